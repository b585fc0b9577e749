"""A striped bookie's range read from its stripe view (bookie/striped_read.py)
on the real Storage (a journal on disk): the records and the `through` are
the run walk's, frame by frame, for every filter and frame size; the view is
used once the index holds still, follows appends at the end, and is dropped
when the index changes otherwise (a gap filled, a range deleted)."""
from __future__ import annotations

import asyncio
import bisect
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import entry as E
from bookie import striped_read
from bookie.core import Status
from bookie.storage import Storage, StorageConfig
from tests.storage_support import admit_durably

LID = 7


def payload(e: int) -> bytes:
    return b"e%d-" % e + b"x" * (e * 37 % 1500)


async def add(s: Storage, ids: list[int]) -> None:
    await admit_durably(s, [b"".join(E.encode(LID, e, payload(e), term=1) for e in ids[k:k + 64])
                            for k in range(0, len(ids), 64)])


def ids_of(recs: list[bytes]) -> list[int]:
    out = []
    for run in E.scan_runs(b"".join(recs)):
        out.extend(range(run.first_entry, run.first_entry + len(run.offsets)))
    return out


def by_run_walk(s: Storage, first: int, last: int, max_bytes: int, stripe: int, residues: int):
    """What read_sparse answered before the view: the run walk."""
    st = s.core.ledgers[LID]
    out, nxt, full, count = striped_read.read_runs(st.index.runs_from(first, last, skip_gaps=True), max_bytes,
                                                   stripe, residues, s._read_at, striped_read.GAP_BYTES)
    assert count == len(ids_of(out))
    return out, nxt - 1 if full else last


def read_all(s: Storage, first: int, last: int, max_bytes: int, stripe: int, residues: int) -> list[int]:
    """Frame by frame as the server does; each frame checked against the run
    walk: the same frame, or (a view's window ended first) a frame ending at
    the window's end with every record the run walk has up to there."""
    got, nxt = [], first
    while True:
        status, recs, through, count = s.read_sparse(LID, nxt, last, max_bytes, stripe, residues)
        assert status is Status.OK and count == len(ids_of(recs)) and nxt <= through <= last
        ref_recs, ref_through = by_run_walk(s, nxt, last, max_bytes, stripe, residues)
        if through < ref_through:
            view = s.core.ledgers[LID].index._views[(stripe, residues)]
            assert through == view.hi - 1
            ref_recs, ref_through = by_run_walk(s, nxt, through, max_bytes, stripe, residues)
        assert (b"".join(recs), through) == (b"".join(ref_recs), ref_through)
        got.extend(ids_of(recs))
        if through >= last:
            return got
        nxt = through + 1


@pytest.fixture
def s(storage):  # (tests/conftest.py: a real Storage in the test's directory)
    return storage


def held_by(e: int, qw: int, n: int, bookie: int = 0) -> bool:
    return (e - bookie) % n < qw


@pytest.mark.parametrize("native", [True, False] if striped_read.spans_c is not None else [False])
@pytest.mark.parametrize("gap", [0, 700, striped_read.GAP_BYTES])
@pytest.mark.parametrize("n,qw", [(4, 2), (5, 3), (3, 1)])
def test_the_view_answers_as_the_run_walk_for_every_filter(tmp_path, n, qw, gap, native, monkeypatch):
    """Whatever the gap a span may bridge (0: a span per run of records
    adjacent on disk), and across journal segments (of 256 KiB here: a
    span never crosses one); the view built and its pieces cut in C
    (bookie/_spans.c) or in Python."""
    monkeypatch.setattr(striped_read, "GAP_BYTES", gap)
    if not native:
        monkeypatch.setattr(striped_read, "spans_c", None)
    s = Storage(tmp_path / "b", StorageConfig(segment_size=256 << 10))
    s.open()
    held = [e for e in range(3000) if held_by(e, qw, n)]
    asyncio.run(add(s, held))
    assert len(s.journal.segments()) > 2
    spans = set()
    for residues in range(1, 1 << n):
        for first, last, max_bytes in [(0, 2999, 1 << 20), (0, 2999, 20_000), (17, 2411, 5_000),
                                       (1000, 1003, 1), (2990, 5000, 1 << 16)]:
            want = [e for e in held if first <= e <= last and residues >> (e % n) & 1]
            st = s.core.ledgers[LID]
            st.index._views.clear()
            st.index._spare.clear()
            assert read_all(s, first, last, max_bytes, n, residues) == want
            assert read_all(s, first, last, max_bytes, n, residues) == want
            assert (n, residues) in st.index._views  # asked twice, index unchanged: the view served
            spans.add(len(st.index._views[(n, residues)].breaks))
    s.close()
    assert max(spans) > 1   # (some filter's view preads in several spans)


