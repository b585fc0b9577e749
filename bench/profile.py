"""`bookstream bench profile`: where the CPU goes in the closed loop, or in
a catch-up read.

    bookstream bench profile [--size 100] [--seconds 5]             # appends: the client and one bookie
    bookstream bench profile --workload reads --size 1024 --mb 256  # catch-up: the reader and every bookie

``appends`` runs the stream closed loop of `bookstream bench stream` (3
bookies, E3 Qw3 Qa2, one client process) while py-spy samples the client
and one bookie.  ``reads`` writes a stream of ``--mb`` MiB, then reads it
from the start to its end over and over (``single.stream_read_all``, the
catch-up of `bookstream bench reads`) while py-spy samples the reader and
every bookie, and reports each process's CPU seconds meanwhile (a reader
at one core is bound by its own thread).  Both print, per process, the
functions that were on the CPU most (self time, idle waits left out) and
write them, with the raw samples, to a JSON document.  py-spy samples from
outside the process (no tracing overhead in the measured code); it needs
ptrace rights over the children (root, or kernel.yama.ptrace_scope = 0).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bookstream.tuning import tune_process

# Leaves of stacks where a thread waits rather than computes.
IDLE_LEAVES = ("select (selectors.py", "Condition.wait", "_worker (concurrent/futures/thread.py",
               "Event.wait", "poll (")


def add_parser(bsub) -> None:
    p = bsub.add_parser("profile", help="py-spy profiles of the client and bookies: closed loop, or catch-up read")
    p.add_argument("--workload", choices=("appends", "reads"), default="appends",
                   help="appends: the closed loop; reads: a stream of --mb MiB read back from the start, over and over")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--mb", type=int, default=256, help="reads: the stream's size, written first")
    p.add_argument("--ensemble", default="3/3", help="reads: the stream's E/Qw (Qa 2; E > Qw: a striped read), "
                                                       "on max(3, E) bookies")
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--batch", type=int, default=100, help="appends per call (1: append_async per record)")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=15)
    from bench.single import add_data_args

    add_data_args(p)  # --dir (the data and the samples), --keep-data (the cluster's), --bookie-arg
    p.add_argument("--out", type=Path, default=Path("bench-results/profile.json"))
    p.set_defaults(func=cmd_profile)


def py_spy() -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        raise SystemExit("py-spy not found (pip install -e '.[bench]')")
    return exe


def top_functions(raw: str, top: int) -> dict:
    """Self time per function, busy samples only, by thread, from py-spy's
    raw (collapsed stacks) output."""
    by_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    idle = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        if any(x in frames[-1] for x in IDLE_LEAVES):
            idle += int(n)
            continue
        # py-spy's stacks start at the thread's entry: the main thread's
        # module, or threading's bootstrap for every other thread
        thread = "background threads" if frames[0].startswith("Thread._bootstrap") else "main thread"
        by_thread[thread][frames[-1]] += int(n)
    out = {"idle_samples": idle, "threads": {}}
    for thread, counts in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(counts.values())
        out["threads"][thread] = {"busy_samples": total,
                                  "top": [{"function": f, "share": c / total} for f, c in counts.most_common(top)]}
    return out


def cpu_seconds(pid: int) -> float:
    """The CPU time of process ``pid`` so far, every thread's, ended ones
    too: its CPU-time clock (Linux: clock id ``(~pid << 3) | 2``, in
    nanoseconds), else utime + stime from /proc/PID/stat (in ticks of 10
    ms: a catch-up of 256 MiB is a few hundred ms)."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except (OSError, OverflowError, AttributeError):
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cmd_profile(args: argparse.Namespace) -> int:
    from bench import single
    from bookstream.standalone import Standalone
    from stream.stream import AsyncStreamClient

    tune_process()
    exe = py_spy()
    reads = args.workload == "reads"
    e, qw = (int(x) for x in args.ensemble.split("/"))
    base = Path(tempfile.mkdtemp(prefix="bookstream-profile-", dir=args.dir))
    cluster = Standalone(base / "cluster", bookies=max(3, e) if reads else 3, base_port=0, log_level="WARNING",
                         bookie_args=args.bookie_args).start()
    client = "reader" if reads else "client"
    targets = {client: os.getpid()}
    for k, b in enumerate(cluster.bookies if reads else cluster.bookies[:1]):
        targets[f"bookie-{k}" if reads else "bookie"] = b.proc.pid
    raws = {name: base / f"{name}.txt" for name in targets}
    cpu: dict[str, float] = {}

    async def go() -> dict:
        async with AsyncStreamClient(cluster.etcd_endpoint, cluster.cluster,
                                     max_pending_adds=max(10_000, args.window * 2)) as sc:
            name = f"profile-{os.getpid()}"
            if reads:
                from bench.reads import fill

                print(f"writing {args.mb} MiB of {args.size} B entries, E{e} Qw{qw}", file=sys.stderr)
                await fill(sc, name, e, qw, args.size, args.mb)
            before = {n: cpu_seconds(pid) for n, pid in targets.items()}
            spies = [subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", str(args.rate), "--format", "raw",
                                       "--output", str(raws[n]), "--nonblocking",
                                       "--duration", str(max(1, int(args.seconds)))],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for n, pid in targets.items()]
            try:
                if reads:
                    loop, runs = asyncio.get_running_loop(), []
                    t_end = loop.time() + args.seconds
                    while loop.time() < t_end:
                        runs.append(await single.stream_read_all(sc, name, args.size))
                    r = {"entry_bytes": args.size, "reads": len(runs),
                         "mb_per_s": max(x["mb_per_s"] for x in runs),
                         "entries_per_s": max(x["entries_per_s"] for x in runs)}
                else:
                    r = await single.stream_closed_loop(sc, name, args.size, args.seconds, args.window,
                                                        batch=args.batch)
            finally:
                cpu.update({n: cpu_seconds(pid) - before[n] for n, pid in targets.items()})
                await asyncio.get_running_loop().run_in_executor(None, lambda: [s.wait() for s in spies])
            return r

    try:
        r = asyncio.run(go())
    finally:
        cluster.stop()
        if not args.keep_data:
            shutil.rmtree(base / "cluster", ignore_errors=True)  # the samples stay
    doc = {"benchmark": "profile", "command": " ".join(sys.argv), "workload": args.workload,
           "reads" if reads else "closed_loop": r, "cpu_seconds": cpu, "profiles": {}}
    if reads:
        print(f"catch-up read, {args.size} B: best of {r['reads']} {r['entries_per_s']:,.0f} entries/s, "
              f"{r['mb_per_s']:,.1f} MB/s")
    else:
        print(f"closed loop, {args.size} B ({args.batch} per call): {r['appends_per_s']:,.0f} appends/s")
    print("CPU seconds while sampled: " + ", ".join(f"{n} {c:.2f}" for n, c in cpu.items()))
    for name, path in raws.items():
        if not path.exists():
            print(f"{name}: py-spy wrote nothing (ptrace rights?)", file=sys.stderr)
            continue
        prof = top_functions(path.read_text(), args.top)
        doc["profiles"][name] = prof
        for thread, t in prof["threads"].items():
            print(f"\n{name}, thread {thread}: {t['busy_samples']:,} busy samples")
            for row in t["top"]:
                print(f"  {row['share'] * 100:5.1f}%  {row['function']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out} (raw samples in {base})")
    return 0
