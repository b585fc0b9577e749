"""Range reads of striped streams (E > Qw) on real bookies: a range's
residues are shared out in arcs, each served whole by a bookie that holds
it (stream/read_plan.py) through the stripe filter of a sparse range read;
the reader puts the shares in id order.  Exactly
the appended entries come back, in order, across fragments, rolls and a
killed bookie; no entry is read one request at a time while every bookie
answers, and each is served once."""
from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from bookie import entry as E
from bookie.core import Status
from stream.bookie_client import BookieClient
from stream.quorum import write_set
from stream.read_plan import arcs
from stream.stream import AsyncStreamClient, Position, StreamConfig
from tests.conftest import run


def sname() -> str:
    return f"striped-{uuid.uuid4().hex[:8]}"


async def read_all(sc: AsyncStreamClient, name: str, batch: int = 1000) -> list:
    r = await sc.open_reader(name, Position.EARLIEST)
    out = []
    try:
        while True:
            got = await r.read(batch)
            if not got:
                return out
            out.extend(got)
    finally:
        await r.close()


async def write(sc: AsyncStreamClient, name: str, config: StreamConfig, payloads: list[bytes]) -> None:
    """Appends ``payloads`` to a new stream, 100 at a time, and closes the
    writer (which tells the ensemble the LAC)."""
    w = await sc.open_writer(name, config)
    for k in range(0, len(payloads), 100):
        await w.append_many(payloads[k:k + 100])
    await w.close()


async def counters(procs) -> dict:
    out = {}
    for p in procs:
        bc = BookieClient(p.address)
        try:
            out[p.bookie_id] = await bc.info()
        finally:
            await bc.close()
    return out


