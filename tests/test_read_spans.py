"""A bookie's range read by disk spans (issue 18): ``Run.breaks_after`` (where
a run's records stop following each other on disk) and
``bookie.range_read.read_runs`` (one step per span, the frame's record count from
the index walk) answer as the per-record walk they replaced, on random
indexes (hypothesis, with a stand-in for the pread), and on the real
Storage the count equals the records served at the edges: `max_bytes`
cutting a span, gaps in the ids, one record larger than `max_bytes`."""
from __future__ import annotations

import asyncio
from array import array

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from bookie import entry as E
from bookie.core import Status
from bookie.index import LedgerIndex, pack_location
from bookie.range_read import read_runs
from bookie.storage import Storage
from tests.storage_support import admit_durably

LID = 3


class Preads:
    """Storage's `_read_at` as a record of the preads asked for."""

    def _read_at(self, loc: int, length: int):
        return (loc, length)


def per_record_walk(runs, max_bytes: int):
    """The walk `read_runs` did before the spans (from `runs_from`)."""
    out, size, nxt = [], 0, None
    run_loc, run_len = -1, 0
    for start, locs, lens in runs:
        nxt = start
        for loc, ln in zip(locs, lens):
            if size and size + ln > max_bytes:
                if run_len:
                    out.append((run_loc, run_len))
                return out, nxt, True
            if loc == run_loc + run_len:
                run_len += ln
            else:
                if run_len:
                    out.append((run_loc, run_len))
                run_loc, run_len = loc, ln
            size += ln
            nxt += 1
    if run_len:
        out.append((run_loc, run_len))
    return out, nxt, False


def breaks_in(run, lo: int, hi: int) -> list[int]:
    """The breaks k of a run with lo < k < hi."""
    b, i = run.breaks_after(lo)
    return [k for k in b[i:] if k < hi]


def records_of(runs, max_bytes: int) -> int:
    """How many records the per-record walk read."""
    size = count = 0
    for _, _, lens in runs:
        for ln in lens:
            if size and size + ln > max_bytes:
                return count
            size += ln
            count += 1
    return count


