"""The Spark package's adapter to bookstream's client: reading the chain's
ledger views and fragment boundaries (driver side, for planning) and
reading one planned range of entries (executor side, for a task).

Everything goes through the public client: ``BookKeeperClient``,
``LedgerHandle.read_records`` (range reads from the fragment's bookies, the
records kept in the frames the bookies sent: no ``Entry`` per record),
``read_lac_covering`` and the ledger metadata store.  A :class:`Session` is
a client on its own event-loop thread, so the synchronous Spark callbacks
can use it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Iterator

from bookstream_pb import metadata_pb2 as mpb
from metadata.layout import KeyLayout
from metadata.ledgers import Fragment, LedgerMode, LedgerState
from metadata.tls import CLIENT_SETTINGS, TlsConfigError, client_security
from stream import errors as err
from stream.client import BookKeeperClient
from stream.sync_client import BackgroundLoop
from stream.ledger import LedgerHandle, read_lac_covering
from stream.log import check_truncated, read_ledger_list
from stream.record_batch import RecordBatch
from stream.spark.plan import LedgerView, PlanError, Range

log = logging.getLogger(__name__)


def _camel(setting: str) -> str:
    head, *rest = setting.split("_")
    return head + "".join(w.capitalize() for w in rest)


# The options for a cluster with TLS or etcd authentication (metadata/tls.py
# CLIENT_SETTINGS, camel-cased as Spark's options are), each falling back to
# the BOOKSTREAM_* variable the command line reads (what `bookstream
# standalone --tls --etcd-auth` prints to export): option -> variable.
SECURITY_OPTIONS = {_camel(k): env for k, env in CLIENT_SETTINGS.items()}


def security_overrides(options) -> dict:
    """``ClientConfig`` overrides (``tls``, ``etcd_tls``, ``etcd_auth``) from a
    source's or sink's options, resolved on the driver: the planned tasks
    carry them (picklable), so executors need no environment of their own.
    Spark's options are case-insensitive; a bad combination (a server name
    without TLS, a user without a password) is a one-line error."""
    import os

    v = {}
    for setting, env in CLIENT_SETTINGS.items():
        name = _camel(setting)
        given = options.get(name)
        if given is None:
            given = options.get(name.lower())
        v[setting] = given if given not in (None, "") else os.environ.get(env)
    try:
        return client_security(v)
    except TlsConfigError as e:
        raise PlanError(f"TLS or etcd options: {e}") from None


class Session:
    """A BookKeeperClient on a background event loop (one per process that
    needs one: the planner, a task)."""

    def __init__(self, etcd: str, cluster: str = "default", **overrides):
        self._bg = BackgroundLoop("bookstream-spark")
        self.layout = KeyLayout(cluster)

        async def make() -> BookKeeperClient:
            return BookKeeperClient(etcd, cluster, **overrides)

        self.bk: BookKeeperClient = self._bg.run(make())

    def run(self, coro, timeout: float | None = None):
        return self._bg.run(coro, timeout)

    def read(self, make, attempts: int = 5):
        """Runs ``make()`` (a coroutine factory for reads only: safe to run
        again) and retries it on retriable errors (an etcd or bookie that
        did not answer in time: a loaded machine, a restart), backing off."""
        for k in range(attempts):
            try:
                return self._bg.run(make())
            except err.BookKeeperError as e:
                if not e.retriable or k == attempts - 1:
                    raise
                log.info("retrying a read after %r", e)
                time.sleep(0.2 * 2 ** k)

    def submit(self, coro):
        """Starts ``coro`` on the loop; a concurrent.futures.Future."""
        return asyncio.run_coroutine_threadsafe(coro, self._bg.loop)

    def close(self) -> None:
        if not self._bg.closing:
            self._bg.close(self.bk.close())

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- the chain ------------------------------------------------------------------------------------

async def stream_ledger(bk: BookKeeperClient, name: str) -> int:
    v = await bk.meta_call(bk.store.get, KeyLayout(bk.cluster).stream_key(name))
    if v is None:
        raise err.NoSuchStream(name)
    rec = mpb.StreamRecord()
    rec.ParseFromString(v.value)
    return rec.ledger_id


async def log_ledgers(bk: BookKeeperClient, name: str) -> tuple[list[int], int | None]:
    """A log's ledger list and its key's mod_revision (None: no such log)."""
    return await read_ledger_list(bk, name)


async def chain_ids(bk: BookKeeperClient, kind: str, name: str) -> list[int]:
    if kind == "stream":
        return [await stream_ledger(bk, name)]
    if kind == "log":
        ids, rev = await log_ledgers(bk, name)
        if rev is None:
            raise err.NoSuchLedger(None, f"no log named {name!r}")
        return ids
    return [int(name)]


async def ledger_view(bk: BookKeeperClient, lid: int) -> LedgerView:
    """What a reader can read of the ledger now.  The LAC comes from a
    covering read of the last fragment's bookies (no fence); the planner
    reads the fragments after it, so they cover every entry up to it."""
    meta, _ = await bk.meta_call(bk.ledgers.read, lid, fragments="last")
    first = meta.trimmed_before if meta.mode is LedgerMode.UNBOUNDED else 0
    if meta.state is LedgerState.CLOSED:
        return LedgerView(lid, first, meta.last_entry, True)
    if meta.last_fragment is None:
        return LedgerView(lid, first, -1, False)
    lac = await read_lac_covering(bk, meta)
    return LedgerView(lid, first, max(lac, first - 1), False)


async def chain_views(bk: BookKeeperClient, kind: str, name: str, from_ledger: int | None = None) -> list[LedgerView]:
    """The chain's views, from ledger ``from_ledger`` on when it is in the
    chain (the ones before it are not needed).  A ledger deleted meanwhile
    (a log truncated under us) is left out; one its log still lists raises
    NoSuchLedger (``log.check_truncated``)."""
    ids = await chain_ids(bk, kind, name)
    keep = ids[ids.index(from_ledger):] if from_ledger in ids else ids
    views, gone = [], []
    for lid, v in zip(keep, await asyncio.gather(*(ledger_view(bk, lid) for lid in keep), return_exceptions=True)):
        if isinstance(v, err.NoSuchLedger):
            gone.append(lid)
        elif isinstance(v, BaseException):
            raise v
        else:
            views.append(v)
    if gone and kind == "log":
        await check_truncated(bk, name, gone)   # (still listed: lost, said; truncated meanwhile: left out)
    return views


async def fragment_starts(bk: BookKeeperClient, lid: int, first: int, last: int) -> list[tuple[int, int]]:
    """(index, first entry) of the fragments of ``lid`` that hold entries
    ``first..last``; index counts the ledger's fragments held now."""
    layout = bk.ledgers.layout
    prefix = layout.fragments_prefix(lid)
    try:
        f0: Fragment = await bk.meta_call(bk.ledgers.fragment_for, lid, first)
    except err.BookKeeperError:
        return [(0, first)]
    k0 = layout.fragment_key(lid, f0.first_entry)
    index = await bk.meta_call(bk.store.count_range, prefix, k0)
    out = [(index, f0.first_entry)]
    after = k0
    while True:
        rows = await bk.meta_call(bk.store.range, prefix, 256, after)
        for key, v in rows:
            f = Fragment.from_bytes(v.value)
            if f.first_entry > last:
                return out
            index += 1
            out.append((index, f.first_entry))
            after = key
        if len(rows) < 256:
            return out


