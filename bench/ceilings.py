"""Physical ceilings, measured in the same run as the figures they bound.

- **Disk**: write + fdatasync, appending, at a given write size, from one or
  more writer threads (one file each, as the bookies of a local cluster each
  have their journal): writes/s (fsyncs/s), MB/s and the latency of one
  write + fdatasync.
- **Loopback gRPC with empty handlers**: `EmptyBookie` serves the bookie's own
  service (`proto/bookie.proto`) from a separate process and does nothing:
  an add frame is acked at once, `Info` answers an empty message, `ReadRange`
  streams prebuilt frames.  It is driven by bookstream's own
  `stream.bookie_client.BookieClient` from one Python process, exactly as the
  stream client drives bookies (a long-lived bidi stream of frames, unary
  calls, server-streamed range reads), so the figures are what gRPC and
  protobuf framing alone allow this client.
- **The design's floor**: the same servers with a journal each (`serve
  --journal`): gRPC and the journal's write + fdatasync, nothing else;
  `FloorWriter` (`bench/floor.py`) drives them (and the empty ones) in
  the benchmark's own open loop, batching as the stream writer does.
- **The machine's hiccups**: `HiccupMeter`, a process that only wakes every
  millisecond, records the stalls every process here suffered meanwhile.

    python -m bench.ceilings serve [--port 0] [--journal DIR]   one empty server
    python -m bench.ceilings hiccups [--interval-ms 1]          the meter (until stdin closes)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from bookie import entry as E
from bookstream.tuning import run as run_loop
from bookstream.processes import ServedProcess
from bench.floor import FloorWriter, open_loop_floor

CEILING_READY = "CEILING_READY "


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# -- disk ------------------------------------------------------------------------------------------


def raw_disk_rate(path: Path, write_bytes: int, seconds: float, writers: int = 1,
                  max_bytes: int = 1 << 30) -> dict:
    """write + fdatasync of `write_bytes` at a time, appending, from `writers`
    threads (each its own file, `path` with a suffix): writes/s and MB/s over
    all writers, and the latency of one write + fdatasync.  Stops after
    `seconds` or `max_bytes` written in all.  The files are removed after."""
    buf = os.urandom(write_bytes)
    lat: list[list[float]] = [[] for _ in range(writers)]
    counts = [0] * writers
    stop = threading.Event()
    path = Path(path)

    def one(i: int) -> None:
        p = path.with_name(f"{path.name}.{i}")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while not stop.is_set():
                t = time.perf_counter()
                os.write(fd, buf)
                os.fdatasync(fd)
                lat[i].append(time.perf_counter() - t)
                counts[i] += 1
                if sum(counts) * write_bytes >= max_bytes:
                    stop.set()
        finally:
            os.close(fd)
            os.unlink(p)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(writers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    el = time.perf_counter() - t0
    n = sum(counts)
    all_lat = [x for xs in lat for x in xs]
    return {"write_bytes": write_bytes, "writers": writers, "writes_per_s": n / el,
            "mb_per_s": n * write_bytes / el / 1e6, "p50_ms": pct(all_lat, 0.5) * 1e3,
            "p99_ms": pct(all_lat, 0.99) * 1e3, "p999_ms": pct(all_lat, 0.999) * 1e3, "seconds": el}


def read_files_rate(paths: list[Path]) -> dict:
    """Reads the files through once, sequentially, 4 MiB at a time: MB/s
    (the I/O part of a journal replay; from the page cache if they are in it)."""
    n, t0 = 0, time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(4 << 20):
                n += len(chunk)
    el = time.perf_counter() - t0
    return {"bytes": n, "mb_per_s": n / el / 1e6 if el else 0.0, "seconds": el}


# -- the machine's own hiccups -------------------------------------------------------------------


HICCUPS_READY = "HICCUPS_READY"
STALL_MS = 5.0


def _machine_counters() -> dict:
    """Linux's own account of time taken from this machine's processes: the
    CPU time the hypervisor gave other guests (steal, /proc/stat) and the
    time some runnable task waited for a CPU (pressure stall information,
    /proc/pressure/cpu), in seconds since boot; empty where not available."""
    out = {}
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        out["steal_s"] = int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
        out["cpu_pressure_s"] = int(some[-1].split("=")[1]) / 1e6
    except (OSError, IndexError, ValueError):
        pass
    return out


def _hiccups(interval: float) -> None:
    """The meter's child: wakes every `interval` seconds doing nothing else
    and records how late each wake came; on EOF of stdin, prints a JSON
    summary (lateness quantiles, each stall of STALL_MS or more with its
    time on the system-wide monotonic clock, `time.perf_counter`, and the
    steal and CPU-pressure seconds of the machine meanwhile)."""
    import select

    late: list[float] = []
    stalls: list[list[float]] = []
    before = _machine_counters()
    print(HICCUPS_READY, flush=True)
    stdin = sys.stdin.fileno()
    due = time.perf_counter() + interval
    while True:
        ready, _, _ = select.select([stdin], [], [], max(0.0, due - time.perf_counter()))
        if ready and not os.read(stdin, 4096):
            break
        now = time.perf_counter()
        if now < due:
            continue
        d = now - due
        late.append(d)
        if d * 1e3 >= STALL_MS and len(stalls) < 100:
            stalls.append([due, d * 1e3])
        due = now + interval
    after = _machine_counters()
    print(json.dumps({"interval_ms": interval * 1e3, "wakes": len(late), "p50_ms": pct(late, 0.5) * 1e3,
                      "p99_ms": pct(late, 0.99) * 1e3, "p999_ms": pct(late, 0.999) * 1e3,
                      "max_ms": max(late, default=0.0) * 1e3, "stalls": stalls,
                      **{k: after[k] - before[k] for k in after if k in before}}), flush=True)


class HiccupMeter:
    """A process that only wakes every millisecond and notes how late it
    woke (as jHiccup does for the JVM): the scheduling stalls any process
    of this machine suffered meanwhile (the cores busy, the host's own
    pauses), to tell them apart from a stall of the process measured.

        with HiccupMeter() as h:
            ...
        h.result  # {"p99_ms", "max_ms", "stalls": [[monotonic time, ms], ...], ...}
    """

    def __init__(self, interval: float = 0.001):
        self.interval = interval
        self.result: dict | None = None
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "HiccupMeter":
        self._proc = subprocess.Popen([sys.executable, "-m", "bench.ceilings", "hiccups",
                                       "--interval-ms", str(self.interval * 1e3)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._proc.stdout.readline()
        if line.strip() != HICCUPS_READY:
            self._proc.kill()
            raise RuntimeError(f"hiccup meter did not start: {line!r}")
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self._proc.communicate(timeout=30)  # closes stdin: the child reports and exits
        self.result = json.loads(out)


def settle(min_seconds: float = 0.0, max_seconds: float = 90.0, window: float = 2.5, progress=None) -> dict:
    """Waits until the machine is quiet: at least `min_seconds`, then until
    a `window` passes with no stall of STALL_MS or more and no steal
    (`HiccupMeter`; a window longer than the 2.1 s period of the stalls
    below), or `max_seconds`.

    Why: on this machine (ext4 mounted with `discard`, on a virtio disk),
    after gigabytes of files were removed, a cluster run stalled as a whole
    for 12-26 ms every 2.1 s, the steal rising with it (the hypervisor's
    work), for 20-30 s: started 10 s after the removal, two runs still
    stalled; 20 s after, two of three were quiet and one had a stall of
    11 ms.  The machine idle does not show it, so a phase that removed
    gigabytes asks for `min_seconds` too."""
    say = progress or (lambda msg: None)
    t0 = time.monotonic()
    windows = 0
    if min_seconds > 0:
        say(f"letting the machine settle for {min_seconds:g} s")
        time.sleep(min_seconds)
    while True:
        with HiccupMeter() as h:
            time.sleep(window)
        windows += 1
        r = h.result
        quiet = r["max_ms"] < STALL_MS and not r.get("steal_s")
        waited = time.monotonic() - t0
        if quiet or waited >= max_seconds:
            if not quiet:
                say(f"machine not quiet after {waited:.0f} s (stalls up to {r['max_ms']:.1f} ms): going on")
            return {"quiet": quiet, "waited_s": waited, "windows": windows, "last_max_ms": r["max_ms"],
                    "last_steal_s": r.get("steal_s")}
        say(f"waiting for a quiet machine: stalls up to {r['max_ms']:.1f} ms, steal "
            f"{(r.get('steal_s') or 0) * 1e3:.0f} ms in the last {window:g} s")


# -- loopback gRPC with empty handlers --------------------------------------------------------------


def _empty_servicer(journal_dir: str | None = None):
    from bookie import wire
    from bookie.journal import Journal
    from bookie.journal_record import R_ENTRIES
    from bookstream_pb import bookie_pb2 as pb
    from bookstream_pb import bookie_pb2_grpc as pb_grpc

    class EmptyBookie(pb_grpc.BookieServicer):
        """Does nothing: every add frame is acked OK at once (one AddAcks per
        frame), Info answers empty, and ReadRange streams prebuilt frames of
        entry records.  It holds no ledgers, so ReadRange reads the request's
        ledger_id as the entry size to serve."""

        def __init__(self):
            self._frames: dict[tuple[int, int], tuple[bytes, bytes, int]] = {}
            self.journal = None
            if journal_dir is not None:
                self.journal = Journal(journal_dir)
                self.journal.open_for_append(self.journal.end)

        async def Add(self, request_iterator, context):
            if self.journal is None:
                async for message in request_iterator:  # raw, as a bookie takes them (bookie.server.register)
                    yield pb.AddAcks(acks=[pb.AddAck(frame_id=wire.decode_add_frame(message)[0])])
                return
            # With a journal: each frame is journalled as it comes (the
            # bookie's own group commit) and acked once durable, in order;
            # the acks ready together go as one message, as a bookie's do.
            acks: asyncio.Queue = asyncio.Queue()

            def on_durable(frame_id: int):
                return lambda f: acks.put_nowait(pb.AddAck(frame_id=frame_id) if f.exception() is None else
                                                 pb.AddAck(frame_id=frame_id, status=pb.INTERNAL_ERROR))

            async def journal_frames():
                try:
                    async for message in request_iterator:
                        frame_id, entries, _key = wire.decode_add_frame(message)
                        self.journal.append(R_ENTRIES, entries)
                        self.journal.sync().add_done_callback(on_durable(frame_id))
                finally:
                    await self.journal.sync()
                    acks.put_nowait(None)

            reader = asyncio.create_task(journal_frames())
            try:
                while (ack := await acks.get()) is not None:
                    batch = [ack]
                    while not acks.empty() and (ack := acks.get_nowait()) is not None:
                        batch.append(ack)
                    yield pb.AddAcks(acks=batch)
                    if ack is None:
                        break
            finally:
                reader.cancel()

        async def Info(self, request, context):
            j = self.journal
            if j is None:
                return pb.InfoResponse()
            return pb.InfoResponse(journal_fsyncs=j.fsyncs, journal_bytes=j.bytes_appended,
                                   journal_sync_histogram=j.sync_histogram, journal_sync_max_seconds=j.sync_max_seconds)

        async def ReadRange(self, request, context):
            # frames encoded once, sent as they are (as a bookie sends its own:
            # bookie.server.register, wire.encode_range_frame)
            size, frame_bytes = request.ledger_id, request.max_frame_bytes or (1 << 20)
            key = (size, frame_bytes)
            if key not in self._frames:
                per = max(1, frame_bytes // (size + E.HEADER_SIZE))
                rec = E.encode(1, 0, os.urandom(size))
                self._frames[key] = (wire.encode_range_frame(0, (rec * per,), per), rec * per, per)
            frame, entries, per = self._frames[key]
            left = request.last_entry - request.first_entry + 1
            while left >= per:
                yield frame
                left -= per
            if left > 0:
                yield wire.encode_range_frame(0, (entries[: left * (size + E.HEADER_SIZE)],), left)

    return EmptyBookie()


async def _serve(host: str, port: int, journal_dir: str | None = None) -> None:
    import signal

    import grpc

    from bookie.server import GRPC_OPTIONS, register

    server = grpc.aio.server(options=GRPC_OPTIONS)
    register(_empty_servicer(journal_dir), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    from bench.read_port_ceiling import EmptyReadPort

    read_port = EmptyReadPort(host)
    await read_port.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(CEILING_READY + json.dumps({"address": f"{host}:{bound}", "read_address": f"{host}:{read_port.port}",
                                      "pid": os.getpid()}), flush=True)
    await stop.wait()
    await server.stop(0)


class EmptyServerProcess(ServedProcess):
    """`python -m bench.ceilings serve` as a child process."""

    log_name = "empty-server.log"

    def __init__(self, data_dir, journal: bool = False):
        super().__init__(data_dir)
        self.journal = journal
        self.address: str | None = None
        self.read_address: str | None = None   # its read port (bench/read_port_ceiling.py)

    def command(self) -> list[str]:
        journal = ["--journal", str(Path(self.data_dir) / "journal")] if self.journal else []
        return [sys.executable, "-m", "bench.ceilings", "serve", "--port", "0", *journal]

    def describe(self) -> str:
        return "empty gRPC server" + (" with a journal" if self.journal else "")

    def start(self, timeout: float = 30.0) -> "EmptyServerProcess":
        self.spawn()
        line = self.wait_for_line(lambda s: s.startswith(CEILING_READY), timeout)
        info = json.loads(line[len(CEILING_READY):])
        self.address, self.read_address = info["address"], info["read_address"]
        self.start_draining()
        return self


def start_empty_servers(base: Path, n: int, journal: bool = False) -> list[EmptyServerProcess]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(lambda i: EmptyServerProcess(base / f"empty-{i}", journal=journal).start(), range(n)))


def frame_batches(size: int, batches: list[int], max_frame_bytes: int = 4 << 20) -> list[int]:
    """The batch sizes to try for entries of `size`, each cut to fit a frame."""
    out = []
    for b in batches:
        b = max(1, min(b, max_frame_bytes // (size + E.HEADER_SIZE)))
        if b not in out:
            out.append(b)
    return out


async def _timed_window(start_one, seconds: float, window: int) -> tuple[int, float]:
    """Keeps `window` operations in flight for `seconds`: (completed, elapsed)."""
    inflight: set = set()
    done_n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        while len(inflight) < window:
            inflight.add(start_one())
        done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        for d in done:
            d.result()
        done_n += len(done)
    if inflight:
        await asyncio.gather(*inflight)
        done_n += len(inflight)
    return done_n, time.perf_counter() - t0


async def add_rates(clients, size: int, batches: list[int], seconds: float, window: int, say) -> list[dict]:
    """Frames of `batch` entries of `size` bytes, each sent to every server
    with `window` frames in flight per server, for each batch: messages/s
    over all servers, and the implied appends/s (frames/s per server x
    batch) and MB/s."""
    rows = []
    for batch in frame_batches(size, batches):
        frame = E.encode(1, 0, os.urandom(size)) * batch
        results = await asyncio.gather(*(
            _timed_window(lambda c=c: c.add_frame(frame), seconds, window) for c in clients))
        msgs = sum(n for n, _ in results)
        el = max(e for _, e in results)
        per_server = msgs / len(clients) / el
        row = {"entry_bytes": size, "batch": batch, "frame_bytes": len(frame),
               "messages_per_s": msgs / el, "frames_per_s_per_server": per_server,
               "entries_per_s": per_server * batch, "mb_per_s": per_server * batch * size / 1e6}
        rows.append(row)
        say(f"ceiling gRPC add, {size} B x {batch}/frame to {len(clients)} servers: "
            f"{row['messages_per_s']:,.0f} msgs/s, {row['entries_per_s']:,.0f} entries/s, "
            f"{row['mb_per_s']:.1f} MB/s")
    return rows


async def range_read_rate(client, size: int, seconds: float, say=lambda msg: None) -> dict:
    """The gRPC range-read ceiling: range reads of ``size``-byte entries from
    one empty server (its prebuilt frames) in the reader's 1 MiB frames, for
    ``seconds``: entries/s and MB/s."""
    from stream.ledger_read import RANGE_FRAME_BYTES

    want = max(1, int(256 << 20) // (size + E.HEADER_SIZE))  # per call; repeated for `seconds`
    n = calls = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds and calls < 100:
        async for resp in client.read_range(size, 0, want - 1, max_frame_bytes=RANGE_FRAME_BYTES):
            n += resp.count
            if time.perf_counter() - t0 >= seconds:
                break
        calls += 1
    el = time.perf_counter() - t0
    row = {"entry_bytes": size, "frame_bytes": RANGE_FRAME_BYTES, "entries_per_s": n / el,
           "mb_per_s": n * size / el / 1e6}
    say(f"ceiling gRPC range read, {size} B entries: {row['entries_per_s']:,.0f} entries/s, "
        f"{row['mb_per_s']:.1f} MB/s")
    return row


async def grpc_ceiling(addresses: list[str], sizes: list[int], batches: list[int], seconds: float,
                       window: int = 8, ack_quorum: int = 2, progress=None,
                       open_loop: dict | None = None, read_address: str = "") -> dict:
    """Loopback gRPC with empty handlers, from this process.

    - unary: sequential `Info` calls (latency) and a window of 64 in flight (calls/s);
    - rtt: one frame (one 1 KiB entry) at a time to every server, until
      `ack_quorum` acks: the round trip under an append, with no disk;
    - add: `add_rates`;
    - read: range reads from one server in 1 MiB frames (as the reader asks):
      entries/s and MB/s; read_port: the same from ``read_address``, an
      empty server's read port (bench/read_port_ceiling.py);
    - open_loop, given `open_loop_floor`'s size, seconds and rate: the
      latency gRPC alone gives the open loop's load.
    """
    from stream.bookie_client import BookieClient

    say = progress or (lambda msg: None)
    clients = [BookieClient(a) for a in addresses]
    out: dict = {"servers": len(addresses), "window": window, "add": [], "read": []}
    try:
        c0 = clients[0]
        await c0.info()
        lat = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds / 2 and len(lat) < 20_000:
            t = time.perf_counter()
            await c0.info()
            lat.append(time.perf_counter() - t)
        n, el = await _timed_window(lambda: asyncio.ensure_future(c0.info()), seconds / 2, 64)
        out["unary"] = {"calls_per_s": n / el, "p50_ms": pct(lat, 0.5) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3}
        say(f"ceiling gRPC unary: {n / el:,.0f} calls/s, p50 {out['unary']['p50_ms']:.3f} ms")

        one = E.encode(1, 0, os.urandom(1024))
        for c in clients:
            await c.add(one)  # open the streams
        lat = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds / 2 and len(lat) < 20_000:
            t = time.perf_counter()
            pending = {c.add_frame(one) for c in clients}
            while len(clients) - len(pending) < min(ack_quorum, len(clients)):
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            lat.append(time.perf_counter() - t)
            if pending:
                await asyncio.wait(pending)
        out["rtt"] = {"entry_bytes": 1024, "ack_quorum": ack_quorum, "p50_ms": pct(lat, 0.5) * 1e3,
                      "p99_ms": pct(lat, 0.99) * 1e3, "p999_ms": pct(lat, 0.999) * 1e3}
        say(f"ceiling gRPC frame round trip to {len(clients)} servers, {ack_quorum} acks: "
            f"p50 {out['rtt']['p50_ms']:.3f} ms")

        for size in sizes:
            out["add"].extend(await add_rates(clients, size, batches, seconds, window, say))
            out["read"].append(await range_read_rate(c0, size, seconds, say))
            if read_address:
                from bench.read_port_ceiling import read_port_rate

                out.setdefault("read_port", []).append(await read_port_rate(read_address, size, seconds, say))
    finally:
        for c in clients:
            await c.close()
    if open_loop:
        out["open_loop"] = await _floor_open_loop(addresses, open_loop, say, "gRPC", journal=False)
    return out


async def journal_floor(addresses: list[str], plan: list[tuple[int, int, int]], seconds: float,
                        open_loop: dict | None = None, progress=None) -> dict:
    """Servers that journal every frame before acking it (`serve
    --journal`), driven through a `FloorWriter` by the benchmark's own
    loops: for each (entry size, appends in flight, appends per call) of
    `plan`, the closed loop of `bench stream` (appends/s), and the open
    loop at its load (`open_loop_floor`).  This is the design's floor:
    gRPC's transport, the writer's batching and the journal's write +
    fdatasync, sharing the machine's cores as a cluster does, and nothing
    else (no bookie state, index or validation, no writer bookkeeping)."""
    from bench.single import _closed_loop
    from stream.bookie_client import BookieClient

    say = progress or (lambda msg: None)
    clients = [BookieClient(a) for a in addresses]
    out: dict = {"servers": len(addresses), "add": []}
    try:
        for c in clients:
            await c.add(E.encode(1, 0, b"open"))  # open the streams
        for size, window, batch in plan:
            w = FloorWriter(clients)
            r = await _closed_loop(w.append_async, size, seconds, window, append_many_async=w.append_many_async,
                                   batch=batch)
            row = {"entry_bytes": size, "window": window, **r, "entries_per_s": r["appends_per_s"]}
            out["add"].append(row)
            say(f"ceiling gRPC + journal closed loop, {size} B ({batch} per call, {window} in flight): "
                f"{r['appends_per_s']:,.0f} appends/s, {r['mb_per_s']:.1f} MB/s")
    finally:
        for c in clients:
            await c.close()
    if open_loop:
        out["open_loop"] = await _floor_open_loop(addresses, open_loop, say, "gRPC + journal", journal=True)
    return out


async def _floor_open_loop(addresses: list[str], open_loop: dict, say, what: str, journal: bool) -> dict:
    """`open_loop_floor` for a ceiling phase, with the servers' journals'
    group commits over it when they have journals."""
    from bench.single import open_loop_line

    before = await journal_counters(addresses) if journal else None
    r = await open_loop_floor(addresses, **open_loop)
    line = f"ceiling {what} {open_loop_line(r)}"
    if journal:
        r["journal"] = journal_delta(before, await journal_counters(addresses), r["completed"] + r["warmup_appends"])
        line += f"; {journal_line(r['journal'])}"
    say(line)
    return r


async def journal_counters(addresses: list[str]) -> tuple[int, int, list[int]]:
    """The journal counters of bookies (or of journal-only servers), summed:
    bytes, group commits, and group commits by duration
    (bookie.journal.SYNC_BUCKET_BOUNDS_US)."""
    from stream.bookie_client import BookieClient

    total_bytes = total_fsyncs = 0
    histogram: list[int] = []
    for a in addresses:
        c = BookieClient(a)
        try:
            inf = await c.info()
        finally:
            await c.close()
        total_bytes += inf.journal_bytes
        total_fsyncs += inf.journal_fsyncs
        histogram = [x + y for x, y in zip(histogram or [0] * len(inf.journal_sync_histogram),
                                           inf.journal_sync_histogram)]
    return total_bytes, total_fsyncs, histogram


def journal_delta(before: tuple, after: tuple, appends: int) -> dict:
    """What the journals did between two `journal_counters`: bytes,
    group commits, their mean write size, and how long they took (each
    quantile is its histogram bucket's upper bound)."""
    from bookie.journal import SYNC_BUCKET_BOUNDS_US, sync_quantile

    def bound(v):  # past the last bucket: JSON has no infinity
        return v if v is None or v < float("inf") else f"over {SYNC_BUCKET_BOUNDS_US[-1] / 1e3:g}"

    db, df = after[0] - before[0], after[1] - before[1]
    hist = [y - x for x, y in zip(before[2], after[2])]
    return {"bytes": db, "fsyncs": df, "write_bytes": db / df if df else 0.0,
            "bytes_per_append": db / appends if appends else 0.0, "sync_histogram": hist,
            **{f"sync_{name}_ms_at_most": bound(sync_quantile(hist, q))
               for name, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999), ("max", 1.0))}}


def journal_line(j: dict) -> str:
    return (f"the journals' group commits, warm-up included: p99 <= {j['sync_p99_ms_at_most']} ms, p99.9 <= "
            f"{j['sync_p999_ms_at_most']} ms, the longest <= {j['sync_max_ms_at_most']} ms")


def best(rows: list[dict], size: int, key: str) -> dict | None:
    """The row for entries of `size` with the highest `key`."""
    rows = [r for r in rows if r["entry_bytes"] == size]
    return max(rows, key=lambda r: r[key]) if rows else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ceilings")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve the bookie service with empty handlers")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--journal", metavar="DIR", help="journal every add frame there (fdatasync) before its ack")
    h = sub.add_parser("hiccups", help="wake every interval until stdin closes; print how late the wakes were")
    h.add_argument("--interval-ms", type=float, default=1.0)
    args = p.parse_args(argv)
    if args.cmd == "hiccups":
        _hiccups(args.interval_ms / 1e3)
    else:
        run_loop(_serve(args.host, args.port, args.journal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