# puts: (first id, lengths, where on disk: 0 right after the previous put's
# records, else that many bytes further (or in segment 1 when > 900)); a
# put over ids held rewrites them elsewhere, one filling a gap merges runs
PUTS = st.lists(st.tuples(st.integers(0, 60), st.lists(st.integers(60, 200), min_size=1, max_size=12),
                          st.integers(0, 1000)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(PUTS, st.integers(0, 70), st.integers(0, 80), st.integers(0, 1500), st.booleans(), st.booleans(),
       st.booleans())
def test_spans_answer_as_the_per_record_walk(puts, first, last, max_bytes, skip_gaps, adjacent, read_each):
    """(``adjacent``: the puts say their records are one span, as a bookie's
    do: breaks kept as the runs grow; ``read_each``: a read after every put,
    else after the last only)"""
    ix, pos = LedgerIndex(), 0
    for k, (start, lens, skip) in enumerate(puts):  # breaks found, then kept or found again
        seg = 1 if skip > 900 else 0
        pos += skip
        locs = []
        for ln in lens:
            locs.append(pack_location(seg, pos))
            pos += ln
        ix.put_run(start, array("Q", locs), array("I", lens), adjacent=adjacent)
        if not read_each and k < len(puts) - 1:
            continue
        got = read_runs(ix.run_slices(first, last, skip_gaps=skip_gaps), max_bytes, Preads()._read_at)
        want = per_record_walk(ix.runs_from(first, last, skip_gaps=skip_gaps), max_bytes)
        assert got[:3] == want
        assert got[3] == records_of(ix.runs_from(first, last, skip_gaps=skip_gaps), max_bytes)
        for run, lo, hi in ix.run_slices(0, 100, skip_gaps=True):  # the kept breaks are the runs' own
            assert breaks_in(run, lo, hi) == [j for j in range(lo + 1, hi)
                                              if run.locs[j] != run.locs[j - 1] + run.lens[j - 1]]


def test_breaks_follow_appends_and_changes():
    ix = LedgerIndex()
    ix.put_run(0, array("Q", [0, 10, 20]), array("I", [10, 10, 10]))
    run = ix._last
    assert breaks_in(run, 0, 3) == []
    ix.put_run(3, array("Q", [100, 110]), array("I", [10, 10]))  # an append, not adjacent on disk
    assert breaks_in(run, 0, 5) == [3]
    assert breaks_in(run, 3, 5) == [] and breaks_in(run, 0, 3) == []
    ix.put(1, 500, 10)  # a record rewritten elsewhere: breaks before and after it
    assert breaks_in(run, 0, 5) == [1, 2, 3]
    ix.put(1, 10, 10)  # back in place
    assert breaks_in(run, 0, 5) == [3]


def payload(e: int, big: set[int]) -> bytes:
    return b"e%d-" % e + b"y" * (5000 if e in big else 40 + e % 7)


@pytest.fixture
def s(storage):  # (tests/conftest.py: a real Storage in the test's directory)
    return storage


def add(s: Storage, ids: list[int], big: set[int], per_frame: int) -> None:
    asyncio.run(admit_durably(s, [b"".join(E.encode(LID, e, payload(e, big), term=1) for e in ids[k:k + per_frame])
                                  for k in range(0, len(ids), per_frame)]))


def ids_served(recs: list[bytes]) -> list[int]:
    return [h.entry_id for h in E.iter_headers(b"".join(recs))]


@pytest.mark.parametrize("max_bytes", [1, 500, 1000, 4096, 5100, 1 << 20])
def test_the_count_is_the_records_served(s, max_bytes):
    big = {40, 41, 77}  # larger than most frames: served alone, at least one a frame
    held = [e for e in range(200) if e % 50 not in (10, 11, 12)]  # gaps
    add(s, held, big, per_frame=7)  # 7 records a journal record: a span breaks every 7
    got, nxt = [], 0
    while True:  # frame by frame, as the server's sparse read
        status, recs, through, count = s.read_sparse(LID, nxt, 220, max_bytes)
        assert status is Status.OK
        ids = ids_served(recs)
        assert count == len(ids) > 0
        assert sum(map(len, recs)) <= max_bytes or count == 1
        assert all(e <= through for e in ids)
        got += ids
        if through >= 220:
            break
        nxt = through + 1
    assert got == held
    # dense: up to the first gap, the count the ids read
    status, recs, after = s.read_range(LID, 0, 220, max_bytes)
    ids = ids_served(recs)
    assert ids == list(range(after))
    assert status is (Status.NO_SUCH_ENTRY if after == 10 else Status.OK)


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 200), min_size=1, max_size=30, unique=True).map(sorted),
       sizes=st.lists(st.integers(0, 300), min_size=30, max_size=30),
       rot=st.one_of(st.none(), st.tuples(st.integers(0, 29), st.integers(0, 10_000), st.integers(1, 255))))
def test_good_prefix_names_the_first_bad_record_by_the_index(ids, sizes, rot):
    """A range read's records, joined, checked before they are served
    (``range_read.good_prefix``): all good, the count and their end; a byte
    flipped anywhere in one record (its payload, its CRC, its length, its
    ids: the one-pass walk may go astray or name another id), the records
    before it and the id the index gives it, never one its own header
    says.  (Bytes 8-17, the request's flags and term, are no part of
    what the record is: outside its CRC, set anew by whoever sends it on.)"""
    from bookie.range_read import good_prefix

    recs = [E.encode(LID, eid, b"p%d-" % eid + b"x" * sizes[k], lac=-1, lafr=-1, term=1) for k, eid in enumerate(ids)]
    held = [(eid, 0, len(r)) for eid, r in zip(ids, recs)]   # (the location is not looked at)
    if rot is not None:
        k, bits = rot[0] % len(recs), rot[2]
        r = bytearray(recs[k])
        at = rot[1] % len(r)
        r[at] ^= bits
        recs[k] = bytes(r)
        if 8 <= at < E.CHECKSUM_START:
            rot = None
    buf = b"".join(recs)
    count, end, bad = good_prefix(buf, len(recs), LID, lambda: held)
    if rot is None:
        assert (count, end, bad) == (len(recs), len(buf), None)
    else:
        assert count == k and end == sum(len(r) for r in recs[:k])
        assert (bad.ledger_id, bad.entry_id) == (LID, ids[k])