async def entry_bytes(bk: BookKeeperClient, r: Range) -> int:
    """About how many bytes an entry of the range takes: the larger of its
    first and its last (one of them may be a no-op), for sizing partitions."""
    meta, rev = await bk.meta_call(bk.ledgers.read, r.ledger_id, fragments="last")
    h = LedgerHandle(bk, meta, rev, writable=False, lac=r.last)
    try:
        sizes = [len(e.payload) for e in await asyncio.gather(h.read_entry(r.first), h.read_entry(r.last))]
    finally:
        await h.close()
    return 52 + max(sizes)


# -- a task's read --------------------------------------------------------------------------------

def read_range(session: Session, r: Range, *, chunk_bytes: int = 8 << 20, first_chunk: int = 256,
               fail_on_data_loss: bool = True) -> Iterator[tuple[int, list]]:
    """The entries of ``r`` as (entry id, payload) lists per chunk, no-ops
    left out, in order; the next chunk is read while the caller handles one.
    Chunks are sized to about ``chunk_bytes`` from the entries seen so far.
    Entries trimmed under the read raise PositionTrimmed, or end the range
    with a warning when not ``fail_on_data_loss``."""
    lid = r.ledger_id

    async def handle() -> LedgerHandle:
        meta, rev = await session.bk.meta_call(session.bk.ledgers.read, lid, fragments="last")
        return LedgerHandle(session.bk, meta, rev, writable=False, lac=r.last)

    try:
        h = session.read(handle)
    except err.NoSuchLedger as e:
        if fail_on_data_loss:
            raise err.PositionTrimmed(str(lid), r.first, 0) from e
        log.warning("ledger %s is gone: entries %s..%s skipped (failOnDataLoss=false)", lid, r.first, r.last)
        return

    async def chunk(a: int, b: int) -> RecordBatch:
        try:
            return await h.read_records(a, b)
        except (err.ReadFailed, err.EntryMissing) as e:
            meta = await h.refresh_metadata()
            if a < meta.trimmed_before:
                raise err.PositionTrimmed(str(lid), a, meta.trimmed_before) from e
            raise

    n = max(1, min(first_chunk, r.count))
    a, at = r.first + n, r.first  # the next chunk's first entry; the pending one's
    pending = session.submit(chunk(at, a - 1))
    try:
        while pending is not None:
            try:
                batch = pending.result()
            except err.PositionTrimmed:
                if fail_on_data_loss:
                    raise
                log.warning("ledger %s: entries from %s trimmed during the read: skipped "
                            "(failOnDataLoss=false)", lid, at)
                return
            count = a - at  # the chunk's entries, no-ops (no payload, in no batch) included
            size = batch.payload_bytes + 64 * count
            n = max(1, min(10_000, chunk_bytes * count // max(1, size)))
            pending = None
            if a <= r.last:
                b = min(r.last, a + n - 1)
                pending, at = session.submit(chunk(a, b)), a
                a = b + 1
            yield list(zip(batch.entry_ids(), batch))
    finally:
        if pending is not None:
            pending.cancel()
        try:
            session.run(h.close())
        except err.ClientClosed:
            pass
