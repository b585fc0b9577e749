"""A reader's batches without an object per record (issue 18):
``bookie.entry.sparse_runs`` against ``decode_sparse`` on arbitrary frames,
``RecordBatch`` and ``RunSlots`` alone, then ``read_batch`` on real bookie
processes and etcd: exactly the appended payloads and positions, in order,
across fragment rolls and take-overs' no-ops; a record rotted on every
replica is never returned; bad arguments; the read-ahead bound."""
from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import entry as E
from stream import errors as se
from stream.position import Position
from stream.read_plan import RangeRead
from stream.record_batch import RecordBatch, RunSlots
from stream.stream import AsyncStreamClient, StreamClient, StreamConfig
from tests.conftest import run
from tests.test_striped_reads import _rot

LID = 7


def sname() -> str:
    return f"batch-{uuid.uuid4().hex[:8]}"


def _decoded(buf: bytes, after: int):
    """What decode_sparse makes of ``buf`` (the reference), or its error's type."""
    try:
        return E.decode_sparse(buf, LID, after)
    except (E.MalformedEntry, E.ChecksumMismatch) as e:
        return type(e)


# -- the frame's records as runs, against decode_sparse -----------------------------------

record = st.tuples(st.sampled_from([1, 1, 2, 3, 4]),          # the id's distance from the last
                   st.binary(max_size=40),                    # payload
                   st.sampled_from([0, 0, 0, E.FLAG_NOOP]),   # a no-op now and then
                   st.sampled_from([LID] * 20 + [LID + 1]))   # another ledger's record, rarely


@settings(max_examples=400, deadline=None)
@given(st.lists(record, max_size=12), st.integers(0, 3), st.one_of(st.none(), st.integers(0, 2000)),
       st.integers(0, 3), st.sampled_from([1, 2, 4, (1, 3), (2, 1, 1), (4, 3, 2, 1)]))
def test_sparse_runs_holds_exactly_what_decode_sparse_decodes(recs, first, flip, cut, step):
    """The same records (no-ops apart, by id), the same error type, for
    runs of consecutive ids, ids ``step`` apart (a striped share of one
    residue) or ids a residue's ``step[id mod E]`` apart (a share of
    several); a flipped byte or a cut frame is never taken for good records."""
    eid, parts = first, []
    for gap, payload, flags, lid in recs:
        eid += gap
        parts.append(E.encode(lid, eid, b"" if flags else payload, data_flags=flags, term=1))
    buf = bytearray(b"".join(parts))
    if flip is not None and buf:
        buf[flip % len(buf)] ^= 0x20
    buf = bytes(buf[:len(buf) - cut] if cut < len(buf) else buf)
    want = _decoded(buf, first)
    try:
        runs, noops = E.sparse_runs(buf, LID, first, step=step)
    except (E.MalformedEntry, E.ChecksumMismatch) as e:
        assert want is type(e)
        return
    assert isinstance(want, list)
    got = [(_walk(eid, k, step), buf[offs[k] + E.HEADER_SIZE:offs[k + 1]])
           for eid, offs in runs for k in range(len(offs) - 1)]
    assert got == [(e.entry_id, e.payload) for e in want if not e.is_noop]
    assert noops == [e.entry_id for e in want if e.is_noop]
    assert all(len(offs) >= 2 for _, offs in runs)


def _walk(eid: int, k: int, step) -> int:
    if isinstance(step, int):
        return eid + k * step
    for _ in range(k):
        eid += step[eid % len(step)]
    return eid


def test_sparse_runs_cuts_runs_at_no_ops_and_gaps_and_checks_every_checksum():
    recs = [E.encode(LID, i, b"r%d" % i, term=1, data_flags=E.FLAG_NOOP if i == 4 else 0)
            for i in (1, 2, 3, 4, 5, 6, 9, 10)]
    buf = b"xx" + b"".join(recs) + b"yy"
    runs, noops = E.sparse_runs(buf, LID, 0, 2, len(buf) - 2)
    assert [(eid, len(offs) - 1) for eid, offs in runs] == [(1, 3), (5, 2), (9, 2)]
    assert noops == [4]
    with pytest.raises(E.MalformedEntry):
        E.sparse_runs(buf, LID, 1, 2, len(buf) - 2)          # ids must be above ``after``
    bad = bytearray(buf)
    bad[bad.index(b"r10") + 1] ^= 1                          # the last payload rots
    with pytest.raises(E.ChecksumMismatch):
        E.sparse_runs(bytes(bad), LID, 0, 2, len(buf) - 2)


