"""`bookstream ledgers list|show|read|delete`, `bookstream logs list|show` and
`bookstream simpletest`: ledgers (classic and the streams' own), logs built
of ledgers, and an end-to-end check of the cluster as it is."""
from __future__ import annotations

import statistics
import sys
import time

import click

from bookstream.admin import (
    EXIT_USAGE, Admin, AdminError, CheckFailed, Column, NotFound, Output, admin_command, escape_payload,
)
from bookstream.admin_streams import FRAGMENT_COLUMNS, payload_options


@click.group("ledgers")
def ledgers() -> None:
    """Ledgers: the classic bounded ones, and the unbounded ones of streams."""


def _meta_row(meta) -> dict:
    return {"ledger_id": meta.ledger_id, "mode": meta.mode.name.lower(), "state": meta.state.name,
            "config": f"{meta.ensemble_size}/{meta.write_quorum}/{meta.ack_quorum}",
            "last_entry": meta.last_entry if meta.state.name == "CLOSED" else None,
            "term": meta.term, "fragments": meta.fragment_count,
            "owner": meta.custom.get("stream") and f"stream {meta.custom['stream']}" or None,
            "custom": dict(meta.custom)}


LIST_COLUMNS = [
    Column("ledger_id", "ledger", justify="right"), Column("mode", "mode"), Column("state", "state"),
    Column("config", "E/Qw/Qa"), Column("last_entry", "last entry", justify="right"),
    Column("term", "term", justify="right"), Column("fragments", "fragments", justify="right"),
    Column("owner", "owner"),
]


async def _read_meta(bk, ledger_id: int, fragments: str = "all"):
    from metadata.errors import NoSuchLedger as MNoSuch
    from stream import errors as serr

    try:
        return await bk.meta_call(bk.ledgers.read, ledger_id, fragments=fragments)
    except (MNoSuch, serr.NoSuchLedger):
        raise NotFound(f"no such ledger: {ledger_id}") from None


@admin_command(ledgers, "list")
def list_ledgers(adm: Admin) -> Output:
    """Every ledger, with its mode, state, configuration and owner."""
    async def go():
        async with adm.bk() as bk:
            rows = []
            for lid in await bk.list_ledgers():
                try:
                    meta, _ = await _read_meta(bk, lid, "none")
                    rows.append(_meta_row(meta))
                except NotFound:
                    pass  # deleted meanwhile
            return rows
    return Output(rows=adm.run(go()), columns=LIST_COLUMNS)


@admin_command(ledgers, "show")
@click.argument("ledger_id", type=click.IntRange(1))
def show(adm: Admin, ledger_id: int) -> Output:
    """The header, the LAC (of an open ledger, read from its bookies) and every fragment."""
    from metadata.ledgers import LedgerState
    from stream.ledger import read_lac_covering

    async def go():
        async with adm.bk() as bk:
            meta, rev = await _read_meta(bk, ledger_id)
            lac = meta.last_entry if meta.state is LedgerState.CLOSED else await read_lac_covering(bk, meta)
            frags = list(meta.fragments)
            rows = []
            for k, f in enumerate(frags):
                end = frags[k + 1].first_entry - 1 if k + 1 < len(frags) else lac
                rows.append({"first_entry": f.first_entry, "last_entry": end if end >= f.first_entry else None,
                             "ensemble": list(f.ensemble)})
            rec = _meta_row(meta)
            rec.update({"lac": lac, "trimmed_before": meta.trimmed_before, "created_ms": meta.ctime_ms,
                        "metadata_revision": rev})
            return Output(record=rec, sections=[("fragments", FRAGMENT_COLUMNS, rows)], title=f"ledger {ledger_id}")
    return adm.run(go())


@admin_command(ledgers, "read")
@click.argument("ledger_id", type=click.IntRange(1))
@click.option("--from", "first", type=click.IntRange(0), default=0, show_default=True, help="first entry id")
@click.option("--to", "last", type=click.IntRange(0), default=None, help="last entry id (default: the LAC)")
@click.option("--noops", is_flag=True, help="show a stream's no-op entries too")
@click.option("--password", envvar="BOOKSTREAM_LEDGER_PASSWORD", default=None,
              help="the ledger's password, if it was created with one (env BOOKSTREAM_LEDGER_PASSWORD)")
