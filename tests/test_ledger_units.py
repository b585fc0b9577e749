"""Ledger client pieces without processes: error translation, placement."""
from __future__ import annotations

import os
import random
from types import SimpleNamespace

import pytest

from bookie import entry as E
from metadata import errors as me
from stream import errors as se
from stream import writer_core as wc
from stream.bookie_client import BookieUnavailable
from stream.placement import LeastLoadedPlacement, RandomPlacement, get_policy, rejoined_after


def reg(bid, free=0, ro=False):
    return SimpleNamespace(bookie_id=bid, free_bytes=free, read_only=ro, address=f"{bid}:1")


@pytest.mark.parametrize("low,high,retriable", [
    (me.NoSuchLedger(5), se.NoSuchLedger, False),
    (me.InvalidLedgerConfig("x"), se.InvalidLedgerConfig, False),
    (me.MetadataUnavailable("x"), se.MetadataUnavailable, True),
    (me.BadVersion("k", 1, None), se.MetadataConflict, True),
    (wc.WriterFenced("x", wc.WriterState.FENCED), se.LedgerFenced, False),
    (wc.WriterClosed("x", wc.WriterState.CLOSED), se.LedgerClosed, False),
    (wc.WindowFull("x", wc.WriterState.OPEN), se.TooManyPendingAdds, True),
    (wc.WriterFailed("x", wc.WriterState.FAILED), se.AddFailed, False),
    (BookieUnavailable("x"), se.QuorumTimeout, True),
])
def test_translate_maps_lower_layers_to_typed_errors(low, high, retriable):
    out = se.translate(low)
    assert type(out) is high and out.retriable is retriable and out.__cause__ is low


def test_every_error_has_retriable():
    for name in se.__all__:
        obj = getattr(se, name)
        if isinstance(obj, type):
            assert isinstance(obj.retriable, bool), name
    assert se.LedgerRecoveryFailed.retriable and se.NotEnoughBookies.retriable
    assert not se.LedgerFenced.retriable and not se.EntryMissing.retriable
    err = ValueError("x")
    assert se.translate(err) is err


def test_placement_distinct_writable_not_excluded():
    cands = [reg("a"), reg("b"), reg("c", ro=True), reg("d"), reg("a")]
    p = RandomPlacement(random.Random(1))
    for _ in range(50):
        got = p.choose(cands, 2, exclude={"d"})
        assert sorted(got) == ["a", "b"]
    with pytest.raises(se.NotEnoughBookies) as ei:
        p.choose(cands, 3, exclude={"d"})
    assert ei.value.needed == 3 and ei.value.available == 2 and ei.value.retriable


def test_random_placement_spreads():
    cands = [reg(f"b{i}") for i in range(6)]
    p = RandomPlacement(random.Random(7))
    seen = {tuple(sorted(p.choose(cands, 3))) for _ in range(100)}
    assert len(seen) > 5


def test_least_loaded_prefers_free_bytes():
    cands = [reg("a", 10), reg("b", 300), reg("c", 200), reg("d", 5)]
    assert LeastLoadedPlacement().choose(cands, 2) == ["b", "c"]
    assert LeastLoadedPlacement().choose(cands, 2, exclude={"b"}) == ["c", "a"]


def test_a_bookie_rejoined_after_a_ledger_is_left_out_of_its_changes():
    # (bookie/cookie.py: a lost disk back under its id refuses older ledgers' adds)
    cands = [reg("a"), reg("b"), reg("c")]
    cands[2].rejoined_at = 500
    assert rejoined_after(cands, 499).keys() == {"c"} and "revision 500" in rejoined_after(cands, 499)["c"]
    assert rejoined_after(cands, 500) == {} and rejoined_after(cands, 10_000) == {}
    assert rejoined_after([SimpleNamespace(bookie_id="x")], 1) == {}     # (a registration without the field)


def test_get_policy():
    assert get_policy("random").name == "random"
    assert get_policy("least_loaded").name == "least_loaded"
    assert get_policy(None).name == "random"
    with pytest.raises(se.InvalidLedgerConfig):
        get_policy("nope")
    with pytest.raises(se.InvalidLedgerConfig):
        get_policy(object())


# -- batch codecs (the writer's and the reader's hot paths) ------------------------------


