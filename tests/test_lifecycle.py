"""The ledger life-cycle core (stream/lifecycle.py): verdicts, and the CAS
runner over the production metadata I/O on a real etcd."""
from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from stream.client import BookKeeperClient
from stream.lifecycle import (Apply, Backoff, CasUnknown, CloseAt, Done, Moot, ReplaceBookie, Wait, fragment_end,
                              is_sealed, judge_lost_cas, ledger_store_io, read_known, run_cas)


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


# -- the CAS runner on a real etcd ----------------------------------------------------------
# run_cas runs over the production read/write (``ledger_store_io``: a
# BookKeeperClient's LedgerStore) on a real etcd.  The faults are real
# writes or a real absence: another writer's CAS between our read and our
# CAS (a lost CAS), a write that went through whose answer is then dropped
# (CasUnknown raised after the real write), an etcd that is not there.


async def _nosleep(_):
    return None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _ledger(bk, first_of_open=10) -> int:
    """A ledger on ABC in etcd: with ``first_of_open``, fragment 0 sealed by
    an open fragment from there, else fragment 0 alone (open)."""
    m, rev = await bk.meta_call(bk.ledgers.create, LedgerMetadata(3, 3, 2), ABC)
    if first_of_open is not None:
        await bk.meta_call(bk.ledgers.add_fragment, m.ledger_id, Fragment(first_of_open, ABC), m, rev)
    return m.ledger_id


async def _writes_of_fragment0(bk, lid) -> int:
    """How many times fragment 0's key was written (etcd's version count)."""
    v = await bk.meta_call(bk.store.get, bk.ledgers.layout.fragment_key(lid, 0))
    return v.version


def test_runner_retries_a_cas_lost_to_another_writer(etcd_server, cluster):
    async def go():
        async with BookKeeperClient(etcd_server.endpoint, cluster) as bk, \
                BookKeeperClient(etcd_server.endpoint, cluster) as other:
            lid = await _ledger(bk)
            read, write = ledger_store_io(bk, lid)
            bumped, writes = [], []

            async def read_then_another_writer():
                m, rev = await read()
                if not bumped:  # another process's CAS lands between our read and our CAS
                    bumped.append(await other.meta_call(other.ledgers.update_header,
                                                        m.with_(custom={"bump": "1"}), rev))
                return m, rev

            async def counted_write(apply, rev):
                writes.append(rev)
                return await write(apply, rev)

            r = await run_cas(ReplaceBookie(lid, 0, "b", "x", ABC), read_then_another_writer, counted_write,
                              sleep=_nosleep)
            assert isinstance(r.verdict, Apply) and r.attempts == 2
            assert writes[1] == bumped[0] != writes[0]  # lost at the old revision, applied at the bumped one
            m, rev = await read()
            assert m.fragments[0].ensemble == ("a", "x", "c") and m.custom == {"bump": "1"} and rev == r.revision
            assert await _writes_of_fragment0(bk, lid) == 2  # created, replaced once

    asyncio.run(go())


def test_runner_adopts_a_write_whose_answer_was_lost(etcd_server, cluster):
    async def go():
        async with BookKeeperClient(etcd_server.endpoint, cluster) as bk:
            lid = await _ledger(bk)
            read, write = ledger_store_io(bk, lid)
            writes = []

            async def answer_lost(apply, rev):
                writes.append(rev)
                await write(apply, rev)  # etcd applies it ...
                raise CasUnknown("timeout after the write")  # ... and its answer never arrives

            r = await run_cas(ReplaceBookie(lid, 0, "b", "x", ABC), read, answer_lost, sleep=_nosleep)
            # adopted on the re-read, not written twice
            assert isinstance(r.verdict, Done) and r.applied and len(writes) == 1 and r.attempts == 2
            assert (await read())[0].fragments[0].ensemble == ("a", "x", "c")
            assert await _writes_of_fragment0(bk, lid) == 2

    asyncio.run(go())


@contextlib.asynccontextmanager
async def _here_and_away(etcd_server, cluster):
    """(a client, a ledger of it, ``ledger_store_io`` of the ledger over the
    real etcd, and over an etcd that is not there: a closed port)."""
    async with BookKeeperClient(etcd_server.endpoint, cluster) as bk, \
            BookKeeperClient(f"127.0.0.1:{_closed_port()}", cluster, metadata_timeout=1.0) as gone:
        lid = await _ledger(bk)
        yield bk, lid, ledger_store_io(bk, lid), ledger_store_io(gone, lid)


def test_runner_gives_up_after_the_backoff_attempts(etcd_server, cluster):
    """The CAS goes to an etcd that is not there (a closed port): every
    write's outcome is unknown; after the attempts, Wait, nothing written."""
    async def go():
        async with _here_and_away(etcd_server, cluster) as (bk, lid, (read, _), (_, write)):
            before = await read()
            slept = []

            async def sleep(d):
                slept.append(d)

            r = await run_cas(ReplaceBookie(lid, 0, "b", "x", ABC), read, write,
                              Backoff(base=0.1, factor=2, cap=0.5, attempts=4), sleep=sleep)
            assert isinstance(r.verdict, Wait) and not r.applied
            assert slept == [0.1, 0.2, 0.4, 0.5]
            assert await read() == before and await _writes_of_fragment0(bk, lid) == 1

    asyncio.run(go())


def test_a_read_waits_out_an_etcd_away_then_gives_up(etcd_server, cluster):
    """``read_known``: the first two reads go to an etcd that is not there
    (a closed port), the third to the real one: the metadata, after two
    back-offs.  Away for every attempt: CasUnknown, raised."""
    async def go():
        async with _here_and_away(etcd_server, cluster) as (bk, lid, (here, _), (away, _)):
            calls, slept = [], []

            async def read():
                calls.append(1)
                return await (away() if len(calls) <= 2 else here())

            async def sleep(d):
                slept.append(d)

            meta, _rev = await read_known(read, Backoff(base=0.1, factor=2, cap=0.5, attempts=4), sleep=sleep)
            assert meta.ledger_id == lid and len(calls) == 3 and slept == [0.1, 0.2]
            with pytest.raises(CasUnknown):
                await read_known(away, Backoff(base=0.1, factor=2, cap=0.5, attempts=3), sleep=sleep)
            assert slept[2:] == [0.1, 0.2]

    asyncio.run(go())


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


def test_runner_starts_from_known_metadata_without_a_read(etcd_server, cluster):
    async def go():
        async with BookKeeperClient(etcd_server.endpoint, cluster) as bk:
            lid = await _ledger(bk, first_of_open=None)
            read, write = ledger_store_io(bk, lid)
            known = await read()
            reads = []

            async def counted_read():
                reads.append(1)
                return await read()

            r = await run_cas(CloseAt(lid, 4), counted_read, write, sleep=_nosleep, known=known)
            assert r.applied and reads == []
            m, rev = await read()
            assert (m.state, m.last_entry) == (LedgerState.CLOSED, 4) and rev == r.revision > known[1]

    asyncio.run(go())


def test_prepare_answers_a_newer_term_wins_then_a_failure():
    from stream.lifecycle import PREPARE_FAILED, PREPARED, prepare_answer, prepare_verdict

    assert prepare_answer(True, None) == PREPARED and prepare_answer(False, None) == PREPARE_FAILED
    assert prepare_answer(False, 5) == 5 and prepare_answer(False, 0) == 1  # INVALID_TERM: fenced
    assert prepare_verdict([]) == PREPARED
    assert prepare_verdict([PREPARED, PREPARE_FAILED]) == PREPARE_FAILED
    assert prepare_verdict([PREPARE_FAILED, 4, 3]) == 4
