"""The read path of a ledger: :class:`ReadPath` (the reads of a
:class:`stream.ledger.LedgerHandle`: range reads as ``stream.read_plan``
plans them, per-entry reads that ask another replica when one is slow or
fails, checksums verified, nothing skipped; tailing) and
:func:`read_lac_covering` (the LAC from a covering quorum, never fencing).
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import time
from typing import TYPE_CHECKING, AsyncIterator

from bookie import entry as entry_codec
from bookie import wire
from bookie.core import Status
from metadata.ledgers import Fragment, LedgerMetadata, LedgerState
from stream import errors as err
from stream.bookie_client import BookieUnavailable, status_of
from stream.read_core import Answer, EntryRead, LacRead, Verdict, answer_of
from stream.read_plan import RangeRead, plan_missing, plan_reads
from stream.record_batch import EntrySlots, RecordBatch, RunSlots
from stream.ledger_write import why

if TYPE_CHECKING:  # pragma: no cover
    from stream.client import BookKeeperClient

log = logging.getLogger("stream.ledger")  # one logger for the ledger's rooms

RANGE_FRAME_BYTES = 1 << 20  # small range-read frames: the first one comes back fast
# A range read's first frame may take this many speculative read timeouts
# (several reads are in flight per bookie: a read-ahead queues behind others).
FIRST_FRAME_SPECULATIONS = 20


class ReadPath:
    """The reads of a ledger handle (mixed into :class:`LedgerHandle`)."""

    # -- reads -------------------------------------------------------------------------

    async def read_entry(self, entry_id: int) -> entry_codec.Entry:
        return (await self.read_entries(entry_id, entry_id))[0]

    async def read_entries(self, first: int, last: int, *, rotation: int = 0) -> list[entry_codec.Entry]:
        """Entries ``first..last`` in order, every one of them, checksums
        verified.  Never past the LAC (ReadBeyondLac); the LAC is refreshed
        once if ``last`` is beyond the known one.  ``rotation`` turns which
        bookie serves which part (stream.read_plan), e.g. per read-ahead chunk."""
        return (await self._read(first, last, rotation, EntrySlots)).slots

    async def read_records(self, first: int, last: int, *, rotation: int = 0) -> RecordBatch:
        """``read_entries`` as a ``RecordBatch``: the records of
        ``first..last`` (no-ops left out) in the frames the bookies sent,
        no object per record (a stream reader's hot path), every one
        verified as ``read_entries`` verifies it."""
        return (await self._read(first, last, rotation, RunSlots)).batch()

    async def _read(self, first: int, last: int, rotation: int, sink_type):
        """``first..last`` into a new ``sink_type`` (stream.record_batch:
        ``EntrySlots`` or ``RunSlots``): range reads first, then entry by
        entry for what they did not deliver."""
        if not (isinstance(first, int) and isinstance(last, int)) or first < 0 or last < first:
            raise ValueError(f"bad entry range {first}..{last}")
        self._check_client()
        if last > self.last_add_confirmed and self._meta.state is not LedgerState.CLOSED:
            if self._writer is None:
                await self.read_last_add_confirmed()
                if last > self._lac:
                    await self.refresh_metadata()
        bound = self.last_add_confirmed
        if last > bound:
            raise err.ReadBeyondLac(self.ledger_id, last, bound)
        sink = sink_type(self.ledger_id, first, last)
        if last > first:   # (one entry: the speculative read is the plan)
            await self._read_ranges(first, last, rotation, sink)
        todo = sink.missing(first, last)
        if todo:
            results = await asyncio.gather(*(self._read_one_bounded(e) for e in todo), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            for r in results:
                sink.put_entry(r)
        return sink

    async def _read_ranges(self, first: int, last: int, rotation: int, sink) -> None:
        """``first..last`` by range reads, as ``stream.read_plan`` plans them
        per fragment (every id asked of one bookie of its write set, the
        bookies in parallel), into ``sink`` (stream.record_batch); what no
        planned read delivered stays missing there (the caller reads those
        entry by entry, which alone may find an entry missing).  What a
        round leaves undelivered (a bookie down, stalled, or without the
        entry) is asked again of the other bookies of its write sets
        (``plan_missing``), for up to Qw rounds."""
        meta = self._meta
        frags: list[tuple[Fragment, int, int, set[int]]] = []  # (fragment, first, last, bookies to avoid)
        q = self.client.quarantined()
        nxt_frag = first
        while nxt_frag <= last:
            try:
                f, end = await self._span(nxt_frag)
            except err.ReadFailed:
                break  # the entry-by-entry reads report it
            a, b = nxt_frag, last if end is None else min(last, end - 1)
            nxt_frag = b + 1
            frags.append((f, a, b, {i for i, x in enumerate(f.ensemble) if x in q}))
        E, Qw = meta.ensemble_size, meta.write_quorum
        rotation += self.ledger_id  # readers of different ledgers start on different bookies
        for rnd in range(Qw):
            reads: list[tuple[int, str, RangeRead]] = []
            for k, (f, a, b, avoid) in enumerate(frags):
                if rnd == 0:
                    plans = plan_reads(a, b, E, Qw, avoid=avoid, rotation=rotation,
                                       block_entries=self.read_block_entries)
                else:
                    if sink.full(a, b):
                        continue
                    plans = plan_missing(sink.missing(a, b), E, Qw, avoid=avoid, rotation=rotation + rnd)
                reads.extend((k, f.ensemble[r.bookie_index], r) for r in plans)
            if not reads:
                break
            if len(reads) == 1:
                got = [await self._planned_read(reads[0][1], reads[0][2], sink)]
            else:
                got = await asyncio.gather(*(self._planned_read(bid, r, sink) for _, bid, r in reads))
            short = False
            for (k, _, r), delivered in zip(reads, got):
                # (the first round's reads are disjoint over empty slots: a count says it)
                if delivered < r.count() if rnd == 0 else sink.undelivered(r):
                    frags[k][3].add(r.bookie_index)
                    short = True
            if not short:
                break

    async def _planned_read(self, bid: str, r: RangeRead, sink) -> int:
        """One planned range read (sparse, with the plan's stripe filter);
        the entries it delivers go to ``sink`` (``put_frame``: checksums
        verified; entries the plan did not ask of this bookie, or delivered
        already, are dropped).  A failure or a stall ends it quietly.
        Returns how many of its ids it delivered."""
        bc = await self.client.bookie(bid)
        if bc is None:
            return 0
        delivered = 0
        cfg = self.client.config
        # (the sink checks every record's checksum: the bookie need not;
        # a record that fails ends this read, and the next round asks another)
        stream = bc.read_range(self.ledger_id, r.first, r.last, max_frame_bytes=self.read_frame_bytes, sparse=True,
                               stripe=r.stripe, residues=r.residues, raw=True, reader_verifies=True)
        after = r.first - 1
        lid = self.ledger_id
        try:
            while True:
                # A slow first answer hands over to the next round (other
                # bookies), so does a stall later on.  Not marked failed: a
                # busy bookie is no dead one, and a client's quarantine keeps
                # its writers away too (under load, slow reads had
                # quarantined every bookie of a cluster).
                wait = cfg.speculative_read_timeout * FIRST_FRAME_SPECULATIONS if after < r.first else cfg.read_timeout
                try:
                    resp = await asyncio.wait_for(stream.__anext__(), wait)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    log.info("ledger %s: range read from %s too slow", lid, bid)
                    break
                if resp.stop > resp.start:  # (raw frames: the records are data[start:stop])
                    n, after = sink.put_frame(resp.data, resp.start, resp.stop, after, r)
                    delivered += n
                if wire.ends_sparse_read(resp.status, resp.through, r.last):
                    break
        except (BookieUnavailable, entry_codec.ChecksumMismatch, entry_codec.MalformedEntry) as e:
            log.info("ledger %s: range read from %s stopped: %s", lid, bid, e)
        finally:
            await stream.aclose()
        return delivered

    async def _read_one_bounded(self, eid: int) -> entry_codec.Entry:
        async with self._read_sem:
            return await self._read_one(eid)

    async def _read_one(self, eid: int) -> entry_codec.Entry:
        for attempt in range(2):
            frag = await self._fragment_for(eid)
            try:
                return await self._read_replicas(eid, frag)
            except (err.EntryMissing, err.ReadFailed):
                # Missing, or missing on some replicas and unreachable on the
                # rest: the entry may have moved to a fragment this handle
                # has not seen yet (an ensemble change from LAFR+1 moves
                # entries the old ensemble only partly holds).
                if attempt:
                    raise
                await self.refresh_metadata()
                if self._fragment_or_none(eid) == frag:
                    raise
        raise AssertionError("unreachable")

    def _fragment_or_none(self, eid: int) -> Fragment | None:
        span = self._span_now(eid)
        return span[0] if span is not None else None

    def _span_now(self, eid: int) -> tuple[Fragment, int | None] | None:
        """The fragment holding ``eid`` and the next fragment's first entry
        (None: the newest), from what this handle holds; None if unknown."""
        meta = self._meta
        last = meta.last_fragment
        if last is not None and eid >= last.first_entry:
            return last, None
        if not self._lazy_fragments:
            frags = meta.fragments
            i = bisect.bisect_right([f.first_entry for f in frags], eid) - 1
            return (frags[i], frags[i + 1].first_entry) if i >= 0 else None
        i = self._spans.bisect_right(eid) - 1
        if i >= 0:
            frag, end = self._spans.peekitem(i)[1]
            if eid < end:
                return frag, end
        return None

    async def _span(self, eid: int) -> tuple[Fragment, int | None]:
        span = self._span_now(eid)
        if span is None and self._lazy_fragments and eid >= self._meta.trimmed_before:
            try:
                frag, end = await self.client.meta_call(self.client.ledgers.fragment_span, self.ledger_id, eid)
            except err.BookKeeperError:
                frag = None
            if frag is not None:
                if end is None:  # the store's newest fragment: our metadata is behind
                    await self.refresh_metadata()
                    return self._span_now(eid) or (frag, None)
                self._spans[frag.first_entry] = (frag, end)
                return frag, end
        if span is None:
            await self.refresh_metadata()
            span = self._span_now(eid)
        if span is None:
            raise err.ReadFailed(self.ledger_id, eid, f"ledger {self.ledger_id}: no fragment holds entry {eid}")
        return span

    async def _fragment_for(self, eid: int) -> Fragment:
        return (await self._span(eid))[0]

    async def _read_replicas(self, eid: int, frag: Fragment) -> entry_codec.Entry:
        """Speculative read, as ``stream.read_core.EntryRead`` decides it:
        the replicas of the write set healthy first; the next one asked when
        the last is slow (past ``speculative_read_timeout``) or fails; the
        first verified answer wins; missing only on Qw - Qa + 1 absent answers."""
        meta, cfg = self._meta, self.client.config
        ens = frag.ensemble
        now = time.monotonic()
        health = self.client.health
        read = EntryRead(eid, meta.ensemble_size, meta.write_quorum, meta.ack_quorum,
                         scores={i: health.score(b, now) for i, b in enumerate(ens)},
                         speculate_after=cfg.speculative_read_timeout)
        loop = asyncio.get_running_loop()
        tasks: dict[asyncio.Future, int] = {}

        def send(indexes: list[int]) -> None:
            for i in indexes:
                tasks[asyncio.ensure_future(self._read_from(ens[i], eid))] = i

        send(read.start(loop.time()))
        try:
            while tasks and read.verdict is Verdict.PENDING:
                d = read.deadline
                done, _ = await asyncio.wait(tasks, timeout=None if d is None else max(0.0, d - loop.time()),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    send(read.tick(loop.time()))
                for t in done:
                    answer, value = t.result()
                    send(read.on_answer(tasks.pop(t), answer, loop.time(), value))
        finally:
            for t in tasks:
                t.cancel()
        verdict = read.verdict
        if verdict is Verdict.FOUND:
            return read.value
        replicas = [ens[i] for i in read.order]
        if verdict is Verdict.MISSING:
            raise err.EntryMissing(self.ledger_id, eid, f"ledger {self.ledger_id}: entry {eid} is missing: "
                                                        f"{meta.write_quorum - meta.ack_quorum + 1} of its "
                                                        f"replicas {replicas} do not hold it")
        if verdict is Verdict.BAD:
            raise err.BadChecksum(f"ledger {self.ledger_id}: entry {eid}: bad checksum on {replicas}")
        raise err.ReadFailed(self.ledger_id, eid)

    async def _read_from(self, bookie_id: str, eid: int) -> tuple[Answer, entry_codec.Entry | None]:
        """One replica's answer, sorted (``read_core.Answer``); the entry
        with OK, its checksum verified."""
        bc = await self.client.bookie(bookie_id)
        if bc is None:
            return Answer.FAILED, None
        try:
            resp = await bc.read_entry(self.ledger_id, eid, timeout=self.client.config.read_timeout)
        except (BookieUnavailable, asyncio.TimeoutError):
            self.client.mark_failed(bookie_id)
            return Answer.FAILED, None
        st = status_of(resp.status)
        if st is not Status.OK:
            return answer_of(st), None
        try:
            e = entry_codec.decode(resp.entry)
        except (entry_codec.ChecksumMismatch, entry_codec.MalformedEntry) as x:
            log.warning("ledger %s: entry %s from %s: %s", self.ledger_id, eid, bookie_id, x)
            return Answer.BAD, None
        if e.ledger_id != self.ledger_id or e.entry_id != eid:
            log.warning("ledger %s: entry %s from %s: got entry %s/%s", self.ledger_id, eid, bookie_id,
                        e.ledger_id, e.entry_id)
            return Answer.BAD, None
        return Answer.OK, e

    async def tail(self, start: int = 0, *, poll_timeout: float = 1.0,
                   batch: int = 1000) -> AsyncIterator[entry_codec.Entry]:
        """Every entry from ``start`` on, in order, as the LAC moves; ends
        once the ledger is closed and its last entry was yielded."""
        nxt = start
        while True:
            lac = self.last_add_confirmed
            if nxt <= lac:
                for e in await self.read_entries(nxt, min(lac, nxt + batch - 1)):
                    yield e
                    nxt = e.entry_id + 1
                continue
            if self._meta.state is LedgerState.CLOSED:
                return
            await self.long_poll_last_add_confirmed(lac, poll_timeout)


async def read_lac_covering(client: "BookKeeperClient", meta: LedgerMetadata) -> int:
    """The highest LAC among a covering set of the last fragment's bookies
    (stream.quorum.CoverageTracker), with plain reads: no fence, no term.

    A fragment starts at the LAC + 1 of the change that made it, so its
    first entry - 1 is a confirmed lower bound even before its bookies hold
    anything."""
    frag = meta.last_fragment
    read = LacRead(frag.first_entry, meta.ensemble_size, meta.write_quorum, meta.ack_quorum)
    timeout = client.config.read_timeout

    async def one(bid: str):
        bc = await client.bookie(bid)
        if bc is None:
            return None
        try:
            resp = await bc.read_lac(meta.ledger_id, timeout=timeout)
        except (BookieUnavailable, asyncio.TimeoutError) as e:
            client.mark_failed(bid, f"LAC read failed: {why(e)}")
            return None
        client.mark_healthy(bid)
        return resp

    tasks = {asyncio.ensure_future(one(b)): i for i, b in enumerate(frag.ensemble)}
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                resp = t.result()
                if resp is None:
                    read.on_answer(tasks[t], None)
                else:
                    read.on_answer(tasks[t], status_of(resp.status), resp.lac)
            if read.covered:
                return read.lac
            if read.impossible:
                break
    finally:
        for t in tasks:
            t.cancel()
    raise err.QuorumTimeout(f"ledger {meta.ledger_id}: no covering quorum answered the LAC read")


