"""The entry index: (ledger, entry) -> where the record lies in the journal.

Entries of a ledger mostly arrive in order, so a ledger's index is a set of
*runs* of consecutive entry ids, kept in a SortedDict keyed by the run's first
id.  A run stores its locations in two flat arrays (`array('Q')` of packed
segment/offset and `array('I')` of record lengths): 12 bytes an entry, no
Python object per entry.  Range reads walk a run's arrays; truncation and
fragment deletion cut runs.

A run also knows, once read, where its records stop following each other
on disk (``Run.breaks_after``: the positions where a range read starts a new
pread, found for the whole run at C speed and kept while the run only
grows; 4 bytes a break, one per journal record a run spans): a range read
then costs per disk span, not per entry.

A striped bookie (E > Qw) holds Qw of every E ids: runs of consecutive ids
would be a run per Qw ids, a Python object, two arrays and a SortedDict
entry each (150-220 bytes an entry, against 12).  An id past the end of a
short run (at most ``SHORT_RUN`` ids) or of a *gapped* run joins that run
instead, which then lists its ids too (``Run.ids``: 20 bytes an entry): a
striped bookie's share of a ledger is one run.  A gapped run shows itself
to range reads as its consecutive pieces (``Run.pieces``), and to a
checkpoint too (the image has one form: runs of consecutive ids), and an
index loaded from an image joins them again as its puts would have.
"""
from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from itertools import compress, islice, repeat
from operator import add, ne
from typing import Iterator

from sortedcontainers import SortedDict

from bookie import native

spans_c = native("_spans")   # the index's walks in C (bookie/_spans.c), or None: the Python code here
_LITTLE = sys.byteorder == "little"   # (the arrays' memory is the checkpoint's form)
# A run in a checkpoint (bookie/storage.py): its start and count, then its
# locations and lengths as the arrays hold them.
RUN_HEAD = struct.Struct("<QI")

OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1
MAX_SEGMENT = (1 << (64 - OFFSET_BITS)) - 1


def pack_location(segment: int, offset: int) -> int:
    assert 0 <= segment <= MAX_SEGMENT and 0 <= offset <= OFFSET_MASK
    return (segment << OFFSET_BITS) | offset


def unpack_location(loc: int) -> tuple[int, int]:
    return loc >> OFFSET_BITS, loc & OFFSET_MASK


SHORT_RUN = 64   # an id past the end of a run this short (or of a gapped run) joins it (see the module doc)