def test_the_view_follows_appends_and_is_dropped_on_other_changes(s):
    held = [e for e in range(2000) if held_by(e, 2, 4)]
    asyncio.run(add(s, held))
    idx = s.core.ledgers[LID].index
    wanted = lambda ids, a, b: [e for e in ids if a <= e <= b and e % 4 == 0]  # noqa: E731
    assert read_all(s, 0, 9999, 1 << 20, 4, 0b0001) == wanted(held, 0, 9999)
    assert read_all(s, 0, 9999, 1 << 20, 4, 0b0001) == wanted(held, 0, 9999)
    view = idx._views[(4, 0b0001)]
    # appends at the end: the same view, kept current
    more = [e for e in range(2000, 2400) if held_by(e, 2, 4)]
    asyncio.run(add(s, more))
    assert idx.stripe_view(4, 0b0001, 0) is view
    held += more
    assert read_all(s, 0, 9999, 1 << 20, 4, 0b0001) == wanted(held, 0, 9999)
    # an id below the end (a gap filled, as a re-replication would): the view is dropped
    asyncio.run(add(s, [2]))
    held = sorted(held + [2])
    assert 2 in read_all(s, 0, 9999, 1 << 20, 4, 0b0101)
    assert read_all(s, 0, 9999, 1 << 20, 4, 0b0001) == wanted(held, 0, 9999)
    assert idx.stripe_view(4, 0b0001, 0) is not view
    # a range deleted: nothing of it comes back
    status, _ = asyncio.run(s.delete(LID, (100, 799)))
    assert status is Status.OK
    held = [e for e in held if not 100 <= e <= 799]
    assert read_all(s, 0, 9999, 1 << 20, 4, 0b0001) == wanted(held, 0, 9999)
    assert read_all(s, 0, 9999, 1 << 20, 4, 0b0001) == wanted(held, 0, 9999)


def test_a_ledger_changing_between_reads_keeps_the_run_walk(s):
    """A tail reader of a ledger being written: never a build per frame."""
    held = [e for e in range(400) if held_by(e, 2, 4)]
    asyncio.run(add(s, held))
    idx = s.core.ledgers[LID].index
    for k in range(400, 2000, 100):
        assert s.read_sparse(LID, 0, 9999, 1 << 20, 4, 0b0001)[0] is Status.OK
        asyncio.run(add(s, [e for e in range(k, k + 100) if held_by(e, 2, 4)]))
    assert not idx._views


def test_the_views_of_a_bookie_stay_within_their_budget(s):
    """Counted in bytes (28 per id, 8 per seam and break): two views of one
    residue (500 ids and about 500 seams each, about 18 kB) fit in 40 kB,
    a third of both residues (1,000 ids, about 28 kB) sends both away."""
    held = [e for e in range(2000) if held_by(e, 2, 4)]   # 1,000 ids: 500 in each residue 0, 1
    asyncio.run(add(s, held))
    idx = s.core.ledgers[LID].index
    s.stripe_views.max_bytes = 40_000
    for residues in (0b0001, 0b0010, 0b0011):
        want = [e for e in held if residues >> (e % 4) & 1]
        assert read_all(s, 0, 9999, 1 << 20, 4, residues) == want
        assert read_all(s, 0, 9999, 1 << 20, 4, residues) == want
        assert (4, residues) in idx._views                # the one just used is kept
        assert s.stripe_views.held <= 40_000 or len(idx._views) == 1
        if residues == 0b0010:
            assert (4, 0b0001) in idx._views              # two of one residue fit
    assert set(idx._views) == {(4, 0b0011)}               # the least recently used went
    assert sum(v.nbytes for v in idx._views.values()) == s.stripe_views.held
    assert read_all(s, 0, 9999, 1 << 20, 4, 0b0001) == [e for e in held if e % 4 == 0]


