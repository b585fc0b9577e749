"""The run-based entry index against a dict (hypothesis), and its checkpoint form."""
from __future__ import annotations

import contextlib

import hypothesis.strategies as st
from hypothesis import given, settings

from bookie.index import LedgerIndex, pack_location, unpack_location

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 60), st.integers(0, 10**6)),
        st.tuples(st.just("trunc"), st.integers(-1, 60), st.just(0)),
        st.tuples(st.just("del"), st.integers(0, 60), st.integers(0, 15)),
    ),
    max_size=120,
)


@contextlib.contextmanager
def short_runs(n: int):
    """bookie.index.SHORT_RUN set to ``n`` (0: no run ever gapped)."""
    from bookie import index as I
    saved, I.SHORT_RUN = I.SHORT_RUN, n
    try:
        yield
    finally:
        I.SHORT_RUN = saved


def _check_shape(idx: LedgerIndex) -> None:
    """Runs keyed by their first id, spans apart and ascending, a gapped
    run's ids strictly ascending from its start, arrays of one length."""
    end = -1
    for key, run in idx._runs.items():
        assert key == run.start and run.start >= end and len(run.locs) == len(run.lens) > 0
        if run.ids is not None:
            assert len(run.ids) == len(run.locs) and run.ids[0] == run.start
            assert all(x < y for x, y in zip(run.ids, run.ids[1:]))
        end = run.end


@settings(max_examples=400, deadline=None)
@given(OPS, st.sampled_from([0, 2, 64]))
def test_index_matches_a_dict(ops, short_run):
    """Consecutive runs only (SHORT_RUN 0), and with ids past a short run's
    end joining it as a gapped run (2, and the default: every run here)."""
    with short_runs(short_run):
        _index_matches_a_dict(ops)