def test_encode_run_and_decode_run_match_the_one_at_a_time_codec():
    payloads = [os.urandom(n) for n in (0, 1, 52, 100, 4096)]
    recs = E.encode_run(9, 40, payloads, lac=38, lafr=37, term=4)
    assert recs == [E.encode(9, 40 + i, p, lac=38, lafr=37, term=4) for i, p in enumerate(payloads)]
    got = E.decode_run(b"".join(recs), 9, 40)
    assert got == [E.decode(r) for r in recs]
    assert [g.payload for g in got] == payloads and E.decode_run(b"", 9, 40) == []


@pytest.mark.parametrize("damage", ["crc", "gap", "ledger", "truncated", "flags"])
def test_decode_run_rejects_damaged_or_foreign_frames(damage):
    recs = [E.encode(9, 40 + i, b"payload %d" % i, lac=39) for i in range(3)]
    if damage == "gap":
        recs[1] = E.encode(9, 42, b"x")
    elif damage == "ledger":
        recs[2] = E.encode(8, 42, b"x")
    buf = bytearray(b"".join(recs))
    if damage == "crc":
        buf[-1] ^= 1
    elif damage == "truncated":
        del buf[-3:]
    elif damage == "flags":
        buf[8] = 0xFF  # request flags of the first record: unknown bits
    expected = E.ChecksumMismatch if damage == "crc" else E.MalformedEntry
    with pytest.raises(expected):
        E.decode_run(bytes(buf), 9, 40)


def test_verify_all_counts_good_frames_and_names_the_rotten_record():
    recs = [E.encode(3, 10 + i, b"x" * i) for i in range(5)]
    assert E.verify_all(b"".join(recs)) == 5 and E.verify_all(b"") == 0
    bad = bytearray(b"".join(recs))
    bad[len(recs[0]) + len(recs[1]) + E.HEADER_SIZE] ^= 0xFF   # the payload of entry 12
    with pytest.raises(E.ChecksumMismatch) as e:
        E.verify_all(bytes(bad))
    assert (e.value.ledger_id, e.value.entry_id) == (3, 12)
    with pytest.raises(E.MalformedEntry):
        E.verify_all(b"".join(recs)[:-1])


def test_tune_gc_freezes_what_lives_and_raises_the_thresholds():
    import gc

    from bookstream.tuning import GC_THRESHOLDS, tune_gc
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_run_uses_uvloop():
    from bookstream.tuning import loop_implementation, run

    async def which():
        return loop_implementation()

    assert run(which()) == "uvloop"


def test_tune_malloc_keeps_freed_buffers_for_reuse():
    """After tune_malloc, freeing and taking again a few MiB does not fault
    the pages in again (glibc; elsewhere it reports that it changed nothing)."""
    import subprocess
    import sys
    code = (
        "import resource, sys\n"
        "from bookstream.tuning import tune_malloc\n"
        "tuned = sys.argv[1] == '1' and tune_malloc()\n"
        "def faults():\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "bufs = [bytearray(8 << 20) for _ in range(4)]; del bufs\n"
        "f0 = faults()\n"
        "for _ in range(20):  # a few frames in flight, then none\n"
        "    bufs = [bytearray(8 << 20) for _ in range(4)]; del bufs\n"
        "print(tuned, faults() - f0)\n")
    # glibc's default mmap threshold moves with what was freed, and whether
    # the heap's top can be trimmed depends on where the kernel put the
    # mappings around it (one untuned run here faulted 57k pages, most 163k):
    # both children start from the fixed default, so only tune_malloc differs
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    got = {}
    for arg in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, check=True,
                             env=env).stdout.split()
        got[arg] = (out[0] == "True", int(out[1]))
    if not got["1"][0]:
        pytest.skip("not glibc: tune_malloc changes nothing")
    # untuned, every 8 MiB buffer is mapped and unmapped, and its pages
    # faulted in again, 8,192 pages per round
    assert got["0"][1] > 20 * 8000 and got["1"][1] < 20 * 100, got


def test_a_batch_leaves_in_frames_of_at_most_frame_bytes_in_order():
    from stream.frames import FRAME_BYTES, split_frames

    size = FRAME_BYTES // 4
    records = [bytes([k]) * size for k in range(10)] + [b"x" * (FRAME_BYTES + 1), b"y"]
    ids = list(range(100, 112))
    frames = list(split_frames(records, ids))
    assert [f[0] for f in frames] == [ids[0:4], ids[4:8], ids[8:10], [110], [111]]  # an oversized record alone
    assert [r for _, recs in frames for r in recs] == records
    assert all(sum(map(len, recs)) <= FRAME_BYTES for fids, recs in frames if len(fids) > 1)
    assert list(split_frames(records[:3], ids[:3])) == [(ids[:3], records[:3])]  # a small batch: one frame
