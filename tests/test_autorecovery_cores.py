"""The auditor's and the replication worker's pure decisions."""
from __future__ import annotations

import dataclasses

from stream.autorecovery.auditor_core import AuditorConfig, AuditorCore, Check, MootTasks, PublishTask, Scan
import pytest

from stream.autorecovery.worker_core import (Pace, Step, choose_target, jobs_left, judge_round, judge_task, plan_ledger,
                                             restrict_plan)
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from stream.writer_lease import Liveness


def start(delay=10.0, bookies=("a", "b", "c", "d"), check=None):
    core = AuditorCore(AuditorConfig(delay, check), now=0.0)
    fx = core.on_registrations(0.0, bookies)
    assert fx == [Scan(frozenset())]          # a new auditor scans at once (discovery)
    assert core.on_scan_done(0.0) == []
    return core


def test_bookie_back_within_the_delay_cancels():
    core = start()
    assert core.on_registrations(1.0, {"a", "b", "c"}) == []
    assert core.tick(9.9) == []
    assert core.on_registrations(10.5, {"a", "b", "c", "d"}) == []
    assert core.tick(100.0) == [] and core.cancelled == 1 and not core.lost


def test_lost_after_the_delay_scans_and_publishes_one_task_per_ledger():
    core = start()
    core.on_registrations(1.0, {"a", "b", "c"})
    assert core.next_deadline() == 11.0
    assert core.tick(11.0) == [Scan(frozenset({"d"}))]
    fx = core.on_scan_page(11.5, {5: {"a", "b", "c"}, 6: {"a", "d", "c"}, 7: {"d", "b"}})
    assert fx == [PublishTask(6, frozenset({"d"})), PublishTask(7, frozenset({"d"}))]
    assert core.on_scan_done(12.0) == []


def test_a_bookie_lost_during_a_scan_gets_its_own_scan_after_it():
    core = start()
    core.on_registrations(1.0, {"a", "b", "c"})
    assert core.tick(11.0) == [Scan(frozenset({"d"}))]
    core.on_registrations(12.0, {"a", "b"})
    assert core.tick(30.0) == []                     # c is lost, but a scan is running
    assert core.on_scan_done(31.0) == [Scan(frozenset({"c"}))]


def test_back_after_the_delay_makes_pending_tasks_moot():
    core = start()
    core.on_registrations(1.0, {"a", "b", "c"})
    core.tick(11.0)
    core.on_scan_done(11.0)
    assert core.on_registrations(50.0, {"a", "b", "c", "d"}) == [MootTasks("d")]
    assert not core.lost


def test_a_new_auditor_finds_bookies_that_died_before_it():
    core = AuditorCore(AuditorConfig(5.0), now=100.0)
    assert core.on_registrations(100.0, {"a", "b", "c"}) == [Scan(frozenset())]
    assert core.on_scan_page(100.5, {9: {"a", "b", "z"}}) == []   # z: not registered, starts its delay
    assert core.on_scan_done(101.0) == []
    assert core.tick(105.4) == []
    assert core.tick(105.5) == [Scan(frozenset({"z"}))]
    assert core.on_scan_page(105.6, {9: {"a", "b", "z"}}) == [PublishTask(9, frozenset({"z"}))]


def test_an_interrupted_scan_is_run_again():
    core = start()
    core.on_registrations(1.0, {"a", "b", "c"})
    core.tick(11.0)
    assert core.on_scan_done(11.0, completed=False) == [Scan(frozenset({"d"}))]


def test_periodic_check():
    core = start(check=60.0)
    assert core.tick(59.0) == []
    assert core.tick(60.0) == [Check()]
    assert core.next_deadline() == 120.0


# -- worker -----------------------------------------------------------------------------

def meta(frags, state=LedgerState.CLOSED, last=29, e=3, qw=3, mode=LedgerMode.CLASSIC):
    frs = tuple(Fragment(f, tuple(ens)) for f, ens in frags)
    return LedgerMetadata(e, qw, min(qw, 2), ledger_id=4, state=state, last_entry=last, mode=mode,
                          fragments=frs, fragment_count=len(frs), last_fragment_first_entry=frs[-1].first_entry)


