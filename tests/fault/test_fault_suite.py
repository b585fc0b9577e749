"""The fault suite's short seeded set, for CI (``-m 'not fault'`` deselects it).

Three seeds whose schedules together hold every fault kind (15 s of faults
each, 30-50 s a run on this machine), two on the Stream API and one on
classic ledgers-to-logs, and a run with a broken recovery rule that the
checker must catch.  A run fails on any anomaly but those of faults
outside the model (tests/fault/checker.py ``attribute``; ``-s`` prints
every anomaly).  Hours of it: ``python -m tests.fault --seed N --runs M --minutes T``.
"""
from __future__ import annotations

import json

import pytest

from tests.fault.nemesis import KINDS, plan
from tests.fault.run import Options, run_one

pytestmark = [pytest.mark.fault, pytest.mark.timeout(600)]

CI_SEEDS = [44, 25]        # the Stream API
LOG_SEED = 47              # classic ledgers-to-logs (stream/log.py)
CI_SECONDS = 15.0


def test_the_ci_seeds_cover_every_fault_kind():
    kinds = set()
    for seed in CI_SEEDS + [LOG_SEED]:
        kinds |= {f.kind for f in plan(seed, CI_SECONDS, bookies=5, writers=["w1", "w2"], readers=["r1", "r2"],
                                       tmpfs_bookie=0)}
    assert kinds == {k for k, v in KINDS.items() if v.weight}


def _show(r: dict) -> None:
    keys = ("seed", "seconds", "faults_done", "faults_skipped", "operations", "anomaly_counts", "acks_after_heal",
            "read_port_connections")
    print(json.dumps({k: r.get(k) for k in keys}))
    for a in r.get("anomalies", []):
        print("  anomaly:", json.dumps(a)[:400])


@pytest.mark.parametrize("seed,api", [(s, "stream") for s in CI_SEEDS] + [(LOG_SEED, "log")])
def test_seeded_fault_run(seed, api, tmp_path):
    r = run_one(seed, tmp_path, Options(seconds=CI_SECONDS, api=api))
    _show(r)
    assert not r.get("harness_error"), r.get("harness_error")
    new = [a for a in r["anomalies"] if a["known"] is None]
    assert not new, f"seed {seed}: new anomalies (files in {tmp_path}): {json.dumps(new)[:3000]}"
    assert r["operations"].get("append_ok", 0) > 0 and r["final_records"] is not None
    assert r["read_port_connections"] > 0   # the readers read through the bookies' read ports (and their proxies)


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
