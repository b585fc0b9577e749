"""Ledger passwords checked by the bookies (issue 17; bookie/core.py, the
master key): real bookie processes, raw gRPC requests with no key, a wrong
one and the right one; the key learned at a ledger's first request, kept
as a verifier through a journal replay and a checkpoint; then real etcd:
recovery, an ensemble change and an autorecovery copy of a password ledger,
and the typed error a client gets when a bookie refuses its key."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bookie import entry as E
from bookie.core import Status, verifier_of
from stream import errors as se
from stream import password
from stream.bookie_client import BookieClient
from stream.client import BookKeeperClient
from tests.conftest import run
from tests.test_autorecovery import autorecovery, check_every_replica, names_bookie, until
from tests.test_bookie import rec, with_client

OK, REFUSED = Status.OK, Status.UNAUTHORIZED_ACCESS
KEY = bytes(range(32))          # a master key, as stream/password.py derives one
WRONG = bytes(range(1, 33))
SECRET = b"open sesame"


async def add(c: BookieClient, records: list[bytes], key: bytes = b"") -> Status:
    """The frame's status, or its entries' (all the same here)."""
    ack = await c.add(b"".join(records), master_key=key)
    if ack.errors:
        assert len({e.status for e in ack.errors}) == 1 and len(ack.errors) == len(records), ack
        return Status(ack.errors[0].status)
    return Status(ack.status)


async def held(c: BookieClient, ledger: int) -> list[int]:
    out = []
    async for r in c.read_range(ledger, 0, 100, sparse=True):
        out += [eid for eid, _s, _e in E.record_spans(r.entries)]
    return out


def test_a_bookie_refuses_adds_and_state_changes_without_the_ledger_key(bookies):
    b = bookies()

    async def go(c: BookieClient):
        assert await add(c, [rec(9, 0), rec(9, 1)], KEY) == OK            # first add: the bookie learns KEY
        for key in (b"", WRONG):
            assert await add(c, [rec(9, 2)], key) == REFUSED
            assert await add(c, [rec(9, 2, recovery=True)], key) == REFUSED  # recovery adds too
            assert (await c.read_lac(9, fence=True, master_key=key)).status == REFUSED
            assert (await c.read_lac(9, term=1, master_key=key)).status == REFUSED
            assert (await c.read_entry(9, 0, term=1, master_key=key)).status == REFUSED
            frames = [r async for r in c.read_range(9, 0, 5, fence=True, sparse=True, master_key=key)]
            assert [f.status for f in frames] == [REFUSED]
            assert (await c.write_lac(9, 1, 1, master_key=key)).status == REFUSED
            assert (await c.prepare(9, 0, 1, master_key=key)).status == REFUSED
            assert (await c.delete(9, master_key=key)).status == REFUSED
            assert (await c.delete(9, (0, 1), master_key=key)).status == REFUSED
        # nothing changed: not fenced, term 0, both entries there
        info = await c.read_lac(9)
        assert (info.fenced, info.term, await held(c, 9)) == (False, 0, [0, 1])
        # normal reads are not checked (they change nothing; see stream/password.py)
        assert (await c.read_entry(9, 0)).status == OK
        # with the key: everything works
        assert await add(c, [rec(9, 2)], KEY) == OK
        assert (await c.write_lac(9, 2, 2, master_key=KEY)).status == OK
        assert (await c.read_lac(9, fence=True, master_key=KEY)).status == OK
        assert await add(c, [rec(9, 3, recovery=True)], KEY) == OK
        # a ledger without a password: no key, and no key may be bound to it later
        assert await add(c, [rec(10, 0)]) == OK
        assert await add(c, [rec(10, 1)], KEY) == REFUSED
        assert await add(c, [rec(10, 1)]) == OK
        # a fencing read of a ledger this bookie never saw binds its key too
        assert (await c.read_lac(11, term=2, master_key=KEY)).status == OK
        assert await add(c, [rec(11, 0, term=2)]) == REFUSED
        # a frame of two ledgers: the key is checked against each
        assert await add(c, [rec(12, 0)], KEY) == OK
        ack = await c.add(rec(12, 1) + rec(10, 2), master_key=KEY)
        assert [(e.index, e.status) for e in ack.errors] == [(1, REFUSED)]

    run(with_client(b.address, go))

    async def after_restart(c: BookieClient):
        for lid, entry in ((9, 4), (11, 0), (12, 2)):   # (9 is fenced: recovery adds)
            term = 2 if lid == 11 else 0
            assert await add(c, [rec(lid, entry, term=term, recovery=True)]) == REFUSED, lid
            assert await add(c, [rec(lid, entry, term=term, recovery=True)], WRONG) == REFUSED, lid
            assert await add(c, [rec(lid, entry, term=term, recovery=True)], KEY) == OK, lid
            assert (await c.read_lac(lid, term=term, fence=True)).status == REFUSED
        assert await add(c, [rec(10, 3)]) == OK
        assert await add(c, [rec(10, 4)], KEY) == REFUSED
        assert await held(c, 9) == [0, 1, 2, 3, 4]

    b.kill()     # kill -9: the keys come back from the journal (R_KEY records)
    b.start()
    assert run(with_client(b.address, lambda c: c.info())).replayed_records > 0
    run(with_client(b.address, after_restart))
    b.stop()     # a clean stop checkpoints: the keys come back from the checkpoint
    b.start()
    assert run(with_client(b.address, lambda c: c.info())).replayed_records == 0
    assert run(with_client(b.address, lambda c: add(c, [rec(9, 5, recovery=True)], WRONG))) == REFUSED
    assert run(with_client(b.address, lambda c: add(c, [rec(9, 5, recovery=True)], KEY))) == OK

    # the bookie's disk holds the verifier, never the key
    disk = b"".join(p.read_bytes() for p in Path(b.data_dir).rglob("*") if p.is_file())
    assert KEY not in disk and verifier_of(KEY) in disk


def test_password_ledger_through_the_client_recovery_and_an_ensemble_change(own):
    """The writer sends the key with every frame (a replacement bookie
    learns it from its first frame); a recovery with the password fences,
    reads and writes back with it; the bookies refuse a raw add without it."""
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        async with BookKeeperClient(own.endpoint, own.cluster, add_timeout=5.0) as bk:
            lh = await bk.create_ledger(3, 3, 2, password=SECRET)
            key = password.master_key((await bk.ledger_metadata(lh.ledger_id)).custom)
            assert key and SECRET not in key
            assert key == password.check(lh.ledger_id, lh._meta.custom, SECRET)  # derived from the password
            for i in range(10):
                await lh.add_entry(b"e%d" % i)
            first = list(lh._meta.last_fragment.ensemble)
            by_id[first[0]].kill()
            for i in range(10, 20):
                await lh.add_entry(b"e%d" % i)
            meta = await bk.ledger_metadata(lh.ledger_id)
            (joined,) = set(meta.last_fragment.ensemble) - set(first)
            assert meta.fragment_count == 2
            for bid in meta.last_fragment.ensemble:
                bc = await bk.bookie(bid)
                assert await add(bc, [rec(lh.ledger_id, 50)]) == REFUSED, bid
                assert await add(bc, [rec(lh.ledger_id, 50)], WRONG) == REFUSED, bid
            async with BookKeeperClient(own.endpoint, own.cluster, add_timeout=5.0) as other:
                with pytest.raises(se.UnauthorizedAccess):
                    await other.open_ledger(lh.ledger_id, password=b"guess")
                rh = await other.open_ledger(lh.ledger_id, recovery=True, password=SECRET)
                assert rh.last_add_confirmed == 19
                assert [e.payload for e in await rh.read_entries(0, 19)] == [b"e%d" % i for i in range(20)]
            with pytest.raises(se.LedgerFenced):
                await lh.add_entry(b"late")
            # the replacement's entries came with the key: it refuses others too
            bc = await bk.bookie(joined)
            assert (await bc.read_lac(lh.ledger_id, fence=True)).status == REFUSED

    run(go())


def test_a_bookie_refusing_the_key_is_a_typed_error_for_writers_and_recoveries(own):
    """A bookie that learned another key for the ledger (a first request
    from someone else got there first) refuses the writer and a recovery:
    UnauthorizedAccess, not AddFailed or LedgerRecoveryFailed."""
    own.start(3)

    async def go():
        async with BookKeeperClient(own.endpoint, own.cluster, add_timeout=5.0) as bk:
            lh = await bk.create_ledger(3, 3, 3, password=SECRET)   # Qa = 3: every bookie's answer counts
            squatted = lh._meta.last_fragment.ensemble[1]
            bc = await bk.bookie(squatted)
            assert await add(bc, [rec(lh.ledger_id, 0, b"x")], WRONG) == OK
            with pytest.raises(se.UnauthorizedAccess) as e:
                await lh.add_entry(b"e0")
            assert not e.value.retriable and squatted in str(e.value)
            async with BookKeeperClient(own.endpoint, own.cluster, add_timeout=5.0) as other:
                with pytest.raises(se.UnauthorizedAccess) as e:
                    await other.open_ledger(lh.ledger_id, recovery=True, password=SECRET)
                assert "UNAUTHORIZED_ACCESS" in str(e.value)

    run(go())


def test_autorecovery_copies_a_password_ledger_with_the_key_from_its_metadata(own):
    """The copier does not know the password: it sends the master key the
    metadata holds, and the new replica is protected like the others."""
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        lh = await bk.create_ledger(3, 3, 2, password=SECRET)
        await asyncio.gather(*(lh.add_entry(b"c%d" % i) for i in range(30)))
        await lh.close()
        lid = lh.ledger_id
        victim = lh._meta.last_fragment.ensemble[0]
        by_id[victim].kill()
        live = set(by_id) - {victim}
        async with autorecovery(own, delay=0.5, grace=0.5) as (_auditor, ws, keys):
            async def clean():
                tasks = await asyncio.to_thread(lambda: list(keys.tasks()))
                return not tasks and not await names_bookie(bk, victim)
            await until(clean, what="the password ledger's fragment off the killed bookie")
            assert sum(len(o.replaced) for o in ws[0].outcomes) == 1
        assert await check_every_replica(bk, lid, 29, live) == 90
        meta = await bk.ledger_metadata(lid)
        (target,) = set(meta.last_fragment.ensemble) - set(lh._meta.last_fragment.ensemble)
        tc = await bk.bookie(target)
        assert await add(tc, [rec(lid, 30, recovery=True)]) == REFUSED      # it learned the key from the copy
        assert (await tc.delete(lid, (0, 29))).status == REFUSED
        rh = await bk.open_ledger(lid, password=SECRET)
        assert [e.payload for e in await rh.read_entries(0, 29)] == [b"c%d" % i for i in range(30)]
        await bk.close()

    run(go())


def test_a_stream_with_a_password(own):
    """StreamConfig(password=): writers and readers need it (a refused
    writer fences nothing); the bookies refuse the stream's ledger without
    its key; a take-over with it recovers with the key."""
    from stream.stream import AsyncStreamClient, Position, StreamConfig

    own.start(3)

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc, \
                AsyncStreamClient(own.endpoint, own.cluster) as other:
            cfg = StreamConfig(3, 3, 2, password=SECRET)
            assert "open sesame" not in repr(cfg)
            w = await sc.open_writer("pw", cfg)
            await w.append_many([b"a%d" % i for i in range(5)])
            for wrong in (None, b"guess"):
                with pytest.raises(se.UnauthorizedAccess):
                    await other.open_writer("pw", StreamConfig(3, 3, 2, password=wrong))
                with pytest.raises(se.UnauthorizedAccess):
                    await other.open_reader("pw", password=wrong)
            await w.append(b"a5")                       # not fenced by the refused writers
            lid = (await sc.stream_info("pw"))["ledger_id"]
            meta = await sc.bk.ledger_metadata(lid)
            for bid in meta.last_fragment.ensemble:
                bc = await sc.bk.bookie(bid)
                assert await add(bc, [rec(lid, 40, term=meta.term)]) == REFUSED
                assert (await bc.read_lac(lid, term=meta.term + 1)).status == REFUSED
            w2 = await other.open_writer("pw", cfg)     # a take-over: recovery with the key
            await w2.append(b"b0")
            r = await other.open_reader("pw", Position.EARLIEST, password=SECRET)
            got = []
            while not got or got[-1].payload != b"b0":
                got += await r.read(100, timeout=5)
            assert [x.payload for x in got if x.payload] == [b"a%d" % i for i in range(6)] + [b"b0"]
            await w2.close()

    run(go())
    cli = [sys.executable, "-m", "bookstream.cli", "streams", "read", "pw", "--etcd", own.endpoint,
           "--cluster", own.cluster, "--format", "json", "--timeout", "20"]
    refused = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and json.loads(refused.stderr)["error"]["type"] == "UnauthorizedAccess"
    ok = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, BOOKSTREAM_STREAM_PASSWORD=SECRET.decode()))
    assert ok.returncode == 0, ok.stderr
    assert [json.loads(line)["payload"] for line in ok.stdout.splitlines()] == ["a0", "a1", "a2", "a3", "a4", "a5", "b0"]
