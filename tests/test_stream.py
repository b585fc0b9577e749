"""Streams end to end: real bookie processes and etcd.

Take-over after a writer crash, duelling writers, the seed's divergence
counterexample replayed on real bookies, rolling by size, trim, tailing
readers across rolls and ensemble changes, a restart of every bookie, and a
stream with very many fragments.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from bookie import entry as E
from bookie.core import Status
from metadata.ledgers import Fragment, LedgerStore
from metadata.store import Put
from stream import errors as se
from stream import mutations
from stream.bookie_client import BookieClient
from stream.quorum import write_set
from stream.stream import AsyncStreamClient, Position, StreamClient, StreamConfig
from tests.conftest import run


def sname() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def aclient(env, **kw) -> AsyncStreamClient:
    return AsyncStreamClient(env.endpoint, env.cluster, **kw)


async def read_all(sc: AsyncStreamClient, name: str, start=Position.EARLIEST, *, until=None) -> list:
    """Every record up to the LAC.  With ``until`` (a payload), long-polls
    until that record is read: an append is acknowledged before its LAC
    reaches the bookies (with the next entry, or the writer's explicit LAC
    once adds go quiet), so a reader sees it a moment later."""
    r = await sc.open_reader(name, start)
    out = []
    while True:
        got = await r.read(1000, timeout=10 if until is not None else 0)
        out.extend(got)
        if until is None and not got:
            return out
        if until is not None and (any(x.payload == until for x in got) or not got):
            return out


async def replicas(env, sc: AsyncStreamClient, name: str, entry_id: int) -> dict[str, tuple]:
    """What every bookie of the entry's write set holds for it."""
    info = await sc.stream_info(name)
    frag = await sc.bk.meta_call(sc.bk.ledgers.fragment_for, info["ledger_id"], entry_id)
    out = {}
    for i in write_set(entry_id, info["E"], info["Qw"]):
        bid = frag.ensemble[i]
        bc = await sc.bk.bookie(bid)
        r = await bc.read_entry(info["ledger_id"], entry_id)
        out[bid] = (Status(r.status), E.decode(r.entry).payload if r.status == Status.OK else None)
    return out


# -- the API ----------------------------------------------------------------------------


def test_produce_and_consume_with_the_blocking_api(shared):
    name = sname()
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_writer(name) as w:
            assert w.term == 1
            positions = [w.append(b"m%d" % i) for i in range(10)]
            futs = [w.append_async(b"m%d" % i) for i in range(10, 500)]
            w.flush()
            positions += [f.result() for f in futs]
        assert positions == sorted(positions) and len(set(positions)) == 500
        assert positions[0] > Position.EARLIEST and positions[-1] < Position.LATEST
        with sc.open_reader(name) as r:
            got = r.read(1000)
            assert [x.payload for x in got] == [b"m%d" % i for i in range(500)]  # no no-ops
            assert [x.position for x in got] == positions
            assert r.read(10, timeout=0.2) == []                               # nothing more yet
            r.seek(positions[100], inclusive=False)
            assert r.next(timeout=1).payload == b"m101"
        with sc.open_reader(name, positions[250]) as r:
            assert r.next(timeout=1).position == positions[250]
        assert name in sc.list_streams()


def test_positions_are_opaque_comparable_and_serializable():
    ps = [Position.EARLIEST, Position(0), Position(7), Position(1 << 40), Position.LATEST]
    assert ps == sorted(ps[::-1])
    for p in ps:
        assert Position.from_bytes(bytes(p)) == p and Position.parse(str(p)) == p
    with pytest.raises(ValueError):
        Position(-5)
    with pytest.raises(ValueError):
        Position.LATEST.entry_id


def test_latest_after_own_acknowledged_appends(shared):
    """A reader at LATEST opened, or sought, after appends its client's writer
    had acknowledged starts after them, though the ensemble has not learnt
    their LAC yet (explicit LAC held back here, so it never does)."""
    name = sname()

    async def go():
        async with aclient(shared, explicit_lac_delay=3600) as sc:
            w = await sc.open_writer(name)
            ps = await asyncio.gather(*(w.append_async(b"old%d" % i) for i in range(20)))
            r = await sc.open_reader(name, Position.LATEST)
            assert r.position == Position(ps[-1].entry_id + 1)
            await w.append(b"new0")
            r.seek(Position.LATEST)  # resolved by the next read
            assert await r.read(10) == []
            await w.append(b"new1")
            await w.append(b"new2")  # carries LAC 21 to the bookies
            assert [x.payload for x in await r.read(10, timeout=5)] == [b"new1"]
            await w.close()
    run(go())