def _python_fill(stripe: int, residues: int, runs, gap: int, lo: int = 0,
                 max_ids: int = -1) -> tuple[striped_read.StripeView, int]:
    view = striped_read.StripeView(stripe, residues, lo)
    view.gap_bytes = gap
    return view, view._fill_py(runs, max_ids)


def _arrays(view):
    return [list(a) for a in (view.ids, view.locs, view.lens, view.ends, view.seams, view.breaks)]


_move = st.one_of(st.integers(0, 6000), st.sampled_from([699, 700, 701, 4095, 4096, 4097]))
_run_shape = st.tuples(st.integers(1, 9), st.integers(0, 7),   # ids in the run, ids skipped before it
                       st.lists(st.tuples(st.integers(0, 3), _move), min_size=9, max_size=9))


@pytest.mark.skipif(striped_read.spans_c is None, reason="bookie._spans not built")
@settings(max_examples=400, deadline=None)
@given(st.integers(0, 40), st.lists(_run_shape, max_size=30), st.integers(1, 6), st.data(),
       st.sampled_from([0, 700, striped_read.GAP_BYTES]))
def test_the_c_build_of_a_view_is_the_python_build(first, shapes, stripe, data, gap):
    """Runs of ids with gaps between them; records adjacent on disk, apart
    by a little, apart past the gap, backwards, or in the next segment."""
    from array import array

    from bookie.index import OFFSET_BITS, Run
    residues = data.draw(st.integers(1, (1 << stripe) - 1))
    runs, eid, loc = [], first, 5 << OFFSET_BITS
    for count, skipped, moves in shapes:
        eid += skipped
        locs, lens = array("Q"), array("I")
        for kind, n in moves[:count]:
            ln = 60 + n % 3000
            loc = {0: loc, 1: loc + n, 2: max(0, loc - n), 3: (loc >> OFFSET_BITS) + 1 << OFFSET_BITS}[kind]
            locs.append(loc)
            lens.append(ln)
            loc += ln
        runs.append(Run(eid, locs, lens))
        eid += count
    view = striped_read.StripeView(stripe, residues)
    view.gap_bytes = gap
    assert view.fill(runs) == -1
    want = _arrays(_python_fill(stripe, residues, runs, gap)[0])
    assert _arrays(view) == want
    # and built in two goes: the runs up to a cut, then the rest (as appends extend it), as tuples
    cut = data.draw(st.integers(0, len(runs)))
    view = striped_read.StripeView(stripe, residues)
    view.gap_bytes = gap
    view.fill(runs[:cut])
    for run in runs[cut:]:
        view.extend(run.start, run.locs, run.lens)
    assert _arrays(view) == want
    # a window: from an id `lo` on, at most `max_ids` ids walked
    lo = data.draw(st.integers(0, eid + 2))
    max_ids = data.draw(st.integers(-1, 60))
    view = striped_read.StripeView(stripe, residues, lo)
    view.gap_bytes = gap
    stop = view.fill(runs, max_ids)
    ref, ref_stop = _python_fill(stripe, residues, runs, gap, lo, max_ids)
    assert (_arrays(view), stop) == (_arrays(ref), ref_stop)
    held = [r.start + j for r in runs for j in range(len(r.locs)) if r.start + j >= lo]
    assert stop == (held[max_ids] if 0 <= max_ids < len(held) else -1)
    assert list(view.ids) == [e for e in held[:None if max_ids < 0 else max_ids] if residues >> e % stripe & 1]
    # the same ids in gapped runs (bookie/index.py: a run listing its ids), joined at random: in C and in Python
    joined, k = [], 0
    while k < len(runs):
        z = data.draw(st.integers(k + 1, len(runs)))
        part = runs[k:z]
        joined.append(Run(part[0].start, array("Q", [x for r in part for x in r.locs]),
                          array("I", [x for r in part for x in r.lens]),
                          array("q", [r.start + j for r in part for j in range(len(r.locs))])))
        k = z
    for build in ("fill", "_fill_py"):
        view = striped_read.StripeView(stripe, residues)
        view.gap_bytes = gap
        assert getattr(view, build)(joined, -1) == -1 and _arrays(view) == want
        view = striped_read.StripeView(stripe, residues, lo)
        view.gap_bytes = gap
        assert getattr(view, build)(joined, max_ids) == ref_stop and _arrays(view) == _arrays(ref)


