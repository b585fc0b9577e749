"""`bookstream bench profile`: where the CPU goes in the closed loop.

Runs the stream closed loop of `bookstream bench stream` (3 bookies, E3 Qw3
Qa2, one client process) while py-spy samples the client and one bookie,
then prints, per process, the functions that were on the CPU most (self
time, idle waits left out) and writes them, with the raw samples, to a
JSON document.  py-spy samples from outside the process (no tracing
overhead in the measured code); it needs ptrace rights over the children
(root, or kernel.yama.ptrace_scope = 0).
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
from pathlib import Path

from bookstream.tuning import tune_process

# Leaves of stacks where a thread waits rather than computes.
IDLE_LEAVES = ("select (selectors.py", "Condition.wait", "_worker (concurrent/futures/thread.py",
               "Event.wait", "poll (")


def add_parser(bsub) -> None:
    p = bsub.add_parser("profile", help="py-spy profiles of the client and a bookie under the closed loop")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--seconds", type=float, default=5.0)
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


def cmd_profile(args: argparse.Namespace) -> int:
    from bench import single
    from bookstream.standalone import Standalone
    from stream.stream import AsyncStreamClient

    tune_process()
    exe = py_spy()
    base = Path(tempfile.mkdtemp(prefix="bookstream-profile-", dir=args.dir))
    cluster = Standalone(base / "cluster", bookies=3, base_port=0, log_level="WARNING",
                         bookie_args=args.bookie_args).start()
    targets = {"client": os.getpid(), "bookie": cluster.bookies[0].proc.pid}
    raws = {name: base / f"{name}.txt" for name in targets}

    async def go() -> dict:
        async with AsyncStreamClient(cluster.etcd_endpoint, cluster.cluster,
                                     max_pending_adds=max(10_000, args.window * 2)) as sc:
            spies = [subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", str(args.rate), "--format", "raw",
                                       "--output", str(raws[name]), "--nonblocking",
                                       "--duration", str(max(1, int(args.seconds)))],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for name, pid in targets.items()]
            try:
                r = await single.stream_closed_loop(sc, f"profile-{os.getpid()}", args.size, args.seconds,
                                                   args.window, batch=args.batch)
            finally:
                await asyncio.get_running_loop().run_in_executor(None, lambda: [s.wait() for s in spies])
            return r

    try:
        r = asyncio.run(go())
    finally:
        cluster.stop()
        if not args.keep_data:
            shutil.rmtree(base / "cluster", ignore_errors=True)  # the samples stay
    doc = {"benchmark": "profile", "command": " ".join(sys.argv), "closed_loop": r, "profiles": {}}
    print(f"closed loop, {args.size} B ({args.batch} per call): {r['appends_per_s']:,.0f} appends/s")
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