@payload_options
def read(adm: Admin, ledger_id: int, first: int, last: int | None, noops: bool, password: str | None, raw: bool,
         hexed: bool, max_bytes: int) -> Output | None:
    """Entries --from..--to (up to the LAC; never fences the writer)."""
    from metadata.ledgers import LedgerMode
    from stream.ledger import LedgerHandle, read_lac_covering

    async def go():
        async with adm.bk() as bk:
            meta, rev = await _read_meta(bk, ledger_id, "last")
            if meta.mode is LedgerMode.CLASSIC:
                h = await bk.open_ledger(ledger_id, recovery=False, password=password)
            else:
                h = LedgerHandle(bk, meta, rev, writable=False, lac=await read_lac_covering(bk, meta))
            top = h.last_add_confirmed if last is None else min(last, h.last_add_confirmed)
            start = max(first, meta.trimmed_before)
            entries = await h.read_entries(start, top) if top >= start else []
            return [e for e in entries if noops or not e.is_noop]
    entries = adm.run(go())
    if raw:
        for e in entries:
            sys.stdout.buffer.write(bytes(e.payload))
        sys.stdout.buffer.flush()
        return None
    rows = [{"entry_id": e.entry_id, "size": len(e.payload), "noop": e.is_noop,
             "payload": bytes(e.payload).hex() if hexed or adm.json else escape_payload(bytes(e.payload), max_bytes)}
            for e in entries]
    cols = [Column("entry_id", "entry", justify="right"), Column("size", "size", justify="right"),
            Column("payload", "payload (hex)" if hexed else "payload")]
    if noops:
        cols.insert(2, Column("noop", "no-op"))
    if adm.json:
        for r, e in zip(rows, entries):
            r["payload_hex"] = r.pop("payload")
            r["payload"] = escape_payload(bytes(e.payload))
    return Output(rows=rows, columns=cols)


@admin_command(ledgers, "delete")
@click.argument("ledger_id", type=click.IntRange(1))
@click.option("--yes", "-y", is_flag=True, help="do not ask")
@click.option("--force", is_flag=True, help="delete even a ledger that a stream or log names")
def delete(adm: Admin, ledger_id: int, yes: bool, force: bool) -> Output:
    """Deletes the ledger's metadata, then its entries on its bookies."""
    if not yes:
        if not sys.stdin.isatty():
            raise AdminError(f"deleting ledger {ledger_id} needs --yes when not asked at a terminal", EXIT_USAGE)
        click.confirm(f"delete ledger {ledger_id} and all its entries?", abort=True, err=True)

    async def go():
        async with adm.bk() as bk:
            meta, _ = await _read_meta(bk, ledger_id, "none")
            owner = meta.custom.get("stream")
            if owner and not force:
                raise AdminError(f"ledger {ledger_id} belongs to stream {owner!r}: use `bookstream streams delete "
                                 f"{owner}` (or --force)", EXIT_USAGE)
            listed = [name for name, ids in await _logs(bk) if ledger_id in ids]
            if listed and not force:   # (its readers would skip its entries, or stop at it)
                raise AdminError(f"ledger {ledger_id} is in the list of log(s) {', '.join(map(repr, listed))}: "
                                 "truncate the log (its leader's LogWriter.truncate), or use --force", EXIT_USAGE)
            await bk.delete_ledger(ledger_id)
            return {"ledger_id": ledger_id, "deleted": True}
    return Output(record=adm.run(go()), title=f"deleted ledger {ledger_id}")


# -- logs ---------------------------------------------------------------------------------------


@click.group("logs")
def logs() -> None:
    """Logs built of classic ledgers (ledgers-to-logs)."""


async def _logs(bk) -> list[tuple[str, list[int]]]:
    """Every log and its ledger list, by name, from one range read."""
    from metadata.layout import KeyLayout
    from stream.log import decode_ledger_list

    layout = KeyLayout(bk.cluster)
    rows = await bk.meta_call(bk.store.range, layout.logs_prefix())
    return sorted((layout.parse_log_key(k), decode_ledger_list(v.value)) for k, v in rows)


async def _log_ids(bk, name: str) -> list[int]:
    from stream.log import read_ledger_list

    ids, rev = await read_ledger_list(bk, name)
    if rev is None:
        raise NotFound(f"no such log: {name!r}")
    return ids


@admin_command(logs, "list")
def list_logs(adm: Admin) -> Output:
    """Every log and its ledgers."""
    async def go():
        async with adm.bk() as bk:
            return [{"name": name, "ledgers": len(ids), "ledger_ids": ids, "current": ids[-1] if ids else None}
                    for name, ids in await _logs(bk)]
    return Output(rows=adm.run(go()), columns=[
        Column("name", "log"), Column("ledgers", "ledgers", justify="right"),
        Column("ledger_ids", "ledger ids", lambda v: ", ".join(map(str, v))),
        Column("current", "current", justify="right")])


@admin_command(logs, "show")
@click.argument("name")
def show_log(adm: Admin, name: str) -> Output:
    """The log's ledgers in order, each with its state, last entry or LAC."""
    from metadata.ledgers import LedgerState
    from stream.ledger import read_lac_covering

    async def go():
        async with adm.bk() as bk:
            ids = await _log_ids(bk, name)
            rows = []
            for lid in ids:
                try:
                    meta, _ = await _read_meta(bk, lid, "last")
                except NotFound:
                    rows.append({"ledger_id": lid, "state": "DELETED"})
                    continue
                lac = meta.last_entry if meta.state is LedgerState.CLOSED else await read_lac_covering(bk, meta)
                rows.append({"ledger_id": lid, "state": meta.state.name,
                             "config": f"{meta.ensemble_size}/{meta.write_quorum}/{meta.ack_quorum}",
                             "lac": lac, "entries": lac + 1})
            return Output(record={"name": name, "ledger_count": len(ids), "entries": sum(r.get("entries", 0) for r in rows)},
                          sections=[("ledgers", [Column("ledger_id", "ledger", justify="right"),
                                                 Column("state", "state"), Column("config", "E/Qw/Qa"),
                                                 Column("lac", "LAC / last entry", justify="right"),
                                                 Column("entries", "entries", justify="right")], rows)],
                          title=f"log {name}")
    return adm.run(go())


