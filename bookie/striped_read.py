"""A striped bookie's share of a range read (issue 12 item 0c, issue 18).

A bookie of a striped ledger (E > Qw) holds Qw of every E consecutive ids,
so its index (bookie/index.py) is one run per Qw ids, and a striped reader
asks it for the ids of some residues mod `stripe` only.  Walking the runs
costs a slice of two arrays per run and a test per held id, in Python:
about 8x the CPU per returned entry of a Qw = E range read.

``StripeView``: the held ids of one (stripe, residues) filter in a window
of the ledger, with their locations, lengths, running byte totals and the
places where they stop being close on disk, in flat arrays: a read bisects
to `first`, bisects its byte cut and preads span by span, with no Python
step per record (a striped bookie's CPU per byte served was about 3x a Qw
= E bookie's with a step per record; issue 18).  A view covers a window
from the first id read, of at most ``VIEW_WINDOW_IDS`` of the index's ids
(or to its end, and then it takes the appends): its build, one pass in C
over the index's runs (``StripeView.fill``, bookie/_spans.c), holds the
bookie's event loop, and a frame of a range read stops at the window's
end.  The index drops a view on any change but an append at its end
(``LedgerIndex.stripe_view``), and builds one when a filter is asked for a
second time with no change in between, or only appends and a window
ending below the ledger's end: a ledger being written and read at its
tail keeps the run walk and never pays a build per frame.

Both walks read the wanted records close together on disk in one pread
(gaps of at most ``GAP_BYTES``) and slice them out.
"""
from __future__ import annotations

import weakref
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from itertools import repeat
from operator import add, sub

from bookie.index import OFFSET_BITS, spans_c


# A striped read takes wanted records this close together on disk in one
# pread (and slices them out) rather than one pread each: small records
# cost more per syscall than per byte, large ones the other way round.
GAP_BYTES = 4 << 10
# A view covers a window of at most this many of the index's ids from the
# first id read: its build holds the bookie's event loop (here the longest
# build of a catch-up of a bookie holding 2 Mi ids took 2.6 ms at 2^14 ids
# a window, 7.5 at 2^15, 15 at 2^16; the whole ledger at once, in Python,
# 1.3 s) and it holds 28 bytes an id; a read past the window builds the next.
VIEW_WINDOW_IDS = 1 << 14
# Windows of one filter kept besides its latest (LedgerIndex.stripe_view):
# a reader's chunks in flight at once each read in a window of their own.
SPARE_VIEWS = 3


def wanted(stripe: int, residues: int) -> list[bool]:
    """For each residue mod `stripe`, whether the filter asks for it."""
    return [bool(residues >> r & 1) for r in range(stripe)]


