"""Classic ledgers over gRPC and etcd: thin asyncio adapters around the pure
protocol cores.

- :class:`_Writer` drives :class:`stream.writer_core.WriterCore` (classic
  mode: term 0, released at the LAC, ensemble changes from LAC+1).  Every
  input (an add, a bookie's ack, an error, a timeout, a published ensemble
  change) goes into the core; its ``Ready`` is drained once per event-loop
  turn, so all adds of a turn leave as one frame per bookie (pipelining).
  An ensemble change the core proposes is published here: replacements from
  the placement policy, one fragment CASed into etcd with
  ``LedgerStore.add_fragment``; a lost CAS re-reads the metadata and, unless
  the ledger is still OPEN, fails the outstanding adds (fenced).
- :class:`_RecoveryDriver` drives :class:`stream.recovery_core.RecoveryCore`
  (classic: the fence flag, no term, no truncate no-op): fencing LAC reads,
  read-forward with read-ahead (the core's per-entry reads leave as one
  sparse range read per bookie and run of ids, carrying the term/fence; the
  answers go back per entry and bookie), write-back batched into add frames,
  bookie replacement.  :func:`recover_ledger` wraps
  it in the metadata steps: CAS to IN_RECOVERY, run, CAS to CLOSED with the
  last entry (and the ensemble change, if any); a lost final CAS re-reads and
  adopts a CLOSED ledger's last entry, so concurrent recoverers converge.
- :class:`LedgerHandle` is what applications hold: adds and close for the
  writer, and for everyone reads up to the LAC (speculative: another replica
  is asked when one is slow or fails; checksums verified; nothing skipped),
  LAC reads from a covering quorum (never fencing) and long-poll tailing.

The adapters decide nothing about the protocol: acks, LAC, what to resend,
when to change the ensemble, what recovery reads, writes and concludes all
come from the cores.
"""
from __future__ import annotations

import asyncio
import collections
import bisect
import dataclasses
import functools
import itertools
import logging
from typing import TYPE_CHECKING, AsyncIterator, Callable

from sortedcontainers import SortedDict

from bookie import entry as entry_codec
from bookie import wire
from bookie.core import Status
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from stream import errors as err
from stream.bookie_client import BookieUnavailable
from stream.quorum import CoverageTracker, write_set
from stream.read_plan import RangeRead, plan_missing, plan_reads
from stream.recovery_core import TERMINAL as RECOVERY_TERMINAL
from stream.recovery_core import RecoveryCore, RecoveryResult, RecoveryState
from stream.writer_core import TERMINAL as WRITER_TERMINAL
from stream.writer_core import ChangeReason, EnsembleChange, WriterCore, WriterError, WriterFailed, WriterState

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from stream.client import BookKeeperClient

log = logging.getLogger(__name__)

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
RANGE_FRAME_BYTES = 1 << 20  # small range-read frames: the first one comes back fast
# A range read's first frame may take this many speculative read timeouts
# (several reads are in flight per bookie: a read-ahead queues behind others).
FIRST_FRAME_SPECULATIONS = 20
# Recovery's range reads come back in smaller frames still: the frontier moves,
# and write-backs leave, while the rest of the range is on its way.
RECOVERY_FRAME_BYTES = 64 << 10


def _why(e: BaseException) -> str:
    """An error as a reason (a timeout's str() is empty)."""
    return str(e) or type(e).__name__


def _status(code: int) -> Status | None:
    try:
        return Status(code)
    except ValueError:
        return None


def _frames(records: list[bytes], ids: list[int]):
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


class _Writer:
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
        for fids, frecs in _frames(records, ids):
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
        whole = _status(ack.status) if ack.status != Status.OK and not errors else None
        for k, eid in enumerate(ids):
            e = errors.get(k)
            if e is not None:
                st, term = _status(e.status) or Status.INTERNAL_ERROR, e.term
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