# -- RecordBatch and RunSlots alone ---------------------------------------------------------


def _frame(ids, size=5) -> bytes:
    return b"".join(E.encode(LID, i, bytes([i % 256]) * size, term=1) for i in ids)


def test_a_record_batch_slices_payloads_lazily_and_splits_and_joins():
    buf = _frame(range(10, 20))
    s = RunSlots(LID, 10, 24)
    assert s.put_frame(buf, 0, len(buf), 9, RangeRead(0, 10, 24)) == (10, 19)
    s.put_entry(E.Entry(LID, 20, b"loose", 0, 0, 0))          # an entry read by itself
    s.put_entry(E.Entry(LID, 21, b"", 0, 0, E.FLAG_NOOP))    # a no-op: delivered, no record
    assert s.missing(10, 24) == [22, 23, 24] and not s.full(10, 24) and s.full(10, 21)
    b = s.batch()
    want = [bytes([i]) * 5 for i in range(10, 20)] + [b"loose"]
    assert len(b) == 11 and list(b) == want and [bytes(v) for v in b.views()] == want
    assert [p.entry_id for p in b.positions()] == list(range(10, 21))
    assert b[3] == bytes([13]) * 5 and b[-1] == b"loose" and b.position(-1) == Position(20)
    assert isinstance(b.view(0), memoryview) and b.payload(0) == bytes([10]) * 5
    assert (b.first_position, b.last_position, b.payload_bytes) == (Position(10), Position(20), 55)
    assert [(r.position.entry_id, r.payload) for r in b.records()] == list(zip(range(10, 21), want))
    head, tail = b.split(4)
    assert list(head) == want[:4] and list(tail) == want[4:] and tail.first_position == Position(14)
    assert list(RecordBatch.join([head, RecordBatch(), tail])) == want
    assert b.split(0)[0].first_position is None and len(b.split(99)[0]) == 11
    with pytest.raises(IndexError):
        b[11]
    with pytest.raises(TypeError):
        b["0"]


def test_run_slots_keep_only_what_the_read_asked_for_once():
    """Ids past the read's last, of another stripe, or delivered before are
    dropped (a bookie sent more than it was asked)."""
    s = RunSlots(LID, 0, 11)
    ids = [*range(0, 6), *range(7, 12)]                                         # (6: not held)
    buf = _frame(ids)
    assert s.put_frame(buf, 0, len(buf), -1, RangeRead(0, 0, 5)) == (6, 5)     # 7..11: not this read's
    assert s.missing(0, 11) == list(range(6, 12))
    assert s.put_frame(buf, 0, len(buf), -1, RangeRead(1, 3, 11)) == (5, 11)   # 3..5 held already
    assert s.missing(0, 11) == [6]
    striped = RunSlots(LID, 0, 11)
    assert striped.put_frame(buf, 0, len(buf), -1, RangeRead(0, 0, 11, 4, 0b0101)) == (5, 11)
    assert [p.entry_id for p in striped.batch().positions()] == [0, 2, 4, 8, 10]
    assert striped.undelivered(RangeRead(1, 0, 11, 4, 0b0010)) and not striped.undelivered(RangeRead(0, 0, 11, 4, 1))
    assert list(s.batch()) == [bytes([i]) * 5 for i in ids]


