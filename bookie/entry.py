"""The entry record: the one place that packs and parses entries.

An entry travels, is journalled and is served back as the same bytes: a
60-byte little-endian header followed by the payload (layout in
proto/bookie.proto).  The CRC-32 covers bytes [18, 60) of the header (ledger
id, entry id, LAC, LAFR, data flags, origin term) and the payload: what the
entry *is*.  The *origin term* is the term of whoever created the entry (a
writer's appends: its term; a recovery's truncate no-op: the recovering
term; classic ledgers: 0); a recovery write-back copies it unchanged, like
the payload, so recovery can tell an older term's leftovers from what a
newer term decided (README, "Recovery and the origin term").
The term and the RECOVERY_ADD flag describe how a record was sent, so they
sit outside the checksum, before it: the checked bytes run to the record's
end, and one CRC call over one slice checks a record (two were needed while
the unchecked fields sat between the header and the payload).
"""
from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

from bookie import native
from bookie.crc import crc32

# payload_len, checksum, req_flags, term | ledger_id, entry_id, lac, lafr, data_flags, origin
ENTRY_HEADER = struct.Struct("<IIHQQqqqHQ")
HEADER_SIZE = ENTRY_HEADER.size
assert HEADER_SIZE == 60

CHECKSUM_START = 18  # the checksum covers bytes [18, end of the record)

# What a bookie's data dir says it holds (its FORMAT file, bookie/storage.py):
# records of another layout would read as a torn journal tail and be cut.
RECORD_FORMAT = "bookstream entry records v2: 60-byte header with the origin term"

# data_flags (covered by the checksum)
FLAG_NOOP = 1
FLAG_TRUNCATE = 2
DATA_FLAGS_MASK = FLAG_NOOP | FLAG_TRUNCATE
# req_flags (not covered)
REQ_RECOVERY = 1
REQ_FLAGS_MASK = REQ_RECOVERY

MAX_LEDGER_ID = (1 << 64) - 1
MAX_ENTRY_ID = (1 << 63) - 1



class MalformedEntry(ValueError):
    """A record that cannot be parsed: truncated, or with impossible fields."""


class ChecksumMismatch(ValueError):
    """A record whose CRC does not match its contents."""

    def __init__(self, ledger_id: int, entry_id: int):
        super().__init__(f"checksum mismatch for ledger {ledger_id} entry {entry_id}")
        self.ledger_id = ledger_id
        self.entry_id = entry_id


class _Flags:
    """The flag tests of a record's header (``data_flags``, ``req_flags``)."""

    __slots__ = ()

    @property
    def is_noop(self) -> bool:
        return bool(self.data_flags & FLAG_NOOP)

    @property
    def is_truncate(self) -> bool:
        return bool(self.data_flags & FLAG_TRUNCATE)

    @property
    def is_recovery(self) -> bool:
        return bool(self.req_flags & REQ_RECOVERY)


@dataclass(slots=True)
class EntryHeader(_Flags):
    """The parsed header of one record, and where it sits in its buffer.
    (Not frozen: a frozen dataclass's __init__ costs more, and one of
    these is built per entry on the data path.  Treat it as read-only.)"""

    ledger_id: int
    entry_id: int
    lac: int
    lafr: int
    data_flags: int
    req_flags: int
    term: int
    origin: int  # the origin term (covered by the checksum)
    checksum: int
    payload_len: int
    offset: int  # of the record in the buffer it was parsed from

    @property
    def size(self) -> int:
        return HEADER_SIZE + self.payload_len


def compute_checksum(record: bytes | memoryview, payload_len: int) -> int:
    return crc32(memoryview(record)[CHECKSUM_START : HEADER_SIZE + payload_len])


def encode(
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    *,
    lac: int = -1,
    lafr: int = -1,
    data_flags: int = 0,
    req_flags: int = 0,
    term: int = 0,
    origin: int | None = None,
) -> bytes:
    """Builds one signed record; ``origin`` (the origin term) defaults to
    ``term``: an entry created by whoever sends it."""
    if origin is None:
        origin = term
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise ValueError(f"ledger id out of range: {ledger_id}")
    if not 0 <= entry_id <= MAX_ENTRY_ID:
        raise ValueError(f"entry id out of range: {entry_id}")
    if data_flags & ~DATA_FLAGS_MASK or req_flags & ~REQ_FLAGS_MASK:
        raise ValueError("unknown flags")
    if data_flags & FLAG_TRUNCATE and not data_flags & FLAG_NOOP:
        raise ValueError("the truncate flag is only valid on a no-op entry")
    if not 0 <= origin <= term:
        raise ValueError(f"origin term {origin} must be in [0, term {term}]")
    head = ENTRY_HEADER.pack(len(payload), 0, req_flags, term, ledger_id, entry_id, lac, lafr, data_flags, origin)
    crc = crc32(payload, crc32(head[CHECKSUM_START:]))
    return struct.pack("<II", len(payload), crc) + head[8:] + payload


