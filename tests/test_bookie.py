"""A real bookie process on loopback: durability, terms, fencing, truncation,
read-only mode, malformed input, garbage collection and restart."""
from __future__ import annotations

import asyncio
import os
import struct
import time

import grpc
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from bookie import entry as E
from bookie import wire
from bookie.core import Status
from bookie.journal_record import R_ENTRIES, frame_record
from bookstream_pb import bookie_pb2 as pb
from stream.bookie_client import BookieClient
from tests.conftest import run

OK = Status.OK


def rec(ledger, entry, payload=None, *, term=0, lac=-1, recovery=False, truncate=False, noop=False):
    payload = payload if payload is not None else f"L{ledger}E{entry}T{term}".encode()
    flags = (E.FLAG_NOOP if (noop or truncate) else 0) | (E.FLAG_TRUNCATE if truncate else 0)
    return E.encode(ledger, entry, payload, lac=lac, term=term, data_flags=flags,
                    req_flags=E.REQ_RECOVERY if recovery else 0)


async def with_client(address, fn):
    c = BookieClient(address)
    try:
        return await fn(c)
    finally:
        await c.close()


async def read_payload(c, ledger, entry):
    r = await c.read_entry(ledger, entry)
    return r.status, (E.decode(r.entry).payload if r.status == OK else None)


def wait_until(predicate, timeout=20.0, what="condition"):
    """For state that can only be observed by asking (a bookie's disk check):
    ask until it holds, with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_bookie_serves_on_uvloop(bookies):
    """`bookstream bookie` runs its event loop on uvloop (bookstream.tuning.run):
    the process has uvloop's extension mapped."""
    b = bookies()
    with open(f"/proc/{b.pid}/maps") as f:
        maps = f.read()
    assert "/uvloop/loop." in maps


# -- durability ------------------------------------------------------------------


def test_acknowledged_entries_survive_kill_9_mid_stream(bookies):
    b = bookies()
    acked: dict[int, bytes] = {}

    async def write(c):
        # 400 frames of 25 entries pipelined; kill -9 once 100 frames are acked,
        # with many still in flight.
        futs = {}
        for f in range(400):
            frame = b"".join(rec(1, f * 25 + i, os.urandom(64)) for i in range(25))
            futs[c.add_frame(frame)] = frame
        done_frames = 0
        for fut in asyncio.as_completed(list(futs)):
            try:
                ack = await fut
            except Exception:
                continue  # in flight when the bookie died: outcome unknown
            assert ack.status == OK
            done_frames += 1
            if done_frames == 100:
                b.kill()
        return futs

    futs = run(with_client(b.address, write))
    for fut, frame in futs.items():
        if not fut.cancelled() and fut.exception() is None:
            for e in E.decode_all(frame):
                acked[e.entry_id] = e.payload
    assert len(acked) >= 100 * 25
    b.start()

    async def check(c):
        for eid, payload in acked.items():
            assert await read_payload(c, 1, eid) == (OK, payload), eid
    run(with_client(b.address, check))


def test_group_commit_covers_frames_of_several_clients(bookies):
    b = bookies()

    async def go():
        clients = [BookieClient(b.address) for _ in range(3)]
        try:
            futs = [c.add_frame(rec(10 + k, i)) for i in range(200) for k, c in enumerate(clients)]
            acks = await asyncio.gather(*futs)
            assert all(a.status == OK for a in acks)
            return await clients[0].info()
        finally:
            for c in clients:
                await c.close()

    info = run(go())
    assert info.entries == 600
    # one fdatasync per frame would be 600; group commit shares them
    assert info.journal_fsyncs < 300, info.journal_fsyncs
    # every group commit counted once by how long it took
    assert len(info.journal_sync_histogram) == 16 and sum(info.journal_sync_histogram) == info.journal_fsyncs
    assert info.journal_sync_max_seconds > 0


def _unmarked(seg) -> int:
    """The segment as a crash during its last commit leaves it: a mark
    ending it (one an idle journal writes a second after its last commit,
    bookie/journal.py) taken off, so that the last record is one a crash may
    tear (a mark after it says it was durable).  Returns the size."""
    from bookie.journal_record import MARK_BODY, MARK_SIZE, R_MARK, frame_record

    data = seg.read_bytes()
    end = len(data) - MARK_SIZE
    body = MARK_BODY.pack(int(seg.name[len("segment-"):-len(".log")]), end)
    if end > 0 and data[end:] == frame_record(R_MARK, body) + body:
        seg.write_bytes(data[:end])
    return seg.stat().st_size


