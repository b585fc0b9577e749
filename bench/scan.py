"""`bookstream bench scan`: what finding the ledgers a lost bookie touches
costs autorecovery's auditor (and ``bookstream recover``, the periodic
check, a lost disk's rejoin): ``LedgerStore.named_bookies``, one paged scan
of every ledger key, beside what it replaced in the same run, a listing of
the ids and a read of each ledger (``LedgerStore.read``, a request a
ledger), and beside its floor, the same paged range of every key with no
decoding.

    bookstream bench scan [--ledgers 5000] [--fragments 2] [--rounds 3] [--dir D] [--out scan.json]

A local etcd of its own; ``--ledgers`` classic ledgers E3 Qw3 Qa2 with
``--fragments`` fragments each, on 10 bookie ids.  Each round times the
three on the same keys (the best round counts) and checks that the two
ways find the same bookies for every ledger.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import in_work_dir, save_result

BOOKIES = [f"bookie-{i}" for i in range(10)]


def add_parser(bsub) -> None:
    p = bsub.add_parser("scan", help="the auditor's scan of every ledger beside per-ledger reads and a plain range")
    p.add_argument("--ledgers", type=int, default=5000)
    p.add_argument("--fragments", type=int, default=2, help="fragments a ledger")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (the best counts)")
    p.add_argument("--dir", type=Path, default=None, help="where etcd keeps its data (default: a temporary dir)")
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=cmd_scan)


def fill(ledgers, n: int, fragments: int) -> None:
    from metadata.ledgers import Fragment, LedgerMetadata

    header = LedgerMetadata(ensemble_size=3, write_quorum=3, ack_quorum=2)
    for i in range(n):
        meta, rev = ledgers.create(header, [BOOKIES[(i + k) % 10] for k in range(3)])
        for f in range(1, fragments):
            meta, rev = ledgers.add_fragment(meta.ledger_id, Fragment(100 * f, tuple(
                BOOKIES[(i + 3 * f + k) % 10] for k in range(3))), meta, rev)


def per_ledger(ledgers) -> dict[int, frozenset[str]]:
    """What ``scan_pages`` did before: the ids listed, each ledger read."""
    out = {}
    for lid in ledgers.list_ledgers():
        meta, _ = ledgers.read(lid)
        out[lid] = frozenset(b for f in meta.fragments for b in f.ensemble)
    return out


def run(n: int, fragments: int, rounds: int, base: Path) -> dict:
    from metadata.etcd_server import ManagedEtcd
    from metadata.ledgers import LedgerStore
    from metadata.store import MetadataStore

    etcd = ManagedEtcd(base / "etcd").start()
    try:
        with MetadataStore([etcd.endpoint]) as store:
            ledgers = LedgerStore(store, "bench-scan")
            t0 = time.perf_counter()
            fill(ledgers, n, fragments)
            filled = time.perf_counter() - t0
            prefix = ledgers.layout.ledgers_prefix()
            best = {"per_ledger": float("inf"), "scan": float("inf"), "range": float("inf")}
            keys = 0
            for _ in range(rounds):
                t0 = time.perf_counter()
                old = per_ledger(ledgers)
                t1 = time.perf_counter()
                new = dict(ledgers.named_bookies())
                t2 = time.perf_counter()
                keys = sum(1 for _ in store.iter_range(prefix, pin=False))
                t3 = time.perf_counter()
                if old != new or len(new) != n:
                    raise AssertionError(f"the scan and the per-ledger reads disagree ({len(new)} and {len(old)} "
                                         f"ledgers of {n})")
                for name, t in (("per_ledger", t1 - t0), ("scan", t2 - t1), ("range", t3 - t2)):
                    best[name] = min(best[name], t)
    finally:
        etcd.stop()
    return {"ledgers": n, "fragments_per_ledger": fragments, "keys": keys, "rounds": rounds,
            "fill_seconds": round(filled, 2), "seconds": {k: round(v, 4) for k, v in best.items()},
            "ledgers_per_s": {k: round(n / v) for k, v in best.items()},
            "per_ledger_over_scan": round(best["per_ledger"] / best["scan"], 1),
            "scan_over_range": round(best["scan"] / best["range"], 2)}


def cmd_scan(args: argparse.Namespace) -> int:
    if args.ledgers < 1 or args.fragments < 1 or args.rounds < 1:
        print("bookstream bench scan: --ledgers, --fragments and --rounds must be at least 1", file=sys.stderr)
        return 2
    r = in_work_dir(args.dir, "bench-scan-", lambda d: run(args.ledgers, args.fragments, args.rounds, d))
    s = r["seconds"]
    print(f"{r['ledgers']:,} ledgers ({r['keys']:,} keys): one scan {s['scan']:.3f} s, per-ledger reads "
          f"{s['per_ledger']:.3f} s ({r['per_ledger_over_scan']}x the scan's time), a plain range of the keys "
          f"{s['range']:.3f} s (the scan takes {r['scan_over_range']}x its floor)")
    save_result(args.out, "scan", r)
    return 0
