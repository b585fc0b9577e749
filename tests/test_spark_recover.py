"""Re-replication as a Spark job (stream/spark/recover.py) on a real local
SparkSession against real etcd and bookie processes: a bookie is killed
(kill -9), the job copies and replaces every fragment naming it, one task
per fragment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import pytest

pytest.importorskip("pyspark")

from bookie.core import Status  # noqa: E402
from stream.client import BookKeeperClient  # noqa: E402
from stream.stream import AsyncStreamClient, Position, StreamConfig  # noqa: E402
from tests.conftest import run  # noqa: E402
from tests.test_autorecovery import check_every_replica, names_bookie  # noqa: E402
from tests.test_recovery_cli import closed_ledger  # noqa: E402
from tests.test_spark import spark  # noqa: E402,F401  (the session's SparkSession)

N_STREAM, N_CLASSIC = 300, 200
PW = b"spark-pw"  # the first test's stream and ledger have a password: the copies carry the key (bookie-checked)


async def _write(env, name: str) -> tuple[int, int]:
    """A stream of several fragments (E3 Qw2: a lost position holds a part
    of each range) whose writer is gone, and a closed classic ledger."""
    async with AsyncStreamClient(env.endpoint, env.cluster) as sc:
        w = await sc.open_writer(name, StreamConfig(3, 2, 2, fragment_size_entries=40, password=PW))
        await w.append_many([b"s-%d" % i for i in range(N_STREAM)])
        await w.close()  # no live writer: its last fragment stays open
        slid = (await sc.stream_info(name))["ledger_id"]
    bk = BookKeeperClient(env.endpoint, env.cluster)
    lh = await bk.create_ledger(3, 3, 2, password=PW)
    await lh.add_entries([b"c-%d" % i for i in range(N_CLASSIC)])
    await lh.close()
    await bk.close()
    return slid, lh.ledger_id


async def _victim(env, slid: int, clid: int) -> tuple[str, dict]:
    """A bookie of the classic ledger and of the stream's open fragment,
    named by the most stream fragments; and every fragment's ensemble
    before the loss."""
    bk = BookKeeperClient(env.endpoint, env.cluster)
    smeta, _ = await bk.meta_call(bk.ledgers.read, slid)
    cmeta, _ = await bk.meta_call(bk.ledgers.read, clid)
    await bk.close()
    assert smeta.fragment_count >= 7
    both = set(cmeta.fragments[0].ensemble) & set(smeta.last_fragment.ensemble)  # 3 + 3 of 5: never empty
    count = {b: sum(b in f.ensemble for f in smeta.fragments) for b in both}
    victim = max(sorted(count), key=count.get)
    assert count[victim] >= 2, count
    before = {(lid, f.first_entry): f.ensemble for m, lid in ((smeta, slid), (cmeta, clid)) for f in m.fragments}
    return victim, before


async def _check(env, name: str, slid: int, clid: int, victim: str, live: set[str]) -> dict:
    """Every fragment on live bookies only (distinct ones), every entry
    readable with a valid checksum from every replica of its write set, and
    readers get everything acknowledged.  Returns the fragments' ensembles."""
    bk = BookKeeperClient(env.endpoint, env.cluster)
    assert not await names_bookie(bk, victim)
    after = {}
    for lid in (slid, clid):
        meta, _ = await bk.meta_call(bk.ledgers.read, lid)
        for f in meta.fragments:
            assert set(f.ensemble) <= live and len(set(f.ensemble)) == len(f.ensemble), (lid, f)
            after[(lid, f.first_entry)] = f.ensemble
            for b in f.ensemble:  # every replica, the copies' targets included, refuses a request without the key
                bc = await bk.bookie(b)
                assert (await bc.delete(lid, (1 << 40, 1 << 40))).status == Status.UNAUTHORIZED_ACCESS, (lid, b)
    assert await check_every_replica(bk, clid, N_CLASSIC - 1, live) == N_CLASSIC * 3
    # the stream up to the no-op the seal's take-over wrote (entry N_STREAM)
    assert await check_every_replica(bk, slid, N_STREAM, live) == (N_STREAM + 1) * 2
    lh = await bk.open_ledger(clid, recovery=False, password=PW)
    assert [e.payload for e in await lh.read_entries(0, N_CLASSIC - 1)] == [b"c-%d" % i for i in range(N_CLASSIC)]
    await lh.close()
    await bk.close()
    async with AsyncStreamClient(env.endpoint, env.cluster) as sc:  # a new writer takes over, a reader reads all
        w = await sc.open_writer(name, StreamConfig(3, 2, 2, password=PW))
        p = await w.append(b"after")
        r = await sc.open_reader(name, Position.EARLIEST, password=PW)
        got = []
        while not got or got[-1].payload != b"after":
            got += await r.read(1000, timeout=5)
        assert [x.payload for x in got] == [b"s-%d" % i for i in range(N_STREAM)] + [b"after"]
        assert got[-1].position == p
        await r.close()
        await w.close()
    return after


