"""Ledgers to logs: leadership by fencing + CAS on the ledger list, rolling,
truncation, reading across ledgers, and duelling leaders."""
from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from metadata.ledgers import LedgerState
from stream import errors as se
from stream.client import BookKeeperClient
from stream.log import LogPosition, LogReader, LogWriter, encode_ledger_list, log_key, read_ledger_list
from tests.conftest import run
from tests.conftest import start_bookies


@pytest.fixture(scope="module")
def env(etcd_server, tmp_path_factory):
    name = f"log-{uuid.uuid4().hex[:8]}"
    procs = start_bookies(tmp_path_factory.mktemp("logs"), etcd_server.endpoint, name, 3)
    yield SimpleNamespace(endpoint=etcd_server.endpoint, cluster=name)
    for p in procs:
        p.kill()


def client(env):
    return BookKeeperClient(env.endpoint, env.cluster)


def test_open_roll_truncate_and_read_across_ledgers(env):
    name = f"log-{uuid.uuid4().hex[:6]}"

    async def go():
        async with client(env) as bk:
            w = await LogWriter(bk, name).open()
            first = w.current_ledger.ledger_id
            pos = [await w.append(b"a%d" % i) for i in range(5)]
            assert pos == [LogPosition(first, i) for i in range(5)]
            # appends issued before the roll land in the old ledger, after it in the new
            pending = [w.append_async(b"a%d" % i) for i in range(5, 10)]
            new = await w.roll()
            pos += await asyncio.gather(*pending)
            pos += [await w.append(b"b%d" % i) for i in range(5)]
            assert w.ledger_ids == [first, new.ledger_id] and new.ledger_id > first
            assert pos == sorted(pos) and pos[-1] == LogPosition(new.ledger_id, 4)
            assert (await bk.ledger_metadata(first)).state is LedgerState.CLOSED
            # the open ledger is read up to its LAC: b4 carried LAC 3, and the
            # writer's explicit LAC (adds went quiet) moves it to 4
            rh = await bk.open_ledger(new.ledger_id, recovery=False)
            assert await rh.long_poll_last_add_confirmed(3, timeout=10) == 4
            got = await LogReader(bk, name).read_all()
            assert [e.payload for _, e in got] == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(5)]
            assert [p for p, _ in got] == pos[:len(got)]
            await w.roll()
            assert await w.truncate(new.ledger_id) == [first]
            assert await LogReader(bk, name).ledger_ids() == w.ledger_ids and first not in w.ledger_ids
            with pytest.raises(se.NoSuchLedger):
                await bk.ledger_metadata(first)
            await w.close()
            # a next leader fences and closes what is there, and starts a new ledger
            w2 = await LogWriter(bk, name).open()
            assert len(w2.ledger_ids) == 3
            got = await LogReader(bk, name).read_all()
            assert [e.payload for _, e in got] == [b"b%d" % i for i in range(5)]
            await w2.close()
    run(go())


def test_a_list_not_in_id_order_is_read_from_a_start_by_place_in_the_list(env):
    """The Spark sink appends ledgers in partition order: a later ledger in
    the list may have a lower id.  A start position skips by place."""
    name = f"log-{uuid.uuid4().hex[:6]}"

    async def go():
        async with client(env) as bk:
            lids = []
            for k in range(3):
                lh = await bk.create_ledger(3, 2, 2)
                for i in range(3):
                    await lh.add_entry(b"L%d-%d" % (k, i))
                await lh.close()
                lids.append(lh.ledger_id)
            assert lids == sorted(lids)
            order = [lids[2], lids[0], lids[1]]       # the newest ledger first
            assert await read_ledger_list(bk, name) == ([], None)
            rev = await bk.meta_call(bk.store.create, log_key(bk, name), encode_ledger_list(name, order))
            assert await read_ledger_list(bk, name) == (order, rev)
            r = LogReader(bk, name)
            want = [b"L%d-%d" % (k, i) for k in (2, 0, 1) for i in range(3)]
            assert [e.payload for _, e in await r.read_all()] == want
            got = await r.read_all(LogPosition(lids[2], 1))   # the first ledger, highest id
            assert [e.payload for _, e in got] == want[1:]
            got = await r.read_all(LogPosition(lids[0], 2))   # the middle one: the first is behind it
            assert [e.payload for _, e in got] == want[5:]
            assert [p for p, _ in got] == [LogPosition(lids[0], 2)] + [LogPosition(lids[1], i) for i in range(3)]
            with pytest.raises(se.NoSuchLedger):
                await r.read_all(LogPosition(lids[0] + 10_000, 0))   # not in the list
    run(go())


