"""The fault suite's checker and schedule, without processes: each anomaly
the checker names is shown on a small history that has it (so the checker
can fail), and the schedule is a pure function of its seed."""
from __future__ import annotations

import json

from tests.fault import checker
from tests.fault.nemesis import AUTORECOVERY_KINDS, KINDS, ROT_KINDS, SLOW_KINDS, plan


def write(path, *lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def session(path, proc, inc, sess, term, sent, acked_upto, first_pos):
    """A writer session that sent ``sent`` payloads and got acks for the
    first ``acked_upto`` of them, from ``first_pos`` on."""
    c = {"proc": proc, "inc": inc, "session": sess, "t": 0}
    lines = [{"type": "open", **c}, {"type": "opened", "term": term, **c}]
    lines += [{"type": "invoke", "seq": q, "payload": f"{proc}.{inc}.{sess}.{q}", **c} for q in range(sent)]
    if acked_upto:
        lines.append({"type": "ok", "seq": 0, "n": acked_upto, "pos": first_pos, **c})
    if acked_upto < sent:
        lines.append({"type": "fail", "seq": acked_upto, "n": sent - acked_upto, "err": "WriterFenced", **c})
    write(path, *lines)


def payloads(proc, inc, sess, seqs):
    return [f"{proc}.{inc}.{sess}.{q}" for q in seqs]


def kinds(h, final, **kw):
    return sorted(a["kind"] for a in checker.check(h, final, **kw))


def test_a_clean_history_has_no_anomaly(tmp_path):
    hist = tmp_path / "history"
    session(hist / "w1.1.jsonl", "w1", 1, 1, term=1, sent=4, acked_upto=3, first_pos=0)
    session(hist / "w2.1.jsonl", "w2", 1, 1, term=2, sent=2, acked_upto=2, first_pos=4)
    write(hist / "r1.1.jsonl", {"type": "reader_open", "proc": "r1", "inc": 1, "t": 0},
          {"type": "read", "proc": "r1", "inc": 1, "t": 0, "recs": [[0, "w1.1.1.0"], [1, "w1.1.1.1"]]})
    h = checker.load(hist)
    # the unknown 4th append of w1 was recovered: fine, and so is its absence
    final = list(enumerate(payloads("w1", 1, 1, range(4)) + payloads("w2", 1, 1, range(2))))
    assert kinds(h, final) == []
    final = list(enumerate(payloads("w1", 1, 1, range(3)))) + [(4, "w2.1.1.0"), (5, "w2.1.1.1")]
    assert kinds(h, final) == []
    assert h.ops["append"] == 6 and h.ops["append_ok"] == 5 and h.ops["read"] == 2


def test_each_anomaly_is_found(tmp_path):
    hist = tmp_path / "history"
    session(hist / "w1.1.jsonl", "w1", 1, 1, term=1, sent=5, acked_upto=3, first_pos=0)
    session(hist / "w2.1.jsonl", "w2", 1, 1, term=2, sent=2, acked_upto=2, first_pos=5)
    write(hist / "r1.1.jsonl", {"type": "read", "proc": "r1", "inc": 1, "t": 0, "recs": [[0, "w1.1.1.0"]]})
    write(hist / "r2.1.jsonl", {"type": "read", "proc": "r2", "inc": 1, "t": 0,
                                "recs": [[0, "w1.1.1.0"], [1, "w1.1.1.1"], [1, "w1.1.1.1"]]})
    h = checker.load(hist)
    good = list(enumerate(payloads("w1", 1, 1, range(3)))) + [(5, "w2.1.1.0"), (6, "w2.1.1.1")]
    assert kinds(h, good) == ["reader_order"]  # r2 got position 1 twice
    lost = [x for x in good if x[1] != "w1.1.1.1"]
    assert "lost" in kinds(h, lost)
    moved = good[:3] + [(7, "w2.1.1.0"), (8, "w2.1.1.1")]
    assert "moved" in kinds(h, moved)
    assert "phantom" in kinds(h, good + [(9, "never sent")])
    assert "duplicate" in kinds(h, good + [(9, "w2.1.1.1")])
    diverged = [(0, "w1.1.1.1"), (1, "w1.1.1.0")] + good[2:]
    assert "divergence" in kinds(h, diverged)
    # w1's unknown appends 3 and 4: 4 without 3 is a hole, at consecutive positions or not
    holed = good[:3] + [(3, "w1.1.1.4")] + good[3:]
    assert kinds(h, holed) == ["hole", "reader_order"]
    gap = good[:3] + [(4, "w1.1.1.3")] + good[3:]
    assert kinds(h, gap) == ["hole", "reader_order"]
    # an older term's payload above a newer term's
    stale = good + [(7, "w1.1.1.3")]
    assert "order" in kinds(h, stale)
    anomalies = checker.check(h, None, "LedgerRecoveryFailed: ...")
    assert anomalies[0]["kind"] == "unrecoverable"


def test_only_faults_beyond_the_model_are_attributed():
    # issues 12.0 (the hole) and 12.1 (unregistered bookies) are fixed: their anomalies are bugs again
    ctx = {"registered": 2, "bookies_alive": 5, "lease_faults": True}
    for kind in ("hole", "unrecoverable", "unregistered", "lost", "order"):
        assert checker.attribute({"kind": kind, "what": "older term"}, ctx) is None
    assert checker.attribute({"kind": "lost"}, {"beyond_model": True}) == "beyond-model"
    assert checker.attribute({"kind": "unregistered"}, {"beyond_model": True}) is None


def test_the_schedule_is_a_function_of_its_seed():
    kw = dict(bookies=5, writers=["w1", "w2"], readers=["r1", "r2"], tmpfs_bookie=0)
    a, b = plan(42, 60, **kw), plan(42, 60, **kw)
    assert a == b and a != plan(43, 60, **kw)
    weighted = {k for k, v in KINDS.items() if v.weight}
    assert {f.kind for f in plan(1, 600, **kw)} == weighted - AUTORECOVERY_KINDS - SLOW_KINDS - ROT_KINDS
    with_ar = plan(1, 600, **kw, recoverers=["ar1"])
    assert {f.kind for f in with_ar} == weighted - SLOW_KINDS - ROT_KINDS
    everything = plan(1, 600, **kw, recoverers=["ar1"], slow_disks=True, rot=True)
    assert {f.kind for f in everything} == weighted
    assert sum(f.kind == "lose_bookie" for f in with_ar) == 1   # (one lost disk a run: the fault model)
    damaging = [f for f in everything if f.kind in ("lose_bookie", "rot_entry")]   # (and its rots: on one bookie)
    assert len(damaging) > 2 and len({f.target for f in damaging}) == 1
    assert {f.kind for f in plan(1, 60, **kw, kinds=["cut_tail"])} == {"cut_tail"}  # named: runs at weight 0
    for f in plan(7, 600, **kw, recoverers=["ar1"], slow_disks=True):  # never more than two bookies hurt at once
        if f.kind in ("kill_bookie", "pause_bookie", "partition", "full_disk", "torn_tail", "lose_bookie",
                      "slow_disk"):
            hurt = [g for g in plan(7, 600, **kw, recoverers=["ar1"], slow_disks=True) if isinstance(g.target, int)
                    and g.t <= f.t < g.t + g.duration]
            assert len({g.target for g in hurt}) <= 2
    assert all(f.kind != "full_disk" for f in plan(1, 600, **{**kw, "tmpfs_bookie": None}))


def test_a_campaigns_summary_names_the_runs_whose_replica_audit_failed():
    """An audit that raised (a listed ledger gone, etcd away after the heal)
    is named by seed in the summary (``python -m tests.fault`` counts each
    as a failure, as it does a harness error): the seeded CI run asserts
    there is none, and campaigns had let one by."""
    from tests.fault.run import summarize

    reports = [{"seed": 1, "replicas": {"error": "NoSuchLedger: no such ledger: 183"}},
               {"seed": 2, "replicas": {"entries": 40, "lost": []}}, {"seed": 3, "replicas": None}]
    assert summarize(reports)["audit_errors"] == [(1, "NoSuchLedger: no such ledger: 183")]