def test_asyncio_api_tail_and_latest(shared):
    name = sname()

    async def go():
        async with aclient(shared) as sc:
            w = await sc.open_writer(name)
            await asyncio.gather(*(w.append_async(b"old%d" % i) for i in range(20)))
            r_all = await sc.open_reader(name, Position.EARLIEST)
            r_new = await sc.open_reader(name, Position.LATEST)
            seen = []

            async def tail():
                async for rec in r_new:
                    seen.append(rec.payload)
                    if len(seen) == 30:
                        return

            t = asyncio.create_task(tail())
            for i in range(30):
                await w.append(b"new%d" % i)
            await asyncio.wait_for(t, 20)
            assert seen == [b"new%d" % i for i in range(30)]  # LATEST: only what came after
            got = []
            while len(got) < 50:
                got += await r_all.read(100, timeout=5)
            assert [x.payload for x in got] == [b"old%d" % i for i in range(20)] + seen
            await w.close()
    run(go())


def test_reading_a_missing_stream_and_bad_input_give_typed_errors(shared):
    async def go():
        async with aclient(shared) as sc:
            with pytest.raises(se.NoSuchStream):
                await sc.open_reader("no-such-stream-" + uuid.uuid4().hex)
            with pytest.raises(se.NoSuchStream):
                await sc.open_writer("no-such-stream-" + uuid.uuid4().hex, create=False)
            with pytest.raises(se.InvalidLedgerConfig):
                await sc.open_writer(sname(), StreamConfig(ensemble_size=2, write_quorum=3, ack_quorum=2))
            with pytest.raises(se.NotEnoughBookies):
                await sc.open_writer(sname(), StreamConfig(ensemble_size=9, write_quorum=3, ack_quorum=2))
    run(go())


# -- closing the client with a writer open ---------------------------------------------------

# What the writer logs when it starts replacing a bookie (none of it may
# appear when the client, not a bookie, went away).
ENSEMBLE_CHANGE_LOG = re.compile(r"ensemble change|new fragment|bookie \S+ \(index \d+\) failed|replac")


def _ensemble_change_records(caplog) -> list:
    return [r for r in caplog.records
            if r.name.startswith("stream") and ENSEMBLE_CHANGE_LOG.search(r.getMessage())]


def _loud_records(caplog) -> list:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_closing_the_client_ends_an_open_writer_as_its_close_would(shared, caplog):
    """The application closes the client, not the writer, with appends in
    flight: the client's close waits for them (they are acknowledged), and
    ends the writer before it closes its bookie channels, so no bookie
    looks failed and no ensemble change is attempted.  The writer then
    refuses appends with ClientClosed; a new client reads every record."""
    caplog.set_level(logging.INFO)
    name = sname()

    async def go():
        # explicit LAC at once: its WriteLacs are often on their way when the
        # close tells the LAC (which must then await them, not let the
        # writer's stop cancel them: readers would see r0 only)
        sc = aclient(shared, explicit_lac_delay=0.0)
        w = await sc.open_writer(name)
        await w.append(b"r0")
        futs = [w.append_async(b"r%d" % i) for i in range(1, 300)]  # in flight at the close
        await sc.close()
        positions = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 30)
        assert all(isinstance(p, Position) for p in positions), positions
        with pytest.raises(se.ClientClosed):
            await w.append(b"late")
        with pytest.raises(se.ClientClosed):
            w.append_async(b"late")
        await w.close()  # already ended by the client: nothing left to do
        async with aclient(shared) as sc2:
            got = await read_all(sc2, name)
        assert [r.payload for r in got] == [b"r%d" % i for i in range(300)]
        assert [r.position for r in got[1:]] == positions

    run(go())
    assert _ensemble_change_records(caplog) == []
    assert _loud_records(caplog) == []


def test_closing_the_blocking_client_ends_its_open_writer_and_reader(shared, caplog):
    """The blocking API: appends still lingering in the writer's batch when
    the client closes are handed over and acknowledged; afterwards the
    writer and the reader raise ClientClosed, and closing them is a no-op."""
    caplog.set_level(logging.INFO)
    name = sname()
    sc = StreamClient(shared.endpoint, shared.cluster)
    w = sc.open_writer(name, StreamConfig(linger=10.0))
    first = w.append(b"r0")
    r = sc.open_reader(name)
    futs = [w.append_async(b"r%d" % i) for i in range(1, 300)]  # lingering: not handed over yet
    sc.close()
    positions = [f.result(timeout=30) for f in futs]
    assert positions == sorted(positions) and positions[0] > first
    with pytest.raises(se.ClientClosed):
        w.append(b"late")
    with pytest.raises(se.ClientClosed):
        w.append_async(b"late")
    with pytest.raises(se.ClientClosed):
        r.read(10)
    w.close()
    r.close()
    with StreamClient(shared.endpoint, shared.cluster) as sc2, sc2.open_reader(name) as r2:
        got = r2.read(1000)
    assert [x.payload for x in got] == [b"r%d" % i for i in range(300)]
    assert _ensemble_change_records(caplog) == []
    assert _loud_records(caplog) == []


# -- take-over ----------------------------------------------------------------------------


