#!/usr/bin/env python3
"""TLC's own behaviours of tla/BookstreamLedger.tla replayed through
sim/spec.py (issue 14 item 5): is the transcription stricter than the spec?

    .venv/bin/python tla/behaviours.py --config unbounded --behaviours 50 --depth 30 --seed 1
    .venv/bin/python tla/behaviours.py --config unbounded,classic,unbounded_striped_ensemble

TLC 2.15 (2020) has no way to dump the behaviours its simulation mode
generates, so they come out as error traces: a wrapper module
(``BookstreamBehaviours``, written next to copies of the spec in a scratch
directory) adds the invariant ``TLCGet("level") < depth``, which every
random behaviour violates at its ``depth``-th step, and TLC runs with
``-simulate -seed S -continue`` (one worker): it prints each behaviour that
gets that deep, from the initial state, and goes on with the next.  The
configuration's own invariants and properties are dropped (the run checks
nothing but the depth; the configurations' CI runs check the rest); its
constants and state constraints are kept.  Once ``--behaviours`` traces
are in, TLC is stopped.  Each behaviour is then replayed by
sim/spec_tlc.py; the first step sim/spec.py refuses (or where its state
differs from TLC's) is printed with the behaviour's prefix, and the exit
code is 1.
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import check  # noqa: E402
import tlcvalues  # noqa: E402

from sim import spec_tlc  # noqa: E402

INVARIANT = "BehaviourShorterThanDepth"
# The configurations whose constants sim/spec.py's model takes (no mutant).
# `all`: the CI ones and the extended ones of Spec (liveness: FairSpec, the same steps).
CONFIGS = ["unbounded", "unbounded_lost_acks", "unbounded_terms3", "unbounded_ensemble", "unbounded_crash",
           "unbounded_hole", "unbounded_crash_ids2", "unbounded_crash_timeouts", "unbounded_striped",
           "unbounded_striped_ensemble", "classic", "ext_lost_acks_any_order", "ext_ensemble_crash",
           # BookstreamFiner (sim/spec_tlc_finer.py): channels, stale stores and reads, explicit
           # LACs, give-ups, restarts, rolls, several bookies replaced at once
           "finer", "finer_rolls", "finer_multi", "sim_finer"]


def constants(cfg_text: str) -> dict:
    """The CONSTANTS of a .cfg, as TLC values."""
    out, on = {}, False
    for line in cfg_text.splitlines():
        line = line.split("\\*")[0].rstrip()
        if re.match(r"^\s*CONSTANTS?\b", line):
            on = True
            line = re.sub(r"^\s*CONSTANTS?", "", line)
        elif re.match(r"^[A-Z]", line):
            on = False
        if on and "=" in line:
            name, _, val = line.partition("=")
            out[name.strip()] = tlcvalues.parse_value(val.strip())
    return out


def consts_of(cfg_text: str) -> spec_tlc.Consts:
    c = constants(cfg_text)
    return spec_tlc.Consts(bookies=tuple(sorted(str(b) for b in c["Bookies"])),
                           ensemble0=tuple(sorted(str(b) for b in c["Ensemble0"])),
                           clients=tuple(sorted(str(x) for x in c["Clients"])), creator=str(c["Creator"]),
                           WQ=c["WQ"], AQ=c["AQ"], mode=c["Mode"], inflight=c["InflightLimit"],
                           lost_acks=c["LostAcks"])


def behaviour_cfg(cfg_text: str, *, symmetry: bool = False) -> str:
    """The configuration with the depth invariant instead of its checks
    (and its symmetry only if asked: breadth-first search)."""
    drop = "INVARIANTS?|PROPERTIES|PROPERTY" + ("" if symmetry else "|SYMMETRY")
    keep = [ln for ln in cfg_text.splitlines() if not re.match(rf"^\s*({drop})\b", ln)]
    return "\n".join(keep) + f"\nINVARIANT {INVARIANT}\n"


WRAPPER = """---- MODULE BookstreamBehaviours ----
EXTENDS {module}
\\* violated by every behaviour at its depth-th step (or, with a Target, where it reaches
\\* the Target): TLC prints it (tla/behaviours.py)
Target == {until}
{inv} == {bound}
====
"""

# Targets (--until): rare situations, so that TLC prints the behaviours that reach them.
TARGETS = {
    # a recovery ended (or goes on reading) at an entry a bookie of its write set holds a
    # value of, older than the recovery's floor: a stale answer counted as NoSuchEntry
    "stale": '\\E c \\in Clients : cl[c].phase \\in {"reading", "finishing"} /\\ '
             '\\E b \\in WriteSetOf(cl[c].next, cl[c].rens) : '
             'bk[b].ents[cl[c].next] # NoVal /\\ Origin(bk[b].ents[cl[c].next]) < cl[c].floor',
    # a recovery changed its ensemble
    "recovery_change": '\\E c \\in Clients : Recovering(c) /\\ cl[c].frags # <<>> /\\ '
                       'LastFrag(cl[c].frags).ens # cl[c].rens',
}


@dataclass
class Run:
    config: str
    seed: int
    depth: int
    behaviours: list          # [[tlcvalues.State]]
    seconds: float            # TLC's wall time
    output_tail: str


def generate(config: str, tools: check.Tools, *, depth: int, seed: int, count: int,
             budget: float = 60, until: str = "FALSE", bfs: bool = False) -> Run:
    """Up to ``count`` random behaviours of ``depth`` steps from TLC; with
    ``until`` (a TLA+ predicate), only those that reach a state where it
    holds (within ``depth`` steps), up to that state.  ``bfs``: TLC's
    breadth-first search instead of random simulation (with ``until``: the
    shortest behaviours to each state where it holds; seed and depth
    unused)."""
    cfg_text = (check.MODELS / f"{config}.cfg").read_text()
    with tempfile.TemporaryDirectory(prefix=f"tlc-beh-{config}-") as tmp:
        check.copy_specs(tmp)
        Path(tmp, "BookstreamBehaviours.tla").write_text(WRAPPER.format(
            module=check.BY_NAME[config].module, inv=INVARIANT, until=until, bound=f'TLCGet("level") < {depth}' if until == "FALSE" else "~Target"))
        Path(tmp, "behaviours.cfg").write_text(behaviour_cfg(cfg_text, symmetry=bfs))
        cmd = check.tlc_command(tools, tmp, "-workers", "1", "-config", "behaviours.cfg", "-deadlock", "-continue",
                                "BookstreamBehaviours.tla", jvm=(f"-Dtlc2.TLC.stopAfter={int(budget)}",))
        if not bfs:
            cmd[-1:-1] = ["-simulate", "-depth", str(depth + 2), "-seed", str(seed)]
        t0 = time.monotonic()
        marker = f"Error: Invariant {INVARIANT} is violated."
        lines, errors = [], 0
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for line in proc.stdout:
                if line.startswith(marker):
                    errors += 1
                    if errors > count:  # the count-th trace is complete: stop TLC (the process we started)
                        break
                lines.append(line)
                if time.monotonic() - t0 > budget + 30:
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        seconds = time.monotonic() - t0
    out = "".join(lines)
    if errors == 0 and "Error:" in out:
        raise RuntimeError(f"TLC failed on {config}:\n{out[-3000:]}")
    return Run(config, seed, depth, tlcvalues.behaviours(out + "\n\n", INVARIANT)[:count], seconds, out[-2000:])


@dataclass
class Report:
    config: str
    behaviours: int
    distinct: int
    steps: int
    actions: collections.Counter
    kinds: collections.Counter   # the kinds of step (sim/spec_tlc.kind) of the accepted behaviours
    tlc_seconds: float
    replay_seconds: float
    failures: list            # [(behaviour index, Verdict)]

    def lines(self) -> list[str]:
        out = [f"{self.config}: {self.behaviours} behaviours ({self.distinct} distinct), {self.steps} steps, "
               f"TLC {self.tlc_seconds:.1f} s, replay {self.replay_seconds:.1f} s, "
               + (f"{len(self.failures)} REFUSED" if self.failures else "all accepted by sim/spec.py")]
        out.append("  actions: " + ", ".join(f"{a} {n}" for a, n in sorted(self.actions.items())))
        out.append("  kinds: " + ", ".join(f"{a} {n}" for a, n in sorted(self.kinds.items()) if "[" in a))
        for i, v in self.failures[:5]:
            out.append(f"  behaviour {i}: {v.describe()}")
        return out


def check_config(config: str, tools: check.Tools, *, behaviours: int, depth: int, seed: int,
                 budget: float = 60, until: str = "FALSE", bfs: bool = False) -> Report:
    k = consts_of((check.MODELS / f"{config}.cfg").read_text())
    run = generate(config, tools, depth=depth, seed=seed, count=behaviours, budget=budget, until=until,
                   bfs=bfs)
    acts: collections.Counter = collections.Counter()
    kinds: collections.Counter = collections.Counter()
    failures, keys = [], set()
    t0 = time.monotonic()
    for i, b in enumerate(run.behaviours):
        keys.add(tuple((st.action, repr(sorted(st.vars.items(), key=lambda kv: kv[0]))) for st in b))
        acts.update(st.action for st in b[1:])
        v = spec_tlc.replay(b, k)
        kinds.update(v.kinds)
        if not v.accepted:
            failures.append((i, v))
    return Report(config, len(run.behaviours), len(keys), sum(len(b) - 1 for b in run.behaviours), acts, kinds,
                  run.seconds, time.monotonic() - t0, failures)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="unbounded", help=f"comma-separated; 'all': {','.join(CONFIGS)}")
    ap.add_argument("--behaviours", type=int, default=50)
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--budget", type=float, default=60, help="TLC's seconds per configuration at most")
    ap.add_argument("--until", default="FALSE", help=f"stop each behaviour where this TLA+ predicate holds, "
                                                     f"or one of {', '.join(TARGETS)}")
    ap.add_argument("--bfs", action="store_true", help="breadth-first (with --until: the shortest behaviours "
                                                       "to the target), not random simulation")
    args = ap.parse_args(argv)
    names = CONFIGS if args.config == "all" else args.config.split(",")
    try:
        tools = check.find_tools()
    except check.ToolError as e:
        print(f"behaviours.py: {e}", file=sys.stderr)
        return 2
    bad = 0
    for name in names:
        r = check_config(name, tools, behaviours=args.behaviours, depth=args.depth, seed=args.seed,
                         budget=args.budget, until=TARGETS.get(args.until, args.until), bfs=args.bfs)
        print("\n".join(r.lines()), flush=True)
        bad += len(r.failures) + (r.behaviours == 0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