_UNSIGNED = struct.Struct("<HQ")        # bytes 8..18: req_flags, term
_SIGNED = struct.Struct("<QqqqHQ")      # bytes 18..60: ledger_id, entry_id, lac, lafr, data_flags, origin
_LEN_CRC = struct.Struct("<II")
assert _LEN_CRC.size + _UNSIGNED.size + _SIGNED.size == HEADER_SIZE and 8 + _UNSIGNED.size == CHECKSUM_START
_SPAN = struct.Struct("<I22xq")         # payload_len, entry_id


def encode_run(ledger_id: int, first_entry: int, payloads, *, lac: int, lafr: int, term: int) -> list[bytes]:
    """Signed records for consecutive entries from ``first_entry`` (no flags,
    origin term = ``term``): the writer's hot path, the same bytes as
    ``encode`` one at a time."""
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise ValueError(f"ledger id out of range: {ledger_id}")
    if not 0 <= first_entry and first_entry + len(payloads) - 1 <= MAX_ENTRY_ID:
        raise ValueError(f"entry ids out of range: {first_entry}+{len(payloads)}")
    signed, lencrc, checksum = _SIGNED.pack, _LEN_CRC.pack, crc32
    unsigned = _UNSIGNED.pack(0, term)
    out = []
    eid = first_entry
    for payload in payloads:
        t = signed(ledger_id, eid, lac, lafr, 0, term)
        out.append(lencrc(len(payload), checksum(payload, checksum(t))) + unsigned + t + payload)
        eid += 1
    return out


def parse_header(buf: bytes | memoryview, offset: int = 0) -> EntryHeader:
    if len(buf) - offset < HEADER_SIZE:
        raise MalformedEntry("truncated entry header")
    plen, crc, rflags, term, lid, eid, lac, lafr, dflags, origin = ENTRY_HEADER.unpack_from(buf, offset)
    if len(buf) - offset - HEADER_SIZE < plen:
        raise MalformedEntry("truncated entry payload")
    if eid < 0:
        raise MalformedEntry(f"negative entry id {eid}")
    if lac < -1 or lafr < -1:
        raise MalformedEntry("LAC and LAFR must be >= -1")
    if dflags & ~DATA_FLAGS_MASK or rflags & ~REQ_FLAGS_MASK:
        raise MalformedEntry("unknown flags")
    if dflags & FLAG_TRUNCATE and not dflags & FLAG_NOOP:
        raise MalformedEntry("truncate flag on an entry that is not a no-op")
    if origin > term:
        raise MalformedEntry(f"origin term {origin} above the record's term {term}")
    return EntryHeader(lid, eid, lac, lafr, dflags, rflags, term, origin, crc, plen, offset)


def verify(buf: bytes | memoryview, header: EntryHeader) -> None:
    mv = memoryview(buf)[header.offset : header.offset + header.size]
    if compute_checksum(mv, header.payload_len) != header.checksum:
        raise ChecksumMismatch(header.ledger_id, header.entry_id)


class EntryTooLarge(MalformedEntry):
    def __init__(self, header: EntryHeader, limit: int):
        super().__init__(f"entry {header.entry_id} of ledger {header.ledger_id} is {header.payload_len} bytes "
                         f"(limit {limit})")