def test_run_slots_interleave_the_shares_of_a_striped_read_in_id_order():
    """E4: each bookie's frame holds one residue (ids 4 apart); the batch
    holds every record in id order, without the no-op (9) and with the one
    a bookie did not hold (14) once it was read by itself."""
    s = RunSlots(LID, 0, 23)
    for res in range(4):
        recs = [E.encode(LID, i, b"" if i == 9 else b"s%d" % i, term=1, data_flags=E.FLAG_NOOP if i == 9 else 0)
                for i in range(res, 24, 4) if i != 14]
        buf = b"".join(recs)
        read = RangeRead(res, 0, 23, 4, 1 << res)
        other = RangeRead(res, 0, 23, 4, 1 << (res + 1) % 4)
        assert s.put_frame(buf, 0, len(buf), -1, other)[0] == 0           # another residue's read: dropped
        assert s.put_frame(buf, 0, len(buf), -1, read) == (len(recs), max(i for i in range(res, 24, 4) if i != 14))
        assert s.put_frame(buf, 0, len(buf), -1, read)[0] == 0            # delivered already
    assert s.missing(0, 23) == [14] and s.undelivered(RangeRead(2, 0, 23, 4, 0b0100))
    s.put_entry(E.Entry(LID, 14, b"s14", 0, 0, 0))
    b = s.batch()
    want = [i for i in range(24) if i != 9]
    assert [p.entry_id for p in b.positions()] == want
    assert list(b) == [b"s%d" % i for i in want] and b.payload_bytes == sum(len(b"s%d" % i) for i in want)


@st.composite
def striped_deliveries(draw):
    """A range cut into blocks, each block's residues (id mod E) split among
    shares (arcs, as the planner makes them, or any partition), each
    share's ids in frames cut anywhere: (E, first, last, [(read, ids)])."""
    stripe, first = draw(st.integers(2, 6)), draw(st.integers(0, 9))
    last = first + draw(st.integers(0, 70))
    cuts = sorted(draw(st.sets(st.integers(first + 1, last), max_size=2))) if last > first else []
    frames = []
    for a, b in zip([first, *cuts], [*cuts, last + 1]):
        owner = draw(st.lists(st.integers(0, stripe - 1), min_size=stripe, max_size=stripe))
        for k, mask in enumerate(sorted({sum(1 << r for r in range(stripe) if owner[r] == o) for o in owner})):
            read = RangeRead(k, a, b - 1, stripe, mask)
            ids = list(read.ids())
            fc = sorted(draw(st.sets(st.integers(1, max(1, len(ids) - 1)), max_size=3)))
            for x, y in zip([0, *fc], [*fc, len(ids)]):
                if ids[x:y]:
                    frames.append((read, ids[x:y]))
    return stripe, first, last, draw(st.permutations(frames))


@settings(max_examples=400, deadline=None)
@given(striped_deliveries(), st.data())
def test_a_striped_reads_shares_make_interleaves_that_read_as_the_records_in_id_order(case, data):
    """Every share in frames cut anywhere, arriving in any order: the batch
    is interleaves (nothing per record made) and reads, indexes, splits at
    every point and joins exactly as the records in id order; a no-op or
    an entry read by itself in the range gives the same records by the
    slots' join instead."""
    stripe, first, last, frames = case
    payload = {i: data.draw(st.binary(max_size=9), label=f"p{i}") for i in range(first, last + 1)}
    noop = data.draw(st.sampled_from([None, None, *range(first, last + 1)]), label="noop")
    alone = data.draw(st.sampled_from([None, None, *range(first, last + 1)]), label="alone")
    slots = RunSlots(LID, first, last)
    for read, ids in frames:
        ids = [i for i in ids if i != alone]
        if not ids:
            continue
        buf = b"".join(E.encode(LID, i, b"" if i == noop else payload[i], term=1,
                                data_flags=E.FLAG_NOOP if i == noop else 0) for i in ids)
        assert slots.put_frame(buf, 0, len(buf), ids[0] - 1, read) == (len(ids), ids[-1])
    if alone is not None:
        slots.put_entry(E.Entry(LID, alone, b"" if alone == noop else payload[alone], 0, 0,
                                E.FLAG_NOOP if alone == noop else 0))
    assert slots.missing(first, last) == []
    b = slots.batch()
    woven = noop is None and alone is None
    assert (bool(b._runs) and all(type(r).__name__ == "Interleave" for r in b._runs)) == woven
    want_ids = [i for i in range(first, last + 1) if i != noop]
    want = [payload[i] for i in want_ids]
    assert list(b) == want and [bytes(v) for v in b.views()] == want and len(b) == len(want)
    assert list(b.entry_ids()) == want_ids and [p.entry_id for p in b.positions()] == want_ids
    assert [(r.position.entry_id, r.payload) for r in b.records()] == list(zip(want_ids, want))
    assert b.payload_bytes == sum(map(len, want))
    if want:
        assert (b.first_position, b.last_position) == (Position(want_ids[0]), Position(want_ids[-1]))
    for i in range(len(want)):
        assert (b[i], bytes(b.view(i)), b.position(i)) == (want[i], want[i], Position(want_ids[i]))
    for n in range(len(want) + 1):
        head, tail = b.split(n)
        assert list(head) == want[:n] and list(tail) == want[n:]
        assert list(tail.entry_ids()) == want_ids[n:] and [bytes(v) for v in head.views()] == want[:n]
        assert list(RecordBatch.join([head, tail])) == want
        if 0 < n < len(want):
            assert head.last_position == Position(want_ids[n - 1]) and tail.first_position == Position(want_ids[n])