def test_torn_tail_is_cut_off_and_never_served(bookies):
    b = bookies()

    async def write(c):
        ack = await c.add(b"".join(rec(1, i) for i in range(10)))
        assert ack.status == OK
    run(with_client(b.address, write))
    b.kill()
    seg = sorted((b.data_dir / "journal").glob("segment-*.log"))[-1]
    good_size = _unmarked(seg)
    # A crash in the middle of a write: a record for entries 10..19 whose
    # body was only half written.
    body = b"".join(rec(1, i) for i in range(10, 20))
    torn = frame_record(R_ENTRIES, body) + body[: len(body) // 2]
    with open(seg, "ab") as f:
        f.write(torn)
    b.start()
    from bookie.journal_record import MARK_SIZE

    assert seg.stat().st_size == good_size + MARK_SIZE  # cut off on open (then marked: what it kept is durable)

    async def check(c):
        for i in range(10):
            assert await read_payload(c, 1, i) == (OK, f"L1E{i}T0".encode())
        assert (await c.read_entry(1, 10)).status == Status.NO_SUCH_ENTRY
        assert (await c.read_lac(1)).last_entry == 9
        ack = await c.add(rec(1, 10, b"after"))  # the journal goes on after the cut
        assert ack.status == OK
        assert await read_payload(c, 1, 10) == (OK, b"after")
    run(with_client(b.address, check))


def test_corrupt_record_in_the_middle_stops_replay_there(bookies):
    """A record whose CRC fails with no mark after it (the last commit, in
    flight at a crash) ends the valid journal: nothing after it is trusted,
    and it is never served.  (With a mark after it: refused,
    tests/test_damaged_data_dir.py.)"""
    b = bookies()
    run(with_client(b.address, lambda c: c.add(b"".join(rec(2, i) for i in range(5)))))
    run(with_client(b.address, lambda c: c.add(b"".join(rec(2, i) for i in range(5, 10)))))
    b.kill()
    seg = sorted((b.data_dir / "journal").glob("segment-*.log"))[-1]
    _unmarked(seg)
    data = bytearray(seg.read_bytes())
    # flip a payload byte of the last record (its CRC no longer matches)
    data[-1] ^= 0xFF
    seg.write_bytes(bytes(data))
    b.start()

    async def check(c):
        assert (await c.read_entry(2, 4)).status == OK
        r = await c.read_entry(2, 5)
        assert r.status == Status.NO_SUCH_ENTRY  # the whole corrupt frame is gone
    run(with_client(b.address, check))


# -- terms, fences, truncation -------------------------------------------------


def test_term_rules_and_their_persistence(bookies):
    b = bookies()

    async def phase1(c):
        assert (await c.add(rec(5, 0, term=1))).status == OK
        lac = await c.read_lac(5, term=2)          # a new writer's fencing LAC read
        assert lac.status == OK and lac.term == 2 and lac.last_entry == 0
        ack = await c.add(rec(5, 1, term=1))        # the old writer is refused
        assert ack.status == Status.INVALID_TERM and ack.errors[0].term == 2
        assert (await c.read_entry(5, 1)).status == Status.NO_SUCH_ENTRY
        assert (await c.add(rec(5, 1, term=2))).status == OK
        assert (await c.add(rec(5, 2, term=3))).status == OK   # a higher term raises it
        r = await c.read_entry(5, 0, term=2)                   # a stale recovery read
        assert r.status == Status.INVALID_TERM and r.term == 3
        assert (await c.read_entry(5, 0)).status == OK          # normal reads carry no term
    run(with_client(b.address, phase1))
    b.kill()
    b.start()

    async def phase2(c):
        assert (await c.read_lac(5)).term == 3
        assert (await c.add(rec(5, 3, term=2))).status == Status.INVALID_TERM
        assert (await c.read_lac(5, term=2)).status == Status.INVALID_TERM
    run(with_client(b.address, phase2))


def test_fencing_an_unknown_ledger_persists(bookies):
    b = bookies()

    async def fence(c):
        r = await c.read_lac(77, term=4)
        assert r.status == OK and r.term == 4 and r.last_entry == -1
    run(with_client(b.address, fence))
    b.kill()
    b.start()

    async def late_writer(c):
        ack = await c.add(rec(77, 0, term=3))
        assert ack.status == Status.INVALID_TERM
    run(with_client(b.address, late_writer))


def test_classic_fence_refuses_normal_adds_accepts_recovery_adds(bookies):
    b = bookies()

    async def go(c):
        assert (await c.add(rec(6, 0))).status == OK
        r = await c.read_lac(6, fence=True)
        assert r.status == OK and r.fenced and r.last_entry == 0
        assert (await c.add(rec(6, 1))).status == Status.FENCED
        assert (await c.add(rec(6, 1, recovery=True))).status == OK
        assert (await c.read_entry(7, 0, fence=True)).status == Status.NO_SUCH_ENTRY  # fences ledger 7
    run(with_client(b.address, go))
    b.kill()
    b.start()

    async def after(c):
        assert (await c.read_lac(6)).fenced
        assert (await c.add(rec(6, 2))).status == Status.FENCED
        assert (await c.add(rec(7, 0))).status == Status.FENCED
    run(with_client(b.address, after))


def test_truncate_noop_deletes_higher_entries_across_restarts(bookies):
    b = bookies()

    async def go(c):
        assert (await c.add(b"".join(rec(8, i, term=1) for i in range(10)))).status == OK
        # the new writer (term 2) ends recovery with a truncate no-op at 4
        assert (await c.add(rec(8, 4, b"", term=2, truncate=True, recovery=True))).status == OK
        for i in range(5, 10):
            assert (await c.read_entry(8, i)).status == Status.NO_SUCH_ENTRY
        assert (await c.add(rec(8, 5, b"new5", term=2))).status == OK
        assert (await c.read_lac(8)).last_entry == 5
    run(with_client(b.address, go))

    async def check(c):
        assert await read_payload(c, 8, 3) == (OK, b"L8E3T1")
        r = await c.read_entry(8, 4)
        assert r.status == OK and E.decode(r.entry).is_noop
        assert await read_payload(c, 8, 5) == (OK, b"new5")
        for i in range(6, 10):
            assert (await c.read_entry(8, i)).status == Status.NO_SUCH_ENTRY
    b.kill()          # replay from the journal
    b.start()
    run(with_client(b.address, check))
    b.stop()          # clean stop: from the checkpoint
    b.start()
    run(with_client(b.address, check))


# -- reads -----------------------------------------------------------------------------


def test_range_reads_stream_in_frames_and_stop_at_a_gap(bookies):
    b = bookies()

    async def go(c):
        assert (await c.add(b"".join(rec(3, i, bytes(1000)) for i in range(100)))).status == OK
        assert (await c.add(b"".join(rec(3, i, bytes(1000)) for i in range(101, 110)))).status == OK
        frames = [r async for r in c.read_range(3, 0, 200, max_frame_bytes=10_000)]
        assert len(frames) > 5  # split by size
        got = [e.entry_id for f in frames for e in E.decode_all(f.entries)]
        assert got == list(range(100))  # stops before the gap at 100
        assert sum(f.count for f in frames) == 100
        assert frames[-1].status == Status.NO_SUCH_ENTRY
        frames = [r async for r in c.read_range(3, 101, 109)]
        assert frames[-1].status == OK and sum(f.count for f in frames) == 9
    run(with_client(b.address, go))


async def sparse(c, ledger, first, last, **kw):
    """A sparse range read: (held entry ids, the last frame's through,
    statuses of the frames)."""
    frames = [r async for r in c.read_range(ledger, first, last, sparse=True, **kw)]
    ids = [h.entry_id for f in frames for h in E.iter_headers(f.entries)]
    for f in frames:
        assert f.count == len(list(E.iter_headers(f.entries)))
        for h in E.iter_headers(f.entries):
            E.verify(f.entries, h)
    return ids, frames[-1].through, [Status(f.status) for f in frames]


def test_sparse_range_reads_return_every_held_entry_and_vouch_for_the_rest(bookies):
    b = bookies()

    async def go(c):
        held = [i for i in range(200) if i % 4 != 1]              # striped, as with E = 4, Qw = 3
        held += [500, 501, 750]
        assert (await c.add(b"".join(rec(11, i, bytes(100)) for i in held))).status == OK
        ids, through, sts = await sparse(c, 11, 0, 1000)
        assert ids == held and through == 1000 and set(sts) == {OK}
        ids, through, _ = await sparse(c, 11, 502, 749)            # nothing held in the range
        assert ids == [] and through == 749
        # small frames: each vouches for the ids up to its `through`, and
        # together they cover the range: every id is returned or vouched absent
        frames = [r async for r in c.read_range(11, 0, 1000, sparse=True, max_frame_bytes=1000)]
        assert len(frames) > 20 and frames[-1].through == 1000
        seen, covered = [], -1
        for f in frames:
            got = [h.entry_id for h in E.iter_headers(f.entries)]
            assert all(covered < i <= f.through for i in got)     # ids in order, within the frame's span
            assert f.through > covered
            seen += got
            covered = f.through
        assert seen == held
        # a dense read still stops at the first gap
        dense = [r async for r in c.read_range(11, 0, 10)]
        assert [h.entry_id for f in dense for h in E.iter_headers(f.entries)] == [0]
        assert dense[-1].status == Status.NO_SUCH_ENTRY
        ids, _, sts = await sparse(c, 12345, 0, 10)                # a ledger the bookie does not know
        assert ids == [] and sts == [Status.NO_SUCH_LEDGER]
        info = await c.info()
        assert info.read_range_requests == 3 + 2 and info.read_entry_requests == 0
    run(with_client(b.address, go))


def test_a_record_that_rots_on_disk_is_never_served_by_a_range_read(bookies):
    """A stored record whose bytes changed after it was acknowledged: range
    reads serve the good records below it, then CHECKSUM_MISMATCH (never
    the record, never NO_SUCH_ENTRY for it), unless the reader checks the
    records itself."""
    b = bookies()

    async def go(c):
        assert (await c.add(b"".join(rec(21, i) for i in range(5)))).status == OK
        seg = sorted((b.data_dir / "journal").glob("segment-*.log"))[-1]
        data = seg.read_bytes()
        at = data.index(b"L21E2T0")
        with open(seg, "r+b") as f:  # the bookie's page cache sees it at once
            f.seek(at)
            f.write(b"X")
        frames = [r async for r in c.read_range(21, 0, 4, sparse=True)]
        assert [(f.status, f.count, f.through) for f in frames] == [(OK, 2, 1), (Status.CHECKSUM_MISMATCH, 0, 0)]
        assert [h.entry_id for h in E.iter_headers(frames[0].entries)] == [0, 1]
        dense = [r async for r in c.read_range(21, 0, 4)]
        assert [f.status for f in dense] == [Status.CHECKSUM_MISMATCH]
        # a reader that checks every record itself (reader_verifies) gets
        # them as stored, the rotted one included: its own check fails there
        for sparse_read in (True, False):
            frames = [r async for r in c.read_range(21, 0, 4, sparse=sparse_read, reader_verifies=True)]
            assert [(f.status, f.count) for f in frames] == [(OK, 5)]
            assert [h.entry_id for h in E.iter_headers(frames[0].entries)] == [0, 1, 2, 3, 4]
            with pytest.raises(E.ChecksumMismatch):
                E.decode_sparse(frames[0].entries, 21, -1)
    run(with_client(b.address, go))


def test_range_reads_carry_the_term_and_the_fence_like_read_entry(bookies):
    b = bookies()

    async def go(c):
        assert (await c.add(b"".join(rec(12, i, term=3) for i in range(5)))).status == OK
        ids, _, sts = await sparse(c, 12, 0, 10, term=2)            # a lower term: refused, nothing read
        assert ids == [] and sts == [Status.INVALID_TERM]
        frames = [r async for r in c.read_range(12, 0, 10, term=2)]  # dense too
        assert [(f.status, f.term) for f in frames] == [(Status.INVALID_TERM, 3)]
        ids, _, sts = await sparse(c, 12, 0, 10, term=4)            # raises the term ...
        assert ids == list(range(5)) and set(sts) == {OK}
        assert (await c.read_lac(12)).term == 4
        assert (await c.add(rec(12, 5, term=3))).status == Status.INVALID_TERM  # ... fencing the writer
        b.kill()                                                    # ... durably
        b.start()
    run(with_client(b.address, go))

    async def after(c):
        assert (await c.read_lac(12)).term == 4
        assert (await c.add(rec(12, 5, term=3))).status == Status.INVALID_TERM
        # classic: a fencing range read fences the ledger (normal adds refused,
        # recovery adds accepted), and creates an unknown ledger to fence it
        assert (await c.add(rec(13, 0))).status == OK
        ids, _, _ = await sparse(c, 13, 0, 5, fence=True)
        assert ids == [0]
        assert (await c.add(rec(13, 1))).status == Status.FENCED
        assert (await c.add(rec(13, 1, recovery=True))).status == OK
        ids, _, sts = await sparse(c, 14, 0, 5, fence=True)
        assert ids == [] and set(sts) == {OK} and (await c.read_lac(14)).fenced
        assert (await c.add(rec(14, 0))).status == Status.FENCED
        frames = [r async for r in c.stub.ReadRange(pb.ReadRangeRequest(ledger_id=14, first_entry=0, last_entry=5,
                                                                          sparse=True, flags=8))]
        assert [f.status for f in frames] == [Status.BAD_REQUEST]
    run(with_client(b.address, after))


def test_a_sparse_range_read_is_never_unsure_about_absence(bookies):
    """Entries removed by a truncate no-op or a range delete are absent;
    entries compaction relocated are still returned; the same after a
    restart."""
    b = bookies(extra_args=["--segment-size", str(64 << 10), "--gc-interval", "0.2",
                            "--compaction-threshold", "0.5"])

    async def write(c):
        for i in range(100):  # ledger 15 shares every segment with a big ledger 16
            assert (await c.add(rec(16, i, bytes(3000)) + rec(15, i))).status == OK
        assert (await c.add(rec(15, 60, truncate=True, recovery=True, lac=59))).status == OK  # drops 61..99
        assert (await c.delete(15, (10, 19))).status == OK
        assert (await c.delete(16)).status == OK
        return await c.info()

    before = run(with_client(b.address, write))
    want = [i for i in range(61) if not 10 <= i <= 19]

    async def check(c):
        ids, through, sts = await sparse(c, 15, 0, 200)
        assert ids == want and through == 200 and set(sts) == {OK}

    run(with_client(b.address, check))

    def compacted():
        info = run(with_client(b.address, lambda c: c.info()))
        return info if info.used_bytes < before.used_bytes / 3 else None
    wait_until(compacted, what="GC to compact ledger 15's segments")
    run(with_client(b.address, check))
    b.kill()
    b.start()
    run(with_client(b.address, check))


def test_long_poll_lac_wakes_on_a_new_lac_and_times_out(bookies):
    b = bookies()

    async def go(c):
        assert (await c.add(rec(4, 0, lac=-1))).status == OK
        t0 = time.monotonic()
        r = await c.long_poll_lac(4, previous_lac=5, timeout_s=0.3)  # nothing new: times out
        assert r.lac == -1 and time.monotonic() - t0 >= 0.3
        poll = asyncio.ensure_future(c.long_poll_lac(4, previous_lac=-1, timeout_s=30))
        await asyncio.sleep(0)  # the poll is sent before the add
        assert not poll.done()
        assert (await c.add(rec(4, 1, lac=0))).status == OK
        r = await asyncio.wait_for(poll, 10)
        assert r.status == OK and r.lac == 0
    run(with_client(b.address, go))


def test_a_long_poll_woken_before_its_lac_passed_is_woken_again_when_it_does(bookies):
    """A long poll at ``previous_lac`` 0 is woken by an add whose LAC is
    still 0 (every durable add wakes the ledger's polls), and must still be
    woken by the next, whose LAC is 1, and by an explicit LAC.  (Before: the
    first wake took its list of waiters away and the poll waited again on
    a future left in that list, which no later wake reached: a tailing
    reader waited its whole timeout for a LAC the bookie had.)"""
    b = bookies()

    async def go(c):
        assert (await c.add(b"".join(rec(5, i, lac=i - 1) for i in range(2)))).status == OK   # LAC 0
        poll = asyncio.ensure_future(c.long_poll_lac(5, previous_lac=0, timeout_s=30))
        await asyncio.sleep(0.2)   # (the poll waits at the bookie before the adds)
        assert (await c.add(rec(5, 2, lac=0))).status == OK   # durable: a wake, the LAC still 0
        assert not poll.done()
        assert (await c.add(rec(5, 3, lac=1))).status == OK
        r = await asyncio.wait_for(poll, 10)
        assert r.status == OK and r.lac == 1, r
        poll = asyncio.ensure_future(c.long_poll_lac(5, previous_lac=1, timeout_s=30))
        await asyncio.sleep(0.2)
        assert (await c.add(rec(5, 4, lac=1))).status == OK   # a wake, the LAC still 1
        assert not poll.done()
        assert (await c.write_lac(5, lac=4, lafr=4, term=0)).status == OK
        assert (await asyncio.wait_for(poll, 10)).lac == 4
    run(with_client(b.address, go))


# -- malformed input ---------------------------------------------------------------------


def test_malformed_requests_get_errors_and_change_nothing(bookies):
    b = bookies(extra_args=["--max-entry-size", "1000"])

    async def go(c):
        good = rec(9, 0)
        bad_crc = bytearray(rec(9, 1))
        bad_crc[-1] ^= 1
        assert (await c.add(b"")).status == Status.BAD_REQUEST
        assert (await c.add(b"\x00" * 10)).status == Status.BAD_REQUEST
        assert (await c.add(good + good[:-3])).status == Status.BAD_REQUEST          # truncated
        assert (await c.add(good + bytes(bad_crc))).status == Status.CHECKSUM_MISMATCH
        assert (await c.add(rec(9, 2, bytes(1001)))).status == Status.TOO_LARGE
        neg = bytearray(good)
        struct.pack_into("<q", neg, 26, -5)  # the entry id
        assert (await c.add(bytes(neg))).status == Status.BAD_REQUEST
        flags = bytearray(good)
        struct.pack_into("<H", flags, 50, 0x80)  # the data flags
        assert (await c.add(bytes(flags))).status == Status.BAD_REQUEST
        # nothing of the refused frames was stored, not even their good entries
        assert (await c.read_lac(9)).status == Status.NO_SUCH_LEDGER
        assert (await c.read_entry(9, -1)).status == Status.BAD_REQUEST
        assert (await c.stub.ReadEntry(pb.ReadEntryRequest(ledger_id=9, entry_id=0, flags=8))).status == Status.BAD_REQUEST
        assert (await c.stub.ReadLac(pb.ReadLacRequest(ledger_id=9, flags=8))).status == Status.BAD_REQUEST
        frames = [r async for r in c.read_range(9, 5, 2)]
        assert [f.status for f in frames] == [Status.BAD_REQUEST]
        assert (await c.delete(9, (5, 2))).status == Status.BAD_REQUEST
        assert (await c.read_entry(12345, 0)).status == Status.NO_SUCH_LEDGER
        # bytes that are not even a protobuf: a typed BAD_REQUEST, the bookie lives on
        raw = c.channel.unary_unary("/bookstream.v1.Bookie/ReadEntry")
        assert pb.ReadEntryResponse.FromString(await raw(b"\xff\xff\xff\xff\x0f")).status == Status.BAD_REQUEST
        # an add stream message that is no AddFrame: acks for the frames
        # before it, then the stream ends with INVALID_ARGUMENT
        add = c.channel.stream_stream("/bookstream.v1.Bookie/Add")
        call = add()
        await call.write(wire.encode_add_frame(7, [rec(11, 0)]))
        await call.write(b"\x08\xff")  # a truncated varint
        acks = []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for r in call:
                acks += pb.AddAcks.FromString(r).acks
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert [(a.frame_id, a.status) for a in acks] == [(7, OK)]
        assert await read_payload(c, 11, 0) == (OK, b"L11E0T0")
        assert (await c.add(good)).status == OK
        assert await read_payload(c, 9, 0) == (OK, b"L9E0T0")
    run(with_client(b.address, go))
    assert b.alive()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=8))