def test_plan_sealed_fragments_in_order_with_sources():
    m = meta([(0, "abc"), (10, "dbc"), (20, "dbe")])
    p = plan_ledger(m, {"d"})
    assert [(j.first_entry, j.last_entry, j.index, j.sources) for j in p.jobs] == \
        [(10, 19, 0, ("b", "c")), (20, 29, 0, ("b", "e"))]
    assert p.open_fragment is None and not p.unrecoverable
    assert judge_task(p, 0, 0, 10) is Step.COPY
    assert p.jobs[0].entries == 10


def test_plan_open_last_fragment_waits_for_the_writer_then_seals():
    m = meta([(0, "abc"), (10, "dbc")], state=LedgerState.OPEN, last=-1)
    p = plan_ledger(m, {"d"})
    assert not p.jobs and p.open_fragment == 10
    assert judge_task(p, now=5, first_seen=0, grace=10) is Step.WAIT
    assert judge_task(p, now=10, first_seen=0, grace=10) is Step.SEAL
    assert judge_task(plan_ledger(m.with_(state=LedgerState.IN_RECOVERY), {"d"}), 99, 0, 10) is Step.WAIT


def test_no_surviving_replica_is_reported_never_copied():
    m = meta([(0, "a"), (10, "b")], e=1, qw=1)
    p = plan_ledger(m, {"a"})
    assert not p.jobs and len(p.unrecoverable) == 1 and p.unrecoverable[0].first_entry == 0
    assert judge_task(p, 0, 0, 0) is Step.REPORT
    # two of Qw = 2 lost
    m2 = meta([(0, "abc")], e=3, qw=2)
    assert plan_ledger(m2, {"a", "b"}).unrecoverable and not plan_ledger(m2, {"a", "b"}).jobs
    assert plan_ledger(m2, {"a"}).jobs


def test_striped_fragment_sources_and_entry_count():
    m = meta([(0, "abcd")], e=4, qw=2, last=9)
    (job,) = plan_ledger(m, {"a"}).jobs
    # a is index 0: write sets (3,0) and (0,1) include it
    assert set(job.sources) == {"b", "d"}
    assert job.entries == sum(1 for e in range(10) if job.holds(e)) == 5


def test_empty_fragment_is_replaced_without_copying():
    m = meta([(0, "abc"), (5, "dbc")], last=4)
    (job,) = plan_ledger(m, {"d"}).jobs
    assert job.last_entry < job.first_entry and job.entries == 0


def test_done_and_target_choice():
    m = meta([(0, "abc")])
    p = plan_ledger(m, {"z"})
    assert p.clean and judge_task(p, 0, 0, 0) is Step.DONE
    (job,) = plan_ledger(m, {"a"}).jobs
    assert choose_target(job, ["b", "a", "q", "r"], excluded={"q"}) == "r"
    assert choose_target(job, ["b", "c"]) is None


def test_periodic_check_expectations_and_verdict():
    from stream.autorecovery.keys import Task
    from stream.autorecovery.worker_core import expected_last_entries, judge_check, missing_tails
    m = meta([(0, "abc"), (10, "dbc")], state=LedgerState.OPEN, last=-1)
    assert expected_last_entries(m) == {"a": 9, "b": 9, "c": 9}   # the open fragment: nothing yet
    c = meta([(0, "abcd")], e=4, qw=2, last=9)
    exp = expected_last_entries(c)
    # entry 9 is on positions (1, 2); a (0) last holds 8, d (3) holds 7
    assert exp == {"a": 8, "b": 9, "c": 9, "d": 7}
    assert judge_check(exp, {"a": 8, "b": None, "c": 5}) == {"b", "c"}   # d did not answer: not judged
    # c's tail is known (6..9, of which its position holds 6 and 9); b knows nothing of the ledger
    assert missing_tails(exp, {"a": 8, "b": None, "c": 5}) == {"c": [[6, 9]]}
    t = Task(7, frozenset(), 0).reported({"b", "c"}, True, missing_tails(exp, {"a": 8, "b": None, "c": 5}))
    assert t.damaged == {"b", "c"} and t.damaged_ids == {"c": ((6, 9),)}
    p = plan_ledger(c, (), damaged=t.damaged, damaged_ids=t.damaged_ids)
    # c: only its tail, filled in place from the positions sharing 6 (d) and 9 (b); b: its whole share moved
    assert sorted((j.lost, j.first_entry, j.last_entry, j.fill, j.sources) for j in p.jobs) == [
        ("b", 0, 9, False, ("a", "c", "b")), ("c", 6, 9, True, ("d", "b"))], p.jobs
    assert [j.entries for j in p.jobs if j.fill] == [2]


