"""Autorecovery end to end: real etcd, real bookie processes (kill -9), the
auditor and the replication worker running in this process."""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid

import pytest


from stream.autorecovery.auditor_core import AuditorConfig
from stream.autorecovery.keys import AutorecoveryKeys, StoreLeases
from stream.autorecovery.service import Auditor, ReplicationWorker, WorkerConfig
from bookie import entry as E
from bookie.core import Status
from metadata.ledgers import LedgerState
from stream.client import BookKeeperClient
from stream.quorum import write_set
from stream.stream import AsyncStreamClient, Position, StreamConfig
from tests.conftest import run

TIMEOUT = 90.0


def sname() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def autorecovery(env, *, delay=1.0, grace=1.0, workers=1, check=None, rate=0.0, cfg=None):
    """An auditor (``cfg``, or its delay and check interval) and ``workers``
    replication workers, each with its own client, until the block ends."""
    stop = asyncio.Event()
    clients = [BookKeeperClient(env.endpoint, env.cluster, add_timeout=5.0) for _ in range(workers + 1)]
    keys = AutorecoveryKeys(clients[0].store, env.cluster)
    auditor = Auditor(clients[0], keys, StoreLeases(clients[0].store, ttl=3), cfg or AuditorConfig(delay, check),
                      poll=0.3)
    ws = [ReplicationWorker(c, AutorecoveryKeys(c.store, env.cluster), StoreLeases(c.store, ttl=3),
                            WorkerConfig(grace=grace, poll=0.3, retry=0.5, rate=rate), worker_id=f"w{i}")
          for i, c in enumerate(clients[1:])]
    tasks = [asyncio.ensure_future(auditor.run(stop))] + [asyncio.ensure_future(w.run(stop)) for w in ws]
    try:
        yield auditor, ws, keys
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()


async def mended(env, keys: AutorecoveryKeys, what: str) -> list:
    """Runs an auditor and a worker (the auditor's delay 60 s: no bookie is
    declared lost meanwhile) until no task is left; returns the workers."""
    async with autorecovery(env, delay=60.0, grace=1.0) as (_auditor, ws, _keys):
        async def clean():
            return not list(keys.tasks())
        await until(clean, what=what)
    return ws


async def until(pred, timeout=TIMEOUT, what=""):
    """Polls ``pred`` (an async predicate over etcd state) until true."""
    deadline = time.monotonic() + timeout
    while True:
        if await pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        await asyncio.sleep(0.2)


async def names_bookie(bk: BookKeeperClient, bookie: str) -> list[tuple[int, int]]:
    out = []
    for lid in await bk.list_ledgers():
        meta, _ = await bk.meta_call(bk.ledgers.read, lid)
        out += [(lid, f.first_entry) for f in meta.fragments if bookie in f.ensemble]
    return out


async def check_every_replica(bk: BookKeeperClient, lid: int, last: int, live: set[str]) -> int:
    """Every entry up to ``last`` reads back, checksum valid, from every
    bookie of its write set, all of them live.  Returns the entries checked."""
    meta, _ = await bk.meta_call(bk.ledgers.read, lid)
    n = 0
    for eid in range(0, last + 1):
        frag = meta.fragment_at(eid)
        assert set(frag.ensemble) <= live, (lid, frag)
        for i in write_set(eid, meta.ensemble_size, meta.write_quorum):
            bc = await bk.bookie(frag.ensemble[i])
            r = await bc.read_entry(lid, eid)
            assert r.status == Status.OK, (lid, eid, frag.ensemble[i], r.status)
            E.scan(r.entry)  # raises on a bad checksum
            n += 1
    return n


