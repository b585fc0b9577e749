"""Issue 12 item 0, the recovery hole, on real bookie processes and etcd.

Exactly three bookies, E3 Qw3 Qa2 (no spare): writer A (term 1) has
entries up to p acknowledged and its p+1..p+3 on b3 only; b3 pauses; a
take-over meanwhile writes its truncate no-op at p+1 on b1 and b2, cannot
reach b3, has no bookie to replace it with, and aborts; b3 comes back; the
next take-over reads the no-op first (from b1) and A's leftovers from b3.  With log matching on origin terms the leftovers are
stale and the stream is A's prefix; with the ``IGNORE_ORIGIN_TERM`` mutant
(the rule before the fix) a leftover is recovered above a no-op: a hole.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import pytest

from bookie import entry as E
from bookie.core import Status
from stream import errors as se
from stream import mutations
from stream.bookie_client import BookieClient
from stream.stream import AsyncStreamClient, StreamConfig
from tests.conftest import run


async def wait_for_noop(bc: BookieClient, lid: int, ids, above: int, timeout: float = 30.0) -> tuple[int, int]:
    """Polls ``bc`` until it holds a no-op of an origin term above
    ``above`` at one of ``ids``: (its id, its origin)."""
    deadline = time.monotonic() + timeout
    while True:
        for eid in ids:
            r = await bc.read_entry(lid, eid)
            if r.status == Status.OK:
                e = E.decode(r.entry)
                if e.is_noop and e.origin > above:
                    return eid, e.origin
        assert time.monotonic() < deadline, f"no no-op of an origin above {above} at {list(ids)}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("mutant", [None, mutations.IGNORE_ORIGIN_TERM])
def test_the_recovery_hole_schedule_on_real_bookies(own, mutant):
    procs = own.start(3)
    name = f"hole-{uuid.uuid4().hex[:8]}"

    def client(**kw) -> AsyncStreamClient:
        return AsyncStreamClient(own.endpoint, own.cluster, **kw)

    async def writer_a():
        async with client() as c:
            w = await c.open_writer(name, StreamConfig(3, 3, 2))
            acked = [await w.append(b"a%d" % i) for i in range(1, 4)]
            await w.flush()
            info = await c.stream_info(name)
            p = acked[-1].entry_id
            by_id = {x.bookie_id: x for x in procs}
            b1, b2, b3 = (by_id[b] for b in info["ensemble"])  # ensemble indexes 0, 1, 2
            # A's p+1..p+3 reach b3 only (A's term, never acknowledged)
            raw = BookieClient(b3.address)
            late = b"".join(E.encode(info["ledger_id"], p + k, b"late%d" % k, lac=p, lafr=p, term=w.term)
                            for k in (1, 2, 3))
            assert (await raw.add(late)).status == Status.OK
            await raw.close()
            # (A crashes: its client goes without a word)
            return info["ledger_id"], p, b1, b2, b3

    lid, p, b1, b2, b3 = run(writer_a())
    os.kill(b3.pid, signal.SIGSTOP)  # b3 pauses

    async def aborted_takeovers():
        # one attempt, short timeouts: the no-op at p+1 lands on b1 and b2,
        # the write to b3 times out, no spare: abort (a take-over raises the
        # term once and, with recovery_attempts=1, tries recovery once)
        async with client(add_timeout=1.0, read_timeout=1.0, recovery_attempts=1, metadata_attempts=1) as c:
            with pytest.raises(se.LedgerRecoveryFailed):
                await c.open_writer(name)
            info = await c.stream_info(name)
        peek = BookieClient(b1.address)
        r = await peek.read_entry(lid, p + 1)
        assert r.status == Status.OK and E.decode(r.entry).is_noop and E.decode(r.entry).origin > 1
        await peek.close()
        return info["term"]

    aborted_term = run(aborted_takeovers())
    # b3 comes back.  (Killed and started again rather than resumed: the
    # aborted take-over's frames wait in b3's socket buffers, and their
    # truncate no-op at p+1 would then remove A's leftovers at once.)
    b3.kill()
    b3.start()

    async def registered(bid: str) -> None:  # (a restart may wait out its old registration's lease)
        async with client() as c:
            deadline = time.monotonic() + 30
            while bid not in {r.bookie_id for r in await c.bk.meta_call(c.bk.registry.list_bookies, True)}:
                assert time.monotonic() < deadline, f"{bid} never registered again"
                await asyncio.sleep(0.05)

    run(registered(b3.bookie_id))
    os.kill(b2.pid, signal.SIGSTOP)  # b1 and b3 make the coverage: p+1.. read from b1, A's leftovers from b3

    async def takeover(**kw):
        async with client(**kw) as c:
            opening = asyncio.ensure_future(c.open_writer(name))
            peek = BookieClient(b1.address)
            end, term = await wait_for_noop(peek, lid, range(p + 1, p + 5), aborted_term)
            os.kill(b2.pid, signal.SIGCONT)  # the no-op must reach every bookie
            w = await asyncio.wait_for(opening, 60)
            assert w.term == term
            await w.append(b"after")
            await w.flush()
            r = await c.open_reader(name)
            got = [x.payload for x in await r.read(100, timeout=5)]
            while got[-1:] != [b"after"]:
                got += [x.payload for x in await r.read(100, timeout=5)]
            await peek.close()
            return end, got

    if mutant:
        end, got = run(takeover(mutations=mutations.Mutations.of(mutant)))
        # A's leftovers above the aborted take-over's no-op: its p+1 is gone, its p+2, p+3 are in the stream
        assert got == [b"a1", b"a2", b"a3", b"late2", b"late3", b"after"] and end == p + 4
    else:
        end, got = run(takeover())
        # A's p+2 (origin below the no-op's at p+1) is stale, so ABSENT: the end; what survives of A is a prefix
        assert got == [b"a1", b"a2", b"a3", b"after"] and end == p + 2
