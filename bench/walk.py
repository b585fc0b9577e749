"""`bookstream bench walk`: the reader's record walk in-process, the C walk
(bookie/_records.c) beside the Python one (``bookie.entry._sparse_runs_py``)
on the same frames in the same run (issue 18); and a striped bookie's
stripe view built in C (bookie/_spans.c) beside the Python build.

    bookstream bench walk [--sizes 100,1024,65536] [--frame-mb 4] [--repeat 15] [--view-ids 131072]
                          [--catchup-ids 2097152] [--out walk.json]

A frame of ``--frame-mb`` MiB of entries of each size, walked ``--repeat``
times by each walk (checksums verified, runs made, as a reader's
``RunSlots.put_frame`` walks a range read's frame): the best time per
record and per byte, and the C walk's speed as a multiple of the Python
walk's.  No I/O, no other process: what the walk alone costs a reader's
thread.

The view: the index of one bookie of an E4 Qw2 ledger holding
``--view-ids`` ids (two of every four, 1 KiB records back to back: one
gapped run, bookie/index.py; a run per two ids before session 16), its view of
everything it holds built from scratch; and a catch-up through a bookie
holding ``--catchup-ids`` ids, its views built window by window as a
reader's frames ask (``LedgerIndex.stripe_view``): the longest build is how
long the bookie's event loop is held, adds included; then that index's
checkpoint image (``LedgerIndex.runs_image``) and the first breaks of one
run of as many entries (``Run.breaks_after``, as after a restart), each with
the C walks and with their Python fallbacks.
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
    p.add_argument("--view-ids", type=int, default=1 << 17,
                   help="ids held by the striped bookie whose view is built (0: no view figures)")
    p.add_argument("--catchup-ids", type=int, default=1 << 21,
                   help="ids held by the striped bookie a catch-up reads through, window by window "
                        "(the longest view build is how long its event loop is held; 0: not measured)")
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
    view = view_build(args.view_ids, max(1, args.repeat // 3)) if args.view_ids else None
    windows = view_windows(args.catchup_ids) if args.catchup_ids else None
    if args.out:
        crc = E._NATIVE.CRC if E.NATIVE else None
        args.out.write_text(json.dumps({"benchmark": "walk", "command": " ".join(sys.argv), "crc": crc,
                                        "results": rows, "view": view, "windows": windows}, indent=2) + "\n")
    return 0


def _striped_index(held: int):
    """The index of bookie 1 of an E4 Qw2 ledger holding `held` ids (4k and
    4k + 1, 1 KiB records back to back), and the id past its last."""
    from array import array

    from bookie.index import LedgerIndex, pack_location

    index = LedgerIndex()
    e = loc = 0
    for _ in range(held // 2):
        index.put_run(e, array("Q", [pack_location(1, loc), pack_location(1, loc + 1084)]), array("I", [1084, 1084]),
                      adjacent=True)
        loc += 2168
        e += 4
    return index, e


def view_windows(held: int) -> dict:
    """A catch-up's asks of a striped bookie's views (``LedgerIndex.stripe_view``)
    from its first id to its last, window by window: the longest call (a
    build: the bookie's event loop held), beside one build of the whole
    ledger's view in one pass of the same C (or Python) code."""
    from bookie import striped_read as S

    index, end = _striped_index(held)
    longest, calls, first = 0.0, 0, 0
    while first < end:
        t0 = time.perf_counter()
        view = index.stripe_view(4, 0b0011, first)
        longest = max(longest, time.perf_counter() - t0)
        calls += 1
        if view is not None:
            first = end if view.hi is None else view.hi
    whole = S.StripeView(4, 0b0011)
    t0 = time.perf_counter()
    whole.fill(index._runs.values())
    out = {"ids": held, "window_ids": S.VIEW_WINDOW_IDS, "calls": calls, "longest_ms": longest * 1e3,
           "whole_ledger_ms": (time.perf_counter() - t0) * 1e3, "c": S.spans_c is not None}
    print(f"a catch-up of a striped bookie holding {held:,} ids, views in windows of {out['window_ids']:,} ids: "
          f"longest call {out['longest_ms']:.1f} ms of {calls}; the whole ledger's view in one build "
          f"{out['whole_ledger_ms']:.0f} ms")
    out["checkpoint_image"] = _c_and_python(lambda: index.runs_image(), "checkpoint image of its runs")
    run = _one_run(held)

    def breaks():
        run.checked = 0
        del run.breaks[:]
        run.breaks_after(0)
    out["run_breaks"] = _c_and_python(breaks, f"first breaks of one run of {held:,} entries")
    return out


def _one_run(n: int):
    from array import array

    from bookie.index import Run
    return Run(0, array("Q", range(0, n * 1084, 1084)), array("I", [1084]) * n)


def _c_and_python(fn, what: str) -> dict:
    """The time of `fn` with the index's C walks and without them (the
    Python fallbacks: bookie.index.spans_c set aside), each on the bookie's
    loop when a bookie runs it."""
    from bookie import index as I

    out = {}
    native = I.spans_c
    for name, mod in (("c", native), ("python", None)):
        if name == "c" and mod is None:
            continue
        I.spans_c = mod
        try:
            t0 = time.perf_counter()
            fn()
            out[name + "_ms"] = (time.perf_counter() - t0) * 1e3
        finally:
            I.spans_c = native
    print(f"{what}: " + ", ".join(f"{k[:-3]} {v:.0f} ms" for k, v in out.items()))
    return out


def view_build(held: int, repeat: int) -> dict:
    """The best build time of the view (the C build where it was built, and the Python one)."""
    from bookie import striped_read as S

    index, _ = _striped_index(held)
    runs = list(index._runs.values())
    builds = {"python": lambda v: v._fill_py(runs, -1)}
    if S.spans_c is not None:
        builds["c"] = lambda v: v.fill(runs)
    out: dict = {"ids": held, "runs": len(runs)}
    for name, build in builds.items():
        best = float("inf")
        for _ in range(repeat):
            view = S.StripeView(4, 0b0011)
            t0 = time.perf_counter()
            build(view)
            best = min(best, time.perf_counter() - t0)
        assert len(view.ids) == held // 2 * 2
        out[name] = {"ms": best * 1e3, "ns_per_id": best / held * 1e9}
    if "c" in out:
        out["c_over_python"] = out["python"]["ms"] / out["c"]["ms"]
    print(f"stripe view of {held:,} ids: " + ", ".join(f"{w} {out[w]['ms']:.1f} ms ({out[w]['ns_per_id']:.0f} ns/id)"
                                                       for w in builds)
          + (f"; C {out['c_over_python']:.1f}x the Python build" if "c" in out else ""))
    return out
