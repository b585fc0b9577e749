"""Issue 15: writers' lease-bound registrations on real etcd and real bookie
processes (kill -9): a live writer's open fragment is left to it by the
worker past the grace; a killed writer's key goes with its lease and the
worker then seals and copies its stream; the key goes with a clean close, a
client's close, and a fenced writer."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid

import pytest

from metadata.keeper_core import KeeperState
from metadata.layout import KeyLayout
from metadata.ledgers import LedgerState
from stream.autorecovery.service import Step
from stream.client import BookKeeperClient
from stream.stream import AsyncStreamClient, Position, StreamConfig, take_over
from stream import errors as err
from stream.writer_lease import Register, WriterRecord, lease_remaining, read_writer
from tests.conftest import run
from tests.test_autorecovery import autorecovery, check_every_replica, names_bookie, until

TTL = 2          # the writers' lease TTL here (etcd's minimum is about 2 s)
GRACE = 1.0
TIMEOUT = 90.0


def sname() -> str:
    return f"wl-{uuid.uuid4().hex[:8]}"


def writer_key(env, lid: int) -> str:
    return KeyLayout(env.cluster).writer_key(lid)


async def read_key(sc: AsyncStreamClient, lid: int) -> tuple[WriterRecord | None, int]:
    return await sc.bk.meta_call(read_writer, sc.bk.store, sc.layout, lid)


async def read_all(sc: AsyncStreamClient, name: str, last: bytes) -> list[bytes]:
    r = await sc.open_reader(name, Position.EARLIEST)
    got: list = []
    while not got or got[-1].payload != last:
        got += await r.read(1000, timeout=5)
    await r.close()
    return [x.payload for x in got]


# -- (c) the key comes with the writer and goes with its close ---------------------------------

def test_the_key_names_the_writer_and_goes_with_a_clean_close(shared):
    name = sname()

    async def go():
        async with AsyncStreamClient(shared.endpoint, shared.cluster, writer_lease_ttl=TTL) as sc:
            w = await sc.open_writer(name, StreamConfig(3, 3, 2))
            await w.append(b"x")
            rec, lease = await read_key(sc, w.ledger_id)
            assert rec is not None and rec.term == w.term and lease == w.registration.keeper.lease.id
            assert rec.pid > 0 and rec.host and rec.writer_id == w.registration.record.writer_id
            assert 0 < await sc.bk.meta_call(lease_remaining, sc.bk.store, lease) <= TTL
            await w.close()
            assert await read_key(sc, w.ledger_id) == (None, 0)   # revoked with the close: gone at once
            assert await sc.bk.meta_call(lease_remaining, sc.bk.store, lease) == -1
            # a client closed under an open writer ends its registration too
            w2 = await sc.open_writer(name)
            lid, term2 = w2.ledger_id, w2.term
            assert (await read_key(sc, lid))[0].term == term2
        async with AsyncStreamClient(shared.endpoint, shared.cluster) as sc:
            assert await read_key(sc, lid) == (None, 0)

    run(go())


def test_a_fenced_writer_stops_advertising_itself(shared):
    name = sname()

    async def fenced(w) -> None:
        with pytest.raises(err.WriterFenced):
            await w.append(b"late")

    async def go():
        async with AsyncStreamClient(shared.endpoint, shared.cluster, writer_lease_ttl=TTL) as sc:
            w = await sc.open_writer(name, StreamConfig(3, 3, 2))
            await w.append(b"a")
            lid, term = w.ledger_id, w.term
            # a later writer's key replaces the fenced one's, which does not delete it
            async with AsyncStreamClient(shared.endpoint, shared.cluster, writer_lease_ttl=TTL) as sc2:
                w2 = await sc2.open_writer(name)
                assert (await read_key(sc, lid))[0].term == w2.term == term + 1
                await fenced(w)
                assert await asyncio.to_thread(w.registration.keeper.wait_for,
                                               lambda k: k.state is KeeperState.STOPPED, TIMEOUT)
                assert w.registration.ended is Register.FENCED
                assert (await read_key(sc, lid))[0].term == term + 1
                await w2.close()
            # a take-over with no writer after it (the worker's seal): the key names an older term
            w3 = await sc.open_writer(name)
            async with BookKeeperClient(shared.endpoint, shared.cluster) as bk:
                meta, _, _ = await take_over(bk, lid)
            rec, _ = await read_key(sc, lid)
            assert meta.term == w3.term + 1 and rec.term == w3.term   # stale, recognisable
            gone = asyncio.ensure_future(asyncio.to_thread(sc.bk.store.wait_deleted, writer_key(shared, lid),
                                                           TIMEOUT))
            await fenced(w3)
            assert await gone, "the fenced writer's key is still there"

    run(go())


# -- (a) a live writer's open fragment is left to it -------------------------------------------

def test_a_live_writers_open_fragment_is_left_to_it_past_the_grace(own):
    """Three bookies, E = Qw = 3: the writer cannot replace the one killed
    until a fourth starts, so its open fragment names a lost bookie for
    longer than the grace.  The worker waits (the writer's key says it is
    live at the stream's term); once a bookie joins, the writer, idle,
    changes its ensemble itself, and the worker copies the fragment it sealed."""
    procs = own.start(3)
    by_id = {p.bookie_id: p for p in procs}
    name = sname()

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster, writer_lease_ttl=TTL, change_retry_max=0.5) as sc:
            w = await sc.open_writer(name, StreamConfig(3, 3, 2))
            before = [b"a-%d" % i for i in range(20)]
            await w.append_many(before)
            lid, term = w.ledger_id, w.term
            victim = w.handle.metadata.last_fragment.ensemble[1]
            by_id[victim].kill()
            async with autorecovery(own, delay=0.5, grace=GRACE) as (auditor, ws, keys):
                worker = ws[0]

                def left_to_writer():
                    return [o for o in worker.outcomes
                            if o.ledger_id == lid and o.step is Step.WAIT and "live writer" in o.note]

                async def waited_past_grace():
                    seen = worker.first_seen.get(lid)
                    return bool(left_to_writer()) and seen is not None and time.monotonic() - seen > 3 * GRACE
                await until(waited_past_grace, what="the worker waiting on the live writer past the grace")
                n = len(left_to_writer())
                await until(lambda: _true(len(left_to_writer()) > n), what="one more decision past the grace")
                assert not any(o.sealed for o in worker.outcomes)
                meta, _ = await sc.bk.meta_call(sc.bk.ledgers.read, lid)
                assert meta.term == term and meta.state is LedgerState.OPEN   # not taken over
                assert victim in meta.last_fragment.ensemble                   # the writer had nowhere to go

                # a bookie to replace the lost one: the writer, idle, changes its
                # ensemble itself (its watch: a registration added)
                own.start(1)
                writer, loop = w.handle._writer, asyncio.get_running_loop()
                deadline = loop.time() + TIMEOUT
                while writer.ensemble_changes == 0:
                    await asyncio.wait_for(writer.progress(), max(0.01, deadline - loop.time()))
                assert w.term == term
                assert victim not in w.handle.metadata.last_fragment.ensemble

                async def clean():
                    tasks = await asyncio.to_thread(lambda: list(keys.tasks()))
                    return not tasks and not await names_bookie(sc.bk, victim)
                await until(clean, TIMEOUT, what="the fragment the writer sealed copied")
                assert not any(o.sealed for o in worker.outcomes)
            after = [b"b-%d" % i for i in range(5)]
            await w.append_many(after)
            meta, _ = await sc.bk.meta_call(sc.bk.ledgers.read, lid)
            assert meta.term == term and meta.fragment_count >= 2   # the same writer, never fenced
            live = {p.bookie_id for p in own.bookies} - {victim}
            assert await check_every_replica(sc.bk, lid, 19, live) == 20 * 3
            assert await read_all(sc, name, after[-1]) == before + after
            await w.close()

    run(go())


async def _true(v) -> bool:
    return bool(v)


# -- (b) a writer killed with kill -9 ----------------------------------------------------------

WRITER = r"""
import json, sys, time
from stream.stream import StreamClient, StreamConfig
endpoint, cluster, name, n, ttl = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
sc = StreamClient(endpoint, cluster, writer_lease_ttl=ttl)
w = sc.open_writer(name, StreamConfig(3, 3, 2))
futs = [w.append_async(b"k-%d" % i) for i in range(n)]
w.flush()
print("ACKED " + json.dumps({"last": str(futs[-1].result()), "term": w.term, "ledger_id": w.aio.ledger_id}),
      flush=True)
time.sleep(3600)
"""


def test_a_killed_writers_key_expires_and_the_worker_seals_and_copies_its_stream(own):
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}
    name = sname()
    n = 50
    child = subprocess.Popen([sys.executable, "-c", WRITER, own.endpoint, own.cluster, name, str(n), str(TTL)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()   # the writer's acknowledged entries (an event: its own word)
        assert line.startswith("ACKED "), line
        acked = json.loads(line[len("ACKED "):])
    finally:
        if child.poll() is None:
            child.kill()   # kill -9: no close, the lease is not revoked
        child.wait()

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            lid = acked["ledger_id"]
            store = sc.bk.store
            meta, _ = await sc.bk.meta_call(sc.bk.ledgers.read, lid)
            assert meta.term == acked["term"]
            victim = meta.last_fragment.ensemble[0]   # in the open fragment
            by_id[victim].kill()
            async with autorecovery(own, delay=0.5, grace=GRACE) as (auditor, ws, keys):
                # the key outlives the process until its lease's TTL: an event from etcd
                assert await asyncio.to_thread(store.wait_deleted, writer_key(own, lid), TIMEOUT), \
                    "the killed writer's key is still there"

                async def clean():
                    tasks = await asyncio.to_thread(lambda: list(keys.tasks()))
                    return not tasks and not await names_bookie(sc.bk, victim)
                await until(clean, TIMEOUT, what="the stream sealed and copied off the killed bookie")
                outs = [o for o in ws[0].outcomes if o.ledger_id == lid]
                assert any(o.sealed for o in outs)
                assert all(o.writer != "live" for o in outs if o.sealed)   # never while its key said live
            live = set(by_id) - {victim}
            last = int(acked["last"])
            assert await check_every_replica(sc.bk, lid, last, live) == (last + 1) * 3   # (the no-op at 0 too)
            # a new writer takes over and sees every acknowledged entry
            w = await sc.open_writer(name)
            p = await w.append(b"after")
            got = await read_all(sc, name, b"after")
            assert got == [b"k-%d" % i for i in range(n)] + [b"after"]
            assert w.term > acked["term"] and int(str(p)) > int(acked["last"])
            await w.close()

    run(go())
