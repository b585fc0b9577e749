"""Benchmark of the Spark source and sink (a command, not a test):

    bookstream bench spark [--mb 1024] [--size 65536] [--cores 1,2] [--sink-rows 200000]
                           [--etcd HOST:PORT] [--out r.json]

In one run: a stream of ``--mb`` MiB of ``--size``-byte records is written,
then read back (1) by bookstream's own catch-up reader (one process), then
through a local SparkSession with each of ``--cores`` cores (the local
master's executor threads, each with its Python worker): (2) into a
DataFrame ``count()``, with pyarrow record batches and with tuples, and (3)
into Parquet; (4) the sink writes ``--sink-rows`` rows of 100 B to a log.
Read figures are MB/s of payload, each also as a ratio to the catch-up read
of the same run; the sink in rows/s.  Without ``--etcd`` it starts its own
etcd and 3 bookies (on ports the OS chooses) in a temporary directory.
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


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bookstream bench spark", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="MiB written to the stream and read back")
    ap.add_argument("--size", type=int, default=65536, help="bytes per record")
    ap.add_argument("--cores", default="1,2", help="local[N] masters to measure, comma-separated")
    ap.add_argument("--sink-rows", type=int, default=200_000)
    ap.add_argument("--etcd", help="an existing cluster's etcd (default: start one with 3 bookies)")
    ap.add_argument("--cluster", default="default")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    tmp = Path(tempfile.mkdtemp(prefix="bookstream-spark-bench-"))
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
        for cores in [int(c) for c in a.cores.split(",")]:
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
        print(json.dumps(res, indent=2))
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=2))
    finally:
        for p in reversed(sa or []):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