class _RecoveryDriver:
    """Runs one RecoveryCore over the last fragment of ``meta``."""

    def __init__(self, client: "BookKeeperClient", meta: LedgerMetadata):
        """Classic ledgers are fenced; an unbounded ledger is recovered with
        the term in ``meta`` (already raised in etcd by the caller)."""
        self.client = client
        self.cfg = client.config
        self.meta = meta
        frag = meta.last_fragment
        assert frag is not None
        self.lid = meta.ledger_id
        unbounded = meta.mode is LedgerMode.UNBOUNDED
        self.core = RecoveryCore(meta.ledger_id, frag.first_entry, list(frag.ensemble), meta.ensemble_size,
                                 meta.write_quorum, meta.ack_quorum, term=meta.term if unbounded else 0,
                                 fence=not unbounded, unbounded=unbounded)
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self._tasks: set[asyncio.Task] = set()
        self._scheduled = False
        self._replace_lock = asyncio.Lock()
        self.range_reads: dict[str, int] = {}   # bookie id -> range reads sent (stats)
        self._answered_at = 0.0                 # the loop time of the last read answer or read sent
        self._speculation: asyncio.TimerHandle | None = None
        self.speculations = 0                   # times stalled reads were asked of the rest (stats)
        self.missing: dict[str, str] = {}       # bookie id -> what failed (named by LedgerRecoveryFailed)

    async def run(self) -> RecoveryResult:
        for b in self.core.read_ensemble:
            await self.client.bookie(b)  # fill the address cache; unknown ones fail fast
        self.core.start()
        self._pump()
        try:
            await self.done
        finally:
            for t in list(self._tasks):
                t.cancel()
            if self._speculation is not None:
                self._speculation.cancel()
        st = self.core.state
        if st is RecoveryState.DONE:
            return self.core.result
        if st is RecoveryState.FENCED_OUT:
            raise err.LedgerFenced(f"ledger {self.lid}: recovery fenced out: {self.core.reason}")
        missing = "; ".join(f"{b}: {why}" for b, why in sorted(self.missing.items()))
        raise err.LedgerRecoveryFailed(f"ledger {self.lid}: recovery aborted: {self.core.reason}"
                                       + (f" (missing bookies: {missing})" if missing else ""),
                                       missing=sorted(self.missing))

    def _missing(self, bookie_id: str, why: str) -> None:
        self.missing[bookie_id] = why
        self.client.mark_failed(bookie_id, why)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._pump)

    def _spawn(self, coro) -> None:
        t = self.loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _pump(self) -> None:
        self._scheduled = False
        r = self.core.ready()
        for f in r.fencing_reads:
            self._spawn(self._fencing_read(f))
        # The core's reads (one per entry and bookie) leave as one sparse range
        # read per bookie and run of ids.
        wanted: dict[tuple[int, str], list[int]] = {}
        for rd in r.reads:
            wanted.setdefault((rd.bookie_index, rd.bookie_id), []).append(rd.entry_id)
        if r.reads:
            self._answered_at = self.loop.time()  # (stalled reads are counted from here)
            term, fence = r.reads[0].term, r.reads[0].fence
            assert all((x.term, x.fence) == (term, fence) for x in r.reads)
            for (index, bid), ids in wanted.items():
                for run in _runs(sorted(ids), index, self.core.E, self.core.Qw):
                    self._spawn(self._read_range(index, bid, run, term, fence))
        batches: dict[tuple[int, str], list] = {}
        for w in r.writes:
            batches.setdefault((w.bookie_index, w.bookie_id), []).append(w)
        for (index, bid), ws in batches.items():
            self._spawn(self._write(index, bid, ws))
        for rp in r.replacements:
            self._spawn(self._replace(rp))
        if self._speculation is None and self.core.single_reads:
            self._speculation = self.loop.call_later(self.cfg.speculative_read_timeout, self._speculate)
        if self.core.state in RECOVERY_TERMINAL and not self.done.done():
            self.done.set_result(None)

    def _speculate(self) -> None:
        """Entries read from one bookie (spread reads): if no read answer
        came for ``speculative_read_timeout``, the core asks the rest of
        their write sets; otherwise look again that long after the last."""
        self._speculation = None
        if not self.core.single_reads:
            return
        quiet = self.loop.time() - self._answered_at
        if quiet >= self.cfg.speculative_read_timeout:
            n = self.core.speculate()
            self.speculations += 1
            log.info("ledger %s: recovery reads stalled for %.0f ms: %d entries asked of the rest of their "
                     "write sets", self.lid, quiet * 1e3, n)
            self._schedule()
        else:
            self._speculation = self.loop.call_later(self.cfg.speculative_read_timeout - quiet, self._speculate)

    async def _fencing_read(self, f) -> None:
        bc = self.client.bookie_now(f.bookie_id)
        try:
            if bc is None:
                raise BookieUnavailable(f"{f.bookie_id}: no address")
            resp = await bc.read_lac(f.ledger_id, term=f.term, fence=f.fence, timeout=self.cfg.read_timeout)
            self.client.mark_healthy(f.bookie_id)
            self.core.on_lac_response(f.bookie_index, _status(resp.status), resp.lac, resp.lafr, resp.last_entry)
        except (BookieUnavailable, asyncio.TimeoutError) as e:
            self._missing(f.bookie_id, f"fencing read failed: {_why(e)}")
            self.core.on_lac_response(f.bookie_index, None)
        self._schedule()

    async def _read_range(self, index: int, bookie_id: str, ids: list[int], term: int, fence: bool) -> None:
        """One sparse range read of ``ids`` (ascending, the ids of a run that
        this bookie holds) from one bookie; every id gets its answer: OK
        with the record, NO_SUCH_ENTRY once a frame vouches for it, or, if
        the stream fails first, the failure (None: timed out/unreachable)."""
        core = self.core
        self.range_reads[bookie_id] = self.range_reads.get(bookie_id, 0) + 1
        k = 0  # ids[:k] are answered
        answers: list[tuple[int, Status | None, bytes | None]] = []  # a frame's, handed over at once

        def answer_upto(limit: int, status: Status | None) -> None:
            nonlocal k
            while k < len(ids) and ids[k] <= limit:
                answers.append((ids[k], status, None))
                k += 1

        def hand_over() -> None:
            if answers:
                self._answered_at = self.loop.time()
                core.on_read_responses(index, answers)
                answers.clear()

        bc = self.client.bookie_now(bookie_id)
        try:
            if bc is None:
                raise BookieUnavailable(f"{bookie_id}: no address")
            async for resp in bc.read_range(self.lid, ids[0], ids[-1], max_frame_bytes=RECOVERY_FRAME_BYTES,
                                            term=term, fence=fence, sparse=True,
                                            frame_timeout=self.cfg.read_timeout):
                st = _status(resp.status)
                if st is not Status.OK:
                    if st is Status.INVALID_TERM:
                        if k < len(ids):
                            answers.append((ids[k], st, None))  # a newer term: fenced out
                    else:
                        # NO_SUCH_LEDGER is definitive (every id absent); any
                        # other status is an error, never "absent"
                        answer_upto(ids[-1], st or Status.INTERNAL_ERROR)
                    break
                data = resp.entries
                for eid, start, end in entry_codec.record_spans(data):
                    answer_upto(eid - 1, Status.NO_SUCH_ENTRY)  # skipped: not held (sparse)
                    if k < len(ids) and ids[k] == eid:
                        if core.wants(eid, index):  # (the core verifies what it takes)
                            answers.append((eid, Status.OK, data[start:end]))
                        k += 1
                answer_upto(resp.through, Status.NO_SUCH_ENTRY)
                hand_over()
                self._schedule()
                if core.state is not RecoveryState.READING:
                    break  # decided (or ended): the rest does not matter
        except (BookieUnavailable, asyncio.TimeoutError, entry_codec.MalformedEntry) as e:
            log.info("ledger %s: recovery range read from %s failed: %s", self.lid, bookie_id, e)
            if not isinstance(e, entry_codec.MalformedEntry):
                self._missing(bookie_id, f"recovery read failed: {_why(e)}")
        hand_over()  # (an answer the loop left: INVALID_TERM, or a frame's before a failure)
        answer_upto(ids[-1], None)  # what the stream did not answer: failed
        hand_over()
        self._schedule()

    async def _write(self, index: int, bookie_id: str, writes: list) -> None:
        bc = self.client.bookie_now(bookie_id)
        try:
            if bc is None:
                raise BookieUnavailable(f"{bookie_id}: no address")
            ids = [w.entry_id for w in writes]
            for fids, frecs in _frames([w.record for w in writes], ids):
                ack = await asyncio.wait_for(bc.add_records(frecs), self.cfg.add_timeout)
                if ack.status == Status.OK and not ack.errors:
                    self.core.on_write_acks(fids, index, bookie_id=bookie_id)
                    continue
                errors = {e.index: e for e in ack.errors}
                whole = _status(ack.status) if ack.status != Status.OK and not errors else None
                for k, eid in enumerate(fids):
                    e = errors.get(k)
                    st = (_status(e.status) or Status.INTERNAL_ERROR) if e is not None else (whole or Status.OK)
                    self.core.on_write_ack(eid, index, st, bookie_id=bookie_id)
        except (BookieUnavailable, asyncio.TimeoutError) as e:
            self._missing(bookie_id, f"recovery write failed: {_why(e)}")
            for w in writes:
                self.core.on_write_ack(w.entry_id, index, None, bookie_id=bookie_id)
        self._schedule()

    async def _replace(self, rp) -> None:
        async with self._replace_lock:
            if self.core.state in RECOVERY_TERMINAL:
                return
            self.client.mark_failed(rp.bookie_id, "recovery write failed")
            exclude = {b: "in the ensemble" for b in (*self.core.ensemble, *self.core.read_ensemble)}
            try:
                (new,) = await self.client.choose_bookies(1, exclude, None)
            except err.BookKeeperError as e:
                self.missing.setdefault(rp.bookie_id, "failed")
                self.core.abort(f"no bookie to replace {rp.bookie_id}: {e}")
            else:
                verdict = await prepare_bookies(self.client, self.lid, self.core.start_entry, self.core.term, [new])
                if verdict > 0:
                    self.core.abort(f"term {verdict} took over while replacing {rp.bookie_id}")
                elif verdict == PREPARE_FAILED:
                    self.core.abort(f"replacement {new} for {rp.bookie_id} could not be prepared")
                elif self.core.state not in RECOVERY_TERMINAL:
                    log.info("ledger %s: recovery replaces %s with %s", self.lid, rp.bookie_id, new)
                    self.core.on_bookie_replaced(rp.bookie_index, new)
        self._schedule()


