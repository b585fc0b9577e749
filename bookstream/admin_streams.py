"""`bookstream streams list|show|read|tail|trim|delete`: the streams of a cluster.

Positions are printed and taken as the Stream API writes them (`str(Position)`:
an entry id, or `earliest` / `latest`).  Payloads print escaped (`\\n`,
`\\x00`: safe on a terminal), in hex with `--hex`, or as raw bytes with
`--raw` (nothing else is written then).  `read` and `tail` under
`--format json` write one JSON object a line.
"""
from __future__ import annotations

import json
import sys

import click

from bookstream.admin import (
    EXIT_USAGE, Admin, AdminError, Column, Output, admin_command, escape_payload,
)


@click.group("streams")
def streams() -> None:
    """Streams: unbounded term-based ledgers, by name."""


def _position(text: str):
    from stream.stream import Position

    try:
        return Position.parse(text)
    except ValueError:
        raise AdminError(f"bad position {text!r}: an entry id, 'earliest' or 'latest'", EXIT_USAGE) from None


LIST_COLUMNS = [
    Column("name", "stream"), Column("ledger_id", "ledger", justify="right"), Column("term", "term", justify="right"),
    Column("state", "state"), Column("config", "E/Qw/Qa"), Column("fragments", "fragments", justify="right"),
    Column("trimmed_before", "trimmed before", justify="right"), Column("ensemble", "last ensemble", ", ".join),
]


def _info_row(info: dict) -> dict:
    row = dict(info)
    row["config"] = f"{info['E']}/{info['Qw']}/{info['Qa']}"
    return row


@admin_command(streams, "list")
def list_streams(adm: Admin) -> Output:
    """Every stream, with its ledger, term, state and last ensemble."""
    async def go():
        async with adm.streams() as sc:
            rows = []
            for name in await sc.list_streams():
                try:
                    rows.append(_info_row(await sc.stream_info(name)))
                except Exception as e:  # deleted meanwhile, or unreadable: listed as such
                    rows.append({"name": name, "state": f"unreadable: {type(e).__name__}"})
            return rows
    return Output(rows=adm.run(go()), columns=LIST_COLUMNS)


FRAGMENT_COLUMNS = [
    Column("first_entry", "first entry", justify="right"), Column("last_entry", "last entry", justify="right"),
    Column("ensemble", "ensemble", ", ".join),
]


async def _writer(bk, layout, lid: int, term: int) -> dict:
    """The stream's writer as its lease-bound key says (stream/writer_lease.py):
    live at the stream's term, stale (a fenced writer's key, until its lease
    goes), or none; with its lease and the seconds the lease has left."""
    import datetime

    from stream.writer_lease import judge_writer, lease_remaining, read_writer

    rec, lease = await bk.meta_call(read_writer, bk.store, layout, lid)
    out: dict = {"state": judge_writer(rec, term).value}
    if rec is not None:
        started = datetime.datetime.fromtimestamp(rec.started_ms / 1000, datetime.timezone.utc)
        out.update(id=rec.writer_id, host=rec.host, pid=rec.pid, term=rec.term,
                   started=started.isoformat(timespec="seconds"), lease=f"{lease:#x}" if lease else None,
                   lease_ttl=await bk.meta_call(lease_remaining, bk.store, lease) if lease else None)
    return out


async def _show(adm: Admin, sc, name: str) -> Output:
    from metadata.ledgers import LedgerState
    from stream.ledger import read_lac_covering

    bk = sc.bk
    lid = await sc._ledger_of(name)
    meta, _ = await bk.meta_call(bk.ledgers.read, lid)
    writer = await _writer(bk, sc.layout, lid, meta.term)
    lac = meta.last_entry if meta.state is LedgerState.CLOSED else await read_lac_covering(bk, meta)
    frags = list(meta.fragments)
    rows = []
    for k, f in enumerate(frags):
        end = frags[k + 1].first_entry - 1 if k + 1 < len(frags) else lac
        rows.append({"first_entry": f.first_entry, "last_entry": end if end >= f.first_entry else None,
                     "ensemble": list(f.ensemble)})
    rec = {"name": name, "ledger_id": lid, "term": meta.term, "state": meta.state.name,
           "writer": writer,
           "E": meta.ensemble_size, "Qw": meta.write_quorum, "Qa": meta.ack_quorum,
           "lac": lac, "trimmed_before": meta.trimmed_before, "fragment_count": meta.fragment_count,
           "fragment_size_bytes": meta.fragment_size_bytes, "fragment_size_entries": meta.fragment_size_entries,
           "created_ms": meta.ctime_ms}
    return Output(record=rec, sections=[("fragments", FRAGMENT_COLUMNS, rows)], title=f"stream {name}")


@admin_command(streams, "show")
@click.argument("name")
def show(adm: Admin, name: str) -> Output:
    """Term, state, the writer and its lease, the LAC, and every fragment
    with its ensemble and entry range."""
    async def go():
        async with adm.streams() as sc:
            return await _show(adm, sc, name)
    return adm.run(go())


