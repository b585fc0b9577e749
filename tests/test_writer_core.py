"""stream/writer_core.py: the pending-add window, pure and deterministic."""
from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from bookie import entry as E
from bookie.core import Status
from stream.quorum import write_set
from stream.writer_core import (ChangeReason, InvalidTransition, WindowFull, WriterCore, WriterFailed,
                                WriterFenced, WriterState)

ENS = ["b0", "b1", "b2", "b3", "b4"]


def writer(e=3, qw=3, qa=2, cls=WriterCore, **kw):
    return cls(7, 1, e, qw, qa, 0, ENS[:e], **kw)


def sent_to(ready):
    return {s.bookie_index: s.entry_ids for s in ready.sends}


class Checker:
    """The rules, written the obvious way, checked after every step."""

    def __init__(self, w: WriterCore):
        self.w = w
        self.acks: dict[int, set[int]] = {}
        self.app_acked: list[int] = []
        self.released: list[int] = []
        self.lac = self.lafr = w.lac

    def ack(self, eid, idx):
        self.w.on_ack(eid, idx)
        if idx not in self.w.failed:
            self.acks.setdefault(eid, set()).add(idx)
        self.check()

    def check(self):
        w, r = self.w, self.w.ready()
        self.app_acked += r.acked
        self.released += r.released
        assert self.app_acked == list(range(len(self.app_acked))), "acks out of order"
        assert r.lac >= self.lac and r.lafr >= self.lafr, "LAC/LAFR went down"
        self.lac, self.lafr = r.lac, r.lafr

        def contiguous(q):
            k = -1
            while len(self.acks.get(k + 1, ())) >= q:
                k += 1
            return k
        assert r.lac == contiguous(w.Qa) and (not self.app_acked or self.app_acked[-1] == r.lac)
        if w.gwq:
            for eid in self.released:  # rule 1: released only at Qw, with all lower
                assert len(self.acks.get(eid, ())) >= w.Qw, f"entry {eid} released below Qw"
                assert all(len(self.acks.get(x, ())) >= w.Qw for x in range(eid))
            assert r.lafr == contiguous(w.Qw), "LAFR not contiguous"
        return r


@st.composite
def quorums(draw):
    e = draw(st.integers(1, 5))
    qw = draw(st.integers(1, e))
    return e, qw, draw(st.integers(1, qw))


@settings(max_examples=200, deadline=None)
@given(q=quorums(), n=st.integers(1, 12), gwq=st.booleans(), data=st.data())
def test_acks_in_order_and_marks_contiguous_under_random_ack_orders(q, n, gwq, data):
    e, qw, qa = q
    w = WriterCore(7, 1, e, qw, qa, 0, ENS[:e], guaranteed_write_quorum=gwq)
    c = Checker(w)
    for _ in range(n):
        w.add(b"p")
    c.check()
    acks = [(eid, i) for eid in range(n) for i in write_set(eid, e, qw)]
    acks = data.draw(st.permutations(acks))
    acks = acks[: data.draw(st.integers(0, len(acks)))]  # some never arrive
    for eid, i in acks:
        c.ack(eid, i)
    if len(acks) == n * qw:
        assert w.lac == n - 1 and (w.lafr == n - 1 or not gwq) and not w.pending


def _pitfall(cls):
    """Entry 0 reaches only Qa; entry 1 (say, a no-op) reaches Qw."""
    w = writer(cls=cls)
    c = Checker(w)
    w.add(b"a"), w.add(b"noop")
    c.check()
    for eid, i in [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]:
        c.ack(eid, i)
    assert w.lac == 1 and w.lafr == -1 and 0 in w.pending
    return w


class BuggyWriter(WriterCore):
    """The public spec's scan: LAFR = the highest entry up to LAC at Qw,
    jumping over an entry left at Qa."""

    def _advance(self):
        while self.lac + 1 < self.next_to_send and len(self.pending[self.lac + 1].acks) >= self.Qa:
            self.lac += 1
            self._out_acked.append(self.lac)
        new = next((x for x in range(self.lac, self.lafr, -1) if len(self.pending[x].acks) >= self.Qw), self.lafr)
        for x in range(self.lafr + 1, new + 1):
            self.pending.pop(x)
            self._out_released.append(x)
        self.lafr = new


def test_entry_at_qa_is_not_released_and_lafr_stops_below_it():
    w = _pitfall(WriterCore)
    # the ensemble change then carries entry 0 forward
    w.on_bookie_failed(2)
    ch = w.ready().ensemble_change
    assert ch.first_entry == 0 and ch.replace == (2,) and ch.replaces_fragment


def test_the_checker_catches_the_buggy_lafr_scan():
    with pytest.raises(AssertionError, match="entry 0 released below Qw"):
        _pitfall(BuggyWriter)


