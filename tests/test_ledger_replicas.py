"""Per-entry reads of a classic ledger (``LedgerHandle.read_entry``, the
speculative read of ``stream/ledger_read.py``) against real bookie
processes and a real etcd: a replica stopped (SIGSTOP), killed, without
the entry, or with its stored record damaged on disk.

Every ledger here is E3 Qw2, made by hand: its metadata is created in etcd
on a chosen ensemble (a, b, c), its records are written straight to the
bookies chosen for each entry (``BookieClient.add``), then it is closed at
``LAST``.  Entry e is on ensemble positions (e % 3, (e + 1) % 3): entries 0
and 3 on (a, b), entry 1 on (b, c), entry 2 on (c, a).  Which replicas were
asked is read from the bookies' own counters (``Info.read_entry_requests``);
of a stopped or dead bookie, which cannot report, from the read's duration
(no faster than the speculative timeout) or the client's failure score.

The tests that only stop a bookie or damage one ledger's records share one
module-wide cluster of three bookies; the one that kills a bookie starts its
own.  Nothing waits by sleeping; every read has a bounded ``wait_for``.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from types import SimpleNamespace

import pytest

from bookie import entry as E
from bookie.core import Status
from metadata.ledgers import LedgerMetadata, LedgerMode, LedgerState
from stream import errors as se
from stream.bookie_client import BookieClient
from stream.client import BookKeeperClient
from stream.quorum import write_set
from tests.conftest import run, start_bookies

LAST = 5
GUARD = 10.0  # a hang guard: far above what a read takes, far below the 30 s timeouts set below


def payload(eid: int) -> bytes:
    return b"payload-%03d" % eid  # one length for all: a record of one entry fits another's slot


@pytest.fixture(scope="module")
def trio(etcd_server, tmp_path_factory):
    """Three bookies in a cluster of this module's own (resumed, then killed,
    at the end)."""
    name = f"replicas-{uuid.uuid4().hex[:8]}"
    procs = start_bookies(tmp_path_factory.mktemp("trio"), etcd_server.endpoint, name, 3)
    yield SimpleNamespace(endpoint=etcd_server.endpoint, cluster=name, bookies=procs)
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        p.kill()


def client(env, **kw) -> BookKeeperClient:
    return BookKeeperClient(env.endpoint, env.cluster, **kw)


async def closed_ledger(bk: BookKeeperClient, procs, *, qa: int = 2, held: dict | None = None):
    """A CLOSED classic ledger E3 Qw2 Qa ``qa`` on ``procs`` (in ensemble
    order) with entries 0..LAST, each written to the bookies of its write
    set, or for an entry in ``held`` to the ensemble positions it names only.
    Returns a read handle (``open_ledger`` without recovery: no bookie asked)."""
    held = held or {}
    meta, rev = await bk.meta_call(bk.ledgers.create, LedgerMetadata(3, 2, qa, mode=LedgerMode.CLASSIC),
                                   [p.bookie_id for p in procs])
    lid = meta.ledger_id
    for j, p in enumerate(procs):
        recs = [record(lid, e) for e in range(LAST + 1) if j in held.get(e, write_set(e, 3, 2))]
        if recs:
            bc = BookieClient(p.address)
            try:
                assert (await bc.add(b"".join(recs))).status == Status.OK
            finally:
                await bc.close()
    await bk.meta_call(bk.ledgers.update_header, meta.with_(state=LedgerState.CLOSED, last_entry=LAST), rev)
    return await bk.open_ledger(lid, recovery=False)


def record(lid: int, eid: int) -> bytes:
    return E.encode(lid, eid, payload(eid))


def overwrite(proc, old: bytes, new: bytes) -> None:
    """Writes ``new`` over the stored record ``old`` in the bookie's journal
    (the bookie reads it back through the page cache at once): bytes changed
    on disk after they were acknowledged."""
    assert len(new) == len(old)
    for seg in sorted((proc.data_dir / "journal").glob("segment-*.log")):
        at = seg.read_bytes().find(old)
        if at >= 0:
            with open(seg, "r+b") as f:
                f.seek(at)
                f.write(new)
            return
    raise AssertionError(f"the record is not in {proc.bookie_id}'s journal")


def rot(proc, lid: int, eid: int) -> None:
    """One payload byte of the stored record flipped: its checksum fails."""
    old = record(lid, eid)
    overwrite(proc, old, old[:-1] + bytes([old[-1] ^ 0xFF]))


async def read_counts(procs) -> dict[str, int]:
    """Each bookie's count of per-entry read requests so far."""
    out = {}
    for p in procs:
        bc = BookieClient(p.address)
        try:
            out[p.bookie_id] = (await bc.info()).read_entry_requests
        finally:
            await bc.close()
    return out


async def asked(procs, before: dict[str, int]) -> dict[str, int]:
    """Per-entry read requests each bookie got since ``before``."""
    now = await read_counts(procs)
    return {b: now[b] - before[b] for b in before}


def test_a_slow_replica_is_outrun_by_the_next_one_of_its_write_set(trio):
    """a is stopped: the read of entry 0 (write set a, b) asks a first, and
    b once a has not answered within the speculative timeout (so the read
    takes at least that long, and far less than the read timeout); c,
    outside the write set, is never asked; a slow bookie is not taken for a
    failed one."""
    a, b, c = trio.bookies
    spec = 0.1

    async def go():
        async with client(trio, read_timeout=30.0, speculative_read_timeout=spec) as bk:
            lh = await closed_ledger(bk, trio.bookies)
            before = await read_counts([b, c])
            loop = asyncio.get_running_loop()
            os.kill(a.pid, signal.SIGSTOP)
            try:
                t0 = loop.time()
                e = await asyncio.wait_for(lh.read_entry(0), GUARD)
                took = loop.time() - t0
                assert await asked([b, c], before) == {b.bookie_id: 1, c.bookie_id: 0}
            finally:
                os.kill(a.pid, signal.SIGCONT)
            assert (e.entry_id, e.payload) == (0, payload(0))
            # b was asked after the speculative timeout (a first), not after the read timeout
            assert spec - 1e-6 <= took < 5.0, took
            assert bk.quarantined() == set()

    run(go())


