"""`bookstream bench reads`: catch-up reads per ensemble shape, and the
writer's latency with a catch-up reader beside it (issue 18).

    bookstream bench reads [--sizes 1024,65536] [--mb 256] [--ensembles 3/3,4/2,5/3] [--spread]
                           [--bookies 5] [--reads 2] [--read-api batch|records] [--one-core-reads 0]
                           [--open-loop-rate 10000] [--reader-rate-mb 0] [--out reads.json]

On one local cluster (etcd + `--bookies` bookie processes, fsync on):

1. for each ensemble E/Qw (Qa 2) and entry size, a stream of `--mb` MiB is
   written, then read from the start to its end `--reads` times by one
   reader (`single.stream_read_all`, with `read_batch` or, `--read-api
   records`, with `read`): entries/s and MB/s.  Striped ensembles
   (E > Qw) are compared with Qw = E (the first ensemble given) per byte, in
   the same run, and with `--spread` with a Qw = E stream of their E where
   one is given (`same_e`: as many bookies serving a read, so what is left
   is the stripes' own cost; without it a Qw = E stream is read from one
   bookie, which on two cores is the cheaper way), and every read with the
   gRPC range-read ceiling of its entry size measured in the same run (`ceilings.range_read_rate`: one
   empty server streaming prebuilt frames; issue 18's target is 0.5 of it);
   each read gives its CPU per GB (the reader's, and with the bookies'),
   and with `--one-core-reads N` N more reads of each stream run with the
   reader and every bookie on one CPU (`OneCore`: what a byte costs);
2. with `--open-loop-rate`: the open loop (`single._open_loop`, 1 KiB) alone,
   then the same with a catch-up reader in another process reading the
   largest E = Qw stream over and over (`bench catchup-reader`): the p99 with
   the reader beside it against the p99 without, and what the reader read
   meanwhile (`--reader-rate-mb`: the reader bounded to that rate, its
   `max_read_bytes_per_s`; `--reader-nice`: at a lower CPU priority).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bookstream.tuning import tune_process


def ensembles(spec: str) -> list[tuple[int, int]]:
    """"3/3,4/2" -> [(3, 3), (4, 2)]."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if part:
            e, qw = part.split("/")
            out.append((int(e), int(qw)))
    return out


def add_parsers(bsub) -> None:
    from bench.single import add_data_args

    r = bsub.add_parser("reads", help="catch-up reads per ensemble shape; the writer's p99 beside a catch-up reader")
    r.add_argument("--sizes", default="1024,65536")
    r.add_argument("--mb", type=int, default=256, help="MiB written per stream, read back as the catch-up")
    r.add_argument("--ensembles", default="3/3,4/2,5/3",
                   help="E/Qw per stream (Qa 2); the first is the reference, and with --spread a striped stream is "
                        "compared with a Qw = E one of its E too, if given (e.g. 3/3,4/4,4/2,5/5,5/3)")
    r.add_argument("--bookies", type=int, default=5)
    r.add_argument("--reads", type=int, default=2, help="catch-up reads of each stream")
    r.add_argument("--read-api", choices=("batch", "records"), default="batch",
                   help="the catch-up reader's API: read_batch (batch: a RecordBatch, nothing per record) "
                        "or read (records: a Record per record)")
    r.add_argument("--spread", action="store_true",
                   help="a Qw = E stream's chunks read from each bookie in turn (the reader's `spread`) instead of "
                        "one bookie per reader: the reference for striped reads, served by several bookies too")
    r.add_argument("--one-core-reads", type=int, default=0,
                   help="that many reads more of each stream with the reader and every bookie on one CPU: "
                        "what a byte costs, striped or not, with no core idle and none shared more")
    r.add_argument("--ceiling-seconds", type=float, default=1.0,
                   help="the gRPC range-read ceiling per entry size, measured first (0: not measured)")
    r.add_argument("--open-loop-rate", type=float, default=10_000, help="0: no open loop")
    r.add_argument("--seconds", type=float, default=3.0, help="open loop length")
    r.add_argument("--reader-nice", type=int, default=0,
                   help="run the catch-up reader beside the open loop under `nice -n N` (0: as the writer)")
    r.add_argument("--reader-rate-mb", type=float, default=0,
                   help="the catch-up reader beside the open loop reads at most this many MB/s "
                        "(its max_read_bytes_per_s; 0: no bound)")
    add_data_args(r)
    r.add_argument("--out", type=Path, default=None)
    r.set_defaults(func=cmd_bench_reads)
    c = bsub.add_parser("catchup-reader", help="(internal) read a stream from the start, over and over")
    c.add_argument("--etcd", required=True)
    c.add_argument("--cluster", required=True)
    c.add_argument("--stream", required=True)
    c.add_argument("--seconds", type=float, default=10.0)
    c.add_argument("--read-api", choices=("batch", "records"), default="batch")
    c.add_argument("--rate-mb", type=float, default=0, help="max_read_bytes_per_s / 1e6 (0: no bound)")
    c.set_defaults(func=cmd_catchup_reader)


