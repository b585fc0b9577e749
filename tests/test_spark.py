"""The Spark source and sink (stream/spark/) on a real local SparkSession
against real etcd and bookie processes.

One SparkSession for the whole session (it takes ~15-20 s to start here);
``local[2,3]``: two cores, and a failed task is retried (up to 3 attempts)
as on a cluster.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid

import pytest

pyspark = pytest.importorskip("pyspark")

from bookstream_pb import metadata_pb2 as mpb  # noqa: E402
from metadata.layout import KeyLayout  # noqa: E402
from metadata.store import MetadataStore  # noqa: E402
from stream.client import SyncBookKeeperClient  # noqa: E402
from stream.stream import Position, StreamClient, StreamConfig  # noqa: E402


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import stream.spark

    s = (SparkSession.builder.master("local[2,3]").appName("bookstream-tests")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
         .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
         .config("spark.driver.extraJavaOptions", "-Dderby.system.home=" + str(tmp_path_factory.mktemp("derby")))
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    stream.spark.register(s)
    yield s
    s.stop()


def _opts(shared, **kw) -> dict:
    return {"etcd": shared.endpoint, "cluster": shared.cluster, **kw}


def _read(spark, shared, **kw):
    return spark.read.format("bookstream").options(**_opts(shared, **kw)).load()


def _stream_payloads(shared, name: str, password=None) -> list[bytes]:
    """Every payload of stream ``name``, from its start, in order."""
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_reader(name, Position.EARLIEST, password=password) as r:
            got = []
            while True:
                recs = r.read(5000, timeout=1.0)
                if not recs:
                    return got
                got += [x.payload for x in recs]


def _append(shared, name: str, payloads, cfg: StreamConfig | None = None) -> list[int]:
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_writer(name, cfg) as w:
            futs = [w.append_async(p) for p in payloads]
            w.flush()
            return [f.result().entry_id for f in futs]


def _wait(pred, timeout: float, what: str):
    """Polls ``pred`` (a state in another process: etcd, Spark's query) until
    true; the deadline only bounds a failure."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- source -----------------------------------------------------------------------------------------

def test_batch_read_of_a_multi_fragment_stream(spark, shared):
    name = "orders-" + uuid.uuid4().hex[:6]
    payloads = [b"order-%05d" % i for i in range(2_000)]
    ids = _append(shared, name, payloads, StreamConfig(fragment_size_entries=300))
    _append(shared, name, [b"after-takeover"])  # a second term: one more no-op in the stream
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        assert sc.stream_info(name)["fragments"] >= 7

    df = _read(spark, shared, stream=name, maxEntriesPerPartition="250")
    assert df.rdd.getNumPartitions() >= 9  # one per fragment at least, the large ones split
    rows = df.collect()
    assert len(rows) == 2_001
    assert [r.payload for r in rows] == payloads + [b"after-takeover"]  # order kept (partitions in order)
    assert [r.entry for r in rows[:2_000]] == ids
    assert {r.stream for r in rows} == {name}
    # order within each fragment, and fragments in entry order
    by_frag: dict[int, list[int]] = {}
    for r in rows:
        by_frag.setdefault(r.fragment, []).append(r.entry)
    assert len(by_frag) >= 7
    for entries in by_frag.values():
        assert entries == sorted(entries)
    # the same through tuples instead of arrow batches
    assert _read(spark, shared, stream=name, arrowBatches="false").count() == 2_001


def test_positions_round_trip(spark, shared):
    name = "pos-" + uuid.uuid4().hex[:6]
    _append(shared, name, [b"p%d" % i for i in range(100)])
    rows = _read(spark, shared, stream=name).collect()
    mid = rows[40]
    assert Position.from_bytes(mid.position).entry_id == mid.entry
    part = _read(spark, shared, stream=name, startingPositions=mid.position.hex(),
                 endingPositions=rows[60].position.hex()).collect()
    assert [r.payload for r in part] == [r.payload for r in rows[40:60]]
    # the JSON offset form, as Spark's checkpoints hold it
    part = _read(spark, shared, stream=name, startingPositions=json.dumps({"entry": rows[90].entry})).collect()
    assert [r.payload for r in part] == [r.payload for r in rows[90:]]
    with pytest.raises(Exception, match="startingPositions"):
        _read(spark, shared, stream=name, startingPositions="yesterday").collect()


def test_streaming_read_while_appending_then_restart_from_checkpoint(spark, shared, tmp_path):
    name = "live-" + uuid.uuid4().hex[:6]
    _append(shared, name, [b"before-%d" % i for i in range(50)])
    seen: dict[int, list[bytes]] = {}  # by batch id: a batch stopped before Spark committed it runs again
    replays: list[int] = []
    cond = threading.Condition()

    def collect(df, batch_id):
        got = [r.payload for r in df.orderBy("entry").collect()]
        with cond:
            if seen.setdefault(batch_id, got) != got:
                replays.append(batch_id)  # a batch run again with other records: checked below
            cond.notify_all()

    def start():
        return (spark.readStream.format("bookstream")
                .options(**_opts(shared, stream=name, startingPositions="earliest", maxRecordsPerTrigger="120"))
                .load().writeStream.foreachBatch(collect)
                .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds")
                .start())

    def wait_for(count: int):
        with cond:
            ok = cond.wait_for(lambda: sum(map(len, seen.values())) >= count, timeout=120)
        assert ok, f"saw {sum(map(len, seen.values()))} records, expected {count}"

    q = start()
    expected = [b"before-%d" % i for i in range(50)]
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_writer(name) as w:  # a writer appends while the query runs
            for k in range(5):
                batch = [b"live-%d-%d" % (k, i) for i in range(100)]
                for p in batch:
                    w.append_async(p)
                w.flush()
                expected += batch
                wait_for(len(expected))
    q.stop()
    # stopped: more records arrive, then the query resumes from its checkpoint
    more = [b"while-stopped-%d" % i for i in range(70)]
    _append(shared, name, more)
    expected += more
    q = start()
    try:
        wait_for(len(expected))
    finally:
        q.stop()
    assert not replays
    got = [p for _, b in sorted(seen.items()) for p in b]
    assert got == expected  # nothing missed, nothing read twice, in order
    assert max(map(len, seen.values())) <= 120  # maxRecordsPerTrigger


def test_failOnDataLoss_for_a_trimmed_start(spark, shared):
    name = "trim-" + uuid.uuid4().hex[:6]
    _append(shared, name, [b"t%d" % i for i in range(600)], StreamConfig(fragment_size_entries=200))
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        assert sc.trim(name, Position(450)) >= 1
    start = json.dumps({"entry": 5})
    with pytest.raises(Exception, match="trimmed"):
        _read(spark, shared, stream=name, startingPositions=start).collect()
    rows = _read(spark, shared, stream=name, startingPositions=start, failOnDataLoss="false").collect()
    from stream.spark.access import Session, chain_views
    with Session(shared.endpoint, shared.cluster) as s:
        views = s.run(chain_views(s.bk, "stream", name))
    assert rows, views
    assert rows[0].entry >= 200 and rows[-1].payload == b"t599"


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_batch_read_with_a_bookie_killed_or_paused_returns_every_record(spark, own, fault):
    """Spark tasks read through the public client: with one bookie of every
    fragment's ensemble killed (connections refused) or SIGSTOPped (they
    hang), each entry comes from another replica, in order, and the job ends."""
    procs = own.start(3)   # (every fragment's ensemble holds the victim)
    name = "faulty-" + uuid.uuid4().hex[:6]
    payloads = [b"r-%05d" % i for i in range(3000)]
    _append(own, name, payloads, StreamConfig(3, 3, 2, fragment_size_entries=400))
    victim = procs[1]
    if fault == "kill":
        victim.kill()
    else:
        os.kill(victim.pid, signal.SIGSTOP)   # (the fixture resumes it at the end)
    rows = _read(spark, own, stream=name, maxEntriesPerPartition="500").collect()
    assert [r.payload for r in rows] == payloads


def test_a_task_reads_its_range_in_chunks(shared):
    """``access.read_range``, a task's read (no Spark session needed): the
    range's (entry id, payload) rows in order, in chunks, each sized from
    the one before (about ``chunk_bytes``, 64 bytes an entry added)."""
    from stream.spark.access import Session, chain_views, read_range
    from stream.spark.plan import Range
    name = "chunks-" + uuid.uuid4().hex[:6]
    payloads = [b"c%d-" % i + b"z" * (i * 7 % 97) for i in range(900)]
    ids = _append(shared, name, payloads)
    with Session(shared.endpoint, shared.cluster) as s:
        (view,) = s.run(chain_views(s.bk, "stream", name))
        chunks = list(read_range(s, Range(view.ledger_id, ids[100], ids[-1]), chunk_bytes=4096, first_chunk=50))
    assert [row for c in chunks for row in c] == list(zip(ids[100:], payloads[100:]))
    assert len(chunks[0]) == 50
    for c, nxt in zip(chunks, chunks[1:-1]):
        size = sum(len(p) for _, p in c) + 64 * len(c)
        assert len(nxt) == max(1, min(10_000, 4096 * len(c) // size))


# -- sink -------------------------------------------------------------------------------------------

def _log_ledgers(shared, name: str) -> list[int]:
    st = MetadataStore(shared.endpoint)
    try:
        v = st.get(KeyLayout(shared.cluster).log_key(name))
        if v is None:
            return []
        rec = mpb.LogRecord()
        rec.ParseFromString(v.value)
        return list(rec.ledger_ids)
    finally:
        st.close()


def _job_ledgers(shared) -> dict[int, str]:
    """Every ledger a sink task created (its custom tag), by id."""
    with SyncBookKeeperClient(shared.endpoint, shared.cluster) as bk:
        out = {}
        for lid in bk.list_ledgers():
            try:
                job = bk.ledger_metadata(lid).custom.get("spark-job")
            except Exception:
                continue
            if job:
                out[lid] = job
        return out


def _pending(shared) -> list[str]:
    st = MetadataStore(shared.endpoint)
    try:
        return [k for k, _ in st.range(KeyLayout(shared.cluster).root + "spark/pending/")]
    finally:
        st.close()


def test_log_sink_writes_in_partition_order_and_needs_a_payload(spark, shared):
    name = "events-" + uuid.uuid4().hex[:6]
    df = spark.createDataFrame([(i, "event-%04d" % i) for i in range(1_000)], "k int, payload string").repartition(4, "k")
    df.write.format("bookstream").options(**_opts(shared, log=name)).mode("append").save()
    back = _read(spark, shared, log=name).collect()
    assert sorted(r.payload for r in back) == sorted(b"event-%04d" % i for i in range(1_000))
    ids = _log_ledgers(shared, name)
    assert len(ids) == 4 and list(dict.fromkeys(r.ledger for r in back)) == ids  # read in list order
    with SyncBookKeeperClient(shared.endpoint, shared.cluster) as bk:  # the list is in partition order
        assert [bk.ledger_metadata(lid).custom["spark-partition"] for lid in ids] == ["0", "1", "2", "3"]
    assert not _pending(shared)
    with pytest.raises(Exception, match="payload"):
        spark.createDataFrame([(1,)], "value int").write.format("bookstream") \
            .options(**_opts(shared, log=name)).mode("append").save()


def test_log_sink_task_killed_mid_write_leaves_nothing_visible(spark, shared, tmp_path):
    """Partition 1's first attempt is killed (kill -9 of the Python worker
    writing it) once its ledger holds entries; Spark retries the task; the
    committed log holds each row once, and the killed attempt's ledger is gone."""
    name = "killed-" + uuid.uuid4().hex[:6]
    before = set(_job_ledgers(shared))
    n = 6_000
    gate = tmp_path / "release"

    def rows(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        slow = ctx.partitionId() == 1 and ctx.attemptNumber() == 0
        for b in batches:
            for i in range(0, b.num_rows, 100):
                yield b.slice(i, 100)
                if slow and not os.path.exists(str(gate)):
                    time.sleep(0.05)  # pacing: this attempt is killed while it writes

    src = spark.range(n, numPartitions=2).selectExpr("id", "cast(concat('row-', id) as binary) as payload")
    killed: dict = {}

    def killer():  # a thread of the test: etcd and signals only (Spark stays on the main thread)
        st = MetadataStore(shared.endpoint)
        prefix = KeyLayout(shared.cluster).root + "spark/pending/"

        def attempt0_of_partition1():
            for k, v in st.range(prefix):
                about = json.loads(v.value)
                if about["partition"] == 1 and about["attempt"] == 0:
                    lid = int(k.rsplit("/", 1)[1])
                    with SyncBookKeeperClient(shared.endpoint, shared.cluster) as bk:
                        if bk.open_ledger(lid, recovery=False).last_add_confirmed >= 0:
                            return lid, about["pid"]
            return None

        try:
            killed["lid"], pid = _wait(attempt0_of_partition1, 120, "the slow attempt to write")
            os.kill(pid, signal.SIGKILL)
        finally:
            st.close()
            gate.touch()

    t = threading.Thread(target=killer)
    t.start()
    try:
        src.mapInArrow(rows, src.schema).write.format("bookstream") \
            .options(**_opts(shared, log=name)).mode("append").save()
    finally:
        gate.touch()
        t.join(130)
    killed_lid = killed["lid"]
    back = _read(spark, shared, log=name).collect()
    assert sorted(r.payload for r in back) == sorted(b"row-%d" % i for i in range(n))
    ids = _log_ledgers(shared, name)
    assert killed_lid not in ids and len(ids) == 2
    left = {lid for lid in _job_ledgers(shared) if lid not in before}
    assert left == set(ids)  # the killed attempt's ledger was deleted
    assert not _pending(shared)


def test_replayed_streaming_batch_is_appended_once(spark, shared, tmp_path):
    """stream -> log with a checkpoint; the commit record of the last batch is
    removed from the checkpoint, so Spark runs that batch again on restart:
    the log must not get its ledgers twice."""
    src, dst = "src-" + uuid.uuid4().hex[:6], "dst-" + uuid.uuid4().hex[:6]
    _append(shared, src, [b"s%d" % i for i in range(300)])
    ckpt = tmp_path / "ckpt"

    def run_once():
        q = (spark.readStream.format("bookstream")
             .options(**_opts(shared, stream=src, startingPositions="earliest")).load()
             .select("payload").writeStream.format("bookstream").options(**_opts(shared, log=dst))
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()

    run_once()
    ids = _log_ledgers(shared, dst)
    assert ids and len(_read(spark, shared, log=dst).collect()) == 300
    commits = sorted((ckpt / "commits").iterdir(), key=lambda p: p.name)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()  # Spark will run that batch again
    crc = ckpt / "commits" / f".{last.name}.crc"
    if crc.exists():
        crc.unlink()
    run_once()
    assert _log_ledgers(shared, dst) == ids
    assert len(_read(spark, shared, log=dst).collect()) == 300
    assert not _pending(shared)


def test_stream_sink_appends_in_partition_order(spark, shared):
    name = "into-" + uuid.uuid4().hex[:6]
    df = spark.createDataFrame([(i, b"r%04d" % i) for i in range(500)], "k int, payload binary").repartitionByRange(3, "k")
    df.write.format("bookstream").options(**_opts(shared, stream=name)).mode("append").save()
    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_reader(name) as r:
            got = []
            while len(got) < 500:
                recs = r.read(1000, timeout=5.0)
                assert recs
                got += [x.payload for x in recs]
    assert got == [b"r%04d" % i for i in range(500)]
    assert not _pending(shared)


def test_a_streaming_batch_into_a_stream_is_copied_once_when_its_commit_died_mid_copy(shared, monkeypatch):
    """The driver dies (an exception here) after part of a streaming batch
    reached the stream; Spark runs the commit again: the stream holds every
    record of the batch once, in order (not the part twice), and a further
    replay of the committed batch appends nothing."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from stream.client import BookKeeperClient
    from stream.spark import commit as cm
    from stream.spark.sink import LedgerWritten, StreamingWriter
    from stream.stream import AsyncStreamWriter

    name = "once-" + uuid.uuid4().hex[:6]
    _append(shared, name, [b"earlier"])
    schema = StructType([StructField("payload", BinaryType())])
    options = _opts(shared, stream=name, checkpointLocation="/tmp/ckpt-" + name)

    def tasks(writer, n_parts=3, per=1500):
        async def go():
            bk = BookKeeperClient(shared.endpoint, shared.cluster)
            out = []
            for part in range(n_parts):
                lh = await bk.create_ledger(3, 2, 2)
                await cm.note_pending(bk, writer.job, lh.ledger_id, partition=part, attempt=0, pid=0, host="")
                await lh.add_entries([b"b-%d-%d" % (part, i) for i in range(per)])
                await lh.close()
                out.append(LedgerWritten(part, lh.ledger_id, per))
            await bk.close()
            return out
        from tests.conftest import run
        return run(go())

    expected = [b"b-%d-%d" % (p, i) for p in range(3) for i in range(1500)]
    w1 = StreamingWriter(options, schema, False)
    calls = {"n": 0}
    real = AsyncStreamWriter.append_many_async

    def dies_after_two_chunks(self, payloads):
        calls["n"] += 1
        if calls["n"] > 2:
            raise RuntimeError("the driver died")
        return real(self, payloads)

    monkeypatch.setattr(AsyncStreamWriter, "append_many_async", dies_after_two_chunks)
    with pytest.raises(RuntimeError, match="driver died"):
        w1.commit(tasks(w1), 0)
    monkeypatch.setattr(AsyncStreamWriter, "append_many_async", real)

    part = _stream_payloads(shared, name)
    assert part == [b"earlier"] + expected[:len(part) - 1] and len(part) > 1  # some of the batch got in
    w2 = StreamingWriter(options, schema, False)  # Spark makes the writer again for the replay
    w2.commit(tasks(w2), 0)
    assert _stream_payloads(shared, name) == [b"earlier"] + expected
    w3 = StreamingWriter(options, schema, False)
    w3.commit(tasks(w3), 0)  # replayed once more, after it was recorded: skipped
    assert _stream_payloads(shared, name) == [b"earlier"] + expected
    assert not _pending(shared)


def test_an_aborted_jobs_commit_whose_answer_was_lost_never_lists_its_deleted_ledger(own):
    """A log sink's commit sent through a link that then holds its bytes (a
    TCP proxy in front of etcd, as a partition would): the driver gives up
    waiting (its call cancelled: the request stays on its way), and the job
    is aborted through another link.  The abort fences the log's list
    (``fence_list``) before it deletes the job's ledger; once the link
    heals, the commit's transaction reaches etcd and fails its compare: the
    list never names the deleted ledger.  (Before: the abort read the list,
    deleted the ledger, and the commit, arriving, listed it: a log naming a
    ledger that no longer existed, the batch lost.)"""
    import asyncio

    from metadata.store import TxnConflict
    from stream import errors as se
    from stream.client import BookKeeperClient
    from stream.log import read_ledger_list
    from stream.spark import commit as cm
    from tests.conftest import run
    from tests.fault.proxy import BookieProxy, ProxyLoop

    own.start(3)
    ploop = ProxyLoop()
    proxy = BookieProxy(ploop, int(own.endpoint.rsplit(":", 1)[1]), lambda: [os.getpid()])
    name, job = "lost-commit-" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    sent, answered, outcome = threading.Event(), threading.Event(), []

    async def hold():
        proxy.blocked["blackhole"] = None

    async def go():
        direct = BookKeeperClient(own.endpoint, own.cluster)
        held = BookKeeperClient(proxy.address, own.cluster, metadata_timeout=60.0)
        try:
            lh = await direct.create_ledger(3, 3, 2)
            await lh.add_entry(b"the batch")
            await lh.close()
            await cm.note_pending(direct, job, lh.ledger_id, partition=0)
            real_txn = held.store.txn

            def txn_held(compares, ops):   # (in a worker thread: the commit's transaction, held from here on)
                ploop.call(hold())
                sent.set()
                try:
                    outcome.append(real_txn(compares, ops))
                except Exception as e:
                    outcome.append(e)
                    raise
                finally:
                    answered.set()

            held.store.txn = txn_held
            commit = asyncio.ensure_future(cm.commit_to_log(held, name, job, [lh.ledger_id]))
            assert await asyncio.to_thread(sent.wait, 30)
            commit.cancel()   # (the driver gives up; the thread's call, and its request, go on)
            assert await cm.abort(direct, job, name) == [lh.ledger_id]
            proxy.heal()
            assert await asyncio.to_thread(answered.wait, 60)
            assert isinstance(outcome[0], TxnConflict), outcome   # (it reached etcd, and its compare failed)
            ids, _ = await read_ledger_list(direct, name)
            assert ids == [], ids
            with pytest.raises(se.NoSuchLedger):
                await direct.open_ledger(lh.ledger_id, recovery=False)
        finally:
            await direct.close()
            await held.close()

    try:
        run(go())
    finally:
        proxy.close()
        ploop.close()


def test_a_log_source_says_a_listed_ledger_is_gone_and_leaves_out_a_truncated_one(shared):
    """The source's views of a log (``chain_views``): a ledger the list
    still names but that no longer exists raises NoSuchLedger (its entries
    lost: not read around in silence); one deleted and taken off the list
    (a truncation, maybe while the views were being made) is left out."""
    from stream import errors as se
    from stream.client import BookKeeperClient
    from stream.log import LogWriter, check_truncated, encode_ledger_list, log_key, read_ledger_list
    from stream.spark.access import chain_views
    from tests.conftest import run

    name = "gone-" + uuid.uuid4().hex[:6]

    async def go():
        async with BookKeeperClient(shared.endpoint, shared.cluster) as bk:
            async with await LogWriter(bk, name, 3, 2, 2).open() as w:   # (one open: the block keeps its lead)
                await w.append(b"one")
                await w.roll()
                await w.append(b"two")
                await w.roll()
                first, second, third = w.ledger_ids
            assert [v.ledger_id for v in await chain_views(bk, "log", name)] == [first, second, third]
            await bk.delete_ledger(second)                      # still listed: lost
            with pytest.raises(se.NoSuchLedger, match=rf"\[{second}\]"):
                await chain_views(bk, "log", name)
            ids, rev = await read_ledger_list(bk, name)        # taken off the list too: a truncation's
            await bk.meta_call(bk.store.cas, log_key(bk, name), encode_ledger_list(name, [first, third]), rev)
            await check_truncated(bk, name, [second])          # (what a view begun on the old list then says)
            assert [v.ledger_id for v in await chain_views(bk, "log", name)] == [first, third]

    run(go())