class Run:
    __slots__ = ("start", "locs", "lens", "checked", "breaks", "ids")

    def __init__(self, start: int, locs: array | None = None, lens: array | None = None, ids: array | None = None):
        self.start = start
        self.locs = locs if locs is not None else array("Q")
        self.lens = lens if lens is not None else array("I")
        # breaks: the positions k (0 < k < checked) whose record does not
        # begin where record k-1 ends on disk; appends keep them valid
        # (a consecutive run's: a gapped run's pieces find their own)
        self.checked = 0
        self.breaks = array("I")
        self.ids = ids   # None: the ids start, start + 1, ...; else array('q') of them, ascending, ids[0] == start

    @property
    def end(self) -> int:
        """One past the last entry id of the run."""
        ids = self.ids
        return ids[-1] + 1 if ids is not None else self.start + len(self.locs)

    def position(self, entry_id: int) -> int:
        """The position of ``entry_id`` in the run, -1 if it holds none."""
        ids = self.ids
        if ids is None:
            k = entry_id - self.start
            return k if 0 <= k < len(self.locs) else -1
        k = bisect_left(ids, entry_id)
        return k if k < len(ids) and ids[k] == entry_id else -1

    def joins(self, first: int) -> bool:
        """Whether ids from ``first`` on (at or past its end) join this run:
        right after it, or past a gap after a short or gapped run."""
        end = self.end
        return first == end or first > end and (self.ids is not None or len(self.locs) <= SHORT_RUN)

    def append(self, first: int, locs, lens) -> None:
        """Appends consecutive ids from ``first`` (at or past its end; see
        ``joins``), listing its ids from a gap on."""
        if first != self.end or self.ids is not None:
            self.make_gapped().extend(range(first, first + len(locs)))
        self.locs.extend(locs)
        self.lens.extend(lens)

    def make_gapped(self) -> array:
        """Lists the run's ids (if it did not), so ids with gaps may join it; returns them."""
        if self.ids is None:
            self.ids = array("q", range(self.start, self.start + len(self.locs)))
            self.checked = 0
            del self.breaks[:]
        return self.ids

    def pieces(self, first: int, last: int) -> Iterator["Run"]:
        """A gapped run's ids in [first, last] as consecutive runs of their
        own (copies of its arrays' slices), in order."""
        ids = self.ids
        a, b = bisect_left(ids, first), bisect_right(ids, last)
        while a < b:
            z = _consecutive_end(ids, a, b)
            yield Run(ids[a], self.locs[a:z], self.lens[a:z])
            a = z

    def changed(self, k: int) -> None:
        """Position k's location changed: the breaks at k and k+1 are
        found again when next asked."""
        if k < self.checked:
            self.checked = k
            del self.breaks[bisect_left(self.breaks, k):]

    def breaks_after(self, lo: int) -> tuple[array, int]:
        """(breaks, i): the positions k whose record does not begin where
        record k-1 ends on disk, ascending, and the index in them of the
        first one above `lo` (a range read from `lo` reads the disk spans
        between them: within one, record k ends where record k+1 begins).
        The array is the run's own: not to be changed, nor held across a
        change of the run."""
        locs = self.locs
        n = len(locs)
        if self.checked < n:
            c = max(self.checked, 1)
            if c < n and spans_c is not None:   # (2 ns an entry: a run of 4 Mi entries, 10 ms)
                self.breaks.frombytes(spans_c.run_breaks(locs, self.lens, c))
            elif c < n:  # (C loops: no Python code per entry, but 100 ns an entry)
                self.breaks.extend(compress(range(c, n), map(ne, locs[c:], map(add, locs[c - 1:n - 1],
                                                                                self.lens[c - 1:n - 1]))))
            self.checked = n
        return self.breaks, bisect_right(self.breaks, lo)



def _consecutive_end(ids: array, a: int, b: int) -> int:
    """The first position k in (a, b) whose id is not ids[a] + (k - a), or
    b: ids strictly ascend, so ids[k] - k never falls, and the positions
    where it holds are a prefix (galloping, then halving: a few steps for a
    striped run's pieces of Qw ids, however long the run)."""
    base = ids[a] - a
    lo, step = a + 1, 1   # every k < lo holds
    while True:
        k = lo + step - 1
        if k >= b:
            hi = b
            break
        if ids[k] - k != base:
            hi = k
            break
        lo, step = k + 1, step * 2
    while lo < hi:   # the first k in [lo, hi) that does not hold, else hi
        mid = (lo + hi) // 2
        if ids[mid] - mid != base:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _piece_cuts(ids: array) -> list[int]:
    """Where a gapped run's pieces of consecutive ids begin, then its length
    (C loops over the ids: no Python step per id)."""
    return [0, *compress(range(1, len(ids)), map(ne, islice(ids, 1, None), map(add, ids, repeat(1)))), len(ids)]


# What a removal hands back, so the caller can account for dead bytes:
# a list of (packed location, length) pairs.
Removed = list[tuple[int, int]]


