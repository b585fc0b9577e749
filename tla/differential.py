#!/usr/bin/env python3
"""sim/spec.py checked against TLC (issue 14 item 5): the same traces judged
by both checkers, and their verdicts compared.

    .venv/bin/python tla/differential.py --seeds 14,3 --perturb 40     # 40 edits of each seed's trace
    .venv/bin/python tla/differential.py --seeds 14 --mutants          # the implementation mutants' traces

The simulator checks every step of every run with sim/spec.py, a Python
transcription of the spec; TLC validates a sample of the same runs against
the spec itself (tla/tracecheck.py).  On a run both accept, they agree; but
the simulator's runs are the implementation's behaviours only, and a
transcription that lets through a step the spec forbids is caught only if
the implementation takes that step.  Here traces are edited at random (an
event dropped, two swapped, a number moved by one, a flag flipped, an
outcome, a status or an actor changed, a reported state changed) and each
edited trace goes to both: sim/spec.py through ``sim/spec_replay.py``, the
spec through TLC.  The verdict pairs:

- ``agree``: both accept, or both reject;
- ``lax``: sim/spec.py accepts what TLC rejects: the transcription allows a
  behaviour the spec does not.  A finding (exit 1);
- ``strict``: sim/spec.py rejects what TLC accepts: the transcription
  checks what the trace spec leaves open (admissions, acks, sends and
  answers are stutters there; the clients' guards on them are
  sim/spec.py's), or is stricter than the spec.  Reported by action.

An edited trace is cut ``--tail`` events after the edit (a prefix of a
trace both accept is accepted by both), which bounds TLC's time.
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import check  # noqa: E402
import tracecheck  # noqa: E402
from sim.spec_replay import replay  # noqa: E402

NUMBERS = ("entry", "term", "lac", "lafr", "first", "start", "durable_term", "last")
FLAGS = ("accepted", "counted", "fence", "truncate", "noop", "recovery", "exists", "durable_fenced", "writer")
CHOICES = {"outcome": ("recovered", "absent", "data_loss"), "status": ("OK", "NO_SUCH_ENTRY", "INVALID_TERM"),
           "value": ("data", "noop", None)}


@dataclass
class Case:
    seed: int
    edit: str
    at: int              # the edited event's index
    replay: str          # "accept" | "reject@k (action)"
    tlc: str
    kind: str            # agree | lax | strict | error


def _leaves(d: dict, path=()):
    """(path, value) of every scalar in an event's args (records nested)."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, path + (k,))
        else:
            yield path + (k,), v


def _set(d: dict, path, v) -> None:
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = v


def perturb(events: list[dict], rng: random.Random, header: dict) -> tuple[list[dict], str, int]:
    """One random edit of the trace (never its header): the edited events,
    a description, the index edited."""
    evs = copy.deepcopy(events)
    while True:
        k = rng.randrange(1, len(evs))
        e = evs[k]
        op = rng.choice(("drop", "swap", "number", "flag", "choice", "actor", "state"))
        if op == "drop":
            del evs[k]
            return evs, f"drop {e['action']}", k
        if op == "swap" and k + 1 < len(evs):
            evs[k], evs[k + 1] = evs[k + 1], evs[k]
            return evs, f"swap {e['action']} / {evs[k]['action']}", k
        leaves = list(_leaves(e["args"]))
        if op == "number":
            cands = [(p, v) for p, v in leaves if p[-1] in NUMBERS and isinstance(v, int) and not isinstance(v, bool)]
            if cands:
                p, v = rng.choice(cands)
                nv = v + rng.choice((-1, 1))
                if nv >= -1:
                    _set(e["args"], p, nv)
                    return evs, f"{e['action']} {'.'.join(p)} {v} -> {nv}", k
        if op == "flag":
            cands = [(p, v) for p, v in leaves if p[-1] in FLAGS and isinstance(v, bool)]
            if cands:
                p, v = rng.choice(cands)
                _set(e["args"], p, not v)
                return evs, f"{e['action']} {'.'.join(p)} {v} -> {not v}", k
        if op == "choice":
            cands = [(p, v) for p, v in leaves if p[-1] in CHOICES and e["action"] != "WriterAdd"
                     and not (p[-1] == "value" and e["action"] != "ClientReadAnswer")]
            if cands:
                p, v = rng.choice(cands)
                nv = rng.choice([x for x in CHOICES[p[-1]] if x != v])
                _set(e["args"], p, nv)
                return evs, f"{e['action']} {'.'.join(p)} {v} -> {nv}", k
        if op == "actor":
            for role, pool in (("client", header["clients"]), ("bookie", header["bookies"])):
                if role in e["args"] and len(pool) > 1:
                    v = e["args"][role]
                    nv = rng.choice([x for x in pool if x != v])
                    e["args"][role] = nv
                    e["actor"] = nv if e["actor"] == v else e["actor"]
                    if "bk" in e and v in e["bk"] and role == "bookie":
                        e["bk"] = {nv: e["bk"][v]}
                    return evs, f"{e['action']} {role} {v} -> {nv}", k
        if op == "state" and "bk" in e:
            b, o = next(iter(e["bk"].items()))
            field = rng.choice(("lac", "lafr", "ents"))
            if field == "ents":
                if not o["ents"]:
                    continue
                n = rng.choice(sorted(o["ents"]))
                v = o["ents"][n]
                o["ents"][n] = [v[0], "noop" if v[1] == "data" else "data"]
                return evs, f"{e['action']} reports {b}'s entry {n} as {o['ents'][n]}", k
            o[field] += rng.choice((-1, 1))
            return evs, f"{e['action']} reports {b}'s {field} {o[field]}", k


