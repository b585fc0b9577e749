"""A striped bookie's share of a range read (issue 12 item 0c, issue 18).

A bookie of a striped ledger (E > Qw) holds Qw of every E consecutive ids,
so its index (bookie/index.py) is one run per Qw ids, and a striped reader
asks it for the ids of some residues mod `stripe` only.  Walking the runs
costs a slice of two arrays per run and a test per held id, in Python:
about 8x the CPU per returned entry of a Qw = E range read.

``StripeView``: the held ids of one (stripe, residues) filter, with their
locations and lengths, in three flat arrays: a read bisects to `first` and
walks only the ids it returns.  The index keeps a view up to date through
appends at its end (the writer's usual case) and drops it on any other
change (``LedgerIndex.stripe_view``); it builds one only when asked twice
for the same filter with no change in between, so a ledger being written
and read at its tail keeps the run walk and never pays a build per frame.

Both walks read the wanted records close together on disk in one pread
(gaps of at most ``gap_bytes``) and slice them out.
"""
from __future__ import annotations

import weakref
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict

from bookie.index import OFFSET_BITS


def wanted(stripe: int, residues: int) -> list[bool]:
    """For each residue mod `stripe`, whether the filter asks for it."""
    return [bool(residues >> r & 1) for r in range(stripe)]


class StripeView:
    __slots__ = ("stripe", "residues", "want", "version", "ids", "locs", "lens")

    def __init__(self, stripe: int, residues: int):
        self.stripe, self.residues = stripe, residues
        self.want = wanted(stripe, residues)
        self.version = -1
        self.ids, self.locs, self.lens = array("q"), array("Q"), array("I")

    def extend(self, start: int, locs, lens) -> None:
        """Adds consecutive held ids from `start` (above every id held)."""
        stripe, want = self.stripe, self.want
        ids, vl, vn = self.ids, self.locs, self.lens
        for k in range(len(locs)):
            e = start + k
            if want[e % stripe]:
                ids.append(e)
                vl.append(locs[k])
                vn.append(lens[k])


class ViewBudget:
    """Bounds the ids held in stripe views across a bookie's ledgers (20
    bytes each): the views used least recently are dropped from their
    indexes past `max_ids` (never the one just used).  Indexes are held
    weakly: a deleted ledger's views go with it."""

    def __init__(self, max_ids: int = 1 << 21):
        self.max_ids = max_ids
        self.held = 0
        self._lru: OrderedDict = OrderedDict()  # (id(index), key) -> (weakref to index, view, ids counted)

    def used(self, index, view: StripeView) -> None:
        k = (id(index), view.stripe, view.residues)
        old = self._lru.pop(k, None)
        if old is not None:
            self.held -= old[2]
        self._lru[k] = (weakref.ref(index), view, len(view.ids))
        self.held += len(view.ids)
        while self.held > self.max_ids and len(self._lru) > 1:
            _, (ref, v, counted) = self._lru.popitem(last=False)
            self.held -= counted
            idx = ref()
            if idx is not None:
                idx.drop_view(v.stripe, v.residues, v)


def _spans_out(spans, read_at) -> list[bytes]:
    out = []
    for s0, end, pieces in spans:
        data = read_at(s0, end - s0)
        if len(pieces) == 1 or sum(ln for _, ln in pieces) == end - s0:
            out.append(data)
        else:
            mv = memoryview(data)
            out.append(b"".join([mv[loc - s0:loc - s0 + ln] for loc, ln in pieces]))
    return out


def _add(spans, loc: int, ln: int, gap_bytes: int) -> None:
    if spans and spans[-1][0] >> OFFSET_BITS == loc >> OFFSET_BITS and 0 <= loc - spans[-1][1] <= gap_bytes:
        s0, _, pieces = spans[-1]
        pieces.append((loc, ln))
        spans[-1] = (s0, loc + ln, pieces)
    else:
        spans.append((loc, loc + ln, [(loc, ln)]))


def read_runs(runs, max_bytes: int, stripe: int, residues: int, read_at,
              gap_bytes: int) -> tuple[list[bytes], int | None, bool, int]:
    """The ids of index runs (``LedgerIndex.runs_from``) with bit (id mod
    stripe) set in `residues`, in order, at most `max_bytes` but at least
    one record.  Returns (records, the id after the last one walked or None,
    whether `max_bytes` stopped it, how many records)."""
    want = wanted(stripe, residues)
    spans: list = []  # (seg loc, end, [(loc, len)])
    size, nxt, count = 0, None, 0
    full = False
    for start, locs, lens in runs:
        nxt = start
        eid = start
        for loc, ln in zip(locs, lens):
            if want[eid % stripe]:
                if size and size + ln > max_bytes:
                    full = True
                    break
                _add(spans, loc, ln, gap_bytes)
                size += ln
                count += 1
            eid += 1
        nxt = eid
        if full:
            break
    return _spans_out(spans, read_at), nxt, full, count


def read_view(view: StripeView, first: int, last: int, max_bytes: int, read_at,
              gap_bytes: int) -> tuple[list[bytes], int | None, bool, int]:
    """``read_runs`` of [first, last] from a view of the same filter."""
    ids, locs, lens = view.ids, view.locs, view.lens
    i, j = bisect_left(ids, first), bisect_right(ids, last)
    spans: list = []
    size, full, nxt = 0, False, None
    s0 = end = -1
    pieces: list = []
    stop = j
    for k in range(i, j):  # (_add inlined: the span being built in locals)
        loc, ln = locs[k], lens[k]
        if size and size + ln > max_bytes:
            full, nxt, stop = True, ids[k], k
            break
        if 0 <= loc - end <= gap_bytes and loc >> OFFSET_BITS == s0 >> OFFSET_BITS:
            pieces.append((loc, ln))
        else:
            if pieces:
                spans.append((s0, end, pieces))
            s0, pieces = loc, [(loc, ln)]
        end = loc + ln
        size += ln
    if pieces:
        spans.append((s0, end, pieces))
    return _spans_out(spans, read_at), nxt, full, stop - i