@pytest.mark.skipif(striped_read.spans_c is None, reason="bookie._spans not built")
def test_the_c_build_refuses_what_is_not_a_run():
    from array import array

    from bookie.index import Run

    def fill(runs, stripe, want, count=0):
        return striped_read.spans_c.stripe_fill(runs, stripe, want, 0, count, 0, 0, 0, -1)
    good = Run(0, array("Q", [1, 2]), array("I", [1, 1]))
    assert fill([good], 2, b"\1\0")[0] == array("q", [0]).tobytes()
    assert fill([(0, good.locs, good.lens)], 2, b"\1\0")[0] == array("q", [0]).tobytes()
    with pytest.raises(ValueError):
        fill([good], 3, b"\1\0")       # a flag per residue
    with pytest.raises(ValueError):
        fill([good], 2, b"\1\0", -1)   # a count below 0
    with pytest.raises(TypeError):
        fill([Run(0, array("I", [1]), array("I", [1]))], 1, b"\1")   # locations of 8 bytes
    with pytest.raises(TypeError):
        fill([(0, array("Q", [1]), array("Q", [1]))], 1, b"\1")      # lengths of 4
    with pytest.raises(TypeError):
        fill([(0, (1,), (1,))], 1, b"\1")                            # arrays, not tuples
    with pytest.raises(ValueError):
        fill([Run(0, array("Q", [1, 2]), array("I", [1]))], 1, b"\1")
    with pytest.raises(ValueError):
        fill([(0, good.locs)], 1, b"\1")
    with pytest.raises(AttributeError):
        fill([object()], 1, b"\1")
    with pytest.raises(TypeError):
        fill([("0", good.locs, good.lens)], 1, b"\1")
    with pytest.raises(AttributeError):   # (a Run whose slots were never set)
        fill([Run.__new__(Run)], 1, b"\1")

    class Sub(Run):   # (a subclass: its attributes looked up, not its parent's slots read)
        __slots__ = ("locs",)
    sub = Sub(0, array("Q", [1, 2]), array("I", [1, 1]))
    assert fill([sub], 2, b"\1\0") == fill([good], 2, b"\1\0")
    runs = {0: good, 4: Run(4, array("Q", [9]), array("I", [3]))}
    assert fill(iter(runs.values()), 2, b"\1\1") == fill(list(runs.values()), 2, b"\1\1")   # any iterable
    via_keys = striped_read.spans_c.stripe_fill(iter([0, 4]), 2, b"\1\1", 0, 0, 0, 0, 0, -1, runs)
    assert via_keys == fill(list(runs.values()), 2, b"\1\1")
    with pytest.raises(KeyError):
        striped_read.spans_c.stripe_fill([0, 5], 2, b"\1\1", 0, 0, 0, 0, 0, -1, runs)
    with pytest.raises(TypeError):
        striped_read.spans_c.stripe_fill([0], 2, b"\1\1", 0, 0, 0, 0, 0, -1, list(runs.values()))
    with pytest.raises(TypeError):
        fill(5, 1, b"\1")   # (not iterable)
    gapped = Run(0, array("Q", [1, 2]), array("I", [1, 1]), array("q", [0, 3]))
    assert fill([gapped], 1, b"\1")[0] == array("q", [0, 3]).tobytes()
    assert fill([(0, gapped.locs, gapped.lens, gapped.ids)], 1, b"\1") == fill([gapped], 1, b"\1")
    with pytest.raises(ValueError):
        fill([Run(0, array("Q", [1, 2]), array("I", [1, 1]), array("q", [0]))], 1, b"\1")   # an id per location
    with pytest.raises(TypeError):
        fill([(0, gapped.locs, gapped.lens, array("I", [0, 3]))], 1, b"\1")   # ids of 8 bytes
    images = striped_read.spans_c.gapped_image
    assert images(array("q", [4, 5, 9]), array("Q", [1, 2, 3]), array("I", [7, 8, 9])) == (
        2, b"".join(struct.pack("<QI", s, n) for s, n in ((4, 2),))
        + array("Q", [1, 2]).tobytes() + array("I", [7, 8]).tobytes()
        + struct.pack("<QI", 9, 1) + array("Q", [3]).tobytes() + array("I", [9]).tobytes())
    for bad in ((array("q", [4, 4]), array("Q", [1, 2]), array("I", [7, 8])),   # not ascending
                (array("q", [-1]), array("Q", [1]), array("I", [7])),           # not an entry id
                (array("q", [4]), array("Q", [1, 2]), array("I", [7]))):        # lengths differ
        with pytest.raises(ValueError):
            images(*bad)
    with pytest.raises(ValueError):   # (its image is its pieces')
        striped_read.spans_c.runs_image([gapped])