def test_kill_one_bookie_of_four_everything_back_at_full_replication(own):
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}
    name = sname()

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        closed = []
        for k in range(3):
            lh = await bk.create_ledger(3, 3, 2)
            for i in range(40):
                await lh.add_entry(b"L%d-%d" % (k, i))
            await lh.close()
            closed.append(lh.ledger_id)
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            w = await sc.open_writer(name, StreamConfig(3, 3, 2, fragment_size_entries=15))
            await w.append_many([b"s-%d" % i for i in range(70)])
            await w.close()  # no live writer: its last fragment is open
            info = await sc.stream_info(name)
        slid = info["ledger_id"]
        smeta, _ = await bk.meta_call(bk.ledgers.read, slid)
        assert smeta.fragment_count >= 4
        victim = smeta.last_fragment.ensemble[0]  # in the open fragment too
        assert await names_bookie(bk, victim)
        by_id[victim].kill()
        live = set(by_id) - {victim}

        async with autorecovery(own, delay=1.0, grace=1.0) as (auditor, ws, keys):
            async def clean():
                tasks = await asyncio.to_thread(lambda: list(keys.tasks()))
                return not tasks and not await names_bookie(bk, victim)
            await until(clean, what="every fragment off the killed bookie and no task left")
            assert sum(len(o.replaced) for o in ws[0].outcomes) >= 1
            assert any(o.sealed for o in ws[0].outcomes)  # the stream's open fragment was sealed

        for lid in closed:
            m, _ = await bk.meta_call(bk.ledgers.read, lid)
            assert m.state is LedgerState.CLOSED and m.last_entry == 39
            assert await check_every_replica(bk, lid, 39, live) == 40 * 3
        smeta, _ = await bk.meta_call(bk.ledgers.read, slid)
        # the stream's content up to the no-op the take-over wrote, on every replica
        assert await check_every_replica(bk, slid, 70, live) > 0
        # a new writer takes over and sees every acknowledged entry
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            w = await sc.open_writer(name)
            p = await w.append(b"after")
            r = await sc.open_reader(name, Position.EARLIEST)
            got = []
            while not got or got[-1].payload != b"after":
                got += await r.read(1000, timeout=5)
            assert [x.payload for x in got] == [b"s-%d" % i for i in range(70)] + [b"after"]
            assert got[-1].position == p
            await w.close()
        await bk.close()

    run(go())


def test_bookie_back_within_the_delay_copies_nothing(own):
    procs = own.start(4)

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        lh = await bk.create_ledger(3, 3, 2)
        for i in range(10):
            await lh.add_entry(b"x%d" % i)
        await lh.close()
        victim = next(p for p in procs if p.bookie_id in lh.metadata.fragments[0].ensemble)
        async with autorecovery(own, delay=20.0, grace=1.0) as (auditor, ws, keys):
            await until(lambda: _true(auditor.core is not None and auditor.core.registered), what="auditor up")
            victim.kill()
            await until(lambda: _true(victim.bookie_id in auditor.core.missing), what="registration gone")
            victim.restart()
            await until(lambda: _true(auditor.core.cancelled == 1), what="bookie back")
            assert not auditor.core.missing and not auditor.core.lost and auditor.core.next_deadline() is None
            assert not list(keys.tasks()) and not ws[0].outcomes
        m, _ = await bk.meta_call(bk.ledgers.read, lh.ledger_id)
        assert m.fragments == lh.metadata.fragments  # nothing replaced
        await bk.close()

    run(go())


async def _true(v) -> bool:
    return bool(v)


async def closed(bk: BookKeeperClient, e: int, qw: int, qa: int, payloads: list[bytes]):
    """A classic ledger with ``payloads``, closed: its handle."""
    lh = await bk.create_ledger(e, qw, qa)
    for p in payloads:
        await lh.add_entry(p)
    await lh.close()
    return lh


@contextlib.contextmanager
def an_older_and_a_later_hold(bk: BookKeeperClient, cluster: str, lid: int):
    """Two holds of ledger ``lid``'s lock: w1's, gone (its lease expired
    while it was paused), then w2's, held.  Yields their fencing tokens."""
    keys = AutorecoveryKeys(bk.store, cluster)
    first, later = bk.store.lease(10), bk.store.lease(10)
    try:
        t1 = keys.try_lock(lid, "w1", first.id)
        keys.unlock(lid, "w1")
        t2 = keys.try_lock(lid, "w2", later.id)
        assert t1 is not None and t2 is not None and t2 > t1
        yield t1, t2
    finally:
        first.revoke()
        later.revoke()


async def reported_task(keys: AutorecoveryKeys, lid: int):
    """Waits until ledger ``lid``'s task reports a fragment unrecoverable; the task."""
    async def reported():
        t = await asyncio.to_thread(keys.get_task, lid)
        return t is not None and t.unrecoverable
    await until(reported, what="the task marked unrecoverable")
    return keys.get_task(lid)