class LedgerIndex:
    """The index of one ledger."""

    __slots__ = ("_runs", "_count", "_last", "_version", "_reshaped", "_views", "_spare", "_asked", "__weakref__")

    def __init__(self) -> None:
        self._runs: SortedDict = SortedDict()
        self._count = 0
        self._last: Run | None = None  # the run with the highest start: the append fast path
        self._version = 0   # bumped by every change (the stripe views' validity)
        self._reshaped = 0  # the version of the last change but an append at the end
        self._views: dict = {}  # (stripe, residues) -> bookie.striped_read.StripeView, the latest built
        # (stripe, residues) -> up to SPARE_VIEWS earlier windows of the filter, the most recent last:
        # concurrent reads of one filter at different places (a reader's read-ahead chunks) each keep
        # theirs, instead of building in turn over each other's
        self._spare: dict = {}
        self._asked: dict = {}  # (stripe, residues) -> the version at its last ask

    def _appended(self, first: int, locs, lens) -> None:
        """Appends at the end keep the current stripe views current: one
        open to the end takes them, and closes below them once it holds its
        window's worth (a view never grows past its window, however long a
        writer goes on); one whose window ends below is unchanged."""
        v0 = self._version
        self._version += 1
        for view in self._all_views():
            if view.version == v0:
                if view.hi is None:
                    if len(view.ids) + len(locs) > view.window:
                        view.hi = first
                    else:
                        view.extend(first, locs, lens)
                view.version = self._version

    def _all_views(self):
        yield from self._views.values()
        for spare in self._spare.values():
            yield from spare

    def drop_view(self, stripe: int, residues: int, view) -> None:
        key = (stripe, residues)
        if self._views.get(key) is view:
            del self._views[key]
        spare = self._spare.get(key)
        if spare and view in spare:
            spare.remove(view)

    def stripe_view(self, stripe: int, residues: int, first: int, window: int | None = None):
        """The current StripeView of a filter (bookie/striped_read.py) whose
        window holds `first`, or None: built from `first` over at most
        `window` ids (``VIEW_WINDOW_IDS``) when asked a second time for that filter,
        with no change in between, or only appends and a window that ends
        below the ledger's end (a catch-up's next window at once, a writer
        appending or not)."""
        key = (stripe, residues)
        view = self._views.get(key)
        if view is not None and view.version == self._version and view.covers(first):
            return view
        spare = self._spare.get(key)
        for view in reversed(spare or ()):
            if view.version == self._version and view.covers(first):
                spare.remove(view)   # (the view last used is the filter's latest: _views)
                self._make_latest(key, view, self._views.get(key))
                return view
        from bookie.striped_read import VIEW_WINDOW_IDS, StripeView

        window = VIEW_WINDOW_IDS if window is None else window
        runs = self._runs
        i = max(runs.bisect_right(first) - 1, 0)
        asked, self._asked[key] = self._asked.get(key), self._version
        if asked is None or asked != self._version and (self._reshaped > asked or self._reaches_end(i, first, window)):
            # asked once, or changed since: the run walk (a tail reader builds
            # no view per frame), but for appends only below a window that
            # ends below the ledger's end (appends cannot change it)
            if len(self._asked) > 8:
                self._asked = {key: self._version}
            return None
        view = StripeView(stripe, residues, first, window)
        # (about a window's worth of runs, at the first run's length: a
        # striped ledger's runs are of Qw ids; fewer ids than the window is a
        # smaller window.  The keys' islice, each run looked up by the build
        # itself: no list of a window's runs made first)
        n = min(window, window // max(1, len(runs.peekitem(i)[1].locs) if runs else 1) + 1)
        stop = view.fill(runs.islice(i, i + n), window, lookup=runs)
        if stop >= 0:
            view.hi = stop
        elif i + n < len(runs):
            view.hi = runs.peekitem(i + n)[0]
        view.version = v = self._version
        old = self._views.get(key)
        self._views = {k: x for k, x in self._views.items() if x.version == v}
        self._spare = {k: live for k, xs in self._spare.items() if (live := [x for x in xs if x.version == v])}
        if len(self._views) >= 8:
            self._views.clear()
            self._spare.clear()
        self._make_latest(key, view, old)
        return view

    def _reaches_end(self, i: int, first: int, window: int) -> bool:
        """Whether a window of ``window`` held ids from ``first`` (its run at
        index ``i``) would hold every id to the ledger's end (appends could
        change it), counting runs from ``i`` until it knows."""
        runs, more = self._runs, window
        for key in runs.islice(i):
            run = runs[key]
            if run.ids is not None:
                more -= len(run.ids) - bisect_left(run.ids, first)
            else:
                more -= max(0, run.end - max(first, run.start))
            if more < 0:
                return False
        return True

    def _make_latest(self, key, view, old) -> None:
        """``view`` becomes its filter's latest; ``old``, the latest before
        it, if current, joins the spares (at most SPARE_VIEWS, the oldest
        going)."""
        from bookie.striped_read import SPARE_VIEWS

        if old is not None and old.version == self._version:
            spare = self._spare.setdefault(key, [])
            spare.append(old)
            del spare[:max(0, len(spare) - SPARE_VIEWS)]
        self._views[key] = view

    def __len__(self) -> int:
        return self._count

    def _locate(self, entry_id: int) -> tuple[Run | None, int]:
        """The run whose span holds ``entry_id`` (or the last below it) and
        the id's position in it (-1: not held)."""
        runs = self._runs
        i = runs.bisect_right(entry_id) - 1
        if i < 0:
            return None, -1
        run = runs.peekitem(i)[1]
        return run, run.position(entry_id)

    def put(self, entry_id: int, loc: int, length: int) -> tuple[int, int] | None:
        """Sets the location of an entry; returns the one it replaced, if any."""
        last = self._last
        if last is not None and entry_id == last.end:
            last.locs.append(loc)
            last.lens.append(length)
            if last.ids is not None:
                last.ids.append(entry_id)
            self._count += 1
            self._appended(entry_id, (loc,), (length,))
            return None
        runs = self._runs
        if last is None or entry_id > last.end:  # past the end (a striped bookie's appends)
            if last is not None and last.joins(entry_id):
                last.append(entry_id, (loc,), (length,))
            else:
                run = self._last = runs[entry_id] = Run(entry_id)
                run.locs.append(loc)
                run.lens.append(length)
            self._count += 1
            self._appended(entry_id, (loc,), (length,))
            return None
        self._version += 1
        self._reshaped = self._version
        i = runs.bisect_right(entry_id) - 1
        run = runs.peekitem(i)[1] if i >= 0 else None
        if run is not None and entry_id < run.end:   # within the run's span
            k = run.position(entry_id)
            if k >= 0:
                old = (run.locs[k], run.lens[k])
                run.locs[k] = loc
                run.lens[k] = length
                run.changed(k)
                return old
            k = bisect_left(run.ids, entry_id)   # (a gapped run without it: in its place)
            run.ids.insert(k, entry_id)
            run.locs.insert(k, loc)
            run.lens.insert(k, length)
            self._count += 1
            return None
        if run is not None and run.joins(entry_id):
            run.append(entry_id, (loc,), (length,))
        else:
            run = Run(entry_id)
            run.locs.append(loc)
            run.lens.append(length)
            runs[entry_id] = run
        self._count += 1
        nxt_i = runs.index(run.start) + 1
        if nxt_i < len(runs):
            nxt = runs.peekitem(nxt_i)[1]
            if nxt.start == run.end:  # the new entry closed a gap: merge
                if run.ids is not None or nxt.ids is not None:
                    run.make_gapped().extend(nxt.ids if nxt.ids is not None else range(nxt.start, nxt.end))
                run.locs.extend(nxt.locs)
                run.lens.extend(nxt.lens)
                del runs[nxt.start]
        self._last = runs.peekitem(-1)[1]
        return None

    def put_run(self, first: int, locs: array, lens: array, *, adjacent: bool = False) -> Removed:
        """``put`` for consecutive entries from ``first``; returns what they
        replaced.  Appending after the highest run (the usual case) extends
        its arrays once.  ``adjacent``: each record begins where the one
        before it ends on disk (a run of one journal record): the run's
        breaks are kept as it is appended, not found at its next read."""
        last = self._last
        if locs and last is not None and last.joins(first):   # onto the last run
            n = len(last.locs)
            if adjacent and first == last.end and last.ids is None and last.checked == n:
                if locs[0] != last.locs[-1] + last.lens[-1]:
                    last.breaks.append(n)
                last.checked = n + len(locs)
            last.append(first, locs, lens)
            self._count += len(locs)
            self._appended(first, locs, lens)
            return []
        if adjacent and locs and (last is None or first > last.end):  # a new run past the end
            run = self._last = self._runs[first] = Run(first, array("Q", locs), array("I", lens))
            run.checked = len(locs)
            self._count += len(locs)
            self._appended(first, locs, lens)
            return []
        dead = []
        for k in range(len(locs)):
            old = self.put(first + k, locs[k], lens[k])
            if old is not None:
                dead.append(old)
        return dead

    def get(self, entry_id: int) -> tuple[int, int] | None:
        run, k = self._locate(entry_id)
        if k < 0:
            return None
        return run.locs[k], run.lens[k]

    def __contains__(self, entry_id: int) -> bool:
        return self._locate(entry_id)[1] >= 0

    @property
    def first_entry(self) -> int:
        return self._runs.peekitem(0)[1].start if self._runs else -1

    @property
    def last_entry(self) -> int:
        return self._runs.peekitem(-1)[1].end - 1 if self._runs else -1

    def runs_from(self, first: int, last: int, *, skip_gaps: bool = False) -> Iterator[tuple[int, array, array]]:
        """(first id, locations, lengths) of the ids in [first, last] the
        index holds, a slice of one run at a time, in id order: from `first`
        up to the first id it does not hold, or (``skip_gaps``) every held
        id of the range."""
        for run, lo, hi in self.run_slices(first, last, skip_gaps=skip_gaps):
            yield run.start + lo, run.locs[lo:hi], run.lens[lo:hi]

    def run_slices(self, first: int, last: int, *, skip_gaps: bool = False) -> Iterator[tuple[Run, int, int]]:
        """``runs_from`` as (run, lo, hi): the run's positions [lo, hi), its
        arrays not copied (a reader must not hold them across a change); a
        gapped run as its consecutive pieces (``Run.pieces``: copies)."""
        runs = self._runs
        if first > last or not runs:
            return
        i = max(runs.bisect_right(first) - 1, 0)
        expect = first
        # (runs.islice: the keys from i on, lazily; a slice of values() copied every
        # run to the end per call, which a striped bookie's many short runs felt)
        for key in runs.islice(i):
            run = runs[key]
            if run.start > last:
                return
            if run.ids is not None:
                for piece in run.pieces(first, last):
                    if not skip_gaps and piece.start != expect:
                        return
                    yield piece, 0, len(piece.locs)
                    expect = piece.end
                continue
            lo, hi = max(first, run.start), min(last + 1, run.end)
            if lo >= hi:
                continue  # the run before `first` ends below it
            if not skip_gaps and lo != expect:
                return
            yield run, lo - run.start, hi - run.start
            expect = hi

    def iter_from(self, first: int, last: int) -> Iterator[tuple[int, int, int]]:
        """(entry_id, loc, length) for consecutive ids from `first`, stopping
        at `last` or at the first id the index does not hold."""
        for run, lo, hi in self.run_slices(first, last):
            for k in range(lo, hi):
                yield run.start + k, run.locs[k], run.lens[k]

    def iter_all(self) -> Iterator[tuple[int, int, int]]:
        for run in list(self._runs.values()):
            if run.ids is not None:
                yield from zip(run.ids, run.locs, run.lens)
                continue
            for k in range(len(run.locs)):
                yield run.start + k, run.locs[k], run.lens[k]

    def delete_range(self, first: int, last: int) -> Removed:
        """Removes every entry with first <= id <= last."""
        removed: Removed = []
        if first > last or not self._runs:
            return removed
        self._version += 1
        self._reshaped = self._version
        runs = self._runs
        i = max(runs.bisect_right(first) - 1, 0)
        affected = [r for r in runs.values()[i:] if r.start <= last and r.end > first]
        for run in affected:
            if run.ids is not None:
                lo, hi = bisect_left(run.ids, first), bisect_right(run.ids, last)
            else:
                lo = max(first, run.start) - run.start
                hi = min(last + 1, run.end) - run.start
            if lo >= hi:
                continue   # (a gapped run holding none of them)
            removed.extend(zip(run.locs[lo:hi], run.lens[lo:hi]))
            del runs[run.start]
            ids = run.ids
            if lo > 0:
                runs[run.start] = Run(run.start, run.locs[:lo], run.lens[:lo], None if ids is None else ids[:lo])
            if hi < len(run.locs):
                tail_start = run.start + hi if ids is None else ids[hi]
                runs[tail_start] = Run(tail_start, run.locs[hi:], run.lens[hi:], None if ids is None else ids[hi:])
        self._count -= len(removed)
        self._last = runs.peekitem(-1)[1] if runs else None
        return removed

    def truncate_after(self, entry_id: int) -> Removed:
        """Removes every entry with id > entry_id (a truncate no-op)."""
        return self.delete_range(entry_id + 1, (1 << 63) - 1)

    # -- checkpoint form -----------------------------------------------------

    def runs(self) -> list[tuple[int, bytes, bytes]]:
        """The checkpoint's form: (start, locations, lengths) per run of
        consecutive ids, a gapped run as its pieces."""
        out = []
        for r in self._runs.values():
            if r.ids is None:
                out.append((r.start, r.locs.tobytes(), r.lens.tobytes()))
                continue
            ids, lb, nb, cuts = r.ids, r.locs.tobytes(), r.lens.tobytes(), _piece_cuts(r.ids)
            out.extend((ids[a], lb[8 * a:8 * b], nb[4 * a:4 * b]) for a, b in zip(cuts, cuts[1:]))
        return out

    def runs_image(self) -> tuple[int, bytes]:
        """(how many runs, their checkpoint form: per run of consecutive ids
        its start (u64) and count (u32), then its locations and lengths,
        little-endian), in C passes where bookie._spans was built (a
        striped ledger's million pieces: 0.8 s of the bookie's loop in
        Python): one over the consecutive runs, one per gapped run."""
        if spans_c is not None and _LITTLE:
            count, parts, plain = 0, [], []
            for run in self._runs.values():
                if run.ids is None:
                    plain.append(run)
                    continue
                if plain:
                    count += len(plain)
                    parts.append(spans_c.runs_image(plain))
                    plain = []
                n, image = spans_c.gapped_image(run.ids, run.locs, run.lens)
                count += n
                parts.append(image)
            if plain:
                count += len(plain)
                parts.append(spans_c.runs_image(plain))
            return count, b"".join(parts)
        count, parts, pack = 0, [], RUN_HEAD.pack
        for run in self._runs.values():
            if run.ids is None:
                count += 1
                parts.append(pack(run.start, len(run.locs)) + run.locs.tobytes() + run.lens.tobytes())
                continue
            ids, lb, nb, cuts = run.ids, run.locs.tobytes(), run.lens.tobytes(), _piece_cuts(run.ids)
            count += len(cuts) - 1
            parts.append(b"".join(pack(ids[a], b - a) + lb[8 * a:8 * b] + nb[4 * a:4 * b]
                                  for a, b in zip(cuts, cuts[1:])))
        return count, b"".join(parts)

    @classmethod
    def from_runs(cls, runs: list[tuple[int, bytes, bytes]]) -> "LedgerIndex":
        """The index of a checkpoint's runs (``runs``, ascending), a run
        joining the one before it as ``put`` would have joined its ids
        (past the end of a short or gapped run: gapped)."""
        idx = cls()
        cur: Run | None = None
        for start, locs, lens in runs:
            la, le = array("Q"), array("I")
            la.frombytes(locs)
            le.frombytes(lens)
            if len(la) != len(le) or not la:
                raise ValueError("corrupt index run")
            if cur is not None and cur.joins(start):
                cur.append(start, la, le)
            else:
                cur = idx._runs[start] = Run(start, la, le)
            idx._count += len(la)
        idx._last = idx._runs.peekitem(-1)[1] if idx._runs else None
        return idx