def _python_pieces(locs, lens, seams, a: int, b: int, s0: int) -> tuple[list[int], list[int]]:
    """read_view's pieces of records a..b-1 in Python (where bookie._spans was not built)."""
    firsts = [a, *seams[bisect.bisect_right(seams, a):bisect.bisect_left(seams, b)]]
    lasts = [f - 1 for f in firsts[1:]] + [b - 1]
    return [locs[f] - s0 for f in firsts], [locs[z] + lens[z] - s0 for z in lasts]


@pytest.mark.skipif(striped_read.spans_c is None, reason="bookie._spans not built")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.sampled_from([0, 0, 0, 1, 57, 4000])), min_size=1, max_size=60),
       st.data())
def test_the_c_pieces_of_a_span_are_the_python_pieces(records, data):
    """A short arc's span (records with gaps between some): its pieces'
    bounds (``piece_bounds``), and their bytes packed from a file
    (``gather``, the read port) or from the span's bytes (``cut``), are
    what read_view computed in Python and slices out."""
    import os
    import tempfile
    from array import array
    c = striped_read.spans_c
    locs, lens, seams, loc = array("Q"), array("I"), array("q"), 11
    for k, (ln, gap) in enumerate(records):
        loc += gap
        if k and gap:
            seams.append(k)
        locs.append(loc)
        lens.append(ln)
        loc += ln
    a = data.draw(st.integers(0, len(locs) - 1))
    b = data.draw(st.integers(a + 1, len(locs)))
    s0, end = locs[a], locs[b - 1] + lens[b - 1]
    lo, hi = bisect.bisect_right(seams, a), bisect.bisect_left(seams, b)
    starts, stops, total = c.piece_bounds(locs, lens, seams, lo, hi, a, b, s0)
    ref = _python_pieces(locs, lens, seams, a, b, s0)
    assert (list(array("q", starts)), list(array("q", stops))) == ref
    assert total == sum(lens[a:b])
    content = os.urandom(loc + 7)
    want = b"".join(content[s0 + x:s0 + y] for x, y in zip(*ref))
    starts, stops = array("q", starts), array("q", stops)
    assert c.cut(content[s0:end], starts, stops) == want
    with tempfile.TemporaryFile() as f:
        f.write(content)
        f.flush()
        assert c.gather(f.fileno(), s0, end - s0, starts, stops, 3) == want
        with pytest.raises(OSError, match="short read in segment 3"):   # (the file ends first)
            c.gather(f.fileno(), len(content) - (end - s0) + 1, end - s0, starts, stops, 3)


