"""The journal in-process: preallocated segments, clean ends, torn tails."""
from __future__ import annotations

import asyncio
import logging
import os

import pytest

from bookie import entry as E
from bookie.journal import PREPARED_SUFFIX, Journal
from bookie.journal_record import R_ENTRIES, R_STATE, STATE_BODY, JournalPosition, frame_record

SEG = 64 << 10


def _entries(ledger: int, first: int, n: int) -> bytes:
    return b"".join(E.encode_run(ledger, first, [bytes([first % 251]) * 900] * n, lac=-1, lafr=-1, term=0))


def _open(path, preallocate: bool = True, **kw) -> tuple[Journal, list]:
    j = Journal(path, segment_size=SEG, preallocate=preallocate, **kw)
    records = [(r.rtype, bytes(r.body)) for r in j.scan(JournalPosition(1, 0))]
    end = j.scan_end if j.segments() else JournalPosition(1, 0)
    j.open_for_append(end)
    return j, records


def _write(j: Journal, bodies: list[tuple[int, bytes]], *, wait_prepared: bool) -> None:
    async def go():
        for rtype, body in bodies:
            if wait_prepared and j.end.offset + len(body) + 12 > SEG:
                j.wait_prepared(30)  # the roll below takes the prepared file
            j.append(rtype, body)
            await j.sync()
    asyncio.run(go())


def test_rolled_segments_are_preallocated_and_replay_to_a_clean_end(tmp_path, caplog):
    j, _ = _open(tmp_path)
    bodies = [(R_ENTRIES, _entries(1, 10 * i, 10)) for i in range(20)] + [(R_STATE, STATE_BODY.pack(1, 3, 0))]
    _write(j, bodies, wait_prepared=True)
    assert j.preallocated_segments >= 2 and len(j.segments()) >= 3
    sealed = j.segments()[:-1]
    j.close()
    # every rolled-to segment was a prepared one: full size, zeros after its records
    assert all(j.path(s).stat().st_size == SEG for s in sealed[1:])
    with caplog.at_level(logging.WARNING, logger="bookie.journal"):
        j2, records = _open(tmp_path)
    assert records == bodies
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # zeros are no torn tail
    # and the journal goes on after a clean end inside a prepared segment
    more = [(R_ENTRIES, _entries(2, 0, 5))]
    _write(j2, more, wait_prepared=False)
    j2.close()
    j3, records = _open(tmp_path)
    j3.close()
    assert records == bodies + more