def test_random_frames_never_crash_the_bookie(shared_bookie, junk):
    async def go(c):
        for j in junk:
            ack = await c.add(j)
            assert ack.status in (Status.BAD_REQUEST, Status.CHECKSUM_MISMATCH, Status.TOO_LARGE, OK)
        assert (await c.info()).bookie_id
    run(with_client(shared_bookie.address, go))
    assert shared_bookie.alive()


@pytest.fixture(scope="module")
def shared_bookie(tmp_path_factory):
    from bookstream.processes import BookieProcess

    b = BookieProcess(tmp_path_factory.mktemp("fuzz") / "b").start()
    yield b
    b.kill()


# -- space ------------------------------------------------------------------------------


def test_read_only_when_full_and_writable_when_space_returns(bookies):
    b = bookies(extra_args=["--max-storage-bytes", str(400_000), "--disk-usage-threshold", "0.9",
                            "--disk-usage-margin", "0.2", "--segment-size", str(64 << 10),
                            "--gc-interval", "0.2", "--disk-check-interval", "0.1",
                            "--compaction-threshold", "0.5"])

    async def fill(c):
        for i in range(1000):
            ack = await c.add(rec(20, i, bytes(4000)))
            if ack.status == Status.READ_ONLY:
                return i
            assert ack.status == OK
        raise AssertionError("never went read-only")

    n = run(with_client(b.address, fill))
    assert 50 < n < 100  # ~90% of 400 kB in 4 kB entries

    async def while_read_only(c):
        assert (await c.info()).state == pb.READ_ONLY_STATE
        assert (await c.add(rec(21, 0))).status == Status.READ_ONLY
        assert (await c.add(rec(20, n, b"r", recovery=True))).status == OK  # recovery still lands
        assert await read_payload(c, 20, 0) == (OK, bytes(4000))          # reads still work
        assert (await c.delete(20)).status == OK
    run(with_client(b.address, while_read_only))

    def writable():
        return run(with_client(b.address, lambda c: c.info())).state == pb.WRITABLE
    wait_until(writable, what="the bookie to become writable after GC")
    run(with_client(b.address, lambda c: c.add(rec(21, 0))))
    assert run(with_client(b.address, lambda c: c.read_entry(21, 0))).status == OK