def _ndjson(events: list[dict]) -> str:
    return "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)


def judge(header_ev: dict, body: list[dict], tools) -> tuple[str, str]:
    evs = [header_ev] + body
    rv = replay(evs)
    r = "accept" if rv.accepted else f"reject@{rv.rejected_at} ({rv.action}: {rv.reason[:120]})"
    try:
        tv = tracecheck.validate(_ndjson(evs), tools, timeout=120)
        t = "accept" if tv.accepted else f"reject@{tv.consumed + 1} ({tv.stuck_at['action'] if tv.stuck_at else '?'})"
    except Exception as x:  # an edit TLC cannot even read (an id outside the model's)
        t = f"error ({type(x).__name__}: {str(x).splitlines()[0][:100]})"
    return r, t


def kind_of(r: str, t: str) -> str:
    if t.startswith("error"):
        return "error"
    ra, ta = r == "accept", t == "accept"
    return "agree" if ra == ta else ("lax" if ra else "strict")


def run_seed(seed: int, n: int, tail: int, tools, rng: random.Random, say=print) -> list[Case]:
    nd = tracecheck.simulate(seed, **tracecheck.profile_for(seed))
    events = [json.loads(x) for x in nd.splitlines() if x.strip()]
    header, body = events[0], events[1:]
    base = replay(events)
    assert base.accepted, f"seed {seed}: sim/spec.py rejects the unedited trace: {base.describe()}"
    out = []
    for _ in range(n):
        edited, what, k = perturb(events, rng, header["args"])
        cut = edited[:k + 1 + tail]
        r, t = judge(header, cut[1:], tools)
        c = Case(seed, what, k, r, t, kind_of(r, t))
        say(f"  seed {seed} event {k:4d} {c.kind:6s} {what[:70]:70s} sim/spec.py {r[:60]}; TLC {t[:40]}")
        out.append(c)
    del body
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="14", help="comma-separated seeds of the validated profile")
    ap.add_argument("--perturb", type=int, default=20, help="edited traces per seed")
    ap.add_argument("--tail", type=int, default=40, help="events kept after the edit")
    ap.add_argument("--rng", type=int, default=1, help="the edits' random seed")
    args = ap.parse_args(argv)
    tools = check.find_tools()
    rng = random.Random(args.rng)
    t0 = time.monotonic()
    cases: list[Case] = []
    for s in (int(x) for x in args.seeds.split(",")):
        cases += run_seed(s, args.perturb, args.tail, tools, rng)
    counts = collections.Counter(c.kind for c in cases)
    strict = collections.Counter(c.edit.split()[0] if not c.edit.startswith(("drop", "swap")) else c.edit.split()[1]
                                 for c in cases if c.kind == "strict")
    print(f"{len(cases)} edited traces in {time.monotonic() - t0:.0f} s: " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if strict:
        print("strict, by the edited event's action: " + ", ".join(f"{k} {v}" for k, v in strict.most_common()))
    for c in cases:
        if c.kind == "lax":
            print(f"LAX: seed {c.seed}, event {c.at}: {c.edit}: sim/spec.py accepts, TLC {c.tlc}")
    return 1 if counts.get("lax") else 0


if __name__ == "__main__":
    sys.exit(main())
