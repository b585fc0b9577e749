"""sim/spec.py replays behaviours TLC itself generates from
tla/BookstreamLedger.tla (issue 14 item 5; sim/spec_tlc.py,
tla/behaviours.py, tla/tlcvalues.py): the transcription must accept every
spec behaviour, and a rule made stricter on purpose must be found.
"""
from __future__ import annotations

import dataclasses
import subprocess

import pytest

from sim import spec as S
from sim import spec_tlc
from tests.tla_support import behaviours, check, tlcvalues, tools  # noqa: F401  (tools: a fixture)

V = tlcvalues


# -- TLC's values --------------------------------------------------------------------------

def test_values_of_every_kind():
    assert V.parse_value("-1") == -1 and V.parse_value("42") == 42
    assert V.parse_value('"IN_RECOVERY"') == "IN_RECOVERY"
    assert V.parse_value("TRUE") is True and V.parse_value("FALSE") is False
    b1 = V.parse_value("b1")
    assert isinstance(b1, V.ModelValue) and b1 == "b1"
    assert V.parse_value("{}") == frozenset() and V.parse_value("<<>>") == ()
    assert V.parse_value("{b1, b2}") == frozenset({"b1", "b2"})
    assert V.parse_value('<<2, "noop">>') == (2, "noop")
    r = V.parse_value("[first |-> 0, ens |-> {b1, b3}]")
    assert isinstance(r, V.Record) and r == {"first": 0, "ens": frozenset({"b1", "b3"})}
    f = V.parse_value('(0 :> <<0, "none">> @@ 1 :> <<1, "data">>)')
    assert isinstance(f, V.Func) and f == {0: (0, "none"), 1: (1, "data")}
    nested = V.parse_value('(c1 :> [frags |-> <<[first |-> 0, ens |-> <<b2, b1>>]>>, ack |-> (0 :> {b1} @@ 1 :> {})]'
                           ' @@ c2 :> [frags |-> <<>>, ack |-> (0 :> {} @@ 1 :> {})])')
    assert nested["c1"]["frags"][0]["ens"] == ("b2", "b1") and nested["c1"]["ack"][0] == {"b1"}
    assert V.parse_value('{<<0, <<1, "data">>>>}') == frozenset({(0, (1, "data"))})
    assert V.parse_value('"a \\"q\\""') == 'a "q"'
    with pytest.raises(TypeError):
        f[0] = 1  # (hashable: never changed after parsing)
    for bad in ("<<1, 2", "[a |-> ]", "(1 :> 2 3)", "{1} 2", "%"):
        with pytest.raises(V.ParseError):
            V.parse_value(bad)


TRACE = """Error: Invariant Deep is violated.
Error: The behavior up to this point is:
State 1: <Initial predicate>
/\\ x = (b1 :> 0 @@
  b2 :> 0)
/\\ y = {}

State 2: <Step line 10, col 5 to line 12, col 30 of module M>
/\\ x = (b1 :> 1 @@ b2 :> 0)
/\\ y = {b1}

Error: Invariant Deep is violated.
Error: The behavior up to this point is:
State 1: <Initial predicate>
/\\ x = (b1 :> 0 @@ b2 :> 0)
/\\ y = {}

State 2: <Other line 20, col 5 to line 21, col 9 of module M>
/\\ x = (b1 :> 0 @@ b2 :> 0)
"""


def test_error_traces_split_into_behaviours():
    bs = V.behaviours(TRACE, "Deep")
    # the second trace's last state is cut off (no blank line after it): dropped
    assert [[s.action for s in b] for b in bs] == [["Init", "Step"], ["Init"]]
    assert bs[0][0].vars == {"x": {"b1": 0, "b2": 0}, "y": frozenset()}
    assert bs[0][1].vars["y"] == {"b1"} and bs[0][1].location.startswith("line 10, col 5")
    assert V.behaviours(TRACE, "Other") == []


