"""Process tuning for throughput and latency: the cyclic garbage collector
and the C allocator.

CPython's cyclic collector runs every few hundred allocations, and a full
(oldest generation) pass walks every live object: with a writer's window of
pending adds, or a bookie's index and protobuf modules loaded, a pass takes
milliseconds, all of it added to whatever requests are in flight.  The data
path makes few reference cycles (reference counting frees its objects), so
the collector can run far less often.  ``tune_gc()`` moves everything alive
after start-up out of the collector's sight (``gc.freeze``) and raises the
thresholds.

The data path allocates and frees buffers of a megabyte or more all the time
(frames, gRPC's copy of each message, range-read answers).  glibc's malloc
gives such blocks back to the kernel when they are freed (mmap, or trimming
the top of the heap) and takes them again on the next one, and every page of
a fresh block is a page fault, so the same memory is faulted in over and
over.  ``tune_malloc()`` keeps freed memory for reuse instead: blocks below
``MMAP_THRESHOLD`` come from the heap, and the heap's top is returned to the
kernel only past ``TRIM_THRESHOLD`` (the cost: up to that much memory kept
after a burst).  Page faults per append drop by one to two orders of
magnitude (figures: bench/notes.md).

Bookies call ``tune_process()`` once serving; a client application may call
it after its own start-up (the benchmarks do, and say so).

The event loop: ``run()`` runs a coroutine on uvloop's loop (libuv, the
loop's own machinery in C) where uvloop is installed, else on asyncio's.
Bookies run on it (and the gRPC ceiling's empty servers, which stand in for
them). Clients are left on the application's loop, and the benchmarks keep
theirs on asyncio's: bookies on uvloop lowered the open loop's p50 with the
tail unchanged, while a client on uvloop doubled its p99 for a few percent
more appends/s (figures: bench/notes.md).
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from typing import Any, Coroutine

log = logging.getLogger(__name__)

# gen0 collections every 50k allocations (default 700); older generations
# as rarely as the defaults relative to it.
GC_THRESHOLDS = (50_000, 20, 100)

# glibc mallopt() parameters (malloc.h) and the values set
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
TRIM_THRESHOLD = 128 << 20
TOP_PAD = 16 << 20
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit


def tune_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)


def tune_malloc() -> bool:
    """Sets glibc's malloc to keep freed memory for reuse (see above);
    False where the C library is not glibc (nothing is changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
    if not ok:
        log.warning("mallopt refused a setting: the allocator keeps its defaults in part")
    return ok


def tune_process() -> None:
    """Both tunings: for a bookie once serving, or a client after start-up."""
    tune_gc()
    tune_malloc()


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run(main)``, on uvloop's event loop where it is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency; kept optional for embedders
        return asyncio.run(main)
    return uvloop.run(main)


def loop_implementation() -> str:
    """The module of the running event loop's class ("uvloop" or "asyncio")."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
