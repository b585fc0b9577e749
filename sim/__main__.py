"""python -m sim --seed N [--set field=value ...] [--trace] [--mutant NAME] [--runs K]

Replays one simulated run (or K runs from seed N) exactly, prints its
statistics and, with --trace, every step as a spec action.  Exit status 1 on
a violation."""
from __future__ import annotations

import argparse
import sys
import time

from sim.scenario import Scenario, parse_override
from sim.world import Violation, World
from stream import mutations


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=1, help="run seeds N .. N+K-1")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field (see sim/scenario.py)")
    p.add_argument("--trace", action="store_true", help="print every step")
    p.add_argument("--mutant", action="append", default=[], choices=mutations.ALL)
    p.add_argument("--no-trace-check", action="store_true", help="invariants only")
    args = p.parse_args(argv)
    overrides = dict(parse_override(s) for s in args.set)
    t0 = time.perf_counter()
    failed = 0
    muts = mutations.Mutations.of(*args.mutant)
    for seed in range(args.seed, args.seed + args.runs):
        sc = Scenario.random(seed, **overrides)
        w = World(sc, check_trace=not args.no_trace_check, mutations=muts)
        try:
            w.run()
            status = "ok"
        except Violation as exc:
            e = exc
            failed += 1
            status = f"VIOLATION {e.invariant}: {e.detail}"
        if args.runs == 1:
            print(sc)
        if args.trace:
            print(w.format_trace())
        if args.runs == 1 or status != "ok":
            print(f"seed {seed}: {status}")
            print("  " + " ".join(f"{k}={v}" for k, v in sorted(w.stats.items())))
            if status != "ok":
                print(f"  replay: {e.replay}")
    dt = time.perf_counter() - t0
    if args.runs > 1:
        print(f"{args.runs} runs, {failed} with violations, {dt:.1f}s ({args.runs / dt:.0f} runs/s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