class StripeView:
    """The held ids of one (stripe, residues) filter in ``[lo, hi)`` in id
    order (``hi`` None: to the ledger's end, the view then taking the ids
    appended), as flat arrays: their ids, locations and lengths; ``ends``:
    the running total of the lengths (``ends[k]``: the bytes of records
    0..k), so a read's byte cut is a bisection; ``breaks``: the positions k
    whose record does not follow record k - 1 on disk within ``gap_bytes``
    in one journal segment (the spans a read preads, each in one call);
    ``seams``: the positions k whose record does not begin where record k -
    1 ends (the pieces a span's wanted bytes are sliced out in: a seam per
    record when a filter skips every other one, a seam per journal record
    when it takes all a bookie holds)."""

    __slots__ = ("stripe", "residues", "want", "gap_bytes", "version", "lo", "hi", "window", "ids", "locs", "lens",
                 "ends", "breaks", "seams", "__weakref__")

    def __init__(self, stripe: int, residues: int, lo: int = 0, window: int = VIEW_WINDOW_IDS):
        self.stripe, self.residues = stripe, residues
        self.gap_bytes = GAP_BYTES   # (read once: a view's spans keep one rule)
        self.want = wanted(stripe, residues)
        self.version = -1
        self.lo, self.hi = lo, None
        self.window = window   # (the most ids it takes: appends past it close it)
        self.ids, self.locs, self.lens = array("q"), array("Q"), array("I")
        self.ends, self.breaks, self.seams = array("Q"), array("q"), array("q")

    def covers(self, entry_id: int) -> bool:
        return self.lo <= entry_id and (self.hi is None or entry_id < self.hi)

    def extend(self, start: int, locs, lens) -> None:
        """Adds consecutive held ids from `start` (above every id held)."""
        if not isinstance(locs, array):  # (an index's single put)
            locs, lens = array("Q", locs), array("I", lens)
        self.fill(((start, locs, lens),))

    def fill(self, runs, max_ids: int = -1, lookup: dict | None = None) -> int:
        """Adds the ids from ``lo`` of a ledger's index runs
        (``bookie.index.Run``, consecutive or gapped, or (start, locs, lens
        [, ids]), ascending, above every id held; with ``lookup``, ``runs``
        gives their keys in it: the index's SortedDict), walking at most
        `max_ids` of their ids (-1: all): one pass in C where
        ``bookie._spans`` was built (600 ns an id in Python: a view of
        131,072 ids held the bookie's event loop for 78 ms), else
        ``_fill_py``.  Returns the id it stopped at, -1 past every run."""
        if spans_c is None:
            return self._fill_py(list(runs) if lookup is None else [lookup[key] for key in runs], max_ids)
        k = len(self.ids)
        *parts, stop = spans_c.stripe_fill(runs, self.stripe, bytes(self.want), self.gap_bytes, k,
                                    self.ends[-1] if k else 0, self.locs[-1] + self.lens[-1] if k else 0,
                                    self.lo, max_ids, lookup)
        for arr, data in zip((self.ids, self.locs, self.lens, self.ends, self.seams, self.breaks), parts):
            arr.frombytes(data)
        return stop

    def _fill_py(self, runs, max_ids: int) -> int:
        """``fill`` in Python, id by id (where bookie._spans was not built)."""
        stripe, want, gap = self.stripe, self.want, self.gap_bytes
        ids, vl, vn, ends, breaks, seams = self.ids, self.locs, self.lens, self.ends, self.breaks, self.seams
        k = len(ids)
        total = ends[-1] if k else 0
        prev = vl[-1] + vn[-1] if k else -1   # where the last held record ends on disk
        walked = 0
        for run in runs:
            start, locs, lens, *rest = run if isinstance(run, tuple) else (run.start, run.locs, run.lens, run.ids)
            held = rest[0] if rest else None   # (a gapped run's ids: bookie/index.py)
            j0 = bisect_left(held, self.lo) if held is not None else min(max(0, self.lo - start), len(locs))
            for j in range(j0, len(locs)):
                e = start + j if held is None else held[j]
                if walked == max_ids:
                    return e
                walked += 1
                if want[e % stripe]:
                    loc, ln = locs[j], lens[j]
                    if k and loc != prev:
                        seams.append(k)
                        if not 0 <= loc - prev <= gap:   # (another segment: a location 2^OFFSET_BITS apart)
                            breaks.append(k)
                    ids.append(e)
                    vl.append(loc)
                    vn.append(ln)
                    total += ln
                    ends.append(total)
                    prev = loc + ln
                    k += 1
        return -1

    @property
    def nbytes(self) -> int:
        """The bytes its arrays hold: 28 per id, 8 per seam and break."""
        return 28 * len(self.ids) + 8 * (len(self.seams) + len(self.breaks))


class ViewBudget:
    """Bounds the bytes held in stripe views across a bookie's ledgers
    (``StripeView.nbytes``): the views used least recently are dropped from
    their indexes past `max_bytes` (never the one just used).  Indexes and
    views are held weakly: a deleted ledger's views go with it, and so does
    a window its index let go."""

    def __init__(self, max_bytes: int = 48 << 20):
        self.max_bytes = max_bytes
        self.held = 0
        self._lru: OrderedDict = OrderedDict()  # (id(index), id(view)) -> (weakrefs to both, bytes counted)

    def used(self, index, view: StripeView) -> None:
        k = (id(index), id(view))
        old = self._lru.pop(k, None)
        if old is not None:
            self.held -= old[2]
        size = view.nbytes
        self._lru[k] = (weakref.ref(index), weakref.ref(view), size)
        self.held += size
        if self.held > self.max_bytes:   # first the views their indexes let go (an older window replaced)
            for dead in [k for k, (_, vref, _) in self._lru.items() if vref() is None]:
                self.held -= self._lru.pop(dead)[2]
        while self.held > self.max_bytes and len(self._lru) > 1:
            _, (ref, vref, counted) = self._lru.popitem(last=False)
            self.held -= counted
            idx, v = ref(), vref()
            if idx is not None and v is not None:
                idx.drop_view(v.stripe, v.residues, v)