def _index_matches_a_dict(ops):
    idx, model = LedgerIndex(), {}
    for op, a, b in ops:
        if op == "put":
            old = idx.put(a, b, a + 1)
            assert old == ((model[a], a + 1) if a in model else None)
            model[a] = b
        elif op == "trunc":
            removed = idx.truncate_after(a)
            gone = sorted(e for e in model if e > a)
            assert sorted(loc for loc, _ in removed) == sorted(model[e] for e in gone)
            for e in gone:
                del model[e]
        else:
            removed = idx.delete_range(a, a + b)
            gone = [e for e in model if a <= e <= a + b]
            assert len(removed) == len(gone)
            for e in gone:
                del model[e]
        assert len(idx) == len(model)
        assert idx.last_entry == (max(model) if model else -1)
        assert idx.first_entry == (min(model) if model else -1)
        _check_shape(idx)
    assert [(e, loc) for e, loc, _ in idx.iter_all()] == sorted(model.items())
    for first, last in ((0, 70), (7, 33), (20, 20)):   # what range reads walk
        held = [(s + k, locs[k]) for s, locs, _ in idx.runs_from(first, last, skip_gaps=True) for k in range(len(locs))]
        assert held == sorted((e, loc) for e, loc in model.items() if first <= e <= last)
    for e in range(62):
        assert idx.get(e) == ((model[e], e + 1) if e in model else None)
    # consecutive reads stop at the first gap
    start = min(model) if model else 0
    got = [e for e, _, _ in idx.iter_from(start, 100)]
    expect = []
    while start in model:
        expect.append(start)
        start += 1
    assert got == expect
    # the checkpoint form round-trips, in one form whatever the runs' shape
    again = LedgerIndex.from_runs(idx.runs())
    assert list(again.iter_all()) == list(idx.iter_all())
    _check_shape(again)
    assert again.runs() == idx.runs() and again.runs_image() == idx.runs_image()
    assert all(len(locs) for _, locs, _ in idx.runs()) and all(  # (its runs: consecutive ids, apart)
        s1 + len(l1) // 8 < s2 for (s1, l1, _), (s2, _, _) in zip(idx.runs(), idx.runs()[1:]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=40), st.data())
def test_the_end_of_a_gapped_runs_consecutive_piece(steps, data):
    from array import array

    from bookie.index import _consecutive_end
    ids = array("q", [0])
    for d in steps:
        ids.append(ids[-1] + d)
    a = data.draw(st.integers(0, len(ids) - 1))
    b = data.draw(st.integers(a + 1, len(ids)))
    z = a + 1
    while z < b and ids[z] == ids[z - 1] + 1:
        z += 1
    assert _consecutive_end(ids, a, b) == z


def test_a_striped_bookies_share_is_one_gapped_run_of_20_bytes_an_entry_and_checkpoints_as_before():
    """A bookie of an E4 Qw2 ledger holds ids 4k+1, 4k+2: one gapped run
    (ids, locations, lengths: 20 bytes an entry), where consecutive runs
    were a run per two ids; its checkpoint image is the consecutive runs'
    image, byte for byte, and loads as one gapped run again."""
    import tracemalloc

    def share(n):
        idx = LedgerIndex()
        for e in range(n):
            if e % 4 in (1, 2):
                idx.put(e, pack_location(1, e * 1100), 1100)
        return idx

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        idx = share(200_000)
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(idx._runs) == 1 and len(idx) == 100_000 and used / len(idx) < 24
    with short_runs(0):
        plain = share(200_000)
    assert len(plain._runs) == 50_000   # (the shape before: a run per Qw ids)
    assert idx.runs_image() == plain.runs_image() == (50_000, plain.runs_image()[1])
    again = LedgerIndex.from_runs(plain.runs())
    assert len(again._runs) == 1 and list(again.iter_all()) == list(idx.iter_all())
    assert idx.get(4 * 777 + 2) == (pack_location(1, (4 * 777 + 2) * 1100), 1100) and idx.get(4 * 777 + 3) is None
    # an image whose runs meet (not written by runs_image, which merges them) loads whole too
    from array import array
    met = LedgerIndex.from_runs([(s, array("Q", [s] * n).tobytes(), array("I", [1] * n).tobytes())
                                 for s, n in ((0, 1), (5, 1), (6, 2), (100, 1))])
    _check_shape(met)
    assert [e for e, _, _ in met.iter_all()] == [0, 5, 6, 7, 100] and met.get(7) == (6, 1)


def test_sequential_entries_form_one_run_of_12_bytes_each():
    idx = LedgerIndex()
    for e in range(10_000):
        idx.put(e, pack_location(3, e * 100), 100)
    runs = idx.runs()
    assert len(runs) == 1
    assert len(runs[0][1]) + len(runs[0][2]) == 12 * 10_000
    assert unpack_location(idx.get(9_999)[0]) == (3, 999_900)


def test_filling_a_gap_merges_runs():
    idx = LedgerIndex()
    for e in (0, 1, 3, 4):
        idx.put(e, e, 1)
    assert len(idx.runs()) == 2
    idx.put(2, 2, 1)
    assert len(idx.runs()) == 1 and [e for e, _, _ in idx.iter_from(0, 10)] == [0, 1, 2, 3, 4]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 12)), max_size=12))
def test_put_run_is_put_entry_by_entry(runs):
    """Runs of consecutive puts (appends after the last run, overwrites,
    gaps) leave the same index and report the same replaced locations."""
    from array import array
    a, b = LedgerIndex(), LedgerIndex()
    loc = 0
    for first, n in runs:
        locs = array("Q", range(loc, loc + n))
        lens = array("I", [loc % 7 + 1] * n)
        loc += n
        want = [old for k in range(n) if (old := a.put(first + k, locs[k], lens[k])) is not None]
        assert b.put_run(first, locs, lens) == want
        assert len(a) == len(b)
        assert list(a.iter_from(0, 100)) == list(b.iter_from(0, 100))
        assert [e in a for e in range(50)] == [e in b for e in range(50)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)), max_size=10), st.integers(0, 45),
       st.integers(0, 50))
def test_runs_from_slices_what_the_index_holds(puts, first, last):
    from array import array
    ix = LedgerIndex()
    for start, n in puts:
        ix.put_run(start, array("Q", range(start * 10, start * 10 + n)), array("I", [7] * n))
    flat = [(s + k, locs[k], lens[k]) for s, locs, lens in ix.runs_from(first, last) for k in range(len(locs))]
    assert flat == list(ix.iter_from(first, last))
    held = [(s + k, locs[k], lens[k]) for s, locs, lens in ix.runs_from(first, last, skip_gaps=True)
            for k in range(len(locs))]
    assert held == [(e, loc, ln) for e, loc, ln in ix.iter_all() if first <= e <= last]


