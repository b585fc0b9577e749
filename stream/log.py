"""Ledgers to logs (the seed's "Ledgers to logs"): a named log is an ordered
list of classic ledgers, kept in etcd under ``logs/<name>`` (a LogRecord)
and changed only by compare-and-swap.

Becoming the leader (:meth:`LogWriter.open`):

1. read the list;
2. fence (recover) its last two ledgers: the old leader may be writing to
   the second-to-last while it adds the last one to the list;
3. create a new ledger;
4. CAS the list with the new ledger appended; on a lost CAS start again at 1
   (the unused ledger is deleted).

No write is served before step 4 succeeded: the writer's ledger handle is
only reachable once the CAS is done.

Rolling (:meth:`LogWriter.roll`): create a ledger, CAS the list with it,
switch appends to it, then close the previous ledger (appends keep going to
the previous ledger while the metadata is updated).  A lost CAS means
another node took over: :class:`~stream.errors.NotLeader`.

Invariant: a log never has an unclosed ledger other than its last two, so
the next leader's open, which fences the last two, recovers every ledger
that may hold acknowledged entries beyond its LAC.  Rolls are serialized,
the close of the previous ledger included: a roll publishes a new ledger
only once the one before the current is CLOSED (a close that failed is
retried by the next roll before it creates anything, and the roll fails if
it still cannot).  Overlapping rolls used to publish a third ledger while
the first was still open: that ledger was never recovered, and the
acknowledged entries above its LAC were lost to readers.

Truncating (:meth:`LogWriter.truncate`): CAS the list without its first
ledgers, then delete them.  Reading (:class:`LogReader`): every ledger of
the list in order, closed ones up to their last entry, open ones up to
their LAC.  Positions are ``(ledger_id, entry_id)``; since a ledger is
created after reading a list that holds its predecessor, ids increase along
the list of a log written by a LogWriter; a list appended by the Spark sink
holds ledgers in partition order, so log order is the list's order, never the
ids' (:meth:`LogReader.read_all` skips by place in the list).
"""
from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from bookie.entry import Entry
from bookstream_pb import metadata_pb2 as mpb
from metadata.layout import KeyLayout
from metadata.store import Versioned
from stream import errors as err
from stream.client import BookKeeperClient
from stream.ledger import LedgerHandle

log = logging.getLogger(__name__)


class LogPosition(NamedTuple):
    ledger_id: int
    entry_id: int


def log_key(client: BookKeeperClient, name: str) -> str:
    """The etcd key holding the log's ledger list (a LogRecord)."""
    return KeyLayout(client.cluster).log_key(name)


async def read_ledger_list(client: BookKeeperClient, name: str) -> tuple[list[int], int | None]:
    """The log's ledger ids, in log order, and the key's mod_revision (None:
    no such log; the list is then empty).  The revision is what a CAS on
    :func:`log_key` compares against."""
    v: Versioned | None = await client.meta_call(client.store.get, log_key(client, name))
    if v is None:
        return [], None
    return decode_ledger_list(v.value), v.mod_revision


async def check_truncated(client: BookKeeperClient, name: str, gone: list[int]) -> None:
    """Ledgers of log ``name`` found missing by a reader: truncated since it
    read the list (fine: left out), or still listed, their entries lost
    (NoSuchLedger: a reader says so rather than skip them)."""
    still = sorted(set(gone) & set((await read_ledger_list(client, name))[0]))
    if still:
        raise err.NoSuchLedger(still[0], f"log {name}: its list names ledger(s) {still}, which no longer exist: "
                               "their entries are lost")


def encode_ledger_list(name: str, ids: list[int]) -> bytes:
    """The value :func:`log_key` holds for this list (what a CAS writes)."""
    return mpb.LogRecord(name=name, ledger_ids=ids).SerializeToString(deterministic=True)


