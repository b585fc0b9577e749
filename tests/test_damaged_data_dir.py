"""A data dir that lost part of what its bookie acknowledged, its cookie
kept: the bookie refuses to start (``bookie.storage.DamagedDataDir``),
where it would have answered "no such entry" for acknowledged entries (a
recovery takes that as proof they were never written).  What a crash
leaves (a torn tail) is still cut off as before.  Real Storage, real
files; the last two on real bookie processes and etcd."""
from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from bookie import entry as E
from bookie.core import Status
from bookie.journal import R_ENTRIES, frame_record, segment_name
from bookie.storage import DamagedDataDir, Storage, StorageConfig
from tests.storage_support import admit_durably
from tests.test_cookie import _refused   # (exit code 3, the reason in its log, its port never served)

SEGMENT = 1 << 16
LID = 7


def _config() -> StorageConfig:
    return StorageConfig(segment_size=SEGMENT, checkpoint_bytes=1 << 30)


def _frame(first: int, n: int = 8, size: int = 1000) -> bytes:
    return b"".join(E.encode(LID, e, bytes([e % 251]) * size, term=1) for e in range(first, first + n))


def _write(path, plan: list) -> list[int]:
    """Opens a Storage in ``path``, then per item of ``plan``: an int n,
    n frames of 8 entries (8 KB) made durable; "checkpoint", a checkpoint.
    Returns the journal's segments at the end."""
    async def go():
        s = Storage(path, _config())
        s.open()
        nxt = 0
        try:
            for step in plan:
                if step == "checkpoint":
                    await s.checkpoint()
                    continue
                for _ in range(step):
                    await admit_durably(s, [_frame(nxt)])
                    nxt += 8
            await s.journal.sync()
            return s.journal.segments()
        finally:
            s.close()
    return asyncio.run(go())


def _reopen(path) -> Storage:
    s = Storage(path, _config())
    try:
        s.open()
    except BaseException:
        s.close()
        raise
    return s


def _seg(path, n: int):
    return path / "journal" / segment_name(n)


def _snapshot(path) -> dict:
    return {p.name: p.read_bytes() for p in sorted((path / "journal").iterdir())}


def test_an_intact_dir_reopens_with_every_entry(tmp_path):
    segs = _write(tmp_path, [20, "checkpoint", 20])
    assert len(segs) >= 4 and _seg(tmp_path, 1).exists()
    s = _reopen(tmp_path)
    try:
        assert s.core.ledgers[LID].index.get(319) is not None and s.had_history
    finally:
        s.close()


@pytest.mark.parametrize("damage, says", [
    ("checkpoint gone, early segments gone", "no checkpoint, and the journal begins at segment"),
    ("the checkpoint's segment gone", "the checkpoint's, is gone"),
    ("the checkpoint's segment cut short", "fewer than the"),
    ("a segment after the checkpoint gone", "after the checkpoint's are gone"),
    ("a segment before the checkpoint gone", "are gone, and the index has entries there"),
])
def test_a_damaged_dir_is_refused_and_left_as_it_was(tmp_path, damage, says):
    segs = _write(tmp_path, [20, "checkpoint", 20])
    s = _reopen(tmp_path)
    ckp = s.checkpoint_pos.segment
    s.close()
    assert segs[0] < ckp < segs[-1] - 1, (segs, ckp)
    if damage == "checkpoint gone, early segments gone":
        (tmp_path / "checkpoint").unlink()
        _seg(tmp_path, 1).unlink()
    elif damage == "the checkpoint's segment gone":
        _seg(tmp_path, ckp).unlink()
    elif damage == "the checkpoint's segment cut short":
        with open(_seg(tmp_path, ckp), "r+b") as f:
            f.truncate(s.checkpoint_pos.offset - 1)
    elif damage == "a segment after the checkpoint gone":
        _seg(tmp_path, ckp + 1).unlink()
    else:
        _seg(tmp_path, segs[0]).unlink()   # (its entries live: nothing was collected)
    before = _snapshot(tmp_path)
    with pytest.raises(DamagedDataDir, match=says):
        _reopen(tmp_path)
    assert _snapshot(tmp_path) == before        # nothing cut, nothing removed