def _python_breaks(locs, lens, first: int) -> list[int]:
    return [k for k in range(max(first, 1), len(locs)) if locs[k] != locs[k - 1] + lens[k - 1]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 0, 0, 1, 2]), st.integers(1, 5000)), max_size=60), st.integers(0, 70),
       st.integers(0, 70))
def test_a_runs_breaks_are_where_its_records_stop_following_each_other(steps, first, grown):
    """``Run.breaks_after`` (in C where bookie._spans was built) against the
    rule written out: found for the whole run, kept as it grows, and found
    again from a changed position."""
    from array import array

    from bookie.index import Run, spans_c
    locs, lens, loc = array("Q"), array("I"), pack_location(3, 0)
    for kind, n in steps:   # 0: the next record follows; 1: a gap; 2: backwards
        loc = {0: loc, 1: loc + n, 2: max(0, loc - n)}[kind]
        locs.append(loc)
        lens.append(n)
        loc += n
    run = Run(0, locs, lens)
    breaks, i = run.breaks_after(first)
    want = _python_breaks(locs, lens, 0)
    assert list(breaks) == want and i == sum(1 for k in want if k <= first)
    if spans_c is not None:
        from array import array as arr
        got = arr("I")
        got.frombytes(spans_c.run_breaks(locs, lens, first))
        assert list(got) == _python_breaks(locs, lens, first)
    for _ in range(grown % 7):   # appends, then a change in the middle
        run.locs.append(loc + 3)
        run.lens.append(9)
        loc += 12
    assert list(run.breaks_after(0)[0]) == _python_breaks(run.locs, run.lens, 0)
    if len(run.locs) > 2:
        k = grown % len(run.locs)
        run.locs[k] = pack_location(4, k)
        run.changed(k)
        assert list(run.breaks_after(0)[0]) == _python_breaks(run.locs, run.lens, 0)


def test_run_breaks_refuses_what_is_not_a_run():
    from array import array

    import pytest

    from bookie.index import spans_c
    if spans_c is None:
        pytest.skip("bookie._spans not built")
    with pytest.raises(TypeError):
        spans_c.run_breaks(array("I", [1]), array("I", [1]), 0)
    with pytest.raises(ValueError):
        spans_c.run_breaks(array("Q", [1, 2]), array("I", [1]), 0)
    assert spans_c.run_breaks(array("Q"), array("I"), 0) == b""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(1, 40), st.integers(0, 2**40), st.integers(1, 2**32 - 1)),
                max_size=20))
def test_the_runs_image_is_the_checkpoints_form_of_the_runs(puts):
    """Per run: start (u64) and count (u32) little-endian, then its
    locations and lengths (bookie/index.py RUN_HEAD), in C or not."""
    import struct

    from bookie import index as I
    idx = LedgerIndex()
    for first, count, loc, ln in puts:   # (runs of consecutive ids, overlapping or not)
        for e in range(first, first + count):
            idx.put(e, loc + e, ln)
    want = b"".join(struct.pack("<QI", start, len(lens) // 4) + locs + lens for start, locs, lens in idx.runs())
    assert idx.runs_image() == (len(idx.runs()), want)
    native, I.spans_c = I.spans_c, None
    try:
        assert idx.runs_image() == (len(idx.runs()), want)
    finally:
        I.spans_c = native


def test_runs_image_refuses_what_is_not_a_run():
    from array import array

    import pytest

    from bookie.index import spans_c
    if spans_c is None:
        pytest.skip("bookie._spans not built")
    assert spans_c.runs_image([(2**63 - 1, array("Q", [5]), array("I", [6]))]) == (
        b"\xff" * 7 + b"\x7f" + b"\1\0\0\0" + b"\5" + b"\0" * 7 + b"\6\0\0\0")
    with pytest.raises(ValueError):
        spans_c.runs_image([(0, array("Q", [1, 2]), array("I", [1]))])
    with pytest.raises(ValueError):
        spans_c.runs_image([(-1, array("Q", [1]), array("I", [1]))])   # (an entry id)
    with pytest.raises(OverflowError):
        spans_c.runs_image([(2**63, array("Q", [1]), array("I", [1]))])
    with pytest.raises(TypeError):
        spans_c.runs_image([(0, array("I", [1]), array("I", [1]))])
    with pytest.raises(TypeError):
        spans_c.runs_image(5)
