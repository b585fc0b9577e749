"""The bookie core's fence barrier, pending adds, read-only transitions and
replay decoding, executed by the real Storage (a journal on disk, fsync on
its flusher thread); and a core mutant (a term-carrying read that does not
wait for pending normal adds) that the barrier test catches."""
from __future__ import annotations

import asyncio
import threading

import pytest

from bookie import core as bc
from bookie import entry as E
from bookie.core import Barrier, BookieCore, Status
from bookie.journal_record import R_ENTRIES, R_STATE
from bookie.storage import Storage


def _add(storage: Storage, lid: int, eid: int, term: int, *, recovery: bool = False):
    rec = E.encode(lid, eid, b"x%d" % eid, term=term, req_flags=E.REQ_RECOVERY if recovery else 0)
    status, msg, runs = storage.validate_frame(rec)
    assert status is Status.OK, msg
    refused, durable = storage.admit_frame(rec, runs)
    assert not refused
    return durable


async def _recovery_read_after_a_pending_add(tmp_path) -> Status:
    """A writer's add at term 2 is admitted (not yet durable); a recovery
    read at the same term (the state unchanged: no journal record of its
    own) reads that entry.  Returns the read's answer."""
    s = Storage(tmp_path / "b")
    s.open()
    try:
        await _add(s, 9, 0, 2)                       # the ledger exists at term 2
        pending = _add(s, 9, 1, 2)                   # admitted, its fsync under way
        assert s.core.pending == {9: 1}
        v = await s.fence(9, 2, False)               # a recovery read at the same term
        assert v.status is Status.OK and not v.state_changed
        status, _ = s.read_record(9, 1)
        await pending
        assert s.core.pending == {}
        return status
    finally:
        s.close()


def test_a_term_carrying_read_waits_for_pending_normal_adds(tmp_path):
    # NO_SUCH_ENTRY here would let a recoverer truncate an entry the old
    # writer is about to see acknowledged.
    assert asyncio.run(_recovery_read_after_a_pending_add(tmp_path)) is Status.OK


def test_the_barrier_test_catches_a_core_that_does_not_wait(tmp_path, monkeypatch):
    correct = bc.BookieCore.fence_read

    def hasty(self, lid, term, fence, verifier=b""):
        v, barrier = correct(self, lid, term, fence, verifier)
        return v, Barrier.NONE if barrier is Barrier.SYNC else barrier

    monkeypatch.setattr(bc.BookieCore, "fence_read", hasty)
    assert asyncio.run(_recovery_read_after_a_pending_add(tmp_path)) is Status.NO_SUCH_ENTRY


def _journalled(core: BookieCore, lid: int) -> None:
    """What Storage does once a JOURNAL_STATE record is durable."""
    core.replay(R_STATE, core.state_body(lid), 0)


def test_the_barrier_is_decided_by_the_core():
    core = BookieCore()
    assert core.fence_read(1, 3, False)[1] is Barrier.JOURNAL_STATE   # created: journalled
    assert core.fence_read(1, 3, False)[1] is Barrier.SYNC            # ... not durable yet
    _journalled(core, 1)
    assert core.fence_read(1, 3, False)[1] is Barrier.NONE            # unchanged, nothing pending
    h = E.scan_runs(E.encode(1, 0, b"a", term=3))
    counts = core.adds_pending(h)
    assert core.fence_read(1, 3, False)[1] is Barrier.SYNC
    assert core.fence_read(1, 3, True)[1] is Barrier.JOURNAL_STATE    # the fence changes the state
    core.adds_settled(counts)
    assert core.fence_read(1, 3, True)[1] is Barrier.SYNC             # the fence not durable yet
    _journalled(core, 1)
    assert core.fence_read(1, 3, True)[1] is Barrier.NONE
    core.adds_pending(E.scan_runs(E.encode(1, 1, b"b", term=3, req_flags=E.REQ_RECOVERY)))
    assert core.pending == {} and core.fence_read(1, 3, True)[1] is Barrier.NONE  # own write-backs: no wait
    v, barrier = core.fence_read(1, 2, False)
    assert v.status is Status.INVALID_TERM and barrier is Barrier.NONE


