"""Classic ledgers end to end: real bookie processes, real etcd.

Tests that do not hurt bookies share one module-wide cluster of 4 bookies;
tests that kill or stop bookies start their own.  Nothing waits by sleeping:
every wait is on an event (an ack, a future, a process exit) with a deadline.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from metadata.ledgers import LedgerState
from stream import errors as se
from stream import mutations
from stream.client import BookKeeperClient, SyncBookKeeperClient
from stream.quorum import write_set
from tests.conftest import run


def client(env, **kw) -> BookKeeperClient:
    return BookKeeperClient(env.endpoint, env.cluster, **kw)


def payload(i: int) -> bytes:
    return f"entry-{i:06d}".encode() + bytes(i % 50)


def test_create_add_close_read_round_trip(shared):
    async def go():
        async with client(shared) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            ids = [await lh.add_entry(payload(i)) for i in range(5)]
            futs = [lh.add_entry_async(payload(i)) for i in range(5, 300)]
            ids += list(await asyncio.gather(*futs))
            assert ids == list(range(300))
            assert lh.last_add_confirmed == 299
            mine = await lh.read_entries(0, 299)
            assert [e.payload for e in mine] == [payload(i) for i in range(300)]
            await lh.close()
            meta = await bk.ledger_metadata(lh.ledger_id)
            assert meta.state is LedgerState.CLOSED and meta.last_entry == 299
            with pytest.raises(se.LedgerClosed):
                await lh.add_entry(b"late")
            for recovery in (False, True):
                rh = await bk.open_ledger(lh.ledger_id, recovery=recovery)
                assert rh.last_add_confirmed == 299
                got = await rh.read_entries(0, 299)
                assert [(e.entry_id, e.payload) for e in got] == [(i, payload(i)) for i in range(300)]
                with pytest.raises(se.ReadBeyondLac):
                    await rh.read_entries(299, 300)
            assert lh.ledger_id in await bk.list_ledgers()
    run(go())


def test_closing_the_client_under_an_open_writer_replaces_no_bookie(shared, caplog):
    """The client closes with a writer handle still open and adds in flight:
    they are acknowledged first, no bookie is taken for failed (no ensemble
    change, nothing logged above INFO), later adds raise ClientClosed, and
    the ledger is left OPEN: a new client's recovery closes it at the last
    entry, with every entry readable."""
    caplog.set_level(logging.INFO)

    async def go():
        bk = client(shared)
        lh = await bk.create_ledger(3, 3, 2)
        futs = [lh.add_entry_async(payload(i)) for i in range(300)]
        await bk.close()
        assert await asyncio.wait_for(asyncio.gather(*futs), 30) == list(range(300))
        with pytest.raises(se.ClientClosed):
            await lh.add_entry(b"late")
        async with client(shared) as bk2:
            assert (await bk2.ledger_metadata(lh.ledger_id)).state is LedgerState.OPEN
            rh = await bk2.open_ledger(lh.ledger_id)  # recovery closes it
            assert rh.last_add_confirmed == 299
            got = await rh.read_entries(0, 299)
            assert [e.payload for e in got] == [payload(i) for i in range(300)]
    run(go())
    writer_logs = [r for r in caplog.records if r.name == "stream.ledger"
                   and ("failed" in r.getMessage() or "fragment" in r.getMessage())]
    assert writer_logs == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_adds_are_pipelined_into_one_frame_per_bookie_per_turn(shared):
    async def go():
        async with client(shared) as bk:
            lh = await bk.create_ledger(3, 3, 3)
            futs = [lh.add_entry_async(payload(i)) for i in range(1000)]
            assert await asyncio.gather(*futs) == list(range(1000))
            # all 1000 adds were queued in one turn: one frame per bookie
            assert lh._writer.frames_sent == 3
            await lh.close()
    run(go())


def test_striping_e3_qw2_qa2_puts_each_entry_on_its_write_set(shared):
    from bookie.core import Status
    from stream.bookie_client import BookieClient

    async def go():
        async with client(shared) as bk:
            lh = await bk.create_ledger(3, 2, 2)
            n = 30
            await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(n)))
            await lh.close()
            ens = lh.metadata.fragments[0].ensemble
            addr = {b.bookie_id: b.address for b in shared.bookies}
            for idx, bid in enumerate(ens):
                c = BookieClient(addr[bid])
                held = set()
                for i in range(n):
                    r = await c.read_entry(lh.ledger_id, i)
                    if r.status == Status.OK:
                        held.add(i)
                await c.close()
                assert held == {i for i in range(n) if idx in write_set(i, 3, 2)}, (idx, bid)
            rh = await bk.open_ledger(lh.ledger_id, recovery=False)
            assert [e.payload for e in await rh.read_entries(0, n - 1)] == [payload(i) for i in range(n)]
    run(go())


@pytest.mark.parametrize("e,qw,qa", [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0), (3, "2", 1)])
def test_bad_configs_are_refused_with_a_typed_error(shared, e, qw, qa):
    async def go():
        async with client(shared) as bk:
            before = await bk.list_ledgers()
            with pytest.raises(se.InvalidLedgerConfig):
                await bk.create_ledger(e, qw, qa)
            assert await bk.list_ledgers() == before
    run(go())


def test_too_few_bookies_is_refused(shared):
    async def go():
        async with client(shared) as bk:
            before = await bk.list_ledgers()
            with pytest.raises(se.NotEnoughBookies) as ei:
                await bk.create_ledger(5, 3, 2)
            assert ei.value.retriable and ei.value.needed == 5 and ei.value.available == 4
            assert await bk.list_ledgers() == before
            with pytest.raises(se.NoSuchLedger):
                await bk.open_ledger(123456789)
    run(go())


def test_least_loaded_placement_and_delete(shared):
    async def go():
        async with client(shared) as bk:
            regs = await bk.choose_bookies(4)
            lh = await bk.create_ledger(2, 2, 2, placement="least_loaded")
            reg = {r.bookie_id: r.free_bytes for r in bk.registry.list_bookies()}
            top = sorted(reg.values(), reverse=True)[:2]
            assert sorted((reg[b] for b in lh.metadata.fragments[0].ensemble), reverse=True) == top
            assert len(regs) == 4
            await lh.add_entry(b"x")
            await lh.close()
            await bk.delete_ledger(lh.ledger_id)
            assert lh.ledger_id not in await bk.list_ledgers()
            with pytest.raises(se.NoSuchLedger):
                await bk.open_ledger(lh.ledger_id, recovery=False)
            with pytest.raises(se.NoSuchLedger):
                await bk.delete_ledger(lh.ledger_id)
    run(go())


def test_sync_facade_and_context_managers(shared):
    with SyncBookKeeperClient(shared.endpoint, shared.cluster) as bk:
        with bk.create_ledger(3, 2, 2) as lh:
            assert lh.add_entry(b"a") == 0
            futs = [lh.add_entry_async(payload(i)) for i in range(1, 100)]
            assert [f.result(30) for f in futs] == list(range(1, 100))
        assert lh.is_closed and lh.last_add_confirmed == 99
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        got = rh.read_entries(0, 99)
        assert [e.payload for e in got[1:]] == [payload(i) for i in range(1, 100)]
        assert [e.entry_id for e in rh.tail(90)] == list(range(90, 100))
        assert lh.ledger_id in bk.list_ledgers()

    async def go():
        async with client(shared) as abk:
            async with await abk.create_ledger(2, 2, 1) as alh:
                await alh.add_entry(b"z")
            assert (await abk.ledger_metadata(alh.ledger_id)).last_entry == 0
    run(go())


def test_kill_9_of_a_bookie_during_writes_changes_the_ensemble(own):
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        async with client(own, add_timeout=5.0) as bk:
            lh = await bk.create_ledger(3, 2, 2)
            first = [lh.add_entry_async(payload(i)) for i in range(600)]
            await asyncio.gather(*first[:300])
            victim = lh.metadata.fragments[0].ensemble[1]
            by_id[victim].kill()
            rest = [lh.add_entry_async(payload(i)) for i in range(600, 1200)]
            acked = await asyncio.gather(*first, *rest)
            assert acked == list(range(1200))
            meta = lh.metadata
            assert len(meta.fragments) == 2 and victim not in meta.fragments[1].ensemble
            assert meta.fragments[1].first_entry > 299
            await lh.close()
        async with client(own) as bk2:
            for recovery in (False, True):
                rh = await bk2.open_ledger(lh.ledger_id, recovery=recovery)
                assert rh.last_add_confirmed == 1199
                got = await rh.read_entries(0, 1199)
                assert [e.payload for e in got] == [payload(i) for i in range(1200)]
    run(go())


WRITER_SCRIPT = r"""
import asyncio, sys
from stream.client import BookKeeperClient