@pytest.mark.skipif(striped_read.spans_c is None, reason="bookie._spans not built")
def test_the_c_pieces_refuse_what_is_not_a_span():
    from array import array
    c = striped_read.spans_c
    locs, lens = array("Q", [0, 10, 30]), array("I", [10, 10, 5])
    assert c.piece_bounds(locs, lens, array("q", [2]), 0, 1, 0, 3, 0)[2] == 25
    for seams, lo, hi, a, b in [([2], 0, 1, 0, 4),    # past the records
                                ([2], 0, 2, 0, 3),    # past the seams
                                ([0], 0, 1, 0, 3),    # a seam at a: not inside
                                ([2, 1], 0, 2, 0, 3),  # not ascending
                                ([2], 0, 1, 2, 2)]:   # no record
        with pytest.raises(ValueError):
            c.piece_bounds(locs, lens, array("q", seams), lo, hi, a, b, 0)
    with pytest.raises(ValueError):   # (s0 after the first piece)
        c.piece_bounds(locs, lens, array("q", [2]), 0, 1, 0, 3, 5)
    with pytest.raises(TypeError):   # (lengths of 4 bytes)
        c.piece_bounds(locs, array("Q", [10, 10, 5]), array("q", [2]), 0, 1, 0, 3, 0)
    span = bytes(range(40))
    for starts, stops in [([0, 5], [6, 9]),     # overlapping
                          ([5, 0], [6, 1]),     # not ascending
                          ([0], [41]),          # past the span
                          ([3], [2])]:          # ending before it begins
        with pytest.raises(ValueError):
            c.cut(span, array("q", starts), array("q", stops))
    with pytest.raises(ValueError):
        c.cut(span, array("q", [0]), array("q", [1, 2]))   # as many starts as stops
    with pytest.raises(TypeError):
        c.cut(span, [0], [1])                               # arrays of int64, not lists
    with pytest.raises(ValueError):
        c.gather(0, -1, 5, array("q"), array("q"), 0)


@pytest.mark.parametrize("qw", [2, 1])   # (Qw 1: runs of one id, a window ends between runs)
@pytest.mark.parametrize("window", [1, 7, 300])
def test_a_view_covers_a_window_and_a_read_past_it_builds_the_next(s, monkeypatch, window, qw):
    """Windows of `stripe_view_window_ids` of the index's ids from the first id read:
    frames stop at a window's end (read_all checks each against the run
    walk), a read's last window is open to the end, appends reach only the one
    open to the end, and a view never holds more than its window."""
    s.config.stripe_view_window_ids = window   # (bookie --stripe-view-window-ids)
    held = [e for e in range(2000) if held_by(e, qw, 4)]
    asyncio.run(add(s, held))
    idx = s.core.ledgers[LID].index
    seen = []
    real = striped_read.read_view

    def spy(view, *a):
        seen.append(view)
        return real(view, *a)
    monkeypatch.setattr(striped_read, "read_view", spy)
    for first in (0, 555):
        for _ in range(2):
            assert read_all(s, first, 9999, 3_000, 4, 0b0011) == [e for e in held if e >= first]
    assert seen and all(sum(1 for e in held if v.lo <= e < (v.hi or 1 << 60)) <= window for v in seen)
    assert len({(v.lo, v.hi) for v in seen}) > 2 and {v.hi is None for v in seen} == {True, False}
    last = idx._views[(4, 0b0011)]
    assert last.hi is None   # (the last window read is open to the end)
    more = [e for e in range(2000, 2100) if held_by(e, qw, 4)]
    held_before = len(last.ids)
    asyncio.run(add(s, more))
    assert idx.stripe_view(4, 0b0011, last.lo, window) is last
    if held_before + len(more) <= window:   # taken by the open window
        assert list(last.ids)[-len(more):] == more and last.hi is None
    else:                                     # or it closes below them (each frame of appends: up to 64 ids)
        assert last.hi is not None and len(last.ids) <= window and last.hi <= more[-1]
        assert [e for e in list(last.ids) if e >= 2000] == [e for e in more if e < last.hi]
    assert read_all(s, 0, 9999, 3_000, 4, 0b0011) == held + more
    if window < 100:  # a read that ends in a closed window: appends leave that one as it was
        read_all(s, 0, 100, 3_000, 4, 0b0011)
        closed = idx._views[(4, 0b0011)]
        ids = list(closed.ids)
        assert closed.hi is not None and ids
        asyncio.run(add(s, [e for e in range(2100, 2200) if held_by(e, qw, 4)]))
        assert idx.stripe_view(4, 0b0011, ids[0], window) is closed and list(closed.ids) == ids


