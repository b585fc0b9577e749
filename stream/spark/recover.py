"""Manual recovery of a lost bookie as a Spark job: ``bookstream recover
BOOKIE --spark [--master URL]``, or through ``spark-submit``:

    spark-submit --master local[2] "$(python -c 'import stream.spark.recover as m; print(m.__file__)')" \\
        BOOKIE --etcd 127.0.0.1:2379 [--seal-open] [--to TARGET] [--dry-run] [--format json]

(the arguments of ``bookstream recover``; the master is spark-submit's).

The driver plans as ``bookstream recover`` does (``plan_bookie``: every
ledger naming the bookie; with ``--seal-open`` it first seals the open
fragments naming it, as the non-Spark command does: fence and recover a
classic ledger, take a stream over), chooses a target per fragment
(``recovery_plan.assign_targets``: never a member of the fragment, spread
over the bookies), and runs **one task per fragment**.  For the job's
duration the driver holds the replication workers' per-ledger locks (one
lease): a worker or another job does not copy the same fragments at the
same time; a ledger locked by someone else is reported left.  A task is the
worker's own per-ledger procedure restricted to its fragment
(``recover_ledger_fragments(..., only={first})``): it plans again on the
metadata of that moment, copies the entries of the lost position from the
surviving replicas (``copier.copy_fragment``: checksums verified, origin
terms kept, acks awaited) and replaces the bookie by CAS through the
life-cycle core (``ReplaceBookie`` in ``run_cas``: a replacement already
made is adopted, a fragment changed meanwhile is left alone, a lost CAS is
judged again).  So a fragment replaced twice, a concurrent writer or
take-over, a lost CAS and a re-run behave exactly as in the non-Spark
command.  A task catches its errors and reports the fragment ``failed``
(one fragment's failure does not abort the others); a task whose Python
worker dies is retried by Spark (``spark.task.maxFailures``) and plans
again.  The summary has the non-Spark command's keys plus ``fragments``
(per fragment: done / skipped / failed, target, entries, bytes, note).
"""
from __future__ import annotations

import logging
import os
import sys
import time

from typing import TYPE_CHECKING

from stream.spark.recovery_plan import FragmentTask, assign_targets, fragment_status, summarize

if TYPE_CHECKING:  # pragma: no cover
    from stream.autorecovery.service import RecoveryLocks

log = logging.getLogger(__name__)