def test_a_torn_record_in_a_prepared_segment_is_cut_off_and_never_replayed(tmp_path, caplog):
    j, _ = _open(tmp_path)
    bodies = [(R_ENTRIES, _entries(1, 10 * i, 10)) for i in range(9)]
    _write(j, bodies, wait_prepared=True)
    end = j.end
    assert j.preallocated_segments >= 1 and end.segment > 1
    j.close()
    # a crash in the middle of a write: a record whose body was half written
    torn_body = _entries(1, 90, 10)
    torn = frame_record(R_ENTRIES, torn_body) + torn_body[: len(torn_body) // 2]
    fd = os.open(j.path(end.segment), os.O_WRONLY)
    os.pwrite(fd, torn, end.offset)
    os.close(fd)
    with caplog.at_level(logging.WARNING, logger="bookie.journal"):
        j2, records = _open(tmp_path)
    assert records == bodies
    assert any("torn tail" in r.getMessage() for r in caplog.records)
    # a shorter record written where the torn one began: the torn bytes
    # behind it must not come back as records
    after = [(R_STATE, STATE_BODY.pack(1, 4, 1))]
    _write(j2, after, wait_prepared=False)
    j2.close()
    j3, records = _open(tmp_path)
    j3.close()
    assert records == bodies + after


def test_without_preallocation_segments_grow_by_appending(tmp_path):
    j, _ = _open(tmp_path, preallocate=False)
    bodies = [(R_ENTRIES, _entries(1, 10 * i, 10)) for i in range(9)]
    _write(j, bodies, wait_prepared=False)
    assert j.preallocated_segments == 0 and not list(tmp_path.glob("*" + PREPARED_SUFFIX))
    sizes = [j.path(s).stat().st_size for s in j.segments()]
    j.close()
    assert sum(sizes) == j.bytes_appended
    j2, records = _open(tmp_path, preallocate=False)
    j2.close()
    assert records == bodies


def test_a_stale_prepared_file_is_removed_on_open(tmp_path):
    (tmp_path / ("segment-0000000007.log" + PREPARED_SUFFIX)).write_bytes(bytes(SEG))
    j = Journal(tmp_path, segment_size=SEG, preallocate=False)
    j.close()
    assert not list(tmp_path.glob("*" + PREPARED_SUFFIX))


def test_group_commits_are_counted_by_duration(tmp_path):
    from bookie.journal import SYNC_BUCKET_BOUNDS_US, sync_bucket, sync_quantile

    # bucket i: under 64 << i us and at least the bound before
    assert [sync_bucket(s) for s in (0.0, 63e-6, 64e-6, 127e-6, 128e-6, 1.5e-3, 1.048575, 1.048576, 30.0)] == [
        0, 0, 1, 1, 2, 5, 14, 15, 15]
    assert all(sync_bucket(b / 1e6 - 1e-9) == i for i, b in enumerate(SYNC_BUCKET_BOUNDS_US))
    hist = [0] * 16
    hist[1], hist[3], hist[15] = 98, 1, 1
    assert sync_quantile(hist, 0.5) == 0.128 and sync_quantile(hist, 0.99) == 0.512
    assert sync_quantile(hist, 1.0) == float("inf") and sync_quantile([0] * 16, 0.5) is None

    j, _ = _open(tmp_path, preallocate=False)
    _write(j, [(R_ENTRIES, _entries(1, 10 * i, 10)) for i in range(12)], wait_prepared=False)
    assert j.fsyncs >= 12 and sum(j.sync_histogram) == j.fsyncs
    assert 0 < j.sync_max_seconds and sync_bucket(j.sync_max_seconds) == max(
        i for i, n in enumerate(j.sync_histogram) if n)
    j.close()


def _bad_last_record(path, seg: int) -> None:
    """Flips the last byte of a segment's last entry record (past every mark
    but a closing one, which the caller removes or keeps)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _refused_under_mark(directory, path, at: int, mark: int) -> None:
    """A byte at ``at`` of the segment flipped: its scan refuses it (the mark
    at ``mark`` says it was durable), and nothing is cut."""
    from bookie.journal import JournalDamaged

    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    j = Journal(directory, segment_size=SEG)
    try:
        with pytest.raises(JournalDamaged, match=f"a mark at {mark} says"):
            list(j.scan(JournalPosition(1, 0)))
    finally:
        j.close()
    assert path.read_bytes() == bytes(data)


def test_marks_tell_a_record_rotted_in_place_from_a_torn_tail(tmp_path, caplog):
    """Each commit to a segment holding records begins with a mark of its
    own offset, and a close ends the journal with one: a bad record with a
    mark after it is refused (acknowledged records follow it); the last
    commit before a crash has none after it, and is cut as a torn tail."""
    from bookie.journal_record import MARK_BODY, MARK_SIZE, R_MARK

    bodies = [(R_ENTRIES, _entries(1, 10 * i, 10)) for i in range(4)]
    j, _ = _open(tmp_path, preallocate=False, mark_idle_s=3600)   # (no idle marks between the commits)
    _write(j, bodies, wait_prepared=False)
    j.close()
    assert j.marks == 4   # before commits 2, 3 and 4, and the close's
    path = j.path(1)
    data = path.read_bytes()
    end = len(data) - MARK_SIZE
    assert frame_record(R_MARK, MARK_BODY.pack(1, end)) + MARK_BODY.pack(1, end) == data[end:]
    j2, records = _open(tmp_path, preallocate=False)   # (the marks are the journal's own: never yielded)
    j2.close()
    assert records == bodies and j2.marks == 0   # (the reopen's close found the journal marked)

    crashed = data[:end]                         # as a crash leaves it: no closing mark
    path.write_bytes(crashed)
    j3, records = _open(tmp_path, preallocate=False)
    j3.close()
    assert records == bodies and j3.marks == 1 and path.read_bytes() == data   # the reopen marked what it kept
    path.write_bytes(crashed)
    _bad_last_record(path, 1)
    with caplog.at_level(logging.WARNING, logger="bookie.journal"):
        j3, records = _open(tmp_path, preallocate=False)
    j3.close()
    assert records == bodies[:3] and any("torn tail" in r.getMessage() for r in caplog.records)

    path.write_bytes(data)                       # closed cleanly: the last record is under a mark
    _refused_under_mark(tmp_path, path, end - 1, end)


def test_an_idle_journal_marks_its_last_commit(tmp_path):
    """A commit not followed by another for ``mark_idle_s`` gets a mark of
    its own (one fdatasync more), so a crash long after it still tells its
    rot from a torn tail; a journal already ending in a mark writes none."""
    from bookie.journal_record import MARK_SIZE

    j = Journal(tmp_path, segment_size=SEG, mark_idle_s=0.05)
    list(j.scan(JournalPosition(1, 0)))
    j.open_for_append(JournalPosition(1, 0))

    async def go():
        j.append(R_ENTRIES, _entries(1, 0, 10))
        await j.sync()
        assert j.marks == 0            # (the first record of a segment has nothing before it to mark)
        j.append(R_ENTRIES, _entries(1, 10, 10))
        await j.sync()
        assert j.marks == 1
        fsyncs = j.fsyncs
        deadline = asyncio.get_running_loop().time() + 30
        while j.marks == 1 or j.fsyncs == fsyncs:    # (the idle mark's commit, awaited)
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)       # (four idle periods more: no mark over a mark)
        assert j.marks == 2

    asyncio.run(go())   # (the journal left open, as a crash leaves it: no closing mark)
    size = j.path(1).stat().st_size
    assert j.end.offset == size
    _refused_under_mark(tmp_path, j.path(1), size - MARK_SIZE - 1, size - MARK_SIZE)   # (the last entry record)
    j.close()


def test_a_payload_that_looks_like_a_mark_leaves_a_torn_tail_cut(tmp_path):
    """A torn record whose payload holds a mark's bytes: a mark names its
    own segment and offset, so one copied into a payload (anywhere but where
    it would be a real one) is not taken for one."""
    from bookie.journal_record import MARK_BODY, R_MARK

    j, _ = _open(tmp_path, preallocate=False)
    _write(j, [(R_ENTRIES, _entries(1, 0, 10))], wait_prepared=False)
    j.close()
    data = j.path(1).read_bytes()
    fake = MARK_BODY.pack(1, 100)   # (a valid mark's bytes, of another offset)
    payload = b"".join(E.encode_run(1, 10, [b"\0" * 7 + frame_record(R_MARK, fake) + fake], lac=-1, lafr=-1, term=0))
    torn = frame_record(R_ENTRIES, payload) + payload[:-3]
    j.path(1).write_bytes(data + torn)
    j2, records = _open(tmp_path, preallocate=False)
    j2.close()
    assert records == [(R_ENTRIES, _entries(1, 0, 10))]
    assert j2.path(1).stat().st_size == len(data)   # cut (and no closing mark: the journal ends in one)