def test_configuration_constants_and_the_behaviour_cfg():
    text = (check.MODELS / "unbounded_striped.cfg").read_text()
    k = behaviours.consts_of(text)
    assert (k.bookies, k.WQ, k.AQ, k.mode, k.striped, k.shift) == (("b1", "b2", "b3"), 2, 1, "unbounded", True, 0)
    cfg = behaviours.behaviour_cfg(text)
    assert "INVARIANT BehaviourShorterThanDepth" in cfg and "NoDivergence" not in cfg and "PROPERTIES" not in cfg
    assert behaviours.consts_of((check.MODELS / "classic.cfg").read_text()).shift == 1


# -- the replay -------------------------------------------------------------------------------

RUNS: dict = {}


def run(tools, config: str, seed: int = 5, count: int = 8, depth: int = 30, **kw):
    key = (config, seed, count, depth, tuple(sorted(kw.items())))
    if key not in RUNS:  # (one TLC run per key for the whole file)
        RUNS[key] = behaviours.generate(config, tools, depth=depth, seed=seed, count=count, budget=40, **kw)
    return RUNS[key]


def consts(config: str) -> spec_tlc.Consts:
    return behaviours.consts_of((check.MODELS / f"{config}.cfg").read_text())


@pytest.mark.parametrize("config,needs", [
    ("unbounded_lost_acks", {"Deliver[ack lost, unseen]", "FenceReadH[unheard]", "RecoveryReadH[absent]"}),
    ("unbounded_crash", {"Crash", "EnsembleChangeMap[open]", "EnsembleChangeMap[reading]", "Finish"}),
    ("unbounded_striped_ensemble", {"EnsembleChangeMap[open]", "EnsembleChangeMap[finishing]",
                                    "NoticeTakeover[open]"}),
    ("classic", {"StartTakeover", "RecoveryReadH[absent]", "Finish", "Deliver[seen, open]"}),
])
def test_tlc_behaviours_are_accepted_by_sim_spec(tools, config, needs):
    r = run(tools, config)
    assert len(r.behaviours) == 8
    k, kinds, steps = consts(config), {}, 0
    for i, b in enumerate(r.behaviours):
        v = spec_tlc.replay(b, k)
        assert v.accepted, f"{config} seed 5 behaviour {i}: {v.describe()}"
        steps += v.steps
        for x, n in v.kinds.items():
            kinds[x] = kinds.get(x, 0) + n
    assert steps >= 8 * 10
    assert needs <= set(kinds), f"{config}: the behaviours did not cover {needs - set(kinds)}: {kinds}"


def test_finer_spec_behaviours_are_accepted_and_a_stricter_give_up_is_found(tools, monkeypatch):
    """BookstreamFiner's steps (sim/spec_tlc_finer.py): TLC names them all
    after FinerNext's disjuncts, the replay finds the action."""
    r = run(tools, "sim_finer", count=8, depth=40)
    assert len(r.behaviours) == 8
    k, kinds = consts("sim_finer"), {}
    for b in r.behaviours:
        v = spec_tlc.replay(b, k)
        assert v.accepted, v.describe()
        for x, n in v.kinds.items():
            kinds[x] = kinds.get(x, 0) + n
    assert {"SendAdd[finer]", "StaleRead[finer]", "StoreLac[finer]", "Restart[finer]", "Withdraw[finer]"} <= set(kinds), \
        kinds
    # a stricter give-up (only an open writer may withdraw): found
    real = S.Model.Withdraw

    def withdraw(self, c):
        if self.cl[c].phase != "open":
            raise S.SpecViolation("Withdraw", f"{c} is {self.cl[c].phase}")
        real(self, c)

    monkeypatch.setattr(S.Model, "Withdraw", withdraw)
    vs = [spec_tlc.replay(b, k) for b in r.behaviours]
    assert any(not v.accepted and "refused by Withdraw" in v.reason for v in vs), [v.describe() for v in vs]


