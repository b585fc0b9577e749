"""The read core (stream/read_core.py): replica order, speculation with time
as an input, the "missing" rule, the covering LAC read; and a read-core
mutant that the simulator (which runs the same core in SimReader) catches."""
from __future__ import annotations

import pytest

import sim
from bookie.core import Status
from sim import Scenario, Violation
from stream import read_core as rc
from stream.read_core import Answer, EntryRead, LacRead, Verdict, answer_of, replica_order


def test_replica_order_is_the_write_set_healthy_first_then_least_suspect():
    assert replica_order(0, 3, 3) == [0, 1, 2]
    assert replica_order(1, 4, 3) == [1, 2, 3]
    assert replica_order(1, 4, 3, rotation=1) == [2, 3, 1]
    assert replica_order(0, 3, 3, {0: 2.0, 1: 0.7, 2: 0.1}) == [2, 1, 0]  # 0.1: faded below suspect
    assert replica_order(0, 3, 3, {0: 0.9}) == [1, 2, 0]


def test_answers_are_typed():
    assert answer_of(Status.NO_SUCH_ENTRY) is Answer.ABSENT and answer_of(Status.NO_SUCH_LEDGER) is Answer.ABSENT
    assert answer_of(Status.CHECKSUM_MISMATCH) is Answer.BAD
    assert answer_of(None) is Answer.FAILED and answer_of(Status.INTERNAL_ERROR) is Answer.FAILED
    with pytest.raises(ValueError):
        answer_of(Status.OK)


def test_speculation_asks_the_next_replica_at_the_deadline_and_the_first_ok_wins():
    r = EntryRead(0, 3, 3, 2, speculate_after=0.1)
    assert r.start(10.0) == [0] and r.deadline == pytest.approx(10.1)
    assert r.tick(10.05) == []                       # not yet
    assert r.tick(10.1) == [1] and r.deadline == pytest.approx(10.2)
    assert r.on_answer(1, Answer.OK, 10.15, "e0") == []
    assert r.verdict is Verdict.FOUND and r.value == "e0" and r.found_at == 1 and r.deadline is None
    assert r.on_answer(0, Answer.ABSENT, 10.3) == []  # late answers change nothing
    assert r.verdict is Verdict.FOUND


def test_a_failed_answer_hands_over_at_once_and_without_speculation_there_is_no_timer():
    r = EntryRead(0, 3, 3, 2)
    assert r.start(0) == [0] and r.deadline is None
    assert r.on_answer(0, Answer.FAILED, 1) == [1]
    assert r.on_answer(1, Answer.BAD, 2) == [2]
    assert r.on_answer(2, Answer.FAILED, 3) == [] and r.verdict is Verdict.BAD


@pytest.mark.parametrize("answers, qa, verdict", [
    ([Answer.ABSENT, Answer.ABSENT, Answer.ABSENT], 2, Verdict.MISSING),
    ([Answer.ABSENT, Answer.FAILED, Answer.ABSENT], 2, Verdict.MISSING),    # Qw - Qa + 1 = 2 absent
    ([Answer.ABSENT, Answer.FAILED, Answer.FAILED], 2, Verdict.UNAVAILABLE),  # one absent proves nothing
    ([Answer.ABSENT, Answer.BAD, Answer.FAILED], 2, Verdict.BAD),
    ([Answer.ABSENT, Answer.FAILED, Answer.FAILED], 3, Verdict.MISSING),    # Qa = Qw: every replica holds it
    ([Answer.ABSENT, Answer.ABSENT, Answer.FAILED], 1, Verdict.UNAVAILABLE),  # Qa = 1: the silent one may
])
def test_missing_only_on_qw_minus_qa_plus_one_absent_answers(answers, qa, verdict):
    r = EntryRead(5, 3, 3, qa)
    asked = r.start(0)
    for a in answers:
        assert r.verdict is Verdict.PENDING  # every replica is asked before giving up
        asked = r.on_answer(asked[0], a, 0) or asked
    assert r.verdict is verdict


def test_an_ok_after_absent_answers_still_wins():
    r = EntryRead(0, 3, 3, 2)
    r.start(0)
    r.on_answer(0, Answer.ABSENT, 0)
    r.on_answer(1, Answer.ABSENT, 0)
    r.on_answer(2, Answer.OK, 0, "e")
    assert r.verdict is Verdict.FOUND


def test_the_covering_lac_read():
    r = LacRead(first_entry=10, ensemble_size=3, write_quorum=3, ack_quorum=2)
    assert r.lac == 9 and not r.covered
    r.on_answer(0, Status.NO_SUCH_LEDGER)      # an answer, no LAC
    assert not r.covered
    r.on_answer(1, Status.OK, 14)
    assert r.covered and r.lac == 14
    r = LacRead(0, 3, 3, 2)
    r.on_answer(0, None)
    r.on_answer(1, Status.INTERNAL_ERROR)
    assert r.impossible and not r.covered


def test_the_simulator_catches_a_read_core_that_decides_missing_on_one_absent_answer(monkeypatch):
    """A mutant of the shipped core (the simulator's reader runs it): an
    entry is missing as soon as one replica says NO_SUCH_ENTRY.  A
    committed entry on Qa of Qw replicas then reads as missing: the
    AckedReadable invariant fails.  (First hit when written: seed 50.)"""
    correct = rc.EntryRead._decide

    def hasty(self):
        if self.found_at is None and Answer.ABSENT in self.answers.values():
            return Verdict.MISSING
        return correct(self)

    monkeypatch.setattr(rc.EntryRead, "_decide", hasty)
    for seed in range(200):
        try:
            sim.run(Scenario.random(seed), check_trace=False)
        except Violation as e:
            assert e.invariant == "AckedReadable", e
            return
    pytest.fail("the hasty-missing read core was not caught in 200 seeds")