def test_gc_removes_dead_segments_and_compacts_mixed_ones(bookies):
    b = bookies(extra_args=["--segment-size", str(64 << 10), "--gc-interval", "0.2",
                            "--compaction-threshold", "0.5"])

    async def write(c):
        # interleave a big ledger (30) and a small one (31) in every segment
        for i in range(120):
            assert (await c.add(rec(30, i, bytes(3000)) + rec(31, i))).status == OK
        return await c.info()
    before = run(with_client(b.address, write))
    run(with_client(b.address, lambda c: c.delete(30)))

    def shrunk():
        info = run(with_client(b.address, lambda c: c.info()))
        return info if info.used_bytes < before.used_bytes / 3 else None
    after = wait_until(shrunk, what="GC to reclaim the deleted ledger's space")
    assert after.entries == 120

    async def check(c):
        for i in range(120):
            assert await read_payload(c, 31, i) == (OK, f"L31E{i}T0".encode())
        assert (await c.read_entry(30, 0)).status == Status.NO_SUCH_LEDGER
    run(with_client(b.address, check))
    b.kill()
    b.start()
    run(with_client(b.address, check))


def test_deleting_a_fragment_range(bookies):
    b = bookies()

    async def go(c):
        assert (await c.add(b"".join(rec(40, i) for i in range(20)))).status == OK
        r = await c.delete(40, (0, 9))
        assert r.status == OK and r.entries_deleted == 10
        assert (await c.read_entry(40, 9)).status == Status.NO_SUCH_ENTRY
        assert (await c.read_entry(40, 10)).status == OK
    run(with_client(b.address, go))
    b.kill()
    b.start()
    assert run(with_client(b.address, lambda c: c.read_entry(40, 5))).status == Status.NO_SUCH_ENTRY
    assert run(with_client(b.address, lambda c: c.read_entry(40, 15))).status == OK


