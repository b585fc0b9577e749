"""The checkpoint file: a bookie's ledger states and index as of a journal
position (bookie/storage.py writes it, by rename, and replays the journal
from that position at the next start).

Layout (little-endian), then a CRC-32 of everything before it:

- head: magic ``BKSTCKP1``, segment, offset, ledger count;
- per ledger: id, term, fenced, LAC, LAFR, run count, then its index runs
  (``bookie.index.RUN_HEAD``, the locations, the lengths: ``runs_image``);
- the verifiers of the ledgers that have one: a count, then (id, verifier);
- the copy tokens of the ledgers that have one: a count, then (id, token).

The last two sections were added later: a loader stops where the file ends
before them, so an earlier bookie's checkpoint still loads (those ledgers
then have neither).  Pure: bytes in, bytes out; no file is touched here.
"""
from __future__ import annotations

import struct

from bookie.core import VERIFIER_SIZE, BookieCore
from bookie.crc import crc32
from bookie.index import RUN_HEAD, LedgerIndex
from bookie.journal_record import JournalPosition

MAGIC = b"BKSTCKP1"
_HEAD = struct.Struct("<8sQQQ")        # magic, segment, offset, ledgers
_LEDGER = struct.Struct("<QQBqqI")     # id, term, fenced, lac, lafr, runs


class BadCheckpoint(ValueError):
    """A checkpoint whose CRC or magic is wrong.  It is written to a temporary
    file and renamed, so a bad one means the disk lied."""


def encode(core: BookieCore, pos: JournalPosition) -> bytes:
    """The checkpoint of ``core``'s ledgers as of journal position ``pos``."""
    parts = [_HEAD.pack(MAGIC, pos.segment, pos.offset, len(core.ledgers))]
    for lid, st in core.ledgers.items():
        n_runs, image = st.index.runs_image()   # (RUN_HEAD, its locations, its lengths: per run)
        parts.append(_LEDGER.pack(lid, st.term, int(st.fenced), st.lac, st.lafr, n_runs))
        parts.append(image)
    keyed = [(lid, st.verifier) for lid, st in core.ledgers.items() if st.verifier]
    parts.append(struct.pack("<Q", len(keyed)))
    parts += [struct.pack("<Q", lid) + v for lid, v in keyed]
    tokens = [(lid, st.copy_token) for lid, st in core.ledgers.items() if st.copy_token]
    parts.append(struct.pack("<Q", len(tokens)))
    parts += [struct.pack("<QQ", lid, t) for lid, t in tokens]
    data = b"".join(parts)
    return data + struct.pack("<I", crc32(data))


def decode(data: bytes, core: BookieCore, where: str = "checkpoint") -> JournalPosition:
    """Restores the ledgers of checkpoint ``data`` into ``core``; returns its
    journal position.  Raises ``BadCheckpoint``."""
    if len(data) < _HEAD.size + 4 or struct.unpack_from("<I", data, len(data) - 4)[0] != crc32(data[:-4]):
        raise BadCheckpoint(f"{where}: its CRC does not match (the disk lost or changed what was written)")
    magic, seg, off, n = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise BadCheckpoint(f"{where}: not a checkpoint (magic {magic!r})")
    p = _HEAD.size
    for _ in range(n):
        lid, term, fenced, lac, lafr, nruns = _LEDGER.unpack_from(data, p)
        p += _LEDGER.size
        runs = []
        for _ in range(nruns):
            start, count = RUN_HEAD.unpack_from(data, p)
            p += RUN_HEAD.size
            locs = data[p : p + 8 * count]
            p += 8 * count
            lens = data[p : p + 4 * count]
            p += 4 * count
            runs.append((start, locs, lens))
        core.restore(lid, term, bool(fenced), lac, lafr, LedgerIndex.from_runs(runs))
    if p + 8 <= len(data) - 4:  # the verifiers (absent from an earlier bookie's checkpoint)
        (nkeys,) = struct.unpack_from("<Q", data, p)
        p += 8
        for _ in range(nkeys):
            (lid,) = struct.unpack_from("<Q", data, p)
            core.ledgers[lid].verifier = data[p + 8:p + 8 + VERIFIER_SIZE]
            p += 8 + VERIFIER_SIZE
    if p + 8 <= len(data) - 4:  # the copy tokens (absent from an earlier bookie's checkpoint)
        (ntokens,) = struct.unpack_from("<Q", data, p)
        p += 8
        for _ in range(ntokens):
            lid, token = struct.unpack_from("<QQ", data, p)
            core.ledgers[lid].copy_token = token
            p += 16
    return JournalPosition(seg, off)


__all__ = ["MAGIC", "BadCheckpoint", "encode", "decode"]