def test_ensemble_change_starts_at_lafr_plus_1_and_resends():
    w = writer()
    c = Checker(w)
    for _ in range(4):
        w.add(b"x")
    c.check()
    for eid, i in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)]:
        c.ack(eid, i)
    assert (w.lac, w.lafr) == (1, 0)
    w.on_bookie_failed(2)
    r = c.check()
    assert w.state is WriterState.CHANGING_ENSEMBLE
    ch = r.ensemble_change
    assert ch.first_entry == 1 and ch.reason is ChangeReason.FAILURE and not ch.replaces_fragment
    eid = w.add(b"during change")  # held until the change is published
    assert eid == 4 and not c.check().sends
    w.on_ensemble_changed(1, ["b0", "b1", "b9"])
    r = c.check()
    assert w.state is WriterState.OPEN and (w.fragment_first, w.ensemble) == (1, ["b0", "b1", "b9"])
    s = sent_to(r)
    assert s[2] == [1, 2, 3, 4] and s[0] == [4] and s[1] == [4]
    assert next(x for x in r.sends if x.bookie_index == 2).bookie_id == "b9"
    w.on_ack(1, 2, bookie_id="b2")  # a late answer from the replaced bookie
    assert w.lafr == 0
    c.ack(1, 2)
    assert w.lafr == 1


def test_classic_mode_changes_from_lac_plus_1():
    w = writer(guaranteed_write_quorum=False)
    for _ in range(3):
        w.add(b"x")
    for eid, i in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        w.on_ack(eid, i)
    r = w.ready()
    assert r.released == [0, 1] and r.lac == 1
    w.on_bookie_failed(2)
    assert w.ready().ensemble_change.first_entry == 2


def test_rule3_a_needed_bookie_is_not_replaced_until_its_entry_reaches_qw():
    w = writer()
    w.add(b"x")
    w.on_ack(0, 0), w.on_ack(0, 1)  # committed at Qa, b1 holds one of the 2 copies
    w.on_bookie_failed(1)
    r = w.ready()
    assert r.ensemble_change is None and w.state is WriterState.OPEN and r.acked == [0]
    w.add(b"y")
    # delayed ensemble change: while b1 waits, entry 1 goes to the rest of its write set
    assert sent_to(w.ready()) == {0: [1], 2: [1]}
    w.on_ack(0, 2)
    r = w.ready()
    assert r.released == [0] and r.ensemble_change.replace == (1,) and r.ensemble_change.first_entry == 1


def test_a_change_held_by_rule3_on_every_failed_bookie_is_retried():
    """Entries 0 and 1 committed with copies {b0, b2} and {b1, b2}; then b0
    and b1 fail.  Each is needed by one entry (rule 3), so no change can be
    proposed: the writer is held.  retry_held gives them another chance and
    resends what they miss; their acks unblock everything."""
    w = writer()
    w.add(b"x"), w.add(b"y")
    w.ready()
    w.on_ack(0, 0), w.on_ack(0, 2), w.on_ack(1, 1), w.on_ack(1, 2)
    w.on_bookie_failed(0), w.on_bookie_failed(1)
    r = w.ready()
    assert r.acked == [0, 1] and r.ensemble_change is None and w.held
    assert w.retry_held() and not w.held and not w.failed
    assert sent_to(w.ready()) == {1: [0], 0: [1]}  # what each one misses
    w.on_ack(0, 1), w.on_ack(1, 0)
    r = w.ready()
    assert r.lafr == 1 and r.released == [0, 1]
    assert not w.retry_held()  # nothing held: a no-op


def test_window_bound_is_backpressure():
    w = writer(max_pending=3)
    for _ in range(3):
        w.add(b"x")
    with pytest.raises(WindowFull) as ei:
        w.add(b"x")
    assert ei.value.retriable and ei.value.state is WriterState.OPEN
    w.on_ack(0, 0), w.on_ack(0, 1)
    with pytest.raises(WindowFull):  # acknowledged at Qa is not released
        w.add(b"x")
    w.on_ack(0, 2)
    w.ready()
    assert w.add(b"x") == 3


def test_invalid_term_fails_every_pending_add():
    w = writer()
    for _ in range(3):
        w.add(b"x")
    w.on_ack(0, 0), w.on_ack(0, 1)
    w.ready()
    w.on_ack(1, 1, Status.INVALID_TERM, term=5)
    r = w.ready()
    assert r.state is WriterState.FENCED and [e for e, _ in r.failed] == [1, 2]
    assert all(isinstance(err, WriterFenced) and err.term == 5 for _, err in r.failed)
    with pytest.raises(WriterFenced):
        w.add(b"x")
    w.on_ack(2, 2)  # late answers are ignored
    assert not w.has_ready()


