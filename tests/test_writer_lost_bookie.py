"""Issue 15: a live writer reacts to a bookie's registration disappearing by
changing its ensemble itself, before any add times out (real etcd, real
bookie processes; registrations with a 3 s TTL, adds with a 120 s timeout)."""
from __future__ import annotations

import asyncio
import os
import signal

from stream.client import BookKeeperClient
from tests.conftest import run

ADD_TIMEOUT = 120.0
BOUND = 60.0  # well below ADD_TIMEOUT: only the registration's loss can move the writer by then


async def _until_changed(writer, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    while writer.ensemble_changes == 0:
        await asyncio.wait_for(writer.progress(), max(0.01, deadline - loop.time()))


def _victim(procs, ensemble, index=1):
    return next(p for p in procs if p.bookie_id == ensemble[index])


def test_an_idle_writer_replaces_a_killed_bookie_when_its_registration_goes(own):
    procs = own.start(4)

    async def go():
        async with BookKeeperClient(own.endpoint, own.cluster, add_timeout=ADD_TIMEOUT) as bk:
            lh = await bk.create_ledger(3, 3, 3)
            for i in range(5):
                await lh.add_entry(b"e%d" % i)
            before = lh.metadata.last_fragment.ensemble
            victim = _victim(procs, before)
            victim.kill()  # kill -9: the lease expires, no add is in flight to notice
            loop = asyncio.get_running_loop()
            await _until_changed(lh._writer, loop.time() + BOUND)
            frag = lh.metadata.last_fragment
            assert victim.bookie_id not in frag.ensemble and frag.first_entry == 5
            assert await lh.add_entry(b"after") == 5  # to the new ensemble
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id, recovery=False)
            assert [e.payload for e in await rh.read_entries(0, 5)] == [b"e%d" % i for i in range(5)] + [b"after"]

    run(go())


def test_an_add_held_by_a_paused_bookie_completes_once_its_registration_goes(own):
    procs = own.start(4)

    async def go():
        async with BookKeeperClient(own.endpoint, own.cluster, add_timeout=ADD_TIMEOUT) as bk:
            lh = await bk.create_ledger(3, 3, 3)  # every entry needs every bookie of the ensemble
            await lh.add_entry(b"first")
            victim = _victim(procs, lh.metadata.last_fragment.ensemble)
            os.kill(victim.pid, signal.SIGSTOP)  # no answer, no refresh of its lease
            try:
                eid = await asyncio.wait_for(lh.add_entry(b"second"), BOUND)
                assert eid == 1 and lh._writer.ensemble_changes == 1
                assert victim.bookie_id not in lh.metadata.last_fragment.ensemble
            finally:
                os.kill(victim.pid, signal.SIGCONT)
            await lh.close()

    run(go())
