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

A striped read's batch (E > Qw: each bookie sends the ids of some
residues of ``id mod E``, stream/read_plan.py) holds *interleaves* instead
(``Interleave``): the bookies' frames as they came, a part per bookie's
share, put in id order only when the records are read, one at a time, as
a plain run's are.  Making the batch costs a few array slices per frame,
not a step per record (issue 18: a striped reader had spent about as much
again as the whole Qw = E read merging its shares record by record).
"""
from __future__ import annotations

import bisect
from array import array
from itertools import accumulate, cycle, islice, repeat
from operator import add
from typing import Iterable, Iterator, NamedTuple

from bookie import entry as entry_codec
from bookie.entry import HEADER_SIZE
from stream.position import Position, Record
from stream.read_plan import RangeRead, count_ids, residue_steps

_ONE = b"\x01"


class Interleave:
    """The records of ids ``first..first + n - 1`` held in parts, one per
    bookie share: part (buffer, offsets, header size, residues) holds, in a
    plain run's layout, every id of the range whose residue ``id mod
    stripe`` is in ``residues`` (the parts' residues are disjoint and cover
    the range).  Record j is found from a table over one cycle of
    ``stripe`` ids: which part holds the id at that place of the cycle, and
    how many ids of that part come before it in the cycle."""

    __slots__ = ("first", "n", "stripe", "parts", "_owner", "_rank")

    def __init__(self, first: int, n: int, stripe: int, parts: list[tuple]):
        self.first, self.n, self.stripe, self.parts = first, n, stripe, parts
        owner, rank = [], []
        for t in range(stripe):
            rho = (first + t) % stripe
            p = next((i for i, part in enumerate(parts) if part[3] >> rho & 1), -1)
            owner.append(p)
            rank.append(count_ids(first, first + t - 1, stripe, parts[p][3]) if p >= 0 else 0)
        self._owner, self._rank = owner, rank

    def record(self, j: int) -> tuple[int, bytes, int, int]:
        """(entry id, buffer, payload start, payload end) of record ``j``."""
        c, t = divmod(j, self.stripe)
        buf, offs, hdr, residues = self.parts[self._owner[t]]
        k = c * bin(residues).count("1") + self._rank[t]
        return self.first + j, buf, offs[k] + hdr, offs[k + 1]

    def payloads(self, views: bool = False) -> Iterator:
        """The payloads in id order, as bytes (or memoryviews)."""
        its = [_payloads(buf, offs, hdr, views) for buf, offs, hdr, _ in self.parts]
        for p in islice(cycle(self._owner), self.n):
            yield next(its[p])

    @property
    def payload_bytes(self) -> int:
        return sum(offs[-1] - offs[0] - hdr * (len(offs) - 1) for _, offs, hdr, _ in self.parts)

    def split(self, m: int) -> tuple["Interleave", "Interleave"]:
        """(the first ``m`` records, the rest), 0 < m < n: each part cut
        where its ids reach ``first + m``."""
        head, tail = [], []
        for buf, offs, hdr, residues in self.parts:
            k = count_ids(self.first, self.first + m - 1, self.stripe, residues)
            head.append((buf, offs[:k + 1], hdr, residues))
            tail.append((buf, offs[k:], hdr, residues))
        return (Interleave(self.first, m, self.stripe, head),
                Interleave(self.first + m, self.n - m, self.stripe, tail))


def _payloads(buf, offs: array, hdr: int, views: bool) -> Iterator:
    src = memoryview(buf) if views else buf
    b = offs[0]
    for e in offs[1:]:
        yield src[b + hdr:e] if views else bytes(src[b + hdr:e])
        b = e


def _nth_id(eid: int, k: int, stripe: int, residues: int) -> int:
    """The id ``k`` places after ``eid`` (of a residue in ``residues``)
    among the ids whose residue is in ``residues``."""
    full, rest = divmod(k, bin(residues).count("1"))
    e = eid + full * stripe
    steps = residue_steps(stripe, residues)
    for _ in range(rest):
        e += steps[e % stripe]
    return e


def _by_residue(eid: int, z: int, stripe: int, residues: int) -> list[tuple[int, int, int]]:
    """The ids of ``eid..z`` whose residue is in ``residues`` (``eid`` one
    of them), a residue at a time: (its first id, how many, its place in
    the sequence: its k-th id is the sequence's place + k * popcount)."""
    out, steps, e = [], residue_steps(stripe, residues), eid
    for i in range(bin(residues).count("1")):
        if e > z:
            break
        out.append((e, (z - e) // stripe + 1, i))
        e += steps[e % stripe]
    return out


class _Share(NamedTuple):
    """A striped read's run kept by ``RunSlots`` until ``batch``: the ids
    ``first..last`` of ``residues`` (mod ``stripe``), in ``buf`` at
    ``offs``, from the read of ``read_first..``."""

    first: int
    last: int
    buf: bytes
    offs: array
    stripe: int
    residues: int
    read_first: int


def _count(run) -> int:
    return run.n if type(run) is Interleave else len(run[2]) - 1


def _first_id(run) -> int:
    return run.first if type(run) is Interleave else run[0]


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
        self._runs: list = list(runs)   # (first id, buffer, offsets, header size) or Interleave, ascending ids
        self._n = sum(map(_count, self._runs))
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
                at += _count(r)
            self._starts = starts
        k = bisect.bisect_right(self._starts, i) - 1
        return runs[k], i - self._starts[k]

    def _record(self, i: int) -> tuple[int, bytes, int, int]:
        """(entry id, buffer, payload start, payload end) of record ``i``."""
        run, j = self._locate(i)
        if type(run) is Interleave:
            return run.record(j)
        eid, buf, offs, hdr = run
        return eid + j, buf, offs[j] + hdr, offs[j + 1]

    def __getitem__(self, i: int) -> bytes:
        _, buf, a, b = self._record(i)
        return bytes(buf[a:b])

    def payload(self, i: int) -> bytes:
        return self[i]

    def view(self, i: int) -> memoryview:
        _, buf, a, b = self._record(i)
        return memoryview(buf)[a:b]

    def position(self, i: int) -> Position:
        return Position._of(self._record(i)[0])

    def __iter__(self) -> Iterator[bytes]:
        for run in self._runs:
            if type(run) is Interleave:
                yield from run.payloads()
                continue
            _, buf, offs, hdr = run
            b = offs[0]
            for e in offs[1:]:
                yield bytes(buf[b + hdr:e])
                b = e

    def views(self) -> Iterator[memoryview]:
        for run in self._runs:
            if type(run) is Interleave:
                yield from run.payloads(views=True)
                continue
            _, buf, offs, hdr = run
            mv, b = memoryview(buf), offs[0]
            for e in offs[1:]:
                yield mv[b + hdr:e]
                b = e

    def entry_ids(self) -> Iterator[int]:
        for run in self._runs:
            eid = _first_id(run)
            yield from range(eid, eid + _count(run))

    def positions(self) -> Iterator[Position]:
        of = Position._of
        for eid in self.entry_ids():
            yield of(eid)

    @property
    def first_position(self) -> Position | None:
        return Position._of(_first_id(self._runs[0])) if self._n else None

    @property
    def last_position(self) -> Position | None:
        if not self._n:
            return None
        run = self._runs[-1]
        return Position._of(_first_id(run) + _count(run) - 1)

    @property
    def payload_bytes(self) -> int:
        return sum(run.payload_bytes if type(run) is Interleave else run[2][-1] - run[2][0] - run[3] * (len(run[2]) - 1)
                   for run in self._runs)

    def records(self) -> list[Record]:
        """A ``Record`` (position, payload bytes) per record: ``read``'s list."""
        new, of = tuple.__new__, Position._of
        out: list[Record] = []
        add = out.append
        for run in self._runs:
            if type(run) is Interleave:
                for eid, p in zip(range(run.first, run.first + run.n), run.payloads()):
                    add(new(Record, (of(eid), p)))
                continue
            eid, buf, offs, hdr = run
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
            c = _count(run)
            if n >= c:
                head.append(run)
                n -= c
                if n == 0:
                    return RecordBatch(head), RecordBatch(runs[k + 1:])
                continue
            if type(run) is Interleave:
                h, t = run.split(n)
                head.append(h)
                return RecordBatch(head), RecordBatch([t, *runs[k + 1:]])
            eid, buf, offs, hdr = run
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

    A striped read's share (E > Qw: the ids of some residues of ``id mod
    E`` per bookie) comes as runs of the ids of those residues, which
    interleave with the other bookies' in id order: they are kept as they
    came (``strided``), and ``batch`` makes them ``Interleave``s when they
    are all the batch holds and hold every id; otherwise (a no-op, an entry
    read by itself, a bookie that sent ids it was not asked for) the
    payloads go to a slot per id (memoryviews into the frames) and
    ``batch`` joins them into one buffer."""

    def __init__(self, ledger_id: int, first: int, last: int):
        self.ledger_id, self.first = ledger_id, first
        self.have = bytearray(last - first + 1)
        self.runs: list[tuple] = []
        self.strided: list[_Share] = []   # a striped read's runs, as they came
        self.views: list | None = None   # a payload per id, for odd deliveries (made when needed)

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
        stripe, residues = r.stripe, r.residues
        runs, noops = entry_codec.sparse_runs(buf, self.ledger_id, after, start, stop, r.steps())
        base, have, last = self.first, self.have, r.last
        delivered, top = 0, after
        for eid, offs in runs:
            if eid > last:
                break
            c = len(offs) - 1
            if not stripe:
                if eid + c - 1 > last:
                    c = last - eid + 1
                    offs = offs[:c + 1]
                top = max(top, eid + c - 1)
                k = eid - base
                if have.find(1, k, k + c) < 0:
                    have[k:k + c] = _ONE * c
                    self.runs.append((eid, buf, offs, HEADER_SIZE))
                    delivered += c
                else:
                    delivered += self._put_some(eid, buf, offs, r)[0]
                continue
            if not residues >> (eid % stripe) & 1:   # (a run from an id not asked: record by record)
                n, z = self._put_some(eid, buf, offs, r)
                delivered, top = delivered + n, max(top, z)
                continue
            c = min(c, count_ids(eid, last, stripe, residues))
            offs = offs[:c + 1] if c < len(offs) - 1 else offs
            z = _nth_id(eid, c - 1, stripe, residues)
            top = max(top, z)
            shares = _by_residue(eid, z, stripe, residues)
            if all(have[e - base:e - base + (n - 1) * stripe + 1:stripe].count(1) == 0 for e, n, _ in shares):
                for e, n, _ in shares:
                    have[e - base:e - base + (n - 1) * stripe + 1:stripe] = _ONE * n
                self.strided.append(_Share(eid, z, buf, offs, stripe, residues, r.first))
                delivered += c
            else:
                delivered += self._put_some(eid, buf, offs, r)[0]
        for eid in noops:
            if eid <= last:
                top = max(top, eid)
                if r.wants(eid) and not have[eid - base]:
                    have[eid - base] = 1
                    delivered += 1
        return delivered, top

    def _put_some(self, eid: int, buf: bytes, offs: array, r: RangeRead) -> tuple[int, int]:
        """A run of which only some records are asked of ``r`` or new: those
        join, as runs of their own (a striped read's: in the slots).
        Returns (how many joined, the run's last id up to ``r.last``)."""
        have, base, c = self.have, self.first, len(offs) - 1
        ids = [eid]
        if r.stripe:
            steps, stripe = r.steps(), r.stripe
            for _ in range(c - 1):
                ids.append(ids[-1] + steps[ids[-1] % stripe])
        else:
            ids = list(range(eid, eid + c))
        keep = [r.wants(e) and not have[e - base] for e in ids]
        top = max((e for e in ids if e <= r.last), default=eid - 1)
        if r.stripe:
            views, mv = self._views(), memoryview(buf)
            for j in range(c):
                if keep[j]:
                    i = ids[j] - base
                    have[i] = 1
                    views[i] = mv[offs[j] + HEADER_SIZE:offs[j + 1]]
            return sum(keep), top
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
        return n, top

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
        if self.strided:
            if self.views is None and not runs:
                woven = self._interleaves()
                if woven is not None:
                    return RecordBatch(woven)
            views, base = self._views(), self.first
            for eid, z, buf, offs, stripe, residues, _ in self.strided:
                mv = memoryview(buf)
                payloads = list(map(mv.__getitem__, map(slice, map(add, offs[:-1], repeat(HEADER_SIZE)), offs[1:])))
                m = bin(residues).count("1")
                for e, n, i in _by_residue(eid, z, stripe, residues):
                    views[e - base:e - base + (n - 1) * stripe + 1:stripe] = payloads[i::m]
            self.strided = []
        if self.views is not None:
            return RecordBatch(self._joined())
        if any(runs[k][0] > runs[k + 1][0] for k in range(len(runs) - 1)):
            runs.sort(key=_first_id)
        return RecordBatch(runs)

    def _interleaves(self) -> list[Interleave] | None:
        """The striped shares as ``Interleave``s over ``first..last``, or
        None unless they hold every id, all of one stripe E, and each
        interleave's parts hold all its ids of their residues.  A frame's
        share and the one before it of the same read are cut apart: the cut
        falls after the id before the frame's first among the ids of its
        residues, at the latest at that first id; the cuts are the fewest
        such points (a greedy stab of those intervals) besides the first id
        of every read (a block, whose reads share out the residues their own
        way)."""
        pieces = self.strided
        E = pieces[0].stripe
        if any(p.stripe != E for p in pieces) or sum(len(p.offs) - 1 for p in pieces) != len(self.have):
            return None   # (the shares are disjoint: as many ids as the range, every id)
        first, end = self.first, self.first + len(self.have)
        by_residue: list[list[_Share]] = [[] for _ in range(E)]   # the runs holding ids of each residue
        cuts, blocks = [first], sorted({p.read_first for p in pieces})
        b = 0
        for p in sorted(pieces, key=_first_id):
            eid, residues = p.first, p.residues
            while b < len(blocks) and blocks[b] <= eid:
                if blocks[b] > cuts[-1]:
                    cuts.append(blocks[b])
                b += 1
            for f, _, _ in _by_residue(eid, p.last, E, residues):
                by_residue[f % E].append(p)
            before = eid - next(d for d in range(1, E + 1) if residues >> (eid - d) % E & 1)
            if cuts[-1] <= before:
                cuts.append(eid)
        cuts.append(end)
        starts = [[q.first for q in qs] for qs in by_residue]
        out = []
        for x, y in zip(cuts, cuts[1:]):
            shares: dict[int, tuple] = {}
            for e0 in range(x, min(y, x + E)):
                r = e0 % E
                i = bisect.bisect_right(starts[r], e0) - 1
                if i < 0:
                    return None
                share = by_residue[r][i]
                shares[id(share)] = share
            parts, seen = [], 0
            for eid, z, buf, offs, _, residues, _ in shares.values():
                n = count_ids(x, y - 1, E, residues)
                if seen & residues or count_ids(max(x, eid), min(y - 1, z), E, residues) != n:
                    return None   # (a share holding only some of its residues' ids here)
                seen |= residues
                k = count_ids(eid, x - 1, E, residues)
                parts.append((buf, offs[k:k + n + 1], HEADER_SIZE, residues))
            out.append(Interleave(x, y - x, E, parts))
        return out

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
