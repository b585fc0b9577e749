"""The ledger life-cycle core (stream/lifecycle.py): verdicts and the CAS runner."""
from __future__ import annotations

import asyncio

import pytest

from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from stream.lifecycle import (Apply, Backoff, CasLost, CasUnknown, CloseAt, Done, Moot, ReplaceBookie, Wait,
                              fragment_end, is_sealed, judge_lost_cas, run_cas)


def meta(frags, state=LedgerState.OPEN, last=-1, mode=LedgerMode.CLASSIC, e=3, qw=3, qa=2):
    frs = tuple(Fragment(f, tuple(ens)) for f, ens in frags)
    return LedgerMetadata(e, qw, qa, ledger_id=7, state=state, last_entry=last, mode=mode,
                          fragments=frs, fragment_count=len(frs), last_fragment_first_entry=frs[-1].first_entry)


ABC = ("a", "b", "c")


def test_fragment_end_and_sealed():
    m = meta([(0, ABC), (10, ("a", "b", "d"))])
    assert fragment_end(m, 0) == 9 and is_sealed(m, 0)
    assert fragment_end(m, 10) is None and not is_sealed(m, 10)
    c = m.with_(state=LedgerState.CLOSED, last_entry=15)
    assert fragment_end(c, 10) == 15 and is_sealed(c, 10)


def test_replace_sealed_fragment_applies_with_target_at_lost_index():
    m = meta([(0, ABC), (10, ("a", "b", "d"))])
    v = ReplaceBookie(7, 0, "b", "x", ABC).judge(m)
    assert isinstance(v, Apply) and v.fragments == (Fragment(0, ("a", "x", "c")),)
    assert v.header.fragment_count == 2 and v.header.state is LedgerState.OPEN


def test_replace_rules():
    m = meta([(0, ABC), (10, ("a", "b", "d"))])
    assert isinstance(ReplaceBookie(7, 10, "b", "x", ("a", "b", "d")).judge(m), Wait)   # open: writer's
    assert isinstance(ReplaceBookie(7, 0, "b", "x", ABC).judge(None), Moot)             # ledger gone
    assert isinstance(ReplaceBookie(7, 5, "b", "x", ABC).judge(m), Moot)                # no such fragment
    assert isinstance(ReplaceBookie(7, 0, "b", "c", ABC).judge(m), Moot)                # target already in it
    done = meta([(0, ("a", "x", "c")), (10, ("a", "b", "d"))])
    assert isinstance(ReplaceBookie(7, 0, "b", "x", ABC).judge(done), Done)             # ours went through
    other = meta([(0, ("a", "y", "c")), (10, ("a", "b", "d"))])
    assert isinstance(ReplaceBookie(7, 0, "b", "x", ABC).judge(other), Moot)            # another worker's
    rec = m.with_(state=LedgerState.IN_RECOVERY)
    assert isinstance(ReplaceBookie(7, 0, "b", "x", ABC).judge(rec), Wait)
    closed = m.with_(state=LedgerState.CLOSED, last_entry=12)
    assert isinstance(ReplaceBookie(7, 10, "b", "x", ("a", "b", "d")).judge(closed), Apply)


def test_lost_cas_verdict_is_the_judgement_on_the_fresh_metadata():
    intent = ReplaceBookie(7, 0, "b", "x", ABC)
    assert isinstance(judge_lost_cas(intent, meta([(0, ("a", "x", "c")), (10, ABC)])), Done)
    # a writer's ensemble change bumped the header: retry on the new revision
    assert isinstance(judge_lost_cas(intent, meta([(0, ABC), (10, ABC), (20, ("a", "c", "d"))])), Apply)
    assert isinstance(judge_lost_cas(intent, None), Moot)


def test_close_verdicts():
    m = meta([(0, ABC)])
    assert isinstance(CloseAt(7, 4).judge(m), Apply)
    assert isinstance(CloseAt(7, 4).judge(m.with_(state=LedgerState.CLOSED, last_entry=4)), Done)
    assert isinstance(CloseAt(7, 4).judge(m.with_(state=LedgerState.CLOSED, last_entry=5)), Moot)
    assert isinstance(CloseAt(7, 4).judge(m.with_(state=LedgerState.IN_RECOVERY)), Moot)