def _replaced_once(before: dict, after: dict, victim: str) -> None:
    """Each fragment that named the victim differs at its position only."""
    for key, ens in before.items():
        if key not in after:
            continue  # the seal's take-over may have rewritten the open fragment
        new = after[key]
        if victim in ens:
            assert [i for i, (a, b) in enumerate(zip(ens, new)) if a != b] == [ens.index(victim)], (key, ens, new)
        else:
            assert new == ens, (key, ens, new)


def test_kill_a_bookie_the_spark_job_rereplicates_every_fragment(spark, own):  # noqa: F811
    from stream.spark.recover import recover_on_spark

    procs = own.start(5)
    by_id = {p.bookie_id: p for p in procs}
    name = "rr-" + uuid.uuid4().hex[:6]
    slid, clid = run(_write(own, name))
    victim, before = run(_victim(own, slid, clid))
    by_id[victim].kill()
    live = set(by_id) - {victim}

    dry = recover_on_spark(spark, own.endpoint, own.cluster, victim, dry_run=True)
    assert dry["dry_run"] and dry["fragments_planned"] == len(dry["plan"]) >= 2
    assert dry["open_fragments"] and dry["left"]  # the stream's open fragment: its writer's without --seal-open
    for t in dry["plan"]:
        assert t["target"] in live and t["target"] not in before[(t["ledger_id"], t["first"])]

    s = recover_on_spark(spark, own.endpoint, own.cluster, victim, seal_open=True)
    assert not s["left"] and not s["unrecoverable"], s
    assert s["spark"]["tasks"] == len(s["fragments"]) == s["fragments_planned"] >= 3, s
    assert s["fragments_replaced"] == len(s["fragments"]) and s["entries_copied"] > 0
    for r in s["fragments"]:
        assert r["status"] == "done" and r["target"] in live, r
    assert len({r["target"] for r in s["fragments"]}) >= 2  # spread over the bookies
    after = run(_check(own, name, slid, clid, victim, live))
    _replaced_once(before, after, victim)

    again = recover_on_spark(spark, own.endpoint, own.cluster, victim, seal_open=True)
    assert again["spark"]["tasks"] == 0 and not again["left"] and again["entries_copied"] == 0