def _checked(buf: bytes | memoryview, max_payload: int | None = None):
    """Yields (offset, end, header fields) for every record of a
    concatenation, each one bounds-, field- and checksum-checked first: the
    one loop under ``scan`` and ``decode_run``.  Raises MalformedEntry
    (EntryTooLarge above ``max_payload``) or ChecksumMismatch."""
    unpack, checksum, mv = ENTRY_HEADER.unpack_from, crc32, memoryview(buf)
    off, n = 0, len(buf)
    while off < n:
        if n - off < HEADER_SIZE:
            raise MalformedEntry("truncated entry header")
        f = unpack(buf, off)
        plen, crc, rflags, term, lid, eid, lac, lafr, dflags, origin = f
        end = off + HEADER_SIZE + plen
        if end > n:
            raise MalformedEntry("truncated entry payload")
        if eid < 0 or lac < -1 or lafr < -1 or dflags & ~DATA_FLAGS_MASK or rflags & ~REQ_FLAGS_MASK or (
                dflags & FLAG_TRUNCATE and not dflags & FLAG_NOOP) or origin > term:
            parse_header(buf, off)  # raises the precise MalformedEntry
        if max_payload is not None and plen > max_payload:
            raise EntryTooLarge(parse_header(buf, off), max_payload)
        if checksum(mv[off + CHECKSUM_START:end]) != crc:
            raise ChecksumMismatch(lid, eid)
        yield off, end, f
        off = end


def scan(buf: bytes | memoryview, max_payload: int | None = None) -> list[EntryHeader]:
    """Parses and verifies every record of a concatenation in one pass (the
    bookie's hot path: what ``iter_headers`` + ``verify`` do, record by
    record).  Raises MalformedEntry (EntryTooLarge above ``max_payload``) or
    ChecksumMismatch."""
    return [EntryHeader(lid, eid, lac, lafr, dflags, rflags, term, origin, crc, plen, off)
            for off, _, (plen, crc, rflags, term, lid, eid, lac, lafr, dflags, origin) in _checked(buf, max_payload)]


class EntryRun(_Flags):
    """Consecutive entries of one ledger, contiguous in a buffer, sent with
    one term and one kind (normal or recovery add): what a bookie admits and
    applies at once.  A truncate no-op is always a run of its own.  Per entry
    only its offset and record length are kept (two flat arrays); the LAC and
    LAFR are the run's highest."""

    __slots__ = ("ledger_id", "first_entry", "term", "req_flags", "data_flags", "lac", "lafr", "index",
                 "offsets", "lengths")

    def __init__(self, ledger_id: int, first_entry: int, term: int, req_flags: int, data_flags: int,
                 lac: int, lafr: int, index: int, offsets: array, lengths: array):
        self.ledger_id, self.first_entry, self.term = ledger_id, first_entry, term
        self.req_flags, self.data_flags = req_flags, data_flags  # data flags: of the first entry
        self.lac, self.lafr = lac, lafr
        self.index = index            # of the first entry among the buffer's records
        self.offsets, self.lengths = offsets, lengths

    @property
    def count(self) -> int:
        return len(self.lengths)

    @property
    def last_entry(self) -> int:
        return self.first_entry + len(self.lengths) - 1

    @property
    def start(self) -> int:
        return self.offsets[0]

    @property
    def end(self) -> int:
        return self.offsets[-1] + self.lengths[-1]

    def __repr__(self) -> str:
        return (f"EntryRun({self.ledger_id}:{self.first_entry}..{self.last_entry}, term={self.term}, "
                f"req_flags={self.req_flags}, data_flags={self.data_flags}, lac={self.lac}, lafr={self.lafr})")


def scan_runs(buf: bytes | memoryview, max_payload: int | None = None) -> list[EntryRun]:
    """Parses and verifies every record of a concatenation in one pass, as
    runs (``EntryRun``): the bookie's hot path, with no object per entry.
    The same checks as ``scan``; raises MalformedEntry (EntryTooLarge above
    ``max_payload``) or ChecksumMismatch."""
    unpack, checksum, mv = ENTRY_HEADER.unpack_from, crc32, memoryview(buf)
    limit = -1 if max_payload is None else max_payload
    runs: list[EntryRun] = []
    off, n, count = 0, len(buf), 0
    # the run being extended: its key, next id, highest LAC/LAFR, arrays
    run = None
    r_lid = r_term = r_rflags = r_next = r_lac = r_lafr = -1
    add_off = add_len = None
    while off < n:
        if n - off < HEADER_SIZE:
            raise MalformedEntry("truncated entry header")
        plen, crc, rflags, term, lid, eid, lac, lafr, dflags, origin = unpack(buf, off)
        size = HEADER_SIZE + plen
        end = off + size
        if end > n:
            raise MalformedEntry("truncated entry payload")
        if eid < 0 or lac < -1 or lafr < -1 or dflags & ~DATA_FLAGS_MASK or rflags & ~REQ_FLAGS_MASK or (
                dflags & FLAG_TRUNCATE and not dflags & FLAG_NOOP) or origin > term:
            parse_header(buf, off)  # raises the precise MalformedEntry
        if limit >= 0 and plen > limit:
            raise EntryTooLarge(parse_header(buf, off), limit)
        if checksum(mv[off + CHECKSUM_START:end]) != crc:
            raise ChecksumMismatch(lid, eid)
        if eid == r_next and lid == r_lid and term == r_term and rflags == r_rflags and not dflags & FLAG_TRUNCATE:
            add_off(off)
            add_len(size)
            if lac > r_lac:
                r_lac = lac
            if lafr > r_lafr:
                r_lafr = lafr
            r_next += 1
        else:
            if run is not None:
                run.lac, run.lafr = r_lac, r_lafr
            offs, lens = array("Q", (off,)), array("I", (size,))
            add_off, add_len = offs.append, lens.append
            run = EntryRun(lid, eid, term, rflags, dflags, lac, lafr, count, offs, lens)
            runs.append(run)
            r_lid, r_term, r_rflags, r_lac, r_lafr = lid, term, rflags, lac, lafr
            r_next = -2 if dflags & FLAG_TRUNCATE else eid + 1  # nothing joins a truncate no-op
        off = end
        count += 1
    if run is not None:
        run.lac, run.lafr = r_lac, r_lafr
    return runs