def test_records_carry_lac_lafr_and_term():
    w = writer()
    w.add(b"a")
    for i in range(3):
        w.on_ack(0, i)
    w.add(b"b")
    w.add(b"c")
    w.on_ack(1, 0), w.on_ack(1, 1)
    w.ready()
    w.add(b"d")
    rec = w.ready().sends[0].records[0]
    h = E.parse_header(rec)
    assert (h.entry_id, h.lac, h.lafr, h.term, E.decode(rec).payload) == (3, 1, 0, 1, b"d")


def test_roll_by_size_waits_for_a_clean_boundary():
    w = writer(fragment_max_entries=2)
    c = Checker(w)
    for _ in range(3):
        w.add(b"x")
    r = c.check()
    assert sent_to(r)[0] == [0, 1] and r.ensemble_change is None
    for eid in (0, 1):
        for i in range(3):
            c.ack(eid, i)
    assert w.proposal.reason is ChangeReason.ROLL and w.proposal.first_entry == 2
    w.on_ensemble_changed(2, ["b2", "b3", "b4"])
    r = c.check()
    assert {s.bookie_id: s.entry_ids for s in r.sends} == {"b2": [2], "b3": [2], "b4": [2]}
    assert w.fragment_first == 2 and w.fragment_entries == 1


def test_the_lac_may_be_told_while_the_roll_after_a_full_fragment_is_under_way():
    """The last entry of a full fragment acknowledged: the roll is proposed
    at once, so a writer closing there is mid-change; its closing LAC must
    still go out (to the fragment that is still the last published one)."""
    w = writer(fragment_max_entries=2)
    assert w.may_tell_lac
    w.add_many([b"x", b"y"])
    for eid in (0, 1):
        for i in range(3):
            w.on_ack(eid, i)
    assert w.state is WriterState.CHANGING_ENSEMBLE and w.proposal.reason is ChangeReason.ROLL
    assert w.lac == 1 and w.may_tell_lac and w.ensemble == ENS[:3]
    w.on_ensemble_changed(2, ["b2", "b3", "b4"])
    assert w.may_tell_lac
    w.fail("stopped")
    assert not w.may_tell_lac


def test_close_only_with_no_pending_adds():
    w = writer()
    w.add(b"x")
    assert not w.close_allowed()
    with pytest.raises(InvalidTransition):
        w.close()
    for i in range(3):
        w.on_ack(0, i)
    assert w.close_allowed() and w.close() == 0 and w.state is WriterState.CLOSED


def test_state_table_refuses_close_during_a_change():
    w = writer()
    w.add(b"x")
    w.on_bookie_failed(0)
    assert w.state is WriterState.CHANGING_ENSEMBLE
    with pytest.raises(InvalidTransition) as ei:
        w.close()
    assert ei.value.state is WriterState.CHANGING_ENSEMBLE
    w.on_ensemble_change_rejected()
    assert w.state is WriterState.FENCED and [e for e, _ in w.ready().failed] == [0]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_frame_acks_equal_entry_by_entry_acks(data):
    """on_acks (a frame's OK answers at once) is on_ack for each entry."""
    a, b = writer(4, 3, 2), writer(4, 3, 2)
    n = data.draw(st.integers(1, 30))
    for w in (a, b):
        for i in range(n):
            w.add(b"p%d" % i)
        w.ready()
    for _ in range(data.draw(st.integers(1, 25))):
        idx = data.draw(st.integers(0, 3))
        mine = [e for e in range(n) if idx in write_set(e, 4, 3)]
        frame = sorted(data.draw(st.sets(st.sampled_from(mine), max_size=6))) if mine else []
        a.on_acks(frame, idx)
        for e in frame:
            b.on_ack(e, idx)
        ra, rb = a.ready(), b.ready()
        assert (ra.lac, ra.lafr, ra.acked, ra.released) == (rb.lac, rb.lafr, rb.acked, rb.released)


# -- batches ---------------------------------------------------------------------------


@pytest.mark.parametrize("e,qw,qa", [(3, 3, 2), (5, 3, 2), (4, 2, 1)])
def test_add_many_sends_what_adds_one_at_a_time_send(e, qw, qa):
    payloads = [b"p%d" % i * (i % 4) for i in range(23)]
    one, many = writer(e, qw, qa), writer(e, qw, qa)
    for p in payloads:
        one.add(p)
    assert many.add_many(payloads) == 0 and many.next_entry == one.next_entry == 23

    def sends(w):
        return {s.bookie_index: (s.bookie_id, s.entry_ids, s.records) for s in w.ready().sends}

    got, want = sends(many), sends(one)
    assert got == want
    for i, (_, ids, recs) in got.items():
        assert ids == [x for x in range(23) if i in write_set(x, e, qw)]
        assert [E.decode(r).payload for r in recs] == [payloads[x] for x in ids]
    for i, (_, ids, _) in got.items():  # acks per frame, as the adapter gives them
        many.on_acks(ids, i)
        one.on_acks(ids, i)
    a, b = many.ready(), one.ready()
    assert (a.lac, a.lafr, a.acked, a.released) == (b.lac, b.lafr, b.acked, b.released) == (
        22, 22, list(range(23)), list(range(23)))


