"""The bookie core's fence barrier, pending adds, read-only transitions and
replay decoding, executed by the real Storage (a journal on disk, fsync on
its flusher thread); and a core mutant (a term-carrying read that does not
wait for pending normal adds) that the barrier test catches."""
from __future__ import annotations

import asyncio

import pytest

from bookie import core as bc
from bookie import entry as E
from bookie.core import Barrier, BookieCore, Status
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


def test_the_barrier_is_decided_by_the_core():
    core = BookieCore()
    assert core.fence_read(1, 3, False)[1] is Barrier.JOURNAL_STATE   # created: journalled
    assert core.fence_read(1, 3, False)[1] is Barrier.NONE            # unchanged, nothing pending
    h = E.scan_runs(E.encode(1, 0, b"a", term=3))
    counts = core.adds_pending(h)
    assert core.fence_read(1, 3, False)[1] is Barrier.SYNC
    assert core.fence_read(1, 3, True)[1] is Barrier.JOURNAL_STATE    # the fence changes the state
    core.adds_settled(counts)
    assert core.fence_read(1, 3, True)[1] is Barrier.NONE
    core.adds_pending(E.scan_runs(E.encode(1, 1, b"b", term=3, req_flags=E.REQ_RECOVERY)))
    assert core.pending == {} and core.fence_read(1, 3, True)[1] is Barrier.NONE  # recovery adds: no wait
    v, barrier = core.fence_read(1, 2, False)
    assert v.status is Status.INVALID_TERM and barrier is Barrier.NONE


def test_read_only_transitions_have_a_margin():
    core = BookieCore()
    assert not core.judge_disk(0.90, 0.95, 0.05) and not core.read_only
    assert core.judge_disk(0.95, 0.95, 0.05) and core.read_only
    assert not core.judge_disk(0.91, 0.95, 0.05) and core.read_only     # inside the margin: stays
    assert core.judge_disk(0.89, 0.95, 0.05) and not core.read_only


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
