"""Client robustness (issue 12 items 0b, 2, 3, 7; issue 19 items 2, 3):
typed errors for bad configuration, oversized entries refused before they
are sent, the blocking writer's order under back-pressure, a writer that
survives a lost bookie with no spare, take-overs that do not burn terms,
bookie health as a score, and no asyncio task left behind.  Real etcd and
real bookie processes, except for the pure pieces (placement, health)."""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import uuid
from types import SimpleNamespace

import pytest

from stream import errors as se
from stream.client import BookKeeperClient, ClientConfig
from stream.placement import BookieHealth, RandomPlacement, choose_with_fallback
from stream.stream import AsyncStreamClient, Position, StreamClient, StreamConfig
from tests.conftest import run


def sname() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


async def read_n(sc: AsyncStreamClient, name: str, n: int) -> list[bytes]:
    """The first ``n`` payloads of the stream, long-polling for the LAC (it
    reaches the bookies a moment after the writer's acknowledgement)."""
    r = await sc.open_reader(name)
    out: list[bytes] = []
    while len(out) < n:
        got = await r.read(n - len(out), timeout=10)
        assert got, f"only {len(out)} of {n} records"
        out += [x.payload for x in got]
    await r.close()
    return out


# -- typed errors (12.7) ------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: StreamClient(""),
    lambda: StreamClient([]),
    lambda: AsyncStreamClient(","),
    lambda: StreamClient("127.0.0.1:1", max_pending_adds=0),
    lambda: StreamClient("127.0.0.1:1", no_such_option=1),
    lambda: StreamConfig(fragment_size_bytes=-1),
    lambda: StreamConfig(fragment_size_entries=-5),
    lambda: StreamConfig(ensemble_size=2, write_quorum=3),
    lambda: StreamConfig(linger=-1.0),
    lambda: StreamConfig(max_batch_bytes=0),
    lambda: StreamConfig(placement="nearest"),
    lambda: ClientConfig(add_timeout=0),
])
def test_bad_configuration_is_a_typed_error_at_construction(make):
    with pytest.raises(se.InvalidLedgerConfig) as ei:
        make()
    assert not ei.value.retriable


# -- placement and health (19.2), pure ---------------------------------------------------------


def regs(*ids, read_only=()):
    return [SimpleNamespace(bookie_id=b, read_only=b in read_only, free_bytes=0) for b in ids]


def test_health_is_a_score_that_fades_and_is_forgiven_by_an_answer_or_a_new_registration():
    h = BookieHealth(half_life=10.0)
    h.on_registrations({"a": 5, "b": 6})
    h.on_failure("a", now=100.0, reason="add timed out")
    h.on_failure("b", now=100.0)
    h.on_failure("b", now=101.0)
    assert [b for b, _ in h.suspects(101.0)] == ["a", "b"]  # the least suspect first
    assert "add timed out" in dict(h.suspects(101.0))["a"]
    assert h.suspects(100.0 + 10.0 * 1.01) and "a" not in dict(h.suspects(100.0 + 10.0 * 1.01))  # faded
    h.on_success("b")  # it answered
    assert h.suspects(102.0) == []
    h.on_failure("a", now=200.0)
    h.on_registrations({"a": 5})  # the same registration: still suspect
    assert "a" in dict(h.suspects(200.0))
    h.on_registrations({"a": 9})  # registered anew (restarted): usable at once
    assert h.suspects(200.0) == []


def test_placement_avoids_suspects_but_tries_them_before_giving_up():
    pol = RandomPlacement()
    cands = regs("a", "b", "c", "d", "e", read_only=("e",))
    avoid = [("c", "failed 1.0 s ago (x)"), ("d", "failed 0.5 s ago (y)")]
    for _ in range(20):
        assert set(choose_with_fallback(pol, cands, 2, {}, avoid)) == {"a", "b"}
        assert set(choose_with_fallback(pol, cands, 3, {}, avoid)) == {"a", "b", "c"}  # least suspect first
    assert set(choose_with_fallback(pol, cands, 4, {}, avoid)) == {"a", "b", "c", "d"}
    with pytest.raises(se.NotEnoughBookies) as ei:
        choose_with_fallback(pol, cands, 3, {"a": "in the ensemble", "b": "in the ensemble"}, avoid)
    e = ei.value
    assert e.retriable and e.needed == 3 and e.available == 0
    assert e.excluded == {"a": "in the ensemble", "b": "in the ensemble", "c": "failed 1.0 s ago (x)",
                          "d": "failed 0.5 s ago (y)", "e": "read-only"}
    assert "c: failed 1.0 s ago (x)" in str(e) and "e: read-only" in str(e)