def count_entries(runs: list[EntryRun]) -> int:
    """How many records the buffer ``runs`` were scanned from holds."""
    return runs[-1].index + runs[-1].count if runs else 0


def verified_prefix(buf: bytes | memoryview) -> tuple[int, int, ChecksumMismatch | None]:
    """Checks the records of a concatenation in order (lengths and
    checksums, no header objects: a bookie serving a range read) up to the
    first that fails its checksum: (records that passed, the byte offset
    where they end, that failure or None).  Raises MalformedEntry."""
    unpack, checksum, mv = _LEN_CRC.unpack_from, crc32, memoryview(buf)
    off, n, count = 0, len(buf), 0
    while off < n:
        if n - off < HEADER_SIZE:
            raise MalformedEntry("truncated entry header")
        plen, crc = unpack(buf, off)
        end = off + HEADER_SIZE + plen
        if end > n:
            raise MalformedEntry("truncated entry payload")
        if checksum(mv[off + CHECKSUM_START:end]) != crc:
            h = parse_header(buf, off)
            return count, off, ChecksumMismatch(h.ledger_id, h.entry_id)
        off, count = end, count + 1
    return count, off, None


def verify_all(buf: bytes | memoryview) -> int:
    """``verified_prefix`` of all of them: how many records; raises
    MalformedEntry or ChecksumMismatch."""
    count, _, bad = verified_prefix(buf)
    if bad is not None:
        raise bad
    return count


# bytes 0..34 of an entry record: payload_len, checksum, (req_flags, term), ledger_id, entry_id
_NAMED = struct.Struct("<II10xQq")


def rotted(buf: bytes | memoryview, ledger_id: int, records: Sequence[tuple[int, int, int]]) -> list[int]:
    """The ids of ``records`` ((entry id, offset in ``buf``, length), as a
    bookie's index names them) whose bytes in ``buf`` are not that entry of
    ``ledger_id``: cut short, another ledger's or id's, a length other than
    the index's, or a CRC that fails.  (The index, not the record, says
    which id a bad record was: its own header may be what rotted.)"""
    mv, n, out = memoryview(buf), len(buf), []
    for eid, off, ln in records:
        if ln < HEADER_SIZE or off + ln > n:
            out.append(eid)
            continue
        plen, crc, lid, rid = _NAMED.unpack_from(mv, off)
        if lid != ledger_id or rid != eid or HEADER_SIZE + plen != ln or \
                crc32(mv[off + CHECKSUM_START : off + ln]) != crc:
            out.append(eid)
    return out


def iter_headers(buf: bytes | memoryview) -> Iterator[EntryHeader]:
    """Parses every record of a concatenation; raises MalformedEntry on junk."""
    off, n = 0, len(buf)
    while off < n:
        h = parse_header(buf, off)
        yield h
        off += h.size


def payload(buf: bytes | memoryview, header: EntryHeader) -> bytes:
    start = header.offset + HEADER_SIZE
    return bytes(memoryview(buf)[start : start + header.payload_len])


class Entry(NamedTuple):
    """A decoded, verified entry, as clients hand it to applications (a
    tuple: readers make them by the hundred thousand)."""

    ledger_id: int
    entry_id: int
    payload: bytes
    lac: int
    lafr: int
    data_flags: int
    origin: int = 0  # the origin term

    @property
    def is_noop(self) -> bool:
        return bool(self.data_flags & FLAG_NOOP)