WRITER_SCRIPT = textwrap.dedent("""
    import sys
    from stream.stream import StreamClient
    endpoint, cluster, name = sys.argv[1:4]
    sc = StreamClient(endpoint, cluster)
    w = sc.open_writer(name)
    i = 0
    while True:
        futs = [(i + k, w.append_async(b"w1-%d" % (i + k))) for k in range(50)]
        for k, f in futs:
            print(k, f.result().entry_id, flush=True)
        i += 50
""")


def test_writer_crash_then_take_over_loses_nothing_acknowledged(shared):
    name = sname()
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, shared.endpoint, shared.cluster, name],
                            stdout=subprocess.PIPE, text=True)
    acked = {}
    try:
        for line in proc.stdout:
            k, eid = map(int, line.split())
            acked[eid] = b"w1-%d" % k
            if len(acked) >= 700:
                break
    finally:
        proc.kill()  # kill -9 with appends in flight
        proc.wait()

    async def go():
        async with aclient(shared) as sc:
            w2 = await sc.open_writer(name)
            assert w2.term == 2
            p = await w2.append(b"w2-first")
            got = await read_all(sc, name, until=b"w2-first")
            by_eid = {r.position.entry_id: r.payload for r in got}
            for eid, payload in acked.items():
                assert by_eid.get(eid) == payload, eid
            assert got[-1].payload == b"w2-first" and got[-1].position == p
            # everything the new writer recovered sits below its first append
            assert all(r.position < p for r in got[:-1])
            # a second reader agrees record for record
            assert await read_all(sc, name, until=b"w2-first") == got
    run(go())


@pytest.mark.parametrize("mutant", [None, mutations.TAKEOVER_KEEPS_TERM])
def test_two_writers_fight_the_older_gets_a_typed_error(shared, mutant):
    """With the life-cycle mutant (a take-over that does not raise the
    term) the older writer is not fenced: two writers of one term."""
    name = sname()

    async def go():
        async with aclient(shared) as a, aclient(shared, mutations=mutations.Mutations.of(mutant)) as b:
            w1 = await a.open_writer(name)
            ok1 = [await w1.append(b"a%d" % i) for i in range(5)]
            w2 = await b.open_writer(name)              # takes over: term 2
            if mutant:
                assert (w1.term, w2.term) == (1, 1)
                await w1.append(b"a-late")              # not fenced
                return
            assert (w1.term, w2.term) == (1, 2)
            with pytest.raises(se.WriterFenced) as e:
                await w1.append(b"a-late")
            assert not e.value.retriable and isinstance(e.value, se.NotWriter)
            ok2 = [await w2.append(b"b%d" % i) for i in range(5)]
            w1b = await a.open_writer(name)             # the application takes over again
            assert w1b.term == 3
            with pytest.raises(se.WriterFenced):
                await w2.append(b"b-late")
            ok3 = [await w1b.append(b"c%d" % i) for i in range(5)]
            got = await read_all(b, name, until=b"c4")
            assert [r.payload for r in got] == [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)] + \
                [b"c%d" % i for i in range(5)]
            assert [r.position for r in got] == ok1 + ok2 + ok3
            assert (await b.stream_info(name))["term"] == 3
    run(go())


@pytest.mark.parametrize("mutant", [None, mutations.NOOP_WITHOUT_TRUNCATE])
def test_the_seeds_counterexample_does_not_diverge_on_real_bookies(own, mutant):
    """c1 writes entries; entries 2 and 3 reach b1 only.  c2 takes over
    while b1 is stopped: b2 and b3 say entry 2 does not exist, so recovery
    ends with a truncate no-op at 2, which must reach b1 too.  b1's stale
    entry 3 is then gone, so c2's new entry 3 cannot diverge from it.

    The control run strips the no-op's truncate flag (a mutant): b1 then
    keeps its stale entry 3, below the new writer's LAC once it appends."""
    procs = own.start(3)
    name = sname()

    async def go():
        async with aclient(own) as c1, aclient(own, mutations=mutations.Mutations.of(mutant)) as c2:
            w1 = await c1.open_writer(name, StreamConfig(3, 3, 2))
            assert (await w1.append(b"A")).entry_id == 1            # entry 0: the take-over no-op
            info = await c1.stream_info(name)
            lid = info["ledger_id"]
            by_id = {p.bookie_id: p for p in procs}
            b1, b2, b3 = (by_id[b] for b in info["ensemble"])
            # c1's entries 2 and 3 reach b1 only (never acknowledged)
            raw = BookieClient(b1.address)
            stale = b"".join(E.encode(lid, e, b"stale-%d" % e, lac=1, term=1) for e in (2, 3))
            assert (await raw.add(stale)).status == Status.OK
            os.kill(b1.pid, signal.SIGSTOP)
            take = asyncio.ensure_future(c2.open_writer(name))
            # wait until the no-op at 2 is on b2 (recovery is past its reads)
            peek = BookieClient(b2.address)
            deadline = time.monotonic() + 20
            while True:
                r = await peek.read_entry(lid, 2)
                if r.status == Status.OK and E.decode(r.entry).is_noop:
                    break
                assert time.monotonic() < deadline, "recovery never wrote its no-op"
                await asyncio.sleep(0.01)
            assert not take.done()  # the no-op must reach every bookie, b1 included
            os.kill(b1.pid, signal.SIGCONT)
            w2 = await asyncio.wait_for(take, 30)
            r2 = await raw.read_entry(lid, 2)
            assert r2.status == Status.OK and E.decode(r2.entry).is_noop
            r3 = await raw.read_entry(lid, 3)
            if mutant:
                # nothing removed b1's stale entry 3: it now sits where the new
                # writer's entry 3 goes, a divergence as soon as b1 misses it
                assert r3.status == Status.OK and E.decode(r3.entry).payload == b"stale-3"
                return
            assert r3.status == Status.NO_SUCH_ENTRY           # the truncate removed the stale entry
            p = await w2.append(b"C")
            assert p.entry_id == 3
            got = await read_all(c2, name, until=b"C")
            assert [r.payload for r in got] == [b"A", b"C"]
            await w2.flush()
            assert set((await replicas(own, c2, name, 3)).values()) <= {(Status.OK, b"C")}
            await raw.close()
            await peek.close()

    run(go())


