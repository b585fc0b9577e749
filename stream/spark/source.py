"""The Spark source: ``spark.read.format("bookstream")`` (batch) and
``spark.readStream.format("bookstream")`` (micro-batch streaming).

Options (names as Spark's Kafka source has them where it has one):

- ``etcd`` (required), ``cluster`` (``default``);
- for a cluster with TLS or etcd authentication: ``tlsCa``, ``tlsCert``,
  ``tlsKey``, ``tlsServerName``, ``etcdCa``, ``etcdCert``, ``etcdKey``,
  ``etcdUser``, ``etcdPassword`` (each defaults to its ``BOOKSTREAM_*``
  variable in the driver's environment: ``stream/spark/access.py``);
- exactly one of ``stream``, ``log``, ``ledger`` (a classic ledger id);
- ``startingPositions``: ``earliest`` (batch default), ``latest``
  (streaming default), the hex of a ``position`` value (that entry
  included) or an offset as JSON ``{"ledger": L, "entry": E}``;
- ``endingPositions`` (batch): ``latest`` (default: the LAC read at
  planning) or a position / offset (excluded);
- ``maxRecordsPerTrigger`` (streaming; Spark 4.2+ also passes its own read
  limits to ``latestOffset(start, limit)``);
- ``failOnDataLoss`` (``true``): a trimmed position is an error; ``false``
  skips to the earliest readable entry with a warning;
- ``minPartitions``, ``maxEntriesPerPartition`` (100,000),
  ``maxBytesPerPartition`` (64 MiB, from the size of the range's first and
  last entries): one input partition per fragment, split by entry range
  when larger;
- ``trimOnCommit`` (``false``, streams only): trim the stream below each
  committed micro-batch;
- ``arrowBatches`` (``true``): tasks return pyarrow record batches (far
  faster than tuples: bench/notes.md; ``false`` returns tuples).

The schema is fixed: ``stream`` string, ``position`` binary, ``ledger``
long, ``entry`` long, ``payload`` binary, ``fragment`` int.  No-op entries
never appear.
"""
from __future__ import annotations

import json
import logging
from typing import Iterator

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from stream.spark import plan
from stream.spark.access import Session, chain_views, entry_bytes, fragment_starts, read_range, security_overrides

try:  # Spark 4.2+
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - Spark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = None

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

log = logging.getLogger(__name__)

SCHEMA = "stream string, position binary, ledger long, entry long, payload binary, fragment int"


def _bool(options, key: str, default: bool) -> bool:
    v = options.get(key)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise plan.PlanError(f"option {key}: expected true or false, not {v!r}")


def _int(options, key: str, default: int | None, minimum: int = 1) -> int | None:
    v = options.get(key)
    if v is None:
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        raise plan.PlanError(f"option {key}: expected an integer, not {v!r}") from None
    if n < minimum:
        raise plan.PlanError(f"option {key}: must be >= {minimum}, not {n}")
    return n


class SourceOptions:
    """The parsed, checked options (picklable: sent to every task)."""

    def __init__(self, options, *, streaming: bool):
        self.etcd = options.get("etcd")
        if not self.etcd:
            raise plan.PlanError('option "etcd" is required (host:port of the cluster\'s etcd)')
        self.cluster = options.get("cluster") or "default"
        self.security = security_overrides(options)
        given = [k for k in plan.KINDS if options.get(k) not in (None, "")]
        if len(given) != 1:
            raise plan.PlanError(f'exactly one of the options "stream", "log", "ledger" is needed, got {given}')
        self.kind = given[0]
        self.name = str(options.get(self.kind))
        if self.kind == "ledger":
            _int(options, "ledger", None)
        self.starting = plan.parse_position_option(
            self.kind, options.get("startingPositions") or ("latest" if streaming else "earliest"),
            option="startingPositions")
        self.ending = plan.parse_position_option(self.kind, options.get("endingPositions") or "latest",
                                                 option="endingPositions")
        if self.ending == "earliest":
            raise plan.PlanError("endingPositions cannot be earliest")
        if streaming and options.get("endingPositions"):
            raise plan.PlanError("endingPositions is for batch reads only")
        self.max_records = _int(options, "maxRecordsPerTrigger", None)
        self.fail_on_data_loss = _bool(options, "failOnDataLoss", True)
        self.min_partitions = _int(options, "minPartitions", 1)
        self.max_entries = _int(options, "maxEntriesPerPartition", 100_000)
        self.max_bytes = _int(options, "maxBytesPerPartition", 64 << 20)
        self.trim_on_commit = _bool(options, "trimOnCommit", False)
        if self.trim_on_commit and self.kind != "stream":
            raise plan.PlanError("trimOnCommit is for streams only")
        self.arrow = _bool(options, "arrowBatches", True)

    def session(self) -> Session:
        return Session(self.etcd, self.cluster, **self.security)

    def label(self) -> str:
        return self.name


