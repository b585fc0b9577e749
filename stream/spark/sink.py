"""The Spark sink: ``df.write.format("bookstream")`` and
``df.writeStream.format("bookstream")``.

Parallel tasks never share a writer (they would fence each other): each
task writes its rows, in order, into a fresh classic ledger (tagged with
the job, and noted under the job's pending keys before its first write),
closes it and returns its id.  Then, on the driver:

- ``option("log", name)``: ``commit`` appends every task's ledger to the
  log's list in one etcd transaction, in partition order, with the batch id
  of a streaming query (a replayed batch is not appended twice: exactly
  once); ledgers of failed task attempts are deleted first; ``abort``
  deletes every ledger of the job (``commit.py``).
- ``option("stream", name)``: ``commit`` takes the stream over with one
  writer and copies the task ledgers into it in partition order, then
  deletes them.  A streaming query: exactly once (``_copy_batch_once``: the
  batch being copied is recorded, with its writer's term and first entry,
  before the first append; a replay skips what the dead attempt's writer
  got into the stream), provided the replayed batch has the same rows in
  the same order per partition (a deterministic replay, as from bookstream
  or Kafka through map-like steps).  A batch job: at least once (a job that
  fails during the copy and is run again copies it again).

Options: ``etcd``, ``cluster``, the source's TLS and etcd authentication
options (``tlsCa`` ... ``etcdPassword``), ``log`` | ``stream``; ``ensembleSize``,
``writeQuorum``, ``ackQuorum`` of the task ledgers (3, 2, 2); streaming:
``sinkId`` (what names the query for exactly-once; default: its
``checkpointLocation``); ``password`` of a stream created with one (the
commit's writer opens it with it; a missing stream is created with it).
Column ``payload`` (binary or string) is required.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import socket
import uuid

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from metadata.layout import KeyLayout
from stream import errors as err
from stream.spark import commit as cm
from stream.spark.access import Session, security_overrides
from stream.spark.plan import PlanError

log = logging.getLogger(__name__)

CHUNK_ENTRIES = 1000      # entries per append_many call
CHUNK_BYTES = 1 << 20     # ... or fewer, to stay under this many bytes
IN_FLIGHT = 16            # chunks issued and not yet acknowledged, per task


class SinkError(ValueError):
    """Bad input to the sink (a missing or null payload): not retriable."""

    retriable = False


@dataclasses.dataclass
class LedgerWritten(WriterCommitMessage):
    partition: int
    ledger_id: int | None     # None: the partition had no rows
    count: int


def _int(options, key: str, default: int) -> int:
    try:
        return int(options.get(key) or default)
    except ValueError:
        raise PlanError(f"option {key}: expected an integer, not {options.get(key)!r}") from None


def check_payload(schema) -> None:
    """The ``payload`` column must exist and be binary or string."""
    from pyspark.sql.types import BinaryType, StringType

    names = {f.name.lower(): f for f in schema.fields}
    f = names.get("payload")
    if f is None:
        raise SinkError(f"the bookstream sink needs a column named payload (binary or string); "
                        f"the columns are {[x.name for x in schema.fields]}")
    if not isinstance(f.dataType, (BinaryType, StringType)):
        raise SinkError(f"column payload must be binary or string, not {f.dataType.simpleString()}")


class _Options:
    def __init__(self, options, schema, *, streaming: bool):
        self.etcd = options.get("etcd")
        if not self.etcd:
            raise PlanError('option "etcd" is required (host:port of the cluster\'s etcd)')
        self.cluster = options.get("cluster") or "default"
        self.security = security_overrides(options)
        given = [k for k in ("log", "stream") if options.get(k)]
        if len(given) != 1:
            raise PlanError(f'the sink needs exactly one of the options "log", "stream", got {given}')
        self.kind, self.name = given[0], options.get(given[0])
        self.password = options.get("password") or None  # of a password stream (its writer needs it)
        if self.password is not None and self.kind != "stream":
            raise PlanError('option "password" is for a stream sink (option "stream"): logs have none')
        self.config = (_int(options, "ensembleSize", 3), _int(options, "writeQuorum", 2),
                       _int(options, "ackQuorum", 2))
        check_payload(schema)
        self.payload = next(f.name for f in schema.fields if f.name.lower() == "payload")
        self.sink = None
        if streaming:
            self.sink = options.get("sinkId") or options.get("checkpointLocation")
            if not self.sink:
                raise PlanError('a streaming bookstream sink needs option "sinkId" or "checkpointLocation" '
                                '(it names the query, so a replayed batch is written once)')

    def session(self) -> Session:
        return Session(self.etcd, self.cluster, **self.security)


def _payloads(batch, column: str) -> list:
    import pyarrow as pa

    col = batch.column(batch.schema.get_field_index(column))
    if col.null_count:
        raise SinkError(f"column {column} holds {col.null_count} nulls: every row needs a payload")
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary() if pa.types.is_string(col.type) else pa.large_binary())
    return col.to_pylist()


def _chunks(payloads: list):
    i, n = 0, len(payloads)
    while i < n:
        j, size = i, 0
        while j < n and j - i < CHUNK_ENTRIES and (size == 0 or size + len(payloads[j]) <= CHUNK_BYTES):
            size += len(payloads[j])
            j += 1
        yield payloads[i:j]
        i = j


def write_task(opts: _Options, job: str, batches) -> LedgerWritten:
    """One task: its rows into a fresh classic ledger, closed at the end.
    On an error the ledger is deleted (a task killed outright leaves it to
    the job's commit or abort, which find it under the pending keys)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    count = 0
    with opts.session() as s:
        bk = s.bk
        lh = None
        inflight: collections.deque = collections.deque()

        async def create():
            h = await bk.create_ledger(*opts.config, custom={"spark-job": job, "spark-partition": str(part)})
            await cm.note_pending(bk, job, h.ledger_id, partition=part, attempt=attempt, pid=os.getpid(),
                                  host=socket.gethostname())
            return h

        async def issue(chunk):
            while True:
                if len(inflight) < IN_FLIGHT:
                    try:
                        inflight.append(lh.add_entries_async(chunk))
                        return
                    except err.TooManyPendingAdds:
                        pass
                await inflight.popleft()

        async def finish():
            while inflight:
                await inflight.popleft()
            await lh.close()

        try:
            for batch in batches:
                payloads = _payloads(batch, opts.payload)
                if not payloads:
                    continue
                if lh is None:
                    lh = s.run(create())
                for chunk in _chunks(payloads):
                    s.run(issue(chunk))
                count += len(payloads)
            if lh is not None:
                s.run(finish())
        except BaseException:
            if lh is not None:
                try:
                    s.run(cm.drop_ledgers(bk, job, [lh.ledger_id]), timeout=30)
                except Exception as e:  # the job's commit or abort finds it
                    log.info("ledger %s of a failed task not deleted: %s", lh.ledger_id, e)
            raise
    return LedgerWritten(part, lh.ledger_id if lh is not None else None, count)


def _ordered(messages) -> list[int]:
    ms = sorted((m for m in messages if m is not None), key=lambda m: m.partition)
    return [m.ledger_id for m in ms if m.ledger_id is not None]


async def copy_into_stream(bk, name: str, ledger_ids: list[int], etcd: str, cluster: str, *,
                           start=None, done=None, password: str | None = None, security: dict | None = None) -> int:
    """Appends the ledgers' entries, in order, to stream ``name`` with one
    writer (taking the stream over; created if missing).  ``start(w)``
    (async), called once the writer holds the stream, returns how many of
    the records to skip (copied by an earlier attempt); ``done(w)`` (async)
    runs once every append is acknowledged, before the writer closes.
    ``password``: the stream's (UnauthorizedAccess without it when it has one);
    ``security``: ``ClientConfig`` overrides (``access.security_overrides``).
    Returns the count appended."""
    from stream.stream import AsyncStreamClient, StreamConfig

    n = 0
    async with AsyncStreamClient(etcd, cluster, **(security or {})) as sc:
        w = await sc.open_writer(name, StreamConfig(password=password) if password is not None else None)
        try:
            skip = 0 if start is None else await start(w)
            pending: collections.deque = collections.deque()
            for lid in ledger_ids:
                h = await bk.open_ledger(lid, recovery=False)
                last = h.last_add_confirmed
                a = min(last + 1, skip)  # whole ledgers (and a ledger's head) copied before: skipped
                skip -= a
                while a <= last:
                    b = min(last, a + CHUNK_ENTRIES - 1)
                    payloads = [e.payload for e in await h.read_entries(a, b)]
                    while len(pending) >= IN_FLIGHT:
                        await pending.popleft()
                    pending.append(w.append_many_async(payloads))
                    n += len(payloads)
                    a = b + 1
                await h.close()
            while pending:
                await pending.popleft()
            if done is not None:
                await w.flush()
                await done(w)
        finally:
            await w.close()
    return n


async def copied_before(w, pending: dict) -> int:
    """How many records of the batch ``pending`` describes are in the
    stream: those earlier attempts counted (``before``) plus the records of
    the last attempt's writer (its ``term``) from entry ``first`` on that
    survived its end.  One writer appends in order and a take-over's
    recovery keeps a prefix of what it appended (no holes: origin terms),
    so they are the next records of the batch, in order.  ``w`` holds the
    stream now (its take-over fixed the end)."""
    from bookie.entry import FLAG_NOOP

    h, first, n = w.handle, pending["first"], 0
    last = h.last_add_confirmed
    while first <= last:
        b = min(last, first + CHUNK_ENTRIES - 1)
        n += sum(1 for e in await h.read_entries(first, b)
                 if e.origin == pending["term"] and not e.data_flags & FLAG_NOOP)
        first = b + 1
    return pending["before"] + n


class _Commit:
    """The driver side shared by the batch and the streaming writer."""

    opts: _Options
    job: str

    def _commit(self, messages, batch_id: int | None) -> None:
        opts, ids = self.opts, _ordered(messages)
        with opts.session() as s:
            if opts.kind == "log":
                s.run(cm.commit_to_log(s.bk, opts.name, self.job, ids, sink=opts.sink, batch_id=batch_id))
                return
            s.run(self._commit_stream(s.bk, ids, batch_id))

    async def _commit_stream(self, bk, ids: list[int], batch_id: int | None) -> None:
        opts = self.opts
        garbage = sorted(set(await cm.pending_ledgers(bk, self.job)) - set(ids))
        await cm.drop_ledgers(bk, self.job, garbage)
        if opts.sink is None:  # a batch job: at least once (a failed job re-run copies again)
            n = await copy_into_stream(bk, opts.name, ids, opts.etcd, opts.cluster, password=opts.password,
                                           security=opts.security)
        else:
            n = await self._copy_batch_once(bk, ids, batch_id)
        log.info("stream %s: appended %d records from ledgers %s (batch %s)", opts.name, n, ids, batch_id)
        await cm.drop_ledgers(bk, self.job, ids)

    async def _copy_batch_once(self, bk, ids: list[int], batch_id: int) -> int:
        """A streaming batch into the stream, exactly once.  The sink's
        record in etcd says which batch was copied last; before its first
        append, a commit CASes into it the batch it is copying (``pending``:
        the batch id, its writer's term, the entry of its first append, the
        records copied by earlier attempts), and once every append is
        acknowledged, CASes it to "batch copied".  A replay after a driver
        died in between counts what the dead attempt's writer got into the
        stream (``copied_before``) and copies only the rest."""
        opts = self.opts
        key = cm.sink_key(KeyLayout(bk.cluster), "stream", opts.name, opts.sink)
        record, rev = await cm.read_sink(bk, key)
        if batch_id <= record["batch"]:
            log.info("stream %s: batch %s was written before: skipped", opts.name, batch_id)
            return 0
        base = {"batch": record["batch"], "stream": opts.name, "sink": opts.sink}

        async def start(w) -> int:
            nonlocal rev
            prior = record.get("pending")
            skip = await copied_before(w, prior) if prior and prior["batch"] == batch_id else 0
            first = w.handle.last_add_confirmed + 1
            rev = await cm.cas_sink(bk, key, dict(base, pending={"batch": batch_id, "term": w.term,
                                                                 "first": first, "before": skip}), rev)
            if skip:
                log.info("stream %s: batch %s: %d records copied by an earlier attempt", opts.name, batch_id, skip)
            return skip

        async def done(w) -> None:
            await cm.cas_sink(bk, key, dict(base, batch=batch_id), rev)

        return await copy_into_stream(bk, opts.name, ids, opts.etcd, opts.cluster, start=start, done=done,
                                      password=opts.password, security=opts.security)

    def _abort(self) -> None:
        with self.opts.session() as s:
            gone = s.run(cm.abort(s.bk, self.job, self.opts.name if self.opts.kind == "log" else None))
        log.info("bookstream sink job %s aborted: deleted ledgers %s", self.job, gone)


class BatchWriter(_Commit, DataSourceArrowWriter):
    def __init__(self, options, schema, overwrite: bool):
        if overwrite:
            raise PlanError("the bookstream sink appends: mode overwrite is not supported")
        self.opts = _Options(options, schema, streaming=False)
        self.job = uuid.uuid4().hex

    def write(self, iterator):
        return write_task(self.opts, self.job, iterator)

    def commit(self, messages) -> None:
        self._commit(messages, None)

    def abort(self, messages) -> None:
        self._abort()


class StreamingWriter(_Commit, DataSourceStreamArrowWriter):
    """Spark makes this object again for every commit: the job id comes from
    what names the query, so the commit finds the pending ledgers its tasks
    noted (micro-batches of a query run one after the other, so whatever is
    pending under it at a commit is that batch's, or a dead run's)."""

    def __init__(self, options, schema, overwrite: bool):
        if overwrite:
            raise PlanError("the bookstream sink appends: output mode complete is not supported")
        self.opts = _Options(options, schema, streaming=True)
        o = self.opts
        self.job = "q" + hashlib.sha256(f"{o.kind}/{o.name}/{o.sink}".encode()).hexdigest()[:31]

    def write(self, iterator):
        return write_task(self.opts, self.job, iterator)

    def commit(self, messages, batchId: int) -> None:
        self._commit(messages, batchId)

    def abort(self, messages, batchId: int) -> None:
        self._abort()


__all__ = ["BatchWriter", "StreamingWriter", "SinkError", "LedgerWritten", "check_payload"]