@pytest.mark.parametrize("ens_size", [4, 3], ids=["E4-Qw3-striped", "E3-Qw3-spread"])
def test_take_over_recovers_many_entries_past_the_lafr_with_a_few_range_reads(own, ens_size):
    """The old writer (Qw3 Qa2) dies mid-burst: 600 entries past its LAFR are
    on their whole write sets; the next one reached no bookie, and 3 after it
    one bookie each.  The new writer's recovery reads ahead with sparse range
    reads (a few per bookie, no per-entry reads), recovers the 600, ends at
    the hole (absent) and truncates the 3 strays above it.  With Qw = E the
    reads are spread: each entry is read from one bookie (the bookies serve
    the 600 once between them, not three times).  The counts leave speculation
    out: a bookie slower than ``speculative_read_timeout`` (100 ms, a loaded
    machine) makes the rest of its write sets asked too (its own test is
    test_take_over_asks_the_rest_when_a_spread_read_stalls), so c2 waits a
    minute before it speculates."""
    procs = own.start(ens_size)
    name = sname()
    PAST, STRAY = 600, 3

    async def go():
        async with aclient(own) as c1, aclient(own, speculative_read_timeout=60) as c2:
            w1 = await c1.open_writer(name, StreamConfig(ens_size, 3, 2))
            acked = [await w1.append(b"a%d" % i) for i in range(50)]
            await w1.flush()
            last = acked[-1].entry_id
            info = await c1.stream_info(name)
            lid, ens = info["ledger_id"], info["ensemble"]
            by_id = {p.bookie_id: p for p in procs}
            raw = {b: BookieClient(by_id[b].address) for b in ens}
            per_bookie: dict[str, list[bytes]] = {b: [] for b in ens}
            for k in [*range(PAST), *range(PAST + 1, PAST + 1 + STRAY)]:  # the hole: PAST
                eid = last + 1 + k
                r = E.encode(lid, eid, b"past-%d" % k, lac=last, lafr=last, term=w1.term)
                targets = write_set(eid, ens_size, 3) if k < PAST else write_set(eid, ens_size, 3)[:1]
                for i in targets:
                    per_bookie[ens[i]].append(r)
            for b, recs in per_bookie.items():
                assert (await raw[b].add(b"".join(recs))).status == Status.OK
            before = {b: await raw[b].info() for b in ens}

            w2 = await c2.open_writer(name)   # the take-over
            after = {b: await raw[b].info() for b in ens}
            ranges = {b: after[b].read_range_requests - before[b].read_range_requests for b in ens}
            entries = {b: after[b].read_entry_requests - before[b].read_entry_requests for b in ens}
            assert set(entries.values()) == {0}, entries          # no per-entry reads
            served = sum(after[b].read_range_entries - before[b].read_range_entries for b in ens)
            if ens_size == 3:  # spread: a block per bookie, then the hole and strays asked of the rest
                assert all(1 <= n <= 5 for n in ranges.values()), ranges
                assert PAST <= served <= PAST + 3 * STRAY, served
            else:
                assert all(1 <= n <= 3 for n in ranges.values()), ranges  # (one per window fill)
                assert served >= 3 * PAST, served  # every entry from each bookie holding it

            end = last + 1 + PAST
            p = await w2.append(b"w2-first")
            assert p.entry_id == end + 1                           # after the truncate no-op at `end`
            got = await read_all(c2, name, until=b"w2-first")
            assert [r.payload for r in got] == ([b"a%d" % i for i in range(50)] +
                                                [b"past-%d" % k for k in range(PAST)] + [b"w2-first"])
            assert [r.position.entry_id for r in got[50:-1]] == list(range(last + 1, end))
            for k in range(1, STRAY):                              # the strays are gone everywhere
                for b in ens:                                       # (end + 1 is w2's entry now)
                    assert (await raw[b].read_entry(lid, end + 1 + k)).status == Status.NO_SUCH_ENTRY
            for eid in (last + 1, last + PAST // 2, end - 1):      # recovered copies on whole write sets
                assert set((await replicas(own, c2, name, eid)).values()) == \
                    {(Status.OK, b"past-%d" % (eid - last - 1))}
            for c in raw.values():
                await c.close()

    run(go())


def test_take_over_asks_the_rest_when_a_spread_read_stalls(own, caplog):
    """Spread recovery reads (E3 Qw3: each entry read from one bookie): the
    first bookie a range read goes to is stopped as it is sent, so its block
    stalls; after speculative_read_timeout the driver asks the rest of the
    write sets (logged), the bookie is resumed then, and the take-over
    recovers every entry."""
    procs = own.start(3)
    name = sname()
    PAST = 600
    by_address = {p.address: p for p in procs}
    stopped: list = []
    real_read_range = BookieClient.read_range

    def read_range(self, *a, **kw):
        if kw.get("sparse") and not stopped:  # the take-over's first range read: its bookie stalls
            stopped.append(by_address[self.address])
            os.kill(stopped[0].pid, signal.SIGSTOP)
        return real_read_range(self, *a, **kw)

    class Resume(logging.Handler):
        def emit(self, record):
            if "recovery reads stalled" in record.getMessage() and stopped:
                os.kill(stopped[0].pid, signal.SIGCONT)

    resume = Resume()
    logging.getLogger("stream.ledger").addHandler(resume)
    caplog.set_level(logging.INFO, logger="stream.ledger")

    async def go():
        async with aclient(own) as c1, aclient(own) as c2:
            w1 = await c1.open_writer(name, StreamConfig(3, 3, 2))
            last = (await w1.append(b"a")).entry_id
            await w1.flush()
            info = await c1.stream_info(name)
            lid, ens = info["ledger_id"], info["ensemble"]
            recs = b"".join(E.encode(lid, last + 1 + k, b"past-%d" % k, lac=last, lafr=last, term=w1.term)
                            for k in range(PAST))
            for b in ens:  # on every bookie, never acknowledged
                raw = BookieClient(next(p.address for p in procs if p.bookie_id == b))
                assert (await raw.add(recs)).status == Status.OK
                await raw.close()
            BookieClient.read_range = read_range
            try:
                w2 = await c2.open_writer(name)   # the take-over
            finally:
                BookieClient.read_range = real_read_range
            assert stopped, "no range read was sent"
            p = await w2.append(b"w2-first")
            got = await read_all(c2, name, until=b"w2-first")
            assert [r.payload for r in got] == [b"a"] + [b"past-%d" % k for k in range(PAST)] + [b"w2-first"]
            assert p.entry_id == last + PAST + 2   # after the truncate no-op at last + PAST + 1

    try:
        run(go())
    finally:
        logging.getLogger("stream.ledger").removeHandler(resume)
        for p in stopped:
            os.kill(p.pid, signal.SIGCONT)
    assert any("recovery reads stalled" in r.getMessage() for r in caplog.records)


# -- fragments: rolling, trimming, tailing ------------------------------------------------------


def test_rolling_by_size_spreads_the_stream_and_trim_removes_old_fragments(shared):
    name = sname()

    async def go():
        async with aclient(shared) as sc:
            w = await sc.open_writer(name, StreamConfig(3, 2, 2, fragment_size_entries=40))
            ps = []
            for i in range(0, 400, 20):
                ps += await asyncio.gather(*(w.append_async(b"r%d" % k) for k in range(i, i + 20)))
            info = await sc.stream_info(name)
            assert info["fragments"] >= 8
            lid = info["ledger_id"]
            frags = [Fragment.from_bytes(v.value) for _, v in
                     await sc.bk.meta_call(sc.bk.store.range, sc.bk.ledgers.layout.fragments_prefix(lid))]
            assert len({f.ensemble for f in frags}) > 1            # fresh ensembles over 4 bookies
            got = await read_all(sc, name, until=b"r399")
            assert [r.payload for r in got] == [b"r%d" % k for k in range(400)]

            # trim below entry 200: whole fragments below it go, from etcd and the bookies
            cut = ps[200]
            removed = await sc.trim(name, cut)
            assert removed >= 3
            info2 = await sc.stream_info(name)
            assert info2["trimmed_before"] == cut.entry_id
            keys = await sc.bk.meta_call(sc.bk.store.range, sc.bk.ledgers.layout.fragments_prefix(lid))
            left = [Fragment.from_bytes(v.value) for _, v in keys]
            # the header's count matches the keys (a roll may have added one since)
            assert len(left) == info2["fragments"] and len(left) <= info["fragments"] + 1 - removed
            # the fragment holding the cut is the oldest left
            assert left[0].first_entry <= cut.entry_id < (left[1].first_entry if len(left) > 1 else 1 << 62)
            assert [f for f in frags if f.first_entry < left[0].first_entry][-removed:] and \
                all(f not in left for f in frags if f.first_entry < left[0].first_entry)
            with pytest.raises(se.PositionTrimmed):
                await sc.open_reader(name, ps[10])
            rest = await read_all(sc, name, until=b"r399")   # EARLIEST is now the trim point
            assert [r.payload for r in rest] == [b"r%d" % k for k in range(200, 400)]
            old = frags[0]                                   # its bookies deleted the data
            for bid in old.ensemble:
                bc = await sc.bk.bookie(bid)
                assert (await bc.read_entry(lid, 1)).status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER)
            await w.append(b"after-trim")
            assert (await read_all(sc, name, ps[399], until=b"after-trim"))[-1].payload == b"after-trim"
    run(go())


