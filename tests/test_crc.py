"""bookie.crc: ISA-L's CRC-32 computes zlib's values (records written with
one are read with the other), and is the one in use."""

from __future__ import annotations

import zlib

from hypothesis import given, strategies as st

from bookie import crc
from bookie import entry as E


def test_the_isal_implementation_is_in_use():
    assert crc.IMPLEMENTATION == "isal"
    assert crc.crc32 is not zlib.crc32


@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1), st.integers(0, 64))
def test_same_values_as_zlib_whole_chained_and_on_views(data, start, cut):
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(data, start) == zlib.crc32(data, start)
    view = memoryview(data)[cut:]
    assert crc.crc32(view) == zlib.crc32(view)
    head, tail = data[: len(data) // 2], data[len(data) // 2:]
    assert crc.crc32(tail, crc.crc32(head)) == zlib.crc32(data)


@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=20))
def test_records_signed_with_zlib_scan_clean(payloads):
    """A record whose checksum zlib computed (as before ISA-L) passes the
    bookie's scan: the on-disk format did not change."""
    records = []
    for i, p in enumerate(payloads):
        r = bytearray(E.encode(5, i, p, term=2, lac=i - 1))
        r[4:8] = zlib.crc32(memoryview(r)[E.CHECKSUM_START:]).to_bytes(4, "little")
        records.append(bytes(r))
    runs = E.scan_runs(b"".join(records))
    assert E.count_entries(runs) == len(payloads)
