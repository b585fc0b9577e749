"""`bookstream ledgers check LEDGER` / `streams check NAME`: every entry of
the sealed fragments, and of an open ledger's last fragment up to the LAC
its bookies report, asked of every bookie of its write set
(stream/autorecovery/replica_check.py).

A progress bar on a terminal (fragments checked, ETA).  Prints one row per fragment (what each bookie lacks, the ids below Qw, below
Qa, lost, held differently, records failing their checksum, bookies that
did not answer) and exits 5 (EXIT_CHECK_FAILED) when any of those is not
empty: what `underreplicated list` would not show until the auditor's
cheaper check or a lost bookie names the ledger.  `bookstream recover`
copies a lost bookie's share; a bookie that lacks ids it should hold is
named to the workers with `recover BOOKIE`, or found by the auditor's
periodic check when what it lacks is a fragment's tail.
"""
from __future__ import annotations

import click

from bookstream.admin import Admin, CheckFailed, Column, Output, admin_command, print_output
from bookstream.admin_ledgers import _progress, _read_meta, ledgers
from bookstream.admin_streams import streams


def _ids(ranges: list[list[int]]) -> int:
    return sum(b - a + 1 for a, b in ranges)


def _spans(ranges: list[list[int]], limit: int = 4) -> str:
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:limit])
    return text + (f", ... ({len(ranges) - limit} more)" if len(ranges) > limit else "")


COLUMNS = [
    Column("first_entry", "first", justify="right"), Column("last_entry", "last", justify="right"),
    Column("checked", "ids read", justify="right"), Column("ensemble", "ensemble", ", ".join),
    Column("missing", "lacking", lambda m: "; ".join(f"{b}: {_spans(r)}" for b, r in m.items()) or "-"),
    Column("under_replicated", "< Qw", lambda r: str(_ids(r))),
    Column("below_ack_quorum", "< Qa", lambda r: str(_ids(r))),
    Column("lost", "lost", lambda r: str(_ids(r))),
    Column("divergent", "divergent", lambda d: str(len(d))),
    Column("bad_records", "bad CRC", lambda b: str(sum(b.values()))),
    Column("unanswered", "no answer", lambda u: ", ".join(u) or "-"),
]


async def _check(bk, meta, what: str, timeout: float, percent: float = 100.0) -> tuple[Output, str | None]:
    from metadata.ledgers import LedgerState
    from stream.autorecovery.replica_check import check_ledger, checked_fragments
    from stream.ledger import read_lac_covering

    lac = None if meta.state is LedgerState.CLOSED else await read_lac_covering(bk, meta)
    bar = _progress(len(checked_fragments(meta, lac)), "fragments checked")   # (the fragments check_ledger reads)
    try:
        frags = await check_ledger(bk, meta, lac=lac, timeout=timeout, progress=lambda done, _n: bar(done),
                                   percent=percent)
    finally:
        bar(None)
    rows = [f.as_json() for f in frags]
    rec = {"ledger_id": meta.ledger_id, "state": meta.state.name, "lac": lac,
           "E": meta.ensemble_size, "Qw": meta.write_quorum, "Qa": meta.ack_quorum,
           "fragments_checked": len(frags), "fragments": meta.fragment_count,
           "entries_checked": sum(f.checked for f in frags),
           "entries_spanned": sum(f.last_entry - f.first_entry + 1 for f in frags), "percent": percent,
           "under_replicated": sum(_ids(f.under_replicated) for f in frags), "below_ack_quorum": sum(_ids(f.below_ack_quorum) for f in frags),
           "lost": sum(_ids(f.lost) for f in frags), "divergent": sum(len(f.divergent) for f in frags),
           "bad_records": sum(sum(f.bad_records.values()) for f in frags),
           "unanswered": sorted({b for f in frags for b in f.unanswered})}
    bad = [f"{k} {rec[k]}" for k in ("lost", "below_ack_quorum", "under_replicated", "divergent", "bad_records")
           if rec[k]] + ([f"no answer from {', '.join(rec['unanswered'])}"] if rec["unanswered"] else [])
    out = Output(record=rec, sections=[("fragments", COLUMNS, rows)], title=what)
    return out, (f"{what}: " + ", ".join(bad)) if bad else None


def _report(adm: Admin, out: Output, failure: str | None) -> None:
    print_output(out, adm.fmt)
    if failure:
        raise CheckFailed(failure)


_PERCENT = click.option("--percent", type=click.FloatRange(0, 100), default=100.0, show_default=True,
                        help="read this share of each fragment's ids (windows drawn at random) and its first and "
                             "last id always; 0: those two only")


@admin_command(ledgers, "check")
@click.argument("ledger_id", type=click.IntRange(1))
@click.option("--read-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="the longest wait for each frame of a bookie's answer")
@_PERCENT
def check_ledger(adm: Admin, ledger_id: int, read_timeout: float, percent: float) -> None:
    """Reads every entry of the ledger (an open one's up to the LAC) from
    every bookie of its write set; exit status 5 when one lacks, or differs,
    or did not answer."""
    async def go():
        async with adm.bk() as bk:
            meta, _ = await _read_meta(bk, ledger_id)
            return await _check(bk, meta, f"ledger {ledger_id}", read_timeout, percent)
    _report(adm, *adm.run(go()))


@admin_command(streams, "check")
@click.argument("name")
@click.option("--read-timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="the longest wait for each frame of a bookie's answer")
@_PERCENT
def check_stream(adm: Admin, name: str, read_timeout: float, percent: float) -> None:
    """`ledgers check` of the stream's ledger (from the trim point on; the
    open fragment up to the LAC)."""
    async def go():
        async with adm.streams() as sc:
            bk = sc.bk
            lid = await sc._ledger_of(name)
            meta, _ = await bk.meta_call(bk.ledgers.read, lid)
            return await _check(bk, meta, f"stream {name}", read_timeout, percent)
    _report(adm, *adm.run(go()))


COMMANDS: list = []   # (the commands join the `ledgers` and `streams` groups)
