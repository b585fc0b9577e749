"""A stream's reader (``AsyncStreamReader``, opened by
``AsyncStreamClient.open_reader`` in stream/stream.py, which re-exports it):
reads in order up to the LAC, tails with long polls, and reads ahead
within a bound in bytes."""
from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, AsyncIterator, Awaitable

from stream import errors as err
from stream.ledger import LedgerHandle
from stream.position import Position, Record
from stream.record_batch import EMPTY, RecordBatch
from stream.timers import ReadPacer

if TYPE_CHECKING:  # pragma: no cover
    from stream.stream import AsyncStreamClient

# A reader behind the LAC reads ahead: at most READ_AHEAD_BYTES (a reader's
# setting, ``read_ahead_bytes``) held in records not yet returned and in reads
# under way, in READ_AHEAD_CHUNKS chunks (range reads in flight at once),
# sized in entries from the mean entry size of the last chunk read.
READ_AHEAD_BYTES = 32 << 20
READ_AHEAD_CHUNKS = 4
MAX_CHUNK_ENTRIES = 32_768
PACED_CHUNK_SECONDS = 0.01   # a reader with a rate bound reads in chunks of this much of its rate
READ_NEXT_BATCH = 1000       # records ``next`` makes at once
PROBE_ENTRIES = 16           # a reader's first fetch, before it knows the entry size


def _check_read_ahead(read_ahead_bytes) -> None:
    if not isinstance(read_ahead_bytes, int) or isinstance(read_ahead_bytes, bool) or read_ahead_bytes < 0:
        raise ValueError(f"read_ahead_bytes must be an int >= 0, got {read_ahead_bytes!r}")


def _check_read_rate(max_read_bytes_per_s) -> None:
    if (isinstance(max_read_bytes_per_s, bool) or not isinstance(max_read_bytes_per_s, (int, float))
            or not max_read_bytes_per_s >= 0 or max_read_bytes_per_s == float("inf")):
        raise ValueError(f"max_read_bytes_per_s must be a number of bytes >= 0 (0: no bound), "
                         f"got {max_read_bytes_per_s!r}")


def _check_read_args(max_records, timeout) -> None:
    if not isinstance(max_records, int) or isinstance(max_records, bool) or max_records < 1:
        raise ValueError(f"max_records must be an int >= 1, got {max_records!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")