@pytest.mark.parametrize("damage", ["corrupt", "wrong", "missing"])
def test_a_replica_that_answers_badly_hands_over_at_once(trio, damage):
    """a's copy of entry 0 fails its checksum (a byte rotted on disk), is
    another entry's valid record (entry 1's, copied over the slot), or is
    not there: the read asks b at once (no speculation: its timeout is 30 s
    here) and returns b's copy."""
    a, b, c = trio.bookies

    async def go():
        async with client(trio, read_timeout=30.0, speculative_read_timeout=30.0) as bk:
            lh = await closed_ledger(bk, trio.bookies, held={0: (1,)} if damage == "missing" else None)
            if damage == "corrupt":
                rot(a, lh.ledger_id, 0)
            elif damage == "wrong":
                overwrite(a, record(lh.ledger_id, 0), record(lh.ledger_id, 1))
            before = await read_counts(trio.bookies)
            e = await asyncio.wait_for(lh.read_entry(0), GUARD)
            assert (e.entry_id, e.payload) == (0, payload(0))
            assert await asked(trio.bookies, before) == {a.bookie_id: 1, b.bookie_id: 1, c.bookie_id: 0}

    run(go())


def test_replicas_all_bad_or_absent_give_typed_errors_and_an_ok_wins(trio):
    a, b, _ = trio.bookies

    async def read0(bk, **kw):
        lh = await closed_ledger(bk, trio.bookies, **kw)
        return lh, (lambda: asyncio.wait_for(lh.read_entry(0), GUARD))

    async def go():
        async with client(trio, read_timeout=30.0, speculative_read_timeout=30.0) as bk:
            lh, read = await read0(bk)
            rot(a, lh.ledger_id, 0)
            rot(b, lh.ledger_id, 0)
            with pytest.raises(se.BadChecksum):
                await read()
            _, read = await read0(bk, held={0: ()})
            with pytest.raises(se.EntryMissing) as ei:
                await read()
            assert not ei.value.retriable
            # Qw 2 Qa 1: missing on both replicas is missing too
            _, read = await read0(bk, qa=1, held={0: ()})
            with pytest.raises(se.EntryMissing):
                await read()
            # an OK wins over an absent answer (a, asked first, does not hold it)
            _, read = await read0(bk, qa=1, held={0: (1,)})
            e = await read()
            assert (e.entry_id, e.payload) == (0, payload(0))

    run(go())


def test_reads_beyond_the_lac_of_a_closed_ledger_are_refused(trio):
    async def go():
        async with client(trio) as bk:
            lh = await closed_ledger(bk, trio.bookies)
            got = await asyncio.wait_for(lh.read_entries(0, LAST), GUARD)
            assert [(x.entry_id, x.payload) for x in got] == [(i, payload(i)) for i in range(LAST + 1)]
            with pytest.raises(se.ReadBeyondLac):
                await lh.read_entries(3, LAST + 1)
            with pytest.raises(ValueError):
                await lh.read_entries(3, 2)

    run(go())


def test_a_dead_replica_hands_over_at_once_and_is_asked_last_next_time(own):
    """a is killed (kill -9): the read of entry 0 hands over to b at once
    and a is suspect.  With Qw = Qa = 2, a confirmed entry is on both
    replicas, so b's absent answer proves it missing; with Qa = 1 it may be
    on a, which did not answer: ReadFailed, retriable.  Entry 3 (write set
    a, b again) is then asked of b first: a is not asked (its failure score
    did not grow)."""
    procs = own.start(3)
    a, b, c = procs

    async def go():
        async with client(own, read_timeout=30.0, speculative_read_timeout=30.0, failure_half_life=600.0) as bk:
            full = await closed_ledger(bk, procs)
            strict = await closed_ledger(bk, procs, held={0: (0,)})  # entry 0 reached a only
            loose = await closed_ledger(bk, procs, qa=1, held={0: (0,)})
            await bk.refresh_bookies()  # every address known: the dead bookie is asked, not skipped as unregistered
            a.kill()
            before = await read_counts([b, c])
            e = await asyncio.wait_for(full.read_entry(0), GUARD)
            assert (e.entry_id, e.payload) == (0, payload(0))
            assert bk.quarantined() == {a.bookie_id}
            with pytest.raises(se.EntryMissing) as ei:
                await asyncio.wait_for(strict.read_entry(0), GUARD)
            assert not ei.value.retriable
            with pytest.raises(se.ReadFailed) as ei:
                await asyncio.wait_for(loose.read_entry(0), GUARD)
            assert ei.value.retriable and not isinstance(ei.value, se.EntryMissing)
            assert await asked([b, c], before) == {b.bookie_id: 3, c.bookie_id: 0}
            score = bk.health.score(a.bookie_id, time.monotonic())
            before = await read_counts([b, c])
            e = await asyncio.wait_for(full.read_entry(3), GUARD)
            assert (e.entry_id, e.payload) == (3, payload(3))
            assert await asked([b, c], before) == {b.bookie_id: 1, c.bookie_id: 0}
            assert 0.5 < bk.health.score(a.bookie_id, time.monotonic()) <= score  # not asked: no new failure

    run(go())