def test_damaged_bookie_copies_sealed_fragments_never_seals_the_open_one():
    m = meta([(0, "abc"), (10, "abd")], state=LedgerState.OPEN, last=-1)
    p = plan_ledger(m, (), damaged={"a"})
    assert [j.first_entry for j in p.jobs] == [0] and p.open_fragment is None
    assert plan_ledger(m, {"a"}).open_fragment == 10


def test_a_damaged_bookies_known_ids_are_filled_in_place_and_nothing_else():
    """With the ids a damaged bookie is known to lack or hold rotted
    (``damaged_ids``: its scrub's findings, a full check's), only those
    are copied, back onto it, per sealed fragment and only where its
    position holds them (a striped write set); its other fragments, the
    open one and the other bookies are left alone; without ids, as before,
    its whole share."""
    m = meta([(0, "abcd"), (20, "abce"), (40, "abcf")], e=4, qw=2, state=LedgerState.OPEN, last=-1)
    p = plan_ledger(m, (), damaged={"a"}, damaged_ids={"a": ((4, 4), (6, 24), (44, 44))})
    # a is position 0: ids e with e % 4 in (0, 3) hold it; 4..4 and 6..19 in the first fragment,
    # 20..24 in the second; 44 is in the open fragment (its writer's)
    got = [(j.first_entry, j.last_entry, j.fragment_first, j.lost, j.fill, j.entries) for j in p.jobs]
    assert got == [(4, 4, 0, "a", True, 1), (6, 19, 0, "a", True, 7), (20, 24, 20, "a", True, 3)]
    assert [j.sources for j in p.jobs] == [("b", "d"), ("b", "d"), ("b", "e")]   # (never a's own copy)
    assert p.open_fragment is None and not p.unrecoverable and p.held_open   # (44: once sealed)
    held = dataclasses.replace(p, jobs=())
    # waited for as an open fragment is: a live writer's adds (or its explicit LAC) pass it, up to the
    # bound; with none (it crashed before its LAC went out: the LAC stays below for good), the seal after the grace
    for writer in Liveness:
        stream = dataclasses.replace(held, mode=LedgerMode.UNBOUNDED, writer=writer)
        assert judge_task(stream, 0.5, 0, 1, 60) is Step.WAIT, writer
        assert judge_task(stream, 2, 0, 1, 60) is (Step.WAIT if writer is Liveness.LIVE else Step.SEAL), writer
        assert judge_task(stream, 61, 0, 1, 60) is Step.SEAL, writer
    assert judge_task(dataclasses.replace(held, state=LedgerState.IN_RECOVERY), 1e9, 0, 1) is Step.WAIT
    # after this worker's take-over (its recovered end: 45): up to it final, above it no entries
    sealed = plan_ledger(m, (), damaged={"a"}, damaged_ids={"a": ((40, 47),)}, open_lac=45, open_end=45)
    assert [(j.first_entry, j.last_entry) for j in sealed.jobs] == [(40, 45)] and not sealed.held_open
    # the open fragment up to a LAC read from its bookies: those ids final, filled in place; above it, waiting
    at = plan_ledger(m, (), damaged={"a"}, damaged_ids={"a": ((40, 47),)}, open_lac=44)
    assert [(j.first_entry, j.last_entry, j.fragment_first, j.entries) for j in at.jobs] == [(40, 44, 40, 3)]
    assert at.held_open and at.jobs[0].sources == ("b", "f") and not at.unrecoverable   # (47 > 44: waits)
    past = plan_ledger(m, (), damaged={"a"}, damaged_ids={"a": ((40, 47),)}, open_lac=50)
    assert [(j.first_entry, j.last_entry) for j in past.jobs] == [(40, 47)] and not past.held_open
    # one call's rounds: the range filled up to 44 is done; the LAC since past 47, the rest is not
    assert jobs_left(at.jobs, (), [(40, 44, "a")]) == []
    assert jobs_left(past.jobs, (), [(40, 44, "a")]) == list(past.jobs)
    before = plan_ledger(m, (), damaged={"a"}, damaged_ids={"a": ((40, 47),)}, open_lac=39)
    assert before.jobs == () and before.held_open
    # a lost bookie of the open fragment stays its writer's (or the seal's): no job from the LAC
    lost_open = plan_ledger(m, {"f"}, damaged={"a"}, damaged_ids={"a": ((44, 44),)}, open_lac=50)
    assert [j.lost for j in lost_open.jobs] == ["a"] and lost_open.open_fragment == 40
    only_b = plan_ledger(m, (), damaged={"a"}, damaged_ids={"a": ((5, 5), (45, 45))})   # position 0 holds neither
    assert only_b.jobs == () and not only_b.held_open and judge_task(only_b, 0, 0, 1) is Step.DONE
    whole = plan_ledger(m, (), damaged={"a"}, damaged_ids={"b": ((0, 3),)})    # (b not damaged: ignored)
    assert [(j.first_entry, j.last_entry, j.fill) for j in whole.jobs] == [(0, 19, False), (20, 39, False)]
    assert [j.first_entry for j in restrict_plan(p, [20]).jobs] == [20]