def record_row(rec, hexed: bool, limit: int) -> dict:
    p = bytes(rec.payload)
    return {"position": str(rec.position), "size": len(p),
            "payload": p.hex() if hexed else escape_payload(p, limit)}


def _emit(adm: Admin, rec, raw: bool, hexed: bool, limit: int) -> None:
    if raw:
        sys.stdout.buffer.write(bytes(rec.payload))
        sys.stdout.buffer.flush()
        return
    p = bytes(rec.payload)
    if adm.json:
        sys.stdout.write(json.dumps({"position": str(rec.position), "size": len(p), "payload_hex": p.hex(),
                                     "payload": escape_payload(p)}) + "\n")
    else:
        sys.stdout.write(f"{rec.position}\t{len(p)}\t{p.hex() if hexed else escape_payload(p, limit)}\n")
    sys.stdout.flush()


def payload_options(f):
    f = click.option("--raw", is_flag=True, help="write the payloads' bytes to stdout, nothing else")(f)
    f = click.option("--hex", "hexed", is_flag=True, help="payloads in hex")(f)
    f = click.option("--max-bytes", type=click.IntRange(0), default=200, show_default=True,
                     help="cut escaped payloads at this many bytes (0: never)")(f)
    return f


def password_option(f):
    return click.option("--password", envvar="BOOKSTREAM_STREAM_PASSWORD", default=None,
                        help="the stream's password, if it was created with one (env BOOKSTREAM_STREAM_PASSWORD)")(f)


@admin_command(streams, "read")
@click.argument("name")
@click.option("--from", "start", default="earliest", show_default=True, help="first position (included)")
@click.option("--count", type=click.IntRange(0), default=100, show_default=True,
              help="at most this many records (0: all up to the LAC)")
@payload_options
@password_option
def read(adm: Admin, name: str, start: str, count: int, raw: bool, hexed: bool, max_bytes: int,
         password: str | None) -> None:
    """Records from --from on, up to the LAC (never waits for more)."""
    pos = _position(start)

    async def go():
        async with adm.streams() as sc:
            async with await sc.open_reader(name, pos, password=password) as r:
                n = 0
                while not count or n < count:
                    batch = await r.read(max_records=min(1000, count - n) if count else 1000, timeout=0)
                    if not batch:
                        return n
                    for rec in batch:
                        _emit(adm, rec, raw, hexed, max_bytes)
                    n += len(batch)
                return n
    adm.run(go())


@admin_command(streams, "tail")
@click.argument("name")
@click.option("--from", "start", default="latest", show_default=True,
              help="first position (default: what comes after now)")
@click.option("--count", type=click.IntRange(0), default=0, help="stop after this many records (0: never)")
@payload_options
@password_option
def tail(adm: Admin, name: str, start: str, count: int, raw: bool, hexed: bool, max_bytes: int,
         password: str | None) -> None:
    """Follows the stream: prints each record as it is acknowledged, until
    Ctrl-C (or --count records)."""
    pos = _position(start)

    async def go():
        async with adm.streams() as sc:
            async with await sc.open_reader(name, pos, password=password) as r:
                n = 0
                async for rec in r:
                    _emit(adm, rec, raw, hexed, max_bytes)
                    n += 1
                    if count and n >= count:
                        return
    try:
        adm.run(go())
    except KeyboardInterrupt:
        pass


@admin_command(streams, "trim")
@click.argument("name")
@click.option("--before", required=True, help="drop the fragments wholly below this position")
def trim(adm: Admin, name: str, before: str) -> Output:
    """Drops the fragments wholly below --before (metadata, then the bookies' entries)."""
    pos = _position(before)

    async def go():
        async with adm.streams() as sc:
            dropped = await sc.trim(name, pos)
            info = await sc.stream_info(name)
            return {"name": name, "before": str(pos), "fragments_dropped": dropped,
                    "trimmed_before": info["trimmed_before"], "fragments": info["fragments"]}
    return Output(record=adm.run(go()), title=f"trimmed {name}")


@admin_command(streams, "delete")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="do not ask")
def delete(adm: Admin, name: str, yes: bool) -> Output:
    """Deletes the stream: its name, its ledger and the entries on its bookies."""
    if not yes:
        if not sys.stdin.isatty():
            raise AdminError(f"deleting stream {name!r} needs --yes when not asked at a terminal", EXIT_USAGE)
        click.confirm(f"delete stream {name!r} and all its entries?", abort=True, err=True)

    async def go():
        async with adm.streams() as sc:
            lid = await sc._ledger_of(name)
            await sc.delete_stream(name)
            return {"name": name, "ledger_id": lid, "deleted": True}
    return Output(record=adm.run(go()), title=f"deleted {name}")


COMMANDS = [streams]
