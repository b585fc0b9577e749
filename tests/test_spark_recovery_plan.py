"""The re-replication job's pure decisions (stream/spark/recovery_plan.py)
and the fragment restriction of the worker's plan (worker_core.restrict_plan)."""
from __future__ import annotations

import collections
import random
from types import SimpleNamespace

import hypothesis
import hypothesis.strategies as st
import pytest

from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from stream.autorecovery.worker_core import plan_ledger, restrict_plan
from stream.placement import LeastLoadedPlacement, RandomPlacement
from stream.spark.recovery_plan import DONE, FAILED, SKIPPED, assign_targets, fragment_status, summarize


def _regs(*ids, read_only=()):
    return [SimpleNamespace(bookie_id=b, read_only=b in read_only, free_bytes=100) for b in ids]


def _meta(fragments, E=3, Qw=3, last=None, state=LedgerState.CLOSED):
    return LedgerMetadata(ledger_id=7, ensemble_size=E, write_quorum=Qw, ack_quorum=2, state=state,
                          last_entry=-1 if last is None else last, mode=LedgerMode.CLASSIC,
                          fragments=tuple(Fragment(f, tuple(ens)) for f, ens in fragments),
                          fragment_count=len(fragments), last_fragment_first_entry=fragments[-1][0])


def _jobs(n_fragments=6, size=100):
    frags = [(k * size, ("lost", "b%d" % (k % 2), "b%d" % (2 + k % 2))) for k in range(n_fragments)]
    return list(plan_ledger(_meta(frags, last=n_fragments * size - 1), {"lost"}).jobs)


def test_a_target_is_never_in_the_fragment_nor_the_lost_bookie_and_load_is_spread():
    jobs = _jobs()
    tasks = assign_targets(jobs, _regs("lost", "b0", "b1", "b2", "b3", "t0", "t1"), "lost", RandomPlacement())
    assert [(t.ledger_id, t.first, t.last) for t in tasks] == [(j.ledger_id, j.first_entry, j.last_entry) for j in jobs]
    for t, j in zip(tasks, jobs):
        assert t.target not in j.ensemble and t.target != "lost"
    load = collections.Counter(t.target for t in tasks)
    # 6 equal fragments, 4 eligible bookies for each: no bookie gets more than twice
    assert max(load.values()) <= 2 and len(load) >= 3


@hypothesis.given(st.lists(st.integers(1, 500), min_size=1, max_size=12), st.integers(4, 8), st.randoms())
def test_spread_is_within_one_job_of_even(sizes, n_bookies, rnd):
    """Every bookie is eligible for every job (E1 fragments on the lost
    bookie): the greedy assignment, largest first, keeps every bookie's load
    within the largest job of the least loaded one."""
    frags, first = [], 0
    for n in sizes:
        frags.append((first, ("lost",)))
        first += n
    jobs = list(plan_ledger(_meta(frags, E=1, Qw=1, last=first - 1), {"lost"}).jobs)
    assert not jobs  # E1: no surviving replica, unrecoverable, no job
    frags = [(f, ("lost", "keep")) for f, _ in frags]
    jobs = list(plan_ledger(_meta(frags, E=2, Qw=2, last=first - 1), {"lost"}).jobs)
    ids = ["c%d" % i for i in range(n_bookies)]
    tasks = assign_targets(jobs, _regs("lost", "keep", *ids), "lost", RandomPlacement(random.Random(rnd.random())))
    load = collections.Counter({b: 0 for b in ids})
    for t in tasks:
        load[t.target] += t.entries
    assert max(load.values()) - min(load.values()) <= max(sizes)


def test_to_is_used_where_it_may_be_and_placement_elsewhere():
    jobs = _jobs(4)
    tasks = assign_targets(jobs, _regs("lost", "b0", "b1", "b2", "b3", "t0"), "lost", LeastLoadedPlacement(), to="b0")
    for t, j in zip(tasks, jobs):
        assert t.target == ("b0" if "b0" not in j.ensemble else t.target) and t.target not in j.ensemble


def test_no_eligible_bookie_leaves_the_choice_to_the_task():
    jobs = _jobs(2)
    # every other bookie is in the fragment or read-only
    tasks = assign_targets(jobs, _regs("lost", "b0", "b1", "b2", "b3", "ro", read_only={"ro"}), "lost",
                           RandomPlacement())
    assert all(t.target not in j.ensemble for t, j in zip(tasks, jobs))
    tasks = assign_targets(jobs, _regs("lost", "b0", "b2", "ro", read_only={"ro"}), "lost", RandomPlacement())
    assert tasks[0].target is None  # fragment 0 is on lost, b0, b2: nobody left


def test_restrict_plan_keeps_one_fragment():
    meta = _meta([(0, ("lost", "a", "b")), (10, ("a", "lost", "c")), (20, ("a", "b", "lost"))],
                 state=LedgerState.OPEN)
    plan = plan_ledger(meta, {"lost"})
    assert [j.first_entry for j in plan.jobs] == [0, 10] and plan.open_fragment == 20
    one = restrict_plan(plan, {10})
    assert [j.first_entry for j in one.jobs] == [10] and one.open_fragment is None
    assert restrict_plan(plan, {20}).open_fragment == 20 and not restrict_plan(plan, {20}).jobs
    assert restrict_plan(plan, ()).clean


def test_status_and_summary():
    assert fragment_status(True, "done") == DONE and fragment_status(True, "wait") == DONE
    assert fragment_status(False, "done") == SKIPPED
    assert fragment_status(False, "wait") == FAILED and fragment_status(False, "report") == FAILED
    meta = _meta([(0, ("lost", "a", "b")), (10, ("a", "lost", "c"))], last=19)
    plans = [(7, plan_ledger(meta, {"lost"}))]
    res = [dict(ledger_id=7, first=10, last=19, status=DONE, entries=10, bytes=1000, step="done", note="",
                target="t", unrecoverable=[]),
           dict(ledger_id=7, first=0, last=9, status=FAILED, entries=0, bytes=0, step="wait", note="copy failed",
                target=None, unrecoverable=[])]
    s = summarize("lost", plans, res, seconds=2.0)
    assert s["fragments_planned"] == 2 and s["entries_planned"] == 20
    assert (s["fragments_replaced"], s["fragments_skipped"], s["fragments_failed"]) == (1, 0, 1)
    assert s["bytes_copied"] == 1000 and s["mb_per_s"] == 0.0
    assert [r["first"] for r in s["fragments"]] == [0, 10]
    assert s["left"] == [{"ledger_id": 7, "first": 0, "step": "wait", "note": "copy failed", "open_fragment": None}]


@pytest.mark.parametrize("policy", [RandomPlacement, LeastLoadedPlacement])
def test_every_policy_gives_distinct_bookies_per_fragment(policy):
    jobs = _jobs(5)
    for t, j in zip(assign_targets(jobs, _regs("lost", "b0", "b1", "b2", "b3", "x"), "lost", policy()), jobs):
        assert len(set(j.ensemble) - {"lost"} | {t.target}) == len(j.ensemble)