# -- restart ------------------------------------------------------------------------------


def test_restart_replays_only_what_follows_the_checkpoint(bookies):
    b = bookies(extra_args=["--checkpoint-bytes", str(1 << 40)])  # only at clean stops

    async def write(c, ledger, frames):
        for f in range(frames):
            assert (await c.add(b"".join(rec(ledger, f * 10 + i) for i in range(10)))).status == OK

    run(with_client(b.address, lambda c: write(c, 50, 100)))
    b.stop()                       # clean stop: checkpoint
    b.start()
    info = run(with_client(b.address, lambda c: c.info()))
    assert info.replayed_records == 0 and info.entries == 1000
    run(with_client(b.address, lambda c: write(c, 51, 7)))
    b.kill()                       # no checkpoint: replay the 7 frames only
    b.start()
    info = run(with_client(b.address, lambda c: c.info()))
    assert info.replayed_records == 7 and info.entries == 1070
    assert run(with_client(b.address, lambda c: read_payload(c, 50, 999))) == (OK, b"L50E999T0")
    assert run(with_client(b.address, lambda c: read_payload(c, 51, 69))) == (OK, b"L51E69T0")


def test_explicit_lac_wakes_long_polls_persists_and_obeys_terms(bookies):
    b = bookies()

    async def go(c):
        assert (await c.add(b"".join(rec(60, i, term=1, lac=i - 1) for i in range(3)))).status == OK
        assert (await c.read_lac(60)).lac == 1        # entry 2 carries LAC 1
        poll = asyncio.ensure_future(c.long_poll_lac(60, previous_lac=1, timeout_s=30))
        await asyncio.sleep(0)
        r = await c.write_lac(60, lac=2, lafr=2, term=1)
        assert r.status == OK
        assert (await asyncio.wait_for(poll, 10)).lac == 2
        assert (await c.write_lac(61, 0, 0, term=1)).status == Status.NO_SUCH_LEDGER
        assert (await c.read_lac(60, term=2)).status == OK
        r = await c.write_lac(60, lac=5, lafr=5, term=1)   # an old writer
        assert r.status == Status.INVALID_TERM and r.term == 2
        assert (await c.stub.WriteLac(pb.WriteLacRequest(ledger_id=60, lac=-7, term=2))).status == Status.BAD_REQUEST
    run(with_client(b.address, go))
    b.kill()
    b.start()
    r = run(with_client(b.address, lambda c: c.read_lac(60)))
    assert (r.lac, r.lafr) == (2, 2)  # never goes down, not even across kill -9