def test_a_lost_bookie_that_held_the_only_copy_is_reported_not_recovered(own):
    procs = own.start(3)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        lh = await closed(bk, 1, 1, 1, [b"only-%d" % i for i in range(5)])
        (victim,) = lh.metadata.fragments[0].ensemble
        by_id[victim].kill()
        async with autorecovery(own, delay=0.5, grace=0.5) as (auditor, ws, keys):
            t = await reported_task(keys, lh.ledger_id)
            assert t.unrecoverable[0]["first"] == 0 and victim in t.unrecoverable[0]["lost"]
            assert not any(o.replaced for o in ws[0].outcomes)
        m, _ = await bk.meta_call(bk.ledgers.read, lh.ledger_id)
        assert m.fragments[0].ensemble == (victim,)  # still names it: nothing made up
        await bk.close()

    run(go())


def test_a_fragment_reported_unrecoverable_is_recovered_once_a_killed_replica_is_back(own):
    """Both replicas of a Qw 2 write set go at once: one only killed, the
    other lost for good (its disk gone).  No surviving replica holds the
    fragment: reported.  Once the killed one is back with its copy, the
    fragment is recoverable again, and is recovered from it."""
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        lh = await closed(bk, 2, 2, 2, [b"pair-%d" % i for i in range(25)])
        killed, lost = (by_id[b] for b in lh.metadata.fragments[0].ensemble)
        killed.kill()
        lost.kill()
        shutil.rmtree(lost.data_dir)  # never back
        async with autorecovery(own, delay=0.5, grace=0.5) as (auditor, ws, keys):
            t = await reported_task(keys, lh.ledger_id)
            assert set(t.unrecoverable[0]["lost"]) == {killed.bookie_id, lost.bookie_id}
            assert not any(o.replaced for o in ws[0].outcomes)
            killed.restart()

            async def clean():
                return not list(keys.tasks()) and not await names_bookie(bk, lost.bookie_id)
            await until(clean, what="the fragment recovered from the bookie back")
            assert sum(len(o.replaced) for o in ws[0].outcomes) == 1
        m, _ = await bk.meta_call(bk.ledgers.read, lh.ledger_id)
        assert killed.bookie_id in m.fragments[0].ensemble
        assert await check_every_replica(bk, lh.ledger_id, 24, set(by_id) - {lost.bookie_id}) == 50
        await bk.close()

    run(go())


def test_periodic_check_finds_a_wiped_bookie(own):
    """A bookie whose disk was wiped comes back under the same id, its
    cookie released by force (``bookstream bookies cookie delete --force``:
    without it the bookie refuses to start, tests/test_cookie.py): its
    registration never went away for long, so only the periodic check
    (ReadLac's last entry per ledger) finds that it lacks its entries."""
    from bookie.cookie import release

    procs = own.start(4)

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        lh = await bk.create_ledger(3, 3, 2)
        for i in range(30):
            await lh.add_entry(b"w%d" % i)
        await lh.close()
        victim = next(p for p in procs if p.bookie_id in lh.metadata.fragments[0].ensemble)
        victim.kill()
        for f in victim.data_dir.iterdir():
            if f.name != "bookie.id":  # the same id, nothing else
                shutil.rmtree(f) if f.is_dir() else f.unlink()
        release(bk.store, own.cluster, victim.bookie_id)
        victim.restart()
        async with autorecovery(own, delay=60.0, grace=1.0, check=1.0) as (auditor, ws, keys):
            async def clean():
                return not await names_bookie(bk, victim.bookie_id) and not list(keys.tasks())
            await until(clean, what="the wiped bookie replaced")
        assert await check_every_replica(bk, lh.ledger_id, 29, {p.bookie_id for p in procs}) == 90
        await bk.close()

    run(go())


def test_the_full_check_finds_entries_missing_mid_fragment_and_workers_mend_them(own):
    """A bookie lacking entries in the middle of a sealed fragment (a write
    that failed on it after Qa others acked) still answers ReadLac with
    the fragment's last entry: the cheap check passes it.  The full check
    (every entry from every replica) names it as damaged at those ids, and
    the workers copy them back onto it (the ledger still names it; the
    spare takes nothing)."""
    from stream.autorecovery.service import run_check
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(4)
    lid, ens = closed_ledger(own, [b"m%d" % i for i in range(40)], ack_quorum=3)
    hurt = ens[1]

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        assert (await (await bk.bookie(hurt)).delete(lid, (10, 14))).status == Status.OK
        keys = AutorecoveryKeys(bk.store, own.cluster)
        assert await run_check(bk, keys) == 0 and not list(keys.tasks())   # ReadLac: 39, as expected
        assert await run_check(bk, keys, full=True, percent=0) == 0         # the ends only: held
        assert await run_check(bk, keys, full=True) == 1
        (task,) = keys.tasks()
        assert task.ledger_id == lid and hurt in task.lost and task.damaged_ids == {hurt: ((10, 14),)}, task
        await mended(own, keys, "the missing entries copied back")
        assert await names_bookie(bk, hurt)
        assert await check_every_replica(bk, lid, 39, set(ens)) == 120
        assert await run_check(bk, keys, full=True) == 0
        await bk.close()

    run(go())


