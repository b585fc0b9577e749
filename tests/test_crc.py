"""bookie.crc: the CRC-32 in use computes zlib's values (records written
with one are read with the other): bookie/_records.c's where built, else
ISA-L's."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

from hypothesis import given, strategies as st

from bookie import crc
from bookie import entry as E


def test_the_native_implementation_is_in_use_and_isal_without_it():
    from bookie import _records

    assert crc.IMPLEMENTATION == f"native ({_records.CRC})" and crc.crc32 is _records.crc32
    out = subprocess.run([sys.executable, "-c", "from bookie import crc; print(crc.IMPLEMENTATION)"],
                         env={**os.environ, "BOOKSTREAM_PURE_PYTHON": "1"}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "isal"


def test_a_crc_past_the_gil_bound_is_zlibs_from_several_threads_at_once():
    """From 256 KiB on, bookie/_records.c computes without the GIL: four
    threads at once over one buffer get zlib's value, chained too."""
    import threading

    data = os.urandom(3 << 20)
    got = []
    threads = [threading.Thread(target=lambda: got.append(crc.crc32(data, 7))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [zlib.crc32(data, 7)] * 4
    assert crc.crc32(data[1 << 20:], crc.crc32(data[:1 << 20])) == zlib.crc32(data)


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