def test_behaviours_to_a_stale_value_below_the_floor_are_accepted(tools):
    """Log matching's stale value (older than the recovery's floor, held by
    a bookie of the entry's write set where the recovery ends or reads) is
    too rare for random walks: TLC's breadth-first search gives the
    shortest behaviours that reach it (tla/behaviours.py TARGETS)."""
    r = run(tools, "unbounded_hole", count=6, bfs=True, until=behaviours.TARGETS["stale"])
    assert len(r.behaviours) == 6
    k = consts("unbounded_hole")
    for b in r.behaviours:
        last = b[-1].vars
        stale = [(c, x) for c, w in last["cl"].items() if w["phase"] in ("reading", "finishing")
                 for x in w["rens"] if 0 < last["bk"][x]["ents"][w["next"]][0] < w["floor"]]
        assert stale, "TLC's behaviour does not end at the target"
        v = spec_tlc.replay(b, k)
        assert v.accepted, v.describe()
        assert v.kinds.get("RecoveryReadH[absent]", 0) + v.kinds.get("RecoveryReadH[absent, a stale value]", 0) >= 1


def test_a_stricter_guard_in_sim_spec_is_found(tools, monkeypatch):
    r = run(tools, "unbounded_lost_acks")
    k = consts("unbounded_lost_acks")
    assert all(spec_tlc.replay(b, k).accepted for b in r.behaviours)
    # break one guard: fencing coverage needs every bookie of the ensemble
    # (the spec's Covered: Qw - Qa + 1 of each write set)
    monkeypatch.setattr(S.Model, "covered", lambda self, w: set(w.rfrags[-1][1]) <= w.fenced)
    vs = [spec_tlc.replay(b, k) for b in r.behaviours]
    refused = [v for v in vs if not v.accepted]
    assert refused, "a stricter StartReading went unnoticed"
    assert all(v.action == "StartReading" and "not covered" in v.reason for v in refused)
    assert refused[0].prefix[0] == "Init" and refused[0].prefix[-1] == "StartReading"


def test_a_different_effect_in_sim_spec_is_found(tools, monkeypatch):
    r = run(tools, "unbounded_lost_acks")
    k = consts("unbounded_lost_acks")
    real = S.Model.BookieStore

    def store_without_lafr(self, b, record):  # a store that forgets to raise the bookie's LAFR
        before = self.bk[b].lafr
        real(self, b, record)
        self.bk[b].lafr = before

    monkeypatch.setattr(S.Model, "BookieStore", store_without_lafr)
    vs = [spec_tlc.replay(b, k) for b in r.behaviours]
    bad = [v for v in vs if not v.accepted]
    assert bad and all(v.action == "DeliverWith" and "lafr" in v.reason for v in bad), [v.describe() for v in bad]


def test_rejected_maps_onto_a_refused_request(tools):
    """TLC names a step by the first action of Next that takes it, and
    Rejected's effect (the client idle) is NoticeTakeover's, which is
    enabled whenever Rejected is: TLC never prints Rejected.  Its mapping
    is checked here on the NoticeTakeover steps where Rejected's guard
    holds too, relabelled."""
    r = run(tools, "unbounded_lost_acks")
    k = consts("unbounded_lost_acks")
    relabelled, kinds = 0, {}
    for b in r.behaviours:
        for i, st in enumerate(b[1:], 1):
            s = b[i - 1].vars
            if st.action != "NoticeTakeover":
                continue
            c = next(x for x in s["cl"] if s["cl"][x] != st.vars["cl"][x])
            w = s["cl"][c]
            ens = set(w["frags"][-1]["ens"]) | set(w["rens"]) if w["frags"] else set()
            if any(s["bk"][x]["term"] > w["term"] for x in ens - set(s["crashed"])):
                steps = list(b[:i]) + [dataclasses.replace(st, action="Rejected")] + list(b[i + 1:])
                v = spec_tlc.replay(steps, k)
                assert v.accepted, v.describe()
                relabelled += 1
                for x in v.kinds:
                    if x.startswith("Rejected"):
                        kinds[x] = kinds.get(x, 0) + 1
    assert relabelled >= 2 and "Rejected[refused request]" in kinds, kinds