async def main():
    async with BookKeeperClient(sys.argv[1], sys.argv[2]) as bk:
        lh = await bk.create_ledger(3, 2, 2)
        print("LEDGER", lh.ledger_id, flush=True)
        def acked(f):
            if not f.cancelled() and f.exception() is None:
                print("ACK", f.result(), flush=True)
        i = 0
        while True:
            futs = []
            for _ in range(50):
                f = lh.add_entry_async(b"w%d" % i)
                f.add_done_callback(acked)
                futs.append(f)
                i += 1
            await asyncio.gather(*futs)

asyncio.run(main())
"""


def test_writer_killed_then_recovery_keeps_every_acked_entry(own):
    import subprocess
    import sys

    own.start(3)
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, own.endpoint, own.cluster],
                            stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    acked = []
    try:
        lid = None
        for line in proc.stdout:
            kind, value = line.split()
            if kind == "LEDGER":
                lid = int(value)
            else:
                acked.append(int(value))
                if len(acked) >= 400:
                    break
        proc.kill()  # kill -9, mid-stream: adds in flight
        proc.wait()
        acked += [int(line.split()[1]) for line in proc.stdout.read().splitlines() if line.startswith("ACK")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert lid is not None and acked == list(range(len(acked)))

    async def go():
        async with client(own) as bk:
            rh = await bk.open_ledger(lid, recovery=True)
            meta = rh.metadata
            assert meta.state is LedgerState.CLOSED and meta.last_entry >= acked[-1]
            got = await rh.read_entries(0, meta.last_entry)
            assert [e.payload for e in got] == [b"w%d" % i for i in range(meta.last_entry + 1)]
            again = await bk.open_ledger(lid, recovery=True)  # already closed: same answer
            assert again.metadata.last_entry == meta.last_entry
    run(go())


def test_recovery_fences_the_live_writer_and_recoverers_converge(shared):
    async def go():
        async with client(shared) as a, client(shared) as b, client(shared) as c:
            lh = await a.create_ledger(3, 2, 2)
            acked: list[int] = []
            failures: list[BaseException] = []
            enough = asyncio.Event()

            async def write():
                i = 0
                while True:
                    futs = [lh.add_entry_async(payload(i + k)) for k in range(20)]
                    i += 20
                    for r in await asyncio.gather(*futs, return_exceptions=True):
                        if isinstance(r, BaseException):
                            failures.append(r)
                        else:
                            assert not failures  # acks are in order: none after a failure
                            acked.append(r)
                    if failures:
                        return
                    if len(acked) >= 300:
                        enough.set()

            writer = asyncio.create_task(write())
            await enough.wait()
            # two recoverers at once, while the writer keeps adding
            rb, rc = await asyncio.gather(b.open_ledger(lh.ledger_id), c.open_ledger(lh.ledger_id))
            await asyncio.wait_for(writer, 30)
            last = rb.metadata.last_entry
            assert rc.metadata.last_entry == last and rb.metadata.state is LedgerState.CLOSED
            assert acked == list(range(len(acked))) and last >= acked[-1]
            assert failures and isinstance(failures[0], se.LedgerFenced)
            with pytest.raises(se.LedgerFenced):
                await lh.add_entry(b"after recovery")
            if last != acked[-1]:
                with pytest.raises(se.CloseMismatch):
                    await lh.close()
            else:
                await lh.close()
            seqs = [await h.read_entries(0, last) for h in (rb, rc, await a.open_ledger(lh.ledger_id, False))]
            assert all([e.payload for e in s] == [payload(i) for i in range(last + 1)] for s in seqs)
    run(go())


def test_open_without_recovery_reads_up_to_lac_tails_and_never_fences(shared):
    async def go():
        async with client(shared) as a, client(shared) as b:
            lh = await a.create_ledger(3, 2, 2)
            await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(100)))
            await lh.add_entry(payload(100))
            rh = await b.open_ledger(lh.ledger_id, recovery=False)
            # The LAC piggybacks on later entries (entry 100 carried LAC 99 to
            # its write set, and every covering set holds one of them); once
            # adds go quiet the writer sends the last one explicitly, which
            # wakes a long poll.
            assert rh.last_add_confirmed >= 99
            assert await rh.long_poll_last_add_confirmed(99, timeout=10) == 100
            assert rh.metadata.state is LedgerState.OPEN  # no recovery, no fence
            with pytest.raises(se.ReadBeyondLac):
                await rh.read_entries(0, 101)
            got = await rh.read_entries(0, rh.last_add_confirmed)
            assert [e.payload for e in got] == [payload(i) for i in range(len(got))]

            tailed: list[int] = []
            seen_50 = asyncio.Event()

            async def follow():
                async for e in rh.tail(0, poll_timeout=0.5):
                    assert e.payload == payload(e.entry_id)
                    tailed.append(e.entry_id)
                    if e.entry_id >= 150:
                        seen_50.set()

            follower = asyncio.create_task(follow())
            # the writer is not fenced by the reader: it keeps adding
            for i in range(101, 401, 50):
                await asyncio.gather(*(lh.add_entry_async(payload(k)) for k in range(i, i + 50)))
            await asyncio.wait_for(seen_50.wait(), 10)  # the tail follows a live ledger
            await lh.close()
            await asyncio.wait_for(follower, 10)  # ... and ends at the close
            assert tailed == list(range(401))
            assert await rh.read_last_add_confirmed() == 400
    run(go())


def test_a_stopped_bookie_does_not_stall_the_writer_while_qa_is_met(own):
    procs = own.start(3)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        async with client(own, add_timeout=60.0) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(100)))
            victim = by_id[lh.metadata.fragments[0].ensemble[0]]
            os.kill(victim.pid, signal.SIGSTOP)
            try:
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                for i in range(100, 1000, 100):
                    await asyncio.gather(*(lh.add_entry_async(payload(k)) for k in range(i, i + 100)))
                elapsed = loop.time() - t0
                assert elapsed < 10, elapsed  # far below add_timeout: Qa = 2 of 3 still answer
                assert len(lh.metadata.fragments) == 1  # no ensemble change was needed
                async with client(own) as reader:
                    rh = await reader.open_ledger(lh.ledger_id, recovery=False)
                    # entries 900.. carried LAC 899; the writer's explicit LAC
                    # (to the two live bookies) brings the reader to 999
                    if rh.last_add_confirmed < 999:
                        assert await rh.long_poll_last_add_confirmed(998, timeout=10) == 999
                    got = await rh.read_entries(0, rh.last_add_confirmed)
                    assert [e.payload for e in got] == [payload(i) for i in range(1000)]
            finally:
                os.kill(victim.pid, signal.SIGCONT)
            await lh.close()
            assert lh.metadata.last_entry == 999
    run(go())


@pytest.mark.parametrize("mutant", [None, mutations.CLOSE_DESPITE_RECOVERY])
def test_close_rules_against_the_metadata(shared, store, mutant):
    """CAS retried while OPEN; CLOSED at the same entry: success; at another:
    CloseMismatch; IN_RECOVERY: LedgerInRecovery.  The life-cycle mutant
    (stream/lifecycle.py's CloseAt closing over a recovery) breaks the last."""
    from metadata.ledgers import LedgerStore

    ledgers = LedgerStore(store, shared.cluster)

    def bump(lid, **changes):
        meta, rev = ledgers.read(lid)
        ledgers.update_header(meta.with_(**changes), rev)

    async def go():
        async with client(shared, mutations=mutations.Mutations.of(mutant)) as bk:
            handles = []
            for _ in range(4):
                lh = await bk.create_ledger(3, 2, 2)
                await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(10)))
                handles.append(lh)
            a, b, c, d = handles
            bump(a.ledger_id, custom={"x": "y"})  # a concurrent change that leaves it OPEN
            await a.close()
            assert (await bk.ledger_metadata(a.ledger_id)).last_entry == 9
            bump(b.ledger_id, state=LedgerState.CLOSED, last_entry=9)
            await b.close()
            bump(c.ledger_id, state=LedgerState.CLOSED, last_entry=5)
            with pytest.raises(se.CloseMismatch):
                await c.close()
            bump(d.ledger_id, state=LedgerState.IN_RECOVERY)
            if mutant:
                await d.close()  # closed under the recoverer's feet
                assert (await bk.ledger_metadata(d.ledger_id)).state is LedgerState.CLOSED
                return
            with pytest.raises(se.LedgerInRecovery):
                await d.close()
    run(go())