class FakeEtcd:
    """A revisioned cell, for the runner's unit tests only."""

    def __init__(self, m):
        self.m, self.rev, self.fail_next = m, 1, []
        self.writes = 0

    async def read(self):
        return self.m, self.rev

    async def write(self, apply, rev):
        if self.fail_next:
            kind = self.fail_next.pop(0)
            if kind == "lost":
                self.m, self.rev = self.m.with_(custom={"bump": str(self.rev)}), self.rev + 1
                raise CasLost("bumped")
            if kind == "unknown-applied":
                self._apply(apply)
                raise CasUnknown("timeout after the write")
            raise CasUnknown("down")
        if rev != self.rev:
            raise CasLost("stale")
        self._apply(apply)
        return self.m, self.rev

    def _apply(self, apply):
        frs = {f.first_entry: f for f in self.m.fragments}
        frs.update({f.first_entry: f for f in apply.fragments})
        self.m = apply.header.with_(fragments=tuple(frs[k] for k in sorted(frs)))
        self.rev += 1
        self.writes += 1


async def _nosleep(_):
    return None


def test_runner_retries_a_lost_cas_and_adopts_an_unknown_outcome():
    m = meta([(0, ABC), (10, ABC)])
    intent = ReplaceBookie(7, 0, "b", "x", ABC)
    cell = FakeEtcd(m)
    cell.fail_next = ["lost"]
    r = asyncio.run(run_cas(intent, cell.read, cell.write, sleep=_nosleep))
    assert isinstance(r.verdict, Apply) and r.attempts == 2 and cell.writes == 1
    assert cell.m.fragments[0].ensemble == ("a", "x", "c")
    # the write went through but its answer was lost: adopted, not written twice
    cell2 = FakeEtcd(m)
    cell2.fail_next = ["unknown-applied"]
    r2 = asyncio.run(run_cas(intent, cell2.read, cell2.write, sleep=_nosleep))
    assert isinstance(r2.verdict, Done) and r2.applied and cell2.writes == 1


def test_runner_gives_up_after_the_backoff_attempts():
    m = meta([(0, ABC), (10, ABC)])
    cell = FakeEtcd(m)
    cell.fail_next = ["down"] * 10
    slept = []

    async def sleep(d):
        slept.append(d)

    r = asyncio.run(run_cas(ReplaceBookie(7, 0, "b", "x", ABC), cell.read, cell.write,
                            Backoff(base=0.1, factor=2, cap=0.5, attempts=4), sleep=sleep))
    assert isinstance(r.verdict, Wait) and not r.applied and cell.writes == 0
    assert slept == [0.1, 0.2, 0.4, 0.5]


@pytest.mark.parametrize("attempt,delay", [(0, 0.05), (1, 0.1), (5, 1.0)])
def test_backoff(attempt, delay):
    assert Backoff().delay(attempt) == pytest.approx(delay)


# -- the other life-cycle steps ------------------------------------------------------------

from stream import lifecycle as lc  # noqa: E402
from stream import mutations as M  # noqa: E402
from stream.lifecycle import (BeginRecovery, ChangeEnsemble, CloseRecovered, FinishTakeOver,  # noqa: E402
                              TakeOver, writer_verdict)

U = LedgerMode.UNBOUNDED


def test_take_over_raises_the_term_once_from_any_state():
    m = meta([(0, ABC)], mode=U).with_(term=3)
    for state in LedgerState:
        v = TakeOver(7).judge(m.with_(state=state))
        assert isinstance(v, Apply) and (v.header.term, v.header.state) == (4, LedgerState.IN_RECOVERY)
    assert TakeOver(7).judge(meta([(0, ABC)])).kind == lc.WRONG_MODE      # a classic ledger
    assert TakeOver(7).judge(None).kind == lc.GONE
    # the mutant keeps the term: caught by the simulator (tests/test_sim.py) and test_stream
    assert TakeOver(7, M.Mutations.of(M.TAKEOVER_KEEPS_TERM)).judge(m).header.term == 3


def test_finish_take_over_opens_at_its_term_or_is_fenced():
    rec = meta([(0, ABC)], mode=U, state=LedgerState.IN_RECOVERY).with_(term=4)
    change = Fragment(0, ("a", "b", "x"))
    v = FinishTakeOver(7, 4, change).judge(rec)
    assert isinstance(v, Apply) and v.header.state is LedgerState.OPEN and v.fragments == (change,)
    assert FinishTakeOver(7, 4).judge(rec).fragments == ()
    assert isinstance(FinishTakeOver(7, 4).judge(rec.with_(state=LedgerState.OPEN)), Done)  # our lost answer
    newer = rec.with_(term=5)
    assert FinishTakeOver(7, 4).judge(newer).kind == lc.FENCED
    assert FinishTakeOver(7, 4).judge(newer.with_(state=LedgerState.OPEN)).kind == lc.FENCED
    bad = FinishTakeOver(7, 4, mutations=M.Mutations.of(M.FINISH_DESPITE_NEWER_TERM)).judge(newer)
    assert isinstance(bad, Apply) and bad.header.term == 4  # the term goes down: the simulator's Monotonic


