"""A batch of records as a reader returns it without an object per record
(:class:`RecordBatch`, issue 18), and what a range read of ``first..last``
has delivered so far (:class:`RunSlots` for a batch, :class:`EntrySlots`
for a list of entries: the two sinks of ``stream.ledger_read``'s range
reads).  Pure: no I/O.

A batch is a few *runs*: records of consecutive ids, contiguous in one
buffer (a range read's frame, as the bookie sent it), each run kept as
(first id, buffer, offsets, header size): record k's payload is
``buffer[offsets[k] + header:offsets[k + 1]]``.  Nothing per record is
built until asked for: a payload is sliced (bytes) or viewed (memoryview)
when read, a position made when asked.  Every record of a batch had its
checksum, ledger id and order verified (``bookie.entry.sparse_runs``)
before it joined one; no-ops are in none.
"""
from __future__ import annotations

import bisect
from array import array
from itertools import accumulate, repeat
from operator import add
from typing import Iterable, Iterator

from bookie import entry as entry_codec
from bookie.entry import HEADER_SIZE
from stream.position import Position, Record
from stream.read_plan import RangeRead

_ONE = b"\x01"


class RecordBatch:
    """Records of a stream in order, held in the buffers they were read in
    (``AsyncStreamReader.read_batch``).  ``len(b)``; ``b[i]`` and iteration:
    payloads as bytes (one copy each, made when asked); ``b.view(i)`` and
    ``b.views()``: payloads as memoryviews into the buffers (no copy; they
    keep the buffer alive); ``b.position(i)``, ``b.positions()``,
    ``b.first_position`` / ``b.last_position`` (None when empty);
    ``b.payload_bytes``: the payloads' total size; ``b.records()``: the
    batch as ``read`` returns it (a ``Record`` per record)."""

    __slots__ = ("_runs", "_n", "_starts")

    def __init__(self, runs: Iterable[tuple] = ()):
        self._runs: list[tuple] = list(runs)   # (first id, buffer, offsets, header size), ascending ids
        self._n = sum(len(r[2]) - 1 for r in self._runs)
        self._starts: list[int] | None = None  # the batch index of each run's first record (built when needed)

    @classmethod
    def of_records(cls, records: Iterable[Record]) -> "RecordBatch":
        """A batch of records already made (one run per record)."""
        return cls((r.position.entry_id, r.payload, array("Q", (0, len(r.payload))), 0) for r in records)

    @staticmethod
    def join(batches: list["RecordBatch"]) -> "RecordBatch":
        """The records of ``batches`` one after the other (ids ascending)."""
        batches = [b for b in batches if b._n]
        if len(batches) == 1:
            return batches[0]
        return RecordBatch(r for b in batches for r in b._runs)

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __repr__(self) -> str:
        if not self._n:
            return "RecordBatch([])"
        return f"RecordBatch({self._n} records, {self.first_position}..{self.last_position})"

    def _locate(self, i: int) -> tuple[tuple, int]:
        """The run of record ``i`` and its index in the run."""
        if not isinstance(i, int):
            raise TypeError(f"record indexes are ints, got {type(i).__name__}")
        n = self._n
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record index {i} out of range (batch of {n})")
        runs = self._runs
        if len(runs) == 1:
            return runs[0], i
        if self._starts is None:
            starts, at = [], 0
            for r in runs:
                starts.append(at)
                at += len(r[2]) - 1
            self._starts = starts
        k = bisect.bisect_right(self._starts, i) - 1
        return runs[k], i - self._starts[k]

    def __getitem__(self, i: int) -> bytes:
        (_, buf, offs, hdr), j = self._locate(i)
        return bytes(buf[offs[j] + hdr:offs[j + 1]])

    def payload(self, i: int) -> bytes:
        return self[i]

    def view(self, i: int) -> memoryview:
        (_, buf, offs, hdr), j = self._locate(i)
        return memoryview(buf)[offs[j] + hdr:offs[j + 1]]

    def position(self, i: int) -> Position:
        (eid, _, _, _), j = self._locate(i)
        return Position._of(eid + j)

    def __iter__(self) -> Iterator[bytes]:
        for _, buf, offs, hdr in self._runs:
            b = offs[0]
            for e in offs[1:]:
                yield bytes(buf[b + hdr:e])
                b = e

    def views(self) -> Iterator[memoryview]:
        for _, buf, offs, hdr in self._runs:
            mv, b = memoryview(buf), offs[0]
            for e in offs[1:]:
                yield mv[b + hdr:e]
                b = e

    def entry_ids(self) -> Iterator[int]:
        for eid, _, offs, _ in self._runs:
            yield from range(eid, eid + len(offs) - 1)

    def positions(self) -> Iterator[Position]:
        of = Position._of
        for eid in self.entry_ids():
            yield of(eid)

    @property
    def first_position(self) -> Position | None:
        return Position._of(self._runs[0][0]) if self._n else None

    @property
    def last_position(self) -> Position | None:
        if not self._n:
            return None
        eid, _, offs, _ = self._runs[-1]
        return Position._of(eid + len(offs) - 2)

    @property
    def payload_bytes(self) -> int:
        return sum(offs[-1] - offs[0] - hdr * (len(offs) - 1) for _, _, offs, hdr in self._runs)

    def records(self) -> list[Record]:
        """A ``Record`` (position, payload bytes) per record: ``read``'s list."""
        new, of = tuple.__new__, Position._of
        out: list[Record] = []
        add = out.append
        for eid, buf, offs, hdr in self._runs:
            b = offs[0]
            for e in offs[1:]:
                add(new(Record, (of(eid), buf[b + hdr:e])))
                b = e
                eid += 1
        return out

    def split(self, n: int) -> tuple["RecordBatch", "RecordBatch"]:
        """(the first ``n`` records, the rest): a run cut in two shares its
        buffer."""
        if n >= self._n:
            return self, EMPTY
        if n <= 0:
            return EMPTY, self
        head: list[tuple] = []
        runs = self._runs
        for k, run in enumerate(runs):
            eid, buf, offs, hdr = run
            c = len(offs) - 1
            if n >= c:
                head.append(run)
                n -= c
                if n == 0:
                    return RecordBatch(head), RecordBatch(runs[k + 1:])
                continue
            head.append((eid, buf, offs[:n + 1], hdr))
            return RecordBatch(head), RecordBatch([(eid + n, buf, offs[n:], hdr), *runs[k + 1:]])
        raise AssertionError("unreachable")


