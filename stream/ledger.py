"""A ledger as applications hold it: :class:`LedgerHandle` (adds and close
for the writer; for everyone reads up to the LAC, LAC reads from a covering
quorum and long-poll tailing).  The rooms of a ledger:

- ``stream/ledger_write.py``: the write path (:class:`LedgerWriter` over
  ``WriterCore``; ensemble changes published here).
- ``stream/ledger_recovery.py``: recovery (:class:`RecoveryDriver` over
  ``RecoveryCore``) and classic recovery's metadata steps
  (:func:`recover_ledger`).
- ``stream/ledger_read.py``: reads (:class:`ReadPath`, :func:`read_lac_covering`).

The adapters decide nothing about the protocol: acks, LAC, what to resend,
when to change the ensemble, what recovery reads, writes and concludes all
come from the cores.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from bookie.core import Status
from metadata.ledgers import LedgerMetadata, LedgerState
from stream import errors as err
from stream import lifecycle as lc
from stream.lifecycle import CloseAt, Moot, run_ledger_cas
from stream.writer_core import TERMINAL as WRITER_TERMINAL
from stream.writer_core import WriterState
from stream.ledger_read import RANGE_FRAME_BYTES, ReadPath, read_lac_covering
from stream.ledger_recovery import recover_ledger
from stream.ledger_write import LedgerWriter, WriterOptions

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from stream.client import BookKeeperClient

log = logging.getLogger("stream.ledger")  # one logger for the ledger's rooms


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """``fn(*args)`` on ``loop``, from another thread (an etcd watch's); not
    at all once the loop is closed: nobody waits on it any more."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


# -- the handle -----------------------------------------------------------------------

class LedgerHandle(ReadPath):
    """A ledger opened by this client: the writer's handle (from
    ``create_ledger``) or a reader's (from ``open_ledger``)."""

    def __init__(self, client: "BookKeeperClient", meta: LedgerMetadata, rev: int, *, writable: bool,
                 lac: int = -1, placement=None, writer_options: WriterOptions | None = None):
        self.client = client
        self.ledger_id: int = meta.ledger_id
        self._meta, self._rev = meta, rev
        self._writer_options = writer_options or WriterOptions()
        # A ledger read without all its fragments (a long-lived stream) looks
        # them up as reads need them: first entry -> (fragment, end), where
        # end is the next fragment's first entry.
        self._lazy_fragments = not meta.fragments_complete
        self._spans: SortedDict = SortedDict()
        self._meta_changed: asyncio.Event | None = None
        self._unwatch = None
        self._lac = meta.last_entry if meta.state is LedgerState.CLOSED else lac
        self.placement = placement
        self._writer: LedgerWriter | None = LedgerWriter(self) if writable else None
        self._closed = False
        self._close_task: asyncio.Future | None = None
        self._read_sem = asyncio.Semaphore(client.config.read_concurrency)
        # range reads (stream.read_plan): the frame size asked of bookies, and
        # Qw = E ranges cut into blocks of this many ids dealt round the
        # bookies (0: one bookie per range)
        self.read_frame_bytes = RANGE_FRAME_BYTES
        self.read_block_entries = 0
        client.track(self)  # its close ends this handle first (see _release)

    # -- state -------------------------------------------------------------------

    @property
    def metadata(self) -> LedgerMetadata:
        return self._meta

    @property
    def writable(self) -> bool:
        return self._writer is not None and self._writer.core.state not in WRITER_TERMINAL

    @property
    def last_add_confirmed(self) -> int:
        """The LAC as this handle knows it (the writer's own, a reader's last
        read, a closed ledger's last entry)."""
        if self._meta.state is LedgerState.CLOSED:
            return self._meta.last_entry
        if self._writer is not None:
            return max(self._lac, self._writer.core.lac)
        return self._lac

    @property
    def is_closed(self) -> bool:
        return self._meta.state is LedgerState.CLOSED

    @property
    def length_entries(self) -> int:
        return self.last_add_confirmed + 1

    @property
    def _fragments_mode(self) -> str:
        """What a re-read of this handle's metadata loads ("last" or "all")."""
        return "last" if self._lazy_fragments else "all"

    def _set_meta(self, meta: LedgerMetadata, rev: int) -> None:
        if rev >= self._rev:
            self._meta, self._rev = meta, rev

    # -- adds --------------------------------------------------------------------

    def add_entry_async(self, payload: bytes) -> asyncio.Future:
        """Queues an add; the future resolves to its entry id once it (and
        every lower entry) reached Qa bookies.  Raises TooManyPendingAdds
        when the window is full, LedgerClosed/LedgerFenced after the end."""
        return self.client.metrics.track_add(self._writable().add(payload))

    def _writable(self) -> LedgerWriter:
        if self._writer is None:
            raise err.LedgerClosed(f"ledger {self.ledger_id} is open read-only")
        if self.client.closing:
            raise err.ClientClosed(f"ledger {self.ledger_id}: the client is closed")
        if self._closed and self._writer.core.state is not WriterState.CLOSED:
            raise err.LedgerClosed(f"ledger {self.ledger_id} is closing")
        return self._writer

    def add_entries_async(self, payloads: Sequence[bytes]) -> asyncio.Future:
        """Queues consecutive adds (all or none); one future resolves to
        their entry ids (a range) once the last reached Qa bookies, or fails
        if any of them fails.  TooManyPendingAdds when they do not all fit."""
        w = self._writable()
        if len(payloads) > w.core.max_pending:
            raise ValueError(f"{len(payloads)} entries in one batch: more than the window "
                             f"({w.core.max_pending} pending adds)")
        return self.client.metrics.track_add(w.add_many(payloads), len(payloads))

    async def add_entries(self, payloads: Sequence[bytes]):
        """Adds a batch and waits for its ack; waits for room in the window."""
        return await self._when_room(lambda: self.add_entries_async(payloads))

    async def add_entry(self, payload: bytes) -> int:
        """Adds one entry and waits for its ack; waits for room in the window."""
        return await self._when_room(lambda: self.add_entry_async(payload))

    async def _when_room(self, add):
        while True:
            try:
                fut = add()
            except err.TooManyPendingAdds:
                await self._writer.progress()
                continue
            return await fut

    async def flush(self, timeout: float | None = None) -> bool:
        """Waits until every add issued so far is acknowledged or failed (at
        most ``timeout`` seconds); returns whether none is left."""
        w = self._writer
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while w is not None and (pending := w.outstanding()):
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            # gather retrieves the failures (the adds' callers see them);
            # wait, unlike wait_for, cancels nothing when the time is up
            await asyncio.wait([asyncio.gather(*pending, return_exceptions=True)], timeout=left)
        return True

    # -- close -------------------------------------------------------------------

    async def end_writes(self, error: BaseException, *, flush_timeout: float | None = None) -> None:
        """Stops writing without closing the ledger (a stream writer's close:
        the stream stays OPEN for the next writer's take-over; the client's
        close under an open writer).  New adds are refused at once; the
        pending ones get ``flush_timeout`` seconds (None: as long as they
        take); the ensemble is told the LAC (readers then see every
        acknowledged entry at once); then the writer ends: an add still
        pending fails with ``error``, and no bookie is replaced any more.
        Idempotent."""
        w = self._writer
        if w is None:
            return
        self._closed = True
        await self.flush(flush_timeout)
        await w.tell_lac()
        w.stop(error)

    async def _release(self) -> None:
        """The client is closing (before its bookie channels and etcd): this
        handle stops watching, and a writer ends as :meth:`end_writes` ends
        it, the ledger left as it is (a classic one OPEN: the next opener
        recovers it).  Without this, the channels closing under frames still
        on their way would look like failed bookies, and the writer would
        try an ensemble change through a closed client."""
        self._stop_watching()
        w = self._writer
        if w is None:
            return
        error = err.ClientClosed(f"ledger {self.ledger_id}: the client closed")
        timeout = self.client.config.add_timeout
        if self._close_task is not None:  # an explicit close under way: let it finish, within reason
            await asyncio.wait([self._close_task], timeout=timeout)
            w.stop(error)
            return
        await self.end_writes(error, flush_timeout=timeout)

    async def close(self) -> None:
        """Closes the ledger (writer) or releases the handle (reader).

        Waits for every pending add, then CASes the metadata to CLOSED with
        the last acknowledged entry: retried while OPEN; IN_RECOVERY is an
        error (LedgerInRecovery); CLOSED at the same entry is success, at
        another one an error (CloseMismatch).  Concurrent calls share one
        close."""
        self._stop_watching()
        if self._writer is None:
            self._closed = True
            return
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._close_writer())
        await asyncio.shield(self._close_task)

    async def _close_writer(self) -> None:
        w = self._writer
        core = w.core
        while not ((core.close_allowed() and not w.queued) or core.state in WRITER_TERMINAL):
            await w.progress()
        # OPEN: close the core (no pending add is left).  FENCED or FAILED:
        # the last acknowledged entry is the LAC; the metadata decides
        # whether that close succeeds (a recoverer may have closed it there).
        last = core.close() if core.state is WriterState.OPEN else core.lac
        try:
            await self._close_metadata(last)
        finally:
            w.cancel()

    async def _close_metadata(self, last: int) -> None:
        """``stream.lifecycle.CloseAt`` through the one CAS runner; its
        verdict becomes the handle's metadata or a typed error."""
        res = await run_ledger_cas(self.client, CloseAt(self.ledger_id, last, self.client.config.mutations),
                                   known=(self._meta, self._rev), fragments=self._fragments_mode)
        if res.meta is not None:
            self._set_meta(res.meta, res.revision)
        v = res.verdict
        if res.applied:
            return
        if isinstance(v, Moot) and v.kind == lc.CLOSED_ELSEWHERE:
            assert res.meta is not None
            raise err.CloseMismatch(self.ledger_id, last, res.meta.last_entry)
        if isinstance(v, Moot) and v.kind == lc.FENCED:
            raise err.LedgerInRecovery(f"ledger {self.ledger_id} is being recovered by another client")
        if isinstance(v, Moot) and v.kind == lc.GONE:
            raise err.NoSuchLedger(self.ledger_id)
        raise err.MetadataConflict(f"ledger {self.ledger_id}: close CAS kept failing ({v.why})")

    async def __aenter__(self) -> "LedgerHandle":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            await self.close()
            return
        try:  # do not mask the body's error
            await self.close()
        except err.BookKeeperError as e:
            log.info("ledger %s: close after an error failed: %s", self.ledger_id, e)

    # -- metadata ------------------------------------------------------------------

    async def refresh_if_changed(self) -> None:
        """Re-reads the metadata if the header moved since this handle read
        it (one point read of the header when it did not).

        Call it after learning a LAC and before reading up to it: a fragment
        is published before any entry of it is acknowledged, so the metadata
        read after a LAC covers every entry up to that LAC.  Reading with
        older metadata could ask a bookie that has left the entry's ensemble,
        which may still hold an older term's value for that id."""
        key = self.client.ledgers.layout.ledger_header_key(self.ledger_id)
        cur = await self.client.meta_call(self.client.store.get, key)
        if cur is None or cur.mod_revision != self._rev:
            await self.refresh_metadata()

    async def refresh_metadata(self) -> LedgerMetadata:
        if self._lazy_fragments:
            meta, rev = await self.client.meta_call(self.client.ledgers.read, self.ledger_id, fragments="last")
        else:
            meta, rev = await self.client.meta_call(self.client.ledgers.read, self.ledger_id)
        self._set_meta(meta, rev)
        if meta.state is LedgerState.CLOSED:
            self._lac = max(self._lac, meta.last_entry)
        return self._meta

    # -- LAC -------------------------------------------------------------------------

    async def read_last_add_confirmed(self) -> int:
        """The LAC from a covering quorum of the last fragment's bookies
        (Qw - Qa + 1 of every write quorum): never fences, never goes down."""
        if self._meta.state is LedgerState.CLOSED:
            return self._meta.last_entry
        if self._writer is not None and self._writer.core.state not in WRITER_TERMINAL:
            return self.last_add_confirmed
        self._check_client()
        lac = await read_lac_covering(self.client, self._meta)
        self._lac = max(self._lac, lac)
        return self._lac

    async def long_poll_last_add_confirmed(self, previous: int, timeout: float) -> int:
        """Waits until a bookie of the last fragment reports a LAC above
        ``previous`` (any bookie's LAC is a confirmed one), or the ledger's
        metadata changes (a new fragment: the LAC moves on other bookies; a
        close), or ``timeout``.  Then returns the LAC as known."""
        if self.last_add_confirmed > previous:
            return self.last_add_confirmed
        self._check_client()
        changed = self._watch_metadata()
        frag = self._meta.last_fragment
        tasks = []
        for bid in frag.ensemble:
            bc = await self.client.bookie(bid)
            if bc is not None:
                tasks.append(asyncio.ensure_future(bc.long_poll_lac(self.ledger_id, previous, timeout)))
        meta_task = asyncio.ensure_future(changed.wait())
        try:
            pending = set(tasks) | {meta_task}
            while pending - {meta_task}:
                done, pending = await asyncio.wait(pending, timeout=timeout + 5.0,
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done or meta_task in done:
                    break
                for t in done:
                    if t.cancelled() or t.exception() is not None:
                        continue
                    resp = t.result()
                    if resp.status == Status.OK and resp.lac > previous:
                        self._lac = max(self._lac, resp.lac)
                if self._lac > previous:
                    return self._lac
        finally:
            for t in tasks + [meta_task]:
                t.cancel()
        changed.clear()
        await self.refresh_metadata()
        if self._meta.last_fragment != frag and self._meta.state is not LedgerState.CLOSED:
            # a new fragment: its bookies hold the LAC now
            self._lac = max(self._lac, await read_lac_covering(self.client, self._meta))
        return self.last_add_confirmed

    def _watch_metadata(self) -> asyncio.Event:
        """An event set whenever the ledger's header changes in etcd (every
        fragment change and state change CASes it), watched from the revision
        this handle last read, so no change is missed.  The watch resumes by
        itself after an etcd restart; if it ends for good (etcd's history no
        longer reaches back to it), the event is set (the long poll re-reads
        the metadata) and the next long poll watches again from there."""
        if self._meta_changed is None:
            loop = asyncio.get_running_loop()
            self._meta_changed = ev = asyncio.Event()

            def on_change(_event) -> None:
                _call_soon(loop, ev.set)

            def on_error(e) -> None:
                log.info("ledger %s: metadata watch ended: %s", self.ledger_id, e)
                _call_soon(loop, self._watch_ended, ev)

            key = self.client.ledgers.layout.ledger_header_key(self.ledger_id)
            try:
                self._unwatch = self.client.store.watch_key(key, on_change, start_revision=self._rev + 1,
                                                            on_error=on_error)
            except Exception as e:  # no watch: long polls still time out and re-read
                log.info("ledger %s: no metadata watch: %s", self.ledger_id, e)
        return self._meta_changed

    def _watch_ended(self, ev: asyncio.Event) -> None:
        ev.set()
        if self._meta_changed is ev:
            self._meta_changed, self._unwatch = None, None

    def _check_client(self) -> None:
        """Bookie I/O through a closed client is refused with a typed error
        (its channels are gone; none is opened again)."""
        if self.client.closing:
            raise err.ClientClosed(f"ledger {self.ledger_id}: the client is closed")

    def _stop_watching(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None



__all__ = ["LedgerHandle", "WriterOptions", "recover_ledger", "read_lac_covering"]