def test_a_checkpoint_the_disk_changed_is_refused(tmp_path):
    """The checkpoint is written by rename: a CRC that fails is the disk's
    loss, refused as a damaged dir (before: a bare RuntimeError)."""
    _write(tmp_path, [20, "checkpoint", 2])
    data = bytearray((tmp_path / "checkpoint").read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / "checkpoint").write_bytes(bytes(data))
    before = _snapshot(tmp_path)
    with pytest.raises(DamagedDataDir, match="checkpoint: its CRC does not match"):
        _reopen(tmp_path)
    assert _snapshot(tmp_path) == before


def test_a_bad_record_before_a_written_segment_is_a_loss_not_a_torn_tail(tmp_path):
    """Segment k + 1 is begun only once segment k is durable: a bad record
    in k with records in k + 1 is the disk's loss.  Cut there, as a torn
    tail is, it would drop every acknowledged entry after it."""
    segs = _write(tmp_path, [4])
    assert segs == [1]
    segs = _write(tmp_path, [30])         # (a reopen: the first segment is the checkpoint-less replay's)
    assert len(segs) >= 3
    data = bytearray(_seg(tmp_path, 1).read_bytes())
    data[-1] ^= 0xFF    # a flipped payload byte in the segment's last record (no mark after it in the segment)
    _seg(tmp_path, 1).write_bytes(bytes(data))
    before = _snapshot(tmp_path)
    with pytest.raises(DamagedDataDir, match="holds records: the disk lost data"):
        _reopen(tmp_path)
    assert _snapshot(tmp_path) == before


