"""Read planning (stream/read_plan.py), pure: every id of a range asked of
exactly one bookie of its write set, the bookies sharing the range evenly,
quarantined bookies left out while another member can serve."""
from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.quorum import write_set
from stream.read_plan import RangeRead, count_ids, plan_missing, plan_reads, residue_owners, residue_steps


@st.composite
def cases(draw):
    e = draw(st.integers(1, 8))
    qw = draw(st.integers(1, e))
    first = draw(st.integers(0, 10_000))
    last = first + draw(st.integers(0, 300))
    avoid = draw(st.sets(st.integers(0, e - 1), max_size=e))
    return e, qw, first, last, avoid, draw(st.integers(0, 50)), draw(st.sampled_from([0, 1, 7, 64]))


@settings(max_examples=400, deadline=None)
@given(cases())
def test_every_id_is_asked_once_of_a_bookie_of_its_write_set(case):
    e, qw, first, last, avoid, rotation, block = case
    plans = plan_reads(first, last, e, qw, avoid=avoid, rotation=rotation, block_entries=block)
    asked = collections.Counter()
    for p in plans:
        assert first <= p.first <= p.last <= last
        for eid in p.ids():
            assert p.wants(eid)
            assert p.bookie_index in write_set(eid, e, qw), (p, eid)
            ws = write_set(eid, e, qw)
            if not set(ws) <= avoid:
                assert p.bookie_index not in avoid, (p, eid, avoid)
            asked[eid] += 1
        assert p.count() == sum(1 for _ in p.ids())
        assert not p.wants(p.first - 1) and not p.wants(p.last + 1)
    assert asked == collections.Counter(range(first, last + 1))
    assert [p.first for p in plans] == sorted(p.first for p in plans)


@pytest.mark.parametrize("e,qw", [(4, 2), (5, 3), (3, 2), (6, 3), (5, 1), (6, 4)])
def test_striped_ensembles_share_a_range_evenly_between_all_their_bookies(e, qw):
    """Each read asks its bookie for an arc of residues it holds whole (all
    it holds but for the short arc when Qw does not divide E); the blocks'
    arcs turn, so every bookie serves the same number of ids; without
    blocks, a range's reads go to E/Qw bookies (rounded up), and the
    rotation turns them."""
    tilings = qw if e % qw == 0 else e
    n = 64 * e * tilings
    plans = plan_reads(1000, 1000 + n - 1, e, qw, rotation=7, block_entries=64 * e)
    served = collections.Counter()
    for p in plans:
        served[p.bookie_index] += p.count()
        arc = [r for r in range(e) if p.residues >> r & 1]
        start = next(r for r in arc if (r - 1) % e not in arc) if len(arc) < e else 0
        assert sorted(arc) == sorted((start + k) % e for k in range(len(arc))) and len(arc) <= qw  # consecutive
        assert all(p.bookie_index in write_set(r, e, qw) for r in arc)
        if e % qw == 0:
            assert len(arc) == qw   # (all the bookie holds)
    assert set(served) == set(range(e)) and len(set(served.values())) == 1, served
    assert len({(p.first, p.last) for p in plans}) == tilings
    one = [plan_reads(0, n - 1, e, qw, rotation=k) for k in range(tilings)]
    assert all(len(ps) == -(-e // qw) and {(p.first, p.last) for p in ps} == {(0, n - 1)} for ps in one)
    assert {p.bookie_index for ps in one for p in ps} == set(range(e))


def test_qw_equal_e_reads_one_bookie_per_range_unless_blocks_are_asked():
    assert plan_reads(0, 999, 3, 3, rotation=4) == [RangeRead(1, 0, 999)]
    assert plan_reads(0, 999, 3, 3, rotation=5, avoid={1}) == [RangeRead(2, 0, 999)]
    assert plan_reads(0, 999, 3, 3, rotation=0, block_entries=400) == [
        RangeRead(0, 0, 399), RangeRead(1, 400, 799), RangeRead(2, 800, 999)]


def test_a_quarantined_bookie_s_share_goes_to_the_next_member_of_each_write_set():
    owners = residue_owners(4, 2, avoid={1})
    assert owners == [0, 2, 2, 3]          # residue 1 (write set 1, 2) moves to 2
    assert residue_owners(4, 2, avoid={1, 2})[1] == 1   # the whole write set avoided: its first choice
    assert residue_owners(4, 2) == [0, 1, 2, 3]
    assert residue_owners(4, 2, rotation=1) == [1, 2, 3, 0]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.data())
def test_residue_counts_and_steps_match_a_walk_of_the_ids(e, data):
    residues = data.draw(st.integers(1, (1 << e) - 1))
    first = data.draw(st.integers(0, 50))
    last = data.draw(st.integers(first - 1, first + 60))
    ids = [i for i in range(first, last + 1) if residues >> (i % e) & 1]
    assert count_ids(first, last, e, residues) == len(ids)
    steps = residue_steps(e, residues)
    for a, b in zip(ids, ids[1:]):
        assert a + steps[a % e] == b


def test_bad_ranges_are_refused():
    with pytest.raises(ValueError):
        plan_reads(5, 4, 3, 3)
    with pytest.raises(ValueError):
        plan_reads(-1, 4, 3, 3)
    with pytest.raises(ValueError):
        plan_reads(0, 4, 3, 3, block_entries=-1)


@settings(max_examples=300, deadline=None)
@given(cases(), st.data())
def test_a_next_round_asks_every_missing_id_once_of_another_member_of_its_write_set(case, data):
    e, qw, first, last, avoid, rotation, _ = case
    ids = list(range(first, last + 1))
    missing = sorted(data.draw(st.sets(st.sampled_from(ids), min_size=1)))
    plans = plan_missing(missing, e, qw, avoid=avoid, rotation=rotation)
    asked = collections.Counter()
    for p in plans:
        for eid in p.ids():
            assert p.bookie_index in write_set(eid, e, qw)
            if eid in missing:
                asked[eid] += 1
                if not set(write_set(eid, e, qw)) <= avoid:
                    assert p.bookie_index not in avoid
        assert p.count() == sum(1 for _ in p.ids())
    assert asked == collections.Counter(missing)
    assert plan_missing([], e, qw) == []