def _missing_in_the_middle(own) -> tuple[int, tuple[str, ...]]:
    """Three bookies, a closed E3 Qw3 ledger of 400 entries whose second
    bookie lacks id 200: (ledger id, ensemble)."""
    from tests.test_recovery_cli import closed_ledger

    own.start(3)
    lid, ens = closed_ledger(own, [b"p%d" % i for i in range(400)], ack_quorum=3)

    async def cut():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            assert (await (await bk.bookie(ens[1])).delete(lid, (200, 200))).status == Status.OK
        finally:
            await bk.close()

    run(cut())
    return lid, ens


def test_a_sampled_periodic_check_reads_every_id_within_its_turn_of_passes(own):
    """``--full-check-percentage 20``: each pass reads the ends of a
    fragment and the next fifth of its windows of 64 ids (the pass number
    kept in etcd, ``check_pass``), so an id missing in the middle is
    found within five passes, by the pass whose windows hold it (here the
    second: 400 ids are 7 windows, two a pass, id 200 in the fourth).
    Drawn at random, a pass finds it one time in seven."""
    from stream.autorecovery.service import run_check

    lid, ens = _missing_in_the_middle(own)

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        keys = AutorecoveryKeys(bk.store, own.cluster)
        found = []
        for _ in range(4):
            pass_no = await asyncio.to_thread(keys.check_pass)
            found.append((pass_no, await run_check(bk, keys, full=True, percent=20, pass_no=pass_no)))
            await asyncio.to_thread(keys.check_pass_done, pass_no)
        assert found == [(0, 0), (1, 1), (2, 0), (3, 0)], found
        (task,) = keys.tasks()
        assert task.damaged_ids == {ens[1]: ((200, 200),)}, task
        await bk.close()

    run(go())


def test_an_auditors_sampled_passes_go_round_the_fragment(own):
    """The same ledger and missing id, found by an auditor running the
    sampled check every 0.2 s: each pass it completes is recorded in etcd,
    so the next reads the next windows, and the id is published by the
    pass whose windows hold it.  (An auditor that took a pass number but
    never recorded its passes would read pass 0's windows every time.)"""
    lid, ens = _missing_in_the_middle(own)

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        keys = AutorecoveryKeys(bk.store, own.cluster)
        cfg = AuditorConfig(60.0, 0.2, full_check=True, full_check_percent=20)
        async with autorecovery(own, workers=0, cfg=cfg):
            async def published():
                return bool(await asyncio.to_thread(lambda: list(keys.tasks())))
            await until(published, what="the sampled check's task")
        (task,) = keys.tasks()
        assert task.damaged_ids == {ens[1]: ((200, 200),)}, task
        assert keys.check_pass() >= 2       # pass 1 found it, and was recorded
        await bk.close()

    run(go())


