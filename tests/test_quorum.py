"""stream/quorum.py: write sets, coverage and the read-forward decision."""
from __future__ import annotations

from itertools import combinations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from bookie.core import Status
from stream.quorum import (CoverageTracker, EntryReadOutcome, InvalidQuorum, ReadOutcome,
                           validate_quorums, write_quorums, write_set)


@st.composite
def quorums(draw, max_e=6):
    e = draw(st.integers(1, max_e))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    return e, qw, qa


def test_write_sets_match_the_seed_table():
    # E = 4, Qw = 3: the table of the protocol seed (B1..B4 -> 0..3)
    assert [write_set(e, 4, 3) for e in range(6)] == [
        (0, 1, 2), (1, 2, 3), (2, 3, 0), (3, 0, 1), (0, 1, 2), (1, 2, 3)]
    assert write_quorums(3, 3) == [(0, 1, 2)]  # E = Qw: one quorum
    assert len(write_quorums(4, 3)) == 4


@pytest.mark.parametrize("e,qw,qa", [(3, 4, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0), (2, 1, 2)])
def test_invalid_quorums(e, qw, qa):
    with pytest.raises(InvalidQuorum) as ei:
        validate_quorums(e, qw, qa)
    assert (ei.value.ensemble_size, ei.value.write_quorum, ei.value.ack_quorum) == (e, qw, qa)


def test_coverage_e_equals_qw_needs_e_minus_qa_plus_1():
    c = CoverageTracker(3, 3, 2)
    assert not c.on_response(0)
    assert c.on_response(2)
    c = CoverageTracker(5, 5, 3)
    assert [c.on_response(i) for i in range(3)] == [False, False, True]


def test_coverage_striped():
    c = CoverageTracker(4, 2, 2)  # one responder in each of {0,1},{1,2},{2,3},{3,0}
    c.on_response(0)
    c.on_response(1)
    assert not c.covered
    c.on_response(2)
    assert c.covered


@settings(max_examples=300, deadline=None)
@given(q=quorums(), data=st.data())
def test_coverage_iff_every_ack_quorum_meets_a_responder(q, data):
    e, qw, qa = q
    responders = data.draw(st.sets(st.integers(0, e - 1)))
    c = CoverageTracker(e, qw, qa)
    for i in sorted(responders):
        c.on_response(i)
    every_ack_quorum_hit = all(set(sub) & responders
                               for s in range(e)
                               for sub in combinations(write_set(s, e, qw), qa))
    assert c.covered == every_ack_quorum_hit


@settings(max_examples=300, deadline=None)
@given(q=quorums(), data=st.data())
def test_coverage_impossible_is_final(q, data):
    e, qw, qa = q
    failed = data.draw(st.sets(st.integers(0, e - 1)))
    c = CoverageTracker(e, qw, qa)
    for i in sorted(failed):
        c.on_failure(i)
    for i in range(e):
        c.on_response(i)  # everybody else answers
    assert c.covered != c.impossible


def test_read_one_ok_is_enough():
    r = EntryReadOutcome(3, 2, (0, 1, 2))
    assert r.on_response(0, Status.NO_SUCH_ENTRY) is ReadOutcome.PENDING
    assert r.on_response(1, Status.OK, b"rec") is ReadOutcome.RECOVERABLE
    assert r.record == b"rec"
    assert r.on_response(2, Status.NO_SUCH_ENTRY) is ReadOutcome.RECOVERABLE  # final


def test_read_absent_needs_qw_minus_qa_plus_1_no_such():
    r = EntryReadOutcome(3, 2)
    assert r.on_response(0, Status.NO_SUCH_ENTRY) is ReadOutcome.PENDING
    assert r.on_response(1, Status.NO_SUCH_LEDGER) is ReadOutcome.ABSENT
    r = EntryReadOutcome(5, 2)
    for i in range(3):
        assert r.on_response(i, Status.NO_SUCH_ENTRY) is ReadOutcome.PENDING
    assert r.on_response(3, Status.NO_SUCH_ENTRY) is ReadOutcome.ABSENT


def test_read_errors_and_unknown_never_absent():
    r = EntryReadOutcome(3, 2)
    r.on_response(0, Status.NO_SUCH_ENTRY)
    r.on_response(1, Status.UNKNOWN_ENTRY)
    assert r.on_timeout(2) is ReadOutcome.UNKNOWN
    r = EntryReadOutcome(3, 1)  # needs 3 no-such
    r.on_response(0, Status.NO_SUCH_ENTRY)
    r.on_response(1, Status.NO_SUCH_ENTRY)
    assert r.on_response(2, Status.INTERNAL_ERROR) is ReadOutcome.UNKNOWN


ANSWERS = st.sampled_from([Status.OK, Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER, Status.UNKNOWN_ENTRY,
                           Status.INTERNAL_ERROR, Status.CHECKSUM_MISMATCH, None])


@settings(max_examples=300, deadline=None)
@given(q=quorums(), data=st.data())
def test_read_outcome_properties(q, data):
    _, qw, qa = q
    answers = data.draw(st.lists(ANSWERS, min_size=qw, max_size=qw))
    r = EntryReadOutcome(qw, qa)
    for i, s in enumerate(answers):
        r.on_response(i, s, b"x" if s is Status.OK else None)
    assert r.outcome is not ReadOutcome.PENDING  # everyone answered
    no_such = [i for i, s in enumerate(answers) if s in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER)]
    if r.outcome is ReadOutcome.ABSENT:
        # fewer than Qa bookies of the write set may hold it: never acknowledged
        assert qw - len(no_such) < qa
        first_ok = next((i for i, s in enumerate(answers) if s is Status.OK), qw)
        assert sum(1 for i in no_such if i < first_ok) >= qw - qa + 1
    if r.outcome is ReadOutcome.RECOVERABLE:
        assert Status.OK in answers
    if r.outcome is ReadOutcome.UNKNOWN:
        assert Status.OK not in answers and len(no_such) < qw - qa + 1
