"""The scrubber (bookie/scrub.py): what a span's bytes say, when a pass is
due, a pass over a real Storage's journal (a dense ledger, a striped
bookie's gapped one, a record rotted in each), and a real bookie whose
rotted entry the workers copy back from the other replicas."""
from __future__ import annotations

import asyncio

import pytest

from bookie import entry as E
from bookie.core import Status
from bookie.entry import rotted
from bookie.index import unpack_location
from bookie.scrub import FIRST_PASS_S, SCRUB_FILE, SPAN_BYTES, Scrubber, due, last_pass_end
from tests.storage_support import admit_durably


def _records(lid: int, ids, size: int = 100) -> list[bytes]:
    return [E.encode(lid, e, bytes([e % 251]) * size, term=1) for e in ids]


def test_rotted_names_each_record_that_is_not_its_entry():
    recs = _records(5, range(10))
    recs[6] = E.encode(5, 60, b"\x06" * 100, term=1)        # another id's record where 6 should be
    buf = bytearray(b"".join(recs))
    at, k = [], 0
    for r in recs:
        at.append(k)
        k += len(r)
    buf[at[3] + E.HEADER_SIZE + 7] ^= 0x01                     # a flipped payload bit
    index = [(e, at[e], len(recs[e])) for e in range(10)]
    index[9] = (9, at[9], len(recs[9]) - 1)                    # the index's length not the record's
    assert rotted(bytes(buf), 5, index) == [3, 6, 9]
    assert rotted(bytes(buf), 4, index[:2]) == [0, 1]          # another ledger's records
    assert rotted(bytes(buf[: at[2] + 10]), 5, index[:3]) == [2]   # cut short
    clean = b"".join(_records(5, range(10)))
    assert rotted(clean, 5, [(e, 160 * e, 160) for e in range(10)]) == []


def test_a_pass_is_due_an_interval_after_the_last_one_ended(tmp_path):
    assert due(None, 7 * 86400, started=1000.0) == 1000.0 + FIRST_PASS_S   # never scrubbed
    assert due(None, 60.0, started=1000.0) == 1060.0
    assert due(500.0, 7 * 86400, started=1000.0) == 500.0 + 7 * 86400     # restarts do not put it off
    assert due(500.0, 600.0, started=1000.0) == 1600.0                     # overdue: the first's delay after the start
    assert last_pass_end(tmp_path) is None
    (tmp_path / SCRUB_FILE).write_text("1796000000.5\n")
    assert last_pass_end(tmp_path) == 1796000000.5
    (tmp_path / SCRUB_FILE).write_text("garbage")                          # (as if never scrubbed)
    assert last_pass_end(tmp_path) is None


def _flip(storage, lid: int, eid: int) -> None:
    """Flips a payload byte of the entry's record in its journal segment."""
    loc, ln = storage.core.ledgers[lid].index.get(eid)
    seg, off = unpack_location(loc)
    with open(storage.journal.path(seg), "r+b") as f:
        f.seek(off + ln - 1)
        b = f.read(1)
        f.seek(off + ln - 1)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_pass_finds_the_rotted_records_of_dense_and_striped_ledgers(storage):
    """Every held entry is read and checked once; the two rotted ones are
    found, said once, and their ledgers reported (then no more)."""
    async def go():
        await admit_durably(storage, [b"".join(_records(1, range(k, k + 100), 1000)) for k in range(0, 600, 100)])
        for e in range(0, 400, 2):                                # a striped bookie's share: even ids only
            await admit_durably(storage, [b"".join(_records(2, [e]))])
        await admit_durably(storage, [b"".join(_records(3, range(6)))])
        _flip(storage, 1, 350)
        _flip(storage, 2, 8)
        published = []
        s = Scrubber(storage, rate=0, publish=lambda lid, ids: published.append((lid, ids)))
        out = await s.scrub_pass()
        held = sum(len(st.index) for st in storage.core.ledgers.values())
        assert out.entries == held == 600 + 200 + 6
        records = sum(ln for st in storage.core.ledgers.values() for _, _, ln in st.index.iter_all())
        assert records <= out.bytes < records * 1.1   # (and the journal's headers between frames, read with them)
        assert sorted(out.rotted) == [(1, 350), (2, 8)] and s.unreported == {1: {350}, 2: {8}}
        await s.report()
        assert published == [(1, [350]), (2, [8])] and not s.unreported
        s.found(1, 350, "a read")
        assert not s.unreported                   # (said and reported once a pass)
        again = await s.scrub_pass()              # (and again the next pass: the task may have been found done)
        assert sorted(again.rotted) == [(1, 350), (2, 8)] and s.unreported == {1: {350}, 2: {8}}

    asyncio.run(go())