@pytest.mark.parametrize("window", [None, 7], ids=["windows-default", "windows-of-7"])
@pytest.mark.parametrize("e,qw,bookies", [(4, 2, 4), (5, 3, 6)], ids=["E4-Qw2", "E5-Qw3"])
def test_striped_reads_return_every_entry_in_order_across_rolls_each_served_once(own, e, qw, bookies, window):
    """(Windows of 7 ids: the bookies' stripe views cover a few ids each,
    frames end at their ends, and the reader goes on.)"""
    procs = own.start(bookies, () if window is None else ("--stripe-view-window-ids", str(window)))
    name = sname()
    payloads = [b"p%d-" % i + b"x" * (i % 97) for i in range(1500)]

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            await write(sc, name, StreamConfig(e, qw, 2, fragment_size_entries=230), payloads)
            assert (await sc.stream_info(name))["fragments"] >= 6
            before = await counters(procs)
            got = await read_all(sc, name, batch=700)
            after = await counters(procs)
            assert [r.payload for r in got] == payloads
            assert [r.position.entry_id for r in got] == list(range(1, len(payloads) + 1))  # (0: the no-op)
            per_entry = sum(after[b].read_entry_requests - before[b].read_entry_requests for b in after)
            served = sum(after[b].read_range_entries - before[b].read_range_entries for b in after)
            assert per_entry == 0                               # no entry read one at a time
            assert served == len(payloads) + 1                  # each entry served once (with the no-op)
            busy = [b for b in after if after[b].read_range_entries > before[b].read_range_entries]
            # the bookies share the work: a range's arcs go to E/Qw of them (rounded up); which
            # ones turns with the rotation and the fragments' ensembles (tests/test_read_plan.py)
            assert len(busy) >= -(-e // qw)

    run(go())


def test_striped_reads_survive_a_killed_bookie(own):
    procs = own.start(4)
    name = sname()
    payloads = [b"k%d" % i for i in range(800)]

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            await write(sc, name, StreamConfig(4, 2, 2, fragment_size_entries=300), payloads)
            ens = (await sc.stream_info(name))["ensemble"]
        victim = next(p for p in procs if p.bookie_id == ens[1])
        victim.kill()
        async with AsyncStreamClient(own.endpoint, own.cluster, read_timeout=2.0) as sc:
            got = await read_all(sc, name, batch=250)
            assert [r.payload for r in got] == payloads
            # once quarantined, the victim's share goes to the other member of its write sets
            rd = await sc.open_reader(name, Position.EARLIEST)
            got = []
            while len(got) < len(payloads):
                got.extend(await rd.read(250))
            await rd.close()
            assert [r.payload for r in got] == payloads

    run(go())


def test_a_stopped_bookie_s_arc_is_read_from_the_other_members_of_its_write_sets(own):
    """The bookie that holds one of a range's arcs is stopped (SIGSTOP)
    after the writes: the reader's range read to it hands over after the
    first-frame wait (20 speculative timeouts) to the other members of the
    arc's write sets, by range reads (no entry read one at a time), and
    returns exactly what was appended, before the read timeout."""
    procs = own.start(4)
    name = sname()
    payloads = [b"s%d-" % i + b"z" * 50 for i in range(900)]

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            await write(sc, name, StreamConfig(4, 2, 2), payloads)
            info = await sc.stream_info(name)
        assert info["fragments"] == 1
        # (a reader that does not spread starts a ledger's arcs at its id: stream/ledger_read.py)
        idx = arcs(4, 2, info["ledger_id"])[0][0]
        stopped = next(p for p in procs if p.bookie_id == info["ensemble"][idx])
        others = [p for p in procs if p is not stopped]
        before = await counters(others)
        loop = asyncio.get_running_loop()
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            async with AsyncStreamClient(own.endpoint, own.cluster, read_timeout=30.0,
                                         speculative_read_timeout=0.05) as sc:
                t0 = loop.time()
                got = await asyncio.wait_for(read_all(sc, name), 60.0)
                took = loop.time() - t0
            after = await counters(others)
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        assert [r.payload for r in got] == payloads
        assert sum(after[b].read_entry_requests - before[b].read_entry_requests for b in after) == 0
        assert sum(after[b].read_range_entries - before[b].read_range_entries for b in after) >= len(payloads)
        # it was asked first (a first frame waited for, 20 x 50 ms), then handed over, not after the read timeout
        assert 20 * 0.05 <= took < 30.0, took

    run(go())


def test_a_bookie_serves_only_the_stripe_asked_and_vouches_for_it(own):
    """The stripe filter on one bookie: a sparse range read with stripe 4
    and residues {0, 3} returns exactly the held ids of those residues; a
    frame vouches (``through``) only for them; a bad filter is BAD_REQUEST."""
    (p,) = own.start(1)

    async def go():
        bc = BookieClient(p.address)
        lid = 4242
        held = [i for i in range(200) if i % 4 in (0, 3, 1) and i != 40]   # 40: a hole
        recs = [E.encode(lid, i, b"v%d" % i + b"." * 100, term=1) for i in held]
        assert (await bc.add(b"".join(recs))).status == Status.OK
        got, throughs = [], []
        async for resp in bc.read_range(lid, 10, 150, sparse=True, stripe=4, residues=0b1001,
                                        max_frame_bytes=1000):
            assert resp.status == Status.OK
            got += [eid for eid, _, _ in E.record_spans(resp.entries)]
            throughs.append(resp.through)
        assert got == [i for i in range(10, 151) if i % 4 in (0, 3) and i != 40]
        assert len(throughs) > 3 and throughs[-1] == 150 and throughs == sorted(throughs)
        for stripe, residues, sparse in ((4, 0, True), (4, 16, True), (65, 1, True), (4, 1, False), (0, 1, True)):
            frames = [r async for r in bc.read_range(lid, 0, 10, sparse=sparse, stripe=stripe, residues=residues)]
            assert [f.status for f in frames] == [Status.BAD_REQUEST], (stripe, residues, sparse)
        await bc.close()

    run(go())


def _rot(proc, marker: bytes) -> None:
    """Flips one byte of the record holding ``marker`` in the bookie's
    journal (its page cache sees it at once): bytes changed on disk after
    they were acknowledged."""
    for seg in sorted((proc.data_dir / "journal").glob("segment-*.log")):
        data = seg.read_bytes()
        at = data.find(marker)
        if at >= 0:
            with open(seg, "r+b") as f:
                f.seek(at)
                f.write(b"X")
            return
    raise AssertionError(f"{marker!r} not in {proc.bookie_id}'s journal")


@pytest.mark.parametrize("e,qw", [(3, 3), (4, 2)], ids=["E3-Qw3", "E4-Qw2"])
def test_a_reader_reads_around_records_rotted_on_every_bookie(own, e, qw):
    """Range reads ask the bookies to serve records unchecked (the reader
    checks every checksum itself: ``reader_verifies``).  With a record
    rotted on every bookie, each on another entry, a reader still returns
    exactly what was appended: the rotted copy fails the reader's check and
    the entry is read from a replica that holds it intact."""
    procs = own.start(e)
    name = sname()
    payloads = [b"rot-%05d-" % i + b"y" * 200 for i in range(600)]

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            await write(sc, name, StreamConfig(e, qw, 2), payloads)
            ens = (await sc.stream_info(name))["ensemble"]
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            got = await read_all(sc, name)
            assert [r.payload for r in got] == payloads

        def holds(k: int, j: int) -> bool:   # record k is on ensemble position j
            return j in write_set(got[k].position.entry_id, e, qw)

        # the bookie at position j loses its first record from index 100 * j + 50 on
        for j, bid in enumerate(ens):
            k = next(k for k in range(100 * j + 50, len(got)) if holds(k, j))
            _rot(next(p for p in procs if p.bookie_id == bid), b"rot-%05d-" % k)
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            for batch in (1000, 37):
                got = await read_all(sc, name, batch=batch)
                assert [r.payload for r in got] == payloads

    run(go())
