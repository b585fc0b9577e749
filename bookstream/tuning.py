"""Process tuning for latency: the cyclic garbage collector.

CPython's cyclic collector runs every few hundred allocations, and a full
(oldest generation) pass walks every live object: with a writer's window of
pending adds, or a bookie's index and protobuf modules loaded, a pass takes
milliseconds, all of it added to whatever requests are in flight.  The data
path makes few reference cycles (reference counting frees its objects), so
the collector can run far less often.

``tune_gc()`` moves everything alive after start-up out of the collector's
sight (``gc.freeze``) and raises the thresholds.  Bookies call it once
serving; a latency-sensitive client application may call it after its own
start-up (the benchmarks do, and say so).
"""
from __future__ import annotations

import gc

# gen0 collections every 50k allocations (default 700); older generations
# as rarely as the defaults relative to it.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
