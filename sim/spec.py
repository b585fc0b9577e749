"""A Python transcription of tla/BookstreamLedger.tla's actions, for trace
checking: every implementation step of a simulated run is mapped onto a spec
action, whose enabling condition is checked on this model's state and whose
effect is applied to it; the world then compares the parts of the model the
step touched with the real state mapped to the spec's variables.  TLC's own
behaviours of the spec are replayed through it by sim/spec_tlc.py (a rule
here that the spec lacks would refuse one).

Mapping (spec variable <-> implementation state):

===================== ========================================================
spec                  implementation (sim/)
===================== ========================================================
bk[b].term            BookieCore.ledgers[L].term (in memory: raised at admit)
bk[b].fenced          BookieCore.ledgers[L].fenced
bk[b].ents[n]         value of the applied (durable) record at index n
bk[b].lac, .lafr      BookieCore.ledgers[L].lac / .lafr
crashed               SimBookie.up = False
meta                  MetaStore.meta: state, term, frags, last
cl[c].phase           idle | RecoveryCore.state FENCING/READING/FINISHING |
                      open (WriterCore not terminal)
cl[c].term, .frags    core.term; the client's fragment list (local changes
                      of a recovery included)
cl[c].lac, .lafr      WriterCore.lac/.lafr; RecoveryCore.lac_seen/.lafr_seen
                      (frozen once covered)
cl[c].lap             WriterCore.next_entry - 1
cl[c].val, .ack       WriterCore.pending (payloads, acks) /
                      RecoveryCore.writes (records, acked); indexes -> bookies
cl[c].rens            RecoveryCore.read_ensemble (model: rfrags, the fragments
                      at take-over; reads go to the write set in the last)
cl[c].fenced          RecoveryCore.coverage.responders
cl[c].next            RecoveryCore.frontier (READING) / .end_entry
cl[c].nosuch          the NoSuchEntry answers of the window's entries:
  (model: .ahead)     RecoveryCore.outcomes, id -> the value (RECOVERABLE)
                      or the bookies that answered NoSuchEntry (a stale OK
                      among them)
cl[c].floor           RecoveryCore.floor: the highest origin term decided
acked                 entries in WriterCore Ready.acked, with their payloads
===================== ========================================================

Values: ("data", payload, origin) for an add (payloads are unique per add,
a refinement of the spec's Data(t)); ("noop", origin) for a no-op, NoOp(t).
The origin is the record's origin term (the term of whoever created the
entry; a write-back copies it), so a copy has the value of the original.
Log matching (issue 12): RecoveryDecide raises cl[c].floor to the origin of
what it decides; an OK answer whose origin is below the floor counts as
NoSuchEntry (ClientReadAnswer), and a value held above next is judged again
when the floor rises (RecoveryDecide: the stale value becomes a
NoSuchEntry of the bookie that gave it, and the rest of the write set may
be asked again: a bookie asked twice answers once, the second is late).

Granularity (where the implementation is finer than the spec):

- Deliver(c, b, n, seen) is split into ClientSendAdd (the client's guard,
  with the client's state when it sent: a delayed request is the spec's
  delivery later), BookieAdmit (the bookie's guard; raises the term),
  BookieStore (the effect, at fsync) and ClientAddAnswer (AckFrom, or a lost
  ack when the core ignores it).  The guard is checked at admission, the
  effect applied at the store: between the two no step observes the entry
  (a fencing/recovery read waits for a journal barrier while normal adds are
  pending, or when it changes the term; a pending recovery add is only
  unseen by its own recovery's reads, which read other entries).
- FenceRead and RecoveryRead are split into the client's send, the
  bookie's handling (AfterRead, the answer) and the client's handling.
  RecoveryRead's client side is split again, for read-ahead:
  ClientReadAnswer records an answer for any entry of the window (next and
  above, up to a known end), in any order; RecoveryDecide takes the
  decision at next, in entry order, from the answers recorded for it (one
  value: recovered; Coverage NoSuchEntry: absent).  An answer above next
  decides nothing until next reaches it, except that an absent entry X is a
  known end: the answers above X are dropped, and later ones ignored.
  That the spec's RecoveryRead reads entry next at the moment it decides is
  what read-ahead relaxes; stream/recovery_core.py's docstring says why an
  earlier answer equals the one a read at the decision would get.
- What the spec's coarse steps tie together, the split steps check
  (session 10, found by tla/differential.py): a client takes only an
  answer a bookie gave to a read of its term (``answered``, told by the
  simulated bookie as it answers), a bookie stores only a request sent to
  it, and an ack is for a record the bookie stored.
- EnsembleChange's preparation of the new bookie (raise its term, delete its
  entries from the fragment's first entry) is a bookie step of its own
  (BookiePrepare), just before the client's EnsembleChange step.
- Extension actions (not in the spec; each only delays or withdraws):
  BookieRestart (a crashed bookie answers again; the term raised by adds
  that were admitted but never durable is forgotten), Withdraw (a client
  gives up: abort, failure, crash), DropAcks (a writer's proposal or a
  recovery's failed write forgets a failed bookie's acks early),
  ReadEntry/ReadLac (plain reads: no effect), and the writer's explicit
  LAC once its adds go quiet (ClientSendLac: its own LAC and LAFR, to its
  ensemble; BookieWriteLac: admitted like an add, without raising the term;
  BookieStoreLac: LAC/LAFR go up once durable).
- Where the implementation is known to differ from the spec as written
  (``DEVIATIONS``), the transcription follows the implementation and the
  difference is listed there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bookie import entry as E
from sim.metadata import CLOSED, IN_RECOVERY, OPEN, frag_of, with_fragment
from stream.quorum import write_quorums, write_set

def noop(origin: int) -> tuple:
    return ("noop", origin)


def is_noop(v) -> bool:
    return isinstance(v, tuple) and bool(v) and v[0] == "noop"


def origin_of(v: tuple) -> int:
    return v[-1]

# Where this transcription follows the implementation rather than the spec text.
DEVIATIONS = {
    "change_first": "EnsembleChange: a writer's new fragment starts at LAFR+1 as of its proposal (spec: at "
                    "the change); entries that reached Qw in between have write sets without the "
                    "replaced bookies (checked), so their write sets do not change",
    "multi_replace": "EnsembleChange replaces several bookies in one step",
    "data_loss_abort": "a recovery that finds an entry <= its frozen LAC absent aborts (Withdraw) "
                       "instead of ending there",
    "read_ahead": "RecoveryRead reads entry next at the moment it decides it; the implementation reads "
                  "ahead (answers for ids above next recorded in any order, decisions in order: "
                  "ClientReadAnswer / RecoveryDecide; why an earlier answer is as good: "
                  "stream/recovery_core.py)",
    "crash_term": "BookieCrash: bk[b].term here is the in-memory term, raised when an add is admitted; "
                  "a crash forgets a raise no durable step carried, so the term goes down (against the "
                  "spec's Monotonic).  The spec raises a term only at a durable step (a store; a fencing "
                  "or recovery read fsyncs the term before it answers), and TLC's mapping "
                  "(tla/BookstreamTrace.tla: the term compared at stores and crashes only) is the "
                  "durable term, which never goes down; the forgotten raise was seen only by the "
                  "refusals it gave (InvalidTerm to an older writer, which then withdrew)",
}


def value_of(record: bytes) -> tuple:
    h = E.parse_header(record)
    if h.is_noop:
        return noop(h.origin)
    return ("data", E.payload(record, h), h.origin)


def _sent_key(record: bytes) -> tuple:
    """A request as a store sees it: the record's header and value."""
    h = E.parse_header(record)
    return (h.term, h.lac, h.lafr, h.is_noop, h.is_truncate, h.is_recovery, value_of(record))


