"""The simulated world: a seeded RNG, a clock, an event queue, a network,
bookies (sim/bookie.py), the metadata store (sim/metadata.py), clients
(sim/clients.py) and readers.  Everything random comes from one
``random.Random(seed)``, and events are ordered by (time, sequence number),
so a seed replays a run exactly.

Network.  Every (sender incarnation, receiver, direction) pair is a stream,
FIFO like a gRPC stream: a message is delivered no earlier than the previous
one on its stream.  Streams to different bookies reorder freely.  Each
message is delayed (uniformly, sometimes very late) and may be lost
independently (a superset of losing a stream's tail); nothing is duplicated.
A bookie crash breaks its streams (messages in flight to or from it are
dropped); a client crash drops the answers to it (requests it already sent
may still arrive).  Scripted tests may also block (sender, receiver, kind)
links.

Faults: message delays, loss and reordering; partitions (a client's link to a
bookie is down for a while, in both directions); bookie crashes (the unsynced
journal tail and all memory lost; a restart replays the durable journal;
no disk is lost) and restarts; client crashes (a client loses everything and
may later take over again); duelling writers (clients take the ledger over
at random times, each with a new term).

Clients (sim/clients.py) drive WriterCore / RecoveryCore like stream/ledger.py
does, explicit LAC included.  After every step the touched parts of the
trace-checking model are compared with the real state (sim/spec.py), and the
invariants (sim/invariants.py) are checked on the real state.
"""
from __future__ import annotations

import heapq
import random
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from bookie import entry as E
from bookie.core import Status
from sim import invariants
from sim.bookie import SimBookie
from sim.clients import SimClient
from sim.reader import SimReader
from sim.metadata import OPEN, LedgerMeta, MetaStore
from sim.scenario import Scenario
from sim.spec import Model, SpecViolation, value_of
from stream.mutations import NONE as NO_MUTATIONS
from stream.mutations import Mutations
from stream.quorum import ABSENT_STATUSES

LID = 7


class Violation(AssertionError):
    """A failed invariant, trace check or core assertion, with the seed to replay."""

    def __init__(self, invariant: str, detail: str, world: "World"):
        self.invariant = invariant
        self.detail = detail
        self.scenario = world.sc
        self.time = world.now
        self.trace_tail = world.format_trace(last=40)
        self.replay = world.sc.replay_command() + "".join(f" --mutant {m}" for m in sorted(world.mutations.names))
        if world.model is None:
            self.replay += " --no-trace-check"
        if world.scripted:
            self.replay = "(a scripted scenario: sim/scripted.py)"
        super().__init__(
            f"{invariant}: {detail}\n  at t={world.now}, step {len(world.trace)}\n"
            f"  replay: {self.replay}\n  last steps:\n{self.trace_tail}")


@dataclass(slots=True)
class Request:
    rid: int
    kind: str               # "add" | "lac" | "read"
    src: str
    src_inc: int
    bid: str
    bid_inc: int
    body: dict
    ctx: dict = field(default_factory=dict)
    done: bool = False