# -- oversized entries (12.2) ---------------------------------------------------------------------


def test_an_oversized_append_is_refused_alone_and_nothing_is_marked_failed(own):
    own.start(3, extra_args=["--max-entry-size", "1000"])
    name = sname()

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            w = await sc.open_writer(name)
            assert sc.bk.max_entry_size == 1000  # published by the bookies' registrations
            p0 = await w.append(b"x" * 1000)
            for size in (1001, 100 << 20):
                with pytest.raises(se.EntryTooLarge) as ei:
                    await w.append(b"y" * size)
                assert not ei.value.retriable and ei.value.limit == 1000 and ei.value.size == size
            with pytest.raises(se.EntryTooLarge):  # a batch holding one: all or none
                w.append_many_async([b"a", b"b" * 2000, b"c"])
            with pytest.raises(se.EntryTooLarge):
                await w.append_many([b"a", b"b" * 2000])
            ps = await w.append_many([b"d", b"e"])
            assert [p.entry_id for p in ps] == [p0.entry_id + 1, p0.entry_id + 2]  # nothing else was queued
            assert sc.bk.quarantined() == set() and w.handle.writable
            assert await read_n(sc, name, 3) == [b"x" * 1000, b"d", b"e"]
        # the blocking API: the same error, for that append alone
        with StreamClient(own.endpoint, own.cluster) as bsc:
            with bsc.open_writer(name) as bw:
                f = bw.append_async(b"z" * 5000)
                with pytest.raises(se.EntryTooLarge):
                    f.result(10)
                assert bw.append(b"after") > Position(0)
    run(go())


# -- the blocking writer's order (12.0b) -------------------------------------------------------------


def _pause(proc):
    os.kill(proc.pid, signal.SIGSTOP)


def _resume(proc):
    os.kill(proc.pid, signal.SIGCONT)


def test_the_blocking_writer_keeps_one_threads_order_when_the_window_is_full(own):
    """A window of 8 and a paused bookie (E3 Qw3 Qa2: nothing reaches Qw, so
    nothing leaves the window): a batch of 6 fills it, the next batch of 6
    is refused and waits, and a later batch of 1 would fit.  It must not
    overtake the waiting one (it did: m12 was acknowledged before m6..m11)."""
    procs = own.start(3)
    name = sname()
    with StreamClient(own.endpoint, own.cluster, max_pending_adds=8, add_timeout=60.0) as sc:
        cfg = StreamConfig(linger=30.0)  # batches end only where the test hands them over
        with sc.open_writer(name, cfg) as w:
            ensemble = sc.stream_info(name)["ensemble"]
            paused = next(p for p in procs if p.bookie_id == ensemble[2])
            _pause(paused)
            try:
                futs = []
                for size in (6, 6, 1, 1, 3, 6, 2):
                    futs += [w.append_async(b"m%d" % (len(futs) + k)) for k in range(size)]
                    w.flush_batch()
                    sc._run(asyncio.sleep(0))  # the loop ran the hand-over (call_soon is FIFO)
                assert not futs[7].done()
            finally:
                _resume(paused)
            positions = [f.result(60) for f in futs]
            assert positions == sorted(positions) and len(set(positions)) == len(positions)
            assert positions[-1].entry_id - positions[0].entry_id == len(futs) - 1
        with sc.open_reader(name) as r:
            got = r.read(100, timeout=5)
        assert [x.payload for x in got] == [b"m%d" % i for i in range(len(futs))]


# -- a lost bookie with no spare (12.3) ---------------------------------------------------------------


async def _released(handle) -> None:
    """Until every add of the writer is released (reached Qw): an event per
    drain of the writer, no polling."""
    w = handle._writer
    while w.core.pending:
        await w.progress()