class SpecViolation(AssertionError):
    """A step the spec does not allow (guard) or whose effect differs."""

    def __init__(self, action: str, reason: str):
        super().__init__(f"trace check: {action}: {reason}")
        self.action = action
        self.reason = reason
        self.invariant = f"trace:{action}"


@dataclass
class MBookie:
    term: int = 0
    fenced: bool = False
    ents: dict = field(default_factory=dict)
    lac: int = -1
    lafr: int = -1
    read_term: int = 0   # the highest term a fencing/recovery read brought (not in snapshot)
    prepared: tuple = ()  # (first, term) of its last accepted BookiePrepare (not in snapshot)

    def snapshot(self) -> tuple:
        return (self.term, self.fenced, dict(self.ents), self.lac, self.lafr)


@dataclass
class MClient:
    phase: str = "idle"
    term: int = 0
    frags: tuple = ()
    rfrags: tuple = ()      # the fragments recovery reads (frags at take-over)
    lac: int = -1
    lafr: int = -1
    lap: int = -1
    val: dict = field(default_factory=dict)
    ack: dict = field(default_factory=dict)
    fenced: set = field(default_factory=set)
    next: int = 0
    ahead: dict = field(default_factory=dict)  # read-ahead answers: id -> value | NoSuchEntry bookies
    okfrom: dict = field(default_factory=dict)  # id -> (bookie that gave ahead's value, NoSuchEntry before it)
    floor: int = 0                              # the highest origin term decided (log matching)
    start: int = -1
    proposed: int | None = None  # a writer's ensemble change: its first entry, fixed at the proposal