@pytest.mark.parametrize("mutant", [None, mutations.CHANGE_DESPITE_FENCE])
def test_ensemble_change_cas_lost_to_recovery_fails_the_outstanding_adds(own, store, mutant):
    """The life-cycle mutant (an ensemble change applied on a ledger in
    recovery) publishes the fragment and the adds go on."""
    from metadata.ledgers import LedgerStore

    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}
    ledgers = LedgerStore(store, own.cluster)

    async def go():
        async with client(own, mutations=mutations.Mutations.of(mutant)) as bk:
            lh = await bk.create_ledger(3, 3, 3)
            await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(10)))
            # a recoverer's first step (no fencing yet): the header moves on
            meta, rev = ledgers.read(lh.ledger_id)
            ledgers.update_header(meta.with_(state=LedgerState.IN_RECOVERY), rev)
            by_id[lh.metadata.fragments[0].ensemble[2]].kill()
            futs = [lh.add_entry_async(payload(i)) for i in range(10, 20)]
            res = await asyncio.gather(*futs, return_exceptions=True)
            if mutant:
                assert len(ledgers.read(lh.ledger_id)[0].fragments) == 2  # published over the recovery
                return
            assert all(isinstance(r, se.LedgerFenced) for r in res), res
            assert len(ledgers.read(lh.ledger_id)[0].fragments) == 1  # no fragment was added
            with pytest.raises(se.LedgerFenced):
                lh.add_entry_async(b"more")
    run(go())