def test_a_recovery_add_that_raised_the_term_holds_reads_until_durable():
    core = BookieCore()
    rec = E.encode(1, 0, b"a", term=4, req_flags=E.REQ_RECOVERY)
    assert core.admit_add(E.parse_header(rec)).state_changed      # a new ledger, at term 4
    core.adds_pending(E.scan_runs(rec))
    assert core.pending == {}                                      # (not a normal add)
    assert core.fence_read(1, 4, False)[1] is Barrier.SYNC         # term 4 not durable yet
    core.replay(R_ENTRIES, rec, 0)                                 # the add durable
    assert core.fence_read(1, 4, False)[1] is Barrier.NONE


async def _second_read_behind_a_term_raise(tmp_path) -> tuple[bool, Status]:
    """An older recoverer's truncate no-op at entry 1 (term 2) is admitted on
    a bookie holding term 1's entries 1 and 2; its journal write is held.  A
    newer recoverer's first read raises the term to 3 (its state record
    queued behind the no-op), and its second read, of entry 2, arrives at
    term 3: the state unchanged in memory.  Returns whether that read had
    answered while the write was held, and what entry 2 reads as once it
    answers."""
    s = Storage(tmp_path / "b")
    s.open()
    gate = threading.Event()
    write_batch = s.journal._write_batch

    def held(batch):
        gate.wait(10)
        return write_batch(batch)
    try:
        await _add(s, 9, 1, 1)
        await _add(s, 9, 2, 1)
        s.journal._write_batch = held
        noop = E.encode(9, 1, b"", term=2, req_flags=E.REQ_RECOVERY, data_flags=E.FLAG_NOOP | E.FLAG_TRUNCATE)
        status, msg, runs = s.validate_frame(noop)
        assert status is Status.OK, msg
        refused, durable = s.admit_frame(noop, runs)
        assert not refused
        first = asyncio.ensure_future(s.fence(9, 3, False))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not first.done()                                    # its state record is held too
        second = asyncio.ensure_future(s.fence(9, 3, False))
        for _ in range(5):
            await asyncio.sleep(0)
        answered_early = second.done()
        entry_2 = s.read_record(9, 2)[0] if answered_early else None
        gate.set()
        await asyncio.gather(first, second, durable)
        assert second.result().status is Status.OK
        return answered_early, entry_2 if answered_early else s.read_record(9, 2)[0]
    finally:
        gate.set()
        s.close()


def test_a_read_at_an_unchanged_term_waits_for_the_term_to_be_durable(tmp_path):
    # Answering at once, the read would see term 1's entry 2, which the
    # no-op admitted before the term raise deletes: no behaviour of the spec
    # has that read (term 3) before the no-op's store (term 2).
    answered_early, entry_2 = asyncio.run(_second_read_behind_a_term_raise(tmp_path))
    assert not answered_early and entry_2 is Status.NO_SUCH_ENTRY


def test_the_durable_state_test_catches_a_core_that_does_not_wait(tmp_path, monkeypatch):
    correct = bc.BookieCore.fence_read

    def normal_adds_only(self, lid, term, fence, verifier=b""):
        v, barrier = correct(self, lid, term, fence, verifier)
        if barrier is Barrier.SYNC and lid not in self.pending:
            barrier = Barrier.NONE
        return v, barrier

    monkeypatch.setattr(bc.BookieCore, "fence_read", normal_adds_only)
    answered_early, entry_2 = asyncio.run(_second_read_behind_a_term_raise(tmp_path))
    assert answered_early and entry_2 is Status.OK      # term 1's entry, about to be truncated


def test_read_only_transitions_have_a_margin():
    core = BookieCore()
    assert not core.judge_disk(0.90, 0.95, 0.05) and not core.read_only
    assert core.judge_disk(0.95, 0.95, 0.05) and core.read_only
    assert not core.judge_disk(0.91, 0.95, 0.05) and core.read_only     # inside the margin: stays
    assert core.judge_disk(0.89, 0.95, 0.05) and not core.read_only


def test_a_halted_bookie_stays_read_only_whatever_its_disk():
    """``halt`` (its etcd gone back in time, bookie/cookie.py): read-only
    for good, prepares refused too; the disk's margin no longer frees it."""
    core = BookieCore()
    assert core.halt("etcd went back") and core.read_only and not core.halt("again")
    assert core.halted == "etcd went back"
    assert not core.judge_disk(0.10, 0.95, 0.05) and core.read_only
    assert core.prepare(7, 0, 1).status is Status.READ_ONLY
    fresh = BookieCore()
    assert fresh.prepare(7, 0, 1).status is Status.OK