def test_prepare_raises_the_term_and_deletes_from_the_first_entry_on(bookies):
    b = bookies()

    async def go(c):
        assert (await c.add(b"".join(rec(70, i, term=1) for i in range(10)))).status == OK
        r = await c.prepare(70, 6, term=3)
        assert r.status == OK and r.term == 3 and r.entries_deleted == 4
        assert (await c.read_entry(70, 5)).status == OK
        assert (await c.read_entry(70, 6)).status == Status.NO_SUCH_ENTRY
        assert (await c.add(rec(70, 6, term=2))).status == Status.INVALID_TERM   # an older writer
        r = await c.prepare(70, 0, term=2)                                         # ... or its prepare
        assert r.status == Status.INVALID_TERM and r.term == 3
        assert (await c.read_entry(70, 0)).status == OK                            # nothing deleted
        assert (await c.prepare(71, 0, term=1)).status == OK                       # unknown: fenced at 1
        assert (await c.add(rec(71, 0, term=0))).status == Status.INVALID_TERM
        assert (await c.stub.Prepare(pb.PrepareRequest(ledger_id=70, first_entry=-1, term=9))).status == \
            Status.BAD_REQUEST
    run(with_client(b.address, go))
    b.kill()
    b.start()

    async def after(c):
        assert (await c.read_entry(70, 6)).status == Status.NO_SUCH_ENTRY
        assert (await c.read_lac(70)).term == 3
    run(with_client(b.address, after))