@pytest.mark.parametrize("e,qw,qa,n,kills", [(3, 3, 3, 5, 2), (4, 3, 2, 5, 1)])
def test_no_acked_entry_lost_with_qa_minus_1_bookies_lost(own, e, qw, qa, n, kills):
    procs = own.start(n)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        async with client(own, add_timeout=5.0) as bk:
            lh = await bk.create_ledger(e, qw, qa)
            futs = [lh.add_entry_async(payload(i)) for i in range(400)]
            await asyncio.gather(*futs[:200])
            for victim in lh.metadata.fragments[0].ensemble[:kills]:  # Qa - 1 of a write quorum
                by_id[victim].kill()
            futs += [lh.add_entry_async(payload(i)) for i in range(400, 800)]
            assert await asyncio.gather(*futs) == list(range(800))
            # the writer is dropped without closing: recover from another client
        async with client(own) as r1, client(own) as r2:
            h1 = await r1.open_ledger(lh.ledger_id, recovery=True)
            assert h1.metadata.last_entry == 799
            h2 = await r2.open_ledger(lh.ledger_id, recovery=False)
            s1, s2 = await h1.read_entries(0, 799), await h2.read_entries(0, 799)
            assert [x.payload for x in s1] == [x.payload for x in s2] == [payload(i) for i in range(800)]
    run(go())