async def _failed(handle, bookie_id: str) -> None:
    """Until the writer holds ``bookie_id`` failed.  Not an instant check:
    while a failed bookie waits for a spare, the writer retries it after a
    back-off (``WriterCore.retry_failed`` clears ``failed``, the retried
    send fails and marks it again), so between the two it is in no list."""
    w = handle._writer
    while bookie_id not in w.core.failed.values():
        await w.progress()


@pytest.mark.parametrize("then", ["the bookie returns", "a spare registers"])
def test_a_writer_goes_on_at_qa_without_a_spare_and_resumes_when_a_bookie_comes(own, then):
    """Three bookies, E3 Qw3 Qa2 (the standalone default): one is killed.
    The writer used to fail 13 ms later (NotEnoughBookies, excluding all
    three).  Now appends go on, acknowledged at Qa, held in the window (rule
    1: they need Qw); the bookie is retried with back-off, and once it is
    back (or a spare registers: the change then replaces it) every entry
    reaches Qw and leaves the window."""
    procs = own.start(3)
    by_id = {p.bookie_id: p for p in procs}
    name = sname()

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster, max_pending_adds=64, add_timeout=3.0) as sc:
            w = await sc.open_writer(name)
            before = list(await w.append_many([b"a%d" % i for i in range(10)]))
            victim = w.handle.metadata.last_fragment.ensemble[2]
            by_id[victim].kill()
            during = [await w.append(b"b%d" % i) for i in range(30)]  # acknowledged at Qa
            core = w.handle._writer.core
            await asyncio.wait_for(_failed(w.handle, victim), 30)
            assert w.handle.writable and len(core.pending) >= 30
            with pytest.raises(se.TooManyPendingAdds):  # the window is the bound
                w.append_many_async([b"c"] * 40)
            if then == "the bookie returns":
                by_id[victim].start()  # same id, same address
            else:
                await asyncio.to_thread(own.start, 1)
            await asyncio.wait_for(_released(w.handle), 60)
            assert not core.failed
            ensemble = w.handle.metadata.last_fragment.ensemble
            if then == "the bookie returns":
                assert w.handle.metadata.fragment_count == 1  # retried, not replaced
            else:
                assert victim not in ensemble and w.handle.metadata.fragment_count == 2
            after = await w.append(b"d")
            ps = before + during + [after]
            assert [p.entry_id for p in ps] == list(range(ps[0].entry_id, ps[0].entry_id + 41))
            got = await read_n(sc, name, 41)
            assert got == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(30)] + [b"d"]
    run(go())


def test_a_take_over_that_cannot_finish_raises_the_term_once_and_names_the_missing_bookie(own):
    procs = own.start(3)
    by_id = {p.bookie_id: p for p in procs}
    name = sname()

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster, add_timeout=3.0) as sc:
            w = await sc.open_writer(name)
            await w.append_many([b"a%d" % i for i in range(5)])
            victim = w.handle.metadata.last_fragment.ensemble[1]
            by_id[victim].kill()
            async with AsyncStreamClient(own.endpoint, own.cluster, read_timeout=2.0) as sc2:
                for attempt in (1, 2):
                    t0 = (await sc2.stream_info(name))["term"]
                    with pytest.raises(se.LedgerRecoveryFailed) as ei:
                        await sc2.open_writer(name)
                    assert ei.value.retriable and victim in ei.value.missing and victim in str(ei.value)
                    assert (await sc2.stream_info(name))["term"] == t0 + 1  # once per explicit attempt
                by_id[victim].start()
                w2 = await sc2.open_writer(name)
                await w2.append(b"z")
                assert (await read_n(sc2, name, 6)) == [b"a%d" % i for i in range(5)] + [b"z"]
    run(go())


# -- health, not a ban (19.2) ---------------------------------------------------------------------------