async def fill(sc, name: str, e: int, qw: int, size: int, mb: int) -> int:
    """Writes `mb` MiB of `size`-byte appends to a new stream (E/Qw/Qa 2);
    returns how many."""
    from stream.errors import TooManyPendingAdds
    from stream.stream import StreamConfig

    w = await sc.open_writer(name, StreamConfig(e, qw, 2))
    payload, n = os.urandom(size), max(1, (mb << 20) // size)
    batch = max(1, min(1000, (4 << 20) // size))
    try:
        pending: list = []
        for k in range(0, n, batch):
            chunk = [payload] * min(batch, n - k)
            try:
                pending.append(w.append_many_async(chunk))
            except TooManyPendingAdds:
                # The window counts adds until their whole write quorum acked,
                # which may come after every call above was answered: wait for
                # room (append_many) rather than spin on flush (a run spun here
                # at 100% of a core for 11 minutes).
                await w.append_many(chunk)
            if len(pending) >= 4:
                await pending.pop(0)
        await asyncio.gather(*pending)
    finally:
        await w.close()
    return n


def disk_reads(pids: list[int]) -> int:
    """Bytes the processes ``pids`` made the kernel fetch from storage
    (/proc/PID/io ``read_bytes``: page-cache misses, not what read() returned)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))
        except (OSError, StopIteration):
            pass
    return total


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


class OneCore:
    """Every thread of the processes ``pids`` (the bookies) and of this one
    (the reader) on one CPU while entered, as they were after: a read then
    costs the machine what it takes, with no core idle beside it and none
    shared among more processes than another read has (the per-byte figure
    of a striped read against Qw = E, where on two cores Qw = E's reader
    and bookie each have one and a striped read's reader and two or three
    bookies share them)."""

    def __init__(self, pids, cpu: int | None = None):
        self.pids = [os.getpid(), *pids]
        self.cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
        self._saved: dict[int, set[int]] = {}

    def __enter__(self) -> "OneCore":
        for pid in self.pids:
            for tid in _tasks(pid):
                try:
                    self._saved[tid] = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, {self.cpu})
                except OSError:   # (a thread that ended meanwhile)
                    pass
        return self

    def __exit__(self, *exc) -> None:
        for tid, cpus in self._saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass
        self._saved.clear()


async def catchup_figures(sc, tag, sizes: list[int], shapes: list[tuple[int, int]], mb: int, reads: int,
                          say=print, bookie_pids: list[int] = (), api: str = "batch", spread: bool = False,
                          one_core_reads: int = 0) -> list[dict]:
    """Step 1 of the module doc: a row per (ensemble, size) with every read
    and the best; `vs_qw_eq_e`: MB/s ÷ the reference ensemble's, same size;
    per read, `disk_fraction`: the bookies' reads from the disk (page-cache
    misses) ÷ the bytes read; `cpu_per_byte_vs_qw_eq_e`: the CPU per GB of
    the best read ÷ the reference's.  ``one_core_reads``: that many reads
    more of each stream with the reader and the bookies on one CPU
    (`OneCore`), as `one_core` (and `one_core_vs_qw_eq_e`)."""
    from bench import single

    from bench.profile import cpu_seconds

    def cpu() -> tuple[float, float]:   # this process (the reader), the bookies
        return time.process_time(), sum(cpu_seconds(p) for p in bookie_pids)

    async def one(name: str, size: int) -> dict:
        before, (reader0, bookies0) = disk_reads(bookie_pids), cpu()
        r = await single.stream_read_all(sc, name, size, api, spread)
        nbytes = max(1, r["entries"] * size)
        reader1, bookies1 = cpu()
        r["disk_fraction"] = (disk_reads(bookie_pids) - before) / nbytes
        # the reader's and the bookies' CPU per GB read, and the reader's alone
        r["reader_cpu_s_per_gb"] = (reader1 - reader0) / (nbytes / 1e9)
        r["cpu_s_per_gb"] = r["reader_cpu_s_per_gb"] + (bookies1 - bookies0) / (nbytes / 1e9)
        return r

    def line(runs: list[dict]) -> str:
        return ", ".join("%.0f (from disk %.2f, %.2f CPU s/GB, the reader's %.2f; %d reads, %d frames over read "
                         "ports)" % (r["mb_per_s"], r["disk_fraction"], r["cpu_s_per_gb"], r["reader_cpu_s_per_gb"],
                                     r["read_port_requests"], r["read_port_frames"]) for r in runs)

    rows = []
    for e, qw in shapes:
        for size in sizes:
            name = f"reads-{e}-{qw}-{size}-{tag}"
            written = await fill(sc, name, e, qw, size, mb)
            runs = [await one(name, size) for _ in range(reads)]
            best = max(runs, key=lambda r: r["mb_per_s"])
            # (`written` > `entries`: the bookies' LAC lags the closed writer's; see NOTES, session 6)
            row = {"ensemble": e, "write_quorum": qw, "ack_quorum": 2, "entry_bytes": size, "stream": name,
                   "read_api": api, "spread": spread,
                   "written": written, "entries": best["entries"], "entries_per_s": best["entries_per_s"], "mb_per_s": best["mb_per_s"],
                   "runs": runs}
            rows.append(row)
            row["cpu_s_per_gb"] = best["cpu_s_per_gb"]
            row["reader_cpu_s_per_gb"] = best["reader_cpu_s_per_gb"]
            say(f"catch-up read E{e} Qw{qw}, {size} B: {best['entries']:,} entries, best of {reads} "
                f"{best['entries_per_s']:,.0f} entries/s, {best['mb_per_s']:.1f} MB/s (all: {line(runs)} MB/s)")
            if one_core_reads:
                with OneCore(bookie_pids) as pin:
                    ones = [await one(name, size) for _ in range(one_core_reads)]
                best1 = max(ones, key=lambda r: r["mb_per_s"])
                row["one_core"] = {"cpu": pin.cpu, "mb_per_s": best1["mb_per_s"], "cpu_s_per_gb": best1["cpu_s_per_gb"],
                                   "entries_per_s": best1["entries_per_s"], "runs": ones}
                say(f"  on one CPU (the reader and the bookies): best {best1['mb_per_s']:.1f} MB/s (all: {line(ones)} MB/s)")
    ref_e, ref_qw = shapes[0]
    for row in rows:
        ref = next(r for r in rows if (r["ensemble"], r["write_quorum"]) == (ref_e, ref_qw)
                   and r["entry_bytes"] == row["entry_bytes"])
        row["vs_qw_eq_e"] = row["mb_per_s"] / ref["mb_per_s"] if ref["mb_per_s"] else None
        row["cpu_per_byte_vs_qw_eq_e"] = row["cpu_s_per_gb"] / ref["cpu_s_per_gb"] if ref["cpu_s_per_gb"] else None
        if "one_core" in row and ref["one_core"]["mb_per_s"]:
            row["one_core_vs_qw_eq_e"] = row["one_core"]["mb_per_s"] / ref["one_core"]["mb_per_s"]
        # A striped stream against a Qw = E one of its E, if read: as many
        # bookies serving (with `spread`), so what is left is the stripes' cost.
        same = same_e(rows, row)
        if same is not None:
            row["vs_same_e"] = row["mb_per_s"] / same["mb_per_s"] if same["mb_per_s"] else None
            row["cpu_per_byte_vs_same_e"] = row["cpu_s_per_gb"] / same["cpu_s_per_gb"] if same["cpu_s_per_gb"] else None
            if "one_core" in row and same["one_core"]["mb_per_s"]:
                row["one_core_vs_same_e"] = row["one_core"]["mb_per_s"] / same["one_core"]["mb_per_s"]
        if same is not None and None not in (row["vs_qw_eq_e"], row["cpu_per_byte_vs_qw_eq_e"], row["vs_same_e"],
                                             row["cpu_per_byte_vs_same_e"]):
            say(f"E{row['ensemble']} Qw{row['write_quorum']}, {row['entry_bytes']} B: {row['vs_qw_eq_e']:.2f} of "
                f"E{ref_e} Qw{ref_qw}'s MB/s (a byte's CPU {row['cpu_per_byte_vs_qw_eq_e']:.2f}x), "
                f"{row['vs_same_e']:.2f} of E{same['ensemble']} Qw{same['write_quorum']}'s "
                f"({row['cpu_per_byte_vs_same_e']:.2f}x)")
    return rows


def same_e(rows: list[dict], row: dict) -> dict | None:
    """For a striped row (E > Qw) read with `spread`, the row of a Qw = E
    stream of the same E and entry size, if there is one: served by as many
    bookies (without `spread` a Qw = E stream is read from one bookie)."""
    if row["ensemble"] == row["write_quorum"] or not row.get("spread"):
        return None
    return next((r for r in rows if r["ensemble"] == r["write_quorum"] == row["ensemble"]
                 and r["entry_bytes"] == row["entry_bytes"]), None)


def range_read_ceilings(base: Path, sizes: list[int], seconds: float, say=print) -> dict[str, dict[int, dict]]:
    """The range-read ceilings per entry size, from one empty server started
    and stopped here: "grpc" (`ceilings.range_read_rate`) and "read_port"
    (`read_port_ceiling.read_port_rate`)."""
    from bench.ceilings import range_read_rate, start_empty_servers
    from bench.read_port_ceiling import read_port_rate
    from stream.bookie_client import BookieClient

    server = start_empty_servers(base, 1)[0]

    async def go() -> dict[str, dict[int, dict]]:
        client = BookieClient(server.address)
        try:
            out: dict[str, dict[int, dict]] = {"grpc": {}, "read_port": {}}
            for size in sizes:
                out["grpc"][size] = await range_read_rate(client, size, seconds, say)
                out["read_port"][size] = await read_port_rate(server.read_address, size, seconds, say)
            return out
        finally:
            await client.close()

    try:
        return asyncio.run(go())
    finally:
        server.stop()


def versus_ceilings(rows: list[dict], ceilings: dict[str, dict[int, dict]]) -> None:
    """Each catch-up row's MB/s ÷ the gRPC range read's of its entry size
    (``vs_ceiling``) and ÷ the read port's (``vs_read_port_ceiling``)."""
    for row in rows:
        for key, name in (("vs_ceiling", "grpc"), ("vs_read_port_ceiling", "read_port")):
            c = ceilings.get(name, {}).get(row["entry_bytes"])
            row[key] = row["mb_per_s"] / c["mb_per_s"] if c and c["mb_per_s"] else None


def start_reader(etcd: str, cluster: str, name: str, seconds: float, nice: int = 0,
                 api: str = "batch", rate_mb: float = 0) -> subprocess.Popen:
    return subprocess.Popen([*(["nice", "-n", str(nice)] if nice else []), sys.executable, "-m", "bench", "catchup-reader", "--etcd", etcd,
                             "--cluster", cluster, "--stream", name, "--seconds", str(seconds), "--read-api", api,
                             "--rate-mb", str(rate_mb)],
                            stdout=subprocess.PIPE, text=True)


async def open_loop_beside_reader(sc, etcd: str, cluster: str, read_stream: str, tag, seconds: float,
                                  rate: float, say=print, reader_nice: int = 0, api: str = "batch",
                                  reader_rate_mb: float = 0, alone: dict | None = None) -> dict:
    """Step 2 of the module doc (``alone``: an open loop alone already run)."""
    from bench import single

    if alone is None:
        alone = await single.stream_open_loop(sc, f"reads-open-alone-{tag}", 1024, seconds, rate)
        say(f"alone: {single.open_loop_line(alone)}")
    reader = start_reader(etcd, cluster, read_stream, seconds * 2 + 30, reader_nice, api, reader_rate_mb)
    try:
        line = await asyncio.get_running_loop().run_in_executor(None, reader.stdout.readline)  # "started"
        if not line.startswith("started"):
            raise RuntimeError(f"the catch-up reader did not start: {line!r}")
        beside = await single.stream_open_loop(sc, f"reads-open-beside-{tag}-{reader_rate_mb:g}", 1024, seconds, rate)
    finally:
        reader.terminate()
        out, _ = await asyncio.get_running_loop().run_in_executor(None, reader.communicate)
    got = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    bound = f", bounded at {reader_rate_mb:g} MB/s" if reader_rate_mb else ""
    say(f"beside a catch-up reader ({got.get('mb_per_s', 0):.0f} MB/s meanwhile{bound}): "
        f"{single.open_loop_line(beside)}")
    return {"alone": alone, "beside_reader": beside, "reader": got, "reader_rate_mb": reader_rate_mb,
            "p99_ratio": beside["p99_ms"] / alone["p99_ms"] if alone["p99_ms"] else None}


def cmd_bench_reads(args: argparse.Namespace) -> int:
    from bench.single import _cluster, _write_results, int_list
    from stream.stream import AsyncStreamClient

    tune_process()
    shapes, sizes = ensembles(args.ensembles), int_list(args.sizes)
    need = max(e for e, _ in shapes)
    if args.bookies < need:
        raise SystemExit(f"--bookies {args.bookies}: the ensembles need {need}")
    results: dict = {}
    tag = os.getpid()
    if args.ceiling_seconds:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="bookstream-ceiling-") as d:
            results["ceilings"] = range_read_ceilings(Path(d), sizes, args.ceiling_seconds)

    async def go():
        async with AsyncStreamClient(cluster.etcd_endpoint, cluster.cluster) as sc:
            results["catchup"] = await catchup_figures(sc, tag, sizes, shapes, args.mb, args.reads,
                                                       bookie_pids=[b.proc.pid for b in cluster.bookies],
                                                       api=args.read_api, spread=args.spread,
                                                       one_core_reads=args.one_core_reads)
            if results.get("ceilings"):
                versus_ceilings(results["catchup"], results["ceilings"])
                for row in results["catchup"]:
                    if row["vs_ceiling"] is not None:
                        print(f"catch-up read E{row['ensemble']} Qw{row['write_quorum']}, {row['entry_bytes']} B: "
                              f"{row['vs_ceiling']:.2f} of the gRPC range-read ceiling, "
                              f"{row['vs_read_port_ceiling']:.2f} of the read port's")
            if args.open_loop_rate:
                ref = [r for r in results["catchup"] if (r["ensemble"], r["write_quorum"]) == shapes[0]]
                big = max(ref, key=lambda r: r["entry_bytes"])
                results["open_loop"] = await open_loop_beside_reader(
                    sc, cluster.etcd_endpoint, cluster.cluster, big["stream"], tag, args.seconds, args.open_loop_rate,
                    reader_nice=args.reader_nice, api=args.read_api, reader_rate_mb=args.reader_rate_mb)

    with _cluster(args, args.bookies) as cluster:
        asyncio.run(go())
    _write_results(args, "reads", results)
    return 0


def cmd_catchup_reader(args: argparse.Namespace) -> int:
    """Reads --stream from the start to its end, again and again, until
    --seconds pass or SIGTERM; prints "started" once the first read is
    under way, then one JSON line: entries, seconds, MB/s."""
    import signal

    from stream.stream import AsyncStreamClient, Position

    tune_process()
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))

    async def go() -> dict:
        n = nbytes = 0
        t0 = time.perf_counter()
        async with AsyncStreamClient(args.etcd, args.cluster) as sc:
            print("started", flush=True)
            while not stop[0] and time.perf_counter() - t0 < args.seconds:
                rd = await sc.open_reader(args.stream, Position.EARLIEST, max_read_bytes_per_s=args.rate_mb * 1e6)
                try:
                    while not stop[0]:
                        if args.read_api == "batch":
                            got = await rd.read_batch(5000)
                            nbytes += got.payload_bytes
                        else:
                            got = await rd.read(5000)
                            nbytes += sum(len(r.payload) for r in got)
                        if not got:
                            break
                        n += len(got)
                finally:
                    await rd.close()
        el = time.perf_counter() - t0
        return {"entries": n, "seconds": el, "mb_per_s": nbytes / el / 1e6 if el else 0.0}

    print(json.dumps(asyncio.run(go())), flush=True)
    return 0