def test_ids_filled_while_the_task_waits_are_taken_off_it_and_not_copied_again(own):
    """A live writer's stream; one of its bookies named damaged at an id it
    lacks below the LAC and at one the writer has not written yet (above
    the LAC: the task waits for it).  The worker's first round fills the
    first and takes it off the task; its next rounds, still waiting, copy
    nothing.  (Before: every round, every half second while the task
    waited, copied all its filled ids again.)"""
    own.start(3)

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            w = await sc.open_writer("mend", StreamConfig(3, 3, 3))
            for i in range(30):
                await w.append(b"m%d" % i)
            bk = sc.bk
            lid = await sc._ledger_of("mend")
            meta, _ = await bk.meta_call(bk.ledgers.read, lid)
            hurt = meta.last_fragment.ensemble[1]
            assert (await (await bk.bookie(hurt)).delete(lid, (5, 5))).status == Status.OK
            keys = AutorecoveryKeys(bk.store, own.cluster)
            keys.publish(lid, {hurt}, True, {hurt: [(5, 5), (500, 500)]})
            client = BookKeeperClient(own.endpoint, own.cluster)
            worker = ReplicationWorker(client, AutorecoveryKeys(client.store, own.cluster),
                                       StoreLeases(client.store, ttl=3), WorkerConfig(grace=1.0), worker_id="w0")
            try:
                for _ in range(3):
                    worker.not_before.clear()
                    assert await worker.round() == 1
                (task,) = keys.tasks()
                assert task.damaged_ids == {hurt: ((500, 500),)} and task.damaged == {hurt}, task
                assert [o.entries for o in worker.outcomes] == [1, 0, 0], worker.outcomes
                assert [o.filled for o in worker.outcomes] == [[(5, 5, hurt)], [], []], worker.outcomes
                assert all(o.step.value == "wait" for o in worker.outcomes), worker.outcomes
            finally:
                await client.close()
            r = await (await bk.bookie(hurt)).read_entry(lid, 5)
            assert r.status == Status.OK
            await w.close()

    run(go())


def test_the_cheap_check_names_a_missing_tails_ids_and_workers_fill_them_in_place(own):
    """A bookie lacking the last entries of a sealed fragment (writes that
    failed on it after Qa others acked, the fragment then closed) answers
    ReadLac with the last it holds: the cheap check knows which ids it
    lacks, publishes them, and the workers copy those back onto it.  (Before:
    it was named damaged without ids and its whole share moved to the spare,
    40 entries for 10.)"""
    from stream.autorecovery.service import run_check
    from tests.test_recovery_cli import closed_ledger

    own.start(4)
    lid, ens = closed_ledger(own, [b"t%d" % i for i in range(40)], ack_quorum=3)
    hurt = ens[2]

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        assert (await (await bk.bookie(hurt)).delete(lid, (30, 39))).status == Status.OK
        keys = AutorecoveryKeys(bk.store, own.cluster)
        assert await run_check(bk, keys) == 1
        (task,) = keys.tasks()
        assert task.damaged == {hurt} and task.damaged_ids == {hurt: ((30, 39),)}, task
        ws = await mended(own, keys, "the missing tail copied back")
        assert not any(o.replaced for o in ws[0].outcomes), ws[0].outcomes
        assert sum(o.entries for o in ws[0].outcomes) == 10, ws[0].outcomes
        assert await names_bookie(bk, hurt)
        assert await check_every_replica(bk, lid, 39, set(ens)) == 120
        assert await run_check(bk, keys) == 0
        await bk.close()

    run(go())


def test_damaged_bookies_with_no_spare_bookie_are_filled_in_place(own):
    """Every bookie of the cluster is in the ledger's ensemble, and each
    lacks different entries (writes that failed on it after Qa others
    acked; ids 30-31 are left on the first bookie alone).  The full check
    names all three damaged; there is no bookie to replace one with, so
    each takes its position's copy itself (no clearing), read from the
    others and, last, from itself: all hold every entry again, the
    metadata unchanged.  (Before: a write set of damaged bookies was
    reported unrecoverable; with a healthy one left, no target, the task
    waited for ever.)"""
    from stream.autorecovery.service import recover_ledger_fragments, run_check
    from stream.autorecovery.worker_core import Step
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(3)
    lid, ens = closed_ledger(own, [b"f%d" % i for i in range(40)], ack_quorum=3)
    live = {p.bookie_id for p in procs}

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            assert (await (await bk.bookie(ens[0])).delete(lid, (5, 9))).status == Status.OK
            assert (await (await bk.bookie(ens[1])).delete(lid, (20, 24))).status == Status.OK
            for b in ens[1:]:
                assert (await (await bk.bookie(b)).delete(lid, (30, 31))).status == Status.OK
            keys = AutorecoveryKeys(bk.store, own.cluster)
            assert await run_check(bk, keys, full=True) == 1
            (task,) = keys.tasks()
            assert task.damaged == set(ens), task
            before, _ = await bk.meta_call(bk.ledgers.read, lid)
            out = await recover_ledger_fragments(bk, lid, set(), damaged=task.damaged)
            assert out.step is Step.DONE and not out.replaced and not out.unrecoverable, out
            assert sorted(out.filled) == sorted((0, 39, b) for b in ens) and out.entries == 120
            after, _ = await bk.meta_call(bk.ledgers.read, lid)
            assert after.fragments == before.fragments
            assert await check_every_replica(bk, lid, 39, live) == 120
            keys.delete_task(task)
            assert await run_check(bk, keys, full=True) == 0
        finally:
            await bk.close()

    run(go())


