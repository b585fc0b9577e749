"""bookie/_records.c, the reader's record walk and CRC-32 in C (issue 18),
against what it replaces: ``bookie.entry._sparse_runs_py`` on arbitrary
frames (the same runs, offsets and no-ops, or the same error with the same
message) and zlib's CRC-32 at every length, alignment and initial value
the folding and table paths can take; the folding constants derived again."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bookie import _records  # (built by the install: scripts/bootstrap.sh, pip install -e)
from bookie import entry as E

LID = 7

_records.bind(E.MalformedEntry, E.ChecksumMismatch, E.Entry)   # (as bookie.entry does, but for BOOKSTREAM_PURE_PYTHON)


@pytest.mark.skipif(os.environ.get("BOOKSTREAM_PURE_PYTHON", "") not in ("", "0"),
                    reason="BOOKSTREAM_PURE_PYTHON asks for the Python walk")
def test_the_native_walk_is_built_and_used():
    """The test environment has a compiler: a build that silently fell back
    to the Python walk would leave the reader's speed-up untested."""
    assert E.NATIVE and E.sparse_runs is _records.sparse_runs and E.decode_sparse is _records.decode_sparse
    assert _records.CRC in ("vpclmul", "vpclmul-256", "pclmul", "slicing-by-8")
    from bookie import striped_read
    assert striped_read.spans_c is not None   # and a bookie's index walks (bookie/_spans.c)


def test_pure_python_can_be_asked_for():
    out = subprocess.run([sys.executable, "-c", "from bookie import entry as E, striped_read as S; "
                          "print(E.NATIVE, E.sparse_runs.__name__, S.spans_c)"],
                         env={**os.environ, "BOOKSTREAM_PURE_PYTHON": "1"}, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "_sparse_runs_py", "None"]


# -- CRC-32 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("way", range(4))
def test_crc32_is_zlibs_at_every_length_alignment_and_initial_value(way):
    """Each way this machine has (0: tables; 1: 128-bit folding from 64
    bytes; 2: 256-bit from 128, AVX2; 3: 512-bit from 256, AVX-512), at
    every length across their loops' and tails' boundaries."""
    if way > _records.CRC_WAY:
        pytest.skip(f"this machine's CPU has ways 0..{_records.CRC_WAY} ({_records.CRC})")
    data = bytes((i * 131 + 7) % 251 for i in range(140_000))
    for n in [*range(0, 1100), 4095, 4096, 4097, 65_535, 65_536, 65_537, 131_071]:
        for align in (0, 1, 13):
            chunk = memoryview(data)[align:align + n]
            for value in (0, 0xFFFFFFFF, 0x12345678):
                assert _records.crc32(chunk, value, way) == zlib.crc32(chunk, value), (n, align, value)
    with pytest.raises(ValueError):
        _records.crc32(data, 0, _records.CRC_WAY + 1)


def test_a_crc_way_can_be_asked_for_and_a_way_the_machine_lacks_is_refused():
    """BOOKSTREAM_CRC_WAY=N runs way N everywhere (the walks, bookie/crc.py):
    an A/B of the ways by the same command; a way above the machine's best,
    or not a number, fails the import loudly rather than falling back."""
    def probe(way: str):
        return subprocess.run([sys.executable, "-c", "from bookie import _records, crc; print(_records.CRC_WAY, crc.IMPLEMENTATION)"],
                              env={**os.environ, "BOOKSTREAM_CRC_WAY": way}, capture_output=True, text=True)

    for way in range(_records.CRC_WAY + 1):
        p = probe(str(way))
        assert p.returncode == 0 and p.stdout.split()[0] == str(way), p.stderr
    for bad in (str(_records.CRC_WAY + 1), "x", "-1"):
        p = probe(bad)
        assert p.returncode != 0 and f"BOOKSTREAM_CRC_WAY={bad}: this machine has ways 0..{_records.CRC_WAY}" in p.stderr


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1))
def test_crc32_chains_like_zlib(data, value):
    cut = len(data) // 3
    assert _records.crc32(data, value) == zlib.crc32(data, value)
    assert _records.crc32(data[cut:], _records.crc32(data[:cut], value)) == zlib.crc32(data, value)