class AsyncStreamReader:
    """Reads a stream in order, up to the LAC; tails it with long polls.

    Behind the LAC it reads ahead, bounded in bytes (``read_ahead_bytes``):
    chunks of entries, several range reads in flight (``stream.read_plan``
    spreads each over the bookies), the next chunks read while the
    application handles the current records.  The bound is kept by estimate
    (the last chunk's mean entry size): a chunk is at least one entry.

    ``read_batch`` returns records as a ``RecordBatch`` (stream/record_batch.py):
    held in the frames the bookies sent, no object per record; ``read``
    and ``next`` make a ``Record`` of each from it.

    ``max_read_bytes_per_s`` (0: none) bounds the rate at which it reads
    from the bookies, and so hands out records: a reader far behind,
    catching up beside writers that share its machine's cores or its
    bookies, takes at most that rate (with a burst of a tenth of a second's
    worth; ``timers.ReadPacer``).  Each range read starts at its turn, in
    chunks of PACED_CHUNK_SECONDS of the rate, so the bookies serve it
    evenly (pacing the records handed out instead let a read-ahead's worth
    through at full speed at a time: twice the writer's p99 beside it)."""

    def __init__(self, client: AsyncStreamClient, name: str, handle: LedgerHandle, *, poll_timeout: float = 0.5,
                 read_ahead_bytes: int = READ_AHEAD_BYTES, spread: bool = False, max_read_bytes_per_s: float = 0):
        _check_read_ahead(read_ahead_bytes)
        _check_read_rate(max_read_bytes_per_s)
        self.client, self.name, self.handle = client, name, handle
        self.poll_timeout = poll_timeout
        self.read_ahead_bytes = read_ahead_bytes
        self._pacer = ReadPacer(max_read_bytes_per_s) if max_read_bytes_per_s else None
        self._paced_until = 0.0   # (loop time) the next read's turn, with a pacer
        self.spread = spread    # Qw = E: chunks taken from the bookies in turn (else one bookie per reader)
        self._next = 0          # the next entry id to read
        self._latest = False    # a seek to LATEST, resolved on the next read
        self._held: RecordBatch = EMPTY   # records read, not yet returned
        self._recs: list[Record] = []      # records ``next`` made, not yet returned: _recs[_rpos:]
        self._rpos = 0
        self._entry_bytes = 0   # mean bytes per entry of the last chunk (0: unknown)
        self._chunks = 0        # chunks started (the rotation when spread)
        self._covered = -1      # the highest LAC learnt with the metadata read after it
        # read-aheads in id order: (first, last, task reading first..last)
        self._aheads: collections.deque[tuple[int, int, asyncio.Task]] = collections.deque()

    @property
    def position(self) -> Position:
        """The position of the next entry to be read."""
        if self._rpos < len(self._recs):
            return self._recs[self._rpos].position
        if self._held:
            return self._held.first_position
        return Position(self._next)

    def seek(self, position: Position, *, inclusive: bool = True) -> None:
        self._held, self._recs, self._rpos = EMPTY, [], 0
        self._drop_ahead()
        self._latest = position == Position.LATEST
        if position == Position.EARLIEST:
            self._next = self.handle.metadata.trimmed_before
        elif not self._latest:
            self._next = position.entry_id + (0 if inclusive else 1)
        if not self._latest and self._next < self.handle.metadata.trimmed_before:
            raise err.PositionTrimmed(self.name, position, self.handle.metadata.trimmed_before)

    def _resolve_latest(self, lac: int) -> None:
        """LATEST becomes the entry after ``lac`` as the ensemble told it, or
        after what a writer of this client confirmed, if that is higher (the
        ensemble learns a LAC a moment after the writer: another client's
        reader may start up to ``explicit_lac_delay`` of adds earlier)."""
        self._next = max(lac, self.client.bk.confirmed_here(self.handle.ledger_id)) + 1
        self._latest = False

    async def _lac(self, timeout: float) -> int:
        if self._covered >= self._next:
            return self._covered  # still behind a LAC learnt before: no need to ask
        h = self.handle
        lac = await h.read_last_add_confirmed()
        if lac < self._next and timeout > 0:
            lac = await h.long_poll_last_add_confirmed(lac, timeout)
        if lac >= self._next:
            # metadata read after the LAC covers every entry up to it
            await h.refresh_if_changed()
            self._covered = max(self._covered, lac)
        return lac

    def _take(self, max_records: int) -> RecordBatch:
        out, self._held = self._held.split(max_records)
        return out

    def _take_made(self, max_records: int) -> list[Record]:
        """Records ``next`` made and did not return (a ``read`` after ``next``)."""
        pos = self._rpos
        out = self._recs[pos:pos + max_records]
        self._rpos = pos + len(out)
        if self._rpos >= len(self._recs):
            self._recs, self._rpos = [], 0
        return out

    async def read(self, max_records: int = 1000, timeout: float = 0.0) -> list[Record]:
        """``read_batch`` as a list of ``Record`` (a position and a bytes
        payload per record)."""
        _check_read_args(max_records, timeout)
        if self._rpos < len(self._recs):
            return self._take_made(max_records)
        return (await self.read_batch(max_records, timeout)).records()

    async def read_batch(self, max_records: int = 1000, timeout: float = 0.0) -> RecordBatch:
        """The next records up to the LAC, at most ``max_records``, as a
        ``RecordBatch``; waits up to ``timeout`` seconds for new ones when
        there are none (a long poll).  The reader's position moves past
        them.  No-op entries are never returned; every record's checksum,
        ledger and id were verified.  While the reader is behind the
        LAC, the next chunks are read ahead in the background, up to
        ``read_ahead_bytes`` beyond the batch asked for; a batch takes what
        read-aheads have brought, never waiting on one once it has records.
        With a read-ahead, a read that fetches itself fetches at most
        ``read_ahead_bytes`` (at the last mean entry size; a first read
        probes PROBE_ENTRIES, then fetches that much): a batch of large
        records is bounded in bytes too, not only by ``max_records``.
        With ``max_read_bytes_per_s``, a read that fetches records waits
        for the fetch's turn (a wait ``timeout`` does not bound: it is the
        rate's, not the LAC's).
        Raises ValueError for a ``max_records`` below 1 or a negative
        ``timeout``."""
        _check_read_args(max_records, timeout)
        if self._rpos < len(self._recs):
            return RecordBatch.of_records(self._take_made(max_records))
        out = self._take(max_records)
        parts, count = [out], len(out)
        if not count and self._latest:
            self._resolve_latest(await self.handle.read_last_add_confirmed())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        probed = False  # the last fetch was a first read's probe: the size is known now
        while count < max_records:
            if count:
                aheads = self._aheads
                if aheads and aheads[0][0] == self._next and aheads[0][2].done() \
                        and not aheads[0][2].cancelled() and aheads[0][2].exception() is None:
                    _, last, t = aheads.popleft()
                    got = t.result()
                elif probed and self._next <= self._covered:
                    probed = False
                    n = self._fetch_entries(max_records - count)
                    got, last = await self._fetch(min(self._covered, self._next + n - 1))
                else:
                    break
            else:
                lac = await self._lac(max(0.0, min(self.poll_timeout, deadline - loop.time())))
                if lac < self._next:
                    if loop.time() >= deadline:
                        break
                    continue
                n = self._fetch_entries(max_records)
                probed = n < max_records and not self._entry_bytes
                got, last = await self._fetch(min(lac, self._next + n - 1))
            self._keep(got, last)
            more = self._take(max_records - count)
            parts.append(more)
            count += len(more)
        self._read_ahead()
        return RecordBatch.join(parts)

    def _keep(self, batch: RecordBatch, last: int) -> None:
        """A chunk read, up to entry ``last``: its records (no-ops left out)
        become the ones held."""
        self._next = last + 1
        self._held = batch
        if batch:  # (no-ops say nothing of the records' size: a take-over's no-op alone is no estimate)
            self._entry_bytes = max(1, batch.payload_bytes // len(batch))

    def _fetch_entries(self, want: int) -> int:
        """How many of ``want`` entries a read fetches itself (see ``read``)."""
        if not self.read_ahead_bytes:
            return want
        if not self._entry_bytes:
            return min(want, PROBE_ENTRIES)
        return max(1, min(want, self.read_ahead_bytes // self._entry_bytes))

    def _chunk_entries(self) -> int:
        """Entries per read-ahead chunk: a READ_AHEAD_CHUNKS-th of the
        read-ahead bytes at the last mean entry size; with a rate bound, at
        most PACED_CHUNK_SECONDS of the rate."""
        nbytes = self.read_ahead_bytes // READ_AHEAD_CHUNKS
        if self._pacer is not None:
            nbytes = min(nbytes, int(self._pacer.rate * PACED_CHUNK_SECONDS))
        return max(1, min(MAX_CHUNK_ENTRIES, nbytes // self._entry_bytes))

    async def _fetch(self, last: int) -> tuple[RecordBatch, int]:
        """The records from ``_next`` to at most ``last`` (fewer or more if a
        read-ahead brought another chunk), and the last entry id read."""
        try:
            if self._aheads and self._aheads[0][0] == self._next:
                _, ahead_last, t = self._aheads.popleft()
                return await t, ahead_last
            self._drop_ahead()
            return await self._read(self._next, last), last
        except (err.ReadFailed, err.EntryMissing) as e:
            meta = await self.handle.refresh_metadata()
            if self._next < meta.trimmed_before:
                raise err.PositionTrimmed(self.name, Position(self._next), meta.trimmed_before) from e
            raise

    def _read(self, first: int, last: int) -> Awaitable[RecordBatch]:
        """``read_records(first..last)``, with a rate bound started at its
        turn: the reads themselves keep to the rate, chunk by chunk, so the
        bookies serve a bounded reader evenly rather than a read-ahead's
        worth at full speed at a time."""
        rotation = self._rotation()
        if self._pacer is None:
            return self.handle.read_records(first, last, rotation=rotation)
        now = asyncio.get_running_loop().time()
        start = max(now, self._paced_until)
        self._paced_until = start + self._pacer.take((last - first + 1) * self._entry_bytes, start)
        return self._read_at(start - now, first, last, rotation)

    async def _read_at(self, delay: float, first: int, last: int, rotation: int) -> RecordBatch:
        if delay > 0:
            await asyncio.sleep(delay)
        return await self.handle.read_records(first, last, rotation=rotation)

    def _rotation(self) -> int:
        self._chunks += 1
        return self._chunks if self.spread else 0

    def _read_ahead(self) -> None:
        """Starts chunk reads after the last one under way, as far as a LAC
        covered by metadata allows (no LAC round trip), while the records
        buffered and the chunks under way stay within ``read_ahead_bytes``."""
        aheads, per = self._aheads, self._entry_bytes
        if not per:
            return
        chunk = self._chunk_entries()
        start = aheads[-1][1] + 1 if aheads else self._next
        buffered = (len(self._held) + len(self._recs) - self._rpos + sum(b - a + 1 for a, b, _ in aheads)) * per
        while start <= self._covered:
            last = min(self._covered, start + chunk - 1)
            if buffered + (last - start + 1) * per > self.read_ahead_bytes:
                return
            t = asyncio.ensure_future(self._read(start, last))
            t.add_done_callback(_retrieve)  # an unused read-ahead's failure is nobody's error
            aheads.append((start, last, t))
            buffered += (last - start + 1) * per
            start = last + 1

    def _drop_ahead(self) -> None:
        while self._aheads:
            self._aheads.popleft()[2].cancel()

    async def next(self, timeout: float | None = None) -> Record | None:
        """The next record; None if none came within ``timeout`` (None: wait
        for ever)."""
        while self._rpos >= len(self._recs):
            t = self.poll_timeout if timeout is None else timeout
            got = await self.read_batch(READ_NEXT_BATCH, t)
            if got:
                self._recs, self._rpos = got.records(), 0   # (handed out one by one)
            elif timeout is not None:
                return None
        rec = self._recs[self._rpos]
        self._rpos += 1
        return rec

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        while True:
            yield await self.next()

    async def close(self) -> None:
        self._held, self._recs, self._rpos = EMPTY, [], 0
        self._drop_ahead()
        await self.handle.close()

    async def __aenter__(self) -> "AsyncStreamReader":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _retrieve(t: asyncio.Future) -> None:
    if not t.cancelled():
        t.exception()