def decode_ledger_list(data: bytes) -> list[int]:
    """The ledger ids a :func:`log_key` value holds, in log order."""
    rec = mpb.LogRecord()
    rec.ParseFromString(data)
    return list(rec.ledger_ids)


class _Record:
    def __init__(self, client: BookKeeperClient, name: str):
        self.client = client
        self.name = name
        self.key = log_key(client, name)

    async def read(self) -> tuple[list[int], int | None]:
        return await read_ledger_list(self.client, self.name)

    async def cas(self, ids: list[int], revision: int | None) -> int:
        """Writes the list if the key is still at ``revision`` (None: absent);
        raises MetadataConflict otherwise."""
        data = encode_ledger_list(self.name, ids)
        st = self.client.store
        if revision is None:
            return await self.client.meta_call(st.create, self.key, data)
        return await self.client.meta_call(st.cas, self.key, data, revision)


class LogWriter:
    """The would-be leader of log ``name``.  ``await open()`` makes it the
    leader (or raises); then ``append`` / ``roll`` / ``truncate``."""

    def __init__(self, client: BookKeeperClient, name: str, ensemble_size: int = 3, write_quorum: int = 2,
                 ack_quorum: int = 2, *, max_attempts: int = 10):
        self.client = client
        self.name = name
        self.config = (ensemble_size, write_quorum, ack_quorum)
        self.max_attempts = max_attempts
        self._rec = _Record(client, name)
        self._ids: list[int] = []
        self._rev: int | None = None
        self._current: LedgerHandle | None = None
        self._lost: BaseException | None = None
        self._meta_lock = asyncio.Lock()  # held by a whole roll (close included) and by truncate
        self._unclosed: LedgerHandle | None = None  # the previous ledger, if its close failed

    @property
    def ledger_ids(self) -> list[int]:
        return list(self._ids)

    @property
    def current_ledger(self) -> LedgerHandle | None:
        return self._current

    async def open(self) -> "LogWriter":
        for attempt in range(self.max_attempts):
            ids, rev = await self._rec.read()
            for lid in ids[-2:]:  # fence: recover (and close) the last two ledgers
                try:
                    await self.client.open_ledger(lid, recovery=True)
                except err.NoSuchLedger:
                    pass  # deleted by a truncation racing with us: nothing to fence
            new = await self.client.create_ledger(*self.config)
            try:
                rev2 = await self._rec.cas(ids + [new.ledger_id], rev)
            except err.MetadataConflict:
                log.info("log %s: lost the list CAS (attempt %d), starting again", self.name, attempt + 1)
                await self._discard(new)
                continue
            except Exception:
                rev2 = await self._settle(ids + [new.ledger_id], rev, new)
                if rev2 is None:
                    raise
            except BaseException:
                await self._settle(ids + [new.ledger_id], rev, new)
                raise
            self._ids, self._rev, self._current, self._lost = ids + [new.ledger_id], rev2, new, None
            log.info("log %s: leader, writing ledger %s (list %s)", self.name, new.ledger_id, self._ids)
            return self
        raise err.NotLeader(f"log {self.name}: the list kept changing ({self.max_attempts} attempts)")

    async def _settle(self, listed: list[int], rev: int | None, new: LedgerHandle | None = None) -> int | None:
        """After a list CAS (``listed`` at ``rev``) whose answer was lost:
        etcd slow or unreachable, or the call cancelled, may have applied it
        all the same, and may still (a paused etcd applies what it received
        once it resumes: this list named a deleted ledger).  While the key
        is still at ``rev`` the CAS is made again (the same list: whichever
        of the two applies, the other fails); once the key has moved past
        ``rev`` the lost one can no longer apply, and the list says what
        happened: exactly ``listed``, it went through (its revision is
        returned: the writer goes on as if answered); otherwise None, and
        ``new`` (the ledger the CAS appended, if any) is deleted only if the
        list does not hold it (held, followed by others: the CAS went
        through and another leader took over since, which fences it).
        Where etcd does not answer (asked again a few times, a few seconds
        in all) nothing is deleted (an orphan at worst): a listed ledger
        never is."""
        why: BaseException | None = None
        for attempt in range(self.max_attempts):
            try:
                ids, cur = await self._rec.read()
                if cur == rev:
                    return await self._rec.cas(listed, rev)
            except err.MetadataConflict:
                continue   # moved past rev meanwhile: read again
            except err.MetadataUnavailable as e:
                why = e
                await asyncio.sleep(min(0.1 * 2 ** attempt, 1.0))
                continue
            except Exception as e:
                why = e
                break
            if ids == listed:
                log.info("log %s: the list CAS whose answer was lost went through", self.name)
                return cur
            if new is not None and new.ledger_id not in ids:
                await self._discard(new)
            return None
        log.warning("log %s: a list CAS's answer was lost and etcd does not say whether it went through (%s)%s",
                    self.name, why, "" if new is None else f": ledger {new.ledger_id} kept")
        return None

    async def _discard(self, lh: LedgerHandle) -> None:
        try:
            await self.client.delete_ledger(lh.ledger_id)
        except err.BookKeeperError as e:  # an orphan ledger, not in any list
            log.warning("log %s: could not delete unused ledger %s: %s", self.name, lh.ledger_id, e)

    def _check(self) -> LedgerHandle:
        if self._lost is not None:
            raise err.NotLeader(f"log {self.name}: leadership lost: {self._lost}")
        if self._current is None:
            raise err.NotLeader(f"log {self.name}: not opened as leader")
        return self._current

    def append_async(self, payload: bytes) -> asyncio.Future:
        """The future resolves to the entry's LogPosition."""
        lh = self._check()
        fut = lh.add_entry_async(payload)
        out = asyncio.get_running_loop().create_future()

        def done(f: asyncio.Future) -> None:
            if out.done():
                if not f.cancelled():
                    f.exception()  # retrieved: the caller gave up on `out`
                return
            if f.cancelled():
                out.cancel()
            elif f.exception() is not None:
                e = f.exception()
                if isinstance(e, err.LedgerFenced) and self._lost is None:
                    self._lost = e
                out.set_exception(e)
            else:
                out.set_result(LogPosition(lh.ledger_id, f.result()))
        fut.add_done_callback(done)
        return out

    async def append(self, payload: bytes) -> LogPosition:
        while True:
            try:
                return await self.append_async(payload)
            except err.TooManyPendingAdds:
                await self._current._writer.progress()

    async def roll(self) -> LedgerHandle:
        """Creates a ledger, CASes it into the list, switches appends to it,
        then closes the previous ledger (waiting for its pending adds).
        Concurrent rolls run one after the other (see the module's
        invariant)."""
        async with self._meta_lock:
            await self._close_unclosed()
            old = self._check()
            new = await self.client.create_ledger(*self.config)
            try:
                rev = await self._rec.cas(self._ids + [new.ledger_id], self._rev)
            except err.MetadataConflict as e:
                await self._discard(new)
                self._lost = e
                raise err.NotLeader(f"log {self.name}: the list changed: another leader took over") from e
            except Exception:
                rev = await self._settle(self._ids + [new.ledger_id], self._rev, new)
                if rev is None:
                    raise
            except BaseException:
                await self._settle(self._ids + [new.ledger_id], self._rev, new)
                raise
            self._ids, self._rev, self._current = self._ids + [new.ledger_id], rev, new
            # after its pending adds (appends already go to `new`), and before
            # any other roll: the next ledger waits for this close
            self._unclosed = old
            await self._close_unclosed()
        return new

    async def _close_unclosed(self) -> None:
        """Closes the previous ledger if a roll left it open (its close
        failed); raises if it still cannot: nothing is published meanwhile."""
        old = self._unclosed
        if old is None:
            return
        try:
            await old.close()
        except (err.LedgerFenced, err.LedgerClosed) as e:
            # recovered (and closed) by another leader: we are no longer the leader
            if self._lost is None:
                self._lost = e
            self._unclosed = None
            raise err.NotLeader(f"log {self.name}: ledger {old.ledger_id} was recovered by another "
                                f"leader: {e}") from e
        self._unclosed = None

    async def truncate(self, keep_from: int) -> list[int]:
        """Removes every ledger before ledger ``keep_from`` from the list
        (CAS), then deletes them.  The current ledger is always kept."""
        async with self._meta_lock:
            self._check()
            if keep_from not in self._ids:
                raise ValueError(f"ledger {keep_from} is not in log {self.name}")
            k = self._ids.index(keep_from)
            gone, keep = self._ids[:k], self._ids[k:]
            if not gone:
                return []
            try:
                self._rev = await self._rec.cas(keep, self._rev)
            except err.MetadataConflict as e:
                self._lost = e
                raise err.NotLeader(f"log {self.name}: the list changed: another leader took over") from e
            except Exception:   # (went through, the writer would otherwise lose its lead at its next roll)
                rev = await self._settle(keep, self._rev)
                if rev is None:
                    raise
                self._rev = rev
            self._ids = keep
        for lid in gone:
            try:
                await self.client.delete_ledger(lid)
            except err.NoSuchLedger:
                pass
        return gone

    async def close(self) -> None:
        """Closes the current ledger (the log stays; a next leader opens it)."""
        if self._unclosed is not None:
            async with self._meta_lock:
                try:
                    await self._close_unclosed()
                except err.NotLeader:
                    pass
        if self._current is not None:
            lh, self._current = self._current, None
            await lh.close()

    async def __aenter__(self) -> "LogWriter":
        """``async with LogWriter(...) as w`` opens it; ``async with await
        LogWriter(...).open() as w`` uses the lead it already has (a second
        open would fence its own first ledger and list another)."""
        return self if self._current is not None else await self.open()

    async def __aexit__(self, *exc) -> None:
        await self.close()