def test_the_folding_constants_are_powers_of_x_mod_p():
    """bookie/_records.c's constants: x^n mod P (P = CRC-32's polynomial),
    bit-reflected in 32 bits and shifted left by one, for the fold distances
    D (x^(D+32), x^(D-32)) of 2048, 1024, 512, 384, 256 and 128 bits and for the
    reduction to 32 (x^64); mu = floor(x^64 / P) and P itself reflected in
    33 bits."""
    P = 0x104C11DB7

    def xpow(n: int) -> int:
        r = 1
        for _ in range(n):
            r <<= 1
            if r >> 32:
                r ^= P
        return r

    def refl(v: int, bits: int) -> int:
        return int(f"{v:0{bits}b}"[::-1], 2)

    q, a = 0, 1 << 64
    while a.bit_length() >= P.bit_length():
        s = a.bit_length() - P.bit_length()
        q, a = q | 1 << s, a ^ P << s
    source = open(os.path.join(os.path.dirname(E.__file__), "_records.c")).read()
    literals = {int(h, 16) for h in re.findall(r"0x([0-9a-fA-F]{8,9})LL", source)}
    powers = (2080, 2016, 1056, 992, 544, 480, 416, 352, 288, 224, 160, 96, 64)
    assert literals == {*(refl(xpow(n), 32) << 1 for n in powers), refl(q, 33), refl(P, 33)}


# -- the walk -------------------------------------------------------------------------------

def _outcome(fn, *args):
    try:
        runs, noops = fn(*args)
    except (E.MalformedEntry, E.ChecksumMismatch) as e:
        return type(e), str(e), getattr(e, "entry_id", None)
    return [(eid, offs.typecode, offs.tolist()) for eid, offs in runs], noops


def _decoded(fn, *args):
    try:
        entries = fn(*args)
    except (E.MalformedEntry, E.ChecksumMismatch) as e:
        return type(e), str(e), getattr(e, "entry_id", None)
    assert all(type(e) is E.Entry for e in entries)
    return [(*e[:2], type(e.payload), bytes(e.payload), *e[3:]) for e in entries]


def _record(lid: int, eid: int, payload: bytes, flags: int) -> bytes:
    """An entry record; with the truncate flag alone (which ``encode``
    refuses on an entry that is no no-op), re-flagged and re-checksummed:
    a record a walk must still take apart from its neighbours' run."""
    if flags != E.FLAG_TRUNCATE:
        return E.encode(lid, eid, payload, data_flags=flags, term=1)
    rec = bytearray(E.encode(lid, eid, payload, term=1))
    rec[50:52] = flags.to_bytes(2, "little")
    rec[4:8] = zlib.crc32(rec[E.CHECKSUM_START:]).to_bytes(4, "little")
    return bytes(rec)


record = st.tuples(st.sampled_from([1] * 6 + [2, 3, 5, 0, -2]),                 # the id's distance from the last
                   st.integers(0, 300),                                           # payload length
                   st.sampled_from([0] * 6 + [E.FLAG_NOOP, E.FLAG_TRUNCATE]),     # flags, now and then
                   st.sampled_from([LID] * 20 + [LID + 1]))                       # another ledger's record, rarely


@settings(max_examples=800, deadline=None)
@given(st.lists(record, max_size=14), st.integers(-1, 4), st.integers(-1, 5),
       st.one_of(st.none(), st.none(), st.none(), st.integers(0, 10_000)), st.sampled_from([0] * 5 + [1, 2, 40]),
       st.integers(0, 70), st.integers(0, 70), st.sampled_from([0, 0, 1, 100]),
       st.sampled_from([1, 2, 4, (1, 3), (2, 1, 1), (4, 3, 2, 1), (1, 1, 1, 1, 4)]),
       st.sampled_from([LID] * 6 + [LID + 1, -1, 2**64]))
@example(recs=[(1, 1, 0, LID), (1, 1, 0, LID), (1, 1, E.FLAG_TRUNCATE, LID), (1, 1, 0, LID)], first=0, after=0,
         flip=None, cut=0, pad=0, tail=0, over=0, step=1, ledger=LID)