def test_a_pass_asked_for_begins_at_once_and_a_newer_ask_gets_one_of_its_own(storage):
    """A scrub whose next pass is an hour away (just ended one): an ask
    (``request``: its key's revision) starts one at once, its progress
    shown while it runs; the pass served is reported done at that
    revision; an ask made while it ran (revision 9) is not served by it:
    another pass follows at once."""
    import time
    from bookie.scrub import scrub_loop

    async def go():
        await admit_durably(storage, [b"".join(_records(1, range(300)))])
        s = Scrubber(storage, rate=0)
        s.last_end = time.time()
        loop, done, progress = asyncio.get_running_loop(), [], []
        both = asyncio.Event()
        real_check = s._check_span

        async def check_span(*a):
            await real_check(*a)
            progress.append((s.pass_checked, s.pass_entries))
            if len(done) == 0 and s.requested == 5:
                s.request(9)   # (asked again while the pass runs)

        s._check_span = check_span

        def served(rev):
            done.append(rev)
            if len(done) == 2:
                loop.call_soon_threadsafe(both.set)

        class Wake(asyncio.Event):   # (tells when the loop waits for its next pass)
            waiting = asyncio.Event()

            async def wait(self):
                self.waiting.set()
                return await super().wait()

        s.wake = Wake()
        task = asyncio.create_task(scrub_loop(s, 3600, served=served))
        await asyncio.wait_for(s.wake.waiting.wait(), 30)
        assert s.next_due > time.time() + 3000 and not done and s.pass_entries == 0   # (not due: waiting)
        s.wake.waiting.clear()
        s.request(5)
        s.request(3)   # (an older revision: nothing new)
        await asyncio.wait_for(both.wait(), 30)
        # (served runs in a thread: the loop clears the ask once it resumes after it, then waits again)
        await asyncio.wait_for(s.wake.waiting.wait(), 30)
        task.cancel()
        assert done == [5, 9] and s.requested is None
        assert progress[0][1] == 300 and progress[-1] == (300, 300) and s.pass_entries == 0

    asyncio.run(go())


def test_an_entry_moved_or_deleted_during_a_pass_is_not_reported(storage):
    """The pass reads a window of the index, then the bytes: an entry whose
    index entry changed between (a GC pass's compaction or deletion) is
    judged again at report time, and not reported for bytes no longer its."""
    async def go():
        await admit_durably(storage, [b"".join(_records(1, range(50)))])
        _flip(storage, 1, 20)

        class Racing(Scrubber):
            def _window(self, lid, first, last):
                w = super()._window(lid, first, last)
                if w and first == 0:
                    self.storage.core.ledgers[lid].index.delete_range(20, 20)   # (as a deletion applied)
                return w

        out = await Racing(storage, rate=0).scrub_pass()
        assert out.entries == 50 and out.rotted == []

    asyncio.run(go())