def test_a_restarted_bookie_is_usable_at_once(own):
    """kill -9 one of four bookies, let the client see it fail, restart it:
    the next writer that needs all four opens at once (it used to be shunned
    for 30 s: 'need 3 writable bookies (excluding [...])')."""
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        async with AsyncStreamClient(own.endpoint, own.cluster, add_timeout=3.0) as sc:
            cfg = StreamConfig(ensemble_size=4, write_quorum=2, ack_quorum=2)
            w = await sc.open_writer(sname(), cfg)
            victim = w.handle.metadata.last_fragment.ensemble[0]
            by_id[victim].kill()
            with pytest.raises(se.BookKeeperError):
                for i in range(100):  # the add stream breaks: the client sees the bookie fail
                    await w.append(b"x%d" % i)
            assert victim in sc.bk.quarantined()
            # three are not four: the suspect is tried before giving up, and the error names it
            with pytest.raises((se.NotEnoughBookies, se.LedgerRecoveryFailed)) as ei:
                await sc.open_writer(sname(), cfg)
            assert victim in str(ei.value)
            by_id[victim].start()  # registered anew: its health is forgiven on the next read
            w2 = await sc.open_writer(sname(), cfg)  # the first try after the restart
            assert victim in w2.handle.metadata.last_fragment.ensemble and victim not in sc.bk.quarantined()
            await w2.append(b"ok")
    run(go())


# -- overlapping log rolls (19.1) ---------------------------------------------------------------------------


def test_overlapping_rolls_never_publish_a_ledger_while_an_older_one_is_open(own, monkeypatch):
    """E3 Qw2 Qa2, one bookie paused so the first ledger's close waits for
    its pending adds; two rolls started back to back.  Every list CAS must
    find every ledger but the current one CLOSED (the next leader's open
    fences only the last two).  The second roll used to publish a third
    ledger at once, leaving the first OPEN outside what an open fences."""
    from stream.log import LogReader, LogWriter, _Record

    procs = own.start(4)  # (a bookie paused past its lease TTL drops out of the registrations)
    by_id = {p.bookie_id: p for p in procs}
    name = f"log-{uuid.uuid4().hex[:6]}"
    seen_open: list[tuple[list[int], int]] = []
    real_cas = _Record.cas

    async def checking_cas(self, ids, revision):
        for lid in ids[:-2]:
            meta = await self.client.ledger_metadata(lid)
            if meta.state.name != "CLOSED":
                seen_open.append((list(ids), lid))
        return await real_cas(self, ids, revision)

    monkeypatch.setattr(_Record, "cas", checking_cas)

    async def go():
        async with BookKeeperClient(own.endpoint, own.cluster, add_timeout=60.0) as bk:
            w = await LogWriter(bk, name, 3, 2, 2).open()
            first = w.current_ledger
            acked = [await w.append(b"a%d" % i) for i in range(10)]
            paused = by_id[first.metadata.last_fragment.ensemble[0]]
            _pause(paused)
            try:
                late = [w.append_async(b"b%d" % i) for i in range(10)]  # some wait for the paused bookie
                roll1 = asyncio.ensure_future(w.roll())
                roll2 = asyncio.ensure_future(w.roll())
                # the second roll either waits for the first ledger's close
                # (right) or publishes a third ledger meanwhile (the bug)
                await asyncio.wait([roll2], timeout=3.0)
            finally:
                _resume(paused)
            await asyncio.gather(roll1, roll2)
            acked += await asyncio.gather(*late)
            assert seen_open == []
            ids = w.ledger_ids
            assert len(ids) == 3
            for lid in ids[:-1]:
                assert (await bk.ledger_metadata(lid)).state.name == "CLOSED"
            await w.close()
        async with BookKeeperClient(own.endpoint, own.cluster) as bk2:
            w2 = await LogWriter(bk2, name).open()  # the next leader
            got = await LogReader(bk2, name).read_all()
            assert [e.payload for _, e in got] == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)]
            assert [p for p, _ in got] == acked
            await w2.close()
    run(go())


# -- no task left behind (12.7, 19.3) -------------------------------------------------------------------------

LEFT_BEHIND = ("Task was destroyed but it is pending", "Task exception was never retrieved",
               "asynchronous generator is already running", "was never awaited",
               "error occurred during closing of asynchronous generator", "Exception in callback")


def _left_behind(caplog) -> list[str]:
    gc.collect()
    return [r.getMessage() for r in caplog.records if any(m in r.getMessage() for m in LEFT_BEHIND)]