def test_a_rejoined_bookie_takes_no_normal_add_nor_prepare_below_its_rejoin():
    """A lost disk's rejoin (bookie/cookie.py) at revision 100: a zombie
    writer's normal add for ledger 40 is refused, known ledger or not (its
    fence here was lost with the disk), and so is a stream writer's prepare
    (it chooses another bookie); a copy's recovery add, a fencing read and
    every request for a ledger created after it go as on any bookie."""
    def add(core, lid, recovery=False, term=0):
        return core.admit_add(E.parse_header(E.encode(lid, 0, b"x", term=term,
                                                      req_flags=E.REQ_RECOVERY if recovery else 0), 0))
    core = BookieCore()
    core.rejoined_at = 100
    assert add(core, 40).status is Status.READ_ONLY and 40 not in core.ledgers
    assert core.prepare(40, 5, 3).status is Status.READ_ONLY and 40 not in core.ledgers
    assert add(core, 40, recovery=True, term=3).status is Status.OK          # autorecovery's copy onto it
    assert add(core, 40, term=3).status is Status.READ_ONLY                  # known now: still none
    assert core.fence(41, 2, True).status is Status.OK and add(core, 41, term=2).status is Status.FENCED
    assert add(core, 100).status is Status.OK and add(core, 101).status is Status.OK
    assert core.prepare(102, 0, 1).status is Status.OK
    core.rejoined_at = 0                                                      # (a bookie that never rejoined)
    assert add(core, 40, term=3).status is Status.OK


@pytest.mark.parametrize("checkpoint", [False, True])
def test_storage_replay_rebuilds_what_the_live_core_held(tmp_path, checkpoint):
    async def go():
        s = Storage(tmp_path / "b")
        s.open()
        for e in range(6):
            await _add(s, 4, e, 1)
        assert (await s.write_lac(4, 3, 2, 1)).status is Status.OK
        await s.fence(4, 2, True)
        assert (await s.write_lac(4, 4, 2, 2)).status is Status.FENCED
        await _add(s, 4, 3, 2, recovery=True)
        assert (await s.delete(4, (5, 5)))[0] is Status.OK
        assert (await s.delete(99, None)) == (Status.NO_SUCH_LEDGER, 0)
        if checkpoint:
            await s.checkpoint()
        live = (s.core.lac_info(4), sorted(s.core.ledgers[4].index.iter_all()))
        s.close()
        return live

    live = asyncio.run(go())
    s = Storage(tmp_path / "b")
    s.open()
    try:
        assert (s.core.lac_info(4), sorted(s.core.ledgers[4].index.iter_all())) == live
        assert live[0].fenced and live[0].term == 2 and live[0].lac == 3
    finally:
        s.close()


def test_a_copy_clearing_below_the_ledger_copy_token_is_fenced():
    """The copy fence (bookie/core.py ``admit_clear``), on the pure core:
    tokens at or above the ledger's are admitted and raise it; below it,
    FENCED and nothing changes; an unknown ledger's state is created to hold
    the token; another key is refused before anything else."""
    core = BookieCore()
    v = core.admit_clear(5, 10, b"k" * 32)
    assert v.status is Status.OK and v.key_learned and core.ledgers[5].copy_token == 10
    assert core.admit_clear(5, 10, b"k" * 32).status is Status.OK           # the same holder, again
    assert core.admit_clear(5, 9, b"k" * 32).status is Status.FENCED
    assert core.admit_clear(5, 3, b"x" * 32).status is Status.UNAUTHORIZED_ACCESS
    assert core.ledgers[5].copy_token == 10
    assert core.admit_clear(5, 12, b"k" * 32).status is Status.OK and core.ledgers[5].copy_token == 12
    assert core.admit_clear(5, 10, b"k" * 32).status is Status.FENCED      # raised at admission
    assert core.admit_clear(6, 1).status is Status.OK and not core.admit_clear(6, 1).key_learned