def test_the_c_walk_is_the_python_walk(recs, first, after, flip, cut, pad, tail, over, step, ledger):
    """Frames of runs, gaps, ids out of order, no-ops, truncate flags and
    other ledgers' records, padded before ``start`` and after ``stop`` (or
    ``stop`` past the buffer), a byte flipped, the end cut, steps of every
    shape, ledger ids no record can carry: the same runs (ids, offsets),
    no-ops, or error and message; and decode_sparse's entries (payloads
    bytes of a bytes frame, views of a memoryview) or error and message."""
    eid, parts = first, []
    for gap, size, flags, lid in recs:
        eid += gap
        payload = bytes((eid + k) % 256 for k in range(0 if flags & E.FLAG_NOOP else size))
        parts.append(_record(lid, max(eid, 0), payload, flags))
    body = bytearray(b"".join(parts))
    if flip is not None and body:
        body[flip % len(body)] ^= 0x20
    body = body[:len(body) - cut] if cut < len(body) else body
    buf = bytes(pad) + bytes(body) + bytes(tail)
    start, stop = pad, pad + len(body) + (tail + over if over else 0)
    for args in [(buf, ledger, after, start, stop, step), (memoryview(buf), ledger, after, start, stop, step),
                 (bytes(body), ledger, after, 0, None, step)]:
        assert _outcome(_records.sparse_runs, *args) == _outcome(E._sparse_runs_py, *args)
        assert _decoded(_records.decode_sparse, *args[:5]) == _decoded(E._decode_sparse_py, *args[:5])


def test_a_stop_past_the_buffer_is_its_end_and_a_cut_header_is_named():
    buf = E.encode(LID, 1, b"abc", term=1) + E.encode(LID, 2, b"de", term=1)
    for fn in (_records.sparse_runs, E._sparse_runs_py):
        runs, noops = fn(buf, LID, 0, 0, len(buf) + 100)
        assert [(eid, len(offs) - 1) for eid, offs in runs] == [(1, 2)] and noops == []
        with pytest.raises(E.MalformedEntry, match="truncated entry header"):
            fn(buf[:len(buf) - 20], LID, 0, 0, None)   # the second header is cut short
        with pytest.raises(E.MalformedEntry, match="truncated entry payload"):
            fn(buf[:len(buf) - 1], LID, 0)              # its payload is
        with pytest.raises(E.ChecksumMismatch) as ei:
            fn(buf[:-1] + bytes([buf[-1] ^ 1]), LID, 0)
        assert (ei.value.ledger_id, ei.value.entry_id) == (LID, 2)


def test_decode_sparse_makes_entries_as_the_python_walk_does():
    buf = b"".join(E.encode(LID, i, b"" if i == 3 else b"p%d" % i, term=2, lac=i - 1, lafr=i - 2, origin=1,
                            data_flags=E.FLAG_NOOP if i == 3 else 0) for i in range(1, 6))
    for fn in (_records.decode_sparse, E._decode_sparse_py):
        got = fn(buf, LID, 0)
        assert [type(e) for e in got] == [E.Entry] * 5 and got[2].is_noop and not got[1].is_noop
        assert [(e.entry_id, e.payload, e.lac, e.lafr, e.origin) for e in got if not e.is_noop] == [
            (i, b"p%d" % i, i - 1, i - 2, 1) for i in (1, 2, 4, 5)]
    with pytest.raises(TypeError):
        _records.bind(E.MalformedEntry, E.ChecksumMismatch, dict)


def test_bad_arguments_are_refused():
    buf = E.encode(LID, 1, b"abc", term=1)
    with pytest.raises(TypeError):
        _records.sparse_runs(buf, LID)
    with pytest.raises(TypeError):
        _records.sparse_runs("not bytes", LID, 0)
    with pytest.raises(ValueError):
        _records.sparse_runs(buf, LID, 0, -1)
    with pytest.raises(ValueError):
        _records.sparse_runs(buf, LID, 0, 0, None, ())
    with pytest.raises(TypeError):
        _records.crc32(buf, 0, 1, 2)