EMPTY = RecordBatch()


class RunSlots:
    """What the range reads of ids ``first..last`` delivered so far, as a
    batch's runs: a byte per id says whether it was delivered (a no-op is
    delivered and in no run).  A frame's records join whole when they are
    all new and all asked of that read (the common case: one slice
    assignment); otherwise record by record.

    A striped read's share (E > Qw: one residue of ``id mod E`` per bookie)
    comes as runs of ids E apart, which interleave with the other bookies'
    in id order: their payloads go to a slot per id (memoryviews into the
    frames, set by extended-slice assignment), and ``batch`` joins them
    into one buffer (one copy, no object per record kept)."""

    def __init__(self, ledger_id: int, first: int, last: int):
        self.ledger_id, self.first = ledger_id, first
        self.have = bytearray(last - first + 1)
        self.runs: list[tuple] = []
        self.views: list | None = None   # a payload per id, for strided and odd deliveries (made when needed)

    def _views(self) -> list:
        if self.views is None:
            self.views = [None] * len(self.have)
        return self.views

    def put_frame(self, buf: bytes, start: int, stop: int, after: int, r: RangeRead) -> tuple[int, int]:
        """The records of ``buf[start:stop]``, a frame of the planned read
        ``r`` whose last id so far was ``after``: those ``r`` asked for and
        not delivered yet join (ids past ``r.last`` are dropped).  Returns
        (how many joined, the frame's last id up to ``r.last``, or
        ``after``).  Raises ChecksumMismatch / MalformedEntry (nothing of
        the frame joins then)."""
        stripe = r.stripe
        step = stripe if stripe and r.residues & (r.residues - 1) == 0 else 1   # (one residue: ids E apart)
        runs, noops = entry_codec.sparse_runs(buf, self.ledger_id, after, start, stop, step)
        base, have, last = self.first, self.have, r.last
        delivered, top = 0, after
        for eid, offs in runs:
            if eid > last:
                break
            c = len(offs) - 1
            if eid + (c - 1) * step > last:
                c = (last - eid) // step + 1
                offs = offs[:c + 1]
            top = max(top, eid + (c - 1) * step)
            k = eid - base
            if step == 1:
                if not stripe and have.find(1, k, k + c) < 0:
                    have[k:k + c] = _ONE * c
                    self.runs.append((eid, buf, offs, HEADER_SIZE))
                    delivered += c
                else:
                    delivered += self._put_some(eid, buf, offs, r)
            elif r.residues >> (eid % stripe) & 1 and have[k:k + (c - 1) * step + 1:step].count(1) == 0:
                have[k:k + (c - 1) * step + 1:step] = _ONE * c
                mv = memoryview(buf)
                self._views()[k:k + (c - 1) * step + 1:step] = list(map(
                    mv.__getitem__, map(slice, map(add, offs[:c], repeat(HEADER_SIZE)), offs[1:])))
                delivered += c
            else:
                delivered += self._put_some(eid, buf, offs, r, step)
        for eid in noops:
            if eid <= last:
                top = max(top, eid)
                if r.wants(eid) and not have[eid - base]:
                    have[eid - base] = 1
                    delivered += 1
        return delivered, top

    def _put_some(self, eid: int, buf: bytes, offs: array, r: RangeRead, step: int = 1) -> int:
        """A run of which only some records are asked of ``r`` or new: those
        join, as runs of their own (or, ids ``step`` apart, in the slots)."""
        have, base, c = self.have, self.first, len(offs) - 1
        keep = [r.wants(eid + j * step) and not have[eid + j * step - base] for j in range(c)]
        if step != 1:
            views, mv = self._views(), memoryview(buf)
            for j in range(c):
                if keep[j]:
                    i = eid + j * step - base
                    have[i] = 1
                    views[i] = mv[offs[j] + HEADER_SIZE:offs[j + 1]]
            return sum(keep)
        j = n = 0
        while j < c:
            if not keep[j]:
                j += 1
                continue
            a = j
            while j < c and keep[j]:
                have[eid + j - base] = 1
                j += 1
            self.runs.append((eid + a, buf, offs[a:j + 1], HEADER_SIZE))
            n += j - a
        return n

    def put_entry(self, e: entry_codec.Entry) -> None:
        """An entry read by itself (``ReadPath._read_one``), verified."""
        i = e.entry_id - self.first
        if self.have[i]:
            return
        self.have[i] = 1
        if not e.is_noop:
            if self.views is not None:
                self.views[i] = e.payload
            else:
                self.runs.append((e.entry_id, e.payload, array("Q", (0, len(e.payload))), 0))

    def missing(self, a: int, b: int) -> list[int]:
        """The ids of ``a..b`` not delivered, ascending."""
        out, have, base = [], self.have, self.first
        i, end = a - base, b - base + 1
        while True:
            i = have.find(0, i, end)
            if i < 0:
                return out
            out.append(base + i)
            i += 1

    def full(self, a: int, b: int) -> bool:
        return self.have.find(0, a - self.first, b - self.first + 1) < 0

    def undelivered(self, r: RangeRead) -> bool:
        """Whether some id of ``r`` was not delivered."""
        if not r.stripe:
            return not self.full(r.first, r.last)
        return any(not self.have[i - self.first] for i in r.ids())

    def batch(self) -> RecordBatch:
        """The records delivered, in id order."""
        runs = self.runs
        if self.views is not None:
            return RecordBatch(self._joined())
        if any(runs[k][0] > runs[k + 1][0] for k in range(len(runs) - 1)):
            runs.sort(key=_first_id)
        return RecordBatch(runs)

    def _joined(self) -> list[tuple]:
        """The slots' payloads (and the runs', put in the slots first) as
        runs of one buffer each, split where an id has no record (a no-op,
        or not delivered)."""
        views, base = self.views, self.first
        for eid, buf, offs, hdr in self.runs:
            mv = memoryview(buf)
            views[eid - base:eid - base + len(offs) - 1] = list(map(
                mv.__getitem__, map(slice, map(add, offs[:-1], repeat(hdr)), offs[1:])))
        out, i, n = [], 0, len(views)
        while i < n:
            if views[i] is None:
                i += 1
                continue
            try:
                j = views.index(None, i)
            except ValueError:
                j = n
            seg = views[i:j]
            offs = array("Q", (0,))
            offs.extend(accumulate(map(len, seg)))
            out.append((base + i, b"".join(seg), offs, 0))
            i = j
        return out


