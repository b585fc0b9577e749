"""A data dir that lost part of what its bookie acknowledged, its cookie
kept: the bookie refuses to start (``bookie.storage.DamagedDataDir``),
where it would have answered "no such entry" for acknowledged entries (a
recovery takes that as proof they were never written).  What a crash
leaves (a torn tail) is still cut off as before; with ``--on-lost-disk
rejoin`` a damaged dir's data is set aside (``bookie.data_dir.set_aside``)
and the bookie walks a lost disk's way back.  Real Storage, real files;
the last ones on real bookie processes and etcd."""
from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest

from bookie import entry as E
from bookie.core import Status
from bookie.data_dir import DATA, REASON_FILE, DataDirInUse, lock_data_dir, set_aside, set_aside_dirs
from bookie.journal import segment_name
from bookie.journal_record import R_ENTRIES, frame_record
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


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_rot_found_where_a_start_would_replay_it_is_checkpointed_past(tmp_path, checkpointed):
    """A record rotted after the last checkpoint, marks after it: the next
    start would refuse the data dir (control: ``checkpointed=False``).
    Found by a scrub pass (or a read: ``BookieService._rotted``), it makes
    a checkpoint due at once (the upkeep loop's next second), and after it
    the start replays from past the record: the data dir opens, the entry
    still indexed there (its reads fail their CRC and report it again
    until autorecovery writes it anew)."""
    from bookie.index import unpack_location
    from bookie.scrub import Scrubber

    _write(tmp_path, [6])
    s = _reopen(tmp_path)
    try:
        loc, ln = s.core.ledgers[LID].index.get(3)
        seg, off = unpack_location(loc)
        with open(_seg(tmp_path, seg), "r+b") as f:
            f.seek(off + ln - 1)
            b = f.read(1)
            f.seek(off + ln - 1)
            f.write(bytes([b[0] ^ 0xFF]))
        assert not s.checkpoint_due
        out = asyncio.run(Scrubber(s, rate=0).scrub_pass())
        assert out.rotted == [(LID, 3)] and s.checkpoint_due
        if checkpointed:
            asyncio.run(s.checkpoint())
            assert not s.checkpoint_due
    finally:
        s.close()
    if not checkpointed:
        with pytest.raises(DamagedDataDir, match="says every byte before it was durable"):
            _reopen(tmp_path)
        return
    s = _reopen(tmp_path)
    try:
        assert s.core.ledgers[LID].index.get(3) == (loc, ln) and s.core.ledgers[LID].index.get(47) is not None
        assert not s.checkpoint_past(LID, 0)    # (before the checkpoint: no start replays it)
    finally:
        s.close()


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
    assert "start with --on-lost-disk rejoin" in victim.log_path.read_text()
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
    newest, rotted = _rot_newest(victim)
    _refused(victim, "says every byte before it was durable")
    assert newest.read_bytes() == rotted and not set_aside_dirs(victim.data_dir)


def _rot_newest(proc) -> tuple:
    """A byte of a killed bookie's newest journal segment flipped, near its
    start (commits, and their marks, after it); (its path, its bytes now)."""
    newest = sorted((proc.data_dir / "journal").glob("segment-*.log"))[-1]
    data = bytearray(newest.read_bytes())
    assert len(data) > 20_000
    data[200] ^= 0xFF
    newest.write_bytes(bytes(data))
    return newest, bytes(data)


def test_a_damaged_bookie_told_to_rejoin_sets_its_data_aside_and_rejoins(own):
    """The rotted newest segment again, the bookie started with
    ``--on-lost-disk rejoin``: its data moved into ``damaged-<time>/``
    (the rotted segment as it was, the reason beside it), its id and log
    kept; it then waits as a lost disk, serving nothing, until `bookstream
    recover` has moved the ledger's copy elsewhere, and rejoins under its
    id as a new bookie; the ledger reads back whole."""
    from concurrent.futures import ThreadPoolExecutor

    from bookie.cookie import read_local
    from tests.test_autorecovery import until
    from tests.test_cookie import _back_as_new
    from tests.test_recovery_cli import cli, closed_ledger

    procs = own.start(4)
    payloads = [b"z" * 500 for _ in range(40)]
    lid, ens = closed_ledger(own, payloads, batch=2)
    victim = next(p for p in procs if p.bookie_id == ens[0])
    stamped = read_local(victim.data_dir, victim.bookie_id)
    victim.kill()
    newest, rotted = _rot_newest(victim)
    victim.extra_args += ["--on-lost-disk", "rejoin", "--lost-disk-poll", "0.2"]
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(victim.start, 120)

        async def waits():
            return f"1 ledger(s) still name it ({lid}); waiting" in victim.log_path.read_text()
        asyncio.run(until(waits, what="the damaged bookie waiting as a lost disk"))
        assert not started.done()
        aside, = set_aside_dirs(victim.data_dir)
        assert (aside / "journal" / newest.name).read_bytes() == rotted
        assert "says every byte before it was durable" in (aside / REASON_FILE).read_text()
        assert sum(p.stat().st_size for p in (victim.data_dir / "journal").iterdir()) < 100   # (begun anew)
        assert "its data set aside in" in victim.log_path.read_text()
        assert cli(own, "recover", victim.bookie_id).returncode == 0
        started.result(timeout=120)
    _back_as_new(own, victim, stamped, lid, payloads)
    assert set_aside_dirs(victim.data_dir) == [aside]   # (kept; its next starts leave it be)
    kept = sum(p.stat().st_size for p in aside.rglob("*") if p.is_file())
    shown = json.loads(cli(own, "bookies", "info", victim.bookie_id, "--format", "json").stdout)
    assert shown["set_aside_bytes"] == kept > len(rotted)   # (what an operator may take back)


def test_set_aside_moves_the_data_and_keeps_the_rest(tmp_path):
    """What ``set_aside`` moves (the data, journal first) and keeps (the
    id, the log, the etcd revision and mark noted); each call its own
    directory; never while another process holds the lock."""
    _write(tmp_path, [3, "checkpoint", 1])
    for name in ("bookie.id", "bookie.log", "etcd.revision", "etcd.mark", "cookie", "scrubbed"):
        (tmp_path / name).write_text(name)
    held = sorted(p.name for p in tmp_path.iterdir() if p.name in DATA)
    assert {"journal", "checkpoint", "FORMAT", "cookie", "scrubbed"} <= set(held)
    to = set_aside(tmp_path, "a reason", now=0)
    assert to.name == "damaged-19700101T000000Z" and (to / REASON_FILE).read_text() == "a reason\n"
    assert sorted(p.name for p in to.iterdir() if p.name != REASON_FILE) == held
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["bookie.id", "bookie.log", "etcd.revision", "etcd.mark", "lock", to.name])
    s = Storage(tmp_path, _config())   # (an empty data dir now: a lost disk's, to its cookie)
    assert not s.has_history()
    assert set_aside(tmp_path, "again", now=0).name == "damaged-19700101T000000Z-2"
    fd = lock_data_dir(tmp_path)
    try:
        with pytest.raises(DataDirInUse):
            set_aside(tmp_path, "held")
    finally:
        os.close(fd)


def test_a_set_aside_cut_off_after_the_journal_is_damaged_again(tmp_path):
    """A start cut off after moving the journal alone: the checkpoint left
    without its segments is refused again (set aside then), never opened
    as a dir holding less than it acknowledged."""
    _write(tmp_path, [3, "checkpoint", 1])
    shutil.move(tmp_path / "journal", tmp_path / "elsewhere")
    with pytest.raises(DamagedDataDir):
        _reopen(tmp_path)


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