def test_a_writer_closing_as_a_roll_falls_due_leaves_its_lac_on_the_last_fragment(shared):
    """The writer closes right after the last entry of a full fragment was
    acknowledged: the roll to the next fragment is under way (often not
    published before the writer stops).  The closing LAC must still reach
    the bookies of the last published fragment, so a reader opened after the
    close sees every record.  Several streams: the race went wrong in most
    runs before the fix (the closing LAC was skipped during a change)."""

    async def go():
        async with aclient(shared) as sc:
            for _ in range(4):
                name = sname()
                w = await sc.open_writer(name, StreamConfig(3, 3, 2, fragment_size_entries=200))
                for i in range(0, 600, 100):
                    await asyncio.gather(*(w.append_async(b"c%d" % k) for k in range(i, i + 100)))
                await w.flush()
                await w.close()
                got = await read_all(sc, name)   # up to the covering LAC, no waiting
                assert [r.payload for r in got] == [b"c%d" % k for k in range(600)], \
                    (name, len(got), await sc.stream_info(name))
    run(go())


def test_readers_tail_while_the_writer_rolls_and_changes_ensembles(own):
    procs = own.start(5)
    name = sname()

    async def go():
        async with aclient(own, add_timeout=2.0) as sc, aclient(own) as rc:
            w = await sc.open_writer(name, StreamConfig(3, 3, 2, fragment_size_entries=60))
            await w.append(b"t0")
            readers = [await rc.open_reader(name) for _ in range(2)]
            seen = [[], []]

            async def tail(k):
                async for rec in readers[k]:
                    seen[k].append(rec.payload)
                    if len(seen[k]) == 600:
                        return

            tails = [asyncio.create_task(tail(k)) for k in range(2)]
            for i in range(1, 600, 25):
                await asyncio.gather(*(w.append_async(b"t%d" % k) for k in range(i, min(i + 25, 600))))
                if i == 301:  # kill a bookie of the current ensemble: an ensemble change
                    cur = (await sc.stream_info(name))["ensemble"]
                    victim = next(p for p in procs if p.bookie_id == cur[0])
                    victim.kill()
            await asyncio.wait_for(asyncio.gather(*tails), 60)
            want = [b"t%d" % k for k in range(600)]
            assert seen[0] == want and seen[1] == want
            assert (await sc.stream_info(name))["fragments"] >= 10
    run(go())