class LogReader:
    """Reads a log across its ledgers, never fencing."""

    def __init__(self, client: BookKeeperClient, name: str):
        self.client = client
        self._rec = _Record(client, name)

    async def ledger_ids(self) -> list[int]:
        return (await self._rec.read())[0]

    async def read_all(self, start: LogPosition | None = None) -> list[tuple[LogPosition, Entry]]:
        """Every readable entry from ``start`` on, in log order.

        Ledgers are skipped by their place in the list, not by id: a list
        appended by the Spark sink holds its ledgers in partition order.  A
        ``start`` whose ledger the list no longer holds (truncated, or of
        another log) raises NoSuchLedger: where it stood is unknown; so does
        a ledger the list still names that no longer exists (one truncated
        while this read went on is left out)."""
        out: list[tuple[LogPosition, Entry]] = []
        ids = await self.ledger_ids()
        if start is not None:
            if start.ledger_id not in ids:
                raise err.NoSuchLedger(start.ledger_id, f"log {self._rec.name}: ledger {start.ledger_id} of the "
                                       "start position is not in the list (truncated, or of another log)")
            ids = ids[ids.index(start.ledger_id):]
        for lid in ids:
            try:
                h = await self.client.open_ledger(lid, recovery=False)
            except err.NoSuchLedger:
                await check_truncated(self.client, self._rec.name, [lid])
                continue  # truncated meanwhile
            first = start.entry_id if start is not None and lid == start.ledger_id else 0
            last = h.last_add_confirmed
            if last >= first:
                out.extend((LogPosition(lid, e.entry_id), e) for e in await h.read_entries(first, last))
        return out


__all__ = ["LogWriter", "LogReader", "LogPosition", "read_ledger_list", "log_key",
           "encode_ledger_list", "decode_ledger_list", "check_truncated"]