def decode(record: bytes | memoryview, *, offset: int = 0, check: bool = True) -> Entry:
    h = parse_header(record, offset)
    if check:
        verify(record, h)
    return Entry(h.ledger_id, h.entry_id, payload(record, h), h.lac, h.lafr, h.data_flags, h.origin)


def decode_run(buf: bytes, ledger_id: int, first_entry: int) -> list[Entry]:
    """Decodes and verifies a concatenation of records of ``ledger_id`` with
    consecutive ids from ``first_entry`` (a range read's frame): the reader's
    hot path, one header parse and one checksum pass per record.  Raises
    MalformedEntry / ChecksumMismatch like ``decode``."""
    out: list[Entry] = []
    want = first_entry
    for off, end, (_, _, _, _, lid, eid, lac, lafr, dflags, origin) in _checked(buf):
        if lid != ledger_id or eid != want:
            raise MalformedEntry(f"got entry {lid}:{eid}, wanted {ledger_id}:{want}")
        out.append(Entry(lid, eid, buf[off + HEADER_SIZE:end], lac, lafr, dflags, origin))
        want += 1
    return out


def record_spans(buf: bytes | memoryview) -> Iterator[tuple[int, int, int]]:
    """(entry id, start, end) of each record of a concatenation: just enough
    to route them (nothing verified).  Raises MalformedEntry on a record cut
    short."""
    off, n, span = 0, len(buf), _SPAN.unpack_from
    while off < n:
        if n - off < HEADER_SIZE:
            raise MalformedEntry("truncated entry header")
        plen, eid = span(buf, off)
        end = off + HEADER_SIZE + plen
        if end > n:
            raise MalformedEntry("truncated entry payload")
        yield eid, off, end
        off = end


def decode_all(buf: bytes | memoryview, *, check: bool = True) -> list[Entry]:
    return [decode(buf, offset=h.offset, check=check) for h in iter_headers(buf)]


def _decode_sparse_py(buf: bytes | memoryview, ledger_id: int, after: int, start: int = 0,
                      stop: int | None = None) -> list[Entry]:
    """``decode_run`` for a sparse range read's frame (a striped reader's
    share, or any range read): the records in ``buf[start:stop]``, of
    ``ledger_id``, with ascending ids above ``after``, gaps allowed;
    payloads are bytes (sliced straight out of a bytes ``buf``).  The
    reader's hot path: per record one header unpack, one CRC call, one
    slice, one tuple.  The header's fields are covered by the checksum, so
    only the lengths, the ledger and the order are checked besides it.
    Raises MalformedEntry / ChecksumMismatch like ``decode``.

    ``decode_sparse`` is this walk in C (bookie/_records.c) where it was
    built, as ``sparse_runs``."""
    unpack, checksum, mv, new = ENTRY_HEADER.unpack_from, crc32, memoryview(buf), tuple.__new__
    out: list[Entry] = []
    append = out.append
    off, n = start, len(buf) if stop is None else min(stop, len(buf))
    while off < n:
        if n - off < HEADER_SIZE:
            raise MalformedEntry("truncated entry header")
        f = unpack(buf, off)
        end = off + HEADER_SIZE + f[0]
        if end > n:
            raise MalformedEntry("truncated entry payload")
        lid, eid, lac, lafr, dflags, origin = f[4:10]  # (after length, checksum, req_flags, term)
        if checksum(mv[off + CHECKSUM_START:end]) != f[1]:
            raise ChecksumMismatch(lid, eid)
        if lid != ledger_id or eid <= after:
            raise MalformedEntry(f"got entry {lid}:{eid}, wanted {ledger_id}:>{after}")
        append(new(Entry, (lid, eid, buf[off + HEADER_SIZE:end], lac, lafr, dflags, origin)))
        after = eid
        off = end
    return out


_READ = struct.Struct("<II10xQq16xH8x")  # payload_len, checksum, ledger_id, entry_id, data_flags