def test_single_puts_at_the_end_extend_an_open_view():
    """``LedgerIndex.put`` (one id: at the end of the last run, or a new
    run past it) hands the view its ids as tuples."""
    from bookie.index import LedgerIndex, pack_location
    idx = LedgerIndex()
    for e in range(400):
        if held_by(e, 2, 4):
            idx.put(e, pack_location(1, e * 100), 100)
    assert idx.stripe_view(4, 0b0011, 0) is None   # (asked once)
    view = idx.stripe_view(4, 0b0011, 0)
    idx.put(400, pack_location(1, 40_000), 100)    # a new run past the end
    idx.put(401, pack_location(1, 40_100), 100)    # at the end of the last run
    assert idx.stripe_view(4, 0b0011, 0) is view and list(view.ids)[-3:] == [397, 400, 401]
    assert list(view.ends)[-1] == 100 * len(view.ids)


def test_filters_asked_in_turn_each_get_a_view_and_a_far_window_outlives_appends():
    """A bookie asked for two filters in turn (a striped reader's arcs turn
    by block) builds each on its second ask; a window far below the end is
    built though the ledger was appended to between the asks (it cannot be
    changed by appends), one reaching the end is not (a tail reader)."""
    from bookie.index import LedgerIndex, pack_location
    idx = LedgerIndex()
    for e in range(4000):
        if held_by(e, 3, 5, bookie=4):
            idx.put(e, pack_location(1, e * 100), 100)
    a, b = 0b10001, 0b10011   # (it holds residues 4, 0, 1)
    assert idx.stripe_view(5, a, 0) is None and idx.stripe_view(5, b, 0) is None
    va, vb = idx.stripe_view(5, a, 0), idx.stripe_view(5, b, 0)
    assert va is not None and vb is not None and idx.stripe_view(5, a, 0) is va
    assert set(e % 5 for e in va.ids) == {4, 0} and set(e % 5 for e in vb.ids) == {4, 0, 1}

    small = LedgerIndex()
    end = 0
    for end in range(0, 4000, 5):
        small.put_run(end, array("Q", [end * 100, end * 100 + 100]), array("I", [100, 100]))
    old, striped_read.VIEW_WINDOW_IDS = striped_read.VIEW_WINDOW_IDS, 100   # (800 runs of 2 ids)
    try:
        for first in (0, 3990):
            got = []
            for _ in range(2):   # appends before each ask
                small.put_run(end + 5, array("Q", [0, 100]), array("I", [100, 100]))
                end += 5
                got.append(small.stripe_view(5, 0b00011, first))
            assert got[0] is None
            if first == 0:   # far below the end: built at the second ask
                assert got[1] is not None and got[1].hi is not None and len(got[1].ids) == 100
            else:            # its window would reach the end: none
                assert got[1] is None
    finally:
        striped_read.VIEW_WINDOW_IDS = old


