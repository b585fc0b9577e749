"""The single-purpose benchmarks and the measuring loops the others share.

    bookstream bench bookie [--sizes 100,1024,65536] [--batches 1,10,100,1000]
                            [--seconds 3] [--out results.json]
    bookstream bench replay | stream | ledger [...]

`bench bookie` starts one real bookie process on a temporary data dir (on
the same disk as --dir) and measures appends/s and MB/s into it, with fsync,
for each entry size and batch size.  In the same run it measures the raw
write + fdatasync rate of the same disk with the same write sizes, and reports
each figure as a ratio to it.  The closed and open loops here
(`_closed_loop`, `_open_loop`) also drive the suite's floors and JetStream.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from operator import sub
from pathlib import Path

from bookie import entry as E
from bench.ceilings import STALL_MS, HiccupMeter
from bench.ceilings import pct as _pct
from bookstream.tuning import tune_process
from bench.ceilings import raw_disk_rate, read_files_rate
from stream.errors import TooManyPendingAdds


def int_list(s: str) -> list[int]:
    """A comma list of integers ("" is none)."""
    return [int(x) for x in str(s).split(",") if x]


MAX_FRAME_BYTES = 16 << 20


def add_parsers(bsub) -> None:
    """`bench bookie`, `bench replay`, `bench stream`, `bench ledger`."""
    b = bsub.add_parser("bookie", help="appends/s and MB/s into one bookie, beside the raw disk")
    b.add_argument("--sizes", default="100,1024,65536")
    b.add_argument("--batches", default="1,10,100,1000")
    b.add_argument("--seconds", type=float, default=3.0, help="time per configuration")
    b.add_argument("--inflight", type=int, default=8, help="frames in flight")
    add_data_args(b)
    b.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    b.set_defaults(func=cmd_bench_bookie)
    r = bsub.add_parser("replay", help="journal replay speed of a bookie restarted after kill -9")
    r.add_argument("--mb", type=int, default=512, help="journal to write before the kill")
    r.add_argument("--sizes", default="100,65536")
    add_data_args(r)
    r.add_argument("--out", type=Path, default=None)
    r.set_defaults(func=cmd_bench_replay)
    add_client_parsers(bsub)


def add_data_args(p) -> None:
    """--dir / --keep-data, for every benchmark that writes data."""
    p.add_argument("--dir", type=Path, default=None, help="where the data goes (default: a temp dir)")
    p.add_argument("--keep-data", action="store_true", help="keep the run's data dir (removed by default)")
    p.add_argument("--bookie-arg", dest="bookie_args", action="append", default=[], metavar="ARG",
                   help="an option for every bookie started (repeatable; e.g. --bookie-arg=--no-preallocate)")


@contextlib.contextmanager
def data_dir(args: argparse.Namespace, prefix: str):
    """A fresh directory for one run's data (under --dir), removed when the
    run ends unless --keep-data: a benchmark writes gigabytes."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=args.dir))
    try:
        yield base
    finally:
        if not getattr(args, "keep_data", False):
            shutil.rmtree(base, ignore_errors=True)


def build_frames(ledger_id: int, size: int, batch: int, count: int) -> list[bytes]:
    payload = os.urandom(size)
    frames, eid = [], 0
    for _ in range(count):
        frames.append(b"".join(E.encode(ledger_id, eid + i, payload, lac=eid + i - 1) for i in range(batch)))
        eid += batch
    return frames