def test_restart_of_every_bookie_keeps_the_stream(own):
    procs = own.start(3)
    name = sname()

    async def go_write():
        async with aclient(own) as sc:
            w = await sc.open_writer(name, StreamConfig(3, 3, 2))
            return await asyncio.gather(*(w.append_async(b"x%d" % i) for i in range(300)))

    ps = run(go_write())
    for p in procs:
        p.kill()
    for p in procs:
        p.start()

    async def go_check():
        async with aclient(own) as sc:
            w = await sc.open_writer(name)
            nxt = await w.append(b"after")
            got = await read_all(sc, name, until=b"after")
            assert [r.payload for r in got] == [b"x%d" % i for i in range(300)] + [b"after"]
            assert [r.position for r in got[:300]] == list(ps) and nxt > ps[-1]
    run(go_check())


def test_a_stream_with_very_many_fragments_opens_appends_and_reads(shared, store):
    """100,000 fragments in etcd (written straight into the key layout, each
    over the same 3 bookies): open, append and read touch only the newest few."""
    n = 100_000
    name = sname()

    async def setup():
        async with aclient(shared) as sc:
            w = await sc.open_writer(name, StreamConfig(3, 3, 2))
            await w.append(b"seed")
            info = await sc.stream_info(name)
            await w.close()
            return info

    info = run(setup())
    lid, ens = info["ledger_id"], tuple(info["ensemble"])
    ls = LedgerStore(store, shared.cluster)
    layout = ls.layout
    # fragments k*10 for k = 1..n over the same ensemble: the stream's
    # entries 0..1 stay in fragment 0; the new writer starts far above
    t0 = time.monotonic()
    batch = []
    for k in range(1, n + 1):
        batch.append(Put(layout.fragment_key(lid, k * 10), Fragment(k * 10, ens).to_bytes()))
        if len(batch) == 120:
            store.txn([], batch)
            batch = []
    if batch:
        store.txn([], batch)
    meta, rev = ls.read(lid, fragments="last")
    hdr = meta.with_(fragment_count=n + 1, last_fragment_first_entry=n * 10)
    ls.update_header(hdr, rev)
    setup_s = time.monotonic() - t0

    async def go():
        async with aclient(shared) as sc:
            t = time.monotonic()
            w = await sc.open_writer(name)
            p = await w.append(b"far")
            r = await sc.open_reader(name, p)
            got = await r.read(10, timeout=5)
            elapsed = time.monotonic() - t
            # the oldest entries are still there, found through fragment 0
            first = await (await sc.open_reader(name, Position.EARLIEST)).read(2)
            return p, got, elapsed, first

    p, got, elapsed, first = run(go())
    assert p.entry_id > n * 10 and [x.payload for x in got] == [b"far"]
    assert [x.payload for x in first] == [b"seed"]
    print(f"\n{n} fragments: setup {setup_s:.1f}s, open+append+read {elapsed:.2f}s")