def test_a_record_rotted_in_the_newest_segment_is_a_loss_not_a_torn_tail(tmp_path):
    """Inside the newest segment, a bad record with a mark after it (each
    commit's, and the one a close writes) is the disk's loss: acknowledged
    records after it would be cut off as a torn tail."""
    segs = _write(tmp_path, [4])
    assert segs == [1]
    data = bytearray(_seg(tmp_path, 1).read_bytes())
    data[-(len(data) // 3)] ^= 0xFF   # a payload byte two thirds in, commits after it
    _seg(tmp_path, 1).write_bytes(bytes(data))
    before = _snapshot(tmp_path)
    with pytest.raises(DamagedDataDir, match="a mark at .* says every byte before it was durable"):
        _reopen(tmp_path)
    assert _snapshot(tmp_path) == before


def test_a_torn_tail_before_an_empty_segment_is_still_cut(tmp_path, caplog):
    """What a crash leaves: the last segment's tail torn (its write never
    made durable), and a segment begun but empty: cut and removed."""
    segs = _write(tmp_path, [30])
    last = segs[-1]
    good = _seg(tmp_path, last).stat().st_size
    body = _frame(10_000)
    with open(_seg(tmp_path, last), "ab") as f:
        f.write(frame_record(R_ENTRIES, body) + body[: len(body) // 2])
    _seg(tmp_path, last + 1).write_bytes(b"")
    s = _reopen(tmp_path)
    try:
        assert _seg(tmp_path, last).stat().st_size == good and not _seg(tmp_path, last + 1).exists()
        assert s.core.ledgers[LID].index.get(10_000) is None
    finally:
        s.close()


# -- real bookie processes ------------------------------------------------------------------


def test_a_bookie_whose_dir_lost_a_segment_refuses_to_start(own):
    """A segment of a real bookie's journal lost (its cookie kept): exit 3,
    saying what is gone and the way back; the data dir untouched."""
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(3, ["--segment-size", str(SEGMENT)])
    closed_ledger(own, [b"x" * 6_000 for _ in range(30)], batch=2)   # (every journal rolls: E3 Qw3)
    victim = procs[0]
    victim.kill()
    journal = victim.data_dir / "journal"
    segs = sorted(journal.glob("segment-*.log"))
    assert len(segs) >= 2
    segs[0].unlink()
    before = sorted(p.name for p in journal.iterdir())
    _refused(victim, "the data dir is damaged")
    assert "Move the data dir aside" in victim.log_path.read_text()
    assert sorted(p.name for p in journal.iterdir()) == before


def test_a_bookie_whose_newest_segment_rotted_refuses_to_start(own):
    """A real bookie killed -9 after many commits, a byte of its newest
    segment's first record flipped (rot, not a crash's tail: marks of later
    commits follow it): exit 3, the data dir untouched, where the journal
    was cut there before and every acknowledged entry after it dropped."""
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(3)
    closed_ledger(own, [b"z" * 500 for _ in range(40)], batch=2)
    victim = procs[0]
    victim.kill()
    newest = sorted((victim.data_dir / "journal").glob("segment-*.log"))[-1]
    data = bytearray(newest.read_bytes())
    assert len(data) > 20_000
    data[200] ^= 0xFF
    newest.write_bytes(bytes(data))
    _refused(victim, "says every byte before it was durable")
    assert newest.read_bytes() == bytes(data)


def test_a_dir_emptied_under_its_cookie_is_a_lost_disk(own):
    """The journal and checkpoint gone, the cookie file kept: judged as a
    data dir that lost its data (refused under its id), not a bookie
    with nothing to say about its ledgers."""
    from tests.test_recovery_cli import cli, closed_ledger

    procs = own.start(3)
    closed_ledger(own, [b"y%d" % i for i in range(10)])
    victim = procs[0]
    victim.kill()
    shutil.rmtree(victim.data_dir / "journal")
    (victim.data_dir / "checkpoint").unlink(missing_ok=True)
    assert (victim.data_dir / "cookie").exists()
    _refused(victim, "or a cookie file and no data")
    shown = json.loads(cli(own, "bookies", "cookie", "show", victim.bookie_id, "--format", "json").stdout)
    assert shown["ledgers_naming_it"] == 1


@pytest.mark.parametrize("seed", range(16))
def test_no_dir_a_bookie_wrote_is_judged_damaged(tmp_path, seed):
    """Random adds to several ledgers, deletions of ledgers and of ranges,
    checkpoints, GC passes (dead segments removed, sparse ones compacted),
    restarts and crashes with a torn tail: every reopen passes the damage
    check (a false refusal would stop a healthy bookie for good) and reads
    back every entry acknowledged and not deleted.  Scrub passes run
    between and beside them (bookie/scrub.py: its spans read while the
    other operations go on, GC passes moving and removing records
    meanwhile): none may find a record rotted."""
    import random

    from bookie.scrub import Scrubber

    rng = random.Random(seed)
    config = StorageConfig(segment_size=SEGMENT, checkpoint_bytes=1 << 18)
    held: dict[tuple[int, int], bytes] = {}
    nxt: dict[int, int] = {}
    counts = {"reopens": 0, "removed": 0, "compacted": 0, "scrubbed": 0}
    scrubs: list[asyncio.Task] = []

    async def scrubbed() -> None:   # (the passes begun: each found nothing rotted)
        for t in scrubs:
            out = await t
            assert out.rotted == [], out.rotted
            counts["scrubbed"] += out.entries
        scrubs.clear()

    def reopen(s: Storage | None, torn: bool) -> Storage:
        if s is not None:
            s.close()
        if torn:
            last = sorted((tmp_path / "journal").glob("segment-*.log"))[-1]
            body = _frame(10 ** 6)
            with open(last, "ab") as f:
                f.write(frame_record(R_ENTRIES, body) + body[:rng.randint(1, len(body) - 1)])
        s = Storage(tmp_path, config)
        s.open()                      # (DamagedDataDir here: the test fails)
        counts["reopens"] += 1
        for (lid, eid), payload in held.items():
            status, rec = s.read_record(lid, eid)
            assert status is Status.OK and E.decode(rec).payload == payload, (lid, eid, status)
        return s

    async def go():
        s = reopen(None, False)
        lids = [1, 2, 3]
        for _ in range(120):
            if not scrubs and rng.random() < 0.15:   # a pass beside the next operations
                scrubs.append(asyncio.create_task(Scrubber(s, rate=0).scrub_pass()))
            op = rng.random()
            if op < 0.55:
                lid = rng.choice(lids)
                first, n = nxt.get(lid, 0), rng.randint(1, 12)
                payloads = [rng.randbytes(rng.randint(50, 3000)) for _ in range(n)]
                await admit_durably(s, [b"".join(E.encode(lid, first + k, p, term=1)
                                                 for k, p in enumerate(payloads))])
                held.update({(lid, first + k): p for k, p in enumerate(payloads)})
                nxt[lid] = first + n
            elif op < 0.62:
                lid = rng.choice(lids)
                await s.drop_ledger(lid)
                for k in [k for k in held if k[0] == lid]:
                    del held[k]
                lids[lids.index(lid)] = max(lids) + 1
            elif op < 0.7 and nxt:
                lid = rng.choice(sorted(nxt))
                a = rng.randint(0, nxt[lid])
                b = rng.randint(a, nxt[lid] + 2)
                await s.delete(lid, (a, b))
                for eid in range(a, b + 1):
                    held.pop((lid, eid), None)
            elif op < 0.8:
                done = await s.collect_garbage()
                counts["removed"] += len(done["removed_segments"])
                counts["compacted"] += len(done["compacted_segments"])
            elif op < 0.86:
                await s.checkpoint()
            else:
                await scrubbed()
                s = reopen(s, torn=rng.random() < 0.5)
        await scrubbed()
        s.close()

    asyncio.run(go())
    assert counts["reopens"] >= 3 and counts["removed"] and counts["compacted"] and counts["scrubbed"]   # (each seed: 14-26, 5-12, 3-9)


def test_a_failed_write_not_taken_back_halts_the_bookie_until_a_restart(tmp_path, monkeypatch):
    """A journal write that fails (here its fdatasync: EIO) and whose bytes
    cannot be cut off either (ftruncate failing too, as on a failing disk):
    a later write would land after those bytes, where no offset handed out
    points.  The journal writes nothing more (every later add fails at
    once) and the bookie halts (read-only for good) until a restart, whose
    replay keeps every record acknowledged before (the failed write's own
    may come back: never acknowledged, as a write whose ack was lost).
    (The faults injected into ``os``: no disk fails on cue.)"""
    import errno
    import os as _os

    from bookie.journal import JournalWriteError

    failing = {"on": False}
    real_fdatasync, real_ftruncate = _os.fdatasync, _os.ftruncate

    def fdatasync(fd):
        if failing["on"]:
            raise OSError(errno.EIO, "injected: fdatasync")
        return real_fdatasync(fd)

    def ftruncate(fd, n):
        if failing["on"]:
            raise OSError(errno.EIO, "injected: ftruncate")
        return real_ftruncate(fd, n)

    async def go():
        s = Storage(tmp_path, _config())
        s.open()
        try:
            await admit_durably(s, [_frame(0), _frame(8)])
            size = _seg(tmp_path, 1).stat().st_size
            monkeypatch.setattr(_os, "fdatasync", fdatasync)
            monkeypatch.setattr(_os, "ftruncate", ftruncate)
            failing["on"] = True
            with pytest.raises(JournalWriteError, match="injected: fdatasync"):
                await admit_durably(s, [_frame(16)])
            failing["on"] = False
            assert s.journal.broken and "could not be taken back" in s.journal.broken
            assert s.core.halted.startswith("journal: ") and s.read_only
            grown = _seg(tmp_path, 1).stat().st_size
            assert grown > size                                  # (the failed write's bytes are there)
            assert s.admit_frame(_frame(24), s.validate_frame(_frame(24))[2])[0]   # (refused: halted)
            s.journal.append(R_ENTRIES, _frame(24))              # (below the core: the journal refuses too)
            with pytest.raises(JournalWriteError, match="could not be taken back"):
                await s.journal.sync()
            assert _seg(tmp_path, 1).stat().st_size == grown     # nothing written after them
        finally:
            s.close()
        assert _seg(tmp_path, 1).stat().st_size == grown         # (nor a closing mark over them)

    asyncio.run(go())
    monkeypatch.undo()
    s = _reopen(tmp_path)
    try:
        assert not s.core.halted and not s.read_only
        assert all(s.core.ledgers[LID].index.get(e) is not None for e in range(16))
    finally:
        s.close()