def test_duelling_leaders_only_the_last_one_writes(env):
    name = f"duel-{uuid.uuid4().hex[:6]}"

    async def go():
        async with client(env) as ca, client(env) as cb:
            a = await LogWriter(ca, name).open()
            acked = [(await a.append(b"A%d" % i), b"A%d" % i) for i in range(20)]
            b = await LogWriter(cb, name).open()  # B fences A's ledger
            with pytest.raises(se.LedgerFenced):
                await a.append(b"A-late")
            with pytest.raises(se.NotLeader):
                await a.roll()  # the list moved on: A may not change it
            acked += [(await b.append(b"B%d" % i), b"B%d" % i) for i in range(20)]
            # A re-elects itself: B is fenced in turn
            await a.open()
            with pytest.raises(se.LedgerFenced):
                await b.append(b"B-late")
            acked += [(await a.append(b"A2-%d" % i), b"A2-%d" % i) for i in range(5)]
            # both at once: each open either wins its CAS or starts again, so
            # both end up opened, and only the later one can write
            await asyncio.gather(a.open(), b.open())
            results = await asyncio.gather(a.append(b"x"), b.append(b"y"), return_exceptions=True)
            ok = [r for r in results if not isinstance(r, BaseException)]
            assert len(ok) == 1 and all(isinstance(r, se.LedgerFenced) for r in results if r not in ok)
            winner = 0 if not isinstance(results[0], BaseException) else 1
            acked.append((ok[0], b"xy"[winner:winner + 1]))
            # A reader reads the winner's open ledger up to the LAC its bookies
            # hold, which the one append there reaches with the next add or the
            # explicit LAC, explicit_lac_delay later: it may be one short.
            for c in (ca, cb):
                got = await LogReader(c, name).read_all()
                assert [(p, e.payload) for p, e in got[:len(acked) - 1]] == acked[:-1]
            await (a, b)[winner].close()   # (the ledger closed at its last entry)
            readers = [await LogReader(c, name).read_all() for c in (ca, cb)]
            assert readers[0] == readers[1]
            got = readers[0]
            # every acknowledged append is there, in order, and nothing else but
            # entries fenced before any ack (none here: every add was awaited)
            assert [(p, e.payload) for p, e in got[:len(acked)]] == acked
            assert [p for p, _ in got] == sorted(p for p, _ in got)
    run(go())


@pytest.mark.parametrize("step", ["open", "roll", "truncate"])
def test_a_list_cas_whose_answer_was_lost_leaves_no_listed_ledger_deleted(tmp_path, cluster, step):
    """etcd paused while a leader's list CAS is on its way (its own etcd:
    SIGSTOP): the client gives up after its timeout, and etcd, resumed,
    applies the CAS it had received.  The leader asks the list again (the
    key still at the CAS's revision: the same CAS again; moved past it: the
    list says) and goes on with the ledger it listed: it writes to it, and
    every ledger of the list exists.  (Before: the ledger was deleted as if
    unlisted, and the list named a ledger that no longer existed.)  A
    truncation's CAS the same: the leader goes on (before, its next roll
    found the list moved under it: NotLeader)."""
    import os
    import signal

    from metadata.etcd_server import ManagedEtcd

    etcd = ManagedEtcd(tmp_path / "etcd").start()
    procs = start_bookies(tmp_path, etcd.endpoint, cluster, 3)
    name = "lost-answer"

    async def go():
        async with BookKeeperClient(etcd.endpoint, cluster, metadata_timeout=2.0) as bk:
            w = LogWriter(bk, name, 3, 3, 2)
            if step != "open":
                await w.open()
                await w.append(b"before")
            if step == "truncate":
                await w.roll()
                await w.append(b"kept")
            real, paused = w._rec.cas, []

            async def cas_unanswered(ids, rev):   # (the first one: the leader's own asking again is answered)
                if paused:
                    return await real(ids, rev)
                os.kill(etcd.pid, signal.SIGSTOP)   # (the request reaches etcd's socket; no answer comes)
                paused.append(ids)
                try:
                    return await real(ids, rev)
                finally:
                    os.kill(etcd.pid, signal.SIGCONT)

            w._rec.cas = cas_unanswered
            if step == "open":
                await w.open()
            elif step == "roll":
                await w.roll()
            else:
                first = w.ledger_ids[0]
                assert await w.truncate(w.ledger_ids[1]) == [first]
                await w.roll()   # (the list as the writer knows it)
            w._rec.cas = real
            new = paused[0][-1]
            assert w.current_ledger.ledger_id == new or step == "truncate"
            await w.append(b"after")
            ids, _ = await read_ledger_list(bk, name)
            assert ids == w.ledger_ids and (ids[-1] == new or step == "truncate"), (ids, w.ledger_ids)
            for lid in ids:   # (raises NoSuchLedger for a listed ledger deleted)
                await bk.open_ledger(lid, recovery=False)
            await w.close()
            got = [e.payload for _, e in await LogReader(bk, name).read_all()]
            want = {"open": [b"after"], "roll": [b"before", b"after"], "truncate": [b"kept", b"after"]}[step]
            assert got == want, got

    try:
        run(go())
    finally:
        for p in procs:
            p.kill()
        etcd.stop()