def _sparse_runs_py(buf: bytes | memoryview, ledger_id: int, after: int, start: int = 0,
                    stop: int | None = None, step: int | tuple[int, ...] = 1) -> tuple[list[tuple[int, array]], list[int]]:
    """``decode_sparse`` without an object per record (a reader's batch,
    stream/record_batch.py): the records in ``buf[start:stop]``, of
    ``ledger_id``, ascending ids above ``after``, gaps allowed, every
    checksum verified, as (runs, no-ops).  A run is (first id, offsets):
    records that are no no-op, contiguous in ``buf``, of ids ``step``
    apart (1: consecutive; a striped read's share of one residue: E), or
    with ``step`` a tuple of E distances, each id's successor is
    ``id + step[id % E]`` (a striped read's share of several residues:
    ``stream.read_plan.RangeRead.steps``);
    ``offsets`` (array 'Q') holds each one's start and then the last one's
    end, so record k's payload is ``buf[offsets[k] + HEADER_SIZE:offsets[k + 1]]``.
    ``no-ops``: the ids of the no-op records (in no run).  Per record: one
    unpack of five header fields, one CRC call, one append (checks done
    with ``map`` over C functions, the CRCs as lists, measured slower here:
    the slices and views they make per record cost more than the loop's
    bytecode).  Raises MalformedEntry / ChecksumMismatch like ``decode_sparse``.

    ``sparse_runs`` is this walk in C (bookie/_records.c) where it was
    built, and this function elsewhere (or with BOOKSTREAM_PURE_PYTHON=1)."""
    unpack, checksum, mv = _READ.unpack_from, crc32, memoryview(buf)
    steps = (step,) if isinstance(step, int) else tuple(step)
    cyc = len(steps)
    same = steps[0] if len(set(steps)) == 1 else 0   # (one distance: no table lookup per record)
    runs: list[tuple[int, array]] = []
    noops: list[int] = []
    off, n = start, len(buf) if stop is None else min(stop, len(buf))
    nxt, add_off = -1, None   # the next id of the open run, its offsets' append
    while off < n:
        if n - off < HEADER_SIZE:
            raise MalformedEntry("truncated entry header")
        plen, crc, lid, eid, dflags = unpack(buf, off)
        end = off + HEADER_SIZE + plen
        if end > n:
            raise MalformedEntry("truncated entry payload")
        if checksum(mv[off + CHECKSUM_START:end]) != crc:
            raise ChecksumMismatch(lid, eid)
        if eid != nxt or dflags or lid != ledger_id:   # (the run's next id, no flag: eid > after already)
            if add_off is not None:
                add_off(off)                 # the open run ends where this record starts
                add_off, after = None, _last_id(runs[-1], steps)
            if lid != ledger_id or eid <= after:
                raise MalformedEntry(f"got entry {lid}:{eid}, wanted {ledger_id}:>{after}")
            after = eid
            if dflags & FLAG_NOOP:
                noops.append(eid)
                nxt = -1
            else:
                offs = array("Q", (off,))
                runs.append((eid, offs))
                add_off, nxt = offs.append, eid + (same or steps[eid % cyc])
        else:
            add_off(off)
            nxt = eid + (same or steps[eid % cyc])
        off = end
    if add_off is not None:
        add_off(off)
    return runs, noops


def _native_walk():
    """bookie._records (bookie/_records.c), bound to this module's
    exceptions; None where it was not built or BOOKSTREAM_PURE_PYTHON=1."""
    _records = native("_records")
    if _records is None:
        return None
    _records.bind(MalformedEntry, ChecksumMismatch, Entry)
    return _records


_NATIVE = _native_walk()
NATIVE = _NATIVE is not None   # whether the reader's walks run in C
sparse_runs = _NATIVE.sparse_runs if NATIVE else _sparse_runs_py
decode_sparse = _NATIVE.decode_sparse if NATIVE else _decode_sparse_py


def _last_id(run: tuple[int, array], steps: tuple[int, ...]) -> int:
    """The id of a ``sparse_runs`` run's last record (its offsets closed)."""
    eid, c = run[0], len(run[1]) - 2
    if len(steps) == 1:
        return eid + c * steps[0]
    for _ in range(c):   # (a walk: a run ends early only at a no-op or an id out of sequence)
        eid += steps[eid % len(steps)]
    return eid


def resend_as(record: bytes | memoryview, *, req_flags: int, term: int) -> bytes:
    """A copy of one record with the request fields (outside the checksum)
    set as a re-sender sends it: re-replication copies what the entry *is*
    byte for byte and sends it as a recovery add in the ledger's term."""
    if req_flags & ~REQ_FLAGS_MASK:
        raise ValueError("unknown flags")
    out = bytearray(record)
    _UNSIGNED.pack_into(out, 8, req_flags, term)
    return bytes(out)