@pytest.mark.parametrize("checkpoint", [False, True])
def test_the_copy_token_survives_a_restart(tmp_path, checkpoint):
    """A clearing's token is journalled with it (R_CLEAR) and kept in a
    checkpoint: after a restart a copy under an older lock is still
    refused, and the range it cleared stays cleared."""
    async def go():
        s = Storage(tmp_path / "b")
        s.open()
        for e in range(6):
            await _add(s, 4, e, 1)
        assert await s.clear(4, 2, 3, 20) == (Status.OK, 2)
        assert await s.clear(7, 0, 9, 21) == (Status.OK, 0)     # unknown: created to hold it
        assert await s.clear(4, 0, 5, 19) == (Status.FENCED, 0)
        if checkpoint:
            await s.checkpoint()
        s.close()

    asyncio.run(go())

    async def after():
        s = Storage(tmp_path / "b")
        s.open()
        try:
            assert sorted(e for e, _, _ in s.core.ledgers[4].index.iter_all()) == [0, 1, 4, 5]
            assert (s.core.ledgers[4].copy_token, s.core.ledgers[7].copy_token) == (20, 21)
            assert await s.clear(4, 0, 5, 19) == (Status.FENCED, 0)
            assert await s.clear(7, 0, 9, 20) == (Status.FENCED, 0)
        finally:
            s.close()

    asyncio.run(after())


def test_the_over_replicated_clearing_refuses_a_ledger_touched_since_its_read(tmp_path):
    """``Storage.clear_over_replicated`` (bookie/ledger_gc.py's step on the
    bookie): given the ledger's count of admitted requests as it stood
    before the collector read the metadata, any request admitted since (an
    add, a prepare, a fencing read, a copy's clearing) leaves the ledger
    alone; not asked (None: ranges below the open end), it clears anyway; a
    token below the ledger's copy token is refused too.  Otherwise the
    ranges go and the state stays (term, fence, token), through a restart:
    a writer fenced here is still refused."""
    END = (1 << 63) - 1

    def held(s):
        return sorted(e for e, _, _ in s.core.ledgers[4].index.iter_all())

    async def go():
        s = Storage(tmp_path / "b")
        s.open()
        for e in range(8):
            await _add(s, 4, e, 3)
        assert (await s.fence(4, 3, True)).status is Status.OK       # a recovery fenced it here
        for touch in (lambda: _add(s, 4, 8, 3, recovery=True),        # a recovery add
                      lambda: s.fence(4, 3, False),                   # a term-carrying read
                      lambda: s.prepare(4, 20, 3),                    # a bookie joining a fragment
                      lambda: s.clear(4, 20, 20, 5)):                 # a copy's clearing
            seen = s.core.touched_of(4)
            await touch()
            assert await s.clear_over_replicated(4, 7, seen, [(0, 1), (6, END)]) is None
            assert held(s) == list(range(9))
        assert await s.clear_over_replicated(4, 7, seen, [(0, 1)]) is None   # still touched since
        assert await s.clear_over_replicated(4, 7, None, [(0, 1)]) == 2      # not asked
        seen = s.core.touched_of(4)
        assert await s.clear_over_replicated(4, 4, seen, [(6, END)]) is None  # a later copy's token is here
        assert await s.clear_over_replicated(4, 8, seen, [(3, 3), (6, END)]) == 4
        assert held(s) == [2, 4, 5]
        st = s.core.ledgers[4]
        assert (st.term, st.fenced, st.copy_token) == (3, True, 8)
        assert await s.clear(4, 0, 9, 7) == (Status.FENCED, 0)        # an older copier's clearing
        assert await s.clear_over_replicated(5, 9, 0, [(0, END)]) is None   # unknown ledger
        s.close()
        s = Storage(tmp_path / "b")
        s.open()
        try:
            st = s.core.ledgers[4]
            assert (held(s), st.term, st.fenced, st.copy_token) == ([2, 4, 5], 3, True, 8)
            for term, why in ((2, Status.INVALID_TERM), (3, Status.FENCED)):   # an old writer, back
                rec = E.encode(4, 9, b"late", term=term)
                _status, _msg, runs = s.validate_frame(rec)
                refused, durable = s.admit_frame(rec, runs)
                assert [v.status for _, v in refused] == [why] and durable is None
        finally:
            s.close()

    asyncio.run(go())