def test_a_far_window_is_not_built_when_the_ledger_changed_otherwise_since_the_ask():
    """A gap filled or a range deleted between the two asks: the run walk."""
    from bookie.index import LedgerIndex, pack_location
    old, striped_read.VIEW_WINDOW_IDS = striped_read.VIEW_WINDOW_IDS, 100
    try:
        for change in ("put", "delete"):
            idx = LedgerIndex()
            for e in range(0, 4000, 5):
                idx.put_run(e, array("Q", [e * 100, e * 100 + 100]), array("I", [100, 100]))
            assert idx.stripe_view(5, 0b00011, 0) is None
            if change == "put":
                idx.put(2, pack_location(1, 7), 100)
            else:
                idx.delete_range(3000, 3004)
            assert idx.stripe_view(5, 0b00011, 0) is None   # (changed since: asked once again)
            assert idx.stripe_view(5, 0b00011, 0) is not None
    finally:
        striped_read.VIEW_WINDOW_IDS = old


def test_a_window_of_no_id_is_refused():
    from bookie.storage import StorageConfig
    with pytest.raises(ValueError):
        StorageConfig(stripe_view_window_ids=0)


def test_an_open_window_takes_appends_until_it_holds_its_window_then_closes_below_them():
    from bookie.index import LedgerIndex, pack_location
    idx = LedgerIndex()
    for e in range(0, 12, 4):   # ids 0, 1, 4, 5, 8, 9
        idx.put_run(e, array("Q", [e * 100, e * 100 + 100]), array("I", [100, 100]))
    assert idx.stripe_view(4, 0b0011, 0, 10) is None
    view = idx.stripe_view(4, 0b0011, 0, 10)
    assert view.hi is None and list(view.ids) == [0, 1, 4, 5, 8, 9]
    idx.put_run(12, array("Q", [1200, 1300]), array("I", [100, 100]))
    assert view.hi is None and list(view.ids)[-2:] == [12, 13]          # 8 ids: taken
    idx.put_run(16, array("Q", [1600, 1700]), array("I", [100, 100]))
    assert view.hi is None and len(view.ids) == 10                       # 10: still taken
    idx.put(20, pack_location(0, 2000), 100)
    assert view.hi == 20 and len(view.ids) == 10                         # past its window: closed below 20
    assert idx.stripe_view(4, 0b0011, 0, 10) is view and not view.covers(20)


@pytest.mark.parametrize("spares", [striped_read.SPARE_VIEWS, 0])
def test_reads_of_one_filter_at_different_places_keep_their_windows(s, monkeypatch, spares):
    """Three reads of one filter in flight at once, far apart (a reader's
    read-ahead chunks), their frames served in turn: each window is built
    once, where with one view a filter they rebuilt each other's at every
    frame.  (``spares`` 0: the count of the old way, which the first must beat.)"""
    monkeypatch.setattr(striped_read, "SPARE_VIEWS", spares)
    s.config.stripe_view_window_ids = 60
    held = [e for e in range(3000) if held_by(e, 2, 4)]
    asyncio.run(add(s, held))
    builds = []
    real = striped_read.StripeView.fill

    def spy(view, *a, **kw):
        builds.append(view.lo)
        return real(view, *a, **kw)
    monkeypatch.setattr(striped_read.StripeView, "fill", spy)
    reads = {start: start for start in (0, 1000, 2000)}   # each read's next id; it ends at start + 799
    got = {start: [] for start in reads}
    while reads:
        for start in list(reads):
            nxt, last = reads[start], start + 799
            status, recs, through, _ = s.read_sparse(LID, nxt, last, 2_000, 4, 0b0011)
            assert status is Status.OK
            got[start].extend(ids_of(recs))
            if through >= last:
                del reads[start]
            else:
                reads[start] = through + 1
    for start, ids in got.items():
        assert ids == [e for e in held if start <= e <= start + 799 and e % 4 in (0, 1)]
    needed = sum(-(-len(ids) // 60) for ids in got.values())   # windows of 60 ids over each read
    if spares:
        assert len(builds) <= needed + 1   # each built once (+1: the filter's first frame took the run walk)
    else:
        assert len(builds) > 5 * needed    # rebuilt at nearly every frame