def test_two_jobs_at_once_replace_each_fragment_once(spark, own):  # noqa: F811
    """Two jobs for the same lost bookie run at the same time: each
    fragment is replaced once, by one of them; the other reports the ledger
    as being recovered by the first (the workers' per-ledger lock, held by
    the driver) or no longer plans it; nothing fails."""
    from stream.spark.recover import recover_on_spark

    procs = own.start(5)
    by_id = {p.bookie_id: p for p in procs}

    async def write():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        ids = []
        for k in range(4):
            lh = await bk.create_ledger(3, 3, 2)
            await lh.add_entries([b"L%d-%d" % (k, i) for i in range(150)])
            await lh.close()
            ids.append(lh.ledger_id)
        metas = [(await bk.meta_call(bk.ledgers.read, lid))[0] for lid in ids]
        await bk.close()
        return ids, metas

    ids, metas = run(write())
    victim = max(sorted(by_id), key=lambda b: sum(b in m.fragments[0].ensemble for m in metas))
    by_id[victim].kill()
    live = set(by_id) - {victim}
    out: list = [None, None]

    def job(k):
        out[k] = recover_on_spark(spark, own.endpoint, own.cluster, victim)

    threads = [threading.Thread(target=job, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(o is not None for o in out)
    for o in out:
        assert o["fragments_failed"] == 0 and all("being recovered by spark-recover-" in x["note"]
                                                  for x in o["left"]), o
    before = {(m.ledger_id, f.first_entry): f.ensemble for m in metas for f in m.fragments}
    for m in metas:
        done = [r for o in out for r in o["fragments"] if r["ledger_id"] == m.ledger_id and r["status"] == "done"]
        assert len(done) == (victim in m.fragments[0].ensemble), (m.ledger_id, out)

    async def check():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        after = {}
        for m in metas:
            meta, _ = await bk.meta_call(bk.ledgers.read, m.ledger_id)
            after.update({(m.ledger_id, f.first_entry): f.ensemble for f in meta.fragments})
            assert await check_every_replica(bk, m.ledger_id, 149, live) == 150 * 3
        await bk.close()
        return after
    _replaced_once(before, run(check()), victim)


def test_spark_submit_entry_point(own, tmp_path):
    """The documented spark-submit command, as a user runs it (its own
    driver JVM, master local[1]): JSON summary on stdout, exit status 0 once
    everything is re-replicated."""
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}

    async def write():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        lh = await bk.create_ledger(3, 3, 2)
        await lh.add_entries([b"x%d" % i for i in range(50)])
        await lh.close()
        await bk.close()
        return lh.ledger_id, lh.metadata.fragments[0].ensemble

    lid, ens = run(write())
    victim = ens[0]
    by_id[victim].kill()
    import stream.spark.recover as m

    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    p = subprocess.run([submit, "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                        "--conf", f"spark.local.dir={tmp_path}", m.__file__, victim, "--etcd", own.endpoint,
                        "--cluster", own.cluster, "--format", "json"],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    s = json.loads(p.stdout)
    assert s["spark"]["master"] == "local[1]" and s["fragments_replaced"] == 1 and not s["left"]

    async def check():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        assert not await names_bookie(bk, victim)
        assert await check_every_replica(bk, lid, 49, set(by_id) - {victim}) == 150
        await bk.close()
    run(check())


def test_a_job_whose_tasks_keep_dying_reports_every_fragment_failed(spark, own, monkeypatch):  # noqa: F811
    """Every attempt of the task kills its Python worker (spark.task.maxFailures
    reached): the job's summary says each fragment failed (a re-run plans
    again), instead of a traceback; nothing was replaced."""
    import stream.spark.recover as rec

    procs = own.start(4)
    lid, ens = closed_ledger(own, [b"d%d" % i for i in range(20)])
    next(p for p in procs if p.bookie_id == ens[1]).kill()

    def dies(task):
        os._exit(1)

    monkeypatch.setattr(rec, "recover_fragment", dies)
    s = rec.recover_on_spark(spark, own.endpoint, own.cluster, ens[1])
    assert s["fragments_failed"] == 1 and s["fragments_replaced"] == 0 and s["left"], s
    assert "Spark job failed" in s["fragments"][0]["note"] and "etcd" not in s["fragments"][0]

    async def still():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        named = await names_bookie(bk, ens[1])
        await bk.close()
        return named
    assert run(still()) == [(lid, 0)]


def test_a_spark_jobs_tasks_copy_at_the_rate_given(spark, own):  # noqa: F811
    """``rate`` (``recover --spark --rate-mb``) holds each task: a fragment
    of 8 MiB copied at 2 MiB/s takes no less than the rate allows, less
    the pace's burst and one frame (unlimited, a fraction of a second)."""
    from stream.spark.recover import recover_on_spark
    from tests.test_recovery_cli import closed_ledger_first_bookie_killed

    procs = own.start(4)
    lid, ensemble, _ = closed_ledger_first_bookie_killed(own, procs, [os.urandom(64 << 10)] * 128)
    s = recover_on_spark(spark, own.endpoint, own.cluster, ensemble[0], rate=2 << 20)
    (r,) = s["fragments"]
    assert r["status"] == "done" and r["entries"] == 128 and r["bytes"] > 8 << 20, r
    assert r["seconds"] >= (r["bytes"] - (2 << 20)) / (2 << 20), r
    bk = BookKeeperClient(own.endpoint, own.cluster)
    assert run(check_every_replica(bk, lid, 127, {p.bookie_id for p in procs} - {ensemble[0]})) == 128 * 3
    run(bk.close())
