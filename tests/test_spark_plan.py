"""The Spark source's planning rules (stream/spark/plan.py): pure, no Spark."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.spark import plan
from stream.spark.plan import LedgerView, Range, offset
from stream.stream import Position

LOG = [LedgerView(10, 0, 99, True), LedgerView(20, 0, 49, True), LedgerView(30, 0, 9, False)]
STREAM = [LedgerView(7, 100, 999, False)]  # trimmed below 100, LAC 999


def test_normalise_moves_past_closed_ledgers():
    assert plan.normalise(LOG, offset(10, 100)) == offset(20, 0)
    assert plan.normalise(LOG, offset(10, 99)) == offset(10, 99)
    # the last ledger is open: its end is not a boundary
    assert plan.normalise(LOG, offset(30, 10)) == offset(30, 10)
    assert plan.earliest(LOG) == offset(10, 0)
    assert plan.latest(LOG) == offset(30, 10)
    assert plan.latest(STREAM) == offset(7, 1000)
    assert plan.earliest(STREAM) == offset(7, 100)


def test_ranges_between_offsets_span_ledgers():
    rs = plan.ranges(LOG, offset(10, 90), offset(30, 5))
    assert rs == [Range(10, 90, 99), Range(20, 0, 49), Range(30, 0, 4)]
    assert plan.ranges(LOG, offset(30, 5), offset(30, 5)) == []
    assert plan.ranges(STREAM, offset(7, 100), offset(7, 1000)) == [Range(7, 100, 999)]


def test_advance_respects_the_limit_and_the_end():
    assert plan.advance(LOG, offset(10, 90), None) == offset(30, 10)
    assert plan.advance(LOG, offset(10, 90), 10) == offset(20, 0)     # 90..99, then normalised
    assert plan.advance(LOG, offset(10, 90), 15) == offset(20, 5)
    assert plan.advance(LOG, offset(30, 10), 100) == offset(30, 10)   # nothing new: start itself
    assert plan.advance(STREAM, offset(7, 990), 1000) == offset(7, 1000)


def test_trimmed_offsets_fail_or_skip():
    assert plan.trimmed(STREAM, offset(7, 99))
    assert not plan.trimmed(STREAM, offset(7, 100))
    assert plan.trimmed(LOG, offset(5, 0))  # a ledger truncated from the log's list
    with pytest.raises(plan.PlanError, match="trimmed"):
        plan.resolve(STREAM, offset(7, 50), fail_on_data_loss=True)
    assert plan.resolve(STREAM, offset(7, 50), fail_on_data_loss=False) == offset(7, 100)


def test_split_cuts_at_fragments_then_by_size_then_to_min_partitions():
    rs = [Range(7, 100, 999)]
    bounds = {7: [(0, 0), (1, 300), (2, 600)]}
    parts = plan.split(rs, bounds, max_entries=1000)
    assert parts == [Range(7, 100, 299, 0), Range(7, 300, 599, 1), Range(7, 600, 999, 2)]
    parts = plan.split(rs, bounds, max_entries=250)
    assert [p.count for p in parts] == [200, 250, 50, 250, 150]
    parts = plan.split([Range(7, 0, 9)], {}, max_entries=100, min_partitions=4)
    assert len(parts) == 4 and sum(p.count for p in parts) == 10


@settings(max_examples=200, deadline=None)
@given(first=st.integers(0, 50), n=st.integers(1, 500), cuts=st.lists(st.integers(1, 600), max_size=6),
       max_entries=st.integers(1, 200), min_parts=st.integers(1, 8))
def test_split_covers_every_entry_once_in_order(first, n, cuts, max_entries, min_parts):
    last = first + n - 1
    starts = sorted({0, *cuts})
    bounds = {1: [(i, s) for i, s in enumerate(starts)]}
    parts = plan.split([Range(1, first, last)], bounds, max_entries=max_entries, min_partitions=min_parts)
    ids = [e for p in parts for e in range(p.first, p.last + 1)]
    assert ids == list(range(first, last + 1))
    assert all(p.count <= max_entries for p in parts)
    assert len(parts) >= min(min_parts, n)
    for p in parts:  # never across a fragment boundary
        assert not any(p.first < s <= p.last for s in starts)


def test_positions_round_trip():
    b = plan.encode_position("stream", 7, 42)
    assert Position.from_bytes(b) == Position(42)  # the stream API reads the column
    assert plan.decode_position("stream", b, 7) == offset(7, 42)
    b = plan.encode_position("log", 20, 5)
    assert plan.decode_position("log", b) == offset(20, 5)
    assert plan.parse_position_option("log", b.hex(), option="x") == offset(20, 5)
    assert plan.parse_position_option("stream", '{"entry": 3}', option="x") == offset(0, 3)
    assert plan.parse_position_option("log", " Earliest ", option="x") == "earliest"
    for bad in ("soon", "abcd", '{"ledger": 0, "entry": 1}', '{"entry": -1}'):
        with pytest.raises(plan.PlanError):
            plan.parse_position_option("log", bad, option="startingPositions")