# -- in the suite (bench/suite.py) ------------------------------------------------------


def _int_list(s: str) -> list[int]:
    from bench.single import int_list

    return int_list(s)


def phase_reads(base: Path, p: dict, say) -> dict:
    """Issue 18's read figures on a cluster of 5 bookies (`bench/reads.py`):
    the catch-up of streams of each ensemble shape (striped against Qw = E,
    per byte), and the open loop alone and beside a catch-up reader."""
    from bookstream.standalone import Standalone
    from stream.stream import AsyncStreamClient

    shapes = ensembles(p["reads_ensembles"])
    n = max(3, max(e for e, _ in shapes))
    say(f"reads: starting etcd + {n} bookies (fsync on)")
    cluster = Standalone(base / "reads", bookies=n, base_port=0, log_level="WARNING",
                         bookie_args=p["bookie_args"]).start()
    out: dict = {"bookies": n}
    tag = os.getpid()

    async def go():
        async with AsyncStreamClient(cluster.etcd_endpoint, cluster.cluster) as sc:
            out["catchup"] = await catchup_figures(sc, tag, _int_list(p["reads_sizes"]), shapes, p["reads_mb"], 2,
                                                   say=say, bookie_pids=[b.proc.pid for b in cluster.bookies],
                                                   api=p["read_api"], spread=bool(p.get("reads_spread", 0)),
                                                   one_core_reads=p.get("reads_one_core", 0))
            if p["open_loop_rate"]:
                ref = [r for r in out["catchup"] if (r["ensemble"], r["write_quorum"]) == shapes[0]]
                big = max(ref, key=lambda r: r["entry_bytes"])
                out["open_loop"] = ol = await open_loop_beside_reader(
                    sc, cluster.etcd_endpoint, cluster.cluster, big["stream"], tag, p["seconds"], p["open_loop_rate"],
                    say=say, api=p["read_api"])
                if p["reads_reader_rate_mb"]:  # what an operator can do about it: the reader's rate bound
                    out["open_loop_bounded"] = await open_loop_beside_reader(
                        sc, cluster.etcd_endpoint, cluster.cluster, big["stream"], tag, p["seconds"],
                        p["open_loop_rate"], say=say, api=p["read_api"], reader_rate_mb=p["reads_reader_rate_mb"],
                        alone=ol["alone"])

    try:
        asyncio.run(go())
    finally:
        cluster.stop()
    return out


