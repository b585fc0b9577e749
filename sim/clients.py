"""Simulated clients: the adapter glue around the real protocol cores, the
same job stream/ledger*.py and stream/stream.py do over gRPC and etcd.

A ``SimClient`` is a would-be writer.  Its life (unbounded mode):

1. take-over: ``stream.lifecycle.TakeOver`` (term + 1, IN_RECOVERY), judged
   on the simulated metadata, whose store executes the Apply;
2. run a ``RecoveryCore`` with that term over the last fragment: its
   fencing reads, recovery reads and recovery writes become messages, the
   answers (or timeouts) go back in; a bookie replacement picks a live spare;
3. on DONE, ``FinishTakeOver`` (OPEN with the recovery's ensemble change);
   Moot (a newer term): withdraw;
4. be the writer: a ``WriterCore`` (guaranteed write quorum) from the
   recovery's next entry; adds at random times; its sends become frames;
   its timing rules (frame timeouts that mark bookies failed, the explicit
   LAC, the retry back-off) are the shipped ``stream/timers.py`` WriterClock
   ticked with simulated time; an ensemble change proposal is published
   as ``ChangeEnsemble`` (``writer_verdict`` says fenced: withdraw);
5. INVALID_TERM, FENCED_OUT, ABORTED, FAILED, a crash: back to idle, and
   maybe take over again later.

Classic mode: term 0, the creator writes and may close (``CloseAt`` its
LAC); other clients recover with the fence flag (``BeginRecovery``) and
close at the last recovered entry (``CloseRecovered``).

No life-cycle rule is written here: every metadata verdict (and the
preparation of joining bookies) is ``stream/lifecycle.py``'s.  Every core
input is recorded as a spec action (sim/spec.py) and the model's client is
compared with the core's state after it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from bookie.core import Status
from metadata.ledgers import Fragment
from sim.metadata import LID, as_ledger_metadata, with_fragment
from sim.spec import SpecViolation, value_of
from stream.lifecycle import (PREPARED, Apply, BeginRecovery, ChangeEnsemble, CloseAt, CloseRecovered, Done,
                              FinishTakeOver, TakeOver, prepare_answer, prepare_verdict, to_prepare, writer_verdict)
from stream.quorum import ABSENT_STATUSES, ReadOutcome
from stream.recovery_core import TERMINAL as REC_TERMINAL
from stream.recovery_core import RecoveryCore, RecoveryState
from stream.timers import RecoveryClock, WriterClock
from stream.tracing import recovery_ack_counted, recovery_steps, writer_ack_counted
from stream.writer_core import TERMINAL as W_TERMINAL
from stream.writer_core import ChangeReason, WindowFull, WriterCore, WriterState

if TYPE_CHECKING:  # pragma: no cover
    from sim.world import Request, World

LAC_DELAY = 1  # simulated time units: adds quiet this long, the explicit LAC goes (ClientConfig.explicit_lac_delay)
LIVE_RECOVERY = (RecoveryState.FENCING, RecoveryState.READING, RecoveryState.FINISHING)


class SimClient:
    def __init__(self, world: "World", name: str):
        self.w = world
        self.name = name
        self.inc = 0                    # incarnation: a crash starts a new one
        self.term = 0
        self.clock: WriterClock | None = None   # the writer's timing rules (stream/timers.py), in simulated time
        self._frames: dict = {}                 # request id -> the writer's add frame awaiting its answer
        self._tick_at: int | None = None
        self.frags: tuple = ()          # this client's view (cl[c].frags)
        self.rec: RecoveryCore | None = None
        self.writer: WriterCore | None = None
        self.payloads: dict[int, bytes] = {}
        self.adds_left = 0
        self.seq = 0
        self._proposal = None           # the writer's proposal already traced
        self.finishing = False          # the final CAS is scheduled
        self.rclock: RecoveryClock | None = None  # the recovery's timing rule (stream/timers.py)
        self._rtick_at = None
        self.closing = False
        self._stale_seen = 0             # the recovery's stale answers counted so far

    # -- state ------------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        if self.rec is not None and self.rec.state in LIVE_RECOVERY:
            return self.rec.state.value
        if self.rec is not None and self.rec.state is RecoveryState.DONE:
            return "finishing"  # DONE, final CAS not yet made
        if self.writer is not None and self.writer.state not in W_TERMINAL:
            return "open"
        return "idle"

    def abstract(self) -> dict:
        """cl[c] from the cores (see the mapping table in sim/spec.py)."""
        ph = self.phase
        if ph == "idle":
            return {"phase": "idle"}
        if self.rec is not None and ph != "open":
            r = self.rec
            ens = r.ensemble
            out = {"phase": ph, "term": r.term, "frags": self.frags, "lac": r.lac_seen, "lafr": r.lafr_seen,
                   "val": {e: value_of(wb.record) for e, wb in r.writes.items()},
                   "ack": {e: {ens[i] for i in wb.acked} for e, wb in r.writes.items()}}
            if ph == "fencing":
                out["fenced"] = {r.read_ensemble[i] for i in r.coverage.responders}
                del out["val"], out["ack"]
            elif ph == "reading":
                out["next"] = r.frontier
                out["floor"] = r.floor
                ahead = {}
                for n, o in r.outcomes.items():
                    if o.outcome is ReadOutcome.RECOVERABLE:
                        ahead[n] = value_of(o.record)
                    elif nse := {r.read_ensemble[i] for i, st in o.answered.items() if st in ABSENT_STATUSES}:
                        ahead[n] = nse
                out["ahead"] = ahead
            else:
                out["next"] = r.end_entry
            return out
        wr = self.writer
        ens = wr.ensemble
        return {"phase": "open", "term": wr.term, "frags": self.frags, "lac": wr.lac, "lafr": wr.lafr,
                "lap": wr.next_entry - 1,
                "val": {e: ("data", p.payload, wr.term) for e, p in wr.pending.items()},
                "ack": {e: {ens[i] for i in p.acks} for e, p in wr.pending.items()}}

    def compare(self) -> None:
        m = self.w.model
        if m is None:
            return
        mc = m.cl[self.name]
        real = self.abstract()
        diffs = {}
        for k, v in real.items():
            mv = getattr(mc, k)
            if k == "ack":
                mv = {e: s for e, s in mv.items() if e in mc.val}
            if mv != v:
                diffs[k] = (mv, v)
        if diffs:
            raise SpecViolation("state", f"client {self.name}: spec != implementation: {diffs}")

    # -- scheduling (random mode) ---------------------------------------------------------------

    def schedule_activity(self) -> None:
        w = self.w
        if w.now > w.sc.horizon:
            return
        w.at(max(1, int(w.rng.expovariate(1 / w.sc.takeover_mean))), self._tick, self.inc)

    def _tick(self, inc: int) -> None:
        if inc != self.inc:
            return
        if self.phase == "idle" and not self.finishing:
            self.takeover()
        elif (self.phase == "open" and not self.w.unbounded and self.adds_left == 0
              and self.w.chance(0.5)):
            self.close()
        self.schedule_activity()

    def become_creator(self, term: int, frags: tuple) -> None:
        sc = self.w.sc
        self.term, self.frags = term, frags
        first, ens = frags[-1]
        self.writer = WriterCore(7, term, sc.E, sc.Qw, sc.Qa, first, list(ens), next_entry=0,
                                 guaranteed_write_quorum=self.w.unbounded, max_pending=sc.window,
                                 fragment_max_entries=sc.roll_entries or None, mutations=self.w.mutations)
        self._start_writing()

    def _start_writing(self) -> None:
        self.adds_left = self.w.sc.entries
        self._proposal = None
        sc = self.w.sc
        # the shipped rules (frame timeouts, explicit LAC, retry back-off), in simulated time
        self.clock = WriterClock(self.writer, frame_timeout=sc.timeout, lac_delay=LAC_DELAY,
                                 retry_min=sc.timeout, retry_max=4 * sc.timeout)
        self._tick_at = None
        self._frames = {}
        if not self.w.scripted:
            self._schedule_add()

    def _schedule_add(self) -> None:
        w = self.w
        if w.now > w.sc.horizon:
            return
        w.at(max(1, int(w.rng.expovariate(1 / w.sc.add_interval))), self._add_tick, self.inc, self.writer)

    def _add_tick(self, inc: int, writer) -> None:
        if inc != self.inc or writer is not self.writer or self.phase != "open" or self.adds_left <= 0:
            return
        self.add()  # WindowFull: try again later
        if self.adds_left > 0:
            self._schedule_add()

    # -- take-over and recovery -------------------------------------------------------------------

    def takeover(self) -> bool:
        """Begins a take-over (unbounded: ``TakeOver``, term + 1) or a classic
        recovery (``BeginRecovery``); the verdict is stream/lifecycle.py's."""
        w = self.w
        if w.unbounded and w.meta.term + 1 > w.sc.max_terms:
            return False  # (the scenario's bound on take-overs)
        verdict, ver = w.metastore.judge(TakeOver(LID, w.mutations) if w.unbounded else BeginRecovery(LID))
        if isinstance(verdict, Apply):
            assert w.metastore.apply(verdict, ver)  # (synchronous: nothing changed since the read)
        elif not isinstance(verdict, Done):
            return False  # (CLOSED: nothing to recover)
        m = w.meta
        t = m.term
        w.count("takeovers")
        w.step("StartTakeover", self.name, t)
        w.compare_meta()
        self.writer = None
        self.term, self.frags = t, m.frags
        first, ens = m.last_frag
        self._stale_seen = 0
        self.rec = RecoveryCore(7, first, list(ens), w.sc.E, w.sc.Qw, w.sc.Qa, term=t,
                                fence=not w.unbounded, unbounded=w.unbounded,
                                max_read_ahead=w.sc.read_ahead, max_inflight_writes=w.sc.rec_writes,
                                mutations=w.mutations)
        # speculative recovery reads: the shipped timing rule, in simulated time
        self.rclock = RecoveryClock(self.rec, w.sc.timeout // 3)
        self.rec.start()
        self.pump_recovery()
        return True

    def pump_recovery(self) -> None:
        rec, w = self.rec, self.w
        if rec is None:
            return
        r = rec.ready()
        for f in r.fencing_reads:
            w.step("ClientSendRead", self.name, f.bookie_id, None, f.term, f.fence)
            w.request(self.name, self.inc, f.bookie_id, "lac", {"term": f.term, "fence": f.fence},
                      {"rec": rec, "index": f.bookie_index}, self._on_lac, self._on_lac_timeout, w.sc.timeout)
        clock = self.rclock if self.rclock is not None and self.rclock.core is rec else None
        if r.reads and clock is not None:
            clock.read_activity(w.now)  # (stalled reads are counted from here)
        for x in r.reads:
            w.step("ClientSendRead", self.name, x.bookie_id, x.entry_id, x.term, x.fence)
            w.request(self.name, self.inc, x.bookie_id, "read",
                      {"entry": x.entry_id, "term": x.term, "fence": x.fence},
                      {"rec": rec, "index": x.bookie_index}, self._on_read, self._on_read_timeout, w.sc.timeout)
        batches: dict[tuple[int, str], list] = {}
        for wr in r.writes:
            batches.setdefault((wr.bookie_index, wr.bookie_id), []).append(wr)
        for (index, bid), ws in batches.items():
            for x in ws:
                w.step("ClientSendAdd", self.name, bid, x.entry_id, x.record)
            w.request(self.name, self.inc, bid, "add", {"records": [x.record for x in ws]},
                      {"rec": rec, "index": index, "ids": [x.entry_id for x in ws]},
                      self._on_rec_add, self._on_rec_add_timeout, w.sc.timeout)
        for rp in r.replacements:
            w.at(w.sc.meta_delay, self._replace, rec, rp)
        if clock is not None and rec.state not in REC_TERMINAL:
            clock.after_ready(w.now)
            at = clock.next_deadline()
            if at is not None and self._rtick_at != at:
                self._rtick_at = at
                w.at(max(0, int(at - w.now)), self._rec_tick, rec, at)
        if rec.state is RecoveryState.DONE and not self.finishing:
            self.finishing = True
            w.at(w.sc.meta_delay, self._finish, rec)
        elif rec.state in (RecoveryState.ABORTED, RecoveryState.FENCED_OUT):
            w.count("recovery_" + rec.state.value)
            self.rec = None

    def _rec_tick(self, rec: RecoveryCore, at) -> None:
        if rec is not self.rec or self.rclock is None or self.rclock.core is not rec:
            return
        if self._rtick_at == at:
            self._rtick_at = None
        before, decided = rec.state, len(rec.recovered)
        if self.rclock.tick(self.w.now):
            self.w.count("recovery_speculations")
        self._after_rec_input(rec, before, decided)

    def _live_rec(self, req: "Request") -> RecoveryCore | None:
        rec = req.ctx["rec"]
        if req.src_inc != self.inc or rec is not self.rec:
            return None
        return rec

    def _after_rec_input(self, rec: RecoveryCore, before: RecoveryState, decided: int) -> None:
        """Records the transitions an input caused (``decided``: how many
        entries were recovered before it), then compares."""
        w = self.w
        if rec.stale_answers > self._stale_seen:  # OK answers below the floor (log matching)
            w.count("stale_answers", rec.stale_answers - self._stale_seen)
            self._stale_seen = rec.stale_answers
        # the steps the input took (StartReading, the decisions the frontier
        # took in entry order, Withdraw): stream/tracing.py, as the real client
        for action, *args in recovery_steps(rec, before, decided):
            w.step(action, self.name, *args)
            if args[-1:] == ["data_loss"]:
                w.count("recovery_data_loss_abort")
        self.pump_recovery()
        self.compare()

    def _on_lac(self, req: "Request", reply) -> None:
        rec = self._live_rec(req)
        if rec is None:
            return
        status, lac, lafr, _term, last = reply
        before, idx, bid = rec.state, req.ctx["index"], req.bid
        decided = len(rec.recovered)
        if before is RecoveryState.FENCING:
            if status is Status.INVALID_TERM:
                self.w.step("Rejected", self.name)
            elif status in (Status.OK, Status.NO_SUCH_LEDGER):
                self.w.step("ClientFenceAnswer", self.name, bid, lac, lafr)
        rec.on_lac_response(idx, status, lac, lafr, last)
        self._after_rec_input(rec, before, decided)

    def _on_lac_timeout(self, req: "Request") -> None:
        rec = self._live_rec(req)
        if rec is None:
            return
        before, decided = rec.state, len(rec.recovered)
        rec.on_lac_response(req.ctx["index"], None)
        self._after_rec_input(rec, before, decided)

    def _on_read(self, req: "Request", reply) -> None:
        rec = self._live_rec(req)
        if rec is None:
            return
        status, record, _term = reply
        n, idx, bid, before = req.body["entry"], req.ctx["index"], req.bid, rec.state
        if self.rclock is not None and self.rclock.core is rec:
            self.rclock.read_activity(self.w.now)
        decided = len(rec.recovered)
        if before is RecoveryState.READING:
            if status is Status.INVALID_TERM:
                if n in rec.outcomes:  # (an answer for an id outside the window is ignored)
                    self.w.step("Rejected", self.name)
            elif status is Status.OK or status in ABSENT_STATUSES:
                out = self.w.step("ClientReadAnswer", self.name, bid, n,
                                  value_of(record) if status is Status.OK else None)
                if n > rec.frontier and rec.wants(n, idx):
                    self.w.count("read_ahead_answers")  # an answer above the frontier, taken
                if out is not None and (out == "late") == rec.wants(n, idx):
                    raise SpecViolation("ClientReadAnswer", f"entry {n} from {bid}: the spec says {out}, "
                                                            f"the core {'takes' if rec.wants(n, idx) else 'ignores'} it")
        rec.on_read_response(n, idx, status, record if status is Status.OK else None)
        self._after_rec_input(rec, before, decided)

    def _on_read_timeout(self, req: "Request") -> None:
        rec = self._live_rec(req)
        if rec is None:
            return
        before, decided = rec.state, len(rec.recovered)
        if self.rclock is not None and self.rclock.core is rec:
            self.rclock.read_activity(self.w.now)
        rec.on_read_response(req.body["entry"], req.ctx["index"], None)
        self._after_rec_input(rec, before, decided)

    def _on_rec_add(self, req: "Request", results) -> None:
        rec = self._live_rec(req)
        if rec is None:
            return
        idx, bid = req.ctx["index"], req.bid
        for res in results:
            before, decided = rec.state, len(rec.recovered)
            live = rec.state not in REC_TERMINAL and rec.state is not RecoveryState.INIT
            mine = live and rec.ensemble[idx] == bid
            if res.status is Status.OK:
                counted = recovery_ack_counted(rec, idx, bid, res.entry_id, REC_TERMINAL)
                self.w.step("ClientAddAnswer", self.name, bid, res.entry_id, counted)
            elif mine and res.status is Status.INVALID_TERM:
                self.w.step("Rejected", self.name)
            elif mine and idx not in rec.replacing:
                self.w.step("DropAcks", self.name, {bid}, 0, False)
            rec.on_write_ack(res.entry_id, idx, res.status, bookie_id=bid)
            self._after_rec_input(rec, before, decided)

    def _on_rec_add_timeout(self, req: "Request") -> None:
        rec = self._live_rec(req)
        if rec is None:
            return
        idx, bid = req.ctx["index"], req.bid
        before, decided = rec.state, len(rec.recovered)
        if (rec.state in LIVE_RECOVERY and rec.ensemble[idx] == bid and idx not in rec.replacing):
            self.w.step("DropAcks", self.name, {bid}, 0, False)
        for eid in req.ctx["ids"]:
            rec.on_write_ack(eid, idx, None, bookie_id=bid)
        self._after_rec_input(rec, before, decided)

    def _replace(self, rec: RecoveryCore, rp) -> None:
        if rec is not self.rec or rec.state not in LIVE_RECOVERY or rp.bookie_index not in rec.replacing:
            return
        w = self.w
        used = set(rec.ensemble) | set(rec.read_ensemble)
        spare = [b for b in w.up_bookies() if b not in used]
        before, decided = rec.state, len(rec.recovered)
        if not spare:
            w.count("recovery_no_spare")
            rec.abort(f"no bookie to replace {rp.bookie_id}")
        else:
            nb = w.rng.choice(spare)
            if w.unbounded and not self._prepare(to_prepare(rec.ensemble, [nb], w.mutations), rec.start_entry, rec.term):
                rec.abort(f"replacement {nb} refused its preparation: a newer term")
                self._after_rec_input(rec, before, decided)
                return
            old = rec.ensemble[rp.bookie_index]
            ens = list(rec.ensemble)
            ens[rp.bookie_index] = nb
            w.step("EnsembleChange", self.name, rec.start_entry, tuple(ens), {old: nb})
            self.frags = with_fragment(self.frags, rec.start_entry, tuple(ens))
            rec.on_bookie_replaced(rp.bookie_index, nb)
            w.count("recovery_replacements")
        self._after_rec_input(rec, before, decided)

    def _finish(self, rec: RecoveryCore) -> None:
        """The recovery's final CAS: ``FinishTakeOver`` (OPEN at our term) or,
        classic, ``CloseRecovered`` (CLOSED at the last entry), each with the
        recovery's ensemble change; the verdict is stream/lifecycle.py's."""
        self.finishing = False
        if rec is not self.rec or rec.state is not RecoveryState.DONE:
            return
        w = self.w
        res = rec.result
        change = None if res.ensemble_change is None else Fragment(res.ensemble_change[0],
                                                                   tuple(res.ensemble_change[1]))
        self.rec = None
        if w.unbounded:
            ours = w.meta.term == self.term
            verdict, ver = w.metastore.judge(FinishTakeOver(LID, self.term, change, w.mutations))
            if isinstance(verdict, (Apply, Done)):
                if isinstance(verdict, Apply):
                    assert w.metastore.apply(verdict, ver)
                frags = w.meta.frags
                assert frags == self.frags or not ours, (frags, self.frags)
                w.step("Finish", self.name)
                if w.check_invariants:
                    w.inv.recovery_finished(self.term, res.next_entry - 1, frags[-1][1])
                w.compare_meta()
                w.count("recoveries_done")
                first, ens = frags[-1]
                self.frags = frags
                self.writer = WriterCore(7, self.term, w.sc.E, w.sc.Qw, w.sc.Qa, first, list(ens),
                                         next_entry=res.next_entry, guaranteed_write_quorum=True,
                                         max_pending=w.sc.window, fragment_max_entries=w.sc.roll_entries or None,
                                         mutations=w.mutations)
                self._start_writing()
            else:
                w.step("NoticeTakeover", self.name)
        else:
            verdict, ver = w.metastore.judge(CloseRecovered(LID, res.last_entry, change))
            if isinstance(verdict, Apply):
                assert w.metastore.apply(verdict, ver)
                w.count("recoveries_done")
            w.step("Finish", self.name)
            w.compare_meta()
        self.compare()

    # -- the writer ---------------------------------------------------------------------------------

    def add(self) -> int | None:
        """One add from the application (scripted tests call it directly)."""
        wr, w = self.writer, self.w
        if wr is None or self.phase != "open":
            return None
        self.seq += 1
        payload = f"{self.name}/t{self.term}/#{self.seq}".encode()
        try:
            eid = wr.add(payload)
        except WindowFull:
            w.count("window_full")
            self.seq -= 1
            return None
        self.adds_left -= 1
        self.payloads[eid] = payload
        w.sent.setdefault(self.term, []).append((eid, ("data", payload, self.term)))
        w.step("WriterAdd", self.name, eid, ("data", payload, self.term), w.sc.window)
        w.count("adds")
        self.pump_writer()
        return eid

    def pump_writer(self) -> None:
        wr, w = self.writer, self.w
        if wr is None:
            return
        prop = wr.proposal
        if prop is not None and prop is not self._proposal and prop.reason is ChangeReason.FAILURE:
            w.step("DropAcks", self.name, {prop.ensemble[i] for i in prop.replace}, prop.first_entry, True)
        r = wr.ready()
        for eid in r.acked:
            v = ("data", self.payloads[eid], self.term)
            if eid in w.acked and w.acked[eid] != v:
                from sim.invariants import InvariantViolation
                raise InvariantViolation("AckedUnique", f"entry {eid} acknowledged as {v}, earlier as {w.acked[eid]}")
            w.acked[eid] = v
            w.count("acked")
        for s in r.sends:
            for eid, record in zip(s.entry_ids, s.records):
                w.step("ClientSendAdd", self.name, s.bookie_id, eid, record)
            # the frame's timeout is the clock's (stream/timers.py), not the world's
            req = w.request(self.name, self.inc, s.bookie_id, "add", {"records": s.records},
                            {"writer": wr, "index": s.bookie_index, "ids": list(s.entry_ids)},
                            self._on_add, None, w.sc.timeout)
            self._frames[req.rid] = req
            self.clock.frame_sent(req.rid, s.bookie_index, s.bookie_id, w.now)
        if prop is not None and prop is not self._proposal:
            self._proposal = prop
            w.at(w.sc.meta_delay, self._publish_change, wr, prop)
        if self.clock is not None and self.clock.core is wr:
            self.clock.after_ready(r, w.now)
            at = self.clock.next_deadline()
            if at is not None and (self._tick_at is None or at < self._tick_at):
                self._tick_at = at
                w.at(max(0, at - w.now), self._clock_tick, wr, at)
        if wr.state in W_TERMINAL and wr.state is not WriterState.CLOSED:
            w.count("writer_" + wr.state.value)
            self.writer = None
        if r.acked and w.check_invariants:
            w.inv.acked_changed()

    def _clock_tick(self, wr: WriterCore, at: int) -> None:
        if wr is not self.writer or self.clock is None or self.clock.core is not wr:
            return
        if self._tick_at == at:
            self._tick_at = None
        w = self.w
        t = self.clock.tick(w.now)
        for rid, index, bid in t.timed_out:
            req = self._frames.pop(rid, None)
            if req is None or req.done:
                continue
            req.done = True  # given up: a late answer is dropped
            w.count("timeouts")
            if wr.state not in W_TERMINAL and wr.ensemble[index] == bid:
                w.count("writer_bookie_failed")
                wr.on_bookie_failed(index)
        if t.tell_lac is not None:
            lac, lafr = t.tell_lac
            for bid in wr.ensemble:
                w.step("ClientSendLac", self.name, bid, lac, lafr, wr.term)
                w.request(self.name, self.inc, bid, "wlac", {"lac": lac, "lafr": lafr, "term": wr.term},
                          {"writer": wr}, self._on_lac_written, None, w.sc.timeout)
        if t.retried:
            w.count("writer_retries")
        self.pump_writer()
        self.compare()

    def _live_writer(self, req: "Request") -> WriterCore | None:
        wr = req.ctx["writer"]
        if req.src_inc != self.inc or wr is not self.writer:
            return None
        return wr

    def _on_add(self, req: "Request", results) -> None:
        wr = self._live_writer(req)
        if wr is None:
            return
        idx, bid = req.ctx["index"], req.bid
        self._frames.pop(req.rid, None)
        if self.clock is not None and self.clock.core is wr:
            self.clock.frame_done(req.rid)
            self.clock.answered(bid)
        for res in results:
            live = wr.state not in W_TERMINAL
            mine = live and wr.ensemble[idx] == bid
            if res.status is Status.OK:
                counted = writer_ack_counted(wr, idx, bid, res.entry_id, W_TERMINAL)
                self.w.step("ClientAddAnswer", self.name, bid, res.entry_id, counted)
            elif mine and res.status in (Status.INVALID_TERM, Status.FENCED):
                self.w.step("Rejected", self.name)
            wr.on_ack(res.entry_id, idx, res.status, bookie_id=bid, term=res.term)
            self.pump_writer()
            self.compare()

    def _on_lac_written(self, req: "Request", reply) -> None:
        wr = self._live_writer(req)
        status, term = reply
        if wr is None or status is not Status.INVALID_TERM or wr.state in W_TERMINAL:
            return  # advisory: the next entry carries the LAC anyway
        self.w.step("Rejected", self.name)
        wr.on_invalid_term(term)
        self.pump_writer()
        self.compare()

    def _publish_change(self, wr: WriterCore, prop) -> None:
        if wr is not self.writer or wr.proposal is not prop or wr.state is not WriterState.CHANGING_ENSEMBLE:
            return
        w = self.w
        if writer_verdict(as_ledger_metadata(w.meta, w.unbounded), LID, self.term, w.mutations) is not None:
            w.step("NoticeTakeover", self.name)
            wr.on_ensemble_change_rejected(w.meta.term)
            self.pump_writer()
            self.compare()
            return
        if prop.reason is ChangeReason.FAILURE:
            spare = [b for b in w.up_bookies() if b not in prop.ensemble]
            n = len(prop.replace)
        else:
            spare = list(w.up_bookies())
            n = w.sc.E
        if len(spare) < n:
            w.count("writer_no_spare")
            self._deferrals = getattr(self, "_deferrals", 0) + 1
            if wr.ack_quorum_reachable and self._deferrals <= 3:
                # delayed ensemble change (stream/ledger_write.py): go on without the
                # failed bookies, retry them (and the change) later; a few
                # times only, so that a run with a bookie down for good ends
                w.count("writer_change_deferred")
                wr.on_change_deferred()
            else:
                w.step("Withdraw", self.name)
                wr.fail("not enough bookies for an ensemble change")
            self.pump_writer()
            self.compare()
            return
        picks = w.rng.sample(spare, n)
        new = list(prop.ensemble)
        for i, b in zip(prop.replace, picks):
            new[i] = b
        joining = to_prepare(prop.ensemble, new, w.mutations)
        if w.unbounded and not self._prepare(joining, prop.first_entry, wr.term):
            wr.on_invalid_term(w.meta.term)
            self.pump_writer()
            self.compare()
            return
        verdict, ver = w.metastore.judge(ChangeEnsemble(LID, self.term, Fragment(prop.first_entry, tuple(new)),
                                                        w.mutations))
        if not isinstance(verdict, Apply):  # (synchronous: still the writer's, as judged above)
            raise AssertionError(f"ensemble change judged {verdict} right after the writer's own check")
        assert w.metastore.apply(verdict, ver)
        frags = w.meta.frags
        if prop.reason is ChangeReason.FAILURE:
            w.step("EnsembleChange", self.name, prop.first_entry, tuple(new),
                   {prop.ensemble[i]: new[i] for i in prop.replace})
        else:
            w.step("RollFragment", self.name, prop.first_entry, tuple(new))
        w.count("ensemble_changes")
        self.frags = frags
        wr.on_ensemble_changed(prop.first_entry, new)
        self.clock.changed()
        w.compare_meta()
        self.pump_writer()
        self.compare()

    def _prepare(self, bookies: list[str], first: int, term: int) -> bool:
        """stream.ledger_write.prepare_bookies: each joining bookie raises its term
        and drops what it holds from `first` on (after a journal barrier);
        stream/lifecycle.py judges the answers.  False if one refused (a newer
        term).  Synchronous here, one bookie after another: the change that
        follows is one step of the glue."""
        w = self.w
        answers: list[int] = []
        for b in bookies:
            sb = w.bookies[b]
            w._fsync(b, sb.incarnation)
            v = sb.prepare(first, term)
            answers.append(prepare_answer(v.status is Status.OK,
                                          v.term if v.status is Status.INVALID_TERM else None))
            w.step("BookiePrepare", b, first, term, v.status is Status.OK)
            w.compare_bookie(b)
            if w.check_invariants:
                w.inv.bookie_changed(b)
            if prepare_verdict(answers) != PREPARED:
                return False
        return True

    def close(self) -> None:
        """Classic: the writer closes with no pending adds, CAS OPEN -> CLOSED."""
        wr, w = self.writer, self.w
        if wr is None or w.unbounded or not wr.close_allowed():
            return
        verdict, ver = w.metastore.judge(CloseAt(LID, wr.lac, w.mutations))
        if not isinstance(verdict, Apply):  # (Done too: a recoverer closed it at our LAC first)
            w.step("NoticeTakeover", self.name)
            wr.on_ensemble_change_rejected()
            self.writer = None
            self.compare()
            return
        last = wr.close()
        assert last == verdict.header.last_entry and w.metastore.apply(verdict, ver)
        w.step("WriterClose", self.name, last)
        w.count("writer_closed")
        self.writer = None
        w.compare_meta()
        self.compare()

    # -- crash ------------------------------------------------------------------------------------------

    def crash(self) -> None:
        """The client loses everything; a new incarnation starts idle."""
        self.w.count("client_crashes")
        self.w.step("Withdraw", self.name)
        self.inc += 1
        self.rec = self.writer = None
        self._proposal = None
        self.finishing = False
        self.compare()
        if not self.w.scripted:
            self.schedule_activity()


__all__ = ["SimClient"]