def _undelivered(r: RangeRead, base: int, slots: list) -> bool:
    """Whether some id of the planned read ``r`` has no entry in ``slots``."""
    if not r.stripe:
        return slots[r.first - base:r.last - base + 1].count(None) > 0
    return any(slots[i - base] is None for i in r.ids())


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    """``fn(*args)`` on ``loop``, from another thread (an etcd watch's); not
    at all once the loop is closed: nobody waits on it any more."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _runs(ids: list[int], index: int, ensemble_size: int, write_quorum: int) -> list[list[int]]:
    """Splits the ascending ids that recovery reads from the bookie at
    ``index`` into runs that one range read each covers: a run breaks only
    where an id this bookie holds (its write set includes the bookie) was not
    asked for; ids between that it does not hold (striping, E > Qw) do not
    break a run."""
    runs: list[list[int]] = []
    for eid in ids:
        if runs:
            prev = runs[-1][-1]
            if eid == prev + 1:
                runs[-1].append(eid)
                continue
            gap = range(prev + 1, eid)
            if len(gap) < ensemble_size and not any(index in write_set(j, ensemble_size, write_quorum) for j in gap):
                runs[-1].append(eid)
                continue
        runs.append([eid])
    return runs


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


async def recover_ledger(client: "BookKeeperClient", ledger_id: int) -> tuple[LedgerMetadata, int]:
    """Classic fencing recovery: returns the CLOSED metadata and its revision.

    1. OPEN -> IN_RECOVERY by CAS (already IN_RECOVERY: another recoverer,
       or one that crashed; recover anyway).
    2. Run the recovery core over the last fragment (fence, read forward,
       write back).
    3. CAS to CLOSED with the last entry, publishing the ensemble change of
       the recovery writes with it.  A lost CAS re-reads: a CLOSED ledger's
       last entry is adopted (concurrent recoverers converge on it).
    """
    cfg = client.config
    meta, rev = await client.meta_call(client.ledgers.read, ledger_id)
    aborted: err.BookKeeperError | None = None
    runs = 0
    for _ in range(cfg.metadata_attempts + cfg.recovery_attempts):
        if meta.state is LedgerState.CLOSED:
            log.info("ledger %s: closed at %d", ledger_id, meta.last_entry)
            return meta, rev
        if meta.state is LedgerState.OPEN:
            try:
                new = meta.with_(state=LedgerState.IN_RECOVERY)
                rev = await client.meta_call(client.ledgers.update_header, new, rev)
                meta = new
            except (err.MetadataConflict, err.MetadataUnavailable):
                meta, rev = await client.meta_call(client.ledgers.read, ledger_id)
                continue
        if runs >= cfg.recovery_attempts:
            break
        runs += 1
        try:
            result = await _RecoveryDriver(client, meta).run()
        except err.LedgerRecoveryFailed as e:
            aborted = e
            log.info("%s (attempt %d)", e, runs)
            await asyncio.sleep(0.1 * runs)
            meta, rev = await client.meta_call(client.ledgers.read, ledger_id)
            continue
        closed = meta.with_(state=LedgerState.CLOSED, last_entry=result.last_entry)
        try:
            log.info("ledger %s: recovered %d entries, closing at %d", ledger_id, len(result.recovered),
                     result.last_entry)
            if result.ensemble_change is not None:
                first, ens = result.ensemble_change
                return await client.meta_call(client.ledgers.add_fragment, ledger_id, Fragment(first, ens),
                                              closed, rev)
            rev = await client.meta_call(client.ledgers.update_header, closed, rev)
            return closed, rev
        except (err.MetadataConflict, err.MetadataUnavailable):
            meta, rev = await client.meta_call(client.ledgers.read, ledger_id)
    raise aborted or err.LedgerRecoveryFailed(f"ledger {ledger_id}: recovery did not complete")


# -- the handle -----------------------------------------------------------------------

class LedgerHandle:
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
        self._writer: _Writer | None = _Writer(self) if writable else None
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

    def _set_meta(self, meta: LedgerMetadata, rev: int) -> None:
        if rev >= self._rev:
            self._meta, self._rev = meta, rev

    # -- adds --------------------------------------------------------------------

    def add_entry_async(self, payload: bytes) -> asyncio.Future:
        """Queues an add; the future resolves to its entry id once it (and
        every lower entry) reached Qa bookies.  Raises TooManyPendingAdds
        when the window is full, LedgerClosed/LedgerFenced after the end."""
        return self._writable().add(payload)

    def _writable(self) -> _Writer:
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
        return w.add_many(payloads)

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
        client = self.client
        meta, rev = self._meta, self._rev
        for _ in range(client.config.metadata_attempts):
            if meta.state is LedgerState.CLOSED:
                self._set_meta(meta, rev)
                if meta.last_entry == last:
                    return
                raise err.CloseMismatch(self.ledger_id, last, meta.last_entry)
            if meta.state is LedgerState.IN_RECOVERY:
                self._set_meta(meta, rev)
                raise err.LedgerInRecovery(f"ledger {self.ledger_id} is being recovered by another client")
            closed = meta.with_(state=LedgerState.CLOSED, last_entry=last)
            try:
                rev = await client.meta_call(client.ledgers.update_header, closed, rev)
                self._set_meta(closed, rev)
                return
            except (err.MetadataConflict, err.MetadataUnavailable):
                meta, rev = await client.meta_call(client.ledgers.read, self.ledger_id)
        raise err.MetadataConflict(f"ledger {self.ledger_id}: close CAS kept failing")

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

    # -- reads -------------------------------------------------------------------------

    async def read_entry(self, entry_id: int) -> entry_codec.Entry:
        return (await self.read_entries(entry_id, entry_id))[0]

    async def read_entries(self, first: int, last: int, *, rotation: int = 0) -> list[entry_codec.Entry]:
        """Entries ``first..last`` in order, every one of them, checksums
        verified.  Never past the LAC (ReadBeyondLac); the LAC is refreshed
        once if ``last`` is beyond the known one.  ``rotation`` turns which
        bookie serves which part (stream.read_plan), e.g. per read-ahead chunk."""
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
        slots = await self._read_ranges(first, last, rotation)
        todo = [first + k for k, e in enumerate(slots) if e is None]
        if todo:
            results = await asyncio.gather(*(self._read_one_bounded(e) for e in todo), return_exceptions=True)
            for eid, r in zip(todo, results):
                if isinstance(r, BaseException):
                    raise r
                slots[eid - first] = r
        return slots

    async def _read_ranges(self, first: int, last: int, rotation: int = 0) -> list:
        """``first..last`` by range reads, as ``stream.read_plan`` plans them
        per fragment (every id asked of one bookie of its write set, the
        bookies in parallel); a slot per id, None where no planned read
        delivered it (the caller reads those entry by entry, which alone may
        find an entry missing).  What a round leaves undelivered (a bookie
        down, stalled, or without the entry) is asked again of the other
        bookies of its write sets (``plan_missing``), for up to Qw rounds."""
        n = last - first + 1
        slots: list = [None] * n
        if n == 1:
            return slots  # one entry: the speculative read is the plan
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
                    if slots[a - first:b - first + 1].count(None) == 0:
                        continue
                    missing = [i for i in range(a, b + 1) if slots[i - first] is None]
                    plans = plan_missing(missing, E, Qw, avoid=avoid, rotation=rotation + rnd)
                reads.extend((k, f.ensemble[r.bookie_index], r) for r in plans)
            if not reads:
                break
            if len(reads) == 1:
                got = [await self._planned_read(reads[0][1], reads[0][2], first, slots)]
            else:
                got = await asyncio.gather(*(self._planned_read(bid, r, first, slots) for _, bid, r in reads))
            short = False
            for (k, _, r), delivered in zip(reads, got):
                # (the first round's reads are disjoint over empty slots: a count says it)
                if delivered < r.count() if rnd == 0 else _undelivered(r, first, slots):
                    frags[k][3].add(r.bookie_index)
                    short = True
            if not short:
                break
        return slots

    async def _planned_read(self, bid: str, r: RangeRead, base: int, slots: list) -> int:
        """One planned range read (sparse, with the plan's stripe filter);
        the entries it delivers go to empty ``slots[id - base]``, checksums
        verified; entries the plan did not ask of this bookie are dropped.
        A failure or a stall ends it quietly.  Returns how many of its ids
        it delivered."""
        bc = await self.client.bookie(bid)
        if bc is None:
            return 0
        delivered = 0
        cfg = self.client.config
        stream = bc.read_range(self.ledger_id, r.first, r.last, max_frame_bytes=self.read_frame_bytes, sparse=True,
                               stripe=r.stripe, residues=r.residues, raw=True)
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
                    got = entry_codec.decode_sparse(resp.data, lid, after, resp.start, resp.stop)
                    if got and got[-1].entry_id > r.last:
                        got = [e for e in got if e.entry_id <= r.last]
                    if got:
                        k = got[0].entry_id - base
                        if (not r.stripe and got[-1].entry_id - got[0].entry_id == len(got) - 1
                                and slots[k:k + len(got)].count(None) == len(got)):
                            slots[k:k + len(got)] = got   # (the common case: consecutive, all new)
                            delivered += len(got)
                        else:
                            stripe, residues = r.stripe, r.residues
                            for e in got:
                                i = e[1] - base
                                if (not stripe or residues >> (e[1] % stripe) & 1) and slots[i] is None:
                                    slots[i] = e   # (an id of this read: the bookie's filter, r.wants)
                                    delivered += 1
                        after = got[-1].entry_id if got else after
                if resp.status != Status.OK or resp.through >= r.last:
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
        """Speculative read: ask one replica; when it is slow (past
        ``speculative_read_timeout``) or fails, ask the next as well; the
        first verified answer wins."""
        meta, cfg = self._meta, self.client.config
        q = self.client.quarantined()
        replicas = [frag.ensemble[i] for i in write_set(eid, meta.ensemble_size, meta.write_quorum)]
        replicas.sort(key=lambda b: b in q)  # healthy first, write-set order otherwise
        pending: set[asyncio.Task] = set()
        outcomes: list[str] = []
        nxt = 0

        def start_next() -> None:
            nonlocal nxt
            pending.add(asyncio.ensure_future(self._read_from(replicas[nxt], eid)))
            nxt += 1

        start_next()
        try:
            while pending:
                timeout = cfg.speculative_read_timeout if nxt < len(replicas) else None
                done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    start_next()
                    continue
                for t in done:
                    kind, value = t.result()
                    if kind == "ok":
                        return value
                    outcomes.append(kind)
                    if nxt < len(replicas):
                        start_next()
        finally:
            for t in pending:
                t.cancel()
        if outcomes and all(k == "missing" for k in outcomes):
            raise err.EntryMissing(self.ledger_id, eid, f"ledger {self.ledger_id}: no replica of entry {eid} "
                                                        f"({replicas}) holds it")
        if "bad" in outcomes:
            raise err.BadChecksum(f"ledger {self.ledger_id}: entry {eid}: bad checksum on {replicas}")
        raise err.ReadFailed(self.ledger_id, eid)

    async def _read_from(self, bookie_id: str, eid: int) -> tuple[str, object]:
        bc = await self.client.bookie(bookie_id)
        if bc is None:
            return "error", f"{bookie_id}: no address"
        try:
            resp = await bc.read_entry(self.ledger_id, eid, timeout=self.client.config.read_timeout)
        except (BookieUnavailable, asyncio.TimeoutError) as e:
            self.client.mark_failed(bookie_id)
            return "error", str(e)
        st = _status(resp.status)
        if st is Status.OK:
            try:
                e = entry_codec.decode(resp.entry)
            except (entry_codec.ChecksumMismatch, entry_codec.MalformedEntry) as x:
                return "bad", str(x)
            if e.ledger_id != self.ledger_id or e.entry_id != eid:
                return "bad", f"got entry {e.ledger_id}/{e.entry_id}"
            return "ok", e
        if st in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
            return "missing", st.name
        if st is Status.CHECKSUM_MISMATCH:
            return "bad", resp.message
        return "error", f"{bookie_id}: {st.name if st else resp.status}"

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
    tracker = CoverageTracker(meta.ensemble_size, meta.write_quorum, meta.ack_quorum)
    best = frag.first_entry - 1
    timeout = client.config.read_timeout

    async def one(bid: str):
        bc = await client.bookie(bid)
        if bc is None:
            return None
        try:
            resp = await bc.read_lac(meta.ledger_id, timeout=timeout)
        except (BookieUnavailable, asyncio.TimeoutError) as e:
            client.mark_failed(bid, f"LAC read failed: {_why(e)}")
            return None
        client.mark_healthy(bid)
        return resp

    tasks = {asyncio.ensure_future(one(b)): i for i, b in enumerate(frag.ensemble)}
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                i, resp = tasks[t], t.result()
                st = _status(resp.status) if resp is not None else None
                if st is Status.OK:
                    best = max(best, resp.lac)
                    tracker.on_response(i)
                elif st is Status.NO_SUCH_LEDGER:
                    tracker.on_response(i)
                else:
                    tracker.on_failure(i)
            if tracker.covered:
                return best
            if tracker.impossible:
                break
    finally:
        for t in tasks:
            t.cancel()
    raise err.QuorumTimeout(f"ledger {meta.ledger_id}: no covering quorum answered the LAC read")


__all__ = ["LedgerHandle", "recover_ledger", "read_lac_covering"]