def test_records_whose_segment_a_gc_pass_removed_meanwhile_are_not_reported(tmp_path):
    """The pass took a window of ledger 1's index; before it reads the
    bytes, the ledger is dropped and a GC pass removes the segments that
    held it: the reads fail (no such segment), and the confirmation finds
    the index no longer names them.  (Taken for the disk's loss, they would
    be reported: a segment gone under the index is one.)"""
    from bookie.storage import Storage, StorageConfig

    async def go():
        s = Storage(tmp_path / "d", StorageConfig(segment_size=1 << 16, checkpoint_bytes=1 << 30))
        s.open()
        try:
            for k in range(0, 200, 10):
                await admit_durably(s, [b"".join(_records(1, range(k, k + 10), 1000))])
            for k in range(0, 100, 10):
                await admit_durably(s, [b"".join(_records(2, range(k, k + 10), 1000))])
            removed = []

            class Racing(Scrubber):
                async def _check_span(self, lid, span, out, clock, sleep):
                    if lid == 1 and not removed:
                        await self.storage.drop_ledger(1)
                        await self.storage.checkpoint()
                        removed.extend((await self.storage.collect_garbage())["removed_segments"])
                    await super()._check_span(lid, span, out, clock, sleep)

            out = await Racing(s, rate=0).scrub_pass()
            assert removed and out.rotted == [] and out.entries == 200 + 100
        finally:
            s.close()

    asyncio.run(go())


def test_a_pass_does_not_chase_a_ledger_written_meanwhile(storage):
    """A ledger's walk ends at the last id it held when the walk began:
    one written faster than the scrub reads would keep a pass from ever
    ending.  (The ids added here point at other ids' records: checked,
    they would be reported.)"""
    async def go():
        await admit_durably(storage, [b"".join(_records(1, range(50)))])

        class Growing(Scrubber):
            def _window(self, lid, first, last):
                index = self.storage.core.ledgers[lid].index
                for e in range(index.last_entry + 1, index.last_entry + 5001):
                    index.put(e, *index.get(e % 50))
                return super()._window(lid, first, last)

        out = await asyncio.wait_for(Growing(storage, rate=0).scrub_pass(), 60)   # (chasing: it never ends)
        assert out.entries == 50 and out.rotted == []

    asyncio.run(go())


def test_a_paced_pass_reads_at_its_rate(storage):
    """The pass asks its pace before each span: at 2 MB/s, 4 MB of entries
    take about 2 s of the pace's clock, less the bucket's burst (1 MiB at
    once) and the last span, whose bytes go once its wait is over (a clock
    the test moves: no wall time spent)."""
    async def go():
        await admit_durably(storage, [b"".join(_records(1, range(k, k + 64), 64_000)) for k in range(0, 64, 64)])
        now = [0.0]
        slept = []

        async def fake_sleep(d):
            slept.append(d)
            now[0] += d

        out = await Scrubber(storage, rate=2e6).scrub_pass(clock=lambda: now[0], sleep=fake_sleep)
        assert out.bytes > 4_000_000
        assert (out.bytes - (1 << 20) - SPAN_BYTES) / 2e6 <= sum(slept) <= (out.bytes - (1 << 20)) / 2e6, sum(slept)

    asyncio.run(go())