class World:
    def __init__(self, sc: Scenario, *, check_trace: bool = True, check_invariants: bool = True,
                 scripted: bool = False, mutations: Mutations = NO_MUTATIONS):
        self.sc = sc
        self.mutations = mutations  # broken rules the cores run with (tests only: stream/mutations.py)
        self.rng = random.Random(sc.seed)
        self.now = 0
        self._q: list = []
        self._seq = 0
        self.scripted = scripted
        self.unbounded = sc.mode == "unbounded"
        self.check_trace = check_trace
        self.check_invariants = check_invariants
        self.trace: list[tuple] = []
        self.tracer = None  # sim/trace.py Tracer.attach(world)
        self.stats: dict[str, int] = {}
        self.bookie_ids = [f"b{i}" for i in range(sc.bookies)]
        self.bookies = {b: SimBookie(b, LID) for b in self.bookie_ids}
        ens = tuple(self.rng.sample(self.bookie_ids, sc.E)) if not scripted else tuple(self.bookie_ids[:sc.E])
        term = 1 if self.unbounded else 0
        self.metastore = MetaStore(LedgerMeta(OPEN, term, ((0, ens),), E=sc.E, Qw=sc.Qw, Qa=sc.Qa),
                                  unbounded=self.unbounded)
        self.client_ids = [f"c{i}" for i in range(sc.clients)]
        self.clients = {c: SimClient(self, c) for c in self.client_ids}
        self.readers = [SimReader(self, f"r{i}") for i in range(1)]
        self.model = (Model(bookies=self.bookie_ids, E=sc.E, Qw=sc.Qw, Qa=sc.Qa, unbounded=self.unbounded,
                            meta=self.metastore.meta, clients=self.client_ids, creator=self.client_ids[0])
                      if check_trace else None)
        self.acked: dict[int, tuple] = {}        # entry id -> value acknowledged to an application
        self.sent: dict[int, list] = {}          # writer term -> [(entry id, value)] it sent, in order
        self.read_values: dict[int, tuple] = {}  # entry id -> value a reader read
        self.blocked: set[tuple[str, str, str]] = set()   # scripted: (src, dst, kind) dropped
        self.cut: dict[tuple[str, str], int] = {}          # (client, bookie) -> partitioned until
        self._stream_last: dict[tuple, int] = {}
        self._fsync_due: set[str] = set()
        # The pending add window: reads waiting for a bookie's next journal
        # sync (the core's barrier over pending normal adds), and the adds and
        # explicit LACs that reached the bookie meanwhile (taken after them).
        self._waiting: dict[str, list] = {}
        self._deferred: dict[str, list] = {}
        self.hide_term: str | None = None   # (sim/trace.py: a barrier's stores)
        self._rid = 0
        self._values: dict[tuple[str, int], tuple] = {}
        self.inv = invariants.State(self)
        self.clients[self.client_ids[0]].become_creator(term, ((0, ens),))
        if not scripted:
            self._schedule_faults()
            for c in self.clients.values():
                c.schedule_activity()
            for r in self.readers:
                r.schedule_reads(sc.reads)

    # -- events -----------------------------------------------------------------------------

    def at(self, delay: int, fn: Callable, *args) -> None:
        assert delay >= 0
        self._seq += 1
        heapq.heappush(self._q, (self.now + delay, self._seq, fn, args))

    @contextmanager
    def checked(self):
        """Turns a failed check inside the block into a Violation (with the replay command)."""
        try:
            yield
        except Violation:
            raise
        except SpecViolation as e:
            raise Violation(e.invariant, e.reason, self) from e
        except invariants.InvariantViolation as e:
            raise Violation(e.invariant, e.detail, self) from e
        except AssertionError as e:  # a core's (or the harness's) own assertion
            raise Violation("assertion", f"{type(e).__name__}: {e}", self) from e

    def do(self, fn: Callable, *args):
        """Scripted tests: one client action, checked like an event."""
        with self.checked():
            out = fn(*args)
            if self.inv.dirty and self.check_invariants:
                self.inv.check_all()
            return out

    def run(self, until: int | None = None) -> "World":
        """Runs events (up to time ``until``); raises Violation."""
        limit = self.sc.max_steps
        with self.checked():
            while self._q:
                t = self._q[0][0]
                if until is not None and t > until:
                    break
                t, _, fn, args = heapq.heappop(self._q)
                self.now = t
                fn(*args)
                self.count("events")
                if self.inv.dirty and self.check_invariants:
                    self.inv.check_all()
                if self.stats["events"] > limit:
                    raise AssertionError(f"more than {limit} events: a run must end")
            if until is None:
                self.final_checks()
            else:
                self.now = max(self.now, until)
        return self

    def final_checks(self) -> None:
        for c in self.clients.values():
            wr = c.writer
            if c.phase == "open" and wr.pending and wr.failed and wr.proposal is None:
                # Every failed bookie still holds a needed ack (rule 3) and
                # nothing resends to it: the writer cannot make progress.
                self.count("writer_stuck")
        if self.check_invariants:
            self.inv.check_all(final=True)
        if self.model is not None:
            for b in self.bookie_ids:
                self.compare_bookie(b)
            for c in self.client_ids:
                self.clients[c].compare()
            self.compare_meta()
            if self.model.acked != self.acked:
                raise SpecViolation("acked", f"model {self.model.acked} != real {self.acked}")

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    # -- trace --------------------------------------------------------------------------------

    def step(self, action: str, *args, **kw):
        """Records an implementation step as a spec action and checks it."""
        self.trace.append((self.now, action, args, kw))
        out = getattr(self.model, action)(*args, **kw) if self.model is not None else None
        if self.tracer is not None:  # NDJSON export for TLC (sim/trace.py)
            self.tracer.record(action, args, kw)
        return out

    def format_trace(self, last: int | None = None) -> str:
        rows = self.trace if last is None else self.trace[-last:]
        out = []
        for t, action, args, kw in rows:
            parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kw.items()]
            out.append(f"    {t:6d}  {action}({', '.join(parts)})")
        return "\n".join(out)

    # -- real state -> spec variables -----------------------------------------------------------

    @property
    def meta(self):
        return self.metastore.meta

    def value_at(self, b: str, loc: int) -> tuple:
        key = (b, loc)
        v = self._values.get(key)
        if v is None:
            v = self._values[key] = value_of(self.bookies[b].record_at(loc))
        return v

    def bookie_state(self, b: str) -> tuple:
        """bk[b] from the real bookie: (term, fenced, ents, lac, lafr)."""
        sb = self.bookies[b]
        st = sb.core.ledgers.get(LID)
        if st is None:
            return (0, False, {}, -1, -1)
        ents = {eid: self.value_at(b, loc) for eid, loc, _ in st.index.iter_all()}
        return (st.term, st.fenced, ents, st.lac, st.lafr)

    def compare_bookie(self, b: str) -> None:
        if self.model is None:
            return
        real, model = self.bookie_state(b), self.model.bk[b].snapshot()
        if real != model:
            names = ("term", "fenced", "ents", "lac", "lafr")
            diff = {n: (m, r) for n, m, r in zip(names, model, real) if m != r}
            raise SpecViolation("state", f"bookie {b}: spec != implementation: {diff}")
        if (b in self.model.crashed) == self.bookies[b].up:
            raise SpecViolation("state", f"bookie {b}: crashed mismatch")

    def compare_meta(self) -> None:
        self.inv.dirty = True
        if self.model is not None and self.model.meta != self.meta:
            raise SpecViolation("state", f"metadata: spec {self.model.meta} != implementation {self.meta}")

    # -- network ----------------------------------------------------------------------------------

    def _delay(self) -> int:
        sc = self.sc
        if self.chance(sc.p_slow):
            return self.rng.randint(sc.delay_max, sc.slow_max)
        return self.rng.randint(sc.delay_min, sc.delay_max)

    def _transmit(self, key: tuple, fn: Callable, *args) -> None:
        t = max(self.now + self._delay(), self._stream_last.get(key, 0))
        self._stream_last[key] = t
        self.at(t - self.now, fn, *args)

    def request(self, src: str, src_inc: int, bid: str, kind: str, body: dict, ctx: dict,
                on_reply: Callable, on_timeout: Callable | None, timeout: int) -> Request:
        self._rid += 1
        b = self.bookies[bid]
        req = Request(self._rid, kind, src, src_inc, bid, b.incarnation, body, ctx)
        req.ctx["on_reply"], req.ctx["on_timeout"] = on_reply, on_timeout
        self.count(f"msg_{kind}")
        if (src, bid, kind) in self.blocked or self._partitioned(src, bid) or self.chance(self.sc.p_loss):
            self.count("msg_lost")
        else:
            self._transmit((src, src_inc, bid, "req"), self._deliver_request, req)
        if on_timeout is not None:
            self.at(timeout, self._timeout, req)
        return req

    def _partitioned(self, client: str, bid: str) -> bool:
        until = self.cut.get((client, bid))
        return until is not None and self.now < until

    def _timeout(self, req: Request) -> None:
        if not req.done:
            req.done = True
            self.count("timeouts")
            req.ctx["on_timeout"](req)

    def _reply(self, req: Request, reply) -> None:
        if ((req.bid, req.src, req.kind) in self.blocked or self._partitioned(req.src, req.bid)
                or self.chance(self.sc.p_loss)):
            self.count("msg_lost")
            return
        self._transmit((req.src, req.src_inc, req.bid, "rep"), self._deliver_reply, req, reply,
                       self.bookies[req.bid].incarnation)

    def _deliver_reply(self, req: Request, reply, bid_inc: int) -> None:
        if self.bookies[req.bid].incarnation != bid_inc or req.done or self._partitioned(req.src, req.bid):
            return  # the stream broke (bookie crash, partition), or the client gave up on it
        req.done = True
        req.ctx["on_reply"](req, reply)

    # -- bookies ------------------------------------------------------------------------------------

    def _deliver_request(self, req: Request) -> None:
        b = self.bookies[req.bid]
        if not b.up or b.incarnation != req.bid_inc or self._partitioned(req.src, req.bid):
            return  # the stream broke
        body = req.body
        if self._waiting.get(req.bid) and not (req.kind in ("lac", "read") and (body["term"] or body["fence"])):
            # A read waits for this bookie's journal sync: what else reaches
            # the bookie meanwhile is taken after it (a network delay), so no
            # step of it meets the state change the read made in memory
            # before the read's own step.
            self._deferred.setdefault(req.bid, []).append(req)
            return
        if req.kind == "add":
            records = body["records"]
            admitted = b.add_frame(records, lambda results: self._reply(req, results))
            for rec, ok in zip(records, admitted):
                self.step("BookieAdmit", req.bid, E.parse_header(rec), ok)
            if any(admitted) and req.bid not in self._fsync_due:
                self._fsync_due.add(req.bid)
                self.at(self.rng.randint(self.sc.fsync_min, self.sc.fsync_max), self._fsync, req.bid, b.incarnation)
            self.compare_bookie(req.bid)
            return
        if req.kind == "wlac":
            exists = LID in b.core.ledgers
            v = b.write_lac(body["lac"], body["lafr"], body["term"], lambda results: self._reply(req, (Status.OK, 0)))
            self.step("BookieWriteLac", req.bid, body["term"], exists, v.status is Status.OK)
            if v.status is Status.OK:
                if req.bid not in self._fsync_due:
                    self._fsync_due.add(req.bid)
                    self.at(self.rng.randint(self.sc.fsync_min, self.sc.fsync_max), self._fsync, req.bid,
                            b.incarnation)
            else:
                self._reply(req, (v.status, v.term))
            return
        term, fence = body["term"], body["fence"]
        n = body.get("entry")
        if term or fence:  # a fencing/recovery read: Storage.fence, then the answer
            v, barrier = b.fence_request(term, fence)
            if (barrier is not None and LID in b.core.pending) or (self._waiting.get(req.bid)
                                                                    and v.status is not Status.OK):
                # The pending add window: normal adds admitted before this
                # read are not durable yet.  The read waits for the journal's
                # next sync (already due: the adds scheduled it), as
                # bookie/storage.py's does; a refusal meanwhile is answered
                # after it too, in arrival order.
                self._waiting.setdefault(req.bid, []).append((req, v, barrier))
                self.count("reads_waiting_for_adds")
                return
            if barrier is not None:  # (nothing normal pending: the journal syncs at once)
                self._waiting.setdefault(req.bid, []).append((req, v, barrier))
                self._fsync(req.bid, b.incarnation)
                return
            self._read_step(req, v)
            self._read_reply(req, v, barrier)
            return
        # a plain read: no spec action
        self.trace.append((self.now, "ReadLac" if req.kind == "lac" else "ReadEntry", (req.bid, n), {}))
        self._answer(req, spec_read=False)

    def _read_step(self, req: Request, v) -> None:
        body = req.body
        self.step("BookieRead", req.bid, body["term"], body["fence"], v.status.name, body.get("entry"))

    def _read_reply(self, req: Request, v, barrier) -> None:
        """A term-carrying/fencing read's answer, once its barrier was met
        (the stores that barrier made durable were stepped before it)."""
        if barrier == "state":
            self.bookies[req.bid].journal_state()
        if v.status is not Status.OK:
            self._reply(req, (v.status, -1, -1, v.term, -1) if req.kind == "lac" else (v.status, None, v.term))
            self.compare_bookie(req.bid)
            return
        self._answer(req)

    def _answer(self, req: Request, *, spec_read: bool = True) -> None:
        """The bookie's answer to a read; a fencing/recovery read's (``spec_read``)
        is checked against the model and told to it (a client takes only
        answers a bookie gave: sim/spec.py ``answered``)."""
        b, n, t = self.bookies[req.bid], req.body.get("entry"), 0
        if req.kind == "lac":
            status, lac, lafr, t, last = b.lac_answer()
            if status is Status.OK and self.model is not None:
                self.model.check_answer(req.bid, None, (lac, lafr))
            if spec_read and status in (Status.OK, Status.NO_SUCH_LEDGER) and self.model is not None:
                self.model.answered(req.bid, None, req.body["term"], (lac, lafr))
            self._reply(req, (status, lac, lafr, t, last))
        else:
            status, rec = b.entry_answer(n)
            value = value_of(rec) if rec is not None else None
            if status in (Status.OK, Status.NO_SUCH_ENTRY) and self.model is not None:
                self.model.check_answer(req.bid, n, value)
            if spec_read and (status is Status.OK or status in ABSENT_STATUSES) and self.model is not None:
                self.model.answered(req.bid, n, req.body["term"], value)
            self._reply(req, (status, rec, t))
        self.compare_bookie(req.bid)
        if self.check_invariants:
            self.inv.bookie_changed(req.bid)

    def _fsync(self, bid: str, inc: int) -> None:
        b = self.bookies[bid]
        if inc != b.incarnation or not b.up:
            return
        self._fsync_due.discard(bid)
        waiting = self._waiting.pop(bid, [])
        if b.unsynced:
            # The stores go first: the reads that waited answer after them.
            # (Their snapshots show the term those reads already raised in
            # memory: the trace hides it, and the spec is compared after the
            # reads' steps.)
            self.hide_term = bid if waiting else None
            self._apply_synced(bid, compare=not waiting)
            self.hide_term = None
        for req, v, _ in waiting:
            self._read_step(req, v)
        for req, v, barrier in waiting:
            self._read_reply(req, v, barrier)
        for req in self._deferred.pop(bid, []):
            self._deliver_request(req)

    def _apply_synced(self, bid: str, compare: bool = True) -> None:
        b = self.bookies[bid]
        truncated = b.truncated
        applied = b.fsync()
        if b.truncated > truncated:
            self.count("entries_truncated", b.truncated - truncated)
        for rec, h in applied:
            if h is None:
                self.step("BookieStoreLac", bid, *rec)
            else:
                self.step("BookieStore", bid, rec)
        self.count("fsyncs")
        if compare:
            self.compare_bookie(bid)
        if self.check_invariants:
            self.inv.bookie_changed(bid)

    # -- faults -------------------------------------------------------------------------------------

    def _schedule_faults(self) -> None:
        sc = self.sc
        for _ in range(sc.crashes):
            self.at(self.rng.randint(1, sc.horizon), self._crash_some_bookie)
        for _ in range(sc.client_crashes):
            self.at(self.rng.randint(1, sc.horizon), self._crash_some_client)
        for _ in range(sc.partitions):
            self.at(self.rng.randint(1, sc.horizon), self._partition_some_link)

    def _crash_some_bookie(self) -> None:
        up = [b for b in self.bookie_ids if self.bookies[b].up]
        down = len(self.bookie_ids) - len(up)
        if down >= self.sc.max_down or not up:
            return
        self.crash_bookie(self.rng.choice(up))

    def crash_bookie(self, bid: str, restart_after: int | None = None) -> None:
        b = self.bookies[bid]
        lost = b.crash()
        self._fsync_due.discard(bid)
        self._waiting.pop(bid, None)  # (their streams broke)
        self._deferred.pop(bid, None)
        self.count("bookie_crashes")
        self.count("adds_lost_in_crash", lost)
        st = b.core.ledgers.get(LID)
        self.step("BookieCrash", bid, st.term if st else 0, st.fenced if st else False)
        self.compare_bookie(bid)
        if self.check_invariants:
            self.inv.bookie_changed(bid)
        if restart_after is None and not self.scripted:
            restart_after = self.rng.randint(self.sc.restart_min, self.sc.restart_max)
        if restart_after is not None:
            self.at(restart_after, self.restart_bookie, bid)

    def restart_bookie(self, bid: str) -> None:
        if self.bookies[bid].up:
            return
        self.bookies[bid].restart()
        self.count("bookie_restarts")
        self.step("BookieRestart", bid)
        self.compare_bookie(bid)

    def _partition_some_link(self) -> None:
        """A client loses its link to a bookie for a while (both directions;
        the link's streams break: what was in flight on it is lost)."""
        c, b = self.rng.choice(self.client_ids), self.rng.choice(self.bookie_ids)
        self.cut[(c, b)] = self.now + self.rng.randint(self.sc.partition_min, self.sc.partition_max)
        self.count("partitions")

    def _crash_some_client(self) -> None:
        alive = [c for c in self.clients.values() if c.phase != "idle"]
        if alive:
            self.rng.choice(alive).crash()

    def up_bookies(self) -> list[str]:
        return [b for b in self.bookie_ids if self.bookies[b].up]

    def committed_bound(self) -> int:
        return self.inv.committed_bound()


def _short(v) -> str:
    if isinstance(v, (bytes, bytearray)):
        try:
            h = E.parse_header(v)
            e = E.decode(v, check=False)
            flags = ("N" if h.is_noop else "") + ("T" if h.is_truncate else "") + ("R" if h.is_recovery else "")
            return f"<e{h.entry_id} t{h.term} lac{h.lac} lafr{h.lafr} {flags}{e.payload.decode(errors='replace')!r}>"
        except Exception:
            return repr(bytes(v[:16]))
    if isinstance(v, E.EntryHeader):
        return f"<e{v.entry_id} t{v.term}{' R' if v.is_recovery else ''}>"
    if isinstance(v, tuple) and v and v[0] == "data":
        return v[1].decode(errors="replace")
    if isinstance(v, tuple) and v and v[0] == "noop":
        return f"noop/t{v[-1]}"
    return repr(v)