def test_an_unknown_action_is_a_loud_error(tools):
    b = run(tools, "unbounded_lost_acks").behaviours[0]
    steps = [b[0], dataclasses.replace(b[1], action="SomethingNew")] + list(b[2:])
    with pytest.raises(spec_tlc.UnmappedAction):
        spec_tlc.replay(steps, consts("unbounded_lost_acks"))


# -- the finding: a late normal add at a fenced classic bookie -------------------------------

LATE = """---- MODULE LateStoreClassic ----
EXTENDS BookstreamFiner
CONSTANT Rec
\\* every bookie fenced by a classic recovery; a late add of entry 0 to each in the channel
LateInit ==
    /\\ bk = [b \\in Bookies |-> [term |-> 0, fenced |-> TRUE, ents |-> [i \\in Ids |-> NoVal],
                                 lac |-> -1, lafr |-> -1]]
    /\\ crashed = {}
    /\\ meta = [state |-> "IN_RECOVERY", term |-> 1, last |-> -1,
               frags |-> <<[first |-> 0, ens |-> Canon(Ensemble0Order)]>>]
    /\\ cl = [c \\in Clients |-> IdleClient]
    /\\ acked = {}
    /\\ msgs = {[c |-> Creator, b |-> b, n |-> 0, v |-> Data(1), t |-> 1, trunc |-> FALSE,
                rl |-> -1, rf |-> -1, rec |-> Rec] : b \\in Bookies}
    /\\ hist = [lac |-> -1, lafr |-> -1]
LateSpec == LateInit /\\ [][\\E m \\in msgs : StaleStore(m) /\\ UNCHANGED hist]_fvars
NothingStored == \\A b \\in Bookies : bk[b].ents[0] = NoVal
====
"""


def late_store(tools, tmp_path, rec: bool) -> str:
    """TLC on LATE with classic.cfg's constants: the outcome."""
    tmp_path.mkdir()
    check.copy_specs(tmp_path)
    (tmp_path / "LateStoreClassic.tla").write_text(LATE)
    cfg = (check.MODELS / "classic.cfg").read_text()
    assert behaviours.constants(cfg)["Mode"] == "classic"
    body = cfg.split("CONSTANTS", 1)[1].split("SPECIFICATION", 1)[0]
    (tmp_path / "late.cfg").write_text(f"CONSTANTS{body}    Rec = {'TRUE' if rec else 'FALSE'}\n"
                                       "SPECIFICATION LateSpec\nINVARIANT NothingStored\n")
    out = subprocess.run(check.tlc_command(tools, tmp_path, "-workers", "1", "-deadlock", "-config", "late.cfg",
                                           "LateStoreClassic.tla"),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return check.parse(out.stdout + out.stderr)[0]


def test_a_tlc_run_keeps_its_standard_modules_to_itself(tools, tmp_path, monkeypatch):
    """TLC 2.15 copies the standard modules out of its jar into the JVM's
    temporary directory and deletes them as it exits: two runs sharing /tmp
    deleted each other's (CI: "source file 'TLC.tla' has apparently been
    deleted").  ``check.tlc_command`` gives each run its scratch directory
    as its temporary directory: a shared one that cannot be written (a
    default the launcher's command line overrides) must not matter."""
    monkeypatch.setenv("JDK_JAVA_OPTIONS", f"-Djava.io.tmpdir={tmp_path / 'absent'}")
    assert late_store(tools, tmp_path / "run", False) == check.OK


def test_a_fenced_classic_bookie_stores_a_late_recovery_add_only(tools, tmp_path):
    """sim/spec.py refuses a normal add at a fenced classic bookie (BookieAdmit,
    BookieStore), as the protocol does; BookstreamFiner's StoreLate stored it
    (its classic guard was TRUE), so the finer and trace specs let a late
    normal add through a fence.  Fixed in the spec (tlcbeh11): a late add is
    admitted as Deliver's AddAccepted admits it."""
    assert late_store(tools, tmp_path / "normal", False) == check.OK
    assert late_store(tools, tmp_path / "recovery", True) == "violation:NothingStored"
