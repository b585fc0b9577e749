"""Streams: the main API.  A stream is one unbounded, term-based ledger,
written by one writer at a time.

    with StreamClient("127.0.0.1:2379") as sc:
        with sc.open_writer("orders") as w:          # takes the stream over
            pos = w.append(b"order 1")               # -> Position
        with sc.open_reader("orders", Position.EARLIEST) as r:
            for rec in r.read(timeout=1.0):
                print(rec.position, rec.payload)

Opening a writer *takes the stream over* (../shared/seeds/unbounded-ledgers-
terms.txt, ../shared/notes/protocol-rules.md):

1. the stream's term is incremented in etcd by CAS, with the state set to
   IN_RECOVERY;
2. recovery runs on the last fragment with the new term: LAC/LAFR reads that
   carry the term (so the previous writer's adds now fail with INVALID_TERM),
   coverage Qw - Qa + 1 per write quorum, read forward from LAFR + 1, write
   back, and a truncate-flagged no-op at the first absent entry that every
   bookie of the fragment must acknowledge;
3. the state goes back to OPEN by CAS (with the recovery's ensemble change,
   if a bookie had to be replaced), and appends continue after the no-op.

The writer and the recovery are the same code as classic ledgers'
(``stream.ledger``: one write path, one recovery path, one read path),
driven in term mode: guaranteed write quorum, fragments rolled by size onto
a freshly chosen ensemble.  Readers read up to the LAC and never see no-ops.

``AsyncStreamClient`` is the asyncio form; ``StreamClient`` the blocking one (stream/blocking.py)
(its event loop runs in a background thread, and appends cross over to it in
batches: ``linger`` and ``max_batch_bytes``).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Sequence

from bookstream_pb import metadata_pb2 as mpb
from metadata import errors as me
from metadata.layout import KeyLayout
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, validate_config
from stream import errors as err
from stream import password as ledger_password
from stream.bookie_client import BookieUnavailable
from stream.client import BookKeeperClient, ClientConfig
from stream.ledger import LedgerHandle, WriterOptions, read_lac_covering
from stream import lifecycle as lc
from stream.ledger_recovery import RecoveryDriver
from stream.lifecycle import FinishTakeOver, Moot, TakeOver, run_ledger_cas
from stream.metrics import timed_takeover
from stream.placement import get_policy
from stream.position import Position, Positions, Record
from stream.record_batch import RecordBatch
from stream.stream_reader import READ_AHEAD_BYTES, AsyncStreamReader, _check_read_ahead, _check_read_rate
from stream.writer_lease import WriterRecord, WriterRegistration

if TYPE_CHECKING:  # pragma: no cover
    from stream.blocking import StreamClient, StreamReader, StreamWriter  # noqa: F401 (see __getattr__)

log = logging.getLogger(__name__)



# -- configuration ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """How a stream is created (E/Qw/Qa) and written."""

    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    fragment_size_bytes: int = 256 << 20   # roll the fragment at this size (0: never)
    fragment_size_entries: int = 0         # ... or at this many entries (0: never)
    placement: str = "random"
    linger: float = 0.001                  # blocking API: gather appends this long
    max_batch_bytes: int = 1 << 20         # ... or until this many bytes
    # A password (stream/password.py): set when the stream is created, then
    # needed by every writer and reader (UnauthorizedAccess); the bookies
    # check the key derived from it.
    password: bytes | str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        """Validated here, not when a writer opens: InvalidLedgerConfig."""
        try:
            validate_config(self.ensemble_size, self.write_quorum, self.ack_quorum)
        except me.InvalidLedgerConfig as e:
            raise err.InvalidLedgerConfig(str(e)) from None
        for name in ("fragment_size_bytes", "fragment_size_entries", "max_batch_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise err.InvalidLedgerConfig(f"StreamConfig.{name} must be an int >= 0, got {v!r}")
        if self.max_batch_bytes < 1:
            raise err.InvalidLedgerConfig(f"StreamConfig.max_batch_bytes must be >= 1, got {self.max_batch_bytes}")
        if isinstance(self.linger, bool) or not isinstance(self.linger, (int, float)) or not 0 <= self.linger <= 60:
            raise err.InvalidLedgerConfig(f"StreamConfig.linger must be seconds in [0, 60], got {self.linger!r}")
        get_policy(self.placement)  # InvalidLedgerConfig for an unknown one
        ledger_password.custom_with_password(None, self.password)  # InvalidLedgerConfig for a bad one


# -- take-over ------------------------------------------------------------------------------

@timed_takeover
async def take_over(bk: BookKeeperClient, ledger_id: int) -> tuple[LedgerMetadata, int, int]:
    """Makes this client the ledger's writer in a new term.  Returns the
    OPEN metadata, its revision, and the first entry id to append at.

    The metadata steps are ``stream.lifecycle``'s :class:`TakeOver` (term +
    1, IN_RECOVERY) and :class:`FinishTakeOver` (OPEN, with the recovery's
    ensemble change), each through the one CAS runner.  The term is raised
    once per call; recovery is retried within that term, backing off, up to
    ``recovery_attempts`` runs (recovery with the same term again is the same
    recoverer again: its fencing, reads and writes carry the term the
    bookies already hold).

    Raises WriterFenced when a newer term takes over meanwhile, and
    LedgerRecoveryFailed (retriable; ``missing`` names the bookies that did
    not answer or could not be replaced) when recovery could not finish:
    the ledger stays IN_RECOVERY at this term until the next take-over."""
    cfg = bk.config
    begun = await run_ledger_cas(bk, TakeOver(ledger_id, cfg.mutations))
    v = begun.verdict
    if isinstance(v, Moot):
        raise (err.InvalidLedgerConfig(f"ledger {ledger_id} is not an unbounded ledger") if v.kind == lc.WRONG_MODE
               else err.NoSuchLedger(ledger_id))
    if not begun.applied:
        raise err.LedgerRecoveryFailed(f"ledger {ledger_id}: could not raise the term: {v.why}")
    mine, rev = begun.meta, begun.revision
    assert mine is not None
    if bk.tracer is not None:
        bk.tracer.step("StartTakeover", mine.term, lid=ledger_id)
    log.info("ledger %s: taking over at term %d", ledger_id, mine.term)
    failure: BaseException | None = None
    missing: tuple[str, ...] = ()
    for attempt in range(cfg.recovery_attempts):
        if attempt:
            await asyncio.sleep(min(0.1 * 2 ** (attempt - 1), cfg.change_retry_max))
            cur, _ = await bk.meta_call(bk.ledgers.read, ledger_id, fragments="last")
            still = FinishTakeOver(ledger_id, mine.term, None, cfg.mutations).judge(cur)
            if isinstance(still, Moot):  # a newer take-over
                raise err.WriterFenced(f"ledger {ledger_id}: {still.why}", cur.term)
            if missing:
                await bk.refresh_bookies(missing)  # restarted meanwhile? a fresh channel asks at once
        try:
            result = await RecoveryDriver(bk, mine).run()
        except err.LedgerFenced as e:  # a newer term's reads reached the bookies first
            raise err.WriterFenced(f"ledger {ledger_id}: a newer term took over during recovery: {e}") from e
        except err.LedgerRecoveryFailed as e:
            failure, missing = e, e.missing
            log.info("%s (attempt %d of %d at term %d)", e, attempt + 1, cfg.recovery_attempts, mine.term)
            continue
        change = None if result.ensemble_change is None else Fragment(result.ensemble_change[0],
                                                                      tuple(result.ensemble_change[1]))
        done = await run_ledger_cas(bk, FinishTakeOver(ledger_id, mine.term, change, cfg.mutations),
                                    known=(mine, rev))
        v = done.verdict
        if bk.tracer is not None and (isinstance(v, Moot) or done.applied):
            bk.tracer.step("NoticeTakeover" if isinstance(v, Moot) else "Finish", lid=ledger_id)
        if isinstance(v, Moot):
            term = done.meta.term if done.meta is not None else mine.term
            raise err.WriterFenced(f"ledger {ledger_id}: {v.why}", term)
        if not done.applied:
            raise err.LedgerRecoveryFailed(f"ledger {ledger_id}: the final CAS of the take-over kept failing: "
                                           f"{v.why}")
        assert done.meta is not None
        log.info("ledger %s: term %d open; recovered %d entries, appends from %d", ledger_id,
                 done.meta.term, len(result.recovered), result.next_entry)
        return done.meta, done.revision, result.next_entry
    raise err.LedgerRecoveryFailed(f"ledger {ledger_id}: take-over at term {mine.term} did not complete "
                                   f"after {cfg.recovery_attempts} recovery runs: {failure}", missing=missing)


# -- the asyncio API --------------------------------------------------------------------------

class AsyncStreamClient:
    """Streams over one BookKeeperClient (etcd + the bookies)."""

    def __init__(self, etcd_endpoints: str | list[str], cluster: str = "default",
                 config: ClientConfig | None = None, **overrides):
        self.bk = BookKeeperClient(etcd_endpoints, cluster, config, **overrides)
        self.layout = KeyLayout(cluster)
        self._readers: weakref.WeakSet[AsyncStreamReader] = weakref.WeakSet()  # closed with the client
        self._writers: weakref.WeakSet[AsyncStreamWriter] = weakref.WeakSet()  # registrations ended at close

    # -- names ---------------------------------------------------------------------------------

    async def _lookup(self, name: str) -> int | None:
        key = self.layout.stream_key(name)
        v = await self.bk.meta_call(self.bk.store.get, key)
        if v is None:
            return None
        rec = mpb.StreamRecord()
        rec.ParseFromString(v.value)
        return rec.ledger_id

    async def _create(self, name: str, config: StreamConfig) -> int:
        """Creates the stream's ledger and names it; if another client named
        one first, its ledger wins and ours is deleted."""
        bk = self.bk
        policy = get_policy(config.placement)
        ensemble = await bk.choose_bookies(config.ensemble_size, (), policy)
        header = LedgerMetadata(config.ensemble_size, config.write_quorum, config.ack_quorum,
                                mode=LedgerMode.UNBOUNDED,
                                fragment_size_bytes=config.fragment_size_bytes,
                                fragment_size_entries=config.fragment_size_entries,
                                custom=ledger_password.custom_with_password({"stream": name}, config.password))
        meta, _ = await bk.meta_call(bk.ledgers.create, header, ensemble)
        rec = mpb.StreamRecord(name=name, ledger_id=meta.ledger_id)
        try:
            await bk.meta_call(bk.store.create, self.layout.stream_key(name), rec.SerializeToString())
            log.info("created stream %r: ledger %s on %s", name, meta.ledger_id, ensemble)
            return meta.ledger_id
        except err.MetadataConflict:
            await bk.meta_call(bk.ledgers.delete, meta.ledger_id)
            lid = await self._lookup(name)
            if lid is None:
                raise
            return lid

    async def _ledger_of(self, name: str) -> int:
        lid = await self._lookup(name)
        if lid is None:
            raise err.NoSuchStream(name)
        return lid

    # -- writers and readers ---------------------------------------------------------------------

    async def open_writer(self, name: str, config: StreamConfig | None = None, *,
                          create: bool = True) -> "AsyncStreamWriter":
        """Takes the stream over as its writer (creating it if missing and
        ``create``).  The previous writer, if any, is fenced: its next adds
        fail with WriterFenced."""
        config = config or StreamConfig()
        try:
            lid = await self._lookup(name)
        except Exception as e:
            raise err.translate(e) from e
        if lid is None:
            if not create:
                raise err.NoSuchStream(name)
            lid = await self._create(name, config)  # (or the ledger of whoever named it first)
        await self._check_password(lid, config.password)  # before the take-over: a refused writer fences nothing
        meta, rev, next_entry = await take_over(self.bk, lid)
        await self.bk.entry_size_limit()
        reg = self._registration(lid, meta.term)
        loop = asyncio.get_running_loop()
        opts = WriterOptions(
            term=meta.term, next_entry=next_entry, guaranteed_write_quorum=True,
            fragment_max_entries=meta.fragment_size_entries or None,
            fragment_max_bytes=meta.fragment_size_bytes or None, result=Position,
            result_range=Positions, on_fenced=lambda: loop.run_in_executor(None, reg.fenced))
        handle = LedgerHandle(self.bk, meta, rev, writable=True, placement=get_policy(config.placement),
                              writer_options=opts, lac=next_entry - 1)
        writer = AsyncStreamWriter(self, name, handle, reg)
        self._writers.add(writer)
        # live as a fact in etcd before the writer is handed out (the key is
        # kept, and created later, if etcd does not answer now)
        if not await asyncio.to_thread(lambda: reg.start().wait_settled(self.bk.config.metadata_timeout)):
            log.warning("stream %r: writer of term %d not registered yet (%s)", name, meta.term,
                        reg.ended.value if reg.ended else reg.keeper.status()["last_error"])
        return writer

    def _registration(self, lid: int, term: int) -> WriterRegistration:
        """The writer's lease-bound key (stream/writer_lease.py), not started."""
        host, pid = socket.gethostname(), os.getpid()
        rec = WriterRecord(f"{host}-{pid}-{uuid.uuid4().hex[:8]}", host, pid, term, int(time.time() * 1000))
        return WriterRegistration(self.bk.store, self.layout, lid, rec, self.bk.config.writer_lease_ttl)

    async def _check_password(self, lid: int, pw) -> None:
        meta, _ = await self.bk.meta_call(self.bk.ledgers.read, lid, fragments="last")
        ledger_password.check(lid, meta.custom, pw)

    async def open_reader(self, name: str, start: Position = Position.EARLIEST, *, inclusive: bool = True,
                          read_ahead_bytes: int = READ_AHEAD_BYTES, max_read_bytes_per_s: float = 0,
                          password: bytes | str | None = None) -> "AsyncStreamReader":
        """A reader from ``start`` (EARLIEST, LATEST, or a position, itself
        included or not).  Never fences the writer.  LATEST is the entry
        after the LAC read at the open (or after what a writer of this
        client had acknowledged, if higher).  ``read_ahead_bytes`` bounds
        what it reads ahead (0: nothing); ``max_read_bytes_per_s`` the rate
        at which it reads (0: none; see ``AsyncStreamReader``).
        ``password``: the stream's, if it was created with one
        (UnauthorizedAccess)."""
        _check_read_ahead(read_ahead_bytes)
        _check_read_rate(max_read_bytes_per_s)
        lid = await self._ledger_of(name)
        meta, rev = await self.bk.meta_call(self.bk.ledgers.read, lid, fragments="last")
        ledger_password.check(lid, meta.custom, password)
        lac = await read_lac_covering(self.bk, meta)
        handle = LedgerHandle(self.bk, meta, rev, writable=False, lac=lac)
        reader = AsyncStreamReader(self, name, handle, read_ahead_bytes=read_ahead_bytes,
                                   max_read_bytes_per_s=max_read_bytes_per_s)
        reader.seek(start, inclusive=inclusive)
        if start == Position.LATEST:  # what comes after the open: resolved now, with the LAC just read
            reader._resolve_latest(lac)
        self._readers.add(reader)
        return reader

    # -- retention and admin --------------------------------------------------------------------------

    async def trim(self, name: str, before: Position) -> int:
        """Removes the fragments wholly below ``before`` from the metadata,
        then has their bookies delete those entries.  Positions below
        ``before`` become unreadable (PositionTrimmed).  The fragment holding
        ``before`` is kept.  Returns the number of fragments removed."""
        if before.is_sentinel:
            raise ValueError("trim needs a concrete position")
        bk = self.bk
        lid = await self._ledger_of(name)
        for _ in range(bk.config.metadata_attempts):
            meta, rev = await bk.meta_call(bk.ledgers.read, lid, fragments="last")
            target = min(before.entry_id, meta.last_fragment.first_entry)
            try:
                keep = (await bk.meta_call(bk.ledgers.fragment_for, lid, target)).first_entry
            except me.NoFragment:
                keep = None
            except err.BookKeeperError:
                keep = None
            doomed = []
            if keep is not None:
                rows = await bk.meta_call(bk.store.range, bk.ledgers.layout.fragments_prefix(lid))
                doomed = [f for f in (Fragment.from_bytes(v.value) for _, v in rows) if f.first_entry < keep]
            try:
                await bk.meta_call(bk.ledgers.remove_fragments_before, lid, before.entry_id, meta, rev)
            except err.MetadataConflict:
                continue
            if doomed:
                await self._delete_on_bookies(lid, {b for f in doomed for b in f.ensemble}, keep - 1,
                                              ledger_password.master_key(meta.custom))
            log.info("stream %r: trimmed before %s (%d fragments)", name, before, len(doomed))
            return len(doomed)
        raise err.MetadataConflict(f"stream {name!r}: trim CAS kept failing")

    async def _delete_on_bookies(self, lid: int, bookies: set[str], last: int, master_key: bytes = b"") -> None:
        async def one(bid: str) -> None:
            bc = await self.bk.bookie(bid)
            if bc is None:
                return  # a dead bookie: its data goes with it, or with its GC
            try:
                await bc.delete(lid, (0, last), timeout=self.bk.config.read_timeout, master_key=master_key)
            except (BookieUnavailable, asyncio.TimeoutError) as e:
                log.info("ledger %s: trim on %s failed: %s", lid, bid, e)

        await asyncio.gather(*(one(b) for b in bookies))

    async def stream_info(self, name: str) -> dict:
        lid = await self._ledger_of(name)
        meta, _ = await self.bk.meta_call(self.bk.ledgers.read, lid, fragments="last")
        return {"name": name, "ledger_id": lid, "term": meta.term, "state": meta.state.name,
                "fragments": meta.fragment_count, "trimmed_before": meta.trimmed_before,
                "ensemble": list(meta.last_fragment.ensemble),
                "E": meta.ensemble_size, "Qw": meta.write_quorum, "Qa": meta.ack_quorum}

    async def list_streams(self) -> list[str]:
        rows = await self.bk.meta_call(self.bk.store.range, self.layout.streams_prefix())
        return sorted(self.layout.parse_stream_key(k) for k, _ in rows)

    async def delete_stream(self, name: str) -> None:
        lid = await self._ledger_of(name)
        await self.bk.meta_call(self.bk.store.delete, self.layout.stream_key(name))
        await self.bk.delete_ledger(lid)

    async def close(self) -> None:
        """Closes the readers still open, then the ledger client, which ends
        every writer still open as the writer's own close would, before its
        bookie channels close under it: appends issued so far get
        ``add_timeout`` seconds to be acknowledged (one still pending then
        fails with ClientClosed), the ensemble is told the LAC, the stream
        stays OPEN for the next writer, and no bookie is taken for failed.
        Afterwards the writers' appends raise ClientClosed.  The writers'
        registrations go once their writes ended (before etcd's connection)."""
        await asyncio.gather(*(r.close() for r in list(self._readers)), return_exceptions=True)
        timeout = self.bk.config.add_timeout
        await asyncio.gather(*(w._end(err.ClientClosed(f"stream {w.name!r}: the client closed"), timeout)
                               for w in list(self._writers)), return_exceptions=True)
        await self.bk.close()

    async def __aenter__(self) -> "AsyncStreamClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class AsyncStreamWriter:
    """The stream's writer for one term.  While it writes it holds a
    lease-bound registration in etcd (``registration``, stream/writer_lease.py),
    which goes when it closes or learns it was fenced."""

    def __init__(self, client: AsyncStreamClient, name: str, handle: LedgerHandle,
                 registration: WriterRegistration | None = None):
        self.client, self.name, self.handle = client, name, handle
        self.registration = registration
        self._ended = False

    @property
    def term(self) -> int:
        return self.handle.metadata.term

    @property
    def ledger_id(self) -> int:
        return self.handle.ledger_id

    def append_async(self, payload: bytes) -> asyncio.Future:
        """Queues an append; the future resolves to its Position once it
        (and every earlier append) is acknowledged by Qa bookies.  Raises
        TooManyPendingAdds when the window is full."""
        try:
            return self.handle.add_entry_async(payload)  # resolves to a Position (WriterOptions.result)
        except Exception as e:
            raise err.translate(e) from e

    def append_many_async(self, payloads: "Sequence[bytes]") -> asyncio.Future:
        """Queues consecutive appends (all or none: TooManyPendingAdds when
        they do not all fit the window); one future resolves to their
        ``Positions`` once the last is acknowledged, or fails if any fails
        (the writer then ended; appends before the failure may be durable:
        a reader or the next writer's recovery tells).  The fast path: one
        future per batch instead of one per record."""
        try:
            return self.handle.add_entries_async(payloads)
        except Exception as e:
            raise err.translate(e) from e

    async def append_many(self, payloads: "Sequence[bytes]") -> "Positions":
        """Appends a batch and waits for it (waits for room in the window)."""
        try:
            return await self.handle.add_entries(payloads)
        except Exception as e:
            raise err.translate(e) from e

    async def append(self, payload: bytes) -> Position:
        """Appends and waits for the acknowledgement (waits for room in the
        window when it is full)."""
        try:
            return await self.handle.add_entry(payload)
        except Exception as e:
            raise err.translate(e) from e

    async def flush(self) -> None:
        """Waits until every append issued so far is acknowledged (or failed)."""
        await self.handle.flush()

    async def close(self) -> None:
        """Flushes and stops writing.  The stream stays OPEN: the next writer
        takes it over with a new term.  Later appends raise LedgerClosed
        (ClientClosed once the client closed).  The writer's registration
        goes once its writes ended."""
        await self._end(err.LedgerClosed(f"stream {self.name!r}: writer closed"))

    async def _end(self, error: BaseException, flush_timeout: float | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            await self.handle.end_writes(error, flush_timeout=flush_timeout)
        finally:
            if self.registration is not None:
                await asyncio.to_thread(self.registration.close)

    async def __aenter__(self) -> "AsyncStreamWriter":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


_BLOCKING = ("StreamClient", "StreamWriter", "StreamReader")


def __getattr__(name: str):
    """The blocking API (stream/blocking.py, built on the classes above),
    importable from here as well."""
    if name in _BLOCKING:
        from stream import blocking

        return getattr(blocking, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Position", "Positions", "Record", "RecordBatch", "StreamConfig", "StreamClient", "StreamWriter", "StreamReader",
           "AsyncStreamClient", "AsyncStreamWriter", "AsyncStreamReader", "take_over"]