def spark_session(master: str | None = None, app: str = "bookstream-recover"):
    """The session the job runs in: the active one, or one built with
    ``master`` (None: spark-submit's, or Spark's default).  Python workers
    run this interpreter unless ``PYSPARK_PYTHON`` says otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app)
    if master:
        b = b.master(master)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("WARN")
    return s


# -- the executor side ------------------------------------------------------------------------

def recover_fragment(task: dict) -> dict:
    """One task (runs on an executor): ``task`` is ``FragmentTask.as_json()``
    plus ``etcd``, ``cluster``, ``holder`` (the job's lock holder: the
    task stops before copying or replacing once the lock is not the job's)
    and ``copy_token`` (that lock's fencing token, which the copy's clearing
    of its target carries).
    Returns the fragment's result; never raises for a failure of the copy
    or the metadata (reported as failed)."""
    from stream.autorecovery.keys import AutorecoveryKeys
    from stream.autorecovery.service import recover_ledger_fragments
    from stream.autorecovery.worker_core import Pace
    from stream.spark.access import Session

    lid, first = task["ledger_id"], task["first"]
    res = {"ledger_id": lid, "first": first, "last": task["last"], "lost": task["lost"], "planned": task["target"],
           "target": None, "entries": 0, "bytes": 0, "step": "failed", "note": "", "unrecoverable": [],
           "host": os.uname().nodename, "pid": os.getpid()}
    t0 = time.monotonic()
    try:
        with Session(task["etcd"], task["cluster"], **(task.get("security") or {})) as s:
            keys = AutorecoveryKeys(s.bk.store, task["cluster"])
            out = s.run(recover_ledger_fragments(
                s.bk, lid, {task["lost"]}, target=task["target"], seal=False, grace=0.0, only={first},
                pace=Pace.of(task.get("rate") or 0.0),   # this task's limit (a task per fragment)
                keep_going=lambda: keys.still_mine(lid, task["holder"]),  # the job's lock (the driver's)
                copy_token=task["copy_token"]))
        res.update(entries=out.entries, bytes=out.bytes, step=out.step.value, note=out.note,
                   unrecoverable=out.unrecoverable, target=out.replaced[-1][2] if out.replaced else None)
        res["status"] = fragment_status(bool(out.replaced), out.step.value)
    except Exception as e:  # a failed fragment is reported; the others go on
        log.warning("ledger %s fragment %s: %r", lid, first, e)
        res.update(status=fragment_status(False, "failed"), note=f"{type(e).__name__}: {e}")
    res["seconds"] = round(time.monotonic() - t0, 3)
    return res


# -- the driver side --------------------------------------------------------------------------

async def _plan(bk, bookie: str, *, seal_open: bool, to: str | None, locks: "RecoveryLocks | None"):
    """(plans, tasks, left): the ledgers naming ``bookie`` as planned (after
    sealing their open fragments with ``seal_open``), one task per fragment
    job, and what is left: open fragments left to their writers, ledgers
    another recovery holds (with ``locks``: only ledgers the job locked are
    sealed and copied)."""
    import asyncio

    from stream.autorecovery.service import plan_bookie, seal_ledger

    left: list[dict] = []

    async def mine(plans):
        if locks is None:
            return plans
        out = []
        for lid, p in plans:
            holder = await asyncio.to_thread(locks.take, lid)
            if holder is None:
                out.append((lid, p))
            elif not any(x["ledger_id"] == lid for x in left):
                left.append({"ledger_id": lid, "step": "wait", "note": f"being recovered by {holder}",
                             "open_fragment": None})
        return out

    plans = await mine(await plan_bookie(bk, bookie))
    if seal_open and any(p.open_fragment is not None for _, p in plans):
        for lid, p in plans:
            if p.open_fragment is not None:
                try:
                    await seal_ledger(bk, lid, p.mode)
                except Exception as e:  # reported; its sealed fragments are still copied
                    left.append({"ledger_id": lid, "step": "seal", "note": f"{type(e).__name__}: {e}",
                                 "open_fragment": p.open_fragment})
        plans = await mine(await plan_bookie(bk, bookie))
    left += [{"ledger_id": lid, "step": "wait", "note": "an open fragment (its writer owns it)",
              "open_fragment": p.open_fragment}
             for lid, p in plans if p.open_fragment is not None and not any(x["ledger_id"] == lid for x in left)]
    regs = await bk.meta_call(bk.registry.list_bookies, True)
    jobs = [j for _, p in plans for j in p.jobs]
    tasks = assign_targets(jobs, regs, bookie, bk.placement, to)
    return plans, tasks, left


def recover_on_spark(spark, etcd: str, cluster: str, bookie: str, *, to: str | None = None,
                     dry_run: bool = False, seal_open: bool = False, security: dict | None = None,
                     rate: float = 0.0) -> dict:
    """Runs the recovery of ``bookie`` as a Spark job on ``spark``'s
    cluster; returns the summary (``bookstream recover``'s keys, plus
    ``fragments`` and ``spark``).  Safe to interrupt and re-run.  A dry run
    changes nothing (no seal, no lock).  ``security``: ``ClientConfig``
    overrides for a cluster with TLS or etcd auth (the tasks carry them).
    ``rate``: bytes/s each task copies at, at most (0: no limit); the job's
    is that times the tasks running at once."""
    from stream.spark.access import Session

    t0 = time.monotonic()
    sc = spark.sparkContext
    with Session(etcd, cluster, **(security or {})) as s:
        from stream.autorecovery.service import RecoveryLocks

        locks = None if dry_run else RecoveryLocks(s.bk, cluster, "spark-recover")
        try:
            plans, tasks, left = s.run(_plan(s.bk, bookie, seal_open=seal_open and not dry_run, to=to, locks=locks))
            about = {"spark": {"master": sc.master, "default_parallelism": sc.defaultParallelism,
                               "tasks": len(tasks)}}
            if dry_run:
                out = summarize(bookie, plans, [], seconds=time.monotonic() - t0, left=left, extra=about)
                out["dry_run"] = True
                out["plan"] = [t.as_json() for t in tasks]
                return out
            results = _run_tasks(sc, tasks, etcd, cluster, bookie, locks, security, rate) if tasks else []
        finally:
            if locks is not None:
                locks.release()
    return summarize(bookie, plans, results, seconds=time.monotonic() - t0, left=left, extra=about)


def _run_tasks(sc, tasks: list[FragmentTask], etcd: str, cluster: str, bookie: str, locks,
               security: dict | None = None, rate: float = 0.0) -> list[dict]:
    payload = [dict(t.as_json(), etcd=etcd, cluster=cluster, holder=locks.holder, copy_token=locks.held[t.ledger_id],
                    security=security, rate=rate) for t in tasks]
    sc.setJobDescription(f"bookstream recover {bookie}: {len(tasks)} fragment(s)")
    try:
        return sc.parallelize(payload, len(payload)).map(recover_fragment).collect()
    except Exception as e:  # the job itself failed (a task's worker died spark.task.maxFailures times)
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        log.warning("the Spark job failed: %s", why)
        return [dict(t.as_json(), target=None, entries=0, bytes=0, step="failed",
                     status=fragment_status(False, "failed"), unrecoverable=[],
                     note=f"the Spark job failed (this fragment may be done: run again): {why}") for t in tasks]


__all__ = ["recover_on_spark", "recover_fragment", "spark_session", "FragmentTask"]


if __name__ == "__main__":  # spark-submit .../stream/spark/recover.py BOOKIE --etcd ...
    from bookstream.recovery_cli import recover as _command

    _command.main(sys.argv[1:] + ["--spark"], prog_name="spark-submit stream/spark/recover.py")