def test_frame_buffer_gives_new_bytes_and_a_view_that_fills_them():
    """The read port client's receive buffer (stream/read_port_client.py):
    each call a new bytes object, filled through its view, unshared; the
    view released, the bytes stay."""
    from stream import read_port_client

    assert read_port_client.frame_buffer is _records.frame_buffer
    for n in (1, 2, 7, 4096, 1 << 20):
        b, view = _records.frame_buffer(n)
        b2, view2 = _records.frame_buffer(n)
        assert type(b) is bytes and len(b) == n and not view.readonly and len(view) == n and b is not b2
        data = os.urandom(n)
        view[: n // 2] = data[: n // 2]
        view[n // 2:] = data[n // 2:]
        view2[:] = bytes(n)
        view.release()
        assert b == data and b2 == bytes(n)
    b, view = _records.frame_buffer(0)
    assert b == b"" and len(view) == 0 and view.readonly   # (the shared empty bytes: no way to write to it)
    assert b"" == bytes()
    with pytest.raises(ValueError):
        _records.frame_buffer(-1)
    with pytest.raises(TypeError):
        _records.frame_buffer("8")


def test_frame_buffer_gives_again_only_bytes_nobody_holds():
    """frame_buffer's pool: bytes of 64 KiB .. 4 MiB come back once nothing
    else holds them (the same object, its length and hash made anew), never
    while anything does (the bytes, or a view of a slice of them: what a
    record's payload view is),
    and it holds at most 32 MiB; below 64 KiB and above 4 MiB, new bytes
    each time."""
    if sys.version_info >= (3, 13):
        pytest.skip("no frame pool from Python 3.13 on (bookie/_records.c)")
    _records.frame_pool(True)
    n = 1 << 20
    b, view = _records.frame_buffer(n)
    view[:] = b"a" * n
    view.release()
    h, first = hash(b), id(b)
    del b
    b, view = _records.frame_buffer(n - 100)   # (within the block's size: the same bytes)
    assert id(b) == first and len(b) == n - 100
    view[:] = b"b" * (n - 100)
    view.release()
    assert b == b"b" * (n - 100) and hash(b) == hash(bytes(b)) != h
    # Held: as bytes, as a view of a slice (a record's payload view).
    held = [b, memoryview(b)[10:20]]
    del b
    for keep in held:
        others = []
        for _ in range(3):
            b2, view2 = _records.frame_buffer(n - 100)
            view2[:] = b"c" * (n - 100)
            view2.release()
            others.append(b2)
        assert all(o is not keep and (o is not getattr(keep, "obj", None)) for o in others)
        assert bytes(keep[:10]) == b"b" * 10
        del others
    # Sizes outside the range are not pooled; a frame far smaller than a block does not take it.
    _records.frame_pool(True)
    made = _records.frame_pool()[1]
    for size in (1000, (64 << 10) - 1, (4 << 20) + 1):
        b, view = _records.frame_buffer(size)
        view.release()
        assert _records.frame_pool()[1:] == (made, 0, 0)
    b, view = _records.frame_buffer(2 << 20)
    view.release()
    ident = id(b)
    del b
    b, view = _records.frame_buffer(256 << 10)   # (a 2 MiB block serves no 256 KiB frame)
    view.release()
    assert id(b) != ident and _records.frame_pool()[1:] == (made + 2, 2, (2 << 20) + (256 << 10))
    del b
    # Every slot held: a block that serves no frame asked is replaced once free.
    _records.frame_pool(True)
    live = [_records.frame_buffer(64 << 10) for _ in range(50)]
    assert _records.frame_pool()[2:] == (48, 48 * (64 << 10))
    del live
    b, view = _records.frame_buffer(n)
    view.release()
    assert _records.frame_pool()[2:] == (48, 47 * (64 << 10) + n)
    del b
    # The bound: 40 frames of 1 MiB held at once, 32 of them from the pool.
    _records.frame_pool(True)
    reused, made = _records.frame_pool()[:2]
    live = [_records.frame_buffer(n) for _ in range(40)]
    assert _records.frame_pool() == (reused, made + 32, 32, 32 << 20)
    del live
    again = [_records.frame_buffer(n) for _ in range(40)]
    assert _records.frame_pool()[:2] == (reused + 32, made + 32)
    del again
    _records.frame_pool(True)