def test_a_bookie_that_stops_answering_is_replaced_after_the_add_timeout(own):
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        async with client(own, add_timeout=1.0) as bk:
            lh = await bk.create_ledger(3, 3, 3)  # Qa = Qw: every add needs the stopped bookie
            await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(50)))
            victim = lh.metadata.fragments[0].ensemble[1]
            os.kill(by_id[victim].pid, signal.SIGSTOP)
            futs = [lh.add_entry_async(payload(i)) for i in range(50, 150)]
            assert await asyncio.wait_for(asyncio.gather(*futs), 20) == list(range(50, 150))
            assert [f.first_entry for f in lh.metadata.fragments] == [0, 50]
            assert victim not in lh.metadata.fragments[1].ensemble
            await lh.close()
            got = await (await bk.open_ledger(lh.ledger_id, recovery=False)).read_entries(0, 149)
            assert [e.payload for e in got] == [payload(i) for i in range(150)]
    run(go())


def test_no_bookie_to_replace_a_dead_one_goes_on_at_qa(own, caplog):
    """E3 Qw3 Qa2 on three bookies: one killed, none to replace it.  The
    writer defers the change (issue 12's delayed ensemble change) and goes
    on in the one fragment, acknowledging at Qa on the two left; a classic
    ledger releases at the LAC, so it closes there (the copies the dead one
    lacks are autorecovery's to make), and every entry reads back from the
    two."""
    caplog.set_level(logging.WARNING, logger="stream.ledger")
    procs = own.start(3)
    by_id = {p.bookie_id: p for p in procs}

    class Deferred(logging.Handler):
        """Sets `seen` when the writer logs the deferral: the two live
        bookies may acknowledge every append (Qa = 2) before the failed write
        to the dead one reaches the change, so it is awaited, not assumed."""
        seen: asyncio.Event

        def emit(self, record):
            if "no bookie to replace" in record.getMessage():
                self.seen.set()

    deferred = Deferred()
    logging.getLogger("stream.ledger").addHandler(deferred)

    async def go():
        deferred.seen = asyncio.Event()
        async with client(own, change_retry_max=0.5) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            assert await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(20))) == list(range(20))
            ens = lh.metadata.fragments[0].ensemble
            by_id[ens[0]].kill()
            acked = await asyncio.wait_for(asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(20, 60))), 30)
            assert acked == list(range(20, 60))
            await asyncio.wait_for(deferred.seen.wait(), 30)
            await asyncio.wait_for(lh.close(), 30)
            assert lh.metadata.state is LedgerState.CLOSED and lh.metadata.last_entry == 59
            assert [f.ensemble for f in lh.metadata.fragments] == [ens]
        async with client(own) as r:
            got = await (await r.open_ledger(lh.ledger_id)).read_entries(0, 59)
            assert [e.payload for e in got] == [payload(i) for i in range(60)]
    try:
        run(go())
    finally:
        logging.getLogger("stream.ledger").removeHandler(deferred)