def _rot_payload(proc, marker: bytes, shift: int = 50) -> None:
    """A byte of the payload starting with ``marker`` flipped in the running
    bookie ``proc``'s journal (its preads see the page cache, as they would
    the disk); ``shift``: the byte's place from the payload's start (a
    negative one in the record's header)."""
    (seg,) = [s for s in (proc.data_dir / "journal").glob("segment-*.log") if marker in s.read_bytes()]
    at = seg.read_bytes().find(marker) + shift
    with open(seg, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_bookie_reports_a_rotted_entry_and_the_workers_copy_it_back(own):
    """Four real bookies scrubbing every second; a closed E3 Qw3 ledger;
    one byte of an entry flipped in one bookie's journal while it runs
    (its preads see the page cache, as they would the disk).  Its scrub
    reports the ledger with that bookie damaged at that id; the workers copy
    the entry back onto it from the other replicas (in place: the ledger
    still names it, the spare holds nothing), every replica reads back, and
    its next passes find nothing.  Without the scrub nothing would notice:
    every replica answers ReadLac as before."""
    from stream.autorecovery.keys import AutorecoveryKeys
    from stream.client import BookKeeperClient
    from tests.conftest import run
    from tests.test_autorecovery import check_every_replica, mended, names_bookie, until
    from tests.test_recovery_cli import cli, closed_ledger

    procs = own.start(4, ["--scrub-interval", "1"])
    lid, ens = closed_ledger(own, [b"scrub-%03d-" % i + b"x" * 200 for i in range(40)], ack_quorum=3)
    victim = next(p for p in procs if p.bookie_id == ens[0])
    _rot_payload(victim, b"scrub-017-")

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            keys = AutorecoveryKeys(bk.store, own.cluster)

            async def reported():
                return any(t.ledger_id == lid and t.damaged == {victim.bookie_id}
                           and t.damaged_ids == {victim.bookie_id: ((17, 17),)} for t in keys.tasks())

            await until(reported, what="the rotted entry reported")
            listed = (await asyncio.to_thread(cli, own, "underreplicated", "list")).stdout
            assert f"ledger {lid}: lost {victim.bookie_id}; {victim.bookie_id} damaged at 17" in listed, listed
            info = await (await bk.bookie(victim.bookie_id)).info()   # (what `bookies info` and /info show)
            # (>= 1: a pass every second finds it again until it is filled, and the list above takes a while)
            assert info.scrub_rotted_entries >= 1 and 0 < info.scrub_last_end < info.scrub_next_due
            await mended(own, keys, "the rotted entry copied back")
            assert await names_bookie(bk, victim.bookie_id)
            assert await check_every_replica(bk, lid, 39, set(ens)) == 120
            spare = next(p for p in procs if p.bookie_id not in ens)
            assert (await (await bk.bookie(spare.bookie_id)).read_lac(lid)).status == Status.NO_SUCH_LEDGER
        finally:
            await bk.close()

    run(go())
    assert f"entry 17 of ledger {lid} rotted on disk (found by the scrub)" in victim.log_path.read_text()
    assert all(last_pass_end(p.data_dir) is not None for p in procs)   # (each noted its last pass's end)


async def _reported_and_mended(own, bk, lid: int, bookie_id: str, entry_id: int) -> None:
    """Awaits the scrub's report of ``entry_id`` rotted on ``bookie_id``
    (the ledger's task naming it damaged there), then runs autorecovery
    until no task is left."""
    from stream.autorecovery.keys import AutorecoveryKeys
    from tests.test_autorecovery import mended, until

    keys = AutorecoveryKeys(bk.store, own.cluster)

    async def reported():
        return any(t.ledger_id == lid and t.damaged_ids == {bookie_id: ((entry_id, entry_id),)}
                   for t in keys.tasks())
    await until(reported, what="the rotted entry reported")
    await mended(own, keys, "the rotted entry copied back")


# a byte's place from the payload's start: in it; the header's length field (its second byte: the length then
# reaches past the frame, and a one-pass walk goes astray); its entry id (its own header then names another id)
ROT_SHIFTS = {"payload": 50, "length": -E.HEADER_SIZE + 1, "entry id": -E.HEADER_SIZE + 26}


@pytest.mark.parametrize("where", list(ROT_SHIFTS))
def test_a_copy_takes_an_entry_rotted_on_one_source_from_another(own, where):
    """A closed E3 Qw3 ledger whose first bookie is recovered onto a spare
    while each of the other two holds one entry rotted (0 on one, the first
    of its frame, 23 on the other: whichever source the copy asks first,
    one of its records is bad), a byte of its payload, of its header's
    length field or of its entry id (the bookie's one-pass check then walks
    astray, or the record names another id: the index names the bad
    record).  The source serves the records below it, then
    CHECKSUM_MISMATCH (and reports it, as a read that meets one does); the
    copier asks the next source for that one id and reads on from the
    first after it: the spare holds every entry, each the one written.
    (Before, the copier left the rest of the range to the next source,
    whose own rotted record ended its read too: the copy failed for good,
    every entry held valid by some source.)"""
    from stream.autorecovery.service import recover_ledger_fragments
    from stream.client import BookKeeperClient
    from tests.conftest import run
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(4)
    payloads = [b"src-%03d-" % i + b"y" * 200 for i in range(40)]
    lid, ens = closed_ledger(own, payloads, ack_quorum=3)
    by_id = {p.bookie_id: p for p in procs}
    _rot_payload(by_id[ens[1]], b"src-000-", ROT_SHIFTS[where])
    _rot_payload(by_id[ens[2]], b"src-023-", ROT_SHIFTS[where])
    (spare,) = set(by_id) - set(ens)

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            out = await recover_ledger_fragments(bk, lid, {ens[0]}, target=spare)
            assert out.replaced == [(0, ens[0], spare)] and out.entries == 40 and not out.unrecoverable, out
            sc = await bk.bookie(spare)
            for eid, payload in enumerate(payloads):
                r = await sc.read_entry(lid, eid)
                assert r.status == Status.OK, (eid, r.status)
                assert E.decode(r.entry).payload == payload, eid     # (decode raises on a bad checksum)
        finally:
            await bk.close()

    run(go())
    said = [f"entry {eid} of ledger {lid} rotted on disk (found by a read)" in by_id[b].log_path.read_text()
            for b, eid in ((ens[1], 0), (ens[2], 23))]
    assert sorted(said) == [False, True], said   # (the first source's, met; the second was asked for its id only)


def test_a_rotted_entry_of_a_live_writers_open_fragment_is_copied_back_below_its_lac(own):
    """A stream whose writer stays live (its open fragment its own); one
    byte of an acknowledged entry flipped on a bookie of that fragment.
    The scrub reports it; the worker reads the fragment's LAC from its
    bookies (ids up to it are final, the writer's adds are above) and copies
    the entry back onto the bookie, without sealing the stream: the writer
    appends on at its term in the same fragment, and every replica of
    every entry reads back.  (Before: the task waited for the fragment to
    be sealed, which a stream whose writers stopped never is.)"""
    from stream.stream import AsyncStreamClient, StreamConfig
    from tests.conftest import run
    from tests.test_autorecovery import check_every_replica

    procs = own.start(4, ["--scrub-interval", "1"])

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            w = await sc.open_writer("rot-live", StreamConfig(3, 3, 2))
            at = [await w.append(b"live-%03d-" % i + b"x" * 200) for i in range(40)]
            bk = sc.bk
            lid = await sc._ledger_of("rot-live")
            meta, _ = await bk.meta_call(bk.ledgers.read, lid)
            ens = meta.last_fragment.ensemble
            victim = next(p for p in procs if p.bookie_id == ens[0])
            _rot_payload(victim, b"live-017-")
            await _reported_and_mended(own, bk, lid, victim.bookie_id, at[17].entry_id)
            after = await w.append(b"after")   # (not fenced: the stream was not taken over)
            now, _ = await bk.meta_call(bk.ledgers.read, lid)
            last = at[-1].entry_id
            assert now.term == meta.term and now.fragments == meta.fragments and after.entry_id == last + 1
            assert await check_every_replica(bk, lid, last, set(ens)) == 3 * (last + 1)
            await w.close()
            return victim

    victim = run(go())
    assert "rotted on disk (found by the scrub)" in victim.log_path.read_text()


_WRITER = r"""
import json, sys, time
from stream.stream import StreamClient, StreamConfig
endpoint, cluster = sys.argv[1], sys.argv[2]
sc = StreamClient(endpoint, cluster, writer_lease_ttl=2, explicit_lac_delay=3600)   # (no explicit LAC)
w = sc.open_writer("rot-tail", StreamConfig(3, 3, 2))
last = [w.append(b"tail-%03d-" % i + b"x" * 200) for i in range(40)][-1]
print("ACKED " + json.dumps({"last": last.entry_id, "ledger_id": w.aio.ledger_id}), flush=True)
time.sleep(3600)
"""


def test_a_rotted_entry_above_the_lac_of_a_writerless_stream_is_filled_after_one_take_over(own):
    """A stream's writer killed (kill -9) before its LAC went out: the
    bookies' LAC stays below its last entry for good; that entry rots on a
    bookie.  No LAC read will ever cover it, and no writer will append
    past it: once the writer's key has expired, the worker takes the
    stream over after the grace (its recovery decides the tail: every id
    up to its end final), copies the entry back onto the bookie, and the
    task is done.  (Before: the task waited for ever.)  One take-over, not
    one per round: the term rises by one."""
    import json
    import subprocess
    import sys
    from stream.client import BookKeeperClient
    from tests.conftest import run
    from tests.test_autorecovery import check_every_replica

    procs = own.start(4, ["--scrub-interval", "1"])
    child = subprocess.Popen([sys.executable, "-c", _WRITER, own.endpoint, own.cluster], stdout=subprocess.PIPE,
                             text=True)
    try:
        line = child.stdout.readline()   # (its own word: every entry acknowledged)
        assert line.startswith("ACKED "), line
        acked = json.loads(line[len("ACKED "):])
    finally:
        if child.poll() is None:
            child.kill()   # kill -9: no close, no LAC sent, the lease not revoked
        child.wait()
    lid, last = acked["ledger_id"], acked["last"]

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            meta, _ = await bk.meta_call(bk.ledgers.read, lid)
            ens = meta.last_fragment.ensemble
            lacs = [(await (await bk.bookie(b)).read_lac(lid)).lac for b in ens]
            assert max(lacs) < last, (lacs, last)   # (the last entry above every bookie's LAC)
            victim = next(p for p in procs if p.bookie_id == ens[0])
            _rot_payload(victim, b"tail-039-")
            await _reported_and_mended(own, bk, lid, victim.bookie_id, last)
            now, _ = await bk.meta_call(bk.ledgers.read, lid)
            assert now.term == meta.term + 1, (meta.term, now.term)
            assert await check_every_replica(bk, lid, last, set(ens)) == 3 * (last + 1)
            return victim
        finally:
            await bk.close()

    victim = run(go())
    assert f"entry {last} of ledger {lid} rotted on disk (found by the scrub)" in victim.log_path.read_text()


def test_bookies_scrub_asks_a_pass_now_and_waits_for_it(own):
    """Bookies scrubbing at the default interval (their first pass an hour
    away); one byte of an entry flipped on one of them.  `bookstream
    bookies scrub ID` asks it for a pass: the pass begins at once, the
    command waits for it (its ask, a key in etcd, deleted at its revision)
    and says the rotted entry it found.  With --no-wait it returns at
    once, the bookie's Info naming the ask until a pass has served it.  A
    bookie that does not scrub is refused."""
    import json
    from tests.conftest import run
    from tests.test_autorecovery import until
    from tests.test_recovery_cli import cli, closed_ledger
    from stream.client import BookKeeperClient

    procs = list(own.start(3))
    lid, ens = closed_ledger(own, [b"ask-%03d-" % i + b"x" * 200 for i in range(40)], ack_quorum=3)
    quiet = own.start(1, ["--scrub-interval", "0"])[-1]   # (after the ledger: none of its bookies)
    victim = next(p for p in procs if p.bookie_id == ens[0])
    _rot_payload(victim, b"ask-017-")
    p = cli(own, "bookies", "scrub", victim.bookie_id, "--format", "json")
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout)
    assert rec["served"] and rec["rotted_entries_found"] == 1 and rec["scrub_last_end"], rec
    assert "scrub: a pass asked for" in victim.log_path.read_text()
    assert f"entry 17 of ledger {lid} rotted on disk (found by the scrub)" in victim.log_path.read_text()

    other = next(p for p in procs if p is not victim)
    p = cli(own, "bookies", "scrub", other.bookie_id, "--no-wait", "--format", "json")
    asked = json.loads(p.stdout)
    assert p.returncode == 0 and not asked["served"] and asked["request_revision"] > 0, p.stdout

    async def served():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            async def gone():
                return (await (await bk.bookie(other.bookie_id)).info()).scrub_requested == 0
            await until(gone, what="the ask served")
        finally:
            await bk.close()
    run(served())
    assert "scrub: a pass asked for" in other.log_path.read_text()

    p = cli(own, "bookies", "scrub", quiet.bookie_id)
    assert p.returncode != 0 and "does not scrub" in (p.stdout + p.stderr), (p.stdout, p.stderr)
