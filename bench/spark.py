"""Benchmark of the Spark source and sink (a command, not a test):

    bookstream bench spark [--mb 1024] [--size 65536] [--cores 1,2] [--sink-rows 200000]
                           [--recover-mb 1024] [--etcd HOST:PORT] [--out r.json]

In one run: a stream of ``--mb`` MiB of ``--size``-byte records is written,
then read back (1) by bookstream's own catch-up reader (one process), then
through a local SparkSession with each of ``--cores`` cores (the local
master's executor threads, each with its Python worker): (2) into a
DataFrame ``count()``, with pyarrow record batches and with tuples, and (3)
into Parquet; (4) the sink writes ``--sink-rows`` rows of 100 B to a log.
Read figures are MB/s of payload, each also as a ratio to the catch-up read
of the same run; the sink in rows/s.  Without ``--etcd`` it starts its own
etcd and 3 bookies (on ports the OS chooses) in a temporary directory.

Then (5) re-replication (``--recover-mb``, 0 skips it; not with ``--etcd``):
its own etcd and 4 bookies, ``--recover-mb`` MiB in 8 closed classic
ledgers E3 Qw3 Qa2 of ``--size`` entries, one bookie killed; the same
fragments are recovered by ``bookstream recover`` (one process) and by the
Spark job with each of ``--cores``, the fragments' metadata put back to
name the killed bookie and the bookies' page cache dropped before each run:
MB/s of each, and the Spark job's as a ratio to the non-Spark recover.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def _fill(etcd: str, cluster: str, name: str, total: int, size: int) -> int:
    from stream.stream import AsyncStreamClient

    payload = os.urandom(size)
    n = total // size
    async with AsyncStreamClient(etcd, cluster) as sc:
        w = await sc.open_writer(name)
        per = max(1, min(1000, (4 << 20) // size))
        pending = []
        for i in range(0, n, per):
            pending.append(asyncio.ensure_future(w.append_many([payload] * min(per, n - i))))  # waits for room
            if len(pending) >= 8:
                await pending.pop(0)
        for f in pending:
            await f
        await w.close()
    return n


async def _catch_up(etcd: str, cluster: str, name: str) -> tuple[int, int, float]:
    from stream.stream import AsyncStreamClient

    async with AsyncStreamClient(etcd, cluster) as sc:
        r = await sc.open_reader(name)
        t0, n, nbytes = time.perf_counter(), 0, 0
        while True:
            recs = await r.read(max_records=2000, timeout=0.0)
            if not recs:
                break
            n += len(recs)
            nbytes += sum(len(x.payload) for x in recs)
        dt = time.perf_counter() - t0
        await r.close()
    return n, nbytes, dt


def _session(cores: int, local_dir: str):
    from pyspark.sql import SparkSession

    import stream.spark

    s = (SparkSession.builder.master(f"local[{cores}]").appName("bookstream-bench")
         .config("spark.ui.enabled", "false").config("spark.local.dir", local_dir)
         .config("spark.driver.memory", "2g").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    stream.spark.register(s)
    return s


async def _fill_ledgers(etcd: str, cluster: str, total: int, size: int, ledgers: int = 8) -> list[int]:
    from stream.client import BookKeeperClient

    payload = os.urandom(size)
    per = max(1, total // size // ledgers)
    bk = BookKeeperClient(etcd, cluster)
    ids = []
    try:
        for _ in range(ledgers):
            lh = await bk.create_ledger(3, 3, 2)
            batch = max(1, (4 << 20) // size)
            for k in range(0, per, batch):
                await lh.add_entries([payload] * min(batch, per - k))
            await lh.close()
            ids.append(lh.ledger_id)
    finally:
        await bk.close()
    return ids


async def _put_back(etcd: str, cluster: str, original: dict) -> None:
    """Every fragment's ensemble as it was before the last run (the killed
    bookie named again), so the next run recovers the same data."""
    from metadata.ledgers import Fragment
    from stream.client import BookKeeperClient

    bk = BookKeeperClient(etcd, cluster)
    try:
        for lid, frags in original.items():
            meta, rev = await bk.meta_call(bk.ledgers.read, lid)
            await bk.meta_call(bk.ledgers.add_fragments, lid, [Fragment(f, e) for f, e in frags], meta, rev)
    finally:
        await bk.close()


def recover_bench(mb: int, size: int, cores: list[int], tmp: Path) -> dict:
    """Re-replication of the same lost bookie's data by ``bookstream
    recover`` and by the Spark job with each of ``cores`` (see the module
    docstring)."""
    from bookstream.processes import BookieProcess
    from bookstream.recovery_cli import recover_bookie
    from metadata.etcd_server import ManagedEtcd
    from bench.autorecovery import drop_cache
    from stream.client import SyncBookKeeperClient
    from stream.spark.recover import recover_on_spark

    base, cluster = tmp / "recover", "rerepl"
    procs = [ManagedEtcd(base / "etcd").start()]
    etcd = procs[0].endpoint
    try:
        procs += [BookieProcess(base / f"b{i}", etcd=etcd, cluster=cluster, log_level="WARNING",
                                extra_args=["--registration-ttl", "3"]).start() for i in range(4)]
        _say(f"re-replication: writing {mb} MiB in 8 ledgers E3 Qw3 Qa2 ...")
        ids = asyncio.run(_fill_ledgers(etcd, cluster, mb << 20, size))
        with SyncBookKeeperClient(etcd, cluster) as bk:
            metas = {lid: bk.ledger_metadata(lid) for lid in ids}
        named = {p.bookie_id: sum(p.bookie_id in m.fragments[0].ensemble for m in metas.values()) for p in procs[1:]}
        victim = max(sorted(named), key=named.get)
        original = {lid: [(f.first_entry, f.ensemble) for f in m.fragments] for lid, m in metas.items()}
        next(p for p in procs[1:] if p.bookie_id == victim).kill()
        out: dict = {"ledgers": len(ids), "victim_ledgers": named[victim], "runs": {}}

        def keep(label: str, s: dict) -> None:
            if s["left"] or s["fragments_replaced"] != out["victim_ledgers"]:
                raise SystemExit(f"{label}: not everything re-replicated: {s['left']}")
            out["runs"][label] = {k: s[k] for k in ("fragments_replaced", "bytes_copied", "seconds", "mb_per_s")}
            _say(f"re-replication, {label}: {s['mb_per_s']} MB/s")

        for c in cores:
            asyncio.run(_put_back(etcd, cluster, original))
            if not out["runs"]:
                drop_cache(base)
                keep("recover", asyncio.run(recover_bookie(etcd, cluster, victim, to=None, dry_run=False,
                                                           seal_open=False, show_progress=False)))
                asyncio.run(_put_back(etcd, cluster, original))
            spark = _session(c, str(tmp / "spark-local"))
            try:
                spark.sparkContext.parallelize(range(c), c).count()  # warm: executors' Python workers started
                drop_cache(base)
                keep(f"spark local[{c}]", recover_on_spark(spark, etcd, cluster, victim))
            finally:
                spark.stop()
        plain = out["runs"]["recover"]["mb_per_s"]
        for label, r in out["runs"].items():
            r["ratio_to_recover"] = round(r["mb_per_s"] / plain, 3) if plain else None
        return out
    finally:
        for p in reversed(procs):
            p.stop()


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_bench(a, cores_list: list[int], tmp: Path) -> dict:
    """(1)-(4): the catch-up read, Spark's count() and Parquet, the sink."""
    sa = None
    try:
        etcd, cluster = a.etcd, a.cluster
        if etcd is None:  # etcd and 3 bookies on ports the OS chooses
            from bookstream.processes import BookieProcess
            from metadata.etcd_server import ManagedEtcd

            sa = [ManagedEtcd(tmp / "etcd").start()]
            etcd = sa[0].endpoint
            sa += [BookieProcess(tmp / f"b{i}", etcd=etcd, cluster=cluster, log_level="WARNING").start()
                   for i in range(3)]
        name = "bench-" + uuid.uuid4().hex[:8]
        _say(f"writing {a.mb} MiB of {a.size} B records to stream {name} ...")
        n = asyncio.run(_fill(etcd, cluster, name, a.mb << 20, a.size))
        mb = n * a.size / 1e6
        got, nbytes, dt = asyncio.run(_catch_up(etcd, cluster, name))
        assert got == n, (got, n)
        res: dict = {"records": n, "size": a.size, "MB": mb, "catch_up": {"seconds": dt, "MBps": mb / dt},
                     "spark": {}}
        _say(f"catch-up read (bookstream reader): {mb / dt:.0f} MB/s")
        opts = {"etcd": etcd, "cluster": cluster}
        for cores in cores_list:
            spark = _session(cores, str(tmp / "spark-local"))
            try:
                df = spark.read.format("bookstream").options(stream=name, **opts).load()
                df.limit(1).collect()  # warm: Python workers started
                row: dict = {"partitions": df.rdd.getNumPartitions()}
                # alternated, best of two each: the host's load drifts
                for label, arrow in (("count_arrow", "true"), ("count_tuples", "false")) * 2:
                    d = spark.read.format("bookstream").options(stream=name, arrowBatches=arrow, **opts).load()
                    t = _timed(lambda: d.count() == n or sys.exit("count mismatch"))
                    if label not in row or t < row[label]["seconds"]:
                        row[label] = {"seconds": t, "MBps": mb / t, "ratio_to_catch_up": (mb / t) / (mb / dt)}
                out = tmp / f"parquet-{cores}"
                t = _timed(lambda: df.write.mode("overwrite").parquet(str(out)))
                row["parquet"] = {"seconds": t, "MBps": mb / t, "ratio_to_catch_up": (mb / t) / (mb / dt)}
                shutil.rmtree(out, ignore_errors=True)
                rows = a.sink_rows
                src = spark.range(rows, numPartitions=max(2, cores)).selectExpr(
                    "cast(lpad(cast(id as string), 100, 'x') as binary) as payload").cache()
                src.count()
                log_name = f"bench-log-{uuid.uuid4().hex[:8]}"
                t = _timed(lambda: src.write.format("bookstream").options(log=log_name, **opts)
                           .mode("append").save())
                row["sink_log"] = {"rows": rows, "seconds": t, "rows_per_s": rows / t}
                res["spark"][f"local[{cores}]"] = row
                _say(f"local[{cores}]: {json.dumps(row)}")
            finally:
                spark.stop()
        return res
    finally:
        for p in reversed(sa or []):
            p.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bookstream bench spark", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="MiB written to the stream and read back")
    ap.add_argument("--size", type=int, default=65536, help="bytes per record")
    ap.add_argument("--cores", default="1,2", help="local[N] masters to measure, comma-separated")
    ap.add_argument("--sink-rows", type=int, default=200_000)
    ap.add_argument("--recover-mb", type=int, default=1024, help="MiB of a lost bookie re-replicated (0: skip)")
    ap.add_argument("--skip-read", action="store_true", help="only the re-replication figures")
    ap.add_argument("--etcd", help="an existing cluster's etcd (default: start one with 3 bookies)")
    ap.add_argument("--cluster", default="default")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    tmp = Path(tempfile.mkdtemp(prefix="bookstream-spark-bench-"))
    cores = [int(c) for c in a.cores.split(",")]
    res: dict = {"load_average_at_start": os.getloadavg()}
    try:
        if not a.skip_read:
            res.update(read_bench(a, cores, tmp))
        if a.recover_mb and a.etcd is None:
            res["rereplication"] = recover_bench(a.recover_mb, a.size, cores, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["load_average_at_end"] = os.getloadavg()
    print(json.dumps(res, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
