"""The write path of a ledger: :class:`LedgerWriter` drives
:class:`stream.writer_core.WriterCore` (classic mode: term 0, released at the
LAC, ensemble changes from LAC+1; or a term's writer on an unbounded ledger).
Every input (an add, a bookie's ack, an error, a timeout, a published
ensemble change) goes into the core; its ``Ready`` is drained once per
event-loop turn, so all adds of a turn leave as one frame per bookie
(pipelining).  An ensemble change the core proposes is published here:
replacements from the placement policy, joining bookies prepared
(:func:`prepare_bookies`), one fragment CASed into etcd with
``LedgerStore.add_fragment``; a lost CAS re-reads the metadata and, unless
the ledger is still OPEN, fails the outstanding adds (fenced).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
from typing import TYPE_CHECKING, Callable

from bookie import wire
from bookie.core import Status
from metadata.ledgers import Fragment, LedgerState
from stream import errors as err
from stream.bookie_client import BookieUnavailable
from stream.writer_core import TERMINAL as WRITER_TERMINAL
from stream.writer_core import ChangeReason, EnsembleChange, WriterCore, WriterError, WriterFailed, WriterState

if TYPE_CHECKING:  # pragma: no cover
    from stream.client import BookKeeperClient
    from stream.ledger import LedgerHandle

log = logging.getLogger("stream.ledger")  # one logger for the ledger's rooms

# A bookie's batch leaves in frames of at most this: at 1 MiB gRPC's cost per
# message is already small beside its cost per byte, and a large batch in
# several frames lets a bookie journal one while the next arrives (with 4 MiB
# the whole window moved as one frame, a stage at a time: bench medians of six
# alternating runs, 1 KiB and 64 KiB appends, about 8 % higher at 1 MiB).
FRAME_BYTES = 1 << 20
# Frames in flight per bookie.  A small batch waits for the frame ahead of
# it to be acknowledged, gathering what comes meanwhile (fewer, larger frames:
# gRPC's cost is per message); a backlog of PIPELINE_BYTES or more goes at
# once, up to MAX_INFLIGHT_FRAMES, so large entries keep the bookie busy.
MAX_INFLIGHT_FRAMES = 4
PIPELINE_BYTES = 256 << 10
TELL_LAC_TIMEOUT = 1.0  # a closing writer's last explicit LAC


def why(e: BaseException) -> str:
    """An error as a reason (a timeout's str() is empty)."""
    return str(e) or type(e).__name__


def status_of(code: int) -> Status | None:
    try:
        return Status(code)
    except ValueError:
        return None


def split_frames(records: list[bytes], ids: list[int]):
    """Splits one bookie's batch into frames of at most FRAME_BYTES."""
    if sum(map(len, records)) <= FRAME_BYTES:
        yield ids, records
        return
    start, size = 0, 0
    for k, rec in enumerate(records):
        if size and size + len(rec) > FRAME_BYTES:
            yield ids[start:k], records[start:k]
            start, size = k, 0
        size += len(rec)
    if start < len(records):
        yield ids[start:], records[start:]


# -- the writer ---------------------------------------------------------------------

PREPARED, PREPARE_FAILED = 0, -1


async def prepare_bookies(client: "BookKeeperClient", ledger_id: int, first_entry: int, term: int,
                          bookies: list[str]) -> int:
    """Prepares bookies joining a fragment that starts at ``first_entry`` of a
    term-based ledger (bookie/core.py ``prepare``: the term is raised, and
    whatever an older term left at ``first_entry`` and above is deleted).
    Classic ledgers (term 0) have one writer per entry id and need none.

    Returns PREPARED when all are, the newer term (> 0) when one answered
    INVALID_TERM, PREPARE_FAILED when one could not be prepared (it is then
    quarantined)."""
    if term == 0 or not bookies:
        return PREPARED

    async def one(bid: str) -> int:
        bc = await client.bookie(bid)
        if bc is None:
            return PREPARE_FAILED
        try:
            r = await bc.prepare(ledger_id, first_entry, term, timeout=client.config.add_timeout)
        except (BookieUnavailable, asyncio.TimeoutError):
            return PREPARE_FAILED
        client.mark_healthy(bid)  # it answered
        if r.status == Status.INVALID_TERM:
            return max(1, int(r.term))
        return PREPARED if r.status == Status.OK else PREPARE_FAILED

    results = await asyncio.gather(*(one(b) for b in bookies))
    for bid, r in zip(bookies, results):
        if r == PREPARE_FAILED:
            client.mark_failed(bid)
    return max(results) if any(r > 0 for r in results) else min(results)




@dataclasses.dataclass(frozen=True)
class WriterOptions:
    """How a writer writes: classic (term 0, released at the LAC, changes
    from LAC+1) or a term's writer on an unbounded ledger (guaranteed write
    quorum, appends after the recovery's no-op, fragments rolled by size)."""

    term: int = 0
    next_entry: int | None = None
    guaranteed_write_quorum: bool = False
    fragment_max_entries: int | None = None
    fragment_max_bytes: int | None = None
    explicit_lac: bool = True   # tell the ensemble the LAC once adds go quiet
    # what an add's future resolves to, from its entry id (streams: a Position)
    result: "Callable[[int], object] | None" = None
    # what a batch's future resolves to, from its first and last entry ids
    result_range: "Callable[[int, int], object] | None" = None


class LedgerWriter:
    def __init__(self, handle: "LedgerHandle"):
        self.h = handle
        self.client = handle.client
        self.cfg = handle.client.config
        meta = handle._meta
        frag = meta.last_fragment
        assert frag is not None and meta.state is LedgerState.OPEN
        o = handle._writer_options
        self.options = o
        self.core = WriterCore(meta.ledger_id, o.term, meta.ensemble_size, meta.write_quorum, meta.ack_quorum,
                               frag.first_entry, list(frag.ensemble), next_entry=o.next_entry,
                               guaranteed_write_quorum=o.guaranteed_write_quorum,
                               max_pending=self.cfg.max_pending_adds,
                               fragment_max_entries=o.fragment_max_entries,
                               fragment_max_bytes=o.fragment_max_bytes)
        self._lac_told = (self.core.lac, self.core.lafr)
        self._lac_told_to: list[str] = list(self.core.ensemble)  # the ensemble the last WriteLacs went to
        self._lac_round: asyncio.Task | None = None  # the explicit LAC's WriteLacs on their way
        self._lac_timer: asyncio.TimerHandle | None = None
        self._retry_timer: asyncio.TimerHandle | None = None
        self._retry_delay = 0.0                # back-off of held/deferred ensemble changes
        self._retried: set[str] = set()        # the failed bookies last retried (an ack resets the back-off)
        self._inflight: dict[str, int] = {}   # bookie id -> frames awaiting their ack
        self._backlog: dict[str, list] = {}  # bookie id -> [index, ids, records, bytes]
        # the last frame encoded: ((first, last), frame id, message, bookies sent to)
        self._last_frame: tuple | None = None
        self.loop = asyncio.get_running_loop()
        self._queued: list = []                # payloads added since the last drain
        self._queued_n = 0
        self._queued_futures: list[tuple[int, bool, asyncio.Future]] = []  # (count, single add, future)
        # (last entry, first entry, single add, future) per add call, in entry order
        self.futures: collections.deque[tuple[int, int, bool, asyncio.Future]] = collections.deque()
        self._scheduled = False
        self._waiters: list[asyncio.Future] = []
        self._fail_error: BaseException | None = None
        self._tasks: set[asyncio.Task] = set()
        self._stopped = False                  # stop(): nothing more is sent
        self.frames_sent = 0
        self.ensemble_changes = 0

    # -- inputs ----------------------------------------------------------------

    def add(self, payload: bytes) -> asyncio.Future:
        """One add; the future resolves to ``options.result(entry id)``."""
        return self.add_many((payload,), one=True)

    def add_many(self, payloads, *, one: bool = False) -> asyncio.Future:
        """Consecutive adds (all or none queued); one future for them all,
        resolving to ``options.result_range(first, last)`` once the last is
        acknowledged (acks are in order), or failing if any of them fails."""
        limit = self.client.max_entry_size
        for p in payloads:
            if not isinstance(p, (bytes, bytearray, memoryview)):
                raise TypeError(f"payload must be bytes, got {type(p).__name__}")
            if len(p) > limit:  # refused here, for this call alone: nothing is sent
                raise err.EntryTooLarge(len(p), limit, f"ledger {self.core.ledger_id}: an entry of {len(p)} "
                                                       f"bytes is larger than the maximum entry size ({limit} "
                                                       f"bytes, the smallest the bookies accept)")
        fut = self.loop.create_future()
        if not payloads:
            nxt = self.core.next_entry + self._queued_n
            fut.set_result(self._resolve(nxt, nxt - 1, False))
            return fut
        try:
            self.core.check_room(self._queued_n + len(payloads))
        except WriterError as e:
            raise self._map(e) from None
        # Queued until the drain: the adds of one turn of the event loop
        # reach the core (and the bookies) as one run.
        self._queued.extend(payloads)
        self._queued_n += len(payloads)
        self._queued_futures.append((len(payloads), one, fut))
        self._schedule()
        return fut

    def _hand_queued(self) -> None:
        payloads, queued = self._queued, self._queued_futures
        self._queued, self._queued_futures, self._queued_n = [], [], 0
        try:
            eid = self.core.add_many(payloads)
        except WriterError as e:  # the writer ended since (check_room passed then)
            e = self._map(e)
            for _, _, fut in queued:
                if not fut.done():
                    fut.set_exception(e)
            return
        for n, one, fut in queued:
            self.futures.append((eid + n - 1, eid, one, fut))
            eid += n

    def outstanding(self) -> list[asyncio.Future]:
        """The futures of every add not yet resolved (queued ones too)."""
        return [f[3] for f in self.futures] + [f[2] for f in self._queued_futures]

    @property
    def queued(self) -> int:
        return self._queued_n

    def _resolve(self, first: int, last: int, one: bool):
        o = self.options
        if one:
            return first if o.result is None else o.result(first)
        return range(first, last + 1) if o.result_range is None else o.result_range(first, last)

    def _bookie_failed(self, index: int, bookie_id: str, reason: str = "add failed") -> None:
        core = self.core
        if core.state in WRITER_TERMINAL or core.ensemble[index] != bookie_id:
            return  # already replaced, or the writer is done
        log.info("ledger %s: bookie %s (index %d) failed: %s", core.ledger_id, bookie_id, index, reason)
        self.client.mark_failed(bookie_id, reason)
        core.on_bookie_failed(index)
        self._schedule()

    def _fail(self, e: BaseException) -> None:
        self._fail_error = e
        self.core.fail(str(e))
        self._schedule()

    def _map(self, e: BaseException) -> BaseException:
        if isinstance(e, WriterFailed) and self._fail_error is not None:
            return self._fail_error
        return err.translate(e)

    # -- outputs ---------------------------------------------------------------

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        if self._queued_futures:
            self._hand_queued()
        r = self.core.ready()
        futures = self.futures
        if r.acked:
            top = r.acked[-1]
            while futures and futures[0][0] <= top:
                last, first, one, f = futures.popleft()
                if not f.done():
                    f.set_result(self._resolve(first, last, one))
        if r.failed:
            # every pending add fails at once (the writer ended); a batch
            # partly acknowledged fails too: its acknowledged part stays
            low, e = r.failed[0]
            e = self._map(e)
            doomed = []
            while futures and futures[-1][0] >= low:
                doomed.append(futures.pop()[3])
            for f in reversed(doomed):
                if not f.done():
                    f.set_exception(e)
        for s in r.sends:
            self._send(s.bookie_index, s.bookie_id, s.entry_ids, s.records)
        if (self.options.explicit_lac and not r.sends and (r.lac, r.lafr) > self._lac_told
                and self.core.may_tell_lac and self._lac_timer is None):
            self._lac_timer = self.loop.call_later(self.cfg.explicit_lac_delay, self._explicit_lac)
        if r.ensemble_change is not None:
            self._spawn(self._change(r.ensemble_change))
        if self._retry_timer is None and not self._stopped and self.core.awaiting:
            # Failed bookies wait (delayed ensemble change): rule 3 holds the
            # change (each holds an ack a committed entry needs), or no bookie
            # could replace them.  Appends go on to the rest meanwhile; the
            # failed ones (and the change) are retried, backing off.
            self._retry_delay = min(self.cfg.change_retry_max, max(0.1, self._retry_delay * 2))
            self._retry_timer = self.loop.call_later(self._retry_delay, self._retry_held)
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def tell_lac(self) -> None:
        """Sends the LAC and LAFR to the ensemble now, if they moved since
        last told, and waits for the answers (a writer going away: readers
        then see every acknowledged entry at once)."""
        core = self.core
        told = (core.lac, core.lafr)
        if not core.may_tell_lac:  # also mid-change: a roll falls due as a full fragment's last entry is acked
            return
        if told <= self._lac_told and self._lac_told_to == core.ensemble:
            # told already, by an explicit LAC: its answers are awaited too
            # (the writer stopping next would cancel a WriteLac on its way)
            if self._lac_round is not None and not self._lac_round.done():
                await asyncio.wait([self._lac_round], timeout=TELL_LAC_TIMEOUT)
            if self._lac_told_to == core.ensemble:
                return
        for _ in range(2):  # again if a change published meanwhile: its bookies need it too
            self._lac_told = told
            # advisory: a slow bookie does not hold a closing writer for long
            await self._tell_ensemble(*told, timeout=TELL_LAC_TIMEOUT)
            if self._lac_told_to == core.ensemble or not core.may_tell_lac:
                return

    async def _tell_ensemble(self, lac: int, lafr: int, timeout: float | None = None) -> None:
        ensemble = self._lac_told_to = list(self.core.ensemble)
        await asyncio.gather(*(self._write_lac(bid, lac, lafr, timeout=timeout) for bid in ensemble))

    def _explicit_lac(self) -> None:
        """Adds went quiet: the last entries' LAC (and LAFR: a take-over
        reads from LAFR + 1) would otherwise reach the bookies only with the
        next add.  Sent once adds stayed quiet for ``explicit_lac_delay`` (a
        WriteLac is journalled: one per add would double the fsyncs), and
        not while adds are in flight (their acks arm it again)."""
        self._lac_timer = None
        core = self.core
        told = (core.lac, core.lafr)
        if not core.may_tell_lac or told <= self._lac_told or core.next_to_send > core.release_mark + 1:
            return
        self._lac_told = told
        self._lac_round = self._spawn(self._tell_ensemble(*told))

    def _retry_held(self) -> None:
        self._retry_timer = None
        waiting = sorted(self.core.failed.values())
        self._retried = set(waiting)
        if self.core.retry_failed():
            log.info("ledger %s: retrying failed bookies %s (and the ensemble change)", self.core.ledger_id,
                     waiting)
            self._schedule()

    def progress(self) -> asyncio.Future:
        """Resolves at the next drain (an ack, a failure, a change...)."""
        w = self.loop.create_future()
        self._waiters.append(w)
        return w

    def _spawn(self, coro) -> asyncio.Task:
        t = self.loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def _send(self, index: int, bookie_id: str, ids: list[int], records: list[bytes]) -> None:
        inflight = self._inflight.get(bookie_id, 0)
        if inflight == 0:
            self._transmit(index, bookie_id, ids, records)
            return
        held = self._backlog.setdefault(bookie_id, [index, [], [], 0])
        held[1].extend(ids)
        held[2].extend(records)
        held[3] += sum(map(len, records))
        if held[3] >= PIPELINE_BYTES and inflight < MAX_INFLIGHT_FRAMES:
            del self._backlog[bookie_id]
            self._transmit(index, bookie_id, held[1], held[2])

    def _transmit(self, index: int, bookie_id: str, ids: list[int], records: list[bytes]) -> None:
        bc = self.client.bookie_now(bookie_id)
        if bc is None:
            self.loop.call_soon(self._bookie_failed, index, bookie_id, "not registered")
            return
        for fids, frecs in split_frames(records, ids):
            try:
                fut = bc.add_encoded(*self._encoded(bookie_id, fids, frecs))
            except Exception:  # pragma: no cover - a broken channel
                log.exception("add_frame failed")
                self.loop.call_soon(self._bookie_failed, index, bookie_id)
                return
            self.frames_sent += 1
            self._inflight[bookie_id] = self._inflight.get(bookie_id, 0) + 1
            timer = self.loop.call_later(self.cfg.add_timeout, self._frame_timeout, index, bookie_id, fut)
            fut.add_done_callback(functools.partial(self._frame_done, index, bookie_id, fids, timer))

    def _encoded(self, bookie_id: str, ids, records: list[bytes]) -> tuple[int, bytes]:
        """The frame of ``records`` (entries ``ids``), encoded once for every
        bookie it goes to: with Qw = E every bookie of the write set is sent
        the same runs, at once or as each one's frame ahead is acked.  Only
        a run of consecutive ids is shared (its ids name its records)."""
        first, last, n = ids[0], ids[-1], len(ids)
        shared = last - first + 1 == n
        c = self._last_frame
        if shared and c is not None and c[0] == (first, last) and bookie_id not in c[3]:
            c[3].add(bookie_id)
            return c[1], c[2]
        fid = next(wire.frame_ids)
        msg = wire.encode_add_frame(fid, records)
        if shared:
            self._last_frame = ((first, last), fid, msg, {bookie_id})
        return fid, msg

    async def _write_lac(self, bookie_id: str, lac: int, lafr: int, timeout: float | None = None) -> None:
        bc = self.client.bookie_now(bookie_id)
        if bc is None:
            return
        try:
            resp = await bc.write_lac(self.core.ledger_id, lac, lafr, self.core.term,
                                      timeout=timeout or self.cfg.add_timeout)
        except (BookieUnavailable, asyncio.TimeoutError):
            return  # advisory: the next entry carries the LAC anyway
        if resp.status == Status.INVALID_TERM:
            self.core.on_invalid_term(resp.term)
            self._schedule()

    def _frame_timeout(self, index: int, bookie_id: str, fut: asyncio.Future) -> None:
        if not fut.done():
            self._bookie_failed(index, bookie_id, f"no ack in {self.cfg.add_timeout} s")

    def _frame_done(self, index: int, bookie_id: str, ids: list[int], timer, fut: asyncio.Future) -> None:
        timer.cancel()
        self._inflight[bookie_id] -= 1
        held = self._backlog.pop(bookie_id, None)
        if held is not None and not self._stopped:
            if self.core.ensemble[held[0]] == bookie_id:  # else replaced: the core resends elsewhere
                self._transmit(held[0], bookie_id, held[1], held[2])
        if fut.cancelled() or fut.exception() is not None:
            self._bookie_failed(index, bookie_id, "cancelled" if fut.cancelled() else str(fut.exception()))
            return
        ack = fut.result()
        self.client.mark_healthy(bookie_id)  # it answered (a refusal too: it is alive)
        if self._retried and bookie_id in self._retried:  # a retried bookie is back
            self._retried.discard(bookie_id)
            self._retry_delay = 0.0
        if ack.status == Status.OK and not ack.errors:
            self.core.on_acks(ids, index, bookie_id=bookie_id)
            self._schedule()
            return
        errors = {e.index: e for e in ack.errors}
        whole = status_of(ack.status) if ack.status != Status.OK and not errors else None
        for k, eid in enumerate(ids):
            e = errors.get(k)
            if e is not None:
                st, term = status_of(e.status) or Status.INTERNAL_ERROR, e.term
            else:
                st, term = whole or Status.OK, 0
            self.core.on_ack(eid, index, st, bookie_id=bookie_id, term=term)
        self._schedule()

    # -- ensemble change ---------------------------------------------------------

    def _live(self, prop: EnsembleChange) -> bool:
        return self.core.proposal is prop and self.core.state is WriterState.CHANGING_ENSEMBLE

    async def _change(self, prop: EnsembleChange) -> None:
        try:
            await self._publish_change(prop)
        except Exception as e:
            log.exception("ledger %s: ensemble change failed", self.core.ledger_id)
            if self._live(prop):
                self._fail(err.translate(e))
        self._schedule()

    async def _publish_change(self, prop: EnsembleChange) -> None:
        lid = self.core.ledger_id
        client = self.client
        async with client.placement_lock:
            for attempt in range(self.cfg.metadata_attempts):
                if not self._live(prop):
                    return
                # A failure replaces bookies with ones outside the ensemble; a
                # roll chooses the whole next ensemble afresh, so a stream
                # spreads over the cluster as it grows.
                # Recently failed bookies are chosen only when the rest are too few.
                exclude: dict[str, str] = {}
                if prop.reason is not ChangeReason.ROLL:
                    exclude = {b: "in the ensemble" for b in prop.ensemble}
                try:
                    picks = await client.choose_bookies(len(prop.replace), exclude, self.h.placement)
                except err.NotEnoughBookies as e:
                    # No bookie to replace them with: while Qa of every write
                    # set is left, the writer goes on without the failed ones
                    # (delayed ensemble change), retrying later; else it fails.
                    if self._live(prop) and not self.core.ack_quorum_reachable:
                        self._fail(e)
                    elif self._live(prop):
                        log.warning("ledger %s: no bookie to replace %s, going on without them (appends "
                                    "acknowledged at Qa while the window has room): %s", lid,
                                    [prop.ensemble[i] for i in prop.replace], e)
                        self.core.on_change_deferred()
                    return
                new = list(prop.ensemble)
                for i, b in zip(prop.replace, picks):
                    new[i] = b
                joining = [b for b in new if b not in prop.ensemble]
                verdict = await prepare_bookies(client, lid, prop.first_entry, self.core.term, joining)
                if verdict > 0:  # INVALID_TERM: a newer term took over
                    if self._live(prop):
                        self.core.on_invalid_term(verdict)
                    return
                if verdict == PREPARE_FAILED:
                    continue  # a joining bookie failed: choose again (it is quarantined)
                frag = Fragment(prop.first_entry, tuple(new))
                try:
                    meta, rev = await client.meta_call(client.ledgers.add_fragment, lid, frag,
                                                       self.h._meta, self.h._rev)
                except (err.MetadataConflict, err.MetadataUnavailable) as e:
                    # A lost CAS, or an unknown outcome: the metadata decides.
                    if isinstance(e, err.MetadataUnavailable):
                        await asyncio.sleep(min(0.05 * (attempt + 1), 1.0))
                    try:
                        meta, rev = await client.meta_call(client.ledgers.read, lid)
                    except err.MetadataUnavailable:
                        continue
                    self.h._set_meta(meta, rev)
                    if meta.state is not LedgerState.OPEN or meta.term != self.core.term:
                        # recovery started, or a newer term's writer took over
                        log.info("ledger %s: ensemble change rejected, ledger is %s at term %d", lid,
                                 meta.state.name, meta.term)
                        if self._live(prop):
                            self.core.on_ensemble_change_rejected(meta.term)
                        return
                    if meta.last_fragment != frag:
                        continue
                self.h._set_meta(meta, rev)
                if self._live(prop):
                    log.info("ledger %s: new fragment %s (replaced %s)", lid, frag,
                             [prop.ensemble[i] for i in prop.replace])
                    self.ensemble_changes += 1
                    self.client.metrics.ensemble_changes.inc()
                    self._retry_delay = 0.0
                    self.core.on_ensemble_changed(prop.first_entry, new)
                return
        if self._live(prop):
            self._fail(err.MetadataConflict(f"ledger {lid}: ensemble change CAS kept failing"))

    def cancel(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for timer in (self._retry_timer, self._lac_timer):
            if timer is not None:
                timer.cancel()

    def stop(self, error: BaseException) -> None:
        """Ends the writer here, with no close CAS (a stream writer closing,
        or the client closing under a writer).  Every add not acknowledged
        yet fails with ``error`` (its outcome is for the next writer's
        recovery to tell); acknowledged ones stay.  The core goes terminal
        first, so a bookie whose stream dies afterwards (the client closing
        its channels under frames still on their way to Qw) is not taken
        for a failed bookie: no ensemble change starts, nothing more is sent."""
        if self._stopped:
            return
        self._stopped = True
        if self.core.state not in WRITER_TERMINAL:
            self._fail(error)
        self._drain()  # settles the futures now (queued adds too), wakes the waiters
        self._backlog.clear()
        self.cancel()


# -- recovery -----------------------------------------------------------------------