def test_add_many_is_all_or_none_against_the_window():
    w = writer(max_pending=10)
    w.add_many([b"x"] * 8)
    with pytest.raises(WindowFull):
        w.add_many([b"y"] * 3)
    assert w.next_entry == 8 and len(w.pending) == 8  # nothing of the refused batch was queued
    assert w.add_many([b"z"] * 2) == 8


def test_add_many_stops_sending_at_a_roll_and_sends_the_rest_after_the_change():
    w = writer(fragment_max_entries=3)
    w.add_many([b"a%d" % i for i in range(5)])
    r = w.ready()
    assert sent_to(r) == {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]}
    for i in range(3):
        w.on_acks([0, 1, 2], i)
    r = w.ready()
    assert r.ensemble_change is not None and r.ensemble_change.reason is ChangeReason.ROLL
    assert r.ensemble_change.first_entry == 3
    w.on_ensemble_changed(3, ["c0", "c1", "c2"])
    r = w.ready()
    assert {s.bookie_id: s.entry_ids for s in r.sends} == {"c0": [3, 4], "c1": [3, 4], "c2": [3, 4]}


def test_check_room_raises_what_add_many_would_and_adds_nothing():
    w = writer(max_pending=4)
    w.check_room(4)
    with pytest.raises(WindowFull):
        w.check_room(5)
    assert w.next_entry == 0 and not w.pending
    w.fail("gone")
    with pytest.raises(WriterFailed):
        w.check_room(1)


def test_a_deferred_change_goes_on_at_qa_until_the_window_is_full_then_retries():
    """Delayed ensemble change (issue 12 item 3): E3 Qw3 Qa2 with no spare
    bookie.  b2 fails; the adapter finds no replacement and defers.  Appends
    go on to b0 and b1 and are acknowledged at Qa, but rule 1 keeps them
    pending (below Qw) until the window is full.  retry_failed sends b2
    what it misses; its acks release everything."""
    w = writer(max_pending=4)
    w.add(b"a")
    w.ready()
    w.on_ack(0, 0), w.on_ack(0, 1)
    w.on_bookie_failed(2)
    prop = w.ready().ensemble_change
    assert prop.replace == (2,) and w.state is WriterState.CHANGING_ENSEMBLE
    w.on_change_deferred()
    assert w.state is WriterState.OPEN and w.deferred and w.awaiting and w.proposal is None
    for x in (b"b", b"c", b"d"):
        w.add(x)
    assert sent_to(w.ready()) == {0: [1, 2, 3], 1: [1, 2, 3]}  # not to the failed b2
    for eid in (1, 2, 3):
        w.on_ack(eid, 0), w.on_ack(eid, 1)
    r = w.ready()
    assert r.acked == [1, 2, 3] and r.released == [] and r.ensemble_change is None  # no re-proposal
    with pytest.raises(WindowFull):
        w.add(b"e")
    assert w.retry_failed() and not w.deferred and not w.failed
    assert sent_to(w.ready()) == {2: [0, 1, 2, 3]}  # what b2 misses, in order
    for eid in range(4):
        w.on_ack(eid, 2)
    r = w.ready()
    assert r.lafr == 3 and r.released == [0, 1, 2, 3] and w.add(b"e") == 4


def test_a_retried_bookie_that_fails_again_proposes_the_change_again():
    w = writer()
    w.add(b"a")
    w.ready()
    w.on_bookie_failed(2)
    w.ready()
    w.on_change_deferred()
    assert w.retry_failed()
    w.ready()
    w.on_bookie_failed(2)  # still down: a spare may have registered since
    prop = w.ready().ensemble_change
    assert prop is not None and prop.replace == (2,)
    w.on_ensemble_changed(prop.first_entry, ["b0", "b1", "b3"])
    assert sent_to(w.ready()) == {2: [0]} and not w.awaiting


def test_the_ack_quorum_is_reachable_while_each_write_set_keeps_qa_live_bookies():
    w = writer()  # E3 Qw3 Qa2
    assert w.ack_quorum_reachable
    w.failed = {2: "b2"}
    assert w.ack_quorum_reachable
    w.failed = {1: "b1", 2: "b2"}
    assert not w.ack_quorum_reachable
    w = writer(e=4, qw=2, qa=1)  # write sets (0,1) (1,2) (2,3) (3,0)
    w.failed = {0: "b0", 2: "b2"}
    assert w.ack_quorum_reachable
    w.failed = {0: "b0", 1: "b1"}
    assert not w.ack_quorum_reachable