def test_take_over_replaces_an_unreachable_bookie_of_the_last_fragment(own):
    """The truncate no-op must reach every bookie of the last fragment; one
    that cannot be reached is replaced by an ensemble change published with
    recovery's final CAS, so it cannot keep dirty entries in the fragment."""
    procs = own.start(4)
    name = sname()

    async def go():
        async with aclient(own) as c1, aclient(own, add_timeout=1.0, read_timeout=1.0) as c2:
            w1 = await c1.open_writer(name, StreamConfig(3, 3, 2))
            await asyncio.gather(*(w1.append_async(b"v%d" % i) for i in range(50)))
            before = (await c1.stream_info(name))["ensemble"]
            stuck = next(p for p in procs if p.bookie_id == before[1])
            os.kill(stuck.pid, signal.SIGSTOP)
            w2 = await c2.open_writer(name)
            info = await c2.stream_info(name)
            assert stuck.bookie_id not in info["ensemble"] and info["fragments"] == 2
            await w2.append(b"after")
            got = await read_all(c2, name, until=b"after")
            assert [r.payload for r in got] == [b"v%d" % i for i in range(50)] + [b"after"]
    run(go())


def test_append_many_returns_positions_in_order_and_fails_whole_after_a_take_over(shared):
    name = sname()

    async def go():
        async with aclient(shared, max_pending_adds=100) as sc, aclient(shared) as other:
            w = await sc.open_writer(name)
            first = await w.append(b"one")
            batch = [b"m%d" % i for i in range(40)]
            ps = await w.append_many(batch)
            assert len(ps) == 40 and list(ps) == [Position(first.entry_id + 1 + i) for i in range(40)]
            assert ps[-1] == Position(first.entry_id + 40) and ps[1:3] == [ps[1], ps[2]]
            assert list(await w.append_many([])) == []
            futs = [w.append_many_async([b"f%d-%d" % (k, i) for i in range(10)]) for k in range(5)]
            got = await asyncio.gather(*futs)
            assert [p.entry_id for ps_ in got for p in ps_] == list(range(42, 92))
            with pytest.raises(se.TooManyPendingAdds):
                w.append_many_async([b"x"] * 30)  # no ack is handled between these calls: 120 > 100
                w.append_many_async([b"y"] * 30)
                w.append_many_async([b"z"] * 30)
                w.append_many_async([b"w"] * 30)
            with pytest.raises(ValueError):
                w.append_many_async([b"x"] * 101)   # more than the window, ever
            await w.flush()
            got = await read_all(other, name)
            assert [r.payload for r in got][:91] == [b"one"] + batch + [b"f%d-%d" % (k, i) for k in range(5)
                                                                         for i in range(10)]
            w2 = await other.open_writer(name)        # takes over: w's next batch fails as a whole
            with pytest.raises(se.WriterFenced):
                await w.append_many([b"late1", b"late2"])
            assert (await w2.append_many([b"after"]))[0].entry_id > ps[-1].entry_id
            await w2.close()
    run(go())


def test_the_blocking_writer_hands_batches_over_and_resolves_every_append(shared):
    name = sname()
    with StreamClient(shared.endpoint, shared.cluster, max_pending_adds=64) as sc:
        with sc.open_writer(name, StreamConfig(linger=0.05)) as w:
            futs = [w.append_async(b"r%d" % i) for i in range(500)]   # batches above half the window
            positions = [f.result(timeout=30) for f in futs]
        assert [p.entry_id for p in positions] == list(range(positions[0].entry_id, positions[0].entry_id + 500))
        with sc.open_reader(name) as r:
            got = []
            while len(got) < 500:
                got += r.read(1000, timeout=5)
        assert [x.payload for x in got] == [b"r%d" % i for i in range(500)]