# -- read_batch on real bookies --------------------------------------------------------------


def test_read_batch_returns_exactly_the_appends_in_order_across_rolls_and_no_ops(shared):
    """Three writers one after the other (each take-over leaves a no-op),
    fragments of 9 entries: batches of 7 hold exactly the appended payloads
    and their positions, in order, each within its bound, and the reader's
    position follows them; ``read``, ``next`` and the blocking reader agree."""
    name = sname()
    appended: list[tuple[Position, bytes]] = []

    async def go():
        async with AsyncStreamClient(shared.endpoint, shared.cluster) as sc:
            for t in range(3):
                w = await sc.open_writer(name, StreamConfig(fragment_size_entries=9))
                payloads = [b"t%d-%03d-" % (t, i) + b"z" * (i % 13) for i in range(40)]
                appended.extend(zip(await w.append_many(payloads), payloads))
                await w.close()   # (tells the ensemble the LAC)
            info = await sc.stream_info(name)
            assert info["fragments"] >= 10
            r = await sc.open_reader(name, read_ahead_bytes=300)   # chunks of a few entries
            got = []
            while True:
                b = await r.read_batch(7)
                if not b:
                    break
                assert 0 < len(b) <= 7
                assert b.payload_bytes == sum(len(p) for p in b)
                got += zip(b.positions(), b)
                assert r.position > b.last_position
            assert got == appended
            # the no-ops (one per take-over) were read, and returned by nobody
            assert len({p.entry_id for p, _ in got}) == 120 and appended[-1][0].entry_id == 122
            r.seek(appended[50][0])
            first = await r.next()
            rest = await r.read(3)                    # what next() made, then batches again
            more = await r.read_batch(4)
            assert [first, *rest] == [_rec(x) for x in appended[50:54]]
            assert list(zip(more.positions(), more)) == appended[54:58]
            await r.close()

    run(go())
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_reader(name, appended[100][0]) as r:
            got = []
            while len(got) < 20:
                b = r.read_batch(100, timeout=10)
                got += zip(b.positions(), b)
            assert got == appended[100:]


def _rec(x):
    from stream.position import Record
    return Record(*x)


def test_read_batch_rejects_bad_arguments_with_value_errors(shared):
    name = sname()

    async def go():
        async with AsyncStreamClient(shared.endpoint, shared.cluster) as sc:
            w = await sc.open_writer(name)
            await w.append(b"one")
            r = await sc.open_reader(name)
            for bad in (0, -1, 1.5, True, None, "10"):
                with pytest.raises(ValueError, match="max_records"):
                    await r.read_batch(bad)
                with pytest.raises(ValueError, match="max_records"):
                    await r.read(bad)
            for bad in (-1, -0.5, float("nan"), "1", None, True):
                with pytest.raises(ValueError, match="timeout"):
                    await r.read_batch(10, bad)
            assert list(await r.read_batch(10, timeout=10)) == [b"one"]   # (nothing was consumed)
            await r.close()
            await w.close()

    run(go())


