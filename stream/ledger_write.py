"""The write path of a ledger: :class:`LedgerWriter` drives
:class:`stream.writer_core.WriterCore` (classic mode: term 0, released at the
LAC, ensemble changes from LAC+1; or a term's writer on an unbounded ledger).
Every input (an add, a bookie's ack, an error, a timeout, a published
ensemble change) goes into the core; its ``Ready`` is drained once per
event-loop turn, so all adds of a turn leave as frames per bookie
(``stream/frames.py``: size, in-flight limit, backlog, a run encoded once).
Every timing rule (frame timeouts, the explicit LAC, the retry of waiting
bookies) is ``stream/timers.py``'s ``WriterClock``: one loop timer at its
next deadline calls ``tick(loop.time())``.  A bookie whose registration
disappears is failed at once (``on_bookie_gone``, from the client's watch).
An ensemble change the core proposes is published here: replacements from
the placement policy, joining bookies prepared
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

from bookie.core import Status
from metadata.ledgers import Fragment, LedgerState
from stream import errors as err
from stream import password as ledger_password
from stream.bookie_client import BookieUnavailable, decode_ack
from stream.frames import Frame, FramePipeline
from stream.lifecycle import (PREPARE_FAILED, PREPARED, ChangeEnsemble, Moot, prepare_answer, prepare_verdict, to_prepare,
                              run_ledger_cas)
from stream.timers import WriterClock
from stream.tracing import writer_ack_counted
from stream.writer_core import TERMINAL as WRITER_TERMINAL
from stream.writer_core import ChangeReason, EnsembleChange, WriterCore, WriterError, WriterFailed, WriterState

if TYPE_CHECKING:  # pragma: no cover
    from stream.client import BookKeeperClient
    from stream.ledger import LedgerHandle

log = logging.getLogger("stream.ledger")  # one logger for the ledger's rooms

TELL_LAC_TIMEOUT = 1.0  # a closing writer's last explicit LAC


def why(e: BaseException) -> str:
    """An error as a reason (a timeout's str() is empty)."""
    return str(e) or type(e).__name__


# -- the writer ---------------------------------------------------------------------

async def prepare_bookies(client: "BookKeeperClient", ledger_id: int, first_entry: int, term: int,
                          bookies: list[str], master_key: bytes = b"") -> int:
    """Prepares bookies joining a fragment that starts at ``first_entry`` of a
    term-based ledger (bookie/core.py ``prepare``: the term is raised, and
    whatever an older term left at ``first_entry`` and above is deleted).
    Classic ledgers (term 0) have one writer per entry id and need none.

    Returns ``stream.lifecycle.prepare_verdict``: PREPARED, the newer term
    (> 0) when one answered INVALID_TERM, PREPARE_FAILED when one could not
    be prepared (it is then quarantined)."""
    if term == 0 or not bookies:
        return PREPARED

    async def one(bid: str) -> int:
        bc = await client.bookie(bid)
        if bc is None:
            return PREPARE_FAILED
        try:
            r = await bc.prepare(ledger_id, first_entry, term, timeout=client.config.add_timeout,
                                 master_key=master_key)
        except (BookieUnavailable, asyncio.TimeoutError):
            return PREPARE_FAILED
        client.mark_healthy(bid)  # it answered
        return prepare_answer(r.status == Status.OK, int(r.term) if r.status == Status.INVALID_TERM else None)

    results = await asyncio.gather(*(one(b) for b in bookies))
    for bid, r in zip(bookies, results):
        if r == PREPARE_FAILED:
            client.mark_failed(bid)
    return prepare_verdict(results)


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
    # called once (on the loop) when the writer learns a later term took over
    # (a stream writer's registration then goes: stream/writer_lease.py)
    on_fenced: "Callable[[], None] | None" = None


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
                               fragment_max_bytes=o.fragment_max_bytes, mutations=self.cfg.mutations)
        # every timing rule (frame timeouts, the explicit LAC, the retry of
        # waiting bookies) is the clock's; one loop timer at its next deadline
        self.clock = WriterClock(self.core, frame_timeout=self.cfg.add_timeout, lac_delay=self.cfg.explicit_lac_delay,
                                 explicit_lac=o.explicit_lac, retry_max=self.cfg.change_retry_max)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._frame_seq = 0
        self._lac_told_to: list[str] = list(self.core.ensemble)  # the ensemble the last WriteLacs went to
        self._lac_round: asyncio.Task | None = None  # the explicit LAC's WriteLacs on their way
        self.master_key = ledger_password.master_key(meta.custom)  # in every frame, WriteLac, prepare
        self.pipeline = FramePipeline(master_key=self.master_key)  # frames in flight and backlog per bookie
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
        self._told_fenced = False              # options.on_fenced called
        self.frames_sent = 0
        self.ensemble_changes = 0
        self.client.watch_for_writer(self)

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
        tr = self.client.tracer
        if tr is not None:
            for k in range(len(payloads)):
                tr.step("WriterAdd", eid + k, lid=self.core.ledger_id, value=[self.core.term, "data"])
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

    def on_bookie_gone(self, bookie_id: str) -> None:
        """The bookie's registration disappeared (the client's watch): it is
        failed now, as a failed write would find it later, so the open
        fragment's ensemble changes (delayed when no bookie can replace it)."""
        if self._stopped:
            return
        for index, b in enumerate(self.core.ensemble):
            if b == bookie_id:
                self._bookie_failed(index, bookie_id, "its registration is gone")

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
        tr = self.client.tracer
        for s in r.sends:
            if tr is not None:
                tr.sends(self.core.ledger_id, s.bookie_id, s.entry_ids, s.records)
            self._send(s.bookie_index, s.bookie_id, s.entry_ids, s.records)
        if r.ensemble_change is not None:
            self._spawn(self._change(r.ensemble_change))
        if not self._stopped:
            self.clock.after_ready(r, self.loop.time())
            self._arm()
        if self.core.state is WriterState.FENCED and not self._told_fenced and self.options.on_fenced is not None:
            self._told_fenced = True
            self.options.on_fenced()
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
        if told <= self.clock.told and self._lac_told_to == core.ensemble:
            # told already, by an explicit LAC: its answers are awaited too
            # (the writer stopping next would cancel a WriteLac on its way)
            if self._lac_round is not None and not self._lac_round.done():
                await asyncio.wait([self._lac_round], timeout=TELL_LAC_TIMEOUT)
            if self._lac_told_to == core.ensemble:
                return
        for _ in range(2):  # again if a change published meanwhile: its bookies need it too
            self.clock.told_now(told)
            # advisory: a slow bookie does not hold a closing writer for long
            await self._tell_ensemble(*told, timeout=TELL_LAC_TIMEOUT)
            if self._lac_told_to == core.ensemble or not core.may_tell_lac:
                return

    async def _tell_ensemble(self, lac: int, lafr: int, timeout: float | None = None) -> None:
        ensemble = self._lac_told_to = list(self.core.ensemble)
        await asyncio.gather(*(self._write_lac(bid, lac, lafr, timeout=timeout) for bid in ensemble))

    def _arm(self) -> None:
        """One loop timer, at the clock's next deadline."""
        at = self.clock.next_deadline()
        if at is None:
            return
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer, self._timer_at = self.loop.call_at(at, self._tick), at

    def _tick(self) -> None:
        self._timer = None
        if self._stopped:
            return
        t = self.clock.tick(self.loop.time())
        for _, index, bookie_id in t.timed_out:
            self._bookie_failed(index, bookie_id, f"no ack in {self.cfg.add_timeout} s")
        if t.tell_lac is not None:
            # Adds went quiet: the last entries' LAC (and LAFR: a take-over
            # reads from LAFR + 1) would otherwise reach the bookies only with
            # the next add (a WriteLac is journalled: not one per add).
            self._lac_round = self._spawn(self._tell_ensemble(*t.tell_lac))
        if t.retried:
            log.info("ledger %s: retrying failed bookies %s (and the ensemble change)", self.core.ledger_id,
                     t.retried)
        self._schedule()  # (the drain re-arms the timer)

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
        self._transmit(self.pipeline.offer(index, bookie_id, ids, records))

    def _transmit(self, frames: list[Frame]) -> None:
        if not frames:
            return
        index, bookie_id = frames[0].bookie_index, frames[0].bookie_id
        bc = self.client.bookie_now(bookie_id)
        if bc is None:
            self.pipeline.unsent(frames)
            self.loop.call_soon(self._bookie_failed, index, bookie_id, "not registered")
            return
        for k, f in enumerate(frames):
            try:
                fut = bc.add_encoded(f.frame_id, f.message)
            except Exception:  # pragma: no cover - a broken channel
                log.exception("add_frame failed")
                self.pipeline.unsent(frames[k:])
                self.loop.call_soon(self._bookie_failed, index, bookie_id)
                return
            self.frames_sent += 1
            self._frame_seq += 1
            self.clock.frame_sent(self._frame_seq, index, bookie_id, self.loop.time())
            fut.add_done_callback(functools.partial(self._frame_done, index, bookie_id, f.entry_ids,
                                                    self._frame_seq))

    async def _write_lac(self, bookie_id: str, lac: int, lafr: int, timeout: float | None = None) -> None:
        bc = self.client.bookie_now(bookie_id)
        if bc is None:
            return
        try:
            resp = await bc.write_lac(self.core.ledger_id, lac, lafr, self.core.term,
                                      timeout=timeout or self.cfg.add_timeout, master_key=self.master_key)
        except (BookieUnavailable, asyncio.TimeoutError):
            return  # advisory: the next entry carries the LAC anyway
        if resp.status == Status.INVALID_TERM:
            if self.client.tracer is not None and self.core.state not in WRITER_TERMINAL:
                self.client.tracer.step("Rejected", lid=self.core.ledger_id)
            self.core.on_invalid_term(resp.term)
            self._schedule()

    def _frame_done(self, index: int, bookie_id: str, ids: list[int], key: int, fut: asyncio.Future) -> None:
        self.clock.frame_done(key)
        at, frames = self.pipeline.frame_done(bookie_id)
        if frames:
            if not self._stopped and self.core.ensemble[at] == bookie_id:
                self._transmit(frames)
            else:  # replaced (the core resends elsewhere), or stopped
                self.pipeline.unsent(frames)
        if fut.cancelled() or fut.exception() is not None:
            self._bookie_failed(index, bookie_id, "cancelled" if fut.cancelled() else str(fut.exception()))
            return
        ack = fut.result()
        self.client.mark_healthy(bookie_id)  # it answered (a refusal too: it is alive)
        self.clock.answered(bookie_id)
        statuses = decode_ack(ack, len(ids))
        if self.client.tracer is not None:
            self._trace_answers(index, bookie_id, ids, statuses)
        if statuses is None:
            self.core.on_acks(ids, index, bookie_id=bookie_id)
        else:
            for eid, (st, term) in zip(ids, statuses):
                self.core.on_ack(eid, index, st, bookie_id=bookie_id, term=term)
        self._schedule()

    def _trace_answers(self, index: int, bookie_id: str, ids: list[int], statuses) -> None:
        """The answers' steps (stream/tracing.py), before the core takes them."""
        core, tr = self.core, self.client.tracer
        sts = [Status.OK] * len(ids) if statuses is None else [Status(st) for st, _ in statuses]
        counted = [writer_ack_counted(core, index, bookie_id, eid, WRITER_TERMINAL) for eid in ids]
        tr.add_answers(core.ledger_id, bookie_id, ids, sts, counted)
        mine = core.state not in WRITER_TERMINAL and core.ensemble[index] == bookie_id
        if mine and any(st in (Status.INVALID_TERM, Status.FENCED) for st in sts):
            tr.step("Rejected", lid=core.ledger_id)

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
            for _ in range(self.cfg.metadata_attempts):
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
                    picks = await client.choose_bookies(len(prop.replace), exclude, self.h.placement,
                                                         ledger_id=lid)
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
                joining = to_prepare(prop.ensemble, new, self.cfg.mutations)
                verdict = await prepare_bookies(client, lid, prop.first_entry, self.core.term, joining,
                                                self.master_key)
                if verdict > 0:  # INVALID_TERM: a newer term took over
                    if self._live(prop):
                        self.core.on_invalid_term(verdict)
                    return
                if verdict == PREPARE_FAILED:
                    continue  # a joining bookie failed: choose again (it is quarantined)
                frag = Fragment(prop.first_entry, tuple(new))
                res = await run_ledger_cas(client, ChangeEnsemble(lid, self.core.term, frag, self.cfg.mutations),
                                           known=(self.h._meta, self.h._rev), fragments=self.h._fragments_mode)
                if res.meta is not None:
                    self.h._set_meta(res.meta, res.revision)
                if isinstance(res.verdict, Moot):  # recovery started, or a newer term's writer took over
                    log.info("ledger %s: ensemble change rejected: %s", lid, res.verdict.why)
                    if self._live(prop) and res.meta is None:
                        self._fail(err.NoSuchLedger(lid))
                    elif self._live(prop):
                        if client.tracer is not None:
                            client.tracer.step("NoticeTakeover", lid=lid)
                        self.core.on_ensemble_change_rejected(res.meta.term)
                    return
                if not res.applied:
                    break  # the CAS kept failing
                if self._live(prop):
                    log.info("ledger %s: new fragment %s (replaced %s)", lid, frag,
                             [prop.ensemble[i] for i in prop.replace])
                    self.ensemble_changes += 1
                    if client.tracer is not None and prop.reason is ChangeReason.ROLL:
                        client.tracer.step("RollFragment", prop.first_entry, tuple(new), lid=lid)
                    elif client.tracer is not None:
                        client.tracer.step("EnsembleChange", prop.first_entry, tuple(new),
                                           {prop.ensemble[i]: new[i] for i in prop.replace}, lid=lid)
                    self.clock.changed()
                    self.client.metrics.ensemble_changes.inc()
                    self.core.on_ensemble_changed(prop.first_entry, new)
                return
        if self._live(prop):
            self._fail(err.MetadataConflict(f"ledger {lid}: ensemble change CAS kept failing"))

    def cancel(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

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
        self.pipeline.forget()
        self.cancel()


# -- recovery -----------------------------------------------------------------------

