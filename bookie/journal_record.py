"""A journal record's format: its header, its types and their bodies, and
the reading of one record (and of a mark) from a segment's bytes
(``bookie/journal.py`` writes and scans them).

A record on disk::

    u32 body_len | u8 type | 3 bytes zero | u32 crc | body

where ``crc`` is the CRC-32 of the first 8 header bytes and then the body,
except for records made of entry records (R_ENTRIES, R_RELOCATED): every entry
record carries its own CRC, verified when it arrived, so the journal CRC
covers only those records' 8 header bytes and the scan verifies the entries'
CRCs instead (one pass over the bytes on the add path, not two).  No record
has type 0, so a header of zeros is no record (a prepared segment's rest).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from bookie import entry as E
from bookie.crc import crc32

RECORD_HEADER = struct.Struct("<IB3xI")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 12

R_ENTRIES = 1     # body: entry records, as received
R_STATE = 2       # body: STATE_BODY
R_DELETE = 3      # body: DELETE_BODY
R_RELOCATED = 4   # body: u32 n, n x u64 old location, then n entry records
R_LAC = 5         # body: LAC_BODY (an explicit LAC)
R_KEY = 6         # body: KEY_BODY, then the ledger's verifier (bookie/core.py, master key)
R_CLEAR = 7       # body: CLEAR_BODY (a copy's clearing of its target, with its fencing token)
R_MARK = 8        # body: MARK_BODY, the record's own segment and offset (every byte before it was durable)

STATE_BODY = struct.Struct("<QQB")          # ledger_id, term, fenced
DELETE_BODY = struct.Struct("<QBqq")        # ledger_id, has_range, first, last
LAC_BODY = struct.Struct("<Qqq")            # ledger_id, lac, lafr
KEY_BODY = struct.Struct("<Q")              # ledger_id
CLEAR_BODY = struct.Struct("<QqqQ")         # ledger_id, first, last, copy token
MARK_BODY = struct.Struct("<QQ")            # segment, offset of this record
MARK_SIZE = RECORD_HEADER_SIZE + MARK_BODY.size

ENTRY_RECORD_TYPES = frozenset((R_ENTRIES, R_RELOCATED))


def frame_record(rtype: int, body: bytes | memoryview) -> bytes:
    head = struct.pack("<IB3x", len(body), rtype)
    crc = crc32(head) if rtype in ENTRY_RECORD_TYPES else crc32(body, crc32(head))
    return head + struct.pack("<I", crc)


def verified_runs(rtype: int, body: memoryview) -> list[E.EntryRun] | None:
    """Parses and checks the entry records of an entry-bearing body (the
    journal CRC does not cover them); None if any is torn or corrupt.  Run
    offsets are relative to the first entry record."""
    try:
        start = 4 + 8 * struct.unpack_from("<I", body, 0)[0] if rtype == R_RELOCATED else 0
        return E.scan_runs(body[start:])
    except (E.MalformedEntry, E.ChecksumMismatch, struct.error):
        return None


@dataclass(frozen=True, slots=True)
class JournalPosition:
    """A point in the journal: a segment and a byte offset in it."""

    segment: int
    offset: int

    def __lt__(self, other: "JournalPosition") -> bool:
        return (self.segment, self.offset) < (other.segment, other.offset)

    def __le__(self, other: "JournalPosition") -> bool:
        return (self.segment, self.offset) <= (other.segment, other.offset)


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    rtype: int
    body: memoryview
    segment: int
    body_offset: int  # of the body in the segment file
    end: JournalPosition     # just past the record
    runs: list | None = None  # entry-bearing records: their entries, scanned (entry.EntryRun)


def record_at(mv: memoryview, seg: int, off: int) -> ScannedRecord | None:
    """The valid record at ``off`` of a segment's bytes, or None: none fits
    there (the end, zeros, a torn or corrupt record)."""
    if off + RECORD_HEADER_SIZE > len(mv):
        return None
    blen, rtype, crc = RECORD_HEADER.unpack_from(mv, off)
    if rtype == 0:
        return None  # no record has type 0: zeros, or a torn tail
    body_off = off + RECORD_HEADER_SIZE
    if body_off + blen > len(mv):
        return None
    body = mv[body_off : body_off + blen]
    runs = None
    if rtype in ENTRY_RECORD_TYPES:
        if crc32(mv[off : off + 8]) != crc:
            return None
        runs = verified_runs(rtype, body)
        if runs is None:
            return None
    elif crc32(body, crc32(mv[off : off + 8])) != crc:
        return None
    return ScannedRecord(rtype, body, seg, body_off, JournalPosition(seg, body_off + blen), runs)


MARK_HEAD = struct.pack("<IB3x", MARK_BODY.size, R_MARK)   # a mark's first 8 bytes


def mark_after(data: bytes, seg: int, off: int) -> int | None:
    """The offset of a valid mark after ``off`` in a segment's bytes, if
    any: a record of type R_MARK, its CRC right, naming its own segment and
    offset (payload bytes that look like one fail one of these)."""
    mv = memoryview(data)
    at = data.find(MARK_HEAD, off + 1)
    while at >= 0:
        rec = record_at(mv, seg, at)
        if rec is not None and rec.rtype == R_MARK and MARK_BODY.unpack(rec.body) == (seg, at):
            return at
        at = data.find(MARK_HEAD, at + 1)
    return None
