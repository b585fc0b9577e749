"""The fault suite's runner: seeded runs on a real cluster, for minutes or hours.

    python -m tests.fault --seed 1 --runs 3 --seconds 20          # three runs, seeds 1, 2, 3
    python -m tests.fault --seed 100 --runs 1000 --minutes 240     # until 1000 runs or 4 hours
    python -m tests.fault --seed 7 --runs 1 --keep                 # replay seed 7, keep all its files
    python -m tests.fault --plan tests/fault/plans/hole-seed109.json   # an exact schedule that found a hole

Each run's files go to ``--dir/seed-N`` (kept when the run found an
anomaly, or with ``--keep``); the summary (runs, faults by kind, operations,
anomalies by kind and by known bug, seeds) is printed as JSON at the end and
written to ``--dir/summary.json``.  Exit status 1 if any anomaly was not
outside the fault model (``--strict``: any anomaly at all).  Needs root
for the full-disk fault's tmpfs (skipped otherwise).  Stop it with Ctrl-C
or SIGTERM (the current run's processes are stopped and its tmpfs
unmounted; a kill -9 of the runner leaves them behind).
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path

from tests.fault.nemesis import KINDS
from tests.fault.run import Options, run_one, summarize


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fault", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=1, help="the first run's seed (runs use seed, seed+1, ...)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--minutes", type=float, default=0, help="stop starting runs after this long (0: no limit)")
    p.add_argument("--seconds", type=float, default=20.0, help="of faults per run")
    p.add_argument("--quiet", type=float, default=4.0, help="healed seconds before the final check")
    p.add_argument("--bookies", type=int, default=5)
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--rate", type=float, default=150.0, help="appends/s per writer")
    p.add_argument("--fragment-entries", type=int, default=500, help="roll stream fragments every N entries (0: never)")
    p.add_argument("--kinds", help="comma-separated fault kinds (default: "
                   f"{','.join(k for k, v in KINDS.items() if v.weight)}; cut_tail only when named; those of "
                   "autorecovery, slow disks and rot only with --autorecovery, --slow-disks, --rot)")
    p.add_argument("--api", choices=["stream", "log"], default="stream",
                   help="the Stream API, or classic ledgers-to-logs (stream/log.py)")
    p.add_argument("--autorecovery", type=int, default=0, metavar="N",
                   help="N auditor + worker processes, and the faults they bring (lose_bookie, kill/pause them)")
    p.add_argument("--slow-disks", action="store_true",
                   help="the slow_disk kind: a bookie's fsyncs made slow (an LD_PRELOAD shim, built with cc)")
    p.add_argument("--lost-disk-rejoin", action="store_true",
                   help="with --autorecovery: a lost disk, once refused under its old id, comes back under it "
                        "with --on-lost-disk rejoin (not as a new bookie): ready once autorecovery drained the id")
    p.add_argument("--rot", action="store_true",
                   help="the rot_entry kind: a bit of an entry flipped on a running bookie's disk (its scrub and "
                        "autorecovery must mend it)")
    p.add_argument("--check", choices=["full", "sampled", "cheap"], default="full",
                   help="with --autorecovery: its periodic check, every 5 s: every entry from every replica, a "
                        "quarter of each fragment's windows in turn, or one ReadLac per ledger and bookie")
    p.add_argument("--quorums", default="3/3/2", metavar="E/QW/QA",
                   help="the writers' ensemble, write and ack quorums (E > Qw: a striped stream)")
    p.add_argument("--mutant", help="writers run with a broken protocol rule (stream/mutations.py)")
    p.add_argument("--plan", help="replay this schedule (a run's plan.json, e.g. tests/fault/plans/*.json)")
    p.add_argument("--no-tmpfs", action="store_true", help="no full-disk fault (no mount)")
    p.add_argument("--dir", type=Path, default=Path("fault-runs"))
    p.add_argument("--keep", action="store_true", help="keep every run's files")
    p.add_argument("--strict", action="store_true", help="fail on known anomalies too")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        e, qw, qa = (int(x) for x in args.quorums.split("/"))
    except ValueError:
        p.error(f"--quorums: E/QW/QA, three integers, got {args.quorums!r}")
    if not 1 <= qa <= qw <= e <= args.bookies:
        p.error(f"--quorums: need 1 <= Qa <= Qw <= E <= --bookies ({args.bookies}), got {args.quorums}")
    if args.lost_disk_rejoin and not args.autorecovery:
        p.error("--lost-disk-rejoin: a lost disk rejoins once autorecovery drained its id: give --autorecovery N")
    opts = Options(autorecovery=args.autorecovery, slow_disks=args.slow_disks, rot=args.rot, check=args.check,
                   lost_disk_rejoin=args.lost_disk_rejoin,
                   ensemble=e, write_quorum=qw, ack_quorum=qa, seconds=args.seconds, quiet=args.quiet, bookies=args.bookies, writers=args.writers,
                   readers=args.readers, rate=args.rate, fragment_entries=args.fragment_entries,
                   kinds=args.kinds.split(",") if args.kinds else None, keep=args.keep, tmpfs=not args.no_tmpfs,
                   mutant=args.mutant, api=args.api, plan_file=args.plan)
    args.dir.mkdir(parents=True, exist_ok=True)

    def interrupted(*_):  # a SIGTERM'd runner still stops its cluster and unmounts its tmpfs
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)
    t0 = time.monotonic()
    reports = []
    for k in range(args.runs):
        if args.minutes and time.monotonic() - t0 > args.minutes * 60:
            break
        r = run_one(args.seed + k, args.dir, opts)
        reports.append(r)
        line = {x: r.get(x) for x in ("seed", "seconds", "faults_done", "operations", "anomaly_counts",
                                      "new_anomalies", "final_error", "harness_error")}
        print(json.dumps(line), file=sys.stderr, flush=True)
    summary = summarize(reports)
    (args.dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    bad = (sum(r.get("new_anomalies", 0) for r in reports) + len(summary["harness_errors"])
           + len(summary["audit_errors"]))
    if args.strict:
        bad += sum(len(r.get("anomalies", [])) for r in reports)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
