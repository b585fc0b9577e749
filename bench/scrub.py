"""`bookstream bench scrub`: what a bookie's scrub pass (bookie/scrub.py)
costs, unpaced, beside its floor in the same run: the same journal
segments read whole with nothing checked.

    bookstream bench scrub [--mb 256] [--sizes 1024,65536] [--rounds 3] [--dir D] [--out scrub.json]

In-process: per size, a bookie Storage of its own filled with ``--mb`` of
entries of that size (frames of about 1 MiB, as a writer's batches), then
per round the segments read in 1 MiB reads (the floor: page cache, as the
pass's reads are here) and a pass (``Scrubber.scrub_pass``, no rate limit),
timed, with the process's CPU time per GB of the pass (the best round of
each counts).  The pass must find every entry and nothing rotted.  The
default rate limit (``--scrub-rate-mb`` 32) spends the CPU time per GB
this reports, times 0.032, a second.
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path

from bench import in_work_dir, save_result


def add_parser(bsub) -> None:
    p = bsub.add_parser("scrub", help="a bookie's scrub pass, unpaced, beside reading its journal with no checks")
    p.add_argument("--mb", type=int, default=256, help="MB of entries per size")
    p.add_argument("--sizes", default="1024,65536", help="entry sizes, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (the best counts)")
    p.add_argument("--dir", type=Path, default=None, help="where the data dirs go (default: a temporary dir)")
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=cmd_scrub)


def _read_whole(paths) -> int:
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n


async def _one(size: int, total: int, rounds: int, data_dir: Path) -> dict:
    from bookie import entry as E
    from bookie.scrub import Scrubber
    from bookie.storage import Storage, StorageConfig

    s = Storage(data_dir, StorageConfig(checkpoint_bytes=1 << 40))
    s.open()
    try:
        n, per, payload = max(1, total // size), max(1, (1 << 20) // size), b"s" * size
        for k in range(0, n, per):   # (as the server admits an add frame, then made durable)
            frame = b"".join(E.encode(1, e, payload, term=1) for e in range(k, min(n, k + per)))
            _, _, runs = s.validate_frame(frame)
            refused, durable = s.admit_frame(frame, runs)
            assert not refused
            await durable
        paths = [s.journal.path(seg) for seg in s.journal.segments()]
        best = {"floor": float("inf"), "pass": float("inf"), "cpu_s_per_gb": float("inf")}
        read = checked = 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            read = _read_whole(paths)
            floor = time.perf_counter() - t0
            c0 = time.process_time()
            out = await Scrubber(s, rate=0).scrub_pass()
            cpu = time.process_time() - c0
            if out.entries != n or out.rotted:
                raise AssertionError(f"the pass checked {out.entries} of {n} entries, found {out.rotted} rotted")
            checked = out.bytes
            best["floor"] = min(best["floor"], floor)
            best["pass"] = min(best["pass"], out.seconds)
            best["cpu_s_per_gb"] = min(best["cpu_s_per_gb"], cpu / (out.bytes / 1e9))
    finally:
        s.close()
    mb_s = {"pass": checked / best["pass"] / 1e6, "floor": read / best["floor"] / 1e6}
    return {"entry_bytes": size, "entries": n, "bytes_checked": checked, "journal_bytes": read,
            "mb_per_s": {k: round(v) for k, v in mb_s.items()}, "pass_over_floor": round(mb_s["pass"] / mb_s["floor"], 2),
            "cpu_s_per_gb": round(best["cpu_s_per_gb"], 2)}


def run(sizes: list[int], total: int, rounds: int, base: Path) -> dict:
    results = []
    for size in sizes:
        d = base / f"scrub-{size}"
        shutil.rmtree(d, ignore_errors=True)
        results.append(asyncio.run(_one(size, total, rounds, d)))
        shutil.rmtree(d, ignore_errors=True)
    return {"mb": total // 10**6, "rounds": rounds, "results": results}


def cmd_scrub(args: argparse.Namespace) -> int:
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x]
    except ValueError:
        sizes = []
    if args.mb < 1 or args.rounds < 1 or not sizes or min(sizes) < 1:
        print("bookstream bench scrub: --mb, --rounds and every size must be at least 1", file=sys.stderr)
        return 2
    r = in_work_dir(args.dir, "bench-scrub-", lambda d: run(sizes, args.mb * 10**6, args.rounds, d))
    for x in r["results"]:
        m = x["mb_per_s"]
        print(f"{x['entry_bytes']:,} B entries ({x['entries']:,}): a scrub pass {m['pass']:,} MB/s, its journal read "
              f"whole {m['floor']:,} MB/s (the pass at {x['pass_over_floor']} of its floor), "
              f"{x['cpu_s_per_gb']} CPU s/GB")
    save_result(args.out, "scrub", r)
    return 0