def test_a_calls_round_skips_what_it_reported_by_range_and_seals_once():
    """``judge_round``: a range already reported (the task's, while its
    bookies are still lost; or this call's copy finding ids on no replica)
    is not copied again and is reported, known by its range: a fill's
    report starting at a fragment's first id is not the fragment's; a call
    never seals twice (its lost bookies are those of its start: one back
    since would have the open fragment sealed again and again)."""
    m = meta([(0, "abc"), (10, "abd")], e=3, qw=2, state=LedgerState.CLOSED, last=19)
    p = plan_ledger(m, {"c"}, damaged={"a"}, damaged_ids={"a": ((11, 11),)})   # (a holds 11, not 10)
    assert [(j.first_entry, j.last_entry, j.lost) for j in p.jobs] == [(0, 9, "c"), (11, 11, "a")]
    r = judge_round(p, 0, 0, 1, known={(11, 19)})   # (a report of 11..19: not the fill of 11..11)
    assert r.step is Step.COPY and [(j.first_entry, j.last_entry) for j in r.jobs] == [(0, 9), (11, 11)]
    gone = {"first": 0, "last": 9, "lost": ["c"], "why": "3 entries held by no surviving replica"}
    r = judge_round(p, 0, 0, 1, absent={(0, 9): gone}, filled={(11, 11, "a")})
    assert r.step is Step.REPORT and r.jobs == () and r.unrecoverable == (gone,)
    r = judge_round(p, 0, 0, 1, known={(0, 9)}, filled={(11, 11, "a")})
    assert r.step is Step.REPORT and [u["why"] for u in r.unrecoverable] == ["reported before"]
    assert judge_round(p, 0, 0, 1, known={(0, 9)}, waiting={(11, "a")}).step is Step.WAIT
    o = plan_ledger(meta([(0, "abc")], state=LedgerState.OPEN, last=-1), {"c"})
    assert judge_round(o, 5, 0, 1).step is Step.SEAL and judge_round(o, 5, 0, 1, seal=False).step is Step.WAIT