class Partition(InputPartition):
    def __init__(self, r: plan.Range):
        super().__init__((r.ledger_id, r.first, r.last, r.fragment))
        self.range = r


def _fill_ledger(spec, views: list[plan.LedgerView], kind: str):
    """A stream's offsets may come without the ledger id: it has one."""
    if isinstance(spec, dict) and kind == "stream" and spec["ledger"] == 0 and views:
        return plan.offset(views[0].ledger_id, spec["entry"])
    return spec


async def _partitions(s, opts: SourceOptions, views, start: dict, end: dict) -> list[Partition]:
    rs = plan.ranges(views, start, end)
    bounds = {}
    max_entries = opts.max_entries
    for r in rs:
        bounds[r.ledger_id] = bounds.get(r.ledger_id, []) + await fragment_starts(s.bk, r.ledger_id, r.first, r.last)
        if r.count > 1:  # large entries: fewer of them per partition
            max_entries = min(max_entries, max(1, opts.max_bytes // await entry_bytes(s.bk, r)))
    pieces = plan.split(rs, bounds, max_entries=max_entries, min_partitions=opts.min_partitions)
    return [Partition(p) for p in pieces]


def read_partition(opts: SourceOptions, partition) -> Iterator:
    """One task: the range's records, as arrow record batches or tuples.
    (Spark hands a plain InputPartition when the plan had none: no rows.)"""
    r = getattr(partition, "range", None)
    if r is None or r.count <= 0:
        return
    with opts.session() as s:
        chunks = read_range(s, r, fail_on_data_loss=opts.fail_on_data_loss)
        try:
            if opts.arrow:
                for rows in chunks:
                    if rows:
                        yield _batch(opts, r, rows)
            else:
                kind, label, lid, frag = opts.kind, opts.label(), r.ledger_id, r.fragment
                for rows in chunks:
                    for eid, payload in rows:
                        yield (label, plan.encode_position(kind, lid, eid), lid, eid, payload, frag)
        finally:
            chunks.close()  # its handle closes before the session does


def _batch(opts: SourceOptions, r: plan.Range, rows: list):
    import numpy as np
    import pyarrow as pa

    n = len(rows)
    ids = np.fromiter((e for e, _ in rows), dtype=np.int64, count=n)
    if opts.kind == "stream":
        width, pos = 8, ids.astype(">i8").tobytes()
    else:
        width = 16
        both = np.empty((n, 2), dtype=">i8")
        both[:, 0], both[:, 1] = r.ledger_id, ids
        pos = both.tobytes()
    offsets = np.arange(0, width * (n + 1), width, dtype=np.int32)
    position = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(pos)])
    label = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                           pa.array([opts.label()])).cast(pa.string())
    return pa.RecordBatch.from_arrays(
        [label, position, pa.array(np.full(n, r.ledger_id, dtype=np.int64)), pa.array(ids),
         pa.array([p for _, p in rows], type=pa.binary()), pa.array(np.full(n, r.fragment, dtype=np.int32))],
        names=["stream", "position", "ledger", "entry", "payload", "fragment"])