def test_an_idle_client_connection_keeps_its_keepalive_without_goaway(bookies):
    """Clients ping their bookies every 10 s, idle too (stream/bookie_client.py
    CHANNEL_OPTIONS).  The bookie accepts pings down to
    ``MIN_CLIENT_PING_INTERVAL_MS``, calls in flight or not: an idle channel
    pinging at that pace stays READY through three pings and more (gRPC's default
    server policy answers the third with GOAWAY too_many_pings, and the
    channel leaves READY).  The clients' own pace is no faster."""
    from bookie.server import MIN_CLIENT_PING_INTERVAL_MS
    from bookstream_pb import bookie_pb2_grpc as pb_grpc
    from stream.bookie_client import CHANNEL_OPTIONS

    assert dict(CHANNEL_OPTIONS)["grpc.keepalive_time_ms"] >= MIN_CLIENT_PING_INTERVAL_MS
    b = bookies()
    pace_s = MIN_CLIENT_PING_INTERVAL_MS / 1000 * 1.1
    options = [(k, v) for k, v in CHANNEL_OPTIONS if k != "grpc.keepalive_time_ms"]
    options.append(("grpc.keepalive_time_ms", int(pace_s * 1000)))

    async def go():
        async with grpc.aio.insecure_channel(b.address, options=options) as ch:
            r = await pb_grpc.BookieStub(ch).ReadLac(pb.ReadLacRequest(ledger_id=1))
            assert r.status == int(Status.NO_SUCH_LEDGER)
            assert ch.get_state() is grpc.ChannelConnectivity.READY
            with pytest.raises(asyncio.TimeoutError):   # no change of state: still READY
                await asyncio.wait_for(ch.wait_for_state_change(grpc.ChannelConnectivity.READY),
                                       timeout=4 * pace_s)

    run(go())