def test_damaged_ids_merge_and_a_whole_report_wins():
    from stream.autorecovery.keys import MAX_DAMAGED_RANGES, Task, _damaged_ids, merge_ranges
    assert merge_ranges([(5, 5), (1, 2)], [(3, 3), (9, 12)], [(10, 20)]) == ((1, 3), (5, 5), (9, 20))
    assert merge_ranges([(2 * k, 2 * k) for k in range(MAX_DAMAGED_RANGES + 1)]) == ((0, 2 * MAX_DAMAGED_RANGES),)
    t = Task(7, frozenset("a"), 1, damaged=frozenset("a"), damaged_ids={"a": ((3, 3),)})
    assert Task.from_bytes(7, t.to_bytes(), 9) == dataclasses.replace(t, revision=9)
    assert _damaged_ids(t, {"a", "b"}, {"a": [(4, 6)], "b": [(1, 1)]}) == {"a": ((3, 6),), "b": ((1, 1),)}
    assert _damaged_ids(t, {"a"}, None) == {}                        # reported whole now: whole
    whole = dataclasses.replace(t, damaged_ids={})
    assert _damaged_ids(whole, {"a"}, {"a": [(4, 6)]}) == {}          # whole before: stays whole
    assert _damaged_ids(None, set(), {"a": [(1, 1)]}) == {}           # (not reported damaged: no ids)


def test_a_damaged_bookie_declared_lost_is_damaged_no_more_and_a_registered_one_stays():
    """What a report does to a task (``Task.reported``, written by
    ``publish``), and a bookie's return (``Task.without``, by ``moot``): a
    bookie reported damaged with ids and then declared lost by the auditor
    (unregistered past its delay: its disk may be gone) is lost, no longer
    damaged, its ids dropped, so that its whole share is moved rather than
    filled in place onto a bookie that may never answer; back, it is moot;
    a damaged bookie's return changes nothing (registered, its damage
    stands)."""
    from stream.autorecovery.keys import Task
    t = Task(7, frozenset(), 1).reported({"a"}, damaged=True, ids={"a": [(3, 4)]})
    assert (t.lost, t.damaged, t.damaged_ids) == ({"a"}, {"a"}, {"a": ((3, 4),)})
    assert t.reported({"a"}, damaged=True, ids={"a": [(4, 4)]}) is t   # (nothing new: the same task)
    assert t.without("a") is t                                       # registered all along: stands
    both = t.reported({"b"}, damaged=True, ids={"b": [(9, 9)]})
    gone = both.reported({"a"})                                      # the auditor: a lost
    assert (gone.lost, gone.damaged, gone.damaged_ids) == ({"a", "b"}, {"b"}, {"b": ((9, 9),)})
    m = meta([(0, "abc")], e=3, qw=3, last=9)
    assert [(j.lost, j.fill, j.first_entry, j.last_entry) for j in plan_ledger(
        m, gone.lost - gone.damaged, gone.damaged, damaged_ids=gone.damaged_ids).jobs] == [
        ("a", False, 0, 9), ("b", True, 9, 9)]
    back = gone.without("a")
    assert (back.lost, back.damaged) == ({"b"}, {"b"})
    assert Task(8, frozenset({"c"}), 1, unrecoverable=({"lost": ["c"]},)).without("c") is None


def test_ranges_filled_are_taken_off_a_task_and_a_bookie_left_with_none_is_mended():
    """``Task.mended``, after a worker's call that must wait for the rest:
    the ranges it filled in place come off the bookie's ids (cut where a
    filled range is within one of them); a bookie left with none is neither
    damaged nor lost (with no ids it would stand for its whole share); one
    damaged as a whole, or lost, is untouched; nothing filled: the same
    task."""
    from stream.autorecovery.keys import Task, subtract_range
    assert subtract_range(((1, 10), (20, 30)), 5, 22) == ((1, 4), (23, 30))
    assert subtract_range(((1, 10),), 1, 10) == () and subtract_range(((1, 10),), 11, 12) == ((1, 10),)
    assert subtract_range(((1, 10),), 3, 3) == ((1, 2), (4, 10))
    t = (Task(7, frozenset(), 1).reported({"a"}, True, {"a": [(3, 9), (40, 40)]})
         .reported({"b"}, True, {"b": [(5, 5)]}).reported({"w"}, True).reported({"x"}))
    assert t.mended([]) is t
    half = t.mended([(3, 6, "a"), (5, 5, "b"), (0, 99, "w"), (0, 99, "x")])
    assert half.damaged_ids == {"a": ((7, 9), (40, 40))}
    assert half.damaged == {"a", "w"} and half.lost == {"a", "w", "x"}   # b mended; w whole, x lost: stand
    done = half.mended([(7, 9, "a"), (40, 40, "a")])
    assert done.damaged == {"w"} and done.lost == {"w", "x"} and not done.damaged_ids
    assert Task.from_bytes(7, done.to_bytes(), 3) == dataclasses.replace(done, revision=3)