class Model:
    def __init__(self, *, bookies, E: int, Qw: int, Qa: int, unbounded: bool, meta, clients, creator):
        self.E, self.Qw, self.Qa, self.unbounded = E, Qw, Qa, unbounded
        self.coverage = Qw - Qa + 1
        self.bk = {b: MBookie() for b in bookies}
        self.crashed: set[str] = set()
        self.meta = meta
        self.cl = {c: MClient() for c in clients}
        w = self.cl[creator]
        w.phase, w.term, w.frags, w.rfrags = "open", meta.term, meta.frags, meta.frags
        self.acked: dict[int, tuple] = {}
        self.deviations: dict[str, int] = {}  # steps where DEVIATIONS made a difference
        # (bookie, entry or None for the LAC) -> [(read's term, answer)]: what the
        # bookies answered to fencing and recovery reads (a client takes only those)
        self.answers: dict[tuple[str, int | None], list] = {}
        # (bookie, entry) -> the records sent there (a store stores one of them:
        # the spec's Deliver, or a late request's StoreLate) and the
        # (term, value) it stored (an ack is for one of those)
        self.sent: dict[tuple[str, int], set] = {}
        self.stored: dict[tuple[str, int], list] = {}

    # -- helpers ---------------------------------------------------------------------

    def _need(self, ok: bool, action: str, why: str) -> None:
        if not ok:
            raise SpecViolation(action, why)

    def write_set(self, n: int, frags) -> tuple[str, ...]:
        ens = frag_of(frags, n)[1]
        return tuple(ens[i] for i in write_set(n, self.E, self.Qw))

    def released(self, w: MClient) -> int:
        return w.lafr if self.unbounded else w.lac

    @staticmethod
    def advance(frm: int, ack: dict, q: int) -> int:
        m = frm
        while len(ack.get(m + 1, ())) >= q:
            m += 1
        return m

    def covered(self, w: MClient) -> bool:
        ens = w.rfrags[-1][1]
        return all(sum(1 for i in q if ens[i] in w.fenced) >= self.coverage
                   for q in write_quorums(self.E, self.Qw))

    def targets(self, w: MClient, n: int) -> tuple[str, ...]:
        """Where c writes entry n: its write set; the recovery's final no-op
        goes to every bookie of the ensemble (E may exceed Qw: the spec's
        Targets, tla/BookstreamBase.tla, since stripe9)."""
        if self.unbounded and w.phase == "finishing" and n == w.next:
            return tuple(w.frags[-1][1])
        return self.write_set(n, w.frags)

    def truncate_flag(self, w: MClient, n: int) -> bool:
        return self.unbounded and is_noop(w.val.get(n)) and w.phase == "finishing" and n == w.next

    # -- take-over, metadata ----------------------------------------------------------

    def StartTakeover(self, c: str, t: int) -> None:
        a, w, m = "StartTakeover", self.cl[c], self.meta
        self._need(w.phase == "idle", a, f"{c} is {w.phase}")
        self._need(m.state != CLOSED, a, "ledger CLOSED")
        self._need(t == (m.term + 1 if self.unbounded else m.term), a, f"term {t}, metadata at {m.term}")
        self.meta = m.with_(state=IN_RECOVERY, term=t)
        self.cl[c] = MClient(phase="fencing", term=t, frags=m.frags, rfrags=m.frags)

    def NoticeTakeover(self, c: str) -> None:
        a, w = "NoticeTakeover", self.cl[c]
        if self.unbounded:
            self._need(w.phase != "idle" and self.meta.term > w.term, a,
                       f"{c} ({w.phase}, term {w.term}) withdrew, metadata term {self.meta.term}")
        else:
            self._need(w.phase == "open" and self.meta.state != OPEN, a, f"{c} {w.phase}, meta {self.meta.state}")
        self.cl[c] = MClient()

    def Withdraw(self, c: str) -> None:
        self.cl[c] = MClient()

    def Finish(self, c: str) -> None:
        a, w, m = "Finish", self.cl[c], self.meta
        self._need(w.phase == "finishing", a, f"{c} is {w.phase}")
        for n, v in w.val.items():
            need = len(w.frags[-1][1]) if (self.unbounded and n == w.next) else self.Qw
            self._need(len(w.ack.get(n, ())) >= need, a,
                       f"entry {n} ({'no-op' if is_noop(v) else 'data'}) acked by {sorted(w.ack.get(n, ()))}, "
                       f"needs {need}")
        if self.unbounded:
            self._need(m.term == w.term and m.state == IN_RECOVERY, a, f"metadata {m.state} term {m.term}")
            self.meta = m.with_(state=OPEN, frags=w.frags)
            self.cl[c] = MClient(phase="open", term=w.term, frags=w.frags, rfrags=w.frags,
                                 lac=w.next, lafr=w.next, lap=w.next)
        else:
            self._need(m.state in (IN_RECOVERY, CLOSED), a, f"metadata {m.state}")
            if m.state == IN_RECOVERY:
                self.meta = m.with_(state=CLOSED, last=w.next - 1, frags=w.frags)
            self.cl[c] = MClient()

    def WriterClose(self, c: str, last: int) -> None:
        a, w, m = "WriterClose", self.cl[c], self.meta
        self._need(not self.unbounded and w.phase == "open" and w.lap == w.lac, a, f"{c} lap {w.lap} lac {w.lac}")
        self._need(m.state == OPEN and last == w.lac, a, f"metadata {m.state}, last {last}")
        self.meta = m.with_(state=CLOSED, last=w.lac)
        self.cl[c] = MClient()

    # -- writer -------------------------------------------------------------------------

    def WriterAdd(self, c: str, n: int, v: tuple, limit: int) -> None:
        a, w = "WriterAdd", self.cl[c]
        self._need(w.phase == "open", a, f"{c} is {w.phase}")
        self._need(n == w.lap + 1, a, f"entry {n}, lap {w.lap}")
        self._need(w.lap - self.released(w) < limit, a, "window full")
        w.val[n] = v
        w.ack[n] = set()
        w.lap = n

    def DropAcks(self, c: str, bs: set, first: int, writer: bool) -> None:
        """Extension: a writer's ensemble-change proposal, or a recovery's
        failed write-back, forgets the failed bookies' acks."""
        a, w = "DropAcks", self.cl[c]
        self._need(w.phase in ("open", "reading", "finishing"), a, f"{c} is {w.phase}")
        if writer:
            self._need(first == max(self.released(w) + 1, w.frags[-1][0]), a,
                       f"change from {first}, released {self.released(w)}")
            for b in bs:
                self._need(b in w.frags[-1][1], a, f"{b} not in the last fragment")
                # Rule 3: b is not replaced while it acked a committed entry
                # (LAFR+1..LAC) that is still below Qw.
                for i in range(w.lafr + 1, w.lac + 1):
                    if self.unbounded and b in w.ack.get(i, ()) and len(w.ack[i]) < self.Qw:
                        raise SpecViolation(a, f"rule 3: {b} acked committed entry {i} below Qw")
            w.proposed = first
        for n in w.ack:
            if n >= first:
                w.ack[n] -= set(bs)

    def EnsembleChange(self, c: str, first: int, ens: tuple, replaced: dict) -> None:
        a, w, m = "EnsembleChange", self.cl[c], self.meta
        last = w.frags[-1]
        for b, nb in replaced.items():
            self._need(b in last[1], a, f"{b} not in the last fragment {last}")
            self._need(nb not in last[1] and nb not in self.crashed, a, f"replacement {nb} in {last} or crashed")
        self._need(tuple(replaced.get(b, b) for b in last[1]) == tuple(ens), a, f"ensemble {ens} from {last}")
        frags2 = with_fragment(w.frags, first, ens)
        self._joined(a, w, first, set(ens) - set(last[1]))
        if w.phase == "open":
            self._need(first == w.proposed, a, f"first {first}, proposed {w.proposed}")
            if self.unbounded:  # DEVIATIONS["change_first"]
                if first <= self.released(w):
                    self.deviations["change_first"] = self.deviations.get("change_first", 0) + 1
                for i in range(first, self.released(w) + 1):
                    ws = self.write_set(i, w.frags)
                    self._need(not set(replaced) & set(ws), a, f"released entry {i} (write set {ws}) "
                                                               f"moves to a new fragment without its copies")
            w.proposed = None
            self._need(m.state == OPEN and m.term == w.term, a, f"metadata {m.state} term {m.term}")
            self.meta = m.with_(frags=frags2)
        else:
            self._need(w.phase in ("reading", "finishing"), a, f"{c} is {w.phase}")
            self._need(first == w.start, a, f"recovery change from {first}, read from {w.start}")
            for nb in replaced.values():
                self._need(nb not in w.rfrags[-1][1], a, f"{nb} in the read ensemble")
        for n in w.ack:
            if n >= first:
                w.ack[n] -= set(replaced)
        w.frags = frags2

    def RollFragment(self, c: str, first: int, ens: tuple) -> None:
        a, w, m = "RollFragment", self.cl[c], self.meta
        self._need(w.phase == "open" and first == self.released(w) + 1, a, f"first {first}")
        self._need(all(not w.ack.get(n) for n in w.val), a, "sent entries not released")
        self._need(m.state == OPEN and m.term == w.term, a, f"metadata {m.state} term {m.term}")
        self._joined(a, w, first, set(ens) - set(w.frags[-1][1]))
        w.frags = with_fragment(w.frags, first, ens)
        self.meta = m.with_(frags=w.frags)

    def _joined(self, a: str, w: MClient, first: int, joining: set) -> None:
        """The spec's EnsembleChange (and the finer spec's RollFragment) prepares
        each joining bookie: here its BookiePrepare at (first, the client's term)
        must have preceded the change."""
        if self.unbounded:
            for nb in sorted(joining):
                self._need(self.bk[nb].prepared == (first, w.term), a, f"{nb} joins from {first} at term "
                                                                      f"{w.term} unprepared ({self.bk[nb].prepared})")

    # -- adds ------------------------------------------------------------------------------

    def ClientSendAdd(self, c: str, b: str, n: int, record: bytes, resend: bool = False) -> None:
        a, w = "ClientSendAdd", self.cl[c]
        h = E.parse_header(record)
        v = value_of(record)
        self._need(w.phase in ("open", "reading", "finishing"), a, f"{c} is {w.phase}")
        self._need(w.val.get(n) == v, a, f"entry {n}: sends {v}, has {w.val.get(n)}")
        self._need(b in self.targets(w, n), a, f"{b} not in the write set of {n}: {self.targets(w, n)}")
        self._need(b not in w.ack.get(n, ()), a, f"{b} already acked {n}")
        if self.unbounded:
            self._need(h.term == w.term, a, f"record term {h.term}, client term {w.term}")
        self._need(h.is_recovery == (w.phase != "open"), a, f"recovery flag {h.is_recovery} in {w.phase}")
        if not resend:
            self._need(h.is_truncate == self.truncate_flag(w, n), a,
                       f"entry {n}: truncate flag {h.is_truncate}, the spec says {self.truncate_flag(w, n)}")
        if w.phase == "open":
            self._need(h.lac <= w.lac and h.lafr <= max(w.lafr, -1), a, f"record LAC/LAFR {h.lac}/{h.lafr}")
        else:
            self._need((h.lac, h.lafr) == (w.lac, w.lafr), a, f"record LAC/LAFR {h.lac}/{h.lafr}, frozen "
                                                              f"{w.lac}/{w.lafr}")
        self.sent.setdefault((b, n), set()).add(_sent_key(record))

    def BookieAdmit(self, b: str, h, accepted: bool) -> None:
        a, k = "BookieAdmit", self.bk[b]
        self._need(b not in self.crashed, a, f"{b} crashed")
        if self.unbounded:
            ok = k.term <= h.term
        else:
            ok = h.is_recovery or not k.fenced
        self._need(ok == accepted, a, f"{b} (term {k.term}, fenced {k.fenced}) "
                                      f"{'accepted' if accepted else 'refused'} entry {h.entry_id} term {h.term}")
        if accepted:
            k.term = max(k.term, h.term)

    def ClientSendLac(self, c: str, b: str, lac: int, lafr: int, term: int) -> None:
        a, w = "ClientSendLac", self.cl[c]
        self._need(w.phase == "open" and b in w.frags[-1][1], a, f"{c} {w.phase}, {b}")
        self._need((lac, lafr) == (w.lac, w.lafr), a, f"explicit LAC/LAFR {lac}/{lafr}, writer's {w.lac}/{w.lafr}")
        self._need(not self.unbounded or term == w.term, a, f"term {term}, writer's {w.term}")

    def BookieWriteLac(self, b: str, term: int, exists: bool, accepted: bool) -> None:
        a, k = "BookieWriteLac", self.bk[b]
        self._need(b not in self.crashed, a, f"{b} crashed")
        ok = exists and term >= k.term and not k.fenced
        self._need(ok == accepted, a, f"{b} (term {k.term}, fenced {k.fenced}) "
                                      f"{'accepted' if accepted else 'refused'} an explicit LAC of term {term}")

    def BookiePrepare(self, b: str, first: int, term: int, accepted: bool) -> None:
        """The spec's EnsembleChange prepares a joining bookie: its term is
        raised and its entries from the fragment's first entry on are deleted
        (here a bookie step of its own, just before the change)."""
        a, k = "BookiePrepare", self.bk[b]
        self._need(b not in self.crashed, a, f"{b} crashed")
        self._need((term >= k.term) == accepted, a, f"{b} (term {k.term}) "
                                                    f"{'accepted' if accepted else 'refused'} term {term}")
        if accepted:
            k.term, k.prepared = term, (first, term)
            for i in [i for i in k.ents if i >= first]:
                del k.ents[i]

    def BookieStoreLac(self, b: str, lac: int, lafr: int) -> None:
        k = self.bk[b]
        k.lac, k.lafr = max(k.lac, lac), max(k.lafr, lafr)

    def BookieStore(self, b: str, record: bytes) -> None:
        k = self.bk[b]
        h = E.parse_header(record)
        n = h.entry_id
        self._need(_sent_key(record) in self.sent.get((b, n), ()), "BookieStore",
                   f"{b} stored entry {n} (term {h.term}, LAC/LAFR {h.lac}/{h.lafr}, {value_of(record)}) "
                   f"that no client sent it")
        self.stored.setdefault((b, n), []).append((h.term, value_of(record)))
        if not h.is_recovery:
            # A normal add admitted before a fencing/recovery read is durable
            # before that read answers (bookie/core.py's barrier); one admitted
            # after it was refused: none is stored after the read.
            late = h.term < k.read_term if self.unbounded else k.fenced
            self._need(not late, "BookieStore", f"{b} stored entry {n} of a normal add (term {h.term}) after a "
                                                f"read (term {k.read_term}, fenced {k.fenced}) answered")
        if h.is_truncate:
            for i in [i for i in k.ents if i > n]:
                del k.ents[i]
        k.ents[n] = value_of(record)
        k.term = max(k.term, h.term)
        k.lac = max(k.lac, h.lac)
        k.lafr = max(k.lafr, h.lafr)

    def ClientAddAnswer(self, c: str, b: str, n: int, counted: bool) -> list[int]:
        """An OK answer.  counted=False: the core ignored it (late, from a
        failed or replaced bookie, entry released): a lost ack.  Returns the
        entries the step acknowledges to the application."""
        a, w = "ClientAddAnswer", self.cl[c]
        if not counted:
            return []
        self._need(w.phase in ("open", "reading", "finishing"), a, f"{c} is {w.phase}")
        self._need(n in w.val, a, f"ack for entry {n} not pending")
        self._need(b in self.targets(w, n), a, f"ack from {b}, not in the write set of {n}")
        self._need(any(v == w.val[n] and (not self.unbounded or t == w.term) for t, v in self.stored.get((b, n), ())),
                   a, f"ack from {b} for entry {n} ({w.val[n]}), which {b} never stored: "
                      f"{self.stored.get((b, n), [])}")
        ack2 = dict(w.ack)
        ack2[n] = w.ack.get(n, set()) | {b}
        if w.phase != "open":
            w.ack = ack2
            return []
        lac2 = self.advance(w.lac, ack2, self.Qa)
        lafr2 = self.advance(w.lafr, ack2, self.Qw) if self.unbounded else w.lafr
        rel = lafr2 if self.unbounded else lac2
        newly = list(range(w.lac + 1, lac2 + 1))
        for i in newly:
            if i in self.acked and self.acked[i] != w.val[i]:
                raise SpecViolation(a, f"entry {i} acknowledged as {w.val[i]}, was {self.acked[i]}")
            self.acked[i] = w.val[i]
        w.ack = {i: s for i, s in ack2.items() if i > rel}
        w.val = {i: v for i, v in w.val.items() if i > rel}
        w.lac, w.lafr = lac2, lafr2
        return newly

    def Rejected(self, c: str) -> None:
        """A bookie refused c (the guard was checked at the bookie's step)."""
        self.cl[c] = MClient()

    # -- fencing and recovery reads ------------------------------------------------------

    def ClientSendRead(self, c: str, b: str, n: int | None, term: int, fence: bool) -> None:
        a, w = ("ClientSendFenceRead" if n is None else "ClientSendRecoveryRead"), self.cl[c]
        self._need(w.phase == ("fencing" if n is None else "reading"), a, f"{c} is {w.phase}")
        if self.unbounded:
            self._need(term == w.term and term > 0, a, f"read carries term {term}, client term {w.term}")
        else:
            self._need(fence, a, "classic read without the fence flag")
        if n is None:
            self._need(b in w.rfrags[-1][1], a, f"{b} not in the last fragment")
        else:
            end = self.known_end(w)
            self._need(n >= w.next and (end is None or n <= end), a,
                       f"reads {n}, next is {w.next}, known end {end}")
            self._need(b in self.write_set(n, w.rfrags), a, f"{b} not in the write set of {n}")

    def BookieRead(self, b: str, term: int, fence: bool, status, entry: int | None) -> None:
        """A term-carrying/fencing read at bookie b (a LAC read, or a read of
        ``entry``): AfterRead, or InvalidTerm.  The answer is checked by
        check_answer."""
        a, k = "BookieRead", self.bk[b]
        self._need(b not in self.crashed, a, f"{b} crashed")
        ok = (not self.unbounded) or k.term <= term
        expect = ("OK", "NO_SUCH_ENTRY") if ok else ("INVALID_TERM",)
        self._need(status in expect, a, f"{b} (term {k.term}) answered {status} to term {term}")
        if ok:
            if self.unbounded:
                k.term = max(k.term, term)
                k.read_term = max(k.read_term, term)
            if fence:
                k.fenced = True
        return ok

    def check_answer(self, b: str, n: int | None, answer) -> None:
        k = self.bk[b]
        if n is None:
            self._need(answer == (k.lac, k.lafr), "BookieRead", f"{b} answered LAC/LAFR {answer}, "
                                                              f"holds {(k.lac, k.lafr)}")
        else:
            self._need(answer == k.ents.get(n), "BookieRead", f"{b} answered {answer} for {n}, holds "
                                                             f"{k.ents.get(n)}")

    def answered(self, b: str, n: int | None, term: int, answer) -> None:
        """Bookie b answered a fencing (n None: its LAC/LAFR) or recovery read
        (entry n: its value, None for NoSuchEntry) of ``term`` with ``answer``."""
        self.answers.setdefault((b, n), []).append((term, answer))

    def _heard(self, a: str, c: str, w: MClient, b: str, n: int | None, answer) -> None:
        """The spec's client takes a read's answer from the bookie's read
        (FenceRead, RecoveryRead): an answer b gave to a read of c's term."""
        got = self.answers.get((b, n), [])
        self._need(any(x == answer and (not self.unbounded or t == w.term) for t, x in got), a,
                   f"{c} (term {w.term}) took {answer} from {b} for {'its LAC' if n is None else n}; "
                   f"{b} answered {got}")

    def ClientFenceAnswer(self, c: str, b: str, lac: int, lafr: int) -> None:
        a, w = "ClientFenceAnswer", self.cl[c]
        self._need(w.phase == "fencing", a, f"{c} is {w.phase}")
        self._heard(a, c, w, b, None, (lac, lafr))
        w.lac, w.lafr = max(w.lac, lac), max(w.lafr, lafr)
        w.fenced.add(b)

    def StartReading(self, c: str, start: int) -> None:
        a, w = "StartReading", self.cl[c]
        self._need(w.phase == "fencing", a, f"{c} is {w.phase}")
        self._need(self.covered(w), a, f"not covered: {sorted(w.fenced)}")
        frm = (w.lafr if self.unbounded else w.lac) + 1
        w.next = max(frm, w.rfrags[-1][0])
        self._need(start == w.next, a, f"reads from {start}, the spec from {w.next}")
        w.start = w.next
        w.phase, w.fenced = "reading", set()

    def known_end(self, w: MClient) -> int | None:
        """The lowest id above next already read as absent (reading stops
        there at the latest)."""
        ends = [n for n, x in w.ahead.items() if isinstance(x, set) and len(x) >= self.coverage]
        return min(ends) if ends else None

    def ClientReadAnswer(self, c: str, b: str, n: int, value) -> str:
        """A recovery read's OK / NoSuchEntry answer for entry n of the
        window: recorded, or ignored when late (n decided, above a known
        end, or n's answers already decide it).  Decides nothing: see
        RecoveryDecide."""
        a, w = "ClientReadAnswer", self.cl[c]
        self._need(w.phase == "reading", a, f"{c} is {w.phase}")
        self._heard(a, c, w, b, n, value)
        self._need(b in self.write_set(n, w.rfrags), a, f"{b} not in the write set of {n}")
        end = self.known_end(w)
        got = w.ahead.get(n, set())
        if n < w.next or (end is not None and n > end) or not isinstance(got, set) or len(got) >= self.coverage:
            return "late"
        if b in got:
            return "late"  # asked again after a stale value was dropped: its first answer counted
        if value is not None and origin_of(value) >= w.floor:
            w.ahead[n] = value
            w.okfrom[n] = (b, got)
            return "recorded"
        self._nosuch(w, n, got | {b})  # NoSuchEntry, or a stale OK: an older term's leftover
        return "recorded"

    def _nosuch(self, w: MClient, n: int, bs: set) -> None:
        w.ahead[n] = bs
        if len(bs) >= self.coverage:  # a known end: nothing above it matters
            w.ahead = {i: x for i, x in w.ahead.items() if i <= n}
            w.okfrom = {i: x for i, x in w.okfrom.items() if i <= n}

    def _demote(self, w: MClient) -> None:
        """The floor rose: values held above next whose origin is below it
        are stale, each a NoSuchEntry of the bookie that gave it."""
        for i in sorted(w.ahead):
            x = w.ahead.get(i)
            if x is not None and not isinstance(x, set) and origin_of(x) < w.floor:
                b, before = w.okfrom.pop(i)
                self._nosuch(w, i, before | {b})

    def RecoveryDecide(self, c: str, n: int, outcome: str) -> None:
        """The decision on entry next from its recorded answers: "recovered"
        (written back from here on), "absent" (the end: finishing; the
        truncate no-op in unbounded mode) or "data_loss" (absent at or below
        the frozen LAC: the implementation then withdraws,
        DEVIATIONS["data_loss_abort"])."""
        a, w = "RecoveryDecide", self.cl[c]
        self._need(w.phase == "reading" and n == w.next, a, f"{c} {w.phase}, next {w.next}, decides {n}")
        got = w.ahead.get(n, set())
        if outcome == "recovered":
            self._need(not isinstance(got, set), a, f"entry {n} recovered without a value: {got}")
            w.val[n], w.ack[n] = got, set()
            del w.ahead[n]
            w.okfrom.pop(n, None)
            w.next = n + 1
            if origin_of(got) > w.floor:
                w.floor = origin_of(got)
                self._demote(w)
            return
        self._need(isinstance(got, set) and len(got) >= self.coverage, a,
                   f"entry {n} {outcome} with NoSuchEntry from {got} only")
        self._need((outcome == "data_loss") == (n <= w.lac), a, f"entry {n} {outcome}, frozen LAC {w.lac}")
        if outcome == "data_loss":
            return
        w.phase, w.ahead, w.okfrom = "finishing", {}, {}
        if self.unbounded:
            w.val[n], w.ack[n] = noop(w.term), set()

    # -- bookies -------------------------------------------------------------------------------

    def BookieCrash(self, b: str, durable_term: int, durable_fenced: bool) -> None:
        """The bookie stops answering and loses its memory: what it rebuilds
        from its journal keeps every stored entry, LAC and LAFR; the term
        raised by adds admitted but never durable is forgotten
        (DEVIATIONS["crash_term"])."""
        a, k = "BookieCrash", self.bk[b]
        self._need(b not in self.crashed, a, f"{b} already crashed")
        self._need(durable_term <= k.term and (k.fenced or not durable_fenced), a, "a crash raised the state")
        k.term, k.fenced = durable_term, durable_fenced
        self.crashed.add(b)

    def BookieRestart(self, b: str) -> None:
        self._need(b in self.crashed, "BookieRestart", f"{b} not crashed")
        self.crashed.discard(b)
