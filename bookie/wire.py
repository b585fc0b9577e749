"""The Add stream's frames, encoded and decoded without protobuf's copies.

An ``AddFrame`` (proto/bookie.proto) is a frame id and a few megabytes of
entry records.  Through the generated class, a frame's bytes were copied when
the message was built, again when it was serialized (once per bookie of the
write set), and on the bookie when it was parsed and when its ``entries``
field was read: most of a large frame's client CPU (bench/notes.md).

So the Add method carries raw bytes on both sides (a serializer and a
deserializer that pass bytes through) and this module writes and reads them.
The bytes on the wire are exactly the protobuf encoding of ``AddFrame``:
``encode_add_frame`` produces what ``AddFrame.SerializeToString`` produces,
and ``decode_add_frame`` reads any valid encoding of it (fields in any order,
unknown fields skipped), a test checks both against the generated class.  A
writer encodes a frame once and sends the same bytes to every bookie of the
write set; a bookie reads the entries as a memoryview into the message.

A frame of a ledger with a password carries its master key (field 3, after
the entries, as protobuf orders it): a frame without one is byte for byte
what it was before the field existed.
"""
from __future__ import annotations

import itertools

# field numbers and wire types of AddFrame
_FRAME_ID_TAG = b"\x08"   # field 1, varint
_ENTRIES_TAG = b"\x12"    # field 2, length-delimited
_KEY_TAG = b"\x1a"        # field 3 (master_key), length-delimited
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

# Frame ids are drawn from one counter per process, so one encoded frame can
# go to several bookies (each bookie client matches acks by frame id).
frame_ids = itertools.count(1)


class MalformedFrame(ValueError):
    """Bytes that are not an encoding of AddFrame."""


def varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_add_frame(frame_id: int, records: list[bytes] | tuple[bytes, ...], master_key: bytes = b"") -> bytes:
    """The AddFrame of ``frame_id`` whose entries are ``records``
    concatenated (one copy of the records, straight into the message), and
    ``master_key`` (the ledger's; empty: none)."""
    size = sum(map(len, records))
    head = (_FRAME_ID_TAG + varint(frame_id) if frame_id else b"") + (_ENTRIES_TAG + varint(size) if size else b"")
    if master_key:
        return b"".join((head, *records, _KEY_TAG, varint(len(master_key)), master_key))
    return b"".join((head, *records))