def test_damaged_bookies_are_sources_and_never_make_a_fragment_unrecoverable():
    """A damaged bookie is alive and holds most of its entries: a write set
    of damaged bookies is no reason to report (the copy counts what no
    replica holds), damaged bookies are sources after the healthy ones, and
    each is the last source of its own position; a write set of
    unregistered bookies is still reported."""
    m = meta([(0, "abcd")], e=4, qw=2, last=19)
    p = plan_ledger(m, (), damaged={"a", "b", "c"})
    assert not p.unrecoverable and [j.lost for j in p.jobs] == ["a", "b", "c"]
    # position 1 (b) shares write sets with a (0) and c (2): both damaged, both sources;
    # each damaged bookie last for its own position (what only it still holds)
    assert {j.lost: j.sources for j in p.jobs} == {"a": ("d", "b", "a"), "b": ("a", "c", "b"),
                                                   "c": ("d", "b", "c")}
    p = plan_ledger(m, {"a", "b"}, damaged={"c"})
    assert [(u.first_entry, sorted(u.lost)) for u in p.unrecoverable] == [(0, ["a", "b", "c"])]
    p = plan_ledger(m, {"a"}, damaged={"b"})
    assert not p.unrecoverable and {j.lost: j.sources for j in p.jobs} == {"a": ("d", "b"), "b": ("c", "b")}


def test_pace_holds_copies_to_the_rate_with_one_burst_ahead():
    """The rate limit: at 10 bytes/s with a burst of 20, 5-byte frames sent
    as fast as allowed go five at once (the burst and the frame reaching
    past it), then one every half second; a frame
    asked after a pause goes at once (the pause is not saved up past the
    burst)."""
    pace = Pace(10, burst=20)
    t, sent = 0.0, []
    for _ in range(12):
        t += pace.take(t, 5)
        sent.append(t)
    assert sent[:5] == [0.0] * 5     # 20 bytes ahead of the rate, and the frame that reaches them
    assert [round(b - a, 9) for a, b in zip(sent[4:], sent[5:])] == [0.5] * 7
    assert sum([5] * 12) <= 10 * sent[-1] + 20 + 5  # never more than the rate, one burst and a frame
    assert pace.held == pytest.approx(3.5)   # some frame waiting from 0.0 (the sixth's turn) on
    overlapping = Pace(10, burst=20)      # frames asked at once: their waits overlap, held counts them once
    assert [overlapping.take(0.0, 5) for _ in range(7)] == [0.0] * 5 + [0.5, 1.0]
    assert overlapping.held == pytest.approx(1.0)
    assert pace.take(100.0, 5) == 0.0 and pace.take(100.0, 1000) == 0.0
    assert pace.take(100.0, 5) == pytest.approx(100.5 - 2.0)  # the big frame is paid for after it went


@pytest.mark.parametrize("rate,burst", [(0, 1), (-1, 1), (1, 0)])
def test_pace_refuses_a_rate_or_burst_not_positive(rate, burst):
    with pytest.raises(ValueError):
        Pace(rate, burst)


def test_a_rate_of_zero_is_no_limit_and_a_negative_one_is_refused():
    assert Pace.of(0) is None and Pace.of(0.0) is None
    assert Pace.of(5).rate == 5.0
    with pytest.raises(ValueError):
        Pace.of(-1)