def test_a_copy_whose_lock_is_gone_does_not_clear_its_target(own):
    """A worker paused past its lock's lease wakes up about to clear its
    target's range, while another worker has copied the fragment to that
    same target and published it: the lock, read again just before the
    clearing, stops it (without that read, the target's published entries
    go, here for good: this copy's sources do not answer)."""
    import dataclasses

    from stream.autorecovery.copier import CopyFailed, copy_fragment
    from stream.autorecovery.worker_core import plan_ledger
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(4)
    lid, ens = closed_ledger(own, [b"c%d" % i for i in range(30)])
    target = next(p.bookie_id for p in procs if p.bookie_id not in ens)

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        meta, _ = await bk.meta_call(bk.ledgers.read, lid)
        (job,) = plan_ledger(meta, {ens[0]}).jobs
        assert (await copy_fragment(bk, job, target)).entries == 30   # (the other worker's copy)
        with pytest.raises(CopyFailed, match="lock was lost"):
            await copy_fragment(bk, dataclasses.replace(job, sources=()), target, keep_going=lambda: False)
        tc = await bk.bookie(target)
        assert [(await tc.read_entry(lid, e)).status for e in range(30)] == [Status.OK] * 30
        await bk.close()

    run(go())


def test_a_copy_under_an_older_lock_is_fenced_by_its_target(own):
    """The window the read above leaves: a worker paused between that read
    and its clearing.  The clearing carries the lock's fencing token (the
    lock key's create revision); a target that has seen a later holder's
    refuses it (FENCED), after a kill -9 and restart too, and keeps what
    the later copy published.  The later holder's next copy, same token,
    goes through."""
    import dataclasses

    from stream.autorecovery.copier import CopyFailed, copy_fragment
    from stream.autorecovery.worker_core import plan_ledger
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(4)
    lid, ens = closed_ledger(own, [b"t%d" % i for i in range(30)])
    target = next(p for p in procs if p.bookie_id not in ens)

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            with an_older_and_a_later_hold(bk, own.cluster, lid) as (t1, t2):
                meta, _ = await bk.meta_call(bk.ledgers.read, lid)
                (job,) = plan_ledger(meta, {ens[0]}).jobs
                assert (await copy_fragment(bk, job, target.bookie_id, copy_token=t2)).entries == 30
                target.kill()
                target.restart()
                bk2 = BookKeeperClient(own.endpoint, own.cluster)  # (connections to the bookie restarted)
                with pytest.raises(CopyFailed, match="later copy"):
                    await copy_fragment(bk2, dataclasses.replace(job, sources=()), target.bookie_id,
                                        keep_going=lambda: True, copy_token=t1)
                tc = await bk2.bookie(target.bookie_id)
                assert [(await tc.read_entry(lid, e)).status for e in range(30)] == [Status.OK] * 30
                assert (await copy_fragment(bk2, job, target.bookie_id, copy_token=t2)).entries == 30
                await bk2.close()
        finally:
            await bk.close()

    run(go())


def test_a_replacement_under_a_lock_since_taken_is_not_published(own):
    """A worker paused between its copy and its replacement's CAS, past its
    lock: another holder may have cleared the same target and be filling
    it.  The replacement's transaction is guarded by the lock's create
    revision: refused (the step says so), the metadata unchanged; under the
    lock still held, the same replacement goes through."""
    from stream.autorecovery.service import recover_ledger_fragments
    from stream.autorecovery.worker_core import Step
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(4)
    lid, ens = closed_ledger(own, [b"g%d" % i for i in range(20)])
    lost = ens[0]
    by_id = {p.bookie_id: p for p in procs}
    by_id[lost].kill()

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            with an_older_and_a_later_hold(bk, own.cluster, lid) as (t1, t2):
                before, _ = await bk.meta_call(bk.ledgers.read, lid)
                out = await recover_ledger_fragments(bk, lid, {lost}, keep_going=lambda: True, copy_token=t1)
                assert out.step is Step.WAIT and "lock lost before the replacement" in out.note and not out.replaced
                after, _ = await bk.meta_call(bk.ledgers.read, lid)
                assert after.fragments == before.fragments
                out = await recover_ledger_fragments(bk, lid, {lost}, copy_token=t2)
                assert out.step is Step.DONE and len(out.replaced) == 1
        finally:
            await bk.close()

    run(go())


