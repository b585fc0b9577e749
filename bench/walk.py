"""`bookstream bench walk`: the reader's record walk in-process, the C walk
(bookie/_records.c) beside the Python one (``bookie.entry._sparse_runs_py``)
on the same frames in the same run (issue 18).

    bookstream bench walk [--sizes 100,1024,65536] [--frame-mb 4] [--repeat 15] [--out walk.json]

A frame of ``--frame-mb`` MiB of entries of each size, walked ``--repeat``
times by each walk (checksums verified, runs made, as a reader's
``RunSlots.put_frame`` walks a range read's frame): the best time per
record and per byte, and the C walk's speed as a multiple of the Python
walk's.  No I/O, no other process: what the walk alone costs a reader's
thread.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.single import int_list
from bookie import entry as E

LEDGER = 7


def add_parser(bsub) -> None:
    p = bsub.add_parser("walk", help="the reader's record walk in-process: the C walk beside the Python walk")
    p.add_argument("--sizes", type=int_list, default=[100, 1024, 65536])
    p.add_argument("--frame-mb", type=float, default=4.0, help="MiB of records per frame walked")
    p.add_argument("--repeat", type=int, default=15, help="walks of the frame per walk and size (the best counts)")
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=cmd_walk)


def frame(size: int, mb: float) -> tuple[bytes, int]:
    """A frame of about ``mb`` MiB of records of ``size`` bytes, and how many."""
    n = max(1, int(mb * (1 << 20)) // (E.HEADER_SIZE + size))
    payload = bytes(range(256)) * (size // 256 + 1)
    return b"".join(E.encode(LEDGER, i, payload[i % 256:i % 256 + size], term=1) for i in range(1, n + 1)), n


def best_seconds(fn, buf: bytes, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(buf, LEDGER, 0)
        best = min(best, time.perf_counter() - t0)
    return best


def cmd_walk(args: argparse.Namespace) -> int:
    walks = {"python": E._sparse_runs_py}
    if E.NATIVE:
        walks["c"] = E._NATIVE.sparse_runs
    else:
        print("the C walk is not built here (or BOOKSTREAM_PURE_PYTHON is set): the Python walk only",
              file=sys.stderr)
    rows = []
    for size in args.sizes:
        buf, n = frame(size, args.frame_mb)
        row = {"entry_bytes": size, "records": n, "frame_bytes": len(buf)}
        for name, fn in walks.items():
            t = best_seconds(fn, buf, args.repeat)
            row[name] = {"ns_per_record": t / n * 1e9, "gb_per_s": len(buf) / t / 1e9}
        if "c" in row:
            row["c_over_python"] = row["python"]["ns_per_record"] / row["c"]["ns_per_record"]
        rows.append(row)
        print(f"{size:>6} B: " + ", ".join(f"{w} {row[w]['ns_per_record']:,.0f} ns/record ({row[w]['gb_per_s']:.2f} GB/s)"
                                          for w in walks)
              + (f"; C {row['c_over_python']:.1f}x the Python walk" if "c" in row else ""))
    if args.out:
        crc = E._NATIVE.CRC if E.NATIVE else None
        args.out.write_text(json.dumps({"benchmark": "walk", "command": " ".join(sys.argv), "crc": crc,
                                        "results": rows}, indent=2) + "\n")
    return 0