def test_recovery_that_cannot_decide_fails_retriably_and_succeeds_later(own):
    procs = own.start(3)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        async with client(own) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            acked = await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(100)))
            await lh.add_entry(payload(100))
            ens = lh.metadata.fragments[0].ensemble
        for b in ens[:2]:  # 2 of 3: no covering quorum (needs Qw - Qa + 1 = 2)
            by_id[b].kill()
        async with client(own) as r:
            with pytest.raises(se.LedgerRecoveryFailed) as ei:
                await r.open_ledger(lh.ledger_id, recovery=True)
            assert ei.value.retriable
            assert (await r.ledger_metadata(lh.ledger_id)).state is LedgerState.IN_RECOVERY
        for b in ens[:2]:
            by_id[b].start()
        async with client(own) as r:
            rh = await r.open_ledger(lh.ledger_id, recovery=True)
            assert rh.metadata.last_entry == 100 and acked == list(range(100))
            got = await rh.read_entries(0, 100)
            assert [e.payload for e in got] == [payload(i) for i in range(101)]
    run(go())


def test_no_bookie_to_replace_a_dead_one_fails_adds_with_not_enough_bookies(own):
    procs = own.start(3)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        async with client(own) as bk:
            lh = await bk.create_ledger(3, 3, 3)
            assert await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(20))) == list(range(20))
            by_id[lh.metadata.fragments[0].ensemble[0]].kill()
            res = await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(20, 30)),
                                       return_exceptions=True)
            assert all(isinstance(r, se.NotEnoughBookies) for r in res), res
            with pytest.raises(se.NotEnoughBookies):
                lh.add_entry_async(b"more")
            await lh.close()  # closes at the last acknowledged entry
            assert lh.metadata.state is LedgerState.CLOSED and lh.metadata.last_entry == 19
            got = await (await bk.open_ledger(lh.ledger_id)).read_entries(0, 19)
            assert [e.payload for e in got] == [payload(i) for i in range(20)]
    run(go())
