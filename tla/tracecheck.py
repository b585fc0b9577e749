#!/usr/bin/env python3
"""TLC trace validation of simulated runs against tla/BookstreamLedger.tla.

    .venv/bin/python tla/tracecheck.py run.ndjson            # validate an exported trace
    .venv/bin/python tla/tracecheck.py --seed 5              # simulate seed 5, export, validate
    .venv/bin/python tla/tracecheck.py --seed 5 --mutant noop_without_truncate
    .venv/bin/python tla/tracecheck.py --seed 16 --runs 3   # seeds 16..18

The trace (NDJSON, sim/trace.py) is translated into a TLA+ module that
defines the constant ``Trace`` of tla/BookstreamTrace.tla (this TLC, a 2020
build, has no Json/IOUtils module to read it itself), with the protocol
spec's constants taken from the trace's header.  TLC then searches for a
behaviour of the spec that consumes the whole trace: it reports the
invariant ``Unconsumed`` violated if and only if the trace is accepted.  A
rejected trace prints the first event no behaviour could take.

What the translation decides (the rest TLC resolves):
- the client a bookie's store serves: the one whose term the record carries
  (unbounded); classic: left to TLC;
- whether the store's ack was heard: a ClientAddAnswer counted for it
  before the next store of the same entry on that bookie; a fencing read's
  answer: a ClientFenceAnswer for it; recovery reads: left to TLC;
- a read that waited for a journal barrier: the stores the barrier made
  durable (same bookie, same instant, right after it) are moved before it,
  as the answer is computed after them.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # (sim/, stream/)

import check  # noqa: E402  (tla/check.py, next to this file: java and the jar)
from bookie.tracelog import STORES, shift_terms, stored_with  # noqa: E402

TRACE_SPEC = HERE / "BookstreamTrace.tla"  # extends the finer spec (check.copy_specs copies the rest)


# -- NDJSON -> TLA+ -------------------------------------------------------------------

def _s(x: str) -> str:
    return json.dumps(str(x))


def _val(v) -> str:
    return f"<<{int(v[0])}, {_s(v[1])}>>"


def _set(xs) -> str:
    return "{" + ", ".join(_s(x) for x in xs) + "}"


def _seq(xs) -> str:
    """An ordered ensemble (striping: entry n goes to the Qw bookies from
    position n mod E); the spec keeps it as a set when E = Qw (Canon)."""
    return "<<" + ", ".join(_s(x) for x in xs) + ">>"


def _fun(d: dict) -> str:
    """{b: nb, ...} as a TLA+ function (an ensemble change's replacements)."""
    return "(" + " @@ ".join(f"{_s(k)} :> {_s(v)}" for k, v in sorted(d.items())) + ")" if d \
        else "[x \\in {} |-> \"\"]"


def _bk(o: dict) -> str:
    ents = o.get("ents", {})
    fn = " @@ ".join(f"{int(n)} :> {_val(v)}" for n, v in sorted(ents.items(), key=lambda kv: int(kv[0])))
    ents_tla = f"({fn})" if fn else "[n \\in {} |-> NoValT]"
    return f"[term |-> {o['term']}, lac |-> {o['lac']}, lafr |-> {o['lafr']}, ents |-> {ents_tla}]"


def _frags(frags) -> str:
    return "<<" + ", ".join(f"[first |-> {f}, ens |-> {_seq(e)}]" for f, e in frags) + ">>"


def _meta(o: dict) -> str:
    return f"[state |-> {_s(o['state'])}, term |-> {o['term']}, frags |-> {_frags(o['frags'])}]"


NOBK = {"term": 0, "lac": -1, "lafr": -1, "ents": {}}
NOMETA = {"state": "OPEN", "term": 0, "frags": []}


@dataclasses.dataclass
class Translated:
    module: str          # the TLA+ module TraceData (Trace and the constants' values)
    cfg: str             # the TLC configuration
    events: int          # events in Trace (the header not counted)
    header: dict


def _prepare(events: list[dict], header: dict | None = None) -> list[dict]:
    """Reorders a barrier's stores before the read that waited for them, and
    decides each store's / fencing read's "heard" from the answers after it."""
    terms: dict[int, str] = {}
    if header is not None and header["mode"] == "unbounded":
        terms[header["term"]] = header["creator"]
        for e in events:
            if e["action"] == "StartTakeover":
                terms[e["args"]["term"]] = e["args"]["client"]
    out: list[dict] = []
    i = 0
    while i < len(events):
        e = events[i]
        if e["action"] == "BookieRead":
            j = i + 1
            moved = []
            while j < len(events) and stored_with(e, events[j]):
                moved.append(events[j])
                j += 1
            if moved:
                e = dict(e)
                last = moved[-1]["bk"][e["args"]["bookie"]]
                e["bk"] = {e["args"]["bookie"]: dict(last, term=e["bk"][e["args"]["bookie"]]["term"])}
                for m in moved:  # (their snapshot is after the read: its term is not theirs)
                    m = dict(m)
                    m["bk"] = {k: dict(x, term=-1) for k, x in m["bk"].items()}
                    out.append(m)
                out.append(e)
                i = j
                continue
        out.append(e)
        i += 1
    # One fsync applies a batch of stores: only the batch's last is compared.
    for k, e in enumerate(out[:-1]):
        if e["action"] in STORES and stored_with(e, out[k + 1]):
            e["_nocheck"] = True
    for k, e in enumerate(out):
        a = e["args"]
        if e["action"] == "BookieStore":
            b, n = a["bookie"], a["record"]["entry"]
            seen = False
            for f in out[k + 1:]:
                if f["action"] == "BookieStore" and f["args"]["bookie"] == b and f["args"]["record"]["entry"] == n:
                    break
                if (f["action"] == "ClientAddAnswer" and f["args"]["bookie"] == b and f["args"]["entry"] == n
                        and f["args"]["counted"]):
                    seen = True
                    break
            e["_seen"] = seen
        elif e["action"] == "BookieRead" and a["entry"] is None:
            # heard: the reading client (the one of the read's term; classic:
            # any) takes a fencing answer from this bookie before it starts
            # another take-over
            c = terms.get(a["term"])
            heard = False
            for f in out[k + 1:]:
                if f["action"] == "StartTakeover" and c is not None and f["args"]["client"] == c:
                    break
                if (f["action"] == "ClientFenceAnswer" and f["args"]["bookie"] == a["bookie"]
                        and (c is None or f["args"]["client"] == c)):
                    heard = True
                    break
            e["_heard"] = heard
    if header is not None and header.get("read_answers"):
        _pin_read_answers(out)
    return out


def _pin_read_answers(out: list[dict]) -> None:
    """The recovery answers a decision used (tla8): each RecoveryDecide(c, n)
    gets the bookies whose ClientReadAnswer for n c recorded since its
    StartReading (``_answered``: BookstreamTrace's ReadAtDecision reads only
    those), and each recovery read whose decision follows is heard iff its
    bookie is one of them.  Only for traces that export the answers (the
    header's ``read_answers``: the simulator's, the real processes' since rtrace9)."""
    start: dict[str, int] = {}
    for k, e in enumerate(out):
        a = e["args"]
        if e["action"] in ("StartReading", "StartTakeover"):
            start[a["client"]] = k
        elif e["action"] == "RecoveryDecide":
            c, n = a["client"], a["entry"]
            e["_answered"] = sorted({f["args"]["bookie"] for f in out[start.get(c, 0):k]
                                     if f["action"] == "ClientReadAnswer" and f["args"]["client"] == c
                                     and f["args"]["entry"] == n})
    terms: dict[int, str] = {}
    for k, e in enumerate(out):
        a = e["args"]
        if e["action"] == "StartTakeover":
            terms[a["term"]] = a["client"]
        elif e["action"] == "BookieRead" and a["entry"] is not None and a["term"] in terms:
            c = terms[a["term"]]
            for f in out[k + 1:]:
                if f["action"] == "StartTakeover" and f["args"]["client"] == c:
                    break
                if f["action"] == "RecoveryDecide" and f["args"]["client"] == c and f["args"]["entry"] == a["entry"]:
                    e["_heard"] = a["bookie"] in f["_answered"]
                    break


def translate(ndjson: str) -> Translated:
    lines = [json.loads(x) for x in ndjson.splitlines() if x.strip()]
    if not lines or lines[0]["action"] != "Header":
        raise ValueError("not a trace: the first line must be the Header event (sim/trace.py)")
    if lines[0]["args"].get("term_offset"):
        lines = shift_terms(lines, lines[0]["args"]["term_offset"])
    h = lines[0]["args"]
    events = _prepare(lines[1:], h)
    classic = h["mode"] == "classic"
    term_client: dict[int, str] = {h["term"]: h["creator"]}
    max_term, max_data, crashes, frags = h["term"], -1, 0, 1
    rows = []
    for e in events:
        a, act = e["args"], e["action"]
        c, b, n, t, v = a.get("client", ""), a.get("bookie", ""), -1, -1, [0, "none"]
        ok, trunc, rl, rf, rep, heard, ens, ans = True, False, -1, -1, {}, "open", (), ()
        if act == "StartTakeover":
            t = a["term"]
            term_client[t] = c
            max_term = max(max_term, t)
        elif act == "WriterAdd":
            n = a["entry"]
            max_data = max(max_data, n)
        elif act == "StartReading":
            n = a["start"]
        elif act == "RecoveryDecide":  # ans: the bookies whose answers it may use
            n, ans = a["entry"], tuple(e.get("_answered", h["bookies"]))
        elif act == "ClientSendAdd":
            r = a["record"]
            n, v, trunc, rl, rf, t = r["entry"], a["value"], r["truncate"], r["lac"], r["lafr"], r["term"]
        elif act == "BookieStore":
            r = a["record"]
            n, v, trunc, rl, rf = r["entry"], a["value"], r["truncate"], r["lac"], r["lafr"]
            c = term_client.get(r["term"], "") if h["mode"] == "unbounded" else ""
            heard = "yes" if e["_seen"] else "no"
        elif act == "BookieStoreLac":
            rl, rf = a["lac"], a["lafr"]
        elif act == "BookieRead":
            t = a["term"]
            n = -1 if a["entry"] is None else a["entry"]
            ok = a["status"] in ("OK", "NO_SUCH_ENTRY")
            c = term_client.get(t, "") if h["mode"] == "unbounded" else ""
            if ok and (a["entry"] is None or "_heard" in e):  # (recovery reads: pinned, tla8)
                heard = "yes" if e["_heard"] else "no"
        elif act == "EnsembleChange":
            n = a["first"]
            rep = dict(a["replaced"])  # one or several, each into the replaced bookie's position
            frags = max(frags, len(e["meta"]["frags"]) if "meta" in e else frags)
        elif act == "RollFragment":  # BookstreamFiner's RollFragment
            n, ens = a["first"], a["ensemble"]
            frags = max(frags, len(e["meta"]["frags"]) if "meta" in e else frags)
        elif act == "BookiePrepare":  # checked at the change or roll it prepares for
            n, t, ok = a["first"], a["term"], a["accepted"]
        elif act == "BookieCrash":
            crashes += 1
        bk = e.get("bk", {}).get(b, NOBK)
        meta = e.get("meta", NOMETA)
        if classic:  # the implementation's classic ledgers have term 0, the spec's metadata term 1
            meta = dict(meta, term=meta["term"] + 1)
            if act == "StartTakeover":
                t += 1
        rows.append(
            f"[a |-> {_s(act)}, c |-> {_s(c)}, b |-> {_s(b)}, n |-> {n}, t |-> {t}, v |-> {_val(v)}, "
            f"ok |-> {'TRUE' if ok else 'FALSE'}, trunc |-> {'TRUE' if trunc else 'FALSE'}, "
            f"rl |-> {rl}, rf |-> {rf}, rep |-> {_fun(rep)}, ens |-> {_seq(ens)}, ans |-> {_set(ans)}, "
            f"h |-> {_s(heard)}, "
            f"hasbk |-> {'TRUE' if 'bk' in e and not e.get('_nocheck') else 'FALSE'}, bk |-> {_bk(bk)}, "
            f"hasmeta |-> {'TRUE' if 'meta' in e else 'FALSE'}, meta |-> {_meta(meta)}]")
    ens0 = h["frags"][0][1]
    module = "\n".join([
        "---- MODULE TraceData ----",
        "EXTENDS Integers, TLC",
        'NoValT == <<0, "none">>',
        f"BookiesV == {_set(h['bookies'])}",
        f"Ensemble0V == {_set(ens0)}",
        f"Ensemble0OrderV == {_seq(ens0)}",
        f"ClientsV == {_set(h['clients'])}",
        f"CreatorV == {_s(h['creator'])}",
        f"PreparesTraced == {'TRUE' if h.get('prepares') else 'FALSE'}",
        "Trace == <<\n  " + ",\n  ".join(rows) + "\n>>",
        "====", ""])
    cfg = "\n".join([
        "CONSTANTS",
        "    Bookies <- BookiesV", "    Ensemble0 <- Ensemble0V", "    Ensemble0Order <- Ensemble0OrderV",
        "    Clients <- ClientsV",
        "    Creator <- CreatorV",
        f"    WQ = {h['Qw']}", f"    AQ = {h['Qa']}", f'    Mode = "{h["mode"]}"',
        f"    MaxTerm = {max(max_term, 1)}", f"    MaxDataId = {max(max_data, 0)}",
        f"    InflightLimit = {h['window']}", f"    MaxCrashes = {crashes}",
        f"    MaxFragments = {max(frags, 1) + 8}", "    LostAcks = TRUE", '    Mutant = "none"',
        "INIT TraceInit", "NEXT TraceNext", "INVARIANT Unconsumed", ""])
    return Translated(module, cfg, len(rows), h)


# -- running TLC ------------------------------------------------------------------------

@dataclasses.dataclass
class Verdict:
    accepted: bool
    events: int
    consumed: int          # events a behaviour consumed (all of them if accepted)
    distinct: int | None
    seconds: float
    stuck_at: dict | None  # the first event no behaviour took (rejected traces)
    output: str

    def describe(self) -> str:
        if self.accepted:
            return f"accepted: {self.events} events, {self.distinct} states, {self.seconds:.1f} s"
        ev = self.stuck_at
        what = f"{ev['action']} {json.dumps(ev['args'], sort_keys=True)[:300]}" if ev else "?"
        return (f"REJECTED after {self.consumed} of {self.events} events ({self.distinct} states, "
                f"{self.seconds:.1f} s): "
                f"no behaviour of the spec takes event {self.consumed + 1}: {what}")


def validate(ndjson: str, tools: "check.Tools | None" = None, *, timeout: float = 300) -> Verdict:
    tools = tools or check.find_tools()
    tr = translate(ndjson)
    events = [json.loads(x) for x in ndjson.splitlines() if x.strip()]
    if events[0]["args"].get("term_offset"):
        events = shift_terms(events, events[0]["args"]["term_offset"])
    prepared = _prepare(events[1:], events[0]["args"])
    with tempfile.TemporaryDirectory(prefix="tlc-trace-") as tmp:
        check.copy_specs(tmp, (TRACE_SPEC,))
        Path(tmp, "TraceData.tla").write_text(tr.module)
        Path(tmp, "MC.tla").write_text("---- MODULE MC ----\nEXTENDS BookstreamTrace\n====\n")
        Path(tmp, "MC.cfg").write_text(tr.cfg)
        # a trace is a few seconds of TLC, mostly start-up: the JIT's first tier
        # only (session 10: 2.6 -> 1.7 s for an 88-event trace, 4.5 -> 3.6 for 530)
        cmd = check.tlc_command(tools, tmp, "-workers", "1", "-deadlock", "-config", "MC.cfg", "MC.tla",
                                jvm=("-XX:TieredStopAtLevel=1", "-Xss16m"))
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout)
            out = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            out = (e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
            out += f"\n[tracecheck.py: killed after {timeout:.0f} s]"
        dt = time.monotonic() - t0
    outcome, distinct, _gen, _left, depth = check.parse(out)
    if outcome == "violation:Unconsumed":
        return Verdict(True, tr.events, tr.events, distinct, dt, None, out)
    if outcome != check.OK:
        raise RuntimeError(f"TLC did not finish the trace check ({outcome}):\n{out[-3000:]}")
    reached = re.findall(r'<<"consumed", (\d+)>>', out)
    consumed = int(reached[-1]) if reached else max((depth or 1) - 1, 0)
    stuck = prepared[consumed] if consumed < len(prepared) else None
    return Verdict(False, tr.events, consumed, distinct, dt, stuck, out)


# -- simulated runs -----------------------------------------------------------------------

def simulate(seed: int, mutant: str | None = None, **overrides) -> str:
    """One simulated run's trace (NDJSON).  With a mutant, the run is not
    checked by the harness (the trace goes to TLC whole)."""
    from sim.scenario import Scenario
    from sim.trace import Tracer
    from sim.world import Violation, World
    from stream import mutations

    sc = Scenario.random(seed, **overrides)
    w = World(sc, check_trace=mutant is None, check_invariants=mutant is None,
              mutations=mutations.Mutations.of(mutant))
    tr = Tracer.attach(w)
    try:
        w.run()
    except Violation:
        if mutant is None:
            raise
    return tr.ndjson()


def simulate_script(name: str, mutant: str | None = None) -> str:
    """The trace of one of ``sim/scripted.py``'s schedules (one that takes
    ``attach``, e.g. ``recovery_hole``); with a mutant, unchecked by the
    harness, as :func:`simulate`."""
    from sim import scripted
    from sim.trace import Tracer
    from sim.world import Violation
    from stream import mutations

    tracers: list = []

    def attach(w) -> None:
        tracers.append(Tracer.attach(w))
        w.check_invariants = mutant is None  # a mutant's run goes on past its damage

    try:
        scripted.SCRIPTS[name](check_trace=mutant is None, attach=attach, mutations=mutations.Mutations.of(mutant))
    except Violation:
        if mutant is None:
            raise
    return tracers[0].ndjson()


# The profile of the CI sample: E = Qw, no rolls; the recovery's
# read-ahead is the scenario's own (1, 2, 4 or 16; BookstreamTrace's
# ReadAtDecision) unless given.  ``striped``: the scenario's own Qw (E > Qw
# in 30 % of seeds: sim/scenario.py), validated since stripe9.
PROFILE = dict(roll_entries=0)


def profile_for(seed: int, read_ahead: int | None = None, *, striped: bool = False) -> dict:
    from sim.scenario import Scenario
    sc = Scenario.random(seed)
    qw = {} if striped else {"Qw": sc.E}
    return dict(PROFILE, **qw, **({} if read_ahead is None else {"read_ahead": read_ahead}))


def striped_seeds(start: int, count: int) -> list[int]:
    """The first ``count`` seeds from ``start`` whose scenario stripes (E > Qw)."""
    from sim.scenario import Scenario
    out, s = [], start
    while len(out) < count:
        sc = Scenario.random(s)
        if sc.E > sc.Qw:
            out.append(s)
        s += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="?", help="an NDJSON trace (sim/trace.py)")
    ap.add_argument("--seed", type=int, help="simulate this seed (in the validated profile) and validate it")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--read-ahead", type=int, help="the recovery's read-ahead window (default: the scenario's)")
    ap.add_argument("--mutant", help="a stream/mutations.py mutation for the simulated run")
    ap.add_argument("--striped", action="store_true",
                    help="keep the scenario's Qw (the seeds' E > Qw runs stripe) instead of Qw = E")
    ap.add_argument("--save", help="write the NDJSON trace / the TLA+ module here (prefix)")
    ap.add_argument("--raw", action="store_true", help="print TLC's output")
    args = ap.parse_args(argv)
    tools = check.find_tools()
    jobs: list[tuple[str, str]] = []
    if args.trace:
        jobs.append((args.trace, Path(args.trace).read_text()))
    elif args.seed is not None:
        for s in range(args.seed, args.seed + args.runs):
            prof = profile_for(s, args.read_ahead, striped=args.striped)
            jobs.append((f"seed {s}", simulate(s, args.mutant, **prof)))
    else:
        ap.error("give a trace file or --seed")
    bad = 0
    for label, text in jobs:
        if args.save:
            Path(f"{args.save}.ndjson").write_text(text)
            tr = translate(text)
            Path(f"{args.save}.tla").write_text(tr.module)
            Path(f"{args.save}.cfg").write_text(tr.cfg)
        v = validate(text, tools)
        print(f"{label}: {v.describe()}")
        if args.raw:
            print(v.output)
        bad += not v.accepted
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