def _spans_out(spans, read_at) -> list[bytes]:
    out = []
    for s0, end, pieces in spans:
        data = read_at(s0, end - s0)
        if len(pieces) == 1 or sum(ln for _, ln in pieces) == end - s0:
            out.append(data)
        else:
            out.append(_cut(data, [loc - s0 for loc, _ in pieces], [loc - s0 + ln for loc, ln in pieces]))
    return out


def _cut(data, starts, stops, total: int | None = None):
    """The pieces ``data[start:stop]`` of a span read with its gaps, joined:
    bytes (in C where the bounds are int64 arrays from bookie/_spans.c);
    or, from the read port's ``read_at`` (a span of a file, not its bytes:
    bookie/read_port.py), its ``cut``, the pieces to send (``total``: their
    bytes in all, if known)."""
    if type(data) is not bytes:
        return data.cut(starts, stops, total)
    if type(starts) is array:
        return spans_c.cut(data, starts, stops)
    mv = memoryview(data)
    return b"".join(map(mv.__getitem__, map(slice, starts, stops)))


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


def read_view(view: StripeView, first: int, last: int, max_bytes: int, read_at
              ) -> tuple[list[bytes], int | None, bool, int]:
    """``read_runs`` of [first, last] from a view of the same filter, with
    no step per record in Python: the ids bisected, the byte cut bisected
    in ``view.ends``, one pread per span between ``view.breaks``, and a
    span with gaps sliced out piece by piece (between ``view.seams``) by
    ``map`` over the arrays."""
    ids, locs, lens, ends = view.ids, view.locs, view.lens, view.ends
    clipped = view.hi is not None and last >= view.hi   # (the view's window ends first: a frame stops there)
    if clipped:
        last = view.hi - 1
    i, j = bisect_left(ids, first), bisect_right(ids, last)
    if i >= j:
        return [], view.hi if clipped else None, clipped, 0
    stop = bisect_right(ends, (ends[i - 1] if i else 0) + max_bytes, i, j)
    stop = max(stop, i + 1)   # (at least one record)
    full = stop < j
    breaks, seams = view.breaks, view.seams
    cuts = [i, *breaks[bisect_right(breaks, i):bisect_left(breaks, stop)], stop]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        s0 = locs[a]
        end = locs[b - 1] + lens[b - 1]
        data = read_at(s0, end - s0)
        if ends[b - 1] - (ends[a - 1] if a else 0) == end - s0:
            out.append(data)   # (no gap: the span is the records)
            continue
        lo, hi = bisect_right(seams, a), bisect_left(seams, b)   # the seams inside: a piece after each
        if spans_c is not None:   # (bookie/_spans.c: no Python object per piece)
            starts, stops, total = spans_c.piece_bounds(locs, lens, seams, lo, hi, a, b, s0)
            out.append(_cut(data, array("q", starts), array("q", stops), total))
            continue
        firsts = [a, *seams[lo:hi]]   # each piece's first record
        lasts = list(map(sub, firsts, repeat(1)))
        del lasts[0]
        lasts.append(b - 1)
        starts = list(map(sub, map(locs.__getitem__, firsts), repeat(s0)))
        stops = list(map(sub, map(add, map(locs.__getitem__, lasts), map(lens.__getitem__, lasts)), repeat(s0)))
        out.append(_cut(data, starts, stops))
    if not full and clipped:
        return out, view.hi, True, stop - i
    return out, ids[stop] if full else None, full, stop - i