def test_a_reader_s_read_ahead_stays_within_its_bytes(shared):
    """read_ahead_bytes bounds what a reader holds ahead (records read but
    not returned, and chunks under way), not an entry count."""
    name = sname()

    async def go():
        async with aclient(shared) as sc:
            w = await sc.open_writer(name)
            await w.append_many([b"r%03d" % i for i in range(60)])   # 4 bytes each
            await w.flush()
            with pytest.raises(ValueError):
                await sc.open_reader(name, read_ahead_bytes=-1)
            r = await sc.open_reader(name, read_ahead_bytes=20)
            got, most, ahead = [], 0, 0
            while len(got) < 60:
                got += await r.read(7, timeout=10)
                held = (len(r._held) + sum(b - a + 1 for a, b, _ in r._aheads)) * r._entry_bytes
                most, ahead = max(most, held), ahead + bool(r._aheads)
            assert 0 < most <= 20 and ahead >= 5    # it read ahead, never more than 20 bytes
            assert [x.payload for x in got] == [b"r%03d" % i for i in range(60)]
            await r.close()
            r = await sc.open_reader(name, read_ahead_bytes=0)   # none at all
            got = []
            while len(got) < 60:
                got += await r.read(7, timeout=10)
                assert not r._aheads
            assert [x.payload for x in got] == [b"r%03d" % i for i in range(60)]
            await r.close()
            await w.close()
    run(go())


def test_a_large_batch_is_bounded_by_the_read_ahead_bytes(shared):
    """A read of many large records fetches at most read_ahead_bytes itself
    (a first read probes PROBE_ENTRIES to learn the entry size): a
    catch-up of 64 KiB entries read 5,000 at a time held 330 MB in one
    batch. Without a read-ahead the batch is the caller's bound."""
    from stream.record_batch import RecordBatch
    from stream.stream_reader import PROBE_ENTRIES

    name = sname()
    payloads = [bytes([i % 251]) * 1000 for i in range(200)]

    async def go():
        async with aclient(shared) as sc:
            w = await sc.open_writer(name)
            await w.append_many(payloads)
            await w.flush()
            r = await sc.open_reader(name, read_ahead_bytes=4000)
            # (internal: a chunk of no-ops alone, as a take-over's, says nothing of the size)
            r._keep(RecordBatch(), 0)   # (entry 0 read: a no-op, no record)
            assert r._entry_bytes == 0 and r._fetch_entries(200) == PROBE_ENTRIES
            r.seek(Position.EARLIEST)
            batches = []
            while sum(map(len, batches)) < 200:
                batches.append(await r.read(200, timeout=10))
            assert 4 < len(batches[0]) <= PROBE_ENTRIES + 4   # the probe, then 4,000 bytes
            assert max(sum(len(x.payload) for x in b) for b in batches[1:]) <= 2 * 4000
            assert [x.payload for b in batches for x in b] == payloads
            await r.close()
            r = await sc.open_reader(name, read_ahead_bytes=0)
            got = await r.read(200, timeout=10)
            assert len(got) > 100
            while len(got) < 200:   # (the LAC reaches the bookies a moment after the ack)
                got += await r.read(200, timeout=10)
            assert [x.payload for x in got] == payloads
            await r.close()
            await w.close()
    run(go())


def test_a_reader_reading_ahead_serves_every_record_once_in_order_across_seeks(shared):
    name = sname()

    async def go():
        async with aclient(shared) as sc:
            w = await sc.open_writer(name, StreamConfig(fragment_size_entries=9))  # reads cross fragments
            ps = []
            for k in range(10):
                ps += await w.append_many([b"r%d" % (10 * k + i) for i in range(10)])
            await w.flush()
            r = await sc.open_reader(name, read_ahead_bytes=40)   # chunks of a few entries
            got, ahead, two = [], 0, 0
            while len(got) < 100:   # (the last LAC reaches the bookies a moment after the ack)
                size = 7 if len(got) < 50 else 3  # a smaller batch than the read-aheads were made for
                batch = await r.read(size, timeout=10)
                assert 0 < len(batch) <= size
                ahead += len(r._aheads) > 0
                two += len(r._aheads) >= 2
                got += batch
            assert ahead >= 10 and two >= 5  # the next batches were on their way after most reads
            assert [x.payload for x in got] == [b"r%d" % i for i in range(100)]
            assert [x.position for x in got] == list(ps)
            r.seek(ps[40])                              # back, while a read-ahead may be under way
            assert [x.payload for x in await r.read(5)] == [b"r%d" % i for i in range(40, 45)]
            r.seek(ps[90], inclusive=False)
            assert [x.payload for x in await r.read(100)] == [b"r%d" % i for i in range(91, 100)]
            assert await r.read(10) == []
            await w.append(b"tail")
            assert [x.payload for x in await r.read(10, timeout=10)] == [b"tail"]
            await r.close()
            await w.close()
    run(go())
