"""CRC-32 (zlib's polynomial, zlib's values) for entry records, journal
records and checkpoints.

Where bookie/_records.c is built, its ``crc32`` (carry-less folding in
128-, 256- or 512-bit registers, what the CPU has; ``_records.CRC`` names
it): as fast as ISA-L's with 128-bit lanes, twice as fast with AVX2 and
VPCLMULQDQ (24 GB/s against 12.5 on 64 KiB on the development machine).
Elsewhere, or with BOOKSTREAM_PURE_PYTHON=1, ISA-L's (python-isal), several
times zlib's speed (bench/notes.md); zlib where no isal wheel exists.  The
values are zlib's in every case, so each reads what another wrote."""

from __future__ import annotations

from bookie import native

_records = native("_records")
if _records is not None:
    crc32 = _records.crc32
    IMPLEMENTATION = f"native ({_records.CRC})"
else:
    try:
        from isal.isal_zlib import crc32
        IMPLEMENTATION = "isal"
    except ImportError:  # pragma: no cover - every supported platform has a wheel
        from zlib import crc32
        IMPLEMENTATION = "zlib"

__all__ = ["crc32", "IMPLEMENTATION"]
