"""The fault suite's short seeded set, for CI (``-m 'not fault'`` deselects it).

Three seeds whose schedules together hold every fault kind but
autorecovery's (15 s of faults each, 30-50 s a run on this machine), two
on the Stream API and one on classic ledgers-to-logs; one with two
autorecovery processes (a bookie's disk lost, the processes killed and
paused) and slow disks on a striped stream (E3 Qw2 Qa2); one whose bookie
has entries rotted under it, which its scrub must find and autorecovery
copy back; and a run with a broken recovery rule that the checker must
catch.  After each final read every entry is
asked of every replica (tests/fault/run.py ``replica_audit``).  A run fails on any anomaly but those of faults
outside the model (tests/fault/checker.py ``attribute``; ``-s`` prints
every anomaly).  Hours of it: ``python -m tests.fault --seed N --runs M --minutes T``.
"""
from __future__ import annotations

import json

import pytest

from tests.fault.nemesis import AUTORECOVERY_KINDS, KINDS, ROT_KINDS, SLOW_KINDS, plan
from tests.fault.run import Options, replica_anomalies, run_one

pytestmark = [pytest.mark.fault, pytest.mark.timeout(600)]

CI_SEEDS = [44, 25]        # the Stream API
LOG_SEED = 47              # classic ledgers-to-logs (stream/log.py)
AR_SEED = 83               # with autorecovery and slow disks, striped
ROT_SEED = 101             # three entries rotted on one bookie (and no restart of it: they stay to be mended)
ROT_RUN_KINDS = ["rot_entry", "takeover", "kill_writer", "partition", "pause_bookie", "kill_autorecovery"]
CI_SECONDS = 15.0
RECOVERERS = ["ar1", "ar2"]


def _kinds(seed: int, recoverers=(), slow_disks=False) -> set[str]:
    return {f.kind for f in plan(seed, CI_SECONDS, bookies=5, writers=["w1", "w2"], readers=["r1", "r2"],
                                 tmpfs_bookie=0, recoverers=list(recoverers), slow_disks=slow_disks)}


def test_the_ci_seeds_cover_every_fault_kind():
    kinds = set()
    for seed in CI_SEEDS + [LOG_SEED]:
        kinds |= _kinds(seed)
    assert not kinds & (AUTORECOVERY_KINDS | SLOW_KINDS | ROT_KINDS)   # (drawn only when asked for)
    assert kinds == {k for k, v in KINDS.items() if v.weight} - AUTORECOVERY_KINDS - SLOW_KINDS - ROT_KINDS
    assert AUTORECOVERY_KINDS | SLOW_KINDS <= _kinds(AR_SEED, RECOVERERS, slow_disks=True)


def test_replica_findings_are_anomalies_and_fewer_than_qw_is_not():
    audit = {"ledgers": 1, "entries": 90, "under_replicated": 7, "unanswered": [], "below_ack_quorum": [[8, 3, 4]],
             "lost": [], "divergent": [[8, 40]]}
    got = replica_anomalies(audit)
    assert [(a["kind"], a["count"]) for a in got] == [("replicas_below_ack_quorum", 1), ("replicas_divergent", 1)]
    assert replica_anomalies({**audit, "below_ack_quorum": [], "divergent": []}) == []
    assert replica_anomalies(None) == [] == replica_anomalies({"error": "etcd away"})


def _show(r: dict) -> None:
    keys = ("seed", "seconds", "faults_done", "faults_skipped", "operations", "anomaly_counts", "acks_after_heal",
            "read_port_connections", "replicas", "autorecovery", "autorecovery_work", "append_latency_ms", "rot")
    print(json.dumps({k: r.get(k) for k in keys}))
    for a in r.get("anomalies", []):
        print("  anomaly:", json.dumps(a)[:400])


@pytest.mark.parametrize("seed,api,quorums,autorecovery",
                         [(s, "stream", (3, 3, 2), 0) for s in CI_SEEDS] + [(LOG_SEED, "log", (3, 3, 2), 0)]
                         + [(AR_SEED, "stream", (3, 2, 2), len(RECOVERERS))])
def test_seeded_fault_run(seed, api, quorums, autorecovery, tmp_path):
    e, qw, qa = quorums
    r = run_one(seed, tmp_path, Options(seconds=CI_SECONDS, api=api, ensemble=e, write_quorum=qw, ack_quorum=qa,
                                        autorecovery=autorecovery, slow_disks=bool(autorecovery)))
    _show(r)
    assert not r.get("harness_error"), r.get("harness_error")
    new = [a for a in r["anomalies"] if a["known"] is None]
    assert not new, f"seed {seed}: new anomalies (files in {tmp_path}): {json.dumps(new)[:3000]}"
    assert r["operations"].get("append_ok", 0) > 0 and r["final_records"] is not None
    assert r["read_port_connections"] > 0   # the readers read through the bookies' read ports (and their proxies)
    assert r["replicas"]["entries"] > 0 and "error" not in r["replicas"], r["replicas"]
    if autorecovery:
        assert r["faults_done"].get("lose_bookie") == 1 and "settled_s" in r["autorecovery"], r["autorecovery"]


def test_rotted_entries_are_found_and_copied_back(tmp_path):
    """Entries of one bookie rotted on its disk while it runs (its scrub
    every 3 s, the full check every 5 s): found, and copied back onto it
    from the other replicas: at the end the bookie is still their replica
    and holds each whole (the audit's ``replicas_rot_unrepaired`` otherwise)."""
    rots = [f for f in plan(ROT_SEED, CI_SECONDS, bookies=5, writers=["w1", "w2"], readers=["r1", "r2"],
                            tmpfs_bookie=0, kinds=ROT_RUN_KINDS, recoverers=RECOVERERS, rot=True)
            if f.kind == "rot_entry"]
    assert len(rots) == 3 and len({f.target for f in rots}) == 1
    r = run_one(ROT_SEED, tmp_path, Options(seconds=CI_SECONDS, kinds=ROT_RUN_KINDS, autorecovery=len(RECOVERERS),
                                            rot=True))
    _show(r)
    assert not r.get("harness_error"), r.get("harness_error")
    new = [a for a in r["anomalies"] if a["known"] is None]
    assert not new, f"new anomalies (files in {tmp_path}): {json.dumps(new)[:3000]}"
    assert r["rot"]["rotted"] >= 2 and r["rot"]["reported"] >= 1, r["rot"]   # (or the full check found it first)
    assert "settled_s" in r["autorecovery"] and not r["replicas"]["rot_unrepaired"], r["replicas"]
    assert r["replicas"]["rot_checked"] == r["rot"]["rotted"], r["replicas"]   # (repaired in place, not moved)


def test_a_broken_recovery_rule_is_caught(tmp_path):
    """Writers whose recovery reads carry no term (a mutant: they do not
    fence the previous writer) lose acknowledged appends when they duel;
    the checker must see it (within two short runs: timing decides)."""
    found = []
    for seed in (5, 6):
        r = run_one(seed, tmp_path, Options(seconds=10, kinds=["takeover", "kill_writer"], tmpfs=False,
                                            mutant="recovery_reads_without_term"))
        _show(r)
        found = [a for a in r["anomalies"] if a["kind"] in ("lost", "moved", "divergence", "duplicate")]
        if found:
            break
    assert found