def _first_id(run: tuple) -> int:
    return run[0]


class EntrySlots:
    """What the range reads of ids ``first..last`` delivered so far, as a
    slot per id (an ``Entry``, or None): ``ReadPath.read_entries``'s sink."""

    def __init__(self, ledger_id: int, first: int, last: int):
        self.ledger_id, self.first = ledger_id, first
        self.slots: list = [None] * (last - first + 1)

    def put_frame(self, buf: bytes, start: int, stop: int, after: int, r: RangeRead) -> tuple[int, int]:
        """As ``RunSlots.put_frame``, an ``Entry`` per record."""
        got = entry_codec.decode_sparse(buf, self.ledger_id, after, start, stop)
        if got and got[-1].entry_id > r.last:
            got = [e for e in got if e.entry_id <= r.last]
        if not got:
            return 0, after
        base, slots = self.first, self.slots
        k = got[0].entry_id - base
        if (not r.stripe and got[-1].entry_id - got[0].entry_id == len(got) - 1
                and slots[k:k + len(got)].count(None) == len(got)):
            slots[k:k + len(got)] = got   # (the common case: consecutive, all new)
            return len(got), got[-1].entry_id
        delivered = 0
        stripe, residues = r.stripe, r.residues
        for e in got:
            i = e[1] - base
            if (not stripe or residues >> (e[1] % stripe) & 1) and slots[i] is None:
                slots[i] = e   # (an id of this read: the bookie's filter, r.wants)
                delivered += 1
        return delivered, got[-1].entry_id

    def put_entry(self, e: entry_codec.Entry) -> None:
        self.slots[e.entry_id - self.first] = e

    def missing(self, a: int, b: int) -> list[int]:
        base, slots = self.first, self.slots
        return [i for i in range(a, b + 1) if slots[i - base] is None]

    def full(self, a: int, b: int) -> bool:
        return self.slots[a - self.first:b - self.first + 1].count(None) == 0

    def undelivered(self, r: RangeRead) -> bool:
        base, slots = self.first, self.slots
        if not r.stripe:
            return slots[r.first - base:r.last - base + 1].count(None) > 0
        return any(slots[i - base] is None for i in r.ids())


__all__ = ["RecordBatch", "RunSlots", "EntrySlots", "EMPTY"]