def test_no_task_is_left_behind_by_an_ensemble_change_and_a_close(own, caplog):
    """A stream writer appending, a tailing reader, a classic ledger writer
    and its tail, one bookie killed under them (ensemble changes), then the
    clients closed with all of it under way and the loop ended."""
    caplog.set_level(logging.DEBUG, logger="asyncio")
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}

    async def go():
        sc = AsyncStreamClient(own.endpoint, own.cluster, add_timeout=2.0, read_timeout=2.0)
        bk = BookKeeperClient(own.endpoint, own.cluster, add_timeout=2.0, read_timeout=2.0)
        name = sname()
        w = await sc.open_writer(name)
        lh = await bk.create_ledger(3, 3, 2)
        reader = await sc.open_reader(name)
        tailer = await bk.open_ledger(lh.ledger_id, recovery=False)
        seen: list[bytes] = []

        async def tail_stream():
            async for rec in reader:
                seen.append(rec.payload)

        async def tail_ledger():
            async for e in tailer.tail(0, poll_timeout=0.5):
                seen.append(e.payload)

        tails = [asyncio.ensure_future(tail_stream()), asyncio.ensure_future(tail_ledger())]
        await w.append_many([b"s%d" % i for i in range(50)])
        await asyncio.gather(*(lh.add_entry_async(b"l%d" % i) for i in range(50)))
        victim = next(b for b in w.handle.metadata.last_fragment.ensemble if b in lh.metadata.last_fragment.ensemble)
        by_id[victim].kill()
        # appends through the change (and through the close below)
        futs = [w.append_async(b"t%d" % i) for i in range(200)]
        futs += [lh.add_entry_async(b"m%d" % i) for i in range(200)]
        await asyncio.gather(*futs[:10], return_exceptions=True)
        await asyncio.wait(futs, timeout=20)
        await sc.close()
        await bk.close()
        for t in tails:
            t.cancel()
        await asyncio.gather(*tails, return_exceptions=True)
        assert all(f.done() for f in futs)
        for f in futs:
            if not f.cancelled():
                f.exception()

    run(go())
    assert _left_behind(caplog) == []


def test_no_task_is_left_behind_by_the_blocking_clients_close(own, caplog):
    """The blocking clients: a thread tailing a stream and one tailing a
    classic ledger (their generators suspended on the loop), a bookie killed
    under the writers, then both clients closed."""
    import threading

    from stream.client import SyncBookKeeperClient

    caplog.set_level(logging.DEBUG, logger="asyncio")
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}
    name = sname()
    sc = StreamClient(own.endpoint, own.cluster, add_timeout=2.0, read_timeout=2.0)
    bk = SyncBookKeeperClient(own.endpoint, own.cluster, add_timeout=2.0, read_timeout=2.0)
    ended: list[BaseException] = []
    try:
        w = sc.open_writer(name)
        lh = bk.create_ledger(3, 3, 2)
        reader = sc.open_reader(name)
        tailer = bk.open_ledger(lh.ledger_id, recovery=False)
        first = threading.Event()

        def consume(it):
            try:
                for _ in it:
                    first.set()
            except BaseException as e:  # ClientClosed once the client closes
                ended.append(e)

        threads = [threading.Thread(target=consume, args=(it,), daemon=True)
                   for it in (iter(reader), tailer.tail(0, poll_timeout=0.5))]
        for t in threads:
            t.start()
        for i in range(50):
            w.append_async(b"s%d" % i)
            lh.add_entry(b"l%d" % i)
        w.flush()
        assert first.wait(30)
        victim = sc.stream_info(name)["ensemble"][0]
        by_id[victim].kill()
        futs = [w.append_async(b"t%d" % i) for i in range(100)]
        for i in range(20):
            try:
                lh.add_entry(b"m%d" % i)
            except se.BookKeeperError:
                break
        w.flush()
    finally:
        sc.close()
        bk.close()
    for t in threads:
        t.join(30)
    assert all(isinstance(e, se.ClientClosed) for e in ended) and len(ended) == 2, ended
    assert all(f.done() for f in futs)
    assert _left_behind(caplog) == []
