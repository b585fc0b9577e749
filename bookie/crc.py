"""CRC-32 (zlib's polynomial, zlib's values) for entry records, journal
records and checkpoints.

ISA-L's implementation (python-isal) folds with carry-less multiplies,
several times zlib's speed (bench/notes.md), and every record is
checksummed once by the writer and once per bookie.  The values are
zlib's, so either module reads what the other wrote; zlib is the fallback
where no isal wheel exists."""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
    IMPLEMENTATION = "isal"
except ImportError:  # pragma: no cover - every supported platform has a wheel
    from zlib import crc32
    IMPLEMENTATION = "zlib"

__all__ = ["crc32", "IMPLEMENTATION"]