def add_figures(rd: dict, add, _ref, _stalls) -> None:
    """The suite's figures of ``phase_reads`` (``add``, ``_ref``, ``_stalls``:
    the suite's helpers): each striped catch-up against the Qw = E one of the
    same size, the open loop's p99 beside a reader against it alone."""
    for r in rd.get("catchup", []):
        if r["ensemble"] == r["write_quorum"]:
            continue
        ref = next((x for x in rd["catchup"] if x["ensemble"] == x["write_quorum"]
                    and x["entry_bytes"] == r["entry_bytes"]), None)
        ceilings = {"qw_eq_e": _ref(r["mb_per_s"], ref["mb_per_s"], f"the same catch-up of a stream of "
                                    f"E{ref['ensemble']} Qw{ref['write_quorum']}, same size, same cluster",
                                    unit="MB/s")} if ref else {}
        same = same_e(rd["catchup"], r)
        if same:
            ceilings["same_e"] = _ref(r["mb_per_s"], same["mb_per_s"], f"the same catch-up of a stream of "
                                      f"E{same['ensemble']} Qw{same['write_quorum']} (as many bookies to read "
                                      f"from), same size, same cluster", unit="MB/s")
        # What a byte costs: the CPU per GB (the reader's and the bookies')
        # against Qw = E's, and the same reads on one CPU (bench.reads.OneCore).
        per_byte = {"cpu_s_per_gb": r.get("cpu_s_per_gb"), "qw_eq_e_cpu_s_per_gb": ref and ref.get("cpu_s_per_gb"),
                    "cpu_per_byte_vs_qw_eq_e": r.get("cpu_per_byte_vs_qw_eq_e"),
                    "one_core_mb_per_s": (r.get("one_core") or {}).get("mb_per_s"),
                    "qw_eq_e_one_core_mb_per_s": ((ref or {}).get("one_core") or {}).get("mb_per_s"),
                    "one_core_vs_qw_eq_e": r.get("one_core_vs_qw_eq_e"),
                    "same_e_cpu_s_per_gb": same and same.get("cpu_s_per_gb"),
                    "cpu_per_byte_vs_same_e": r.get("cpu_per_byte_vs_same_e"),
                    "one_core_vs_same_e": r.get("one_core_vs_same_e")}
        add(f"striped_read_e{r['ensemble']}qw{r['write_quorum']}_{r['entry_bytes']}",
            f"catch-up read, E{r['ensemble']} Qw{r['write_quorum']}, {r['entry_bytes']} B", "MB/s", "higher",
            r["mb_per_s"], ceilings, None, entries=r["entries"], entries_per_s=r["entries_per_s"],
            mb_per_s=r["mb_per_s"], entry_bytes=r["entry_bytes"], ensemble=r["ensemble"],
            write_quorum=r["write_quorum"], per_byte=per_byte)
        one = r.get("one_core")
        if one:
            ones = {}
            for name, x in (("qw_eq_e", ref), ("same_e", same)):
                if x and x.get("one_core"):
                    ones[name] = _ref(one["mb_per_s"], x["one_core"]["mb_per_s"], f"the same on one CPU, "
                                      f"E{x['ensemble']} Qw{x['write_quorum']}", unit="MB/s")
            add(f"striped_read_e{r['ensemble']}qw{r['write_quorum']}_{r['entry_bytes']}_one_core",
                f"catch-up read, E{r['ensemble']} Qw{r['write_quorum']}, {r['entry_bytes']} B, the reader and the "
                f"bookies on one CPU", "MB/s", "higher", one["mb_per_s"], ones,
                None, mb_per_s=one["mb_per_s"], cpu_s_per_gb=one["cpu_s_per_gb"], entry_bytes=r["entry_bytes"],
                ensemble=r["ensemble"], write_quorum=r["write_quorum"])
    for key, ol in (("open_loop_p99_beside_reader", rd.get("open_loop")),
                    ("open_loop_p99_beside_bounded_reader", rd.get("open_loop_bounded"))):
        if not ol:
            continue
        alone, beside = ol["alone"], ol["beside_reader"]
        bound = f", bounded at {ol['reader_rate_mb']:g} MB/s" if ol.get("reader_rate_mb") else ""
        add(key, f"open loop p99 beside a catch-up reader ({ol['reader'].get('mb_per_s', 0):.0f} MB/s{bound}), "
            f"{beside['entry_bytes']} B at {beside['offered_per_s']:,.0f}/s", "ms", "lower", beside["p99_ms"],
            {"alone": _ref(beside["p99_ms"], alone["p99_ms"], "the same open loop just before, no reader", unit="ms")},
            None, ms=beside["p99_ms"], p50_ms=beside["p50_ms"], p999_ms=beside["p999_ms"], reader=ol["reader"],
            stalls=_stalls(beside))