def test_a_worker_with_a_rate_limit_says_how_long_the_limit_held_its_copy(own):
    """A worker limited to 2 MiB/s copies 8 MiB: its outcome, and the
    worker's metrics (`bookstream_autorecovery_paced_seconds_total`, the
    `rate_limit_bytes` gauge), say the limit held the copy no less than the
    rate implies less the burst and a frame; every replica reads back."""
    import os

    from prometheus_client import REGISTRY

    from tests.test_recovery_cli import closed_ledger_first_bookie_killed

    procs = own.start(4)
    lid, _, victim = closed_ledger_first_bookie_killed(own, procs, [os.urandom(64 << 10)] * 128)
    paced0 = REGISTRY.get_sample_value("bookstream_autorecovery_paced_seconds_total") or 0.0

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        keys = AutorecoveryKeys(bk.store, own.cluster)
        async with autorecovery(own, delay=0.3, grace=0.3, rate=2 << 20) as (_auditor, ws, _keys):
            assert REGISTRY.get_sample_value("bookstream_autorecovery_rate_limit_bytes") == 2 << 20

            async def clean():
                return keys.get_task(lid) is None and not await names_bookie(bk, victim.bookie_id)
            await until(clean, what="the ledger off the killed bookie")
        (out,) = [o for o in ws[0].outcomes if o.replaced]
        assert out.bytes > 8 << 20 and out.paced_seconds >= (out.bytes - (2 << 20)) / (2 << 20) - 1.0, out
        paced = REGISTRY.get_sample_value("bookstream_autorecovery_paced_seconds_total") - paced0
        assert paced == pytest.approx(sum(o.paced_seconds for o in ws[0].outcomes))
        assert await check_every_replica(bk, lid, 127, {p.bookie_id for p in procs} - {victim.bookie_id}) == 128 * 3
        await bk.close()

    run(go())


def test_a_copy_takes_each_id_only_from_a_bookie_of_its_write_set(own):
    """A bookie may hold records at ids outside its write sets: a leftover
    of an earlier term's fragment that a later one replaced from the same
    first entry (in fault run 9921, a term-6 recovery's truncate no-op at
    an id whose entry term 7 recovered, the next fragment giving that id to
    two other bookies). Here: an E3 Qw2 ledger whose first bookie holds
    such no-ops at every id of the write sets it is not in. Its second
    bookie is lost; the copy of its position must take each id from the
    third (the one other replica), never the first's leftover: every
    replica then holds the entry, the same record as the other. (Copied
    from the first source, the new replica held no-ops: shown.)"""
    from stream.autorecovery.service import recover_ledger_fragments
    from stream.autorecovery.worker_core import Step

    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}
    payloads = [b"w%d" % i for i in range(30)]

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        try:
            lh = await bk.create_ledger(3, 2, 2)
            await lh.add_entries(payloads)
            await lh.close()
            lid, ens = lh.ledger_id, lh.metadata.fragments[0].ensemble
            others = [e for e in range(30) if 0 not in write_set(e, 3, 2)]
            c0 = await bk.bookie(ens[0])
            ack = await c0.add(b"".join(E.encode(lid, e, b"", data_flags=E.FLAG_NOOP) for e in others))
            assert ack.status == Status.OK
            by_id[ens[1]].kill()
            out = await recover_ledger_fragments(bk, lid, {ens[1]})
            assert out.step is Step.DONE and len(out.replaced) == 1
            meta, _ = await bk.meta_call(bk.ledgers.read, lid)
            for e in range(30):
                got = []
                for i in write_set(e, 3, 2):
                    r = await (await bk.bookie(meta.fragments[0].ensemble[i])).read_entry(lid, e)
                    assert r.status == Status.OK, (e, i)
                    got.append(E.scan(r.entry)[0])
                assert [h.is_noop for h in got] == [False, False] and got[0].checksum == got[1].checksum, e
            rh = await bk.open_ledger(lid)
            assert [x.payload for x in await rh.read_entries(0, 29)] == payloads
        finally:
            await bk.close()

    run(go())