def test_classic_recovery_begins_and_closes():
    m = meta([(0, ABC)])
    assert BeginRecovery(7).judge(m).header.state is LedgerState.IN_RECOVERY
    rec = m.with_(state=LedgerState.IN_RECOVERY)
    assert isinstance(BeginRecovery(7).judge(rec), Done)                  # recover anyway
    assert BeginRecovery(7).judge(m.with_(state=LedgerState.CLOSED, last_entry=3)).kind == lc.ALREADY_CLOSED
    v = CloseRecovered(7, 9, Fragment(5, ("a", "b", "x"))).judge(rec)
    assert isinstance(v, Apply) and (v.header.state, v.header.last_entry) == (LedgerState.CLOSED, 9)
    assert v.fragments == (Fragment(5, ("a", "b", "x")),)
    # a lost CAS: another recoverer closed it, maybe elsewhere: adopt its last entry
    assert isinstance(CloseRecovered(7, 9).judge(m.with_(state=LedgerState.CLOSED, last_entry=8)), Done)
    assert CloseRecovered(7, 9).judge(m).kind == lc.CHANGED


def test_ensemble_change_lost_cas_retries_only_while_the_writers():
    m = meta([(0, ABC)], mode=U).with_(term=2)
    frag = Fragment(10, ("a", "b", "x"))
    v = ChangeEnsemble(7, 2, frag).judge(m)
    assert isinstance(v, Apply) and v.fragments == (frag,) and v.header == m
    # after a lost CAS: still OPEN at our term (a trim, a re-replication moved the header): retry
    assert isinstance(judge_lost_cas(ChangeEnsemble(7, 2, frag), m.with_(trimmed_before=5)), Apply)
    # our CAS went through but its answer was lost
    done = m.with_(fragments=(Fragment(0, ABC), frag), fragment_count=2, last_fragment_first_entry=10)
    assert isinstance(judge_lost_cas(ChangeEnsemble(7, 2, frag), done), Done)
    # a recovery, a newer term, a close: fenced
    for other in (m.with_(state=LedgerState.IN_RECOVERY, term=3), m.with_(term=3),
                  m.with_(state=LedgerState.CLOSED, last_entry=9)):
        assert judge_lost_cas(ChangeEnsemble(7, 2, frag), other).kind == lc.FENCED
    assert writer_verdict(None, 7, 2).kind == lc.GONE
    mutant = ChangeEnsemble(7, 2, frag, M.Mutations.of(M.CHANGE_DESPITE_FENCE))
    assert isinstance(mutant.judge(m.with_(state=LedgerState.IN_RECOVERY, term=3)), Apply)


def test_close_mutant_closes_over_a_recovery():
    rec = meta([(0, ABC)], state=LedgerState.IN_RECOVERY)
    assert CloseAt(7, 4).judge(rec).kind == lc.FENCED
    assert isinstance(CloseAt(7, 4, M.Mutations.of(M.CLOSE_DESPITE_RECOVERY)).judge(rec), Apply)


def test_runner_starts_from_known_metadata_without_a_read():
    m = meta([(0, ABC)])
    cell = FakeEtcd(m)
    reads = []

    async def read():
        reads.append(1)
        return await cell.read()

    r = asyncio.run(run_cas(CloseAt(7, 4), read, cell.write, sleep=_nosleep, known=(m, cell.rev)))
    assert r.applied and reads == [] and cell.m.state is LedgerState.CLOSED


def test_prepare_answers_a_newer_term_wins_then_a_failure():
    from stream.lifecycle import PREPARE_FAILED, PREPARED, prepare_answer, prepare_verdict

    assert prepare_answer(True, None) == PREPARED and prepare_answer(False, None) == PREPARE_FAILED
    assert prepare_answer(False, 5) == 5 and prepare_answer(False, 0) == 1  # INVALID_TERM: fenced
    assert prepare_verdict([]) == PREPARED
    assert prepare_verdict([PREPARED, PREPARE_FAILED]) == PREPARE_FAILED
    assert prepare_verdict([PREPARE_FAILED, 4, 3]) == 4
