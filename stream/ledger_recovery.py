"""The recovery path of a ledger: :class:`RecoveryDriver` drives
:class:`stream.recovery_core.RecoveryCore` (classic: the fence flag, no
term, no truncate no-op; unbounded: the term): fencing LAC reads,
read-forward with read-ahead (the core's per-entry reads leave as one sparse
range read per bookie and run of ids, carrying the term/fence; the answers
go back per entry and bookie), write-back batched into add frames
(``stream/frames.py``), bookie replacement; speculative reads are
``stream/timers.py``'s ``RecoveryClock`` (one loop timer at its deadline).
:func:`recover_ledger` wraps it in the metadata steps of a classic ledger,
``stream.lifecycle``'s ``BeginRecovery`` and ``CloseRecovered`` through the
one CAS runner (what a lost CAS means is theirs to judge).
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from bookie import entry as entry_codec
from bookie.core import Status
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode
from stream import errors as err
from stream import password as ledger_password
from stream.bookie_client import BookieUnavailable, decode_ack, status_of
from stream.frames import FramePipeline
from stream.timers import RecoveryClock
from stream.tracing import recovery_ack_counted, recovery_steps
from stream.quorum import write_set
from stream.recovery_core import TERMINAL as RECOVERY_TERMINAL
from stream.recovery_core import RecoveryCore, RecoveryResult, RecoveryState
from stream.lifecycle import (ALREADY_CLOSED, GONE, BeginRecovery, CloseRecovered, Done, Moot, run_ledger_cas,
                              to_prepare)
from stream.ledger_write import PREPARE_FAILED, prepare_bookies, why

if TYPE_CHECKING:  # pragma: no cover
    from stream.client import BookKeeperClient

log = logging.getLogger("stream.ledger")  # one logger for the ledger's rooms

# Recovery's range reads come back in smaller frames still: the frontier moves,
# and write-backs leave, while the rest of the range is on its way.
RECOVERY_FRAME_BYTES = 64 << 10


class RecoveryDriver:
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
                                 fence=not unbounded, unbounded=unbounded, mutations=self.cfg.mutations)
        self.loop = asyncio.get_running_loop()
        self.done = self.loop.create_future()
        self._tasks: set[asyncio.Task] = set()
        self._scheduled = False
        self._replace_lock = asyncio.Lock()
        # the ledger's master key (stream/password.py), with every fencing read, read and write-back
        self.master_key = ledger_password.master_key(meta.custom)
        self.refused: str | None = None         # a bookie refused the master key: recovery ends
        self.pipeline = FramePipeline(master_key=self.master_key)  # write-backs: a run encoded once for its bookies
        self.range_reads: dict[str, int] = {}   # bookie id -> range reads sent (stats)
        self.clock = RecoveryClock(self.core, self.cfg.speculative_read_timeout)  # speculative reads
        self._timer: asyncio.TimerHandle | None = None
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
            if self._timer is not None:
                self._timer.cancel()
        st = self.core.state
        if st is RecoveryState.DONE:
            return self.core.result
        if self.refused is not None:
            raise err.UnauthorizedAccess(f"ledger {self.lid}: recovery refused: {self.refused}")
        if st is RecoveryState.FENCED_OUT:
            raise err.LedgerFenced(f"ledger {self.lid}: recovery fenced out: {self.core.reason}")
        missing = "; ".join(f"{b}: {why}" for b, why in sorted(self.missing.items()))
        raise err.LedgerRecoveryFailed(f"ledger {self.lid}: recovery aborted: {self.core.reason}"
                                       + (f" (missing bookies: {missing})" if missing else ""),
                                       missing=sorted(self.missing))

    def _unauthorized(self, bookie_id: str, status) -> bool:
        """A bookie answered UNAUTHORIZED_ACCESS: every bookie of the ledger
        learned the same key, so no retry or other bookie would do; the
        recovery ends (UnauthorizedAccess)."""
        if status != Status.UNAUTHORIZED_ACCESS:
            return False
        if self.refused is None:
            self.refused = f"bookie {bookie_id} answered UNAUTHORIZED_ACCESS (not the ledger's master key)"
            self.core.abort(self.refused)
        return True
    def _traced(self, fn, *args, **kw):
        """A core input; with a trace, the steps it took (stream/tracing.py)."""
        tr = self.client.tracer
        if tr is None:
            return fn(*args, **kw)
        before, decided = self.core.state, len(self.core.recovered)
        out = fn(*args, **kw)
        tr.steps(recovery_steps(self.core, before, decided), lid=self.lid)
        return out

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
            self.clock.read_activity(self.loop.time())  # (stalled reads are counted from here)
            term, fence = r.reads[0].term, r.reads[0].fence
            assert all((x.term, x.fence) == (term, fence) for x in r.reads)
            for (index, bid), ids in wanted.items():
                for run in _runs(sorted(ids), index, self.core.E, self.core.Qw):
                    self._spawn(self._read_range(index, bid, run, term, fence))
        batches: dict[tuple[int, str], list] = {}
        for w in r.writes:
            batches.setdefault((w.bookie_index, w.bookie_id), []).append(w)
        tr = self.client.tracer
        if tr is not None:
            for (index, bid), ws in batches.items():
                tr.sends(self.lid, bid, [w.entry_id for w in ws], [w.record for w in ws])
        for (index, bid), ws in batches.items():
            self._spawn(self._write(index, bid, ws))
        for rp in r.replacements:
            self._spawn(self._replace(rp))
        self.clock.after_ready(self.loop.time())
        at = self.clock.next_deadline()
        if self._timer is None and at is not None:
            self._timer = self.loop.call_at(at, self._tick)
        if self.core.state in RECOVERY_TERMINAL and not self.done.done():
            self.done.set_result(None)

    @property
    def speculations(self) -> int:
        """Times stalled reads were asked of the rest of their write sets (stats)."""
        return self.clock.speculations

    def _tick(self) -> None:
        self._timer = None
        before = self.clock.speculations
        n = self._traced(self.clock.tick, self.loop.time())
        if self.clock.speculations > before:
            log.info("ledger %s: recovery reads stalled for %.0f ms: %d entries asked of the rest of their "
                     "write sets", self.lid, self.cfg.speculative_read_timeout * 1e3, n)
        self._schedule()  # (the pump re-arms the timer)

    async def _fencing_read(self, f) -> None:
        bc = self.client.bookie_now(f.bookie_id)
        try:
            if bc is None:
                raise BookieUnavailable(f"{f.bookie_id}: no address")
            resp = await bc.read_lac(f.ledger_id, term=f.term, fence=f.fence, timeout=self.cfg.read_timeout,
                                     master_key=self.master_key)
            self.client.mark_healthy(f.bookie_id)
            if self._unauthorized(f.bookie_id, resp.status):
                return self._schedule()
            st, tr = status_of(resp.status), self.client.tracer
            if tr is not None and self.core.state is RecoveryState.FENCING:
                if st is Status.INVALID_TERM:
                    tr.step("Rejected", lid=self.lid)
                elif st in (Status.OK, Status.NO_SUCH_LEDGER):
                    tr.step("ClientFenceAnswer", f.bookie_id, resp.lac, resp.lafr, lid=self.lid)
            self._traced(self.core.on_lac_response, f.bookie_index, st, resp.lac, resp.lafr, resp.last_entry)
        except (BookieUnavailable, asyncio.TimeoutError) as e:
            self._missing(f.bookie_id, f"fencing read failed: {why(e)}")
            self._traced(self.core.on_lac_response, f.bookie_index, None)
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
        traced = self.client.tracer is not None
        late: list[tuple[int, Status, bytes]] = []  # (traced only) records the core no longer wants

        def answer_upto(limit: int, status: Status | None) -> None:
            nonlocal k
            while k < len(ids) and ids[k] <= limit:
                answers.append((ids[k], status, None))
                k += 1

        def hand_over() -> None:
            tr = self.client.tracer
            if tr is not None and (answers or late) and core.state is RecoveryState.READING:
                # every answer that reached the client, taken or late (as sim/clients.py's)
                tr.read_answers(self.lid, bookie_id, sorted(answers + late, key=lambda a: a[0]))
            late.clear()
            if answers:
                self.clock.read_activity(self.loop.time())
                if (tr is not None and core.state is RecoveryState.READING
                        and any(st is Status.INVALID_TERM and eid in core.outcomes for eid, st, _ in answers)):
                    tr.step("Rejected", lid=self.lid)
                self._traced(core.on_read_responses, index, answers)
                answers.clear()

        bc = self.client.bookie_now(bookie_id)
        try:
            if bc is None:
                raise BookieUnavailable(f"{bookie_id}: no address")
            async for resp in bc.read_range(self.lid, ids[0], ids[-1], max_frame_bytes=RECOVERY_FRAME_BYTES,
                                            term=term, fence=fence, sparse=True,
                                            frame_timeout=self.cfg.read_timeout, master_key=self.master_key):
                st = status_of(resp.status)
                if self._unauthorized(bookie_id, st):
                    break
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
                        elif traced:
                            late.append((eid, Status.OK, data[start:end]))
                        k += 1
                answer_upto(resp.through, Status.NO_SUCH_ENTRY)
                hand_over()
                self._schedule()
                if core.state is not RecoveryState.READING:
                    break  # decided (or ended): the rest does not matter
        except (BookieUnavailable, asyncio.TimeoutError, entry_codec.MalformedEntry) as e:
            log.info("ledger %s: recovery range read from %s failed: %s", self.lid, bookie_id, e)
            if not isinstance(e, entry_codec.MalformedEntry):
                self._missing(bookie_id, f"recovery read failed: {why(e)}")
        hand_over()  # (an answer the loop left: INVALID_TERM, or a frame's before a failure)
        answer_upto(ids[-1], None)  # what the stream did not answer: failed
        hand_over()
        self._schedule()

    async def _write(self, index: int, bookie_id: str, writes: list) -> None:
        bc = self.client.bookie_now(bookie_id)
        try:
            if bc is None:
                raise BookieUnavailable(f"{bookie_id}: no address")
            for f in self.pipeline.encode(index, bookie_id, [w.entry_id for w in writes], [w.record for w in writes]):
                ack = await asyncio.wait_for(bc.add_encoded(f.frame_id, f.message), self.cfg.add_timeout)
                statuses = decode_ack(ack, len(f.entry_ids))
                tr = self.client.tracer
                if statuses is None:
                    if tr is not None:
                        tr.add_answers(self.lid, bookie_id, f.entry_ids, None,
                                       [recovery_ack_counted(self.core, index, bookie_id, eid, RECOVERY_TERMINAL)
                                        for eid in f.entry_ids])
                    self._traced(self.core.on_write_acks, f.entry_ids, index, bookie_id=bookie_id)
                    continue
                for eid, (st, _term) in zip(f.entry_ids, statuses):
                    if self._unauthorized(bookie_id, st):
                        break
                    if tr is not None:
                        mine = (self.core.state not in RECOVERY_TERMINAL and self.core.state is not RecoveryState.INIT
                                and self.core.ensemble[index] == bookie_id)
                        if st is Status.OK:
                            tr.add_answers(self.lid, bookie_id, [eid], None,
                                           [recovery_ack_counted(self.core, index, bookie_id, eid, RECOVERY_TERMINAL)])
                        elif mine and st is Status.INVALID_TERM:
                            tr.step("Rejected", lid=self.lid)
                    self._traced(self.core.on_write_ack, eid, index, st, bookie_id=bookie_id)
        except (BookieUnavailable, asyncio.TimeoutError) as e:
            self._missing(bookie_id, f"recovery write failed: {why(e)}")
            for w in writes:
                self._traced(self.core.on_write_ack, w.entry_id, index, None, bookie_id=bookie_id)
        self._schedule()

    async def _replace(self, rp) -> None:
        async with self._replace_lock:
            if self.core.state in RECOVERY_TERMINAL:
                return
            self.client.mark_failed(rp.bookie_id, "recovery write failed")
            exclude = {b: "in the ensemble" for b in (*self.core.ensemble, *self.core.read_ensemble)}
            try:
                (new,) = await self.client.choose_bookies(1, exclude, None, ledger_id=self.lid)
            except err.BookKeeperError as e:
                self.missing.setdefault(rp.bookie_id, "failed")
                self._traced(self.core.abort, f"no bookie to replace {rp.bookie_id}: {e}")
            else:
                joining = to_prepare(self.core.ensemble, [new], self.core.mutations)
                verdict = await prepare_bookies(self.client, self.lid, self.core.start_entry, self.core.term, joining,
                                                self.master_key)
                if verdict > 0:
                    self._traced(self.core.abort, f"term {verdict} took over while replacing {rp.bookie_id}")
                elif verdict == PREPARE_FAILED:
                    self._traced(self.core.abort, f"replacement {new} for {rp.bookie_id} could not be prepared")
                elif self.core.state not in RECOVERY_TERMINAL:
                    log.info("ledger %s: recovery replaces %s with %s", self.lid, rp.bookie_id, new)
                    if self.client.tracer is not None:
                        ens = list(self.core.ensemble)
                        ens[rp.bookie_index] = new
                        self.client.tracer.step("EnsembleChange", self.core.start_entry, tuple(ens),
                                                {rp.bookie_id: new}, lid=self.lid)
                    self._traced(self.core.on_bookie_replaced, rp.bookie_index, new)
        self._schedule()


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


async def recover_ledger(client: "BookKeeperClient", ledger_id: int) -> tuple[LedgerMetadata, int]:
    """Classic fencing recovery: returns the CLOSED metadata and its revision.

    1. ``BeginRecovery`` (``stream.lifecycle``): OPEN -> IN_RECOVERY by CAS
       (already IN_RECOVERY: another recoverer, or one that crashed; recover
       anyway; CLOSED: nothing to recover).
    2. Run the recovery core over the last fragment (fence, read forward,
       write back).
    3. ``CloseRecovered``: CLOSED at the last entry, with the ensemble
       change of the recovery writes.  A lost CAS is judged again: a CLOSED
       ledger's last entry is adopted (concurrent recoverers converge on it).
    """
    cfg = client.config
    aborted: err.BookKeeperError | None = None
    known = None
    runs = 0
    while True:
        begun = await run_ledger_cas(client, BeginRecovery(ledger_id), known=known, fragments="all")
        meta, rev = begun.meta, begun.revision
        if isinstance(begun.verdict, Moot) and begun.verdict.kind == ALREADY_CLOSED:
            assert meta is not None
            log.info("ledger %s: closed at %d", ledger_id, meta.last_entry)
            return meta, rev
        if isinstance(begun.verdict, Moot):
            raise err.NoSuchLedger(ledger_id)
        if not begun.applied:
            break
        assert meta is not None
        if runs >= cfg.recovery_attempts:
            break
        runs += 1
        if client.tracer is not None:  # (the simulator's classic take-over: sim/clients.py)
            client.tracer.step("StartTakeover", meta.term, lid=ledger_id)
        try:
            result = await RecoveryDriver(client, meta).run()
        except err.LedgerRecoveryFailed as e:
            aborted, known = e, None
            log.info("%s (attempt %d)", e, runs)
            await asyncio.sleep(0.1 * runs)
            continue
        log.info("ledger %s: recovered %d entries, closing at %d", ledger_id, len(result.recovered),
                 result.last_entry)
        change = None if result.ensemble_change is None else Fragment(result.ensemble_change[0],
                                                                      tuple(result.ensemble_change[1]))
        closed = await run_ledger_cas(client, CloseRecovered(ledger_id, result.last_entry, change),
                                      known=(meta, rev), fragments="all")
        if closed.applied:
            assert closed.meta is not None
            if client.tracer is not None:
                client.tracer.step("Finish", lid=ledger_id)
            if isinstance(closed.verdict, Done):
                log.info("ledger %s: closed at %d by another recoverer", ledger_id, closed.meta.last_entry)
            return closed.meta, closed.revision
        if isinstance(closed.verdict, Moot) and closed.verdict.kind == GONE:
            raise err.NoSuchLedger(ledger_id)
        known = None  # OPEN again, or the CAS kept failing: begin again
    raise aborted or err.LedgerRecoveryFailed(f"ledger {ledger_id}: recovery did not complete")