async def bookie_rate(address: str, ledger_id: int, size: int, batch: int, seconds: float,
                      inflight: int) -> dict:
    from stream.bookie_client import BookieClient

    # Enough distinct frames for the run, bounded in memory: frames are
    # reused with fresh ledger ids so every add is a new entry.
    frame_bytes = batch * (size + E.HEADER_SIZE)
    nframes = max(inflight * 2, min(256, (256 << 20) // frame_bytes))
    client = BookieClient(address)
    try:
        await client.add(b"".join(build_frames(ledger_id, size, 1, 1)))  # open the stream
        # Frames are built before the clock starts, each for its own ledger;
        # past the last one they are sent again (overwrites: same work for
        # the bookie, no client-side encoding in the timed loop).
        frames = [build_frames(ledger_id + k, size, batch, 1)[0] for k in range(nframes)]
        sent = acked = 0
        window: set = set()
        t0 = time.perf_counter()
        while True:
            while len(window) < inflight:
                window.add(client.add_frame(frames[sent % nframes]))
                sent += 1
            done, window = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
            for d in done:
                ack = d.result()
                if ack.status != 0:
                    raise RuntimeError(f"add failed: {ack}")
                acked += 1
            el = time.perf_counter() - t0
            if el >= seconds:
                break
        if window:
            await asyncio.wait(window)
            acked += len(window)
        el = time.perf_counter() - t0
        entries = acked * batch
        return {"entries_per_s": entries / el, "mb_per_s": entries * size / el / 1e6,
                "frames_per_s": acked / el, "seconds": el}
    finally:
        await client.close()


def cmd_bench_bookie(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    with data_dir(args, "bookstream-bench-") as base:
        return _bench_bookie(args, base, sizes, batches)


def _bench_bookie(args: argparse.Namespace, base: Path, sizes: list[int], batches: list[int]) -> int:
    from bookstream.processes import BookieProcess

    bookie = BookieProcess(base / "bookie", log_level="WARNING", extra_args=args.bookie_args).start()
    results = []
    print(f"{'size':>7} {'batch':>6} {'entries/s':>12} {'MB/s':>9} {'raw fsync/s':>12} "
          f"{'raw MB/s':>9} {'MB/s ratio':>10}", flush=True)
    try:
        lid = 1
        for size in sizes:
            for batch in batches:
                b = batch
                while b > 1 and b * (size + E.HEADER_SIZE) > MAX_FRAME_BYTES:
                    b //= 2
                write_bytes = b * (size + E.HEADER_SIZE)
                raw = raw_disk_rate(base / "raw.dat", write_bytes, min(args.seconds, 2.0))["writes_per_s"]
                r = asyncio.run(bookie_rate(bookie.address, lid, size, b, args.seconds, args.inflight))
                lid += 100_000
                raw_mb = raw * write_bytes / 1e6
                row = {"entry_bytes": size, "batch": b, **r, "raw_fsyncs_per_s": raw, "raw_mb_per_s": raw_mb,
                       "raw_entries_per_s": raw * b, "mb_ratio_to_raw": r["mb_per_s"] / raw_mb if raw_mb else None}
                results.append(row)
                print(f"{size:>7} {b:>6} {r['entries_per_s']:>12,.0f} {r['mb_per_s']:>9.1f} {raw:>12,.0f} "
                      f"{raw_mb:>9.1f} {row['mb_ratio_to_raw']:>10.2f}", flush=True)
    finally:
        bookie.stop()
    out = {"benchmark": "bookie", "command": " ".join(sys.argv), "cpus": os.cpu_count(),
           "results": results}
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


def replay_rate(base: Path, size: int, mb: int, bookie_args: list[str] = ()) -> dict:
    """Writes `mb` MiB of journal into one bookie, kill -9, restarts it:
    replayed MB/s (no checkpoint, so the whole journal is replayed), beside
    reading the same segment files through once (the I/O part of a replay)."""
    from bookstream.processes import BookieProcess
    from stream.bookie_client import BookieClient

    b = BookieProcess(base / "bookie", log_level="WARNING",
                      extra_args=["--checkpoint-bytes", str(1 << 50), *bookie_args]).start()
    batch = max(1, min(1000, (4 << 20) // (size + E.HEADER_SIZE)))
    total = max(1, (mb << 20) // ((size + E.HEADER_SIZE) * batch))

    async def fill():
        c = BookieClient(b.address)
        frames = [build_frames(k + 1, size, batch, 1)[0] for k in range(min(total, 64))]
        window = set()
        for i in range(total):
            # each pass over the prebuilt frames rewrites them: same bytes,
            # same replay work
            window.add(c.add_frame(frames[i % len(frames)]))
            if len(window) >= 8:
                done, window = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*window)
        await c.close()

    async def info():
        c = BookieClient(b.address)
        try:
            return await c.info()
        finally:
            await c.close()

    try:
        asyncio.run(fill())
        b.kill()
        b.start(timeout=600)
        inf = asyncio.run(info())
    finally:
        b.stop()
    raw = read_files_rate(sorted(b.data_dir.rglob("segment-*.log")))
    mbps = inf.replayed_bytes / inf.replay_seconds / 1e6 if inf.replay_seconds else 0.0
    eps = total * batch / inf.replay_seconds if inf.replay_seconds else 0.0
    return {"entry_bytes": size, "replayed_bytes": inf.replayed_bytes, "replay_seconds": inf.replay_seconds,
            "mb_per_s": mbps, "entries_per_s": eps, "read_files_mb_per_s": raw["mb_per_s"]}


def cmd_bench_replay(args: argparse.Namespace) -> int:
    results = []
    print(f"{'size':>7} {'journal MB':>10} {'replay s':>9} {'replay MB/s':>12} {'entries/s':>12} "
          f"{'read MB/s':>10}", flush=True)
    for size in int_list(args.sizes):
        with data_dir(args, "bookstream-replay-") as base:
            r = replay_rate(base, size, args.mb, args.bookie_args)
        results.append(r)
        print(f"{size:>7} {r['replayed_bytes'] / 1e6:>10.0f} {r['replay_seconds']:>9.2f} {r['mb_per_s']:>12.0f} "
              f"{r['entries_per_s']:>12,.0f} {r['read_files_mb_per_s']:>10.0f}", flush=True)
    _write_results(args, "replay", results)
    return 0


def index_bytes_per_entry(entries: int, stripe: tuple[int, int] | None = None) -> dict:
    """Memory of the bookie's entry index (bookie/index.py) for one ledger of
    `entries` entries appended in order, as tracemalloc sees it; with
    ``stripe`` (E, Qw), the share of one bookie of a striped ledger (Qw of
    every E ids: `entries` of them)."""
    import tracemalloc

    from bookie.index import LedgerIndex, pack_location

    e, qw = stripe or (1, 1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        idx = LedgerIndex()
        for i in range(entries):
            eid = i // qw * e + i % qw   # (residues 0..Qw-1 of every E ids)
            idx.put(eid, pack_location(0, i * 1076), 1076)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(idx) == entries
    return {"entries": entries, "bytes": used, "bytes_per_entry": used / entries,
            **({"ensemble": e, "write_quorum": qw} if stripe else {})}


# -- the client benchmarks: ledgers and streams on a local cluster ----------------------------


def add_client_parsers(bsub) -> None:
    s = bsub.add_parser("stream", help="stream appends/s and latency, tail reads/s, take-over time")
    s.add_argument("--sizes", default="100,1024")
    s.add_argument("--seconds", type=float, default=5.0)
    s.add_argument("--window", type=int, default=5000, help="appends in flight")
    s.add_argument("--batch", type=int, default=1,
                   help="appends per call (append_many_async; 1: append_async per record)")
    s.add_argument("--takeover-lengths", default="1000,1000000",
                   help="stream lengths (entries) to measure take-over on")
    s.add_argument("--takeover-past-lafr", default="0",
                   help="entries the old writer leaves past its LAFR before the take-over (a comma "
                        "list: one take-over per value): they reached every bookie of their write "
                        "set, but the writer died before any later entry or explicit LAC moved "
                        "the bookies' LAC/LAFR past them, so the new writer's recovery must "
                        "read and write back every one of them")
    s.add_argument("--skip-appends", action="store_true",
                   help="measure only the take-over (no append, tail or open-loop figures)")
    s.add_argument("--read-api", choices=READ_APIS, default="batch",
                   help="the tail read's reader API: read_batch (batch) or read (records)")
    s.add_argument("--open-loop-rate", type=float, default=10_000,
                   help="appends/s offered for the open-loop latency figure (0: skip)")
    s.add_argument("--bookies", type=int, default=3)
    add_data_args(s)
    s.add_argument("--out", type=Path, default=None)
    s.set_defaults(func=cmd_bench_stream)
    lg = bsub.add_parser("ledger", help="classic ledger appends/s and latency (E3 Qw3 Qa2)")
    lg.add_argument("--sizes", default="100,1024")
    lg.add_argument("--seconds", type=float, default=5.0)
    lg.add_argument("--window", type=int, default=5000)
    add_data_args(lg)
    lg.add_argument("--out", type=Path, default=None)
    lg.set_defaults(func=cmd_bench_ledger)


async def _closed_loop(append_async, size: int, seconds: float, window: int, min_count: int = 0, *,
                       wait_for_room=None, append_many_async=None, wait_for_room_many=None,
                       batch: int = 1) -> dict:
    """Appends as fast as acks allow with `window` appends in flight, for
    `seconds` and at least `min_count` appends; latency is measured per call
    (one append, or a batch of `batch` appends through `append_many_async`),
    from the call to its ack.  `wait_for_room(_many)`: the awaitable form,
    used when the window of the client is full (TooManyPendingAdds)."""
    payload = os.urandom(size)
    payloads = [payload] * batch
    lat: list[float] = []
    inflight: set = set()
    done_count = 0
    t0 = time.perf_counter()
    room = asyncio.Event()

    def on_done(t_start, f):
        nonlocal done_count
        inflight.discard(f)
        if not f.cancelled() and f.exception() is None:
            lat.append(time.perf_counter() - t_start)
            done_count += batch
        room.set()

    calls = max(1, window // batch)
    issued = 0
    while time.perf_counter() - t0 < seconds or issued < min_count:
        while len(inflight) < calls:
            issued += batch
            try:
                f = append_async(payload) if batch == 1 else append_many_async(payloads)
            except TooManyPendingAdds:  # acked at the LAC, not yet freed (at the LAFR)
                if wait_for_room is None:
                    raise
                f = asyncio.ensure_future(wait_for_room(payload) if batch == 1 else wait_for_room_many(payloads))
            inflight.add(f)
            f.add_done_callback(functools.partial(on_done, time.perf_counter()))
        room.clear()
        await room.wait()
    if inflight:
        await asyncio.gather(*list(inflight), return_exceptions=True)
    el = time.perf_counter() - t0
    return {"appends": done_count, "appends_per_s": done_count / el, "mb_per_s": done_count * size / el / 1e6,
            "batch": batch,
            "p50_ms": _pct(lat, 0.50) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3, "seconds": el}


async def _open_loop(append_async, size: int, seconds: float, rate: float, hiccups: bool = True) -> dict:
    """Appends offered at a fixed rate, whatever the acks do (open loop);
    each latency runs from the append's *scheduled* time to its ack, so a
    stall counts against every append it delays (no coordinated omission).
    The first third of ``seconds`` more (at most 1 s) is offered before, at
    the same rate, and not recorded: a warm-up (the first frames of a new
    stream, channels and buffers growing), as wrk2 and JMH do.

    Also recorded, to tell where a tail comes from: how late the harness
    issued each append (this event loop busy or stalled: ``late_*``, and
    ``stalls``: [seconds into the measured part, ms late] for each burst
    issued STALL_MS late or more), the cyclic garbage collector's passes in
    this process (``gc_*``), and with `hiccups`, what a process doing
    nothing but waking every millisecond suffered meanwhile
    (``ceilings.HiccupMeter``: the machine's own stalls, on the same clock)."""
    payload = os.urandom(size)
    lat: list[float] = []
    late: list[float] = []
    failed = 0
    interval = 1.0 / rate
    warmup = min(1.0, seconds / 3)
    n_warm = round(warmup * rate)
    n = n_warm + round(seconds * rate)
    # Every append's end is counted by its own callback: gathering all the
    # futures at the end once held the event loop for tens of ms (a gather
    # over 40,000 of them) and delayed the acks of the last frames: it was
    # the whole p99.9 of a run.
    unfinished = n
    all_done = asyncio.Event()
    gc_passes: list[float] = []
    gc_started = [0.0]

    def gc_watch(phase, info):
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            gc_passes.append(time.perf_counter() - gc_started[0])

    def finished() -> None:
        nonlocal unfinished
        unfinished -= 1
        if unfinished == 0:
            all_done.set()

    def on_done(t_sched, f):
        nonlocal failed
        if f.cancelled() or f.exception() is not None:
            failed += 1
        else:
            lat.append(time.perf_counter() - t_sched)
        finished()

    def warm_done(f):
        if not f.cancelled():
            f.exception()  # (retrieved: a failed warm-up append is not an error here)
        finished()

    stalls: list[list[float]] = []
    meter = HiccupMeter() if hiccups else None
    with meter or contextlib.nullcontext():
        t0 = time.perf_counter()
        measured_from = t0 + n_warm * interval
        k = 0
        try:
            while k < n:
                now = time.perf_counter()
                due = min(n, int((now - t0) / interval) + 1)
                if k >= n_warm and (now - (t0 + k * interval)) * 1e3 >= STALL_MS:
                    stalls.append([t0 + k * interval - measured_from, (now - (t0 + k * interval)) * 1e3])
                while k < due:  # every append whose time has come (a burst after a stall)
                    t_sched = t0 + k * interval
                    f = append_async(payload)
                    if k >= n_warm:
                        if k == n_warm:
                            gc.callbacks.append(gc_watch)
                        late.append(now - t_sched)
                        f.add_done_callback(functools.partial(on_done, t_sched))
                    else:
                        f.add_done_callback(warm_done)
                    k += 1
                await asyncio.sleep(max(0.0, t0 + k * interval - time.perf_counter()))
            await all_done.wait()
        finally:
            if gc_watch in gc.callbacks:
                gc.callbacks.remove(gc_watch)
    el = time.perf_counter() - t0 - warmup
    machine = None
    if meter is not None:
        machine = {k: v for k, v in meter.result.items() if k != "stalls"}
        machine["stalls"] = [[at - measured_from, ms] for at, ms in meter.result["stalls"] if at >= measured_from]
    return {"offered_per_s": rate, "completed": len(lat), "failed": failed, "seconds": el, "warmup_s": warmup,
            "warmup_appends": n_warm, "p50_ms": _pct(lat, 0.50) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3,
            "p999_ms": _pct(lat, 0.999) * 1e3, "cdf_ms": latency_cdf(lat),
            "late_p99_ms": _pct(late, 0.99) * 1e3, "late_max_ms": max(late, default=0.0) * 1e3, "stalls": stalls,
            "gc_passes": len(gc_passes), "gc_max_ms": max(gc_passes, default=0.0) * 1e3, "hiccups": machine}


CDF_QUANTILES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995,
                 0.998, 0.999, 0.9995, 0.9999, 1.0)


def latency_cdf(lat: list[float]) -> list[list[float]]:
    """[quantile, ms] pairs: enough of the distribution to draw its CDF."""
    xs = sorted(lat)
    return [[q, _pct(xs, q) * 1e3] for q in CDF_QUANTILES] if xs else []


APPEND_HEADER = f"{'size':>6} {'appends/s':>11} {'MB/s':>7} {'p50 ms':>7} {'p99 ms':>7}"


def _append_row(size: int, r: dict) -> str:
    return (f"{size:>6} {r['appends_per_s']:>11,.0f} {r['mb_per_s']:>7.1f} {r['p50_ms']:>7.2f} "
            f"{r['p99_ms']:>7.2f}")


def _write_results(args, name: str, results) -> None:
    if args.out:
        args.out.write_text(json.dumps({"benchmark": name, "command": " ".join(sys.argv),
                                        "results": results}, indent=2) + "\n")


@contextlib.contextmanager
def _cluster(args, n: int):
    """A standalone cluster of `n` bookies on a fresh data dir, for one run."""
    from bookstream.standalone import Standalone

    with data_dir(args, "bookstream-bench-") as base:
        cluster = Standalone(base, bookies=n, base_port=0, log_level="WARNING",
                             bookie_args=getattr(args, "bookie_args", [])).start()
        try:
            yield cluster
        finally:
            cluster.stop()


async def stream_closed_loop(sc, name: str, size: int, seconds: float, window: int, min_count: int = 0, *,
                             batch: int = 1) -> dict:
    """Appends to a new stream `name` as fast as acks allow (E3 Qw3 Qa2):
    `append_async` per record, or `append_many_async` per `batch` records."""
    from stream.stream import StreamConfig

    w = await sc.open_writer(name, StreamConfig(3, 3, 2))
    try:
        r = await _closed_loop(w.append_async, size, seconds, window, min_count, wait_for_room=w.append,
                               append_many_async=w.append_many_async, wait_for_room_many=w.append_many,
                               batch=batch)
    finally:
        await w.close()
    return {"entry_bytes": size, **r}


async def stream_fill(sc, name: str, size: int, mb: int) -> None:
    """Writes `mb` MiB of `size`-byte appends to a new stream `name`."""
    from stream.stream import StreamConfig

    w = await sc.open_writer(name, StreamConfig(3, 3, 2))
    payload, n = os.urandom(size), (mb << 20) // size
    batch = max(1, min(1000, (4 << 20) // size))
    try:
        pending: list = []
        for k in range(0, n, batch):
            pending.append(w.append_many_async([payload] * min(batch, n - k)))
            if len(pending) >= 4:
                await pending.pop(0)
        await asyncio.gather(*pending)
    finally:
        await w.close()


READ_APIS = ("batch", "records")


async def stream_read_all(sc, name: str, size: int, api: str = "batch", spread: bool = False) -> dict:
    """Reads stream `name` from the start to its end, as a reader catching up
    does: entries/s and MB/s.  ``api``: "batch" reads with ``read_batch``
    (a RecordBatch: the records in the frames read, nothing per record),
    "records" with ``read`` (a Record per record, as before issue 18's batches)."""
    from stream.stream import Position

    if api not in READ_APIS:
        raise ValueError(f"read api {api!r}: one of {READ_APIS}")
    rd = await sc.open_reader(name, Position.EARLIEST)
    rd.spread = spread   # (Qw = E: each chunk from the next bookie, instead of one bookie per reader)
    ports0 = _read_port_counts(sc.bk)
    n = nbytes = 0
    t0 = time.perf_counter()
    try:
        if api == "batch":
            while True:
                got = await rd.read_batch(5000)
                if not got:
                    break
                n += len(got)
                nbytes += got.payload_bytes
        else:
            while True:
                got = await rd.read(5000)
                if not got:
                    break
                n += len(got)
                nbytes += sum(len(r.payload) for r in got)
    finally:
        await rd.close()
    el = time.perf_counter() - t0
    requests, frames = map(sub, _read_port_counts(sc.bk), ports0)
    return {"entry_bytes": size, "entries": n, "entries_per_s": n / el, "mb_per_s": nbytes / el / 1e6,
            "read_api": api, "read_port_requests": requests, "read_port_frames": frames}


def _read_port_counts(bk) -> tuple[int, int]:
    """(range reads, frames) over the bookies' read ports so far, by this client."""
    ports = [bc.read_port for bc in bk._bookies.values() if bc.read_port is not None]
    return sum(p.requests for p in ports), sum(p.frames_read for p in ports)


async def stream_open_loop(sc, name: str, size: int, seconds: float, rate: float) -> dict:
    from stream.stream import StreamConfig

    w = await sc.open_writer(name, StreamConfig(3, 3, 2))
    try:
        r = await _open_loop(w.append_async, size, seconds, rate)
    finally:
        await w.close()
    return {"entry_bytes": size, **r}


async def stream_takeover(sc, name: str, length: int, window: int, past_lafr: int = 0) -> dict:
    """Writes `length` entries of 100 B, abandons the writer (a crash as far
    as the stream knows) and times a new writer's take-over.  With
    `past_lafr` > 0, the old writer died mid-burst: that many entries lie on
    their whole write sets past its LAFR, none of them acknowledged."""
    from stream.stream import StreamConfig

    w = await sc.open_writer(name, StreamConfig(3, 3, 2))
    payload = b"x" * 100
    sent = 0
    while sent < length:
        k = min(window, length - sent)
        await w.append_many([payload] * k)
        sent += k
    last = (await w.append(b"last acknowledged")).entry_id
    await _await_lac(sc, name, last)  # the LAFR is fresh ...
    if past_lafr:                     # ... unless the writer died mid-burst
        await _leave_past_lafr(sc, name, w, last, past_lafr, payload)
    t0 = time.perf_counter()
    w2 = await sc.open_writer(name)
    el = time.perf_counter() - t0
    await w2.close()
    await w.close()
    return {"entries": length, "past_lafr": past_lafr, "seconds": el, "ms": el * 1e3}


def open_loop_line(r: dict) -> str:
    line = (f"open loop, {r['entry_bytes']} B at {r['offered_per_s']:,.0f}/s offered: p50 {r['p50_ms']:.2f} ms, "
            f"p99 {r['p99_ms']:.2f} ms, p99.9 {r['p999_ms']:.2f} ms ({r['completed']:,} acked, "
            f"{r['failed']} failed")
    if "late_max_ms" in r:
        line += (f"; issued late by up to {r['late_max_ms']:.2f} ms; {r['gc_passes']} GC passes, "
                 f"the longest {r['gc_max_ms']:.2f} ms")
    if r.get("hiccups"):
        h = r["hiccups"]
        line += f"; the machine's stalls: up to {h['max_ms']:.2f} ms"
        if "steal_s" in h:
            line += f", steal {h['steal_s'] * 1e3:.0f} ms, CPU pressure {h.get('cpu_pressure_s', 0) * 1e3:.0f} ms"
    return line + ")"


def cmd_bench_stream(args: argparse.Namespace) -> int:
    from stream.stream import AsyncStreamClient

    tune_process()  # bookstream/tuning.py

    results: dict = {"appends": [], "tail": [], "takeover": [], "open_loop": []}
    tag = os.getpid()

    async def go():
        async with AsyncStreamClient(cluster.etcd_endpoint, cluster.cluster,
                                     max_pending_adds=max(10_000, args.window * 2)) as sc:
            print(APPEND_HEADER)
            for size in (() if args.skip_appends else int_list(args.sizes)):
                name = f"bench-{size}-{tag}"
                r = await stream_closed_loop(sc, name, size, args.seconds, args.window, batch=args.batch)
                results["appends"].append(r)
                print(_append_row(size, r), flush=True)
                t = await stream_read_all(sc, name, size, args.read_api)
                results["tail"].append(t)
                print(f"{'':>6} tail read: {t['entries']:,} entries at {t['entries_per_s']:,.0f} entries/s", flush=True)
            if args.open_loop_rate and not args.skip_appends:
                r = await stream_open_loop(sc, f"bench-open-loop-{tag}", 1024, args.seconds, args.open_loop_rate)
                results["open_loop"].append(r)
                print(open_loop_line(r), flush=True)
            for length in int_list(args.takeover_lengths):  # empty: no take-over
                for past in int_list(args.takeover_past_lafr):
                    r = await stream_takeover(sc, f"bench-takeover-{length}-{past}-{tag}", length, args.window,
                                              past)
                    results["takeover"].append(r)
                    print(f"take-over of a stream of {length:,} entries, {past:,} past the LAFR: "
                          f"{r['ms']:.1f} ms", flush=True)

    with _cluster(args, args.bookies) as cluster:
        asyncio.run(go())
    _write_results(args, "stream", results)
    return 0


async def _await_lac(sc, name: str, last: int, timeout: float = 10.0) -> None:
    """Waits until every bookie of the stream's last fragment has its LAC at
    ``last`` (the writer's explicit LAC once its adds went quiet; it carries
    the writer's LAFR as of then, at least ``last`` - 1)."""
    info = await sc.stream_info(name)
    deadline = time.monotonic() + timeout
    for bid in info["ensemble"]:
        bc = await sc.bk.bookie(bid)
        lac = (await bc.read_lac(info["ledger_id"])).lac
        while lac < last:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{bid}: LAC not at {last} after {timeout} s")
            lac = (await bc.long_poll_lac(info["ledger_id"], lac, deadline - time.monotonic())).lac


async def _leave_past_lafr(sc, name: str, w, last: int, count: int, payload: bytes) -> None:
    """What a writer that died mid-burst leaves behind: ``count`` entries
    after its last acknowledged one, each on every bookie of its write set,
    none of them acknowledged (their records carry the LAC/LAFR of the last
    acknowledged entry, and nothing moved the bookies' LAC/LAFR past it)."""
    from stream.bookie_client import BookieClient
    from stream.quorum import write_set

    info = await sc.stream_info(name)
    lid, ens = info["ledger_id"], info["ensemble"]
    per_bookie: dict[str, list[bytes]] = {}
    for eid in range(last + 1, last + 1 + count):
        rec = E.encode(lid, eid, payload, lac=last, lafr=last, term=w.term)
        for i in write_set(eid, info["E"], info["Qw"]):
            per_bookie.setdefault(ens[i], []).append(rec)
    for bid, recs in per_bookie.items():
        bc = BookieClient((await sc.bk.bookie(bid)).address)
        try:
            ack = await bc.add(b"".join(recs))
            assert ack.status == 0, ack
        finally:
            await bc.close()


def cmd_bench_ledger(args: argparse.Namespace) -> int:
    from stream.client import BookKeeperClient

    tune_process()  # bookstream/tuning.py

    results = []

    async def go():
        async with BookKeeperClient(cluster.etcd_endpoint, cluster.cluster,
                                    max_pending_adds=max(10_000, args.window * 2)) as bk:
            print(APPEND_HEADER)
            for size in int_list(args.sizes):
                lh = await bk.create_ledger(3, 3, 2)
                r = await _closed_loop(lh.add_entry_async, size, args.seconds, args.window,
                                       wait_for_room=lh.add_entry)
                r["entry_bytes"] = size
                results.append(r)
                print(_append_row(size, r), flush=True)
                await lh.close()

    with _cluster(args, 3) as cluster:
        asyncio.run(go())
    _write_results(args, "ledger", results)
    return 0
