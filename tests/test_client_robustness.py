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