class BatchReader(DataSourceReader):
    """A batch read: planned once, up to the LAC read at planning."""

    def __init__(self, options):
        self.opts = SourceOptions(options, streaming=False)

    def partitions(self):
        opts = self.opts
        with opts.session() as s:
            async def go():
                views = await chain_views(s.bk, opts.kind, opts.name)
                start = plan.resolve(views, _fill_ledger(opts.starting, views, opts.kind),
                                     fail_on_data_loss=opts.fail_on_data_loss)
                end = plan.resolve(views, _fill_ledger(opts.ending, views, opts.kind), fail_on_data_loss=True)
                if not plan.at_or_after(views, end, start):
                    return []
                return await _partitions(s, opts, views, start, end)
            parts = s.read(go)
        log.info("bookstream %s %r: %d partitions", opts.kind, opts.name, len(parts))
        return parts

    def read(self, partition: Partition):
        return read_partition(self.opts, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A micro-batch read.  Offsets are where the next read starts
    (``{"ledger": L, "entry": E}``); the latest offset comes from the last
    ledger's LAC (one covering LAC read, plus the metadata of the ledgers
    from the start on)."""

    def __init__(self, options):
        self.opts = SourceOptions(options, streaming=True)
        self._session: Session | None = None
        self._last: dict | None = None        # the last offset handed out (Spark 4.0/4.1 latestOffset())
        self._cap: dict | None = None         # Trigger.AvailableNow: the end fixed when it began

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_session"] = None
        return d

    def _s(self) -> Session:
        if self._session is None:
            self._session = self.opts.session()
        return self._session

    def _views(self, from_ledger: int | None = None):
        opts = self.opts
        s = self._s()
        return s.read(lambda: chain_views(s.bk, opts.kind, opts.name, from_ledger))

    def initialOffset(self) -> dict:
        opts = self.opts
        views = self._views()
        off = plan.resolve(views, _fill_ledger(opts.starting, views, opts.kind),
                           fail_on_data_loss=opts.fail_on_data_loss)
        self._last = off
        return off

    def getDefaultReadLimit(self):
        if self.opts.max_records is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_records)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        if start is None:  # Spark 4.0/4.1: no start, no limit
            start = self._last if self._last is not None else self.initialOffset()
            max_rows = self.opts.max_records
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        else:
            max_rows = None
        views = self._views(start.get("ledger") or None)
        start = self._checked(views, start)
        end = plan.advance(views, start, max_rows)
        if self._cap is not None and plan.at_or_after(views, end, self._cap):
            end = self._cap if plan.at_or_after(views, self._cap, start) else start
        self._last = end
        return end

    def prepareForTriggerAvailableNow(self) -> None:
        self._cap = plan.latest(self._views())

    def reportLatestOffset(self):
        return self._last

    def _checked(self, views, start: dict) -> dict:
        if plan.trimmed(views, start):
            if self.opts.fail_on_data_loss:
                raise plan.PlanError(f"offset {json.dumps(start)} was trimmed "
                                     "(set failOnDataLoss=false to skip to the earliest)")
            log.warning("offset %s was trimmed: skipping to the earliest (failOnDataLoss=false)", start)
            return plan.earliest(views)
        return plan.normalise(views, start)

    def partitions(self, start: dict, end: dict):
        if start == end:
            return []
        opts = self.opts
        s = self._s()

        async def go():
            views = await chain_views(s.bk, opts.kind, opts.name, start.get("ledger") or None)
            a = self._checked(views, start)
            return await _partitions(s, opts, views, a, end)
        return s.read(go)

    def read(self, partition: Partition):
        return read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        if not self.opts.trim_on_commit:
            return
        from stream.stream import AsyncStreamClient, Position

        opts = self.opts

        async def trim():
            async with AsyncStreamClient(opts.etcd, opts.cluster, **opts.security) as sc:
                return await sc.trim(opts.name, Position(end["entry"]))
        n = self._s().run(trim())
        log.info("stream %r: trimmed %d fragments below %s", opts.name, n, end)

    def stop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


__all__ = ["BatchReader", "StreamReader", "SCHEMA", "SourceOptions", "read_partition"]