# -- simpletest ---------------------------------------------------------------------------------


@admin_command(None, "simpletest")
@click.option("--ensemble", "-e", type=click.IntRange(1), default=3, show_default=True)
@click.option("--write-quorum", "-w", type=click.IntRange(1), default=3, show_default=True)
@click.option("--ack-quorum", "-a", type=click.IntRange(1), default=2, show_default=True)
@click.option("--entries", "-n", type=click.IntRange(1, 10_000_000), default=1000, show_default=True)
@click.option("--size", type=click.IntRange(0, 16 << 20), default=1024, show_default=True, help="payload bytes")
@click.option("--window", type=click.IntRange(1, 100_000), default=100, show_default=True, help="adds in flight")
def simpletest(adm: Admin, ensemble: int, write_quorum: int, ack_quorum: int, entries: int, size: int,
               window: int) -> Output:
    """End-to-end check of the cluster as it is: create a classic ledger, add
    --entries, read them back and compare, delete it; with its figures."""
    return Output(record=adm.run(_simpletest(adm, ensemble, write_quorum, ack_quorum, entries, size, window)),
                  title="simpletest")


async def _simpletest(adm: Admin, e: int, qw: int, qa: int, n: int, size: int, window: int) -> dict:
    import asyncio

    bk = adm.bk()
    lid = None
    progress = _progress(n)
    try:
        lh = await bk.create_ledger(e, qw, qa)
        lid = lh.ledger_id
        pad = b"x" * max(0, size - 12)
        latencies: list[float] = []
        t0 = time.monotonic()
        inflight: set = set()
        for i in range(n):
            payload = (b"%012d" % i + pad)[:size] if size else b""
            sent_at = time.monotonic()
            fut = lh.add_entry_async(payload)
            fut.add_done_callback(lambda f, s=sent_at: latencies.append(time.monotonic() - s))
            inflight.add(fut)
            if len(inflight) >= window:
                done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                for f in done:
                    f.result()
                progress(len(latencies))
        for f in inflight:
            await f
        progress(n)
        write_s = time.monotonic() - t0
        await lh.close()
        t1 = time.monotonic()
        rh = await bk.open_ledger(lid, recovery=False)
        got = await rh.read_entries(0, n - 1)
        read_s = time.monotonic() - t1
        bad = [x.entry_id for i, x in enumerate(got)
               if x.entry_id != i or bytes(x.payload) != ((b"%012d" % i + pad)[:size] if size else b"")]
        if len(got) != n or bad:
            raise CheckFailed(f"simpletest: ledger {lid} read back {len(got)} of {n} entries, "
                              f"{len(bad)} differ (first: {bad[:5]})")
        await bk.delete_ledger(lid)
        lid = None
        lat = sorted(latencies)
        return {"ok": True, "ensemble": e, "write_quorum": qw, "ack_quorum": qa, "entries": n,
                "entry_bytes": size, "window": window, "ensemble_bookies": list(lh.metadata.last_fragment.ensemble),
                "write_seconds": round(write_s, 3), "adds_per_second": round(n / write_s, 1),
                "write_mb_per_second": round(n * size / write_s / 1e6, 2),
                "add_latency_ms_p50": round(statistics.median(lat) * 1000, 2),
                "add_latency_ms_p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2),
                "read_seconds": round(read_s, 3), "reads_per_second": round(n / read_s, 1) if read_s else None}
    except CheckFailed:
        raise
    except AdminError:
        raise
    except Exception as e:
        from bookstream.admin import classify

        c = classify(e)
        raise AdminError(f"simpletest failed: {c}", c.exit_code if c.exit_code != 1 else 5, c.retriable,
                         c.type_name) from None
    finally:
        progress(None)
        if lid is not None:
            try:
                await bk.delete_ledger(lid)
            except Exception:
                pass
        await bk.close()


def _progress(total: int, what: str = "adds"):
    """A rich progress bar (rate, ETA) on a terminal's stderr; nothing in
    scripts.  ``update(done)``, then ``update(None)`` to take it away."""
    if not sys.stderr.isatty():
        return lambda done: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from bookstream.admin import console

    p = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]:>9.0f}/s"),
                 TimeRemainingColumn(), console=console(stderr=True), transient=True)
    task = p.add_task("adds", total=total, rate=0.0)
    t0 = time.monotonic()
    p.start()

    def update(done):
        if done is None:
            p.stop()
        else:
            p.update(task, completed=done, rate=done / max(1e-9, time.monotonic() - t0))
    return update


COMMANDS = [ledgers, logs, simpletest]