_THOUSANDS = [bytes([i % 251]) * 1000 for i in range(200)]


async def _written(sc: AsyncStreamClient, name: str, payloads: list[bytes]) -> None:
    """A new stream ``name`` holding ``payloads``, its writer closed."""
    w = await sc.open_writer(name)
    await w.append_many(payloads)
    await w.close()


def test_read_batch_keeps_to_the_read_ahead_bytes(shared):
    """A catch-up of 1,000-byte records with ``read_ahead_bytes=4000``: the
    first batch is the probe, every later one at most twice the bound in
    payload bytes, and what the reader holds ahead never passes it."""
    from stream.stream_reader import PROBE_ENTRIES

    name = sname()
    payloads = _THOUSANDS

    async def go():
        async with AsyncStreamClient(shared.endpoint, shared.cluster) as sc:
            await _written(sc, name, payloads)
            r = await sc.open_reader(name, read_ahead_bytes=4000)
            batches, most = [], 0
            while sum(map(len, batches)) < 200:
                batches.append(await r.read_batch(200, timeout=10))
                held = (len(r._held) + sum(b - a + 1 for a, b, _ in r._aheads)) * r._entry_bytes
                most = max(most, held)
            assert 4 < len(batches[0]) <= PROBE_ENTRIES + 4
            assert max(b.payload_bytes for b in batches[1:]) <= 2 * 4000
            assert 0 < most <= 4000
            assert [p for b in batches for p in b] == payloads
            await r.close()

    run(go())


def test_a_reader_keeps_to_its_read_rate(shared):
    """``max_read_bytes_per_s``: 200 records of 1,000 bytes read at 400 kB/s
    take at least (200 - 40 - 16 - 4) kB / 400 kB/s = 0.35 s (the burst is
    40 kB; a reader's first read, a probe of 16 entries of a size not known
    yet, counts nothing; the last chunk, 10 ms of the rate, need not wait
    for itself; unbounded, a few ms here), and come back exactly; the
    blocking reader takes the bound too; a bound that is no rate is
    refused."""
    name = sname()
    payloads = _THOUSANDS

    async def go():
        async with AsyncStreamClient(shared.endpoint, shared.cluster) as sc:
            await _written(sc, name, payloads)
            for bad in (-1, float("nan"), float("inf"), "1", None, True):
                with pytest.raises(ValueError, match="max_read_bytes_per_s"):
                    await sc.open_reader(name, max_read_bytes_per_s=bad)
            r = await sc.open_reader(name, max_read_bytes_per_s=400_000)
            loop = asyncio.get_running_loop()
            t0, got = loop.time(), []
            while len(got) < 200:
                got.extend(await r.read_batch(20, timeout=10))
            elapsed = loop.time() - t0
            await r.close()
            assert got == payloads and elapsed >= 0.35
    run(go())
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_reader(name, max_read_bytes_per_s=1_000_000) as r:
            assert r.aio._pacer.rate == 1_000_000 and r.read(5, timeout=5)[0].payload == payloads[0]


def test_a_record_rotted_on_every_replica_is_never_returned(own):
    """Record 30 of 60 rots in the journal of all three bookies: a batch
    reader returns records 0..29 at most and then fails with a typed error;
    it never hands out the rotted record, nor anything after it."""
    procs = own.start(3)
    name = sname()
    payloads = [b"rot-%05d-" % i + b"y" * 200 for i in range(60)]

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            w = await sc.open_writer(name, StreamConfig(3, 3, 2))
            await w.append_many(payloads)
            await w.close()
        for p in procs:
            _rot(p, b"rot-%05d-" % 30)
        async with AsyncStreamClient(own.endpoint, own.cluster, read_timeout=2.0) as sc:
            r = await sc.open_reader(name)
            got = []
            with pytest.raises((se.BadChecksum, se.ReadFailed)):
                while True:
                    b = await r.read_batch(7)
                    assert b, "the reader ended without reading record 30"
                    got += list(b)
            assert got == payloads[:len(got)] and len(got) <= 30
            assert r.position.entry_id <= 31   # (entry 0: the take-over's no-op)
            await r.close()

    run(go())