def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise MalformedFrame("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


def _fields(data):
    """The fields of a protobuf message, in order: (field number, wire type,
    value), the value a varint's number or a length-delimited field's
    (start, stop) in ``data``; fixed-width fields are skipped.  Raises
    MalformedFrame."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _read_varint(data, pos, end)
        field, wtype = key >> 3, key & 7
        if field == 0 or key >> 32:
            raise MalformedFrame(f"bad field number {field}")
        if wtype == _VARINT:
            value, pos = _read_varint(data, pos, end)
            yield field, wtype, value
        elif wtype == _LEN:
            size, pos = _read_varint(data, pos, end)
            if pos + size > end:
                raise MalformedFrame("truncated field")
            yield field, wtype, (pos, pos + size)
            pos += size
        elif wtype in (_I64, _I32):
            pos += 8 if wtype == _I64 else 4
            if pos > end:
                raise MalformedFrame("truncated field")
        else:
            raise MalformedFrame(f"unsupported wire type {wtype}")


def decode_add_frame(data: bytes) -> tuple[int, memoryview, bytes]:
    """(frame id, entries, master key) of an encoded AddFrame; the entries
    are a view into ``data``.  Like protobuf, the last occurrence of a field
    wins and unknown fields are skipped.  Raises MalformedFrame."""
    mv = memoryview(data)
    n = len(data)
    if data[:1] == _FRAME_ID_TAG:  # the usual layout: id, entries, then the key if any
        fid, pos = _read_varint(data, 1, n)
        if data[pos:pos + 1] == _ENTRIES_TAG:
            size, start = _read_varint(data, pos + 1, n)
            end = start + size
            if end == n:
                return fid, mv[start:], b""
            if end < n and data[end:end + 1] == _KEY_TAG:
                klen, kstart = _read_varint(data, end + 1, n)
                if kstart + klen == n:
                    return fid, mv[start:end], bytes(mv[kstart:])
    fid, entries, key = 0, mv[0:0], b""
    for field, wtype, value in _fields(data):
        if field == 1 and wtype == _VARINT:
            fid = value & ((1 << 64) - 1)
        elif field == 2 and wtype == _LEN:
            entries = mv[value[0]:value[1]]
        elif field == 3 and wtype == _LEN:
            key = bytes(mv[value[0]:value[1]])
    return fid, entries, key


# -- range-read frames, written and read without protobuf's copies ----------------------

_RANGE_STATUS_TAG, _RANGE_ENTRIES_TAG, _RANGE_COUNT_TAG = b"\x08", b"\x12", b"\x18"
_RANGE_THROUGH_TAG, _RANGE_TERM_TAG = b"\x28", b"\x30"


def encode_range_frame(status: int, records: list[bytes] | tuple[bytes, ...], count: int = 0, through: int = 0,
                       term: int = 0) -> bytes:
    """A ``ReadRangeResponse`` (proto/bookie.proto) with no ``message``,
    byte for byte as ``SerializeToString`` encodes it, its entries the
    ``records`` concatenated: one copy of them, straight into the frame (a
    bookie building the message and serializing it copied each frame
    twice more)."""
    head, tail = range_frame_parts(status, sum(map(len, records)), count, through, term)
    return b"".join((head, *records, tail))


def range_frame_parts(status: int, size: int, count: int = 0, through: int = 0, term: int = 0) -> tuple[bytes, bytes]:
    """The bytes of ``encode_range_frame``'s frame before and after its
    ``size`` bytes of records: a bookie's read port (bookie/read_port.py)
    sends the records between them from the journal's files."""
    head = ((_RANGE_STATUS_TAG + varint(status & (1 << 64) - 1) if status else b"")
            + (_RANGE_ENTRIES_TAG + varint(size) if size else b""))
    tail = ((_RANGE_COUNT_TAG + varint(count) if count else b"")
            + (_RANGE_THROUGH_TAG + varint(through & (1 << 64) - 1) if through else b"")
            + (_RANGE_TERM_TAG + varint(term) if term else b""))
    return head, tail


def ends_sparse_read(status: int, through: int, last: int) -> bool:
    """Whether a sparse range read's frame is its last (proto/bookie.proto
    ReadRangeResponse): one with a status other than OK, or one vouching
    up to the read's last id.  The bookie stops after it; the reader, over
    gRPC or the read port (bookie/read_port.py), reads no further."""
    return status != 0 or through >= last


def serialize_range_response(resp) -> bytes:
    """The ReadRange method's serializer on the bookie: a frame the handler
    encoded itself (``encode_range_frame``) goes as it is, any other
    ``ReadRangeResponse`` (an error, a refusal) is serialized."""
    return resp if type(resp) is bytes else resp.SerializeToString()


class RangeFrame:
    """A ``ReadRangeResponse`` (proto/bookie.proto) as ``decode_range_frame``
    reads it: the same attributes, ``entries`` a view into the message;
    ``data[start:stop]`` are the entries too (the message's bytes, to
    slice payloads out of with one copy)."""

    __slots__ = ("status", "entries", "count", "message", "through", "term", "data", "start", "stop")

    def __init__(self, status: int = 0, entries=b"", count: int = 0, message: str = "", through: int = 0,
                 term: int = 0):
        self.status, self.entries, self.count = status, entries, count
        self.message, self.through, self.term = message, through, term
        self.data, self.start, self.stop = b"", 0, 0


_RANGE_VARINTS = {1: "status", 3: "count", 5: "through", 6: "term"}


def decode_range_frame(data: bytes) -> RangeFrame:
    """A ReadRangeResponse's fields; ``entries`` is a memoryview into
    ``data`` (through the generated class a frame's records were copied
    when the message was parsed and again when the field was read: two
    copies of every byte a reader reads).  The last occurrence of a field
    wins, unknown fields are skipped.  Raises MalformedFrame."""
    mv = memoryview(data)
    out = RangeFrame(entries=mv[0:0])
    out.data = data
    for field, wtype, value in _fields(data):
        if wtype == _VARINT:
            name = _RANGE_VARINTS.get(field)
            if name == "through":
                value &= (1 << 64) - 1
                value = value - (1 << 64) if value >> 63 else value   # int64
            elif name in ("status", "count"):
                value &= (1 << 32) - 1 if name == "count" else (1 << 64) - 1
                if name == "status" and value >> 31:
                    value -= 1 << 64                                      # (an enum is int32)
            if name is not None:
                setattr(out, name, value)
        elif wtype == _LEN:
            if field == 2:
                out.entries = mv[value[0]:value[1]]
                out.start, out.stop = value
            elif field == 4:
                out.message = bytes(mv[value[0]:value[1]]).decode("utf-8", "replace")
    return out
