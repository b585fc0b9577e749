"""Recovery of a ledger's last fragment as a pure steppable machine (no I/O).

Used at the start of a term (unbounded ledgers) and for classic fencing
recovery before a close.  The adapter feeds bookie answers in and drains a
``RecoveryReady``: fencing reads, recovery reads, recovery writes, bookie
replacement requests, and finally a ``RecoveryResult`` that it publishes with
the final metadata CAS (state OPEN, or CLOSED with the last entry), together
with the ensemble change, if any: "a recovering client does not publish
ensemble changes before recovery completes".

Steps (../shared/notes/protocol-rules.md, "Recovery at the start of a term"):

1. Fencing LAC/LAFR reads, carrying the term (classic: the fence flag), to the
   last fragment's ensemble; wait for coverage (Qw - Qa + 1 responders of
   every write quorum).  Coverage out of reach: ABORTED.
2. Freeze LAC = the highest LAC reported; start reading at
   max(highest LAFR + 1, first entry of the last fragment) (BookKeeper #2615).
   Classic mode (the seed: "takes the highest [LAC] response as the entry id
   to start reading forward from") starts at max(highest LAC + 1, first
   entry of the last fragment): a classic writer does not track the LAFR
   (every record carries -1), every entry up to a reported LAC reached Qa
   and stays readable, and one writer wrote each entry id once, so there is
   nothing to make whole below it.  Starting at the fragment's first entry
   would re-read and rewrite the whole fragment, one fenced read at a time.
3. Read forward over each entry's write set in the last fragment's ensemble
   only (``stream.quorum.EntryReadOutcome``), with a read-ahead window (see
   below): RECOVERABLE -> write it back to its whole write set (recovery
   add: term, REQ_RECOVERY, frozen LAC, the record's *origin term* copied
   unchanged; a recovered no-op loses its truncate flag, which already did
   its work); ABSENT -> the end; UNKNOWN -> ABORTED, never a guess.  An
   entry at or below the frozen LAC read as ABSENT is data loss: ABORTED as
   well.  An OK whose origin term is below the floor is stale (below).
4. Unbounded mode: at the first absent id, write a no-op with
   FLAG_NOOP|FLAG_TRUNCATE that must be acknowledged by every bookie of the
   ensemble (guaranteed write quorum: no bookie keeps a dirty entry above it).
5. DONE only once every recovery write reached its whole write set and the
   no-op all E bookies.  A bookie that fails a recovery write is replaced: the
   core asks the adapter for a new bookie (``ReplaceBookie``), keeps the
   changed ensemble locally (a fragment starting at the first entry read) and
   resends to it every recovery write of that index.
6. INVALID_TERM from any bookie: FENCED_OUT (a newer term took over).

Log matching (the origin term).  Every record carries the term of whoever
created it (``bookie/entry.py``), and a write-back copies it.  The entries a
recovery decides, from its start entry up, have non-decreasing origin
terms: ``floor`` is the highest origin term among the entries decided so
far, and an OK answer whose record's origin is below it is *stale*: it
counts as NO_SUCH_ENTRY in its entry's outcome (that bookie holds no valid
copy).  The floor only rises, so an answer judged stale when it arrives is
stale at its decision; an OK held above the frontier is judged again when
the floor rises (``EntryReadOutcome.demote``: the outcome is made again, and
the bookies of the write set that have not answered are asked).  Why it is
safe and closes the hole of issue 12: README, "Recovery and the origin
term".  Classic ledgers: origin 0 everywhere, the floor stays 0.

Read-ahead.  Reads are outstanding for a window of up to ``max_read_ahead``
entries from the *frontier*, the lowest undecided id (``max_read_ahead=1``:
the protocol as written, one entry at a time).  Each entry of the window has
its own ``EntryReadOutcome``, and answers may arrive in any order, but
decisions are taken strictly in entry order, at the frontier only:

- RECOVERABLE at the frontier: written back (while fewer than
  ``max_inflight_writes`` write-backs are in flight), the frontier moves up
  and consumes the outcomes of higher ids that are already complete;
- ABSENT at the frontier: the end (or data loss at or below the frozen LAC);
- UNKNOWN at the frontier: ABORTED.

An outcome above the frontier never aborts or concludes anything by itself;
it counts once the frontier reaches it.  The one thing it does at once: an
ABSENT outcome at X above the frontier is a *known end*, since whatever the
frontier meets below it, reading stops at X at the latest, so no read above
X matters: the outcomes above X are discarded and no read above X is issued.
Answers for ids outside the window (decided, discarded, never asked) are
ignored.  The fencing responders' highest held ids (``last_entry``) bound
the window until the frontier passes them: every id above H = the highest
of them reads ABSENT from the responders, a coverage, once they answer
(they refuse older adds since the fencing read, and answered after the
adds they had admitted were durable), so the end is at H + 1 at the latest
unless a non-responder holds more (then the frontier passes H + 1 and the
window grows as usual).  A fresh LAFR then costs a read of one or two ids,
not of a whole window.  ``max_read_ahead_bytes`` stops the window from growing while the
records held above the frontier exceed it (the frontier's own read is always
outstanding, so reading never stalls on it).

Spread reads (Qw = E).  An id that some fencing responder reported holding
(its ``last_entry`` is at or above the id) is read first from one responder
that holds it: the ids go to the bookies in blocks of ``READ_BLOCK`` (block
k to bookie k mod E, or to the next responder holding the id), so each
bookie serves one range read of its blocks and a window costs one read per
entry, not Qw.  Any answer but OK (NO_SUCH_ENTRY, an error, a timeout) asks
the rest of the write set at once, and ``speculate()`` (the adapter's timer,
when reads stall) asks them for every entry still waiting on its first
bookie.  Ids nobody reported holding are read from their whole write set
(an end needs Qw - Qa + 1 answers).  Striped ensembles (E > Qw) read the
whole write set: the ids one bookie would be given lie scattered among ids
it holds but is not asked for, a sparse range read per id or two.  Which
bookies are asked, and when, never decides anything: an outcome is still
made of its answers by the EntryReadOutcome rules (one OK: RECOVERABLE, as
when that answer came first; ABSENT only on Qw - Qa + 1 NO_SUCH_ENTRY).

Why reading ahead is safe.  It changes *when* entry n is read, not how n is
decided from its answers: an answer is used only once the frontier reaches n,
by the same EntryReadOutcome rules.  It is safe as long as every answer is
still true when it is used, i.e. nothing changes entry n on a bookie between
its answer to this recovery's read of n and the decision on n.  Nothing can:

- an older term (classic: an older writer): the read itself carries the term
  (classic: the fence), so from that moment the bookie refuses the older
  writer's adds, and the adds it admitted before are durable, and in the
  answer, before it answers (the bookie's fencing barrier).  Fencing coverage
  already holds before the first read, so no older writer can complete an
  add anyway: a bookie outside the coverage may still take an older add of
  n until this recovery's read reaches it, but then that read's answer
  shows it;
- this recovery: within one term only it writes, and it writes entry n
  only after deciding n (late answers for n are ignored); a write-back never
  carries the truncate flag, and the final truncate no-op at the end X only
  deletes ids above X, whose answers are discarded;
- a newer term: it may change anything, but its fencing reached a coverage of
  every write quorum, and those bookies refuse this recovery's writes
  (INVALID_TERM), so it can never finish: every write-back needs its whole
  write set and the no-op every bookie of the ensemble.

So the decisions, and the RecoveryResult, are those of reading one entry at
a time given the same bookie contents (tests/test_recovery_core.py checks
that with hypothesis).

States, events and the messages to and from the adapter (the whole
transition table): ``stream.recovery_machine``, re-exported here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bookie import entry as entry_codec
from bookie.core import Status
from stream.mutations import NONE as NO_MUTATIONS
from stream.mutations import Mutations
from stream.quorum import CoverageTracker, EntryReadOutcome, ReadOutcome, validate_quorums, write_set
from stream.recovery_machine import (  # noqa: F401  (re-exported: the core's interface)
    TERMINAL, TRANSITIONS, FencingRead, InvalidRecoveryTransition, RecoveryError, RecoveryEvent, RecoveryRead,
    RecoveryReady, RecoveryResult, RecoveryState, RecoveryWrite, ReplaceBookie)

DEFAULT_MAX_INFLIGHT_WRITES = 1000
DEFAULT_MAX_READ_AHEAD = 1024            # entries with reads outstanding
DEFAULT_MAX_READ_AHEAD_BYTES = 64 << 20  # records held above the frontier
READ_BLOCK = 256                         # spread reads: ids per bookie in turn


@dataclass(slots=True)
class _WriteBack:
    entry_id: int
    record: bytes
    targets: tuple[int, ...]
    acked: set[int] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return len(self.acked) == len(self.targets)  # (acked only ever holds targets)


class RecoveryCore:
    def __init__(
        self,
        ledger_id: int,
        fragment_first: int,
        ensemble: list[str],
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        *,
        term: int,
        fence: bool = False,
        unbounded: bool = True,
        max_inflight_writes: int = DEFAULT_MAX_INFLIGHT_WRITES,
        max_read_ahead: int = DEFAULT_MAX_READ_AHEAD,
        max_read_ahead_bytes: int = DEFAULT_MAX_READ_AHEAD_BYTES,
        max_replacements: int | None = None,
        mutations: Mutations = NO_MUTATIONS,
    ):
        validate_quorums(ensemble_size, write_quorum, ack_quorum)
        assert len(ensemble) == ensemble_size and len(set(ensemble)) == ensemble_size, ensemble
        assert fragment_first >= 0 and term >= 0 and max_inflight_writes >= 1
        assert max_read_ahead >= 1 and max_read_ahead_bytes >= 1
        assert term > 0 or fence, "recovery must fence: a term (unbounded) or the fence flag (classic)"
        self.ledger_id, self.term, self.fence, self.unbounded = ledger_id, term, fence, unbounded
        self.mutations = mutations                 # tests only: NONE in production
        self.E, self.Qw, self.Qa = ensemble_size, write_quorum, ack_quorum
        self.fragment_first = fragment_first
        self.read_ensemble = tuple(ensemble)       # reads: the last fragment only
        self.ensemble = list(ensemble)             # writes: possibly changed
        self.max_inflight_writes = max_inflight_writes
        self.max_read_ahead = max_read_ahead
        self.max_read_ahead_bytes = max_read_ahead_bytes
        self.max_replacements = 2 * ensemble_size if max_replacements is None else max_replacements
        self.state = RecoveryState.INIT
        self.coverage = CoverageTracker(ensemble_size, write_quorum, ack_quorum)
        self.lac_seen = -1
        self.lafr_seen = -1
        self.frozen_lac: int | None = None
        self.frozen_lafr: int | None = None
        self.start_entry: int | None = None
        self.frontier: int | None = None           # the lowest undecided id (READING)
        self.outcomes: dict[int, EntryReadOutcome] = {}  # the window: [frontier, read_top)
        self.read_top: int | None = None           # reads issued below this id
        self.known_end: int | None = None          # an ABSENT outcome above the frontier
        self.floor = 0                             # the highest origin term decided (log matching)
        self.stale_answers = 0                     # OK answers that counted as NO_SUCH_ENTRY
        self.held_bytes = 0                        # records held by the window's outcomes
        self.held_hint: int | None = -1            # the highest id any fencing responder holds
        self.held: dict[int, int] = {}             # responder index -> the highest id it holds
        self._single: dict[int, int] = {}          # window ids read from one bookie so far -> that bookie
        self._decoded: dict[int, entry_codec.Entry] = {}  # RECOVERABLE outcomes' records, decoded
        self.reads_issued = 0
        self.writes: dict[int, _WriteBack] = {}    # entry id -> write back, the no-op included
        self._incomplete: set[int] = set()         # ids of self.writes not yet complete
        self.recovered: list[int] = []
        self.end_entry: int | None = None          # first absent id
        self.replacing: dict[int, str] = {}        # index -> bookie being replaced
        self.replacements = 0
        self.reason: str | None = None
        self._result: RecoveryResult | None = None
        self._o_fencing: list[FencingRead] = []
        self._o_reads: list[RecoveryRead] = []
        self._o_writes: list[RecoveryWrite] = []
        self._o_replace: list[ReplaceBookie] = []

    @property
    def read_entry(self) -> int | None:
        """The frontier while reading (the entry read one at a time before)."""
        return self.frontier if self.state is RecoveryState.READING else None

    @property
    def read(self) -> EntryReadOutcome | None:
        """The frontier's outcome while reading."""
        return self.outcomes.get(self.frontier) if self.state is RecoveryState.READING else None

    def wants(self, entry_id: int, bookie_index: int) -> bool:
        """Whether an answer of this bookie for this entry would be taken
        (not late: the entry is in the window, undecided, and the bookie has
        not answered it yet)."""
        o = self.outcomes.get(entry_id) if self.state is RecoveryState.READING else None
        return o is not None and o.outcome is ReadOutcome.PENDING and bookie_index not in o.answered

    def _step(self, event: RecoveryEvent) -> None:
        nxt = TRANSITIONS[self.state].get(event)
        if nxt is None:
            raise InvalidRecoveryTransition(self.state, event)
        self.state = nxt

    # -- inputs -----------------------------------------------------------------

    def start(self) -> None:
        self._step(RecoveryEvent.START)
        for i, b in enumerate(self.read_ensemble):
            self._o_fencing.append(FencingRead(i, b, self.ledger_id, self.term, self.fence))
        self.mutations.strip_read_terms(self._o_fencing)  # tests only

    def on_lac_response(self, bookie_index: int, status: Status | None, lac: int = -1, lafr: int = -1,
                        last_entry: int | None = None) -> None:
        """A fencing LAC read's answer; ``status=None``: timed out.
        ``last_entry``: the highest entry id the bookie holds (None: not
        reported), a hint for the first window (see ``_fill_window``)."""
        assert 0 <= bookie_index < self.E
        if self.state is not RecoveryState.FENCING:
            return  # late
        if status is Status.INVALID_TERM:
            return self._end(RecoveryEvent.INVALID_TERM, f"bookie {self.read_ensemble[bookie_index]}: INVALID_TERM")
        self._step(RecoveryEvent.LAC_RESPONSE)
        if status in (Status.OK, Status.NO_SUCH_LEDGER):
            assert lac >= -1 and lafr >= -1
            if status is Status.OK:
                self.lac_seen, self.lafr_seen = max(self.lac_seen, lac), max(self.lafr_seen, lafr)
            held = -1 if status is Status.NO_SUCH_LEDGER else last_entry
            if held is not None:
                self.held[bookie_index] = held
            if self.held_hint is not None:
                self.held_hint = None if held is None else max(self.held_hint, held)
            self.coverage.on_response(bookie_index)
        elif not self.coverage.on_failure(bookie_index):
            return self._end(RecoveryEvent.ABORT, "fencing coverage out of reach")
        if self.coverage.covered:
            self._step(RecoveryEvent.COVERED)
            self.frozen_lac, self.frozen_lafr = self.lac_seen, self.lafr_seen
            done_below = self.lafr_seen if self.unbounded else self.lac_seen
            self.start_entry = max(done_below + 1, self.fragment_first)
            self.frontier = self.read_top = self.start_entry
            self._fill_window()

    def on_read_response(self, entry_id: int, bookie_index: int, status: Status | None,
                         record: bytes | None = None) -> None:
        """A recovery read's answer, for any entry of the window, in any
        order; ``status=None``: timed out.  Late answers are ignored."""
        assert 0 <= bookie_index < self.E
        if self._take_read(entry_id, bookie_index, status, record):
            self._advance()

    def on_read_responses(self, bookie_index: int,
                          answers: list[tuple[int, Status | None, bytes | None]]) -> None:
        """Answers of one bookie, (entry id, status, record) in the order it
        gave them (a frame of a range read): the same as ``on_read_response``
        for each, with the decisions at the frontier made once, after them
        all (deciding later only delays reads and write-backs: an outcome,
        once complete, does not change)."""
        assert 0 <= bookie_index < self.E
        took = False
        for entry_id, status, record in answers:
            took |= self._take_read(entry_id, bookie_index, status, record)
            if self.state is not RecoveryState.READING:
                return
        if took:
            self._advance()

    def _take_read(self, entry_id: int, bookie_index: int, status: Status | None, record: bytes | None) -> bool:
        """Records a read answer in its entry's outcome; False if it changed
        nothing (late, duplicate, or the recovery ended on it)."""
        if self.state is not RecoveryState.READING:
            return False  # late
        o = self.outcomes.get(entry_id)
        if o is None:
            return False  # late: decided, discarded above a known end, or never asked
        if status is not Status.INVALID_TERM and (o.outcome is not ReadOutcome.PENDING
                                                  or bookie_index in o.answered):
            return False  # the entry's outcome is final already (or a duplicate): nothing to decode
        if status is Status.INVALID_TERM:
            self._end(RecoveryEvent.INVALID_TERM, f"bookie {self.read_ensemble[bookie_index]}: INVALID_TERM")
            return False
        self._step(RecoveryEvent.READ_RESPONSE)
        if status is Status.OK:
            try:
                got = entry_codec.decode(record)
                assert got.ledger_id == self.ledger_id and got.entry_id == entry_id, (got, entry_id)
            except (entry_codec.ChecksumMismatch, entry_codec.MalformedEntry):
                status, record = Status.CHECKSUM_MISMATCH, None  # an error, never "absent"
            else:
                if got.origin > self.term:  # only a newer term creates it: it took over (a bookie that
                    self._end(RecoveryEvent.INVALID_TERM,  # saw it should have refused this read)
                              f"bookie {self.read_ensemble[bookie_index]}: entry {entry_id} of term {got.origin}")
                    return False
                if got.origin < self.floor:  # stale: an older term's leftover above a newer term's entry
                    status, record = Status.NO_SUCH_ENTRY, None
                    self.stale_answers += 1
        else:
            record = None
        outcome = o.on_response(bookie_index, status, record)
        if outcome is ReadOutcome.RECOVERABLE:  # (by this answer: it was PENDING)
            self.held_bytes += len(o.record)
            self._decoded[entry_id] = got
            self._single.pop(entry_id, None)
        elif outcome is ReadOutcome.PENDING and entry_id in self._single:
            self._ask_the_rest(entry_id, o)
        else:
            self._single.pop(entry_id, None)
        if outcome is ReadOutcome.ABSENT and entry_id > self.frontier:
            self._known_end(entry_id)
        return True

    def on_write_ack(self, entry_id: int, bookie_index: int, status: Status | None = Status.OK, *,
                     bookie_id: str | None = None) -> None:
        """A recovery write's answer; ``status=None``: timed out."""
        assert 0 <= bookie_index < self.E
        if self.state in TERMINAL or self.state is RecoveryState.INIT:
            return
        if bookie_id is not None and bookie_id != self.ensemble[bookie_index]:
            return  # from a bookie replaced since
        if status is Status.INVALID_TERM:
            return self._end(RecoveryEvent.INVALID_TERM, f"bookie {self.ensemble[bookie_index]}: INVALID_TERM")
        if status is not Status.OK:
            return self.on_write_failed(entry_id, bookie_index)
        self._step(RecoveryEvent.WRITE_ACK)
        if bookie_index in self.replacing or not self._take_acks((entry_id,), bookie_index):
            return
        self._progress()

    def on_write_acks(self, entry_ids: list[int], bookie_index: int, *, bookie_id: str | None = None) -> None:
        """OK answers of one bookie for a frame of recovery writes: the same
        as ``on_write_ack`` for each, with the progress made once."""
        assert 0 <= bookie_index < self.E
        if self.state in TERMINAL or self.state is RecoveryState.INIT:
            return
        if bookie_id is not None and bookie_id != self.ensemble[bookie_index]:
            return  # from a bookie replaced since
        self._step(RecoveryEvent.WRITE_ACK)
        if bookie_index in self.replacing:
            return
        self._take_acks(entry_ids, bookie_index)
        self._progress()

    def _take_acks(self, entry_ids, bookie_index: int) -> int:
        """Records a bookie's OKs for write backs (one loop: a frame holds up
        to thousands); returns how many were known."""
        writes, incomplete, hooks = self.writes, self._incomplete, bool(self.mutations)
        known = 0
        for eid in entry_ids:
            wb = writes.get(eid)
            if wb is None:
                continue
            known += 1
            assert bookie_index in wb.targets, (eid, bookie_index)
            acked = wb.acked
            acked.add(bookie_index)
            if hooks:
                self.mutations.noop_acked(self, wb)  # tests only
            if len(acked) == len(wb.targets):  # (wb.complete)
                incomplete.discard(eid)
        return known

    def on_write_failed(self, entry_id: int, bookie_index: int) -> None:
        """A recovery write failed or timed out: ask for a replacement bookie."""
        assert 0 <= bookie_index < self.E
        if self.state in TERMINAL or bookie_index in self.replacing:
            return
        self._step(RecoveryEvent.WRITE_FAILED)
        if self.replacements >= self.max_replacements:
            return self._end(RecoveryEvent.ABORT, f"more than {self.max_replacements} bookie replacements")
        self.replacements += 1
        self.replacing[bookie_index] = self.ensemble[bookie_index]
        for wb in self.writes.values():
            if bookie_index in wb.acked:
                wb.acked.discard(bookie_index)
                self._incomplete.add(wb.entry_id)
        self._o_replace.append(ReplaceBookie(bookie_index, self.ensemble[bookie_index]))

    def on_bookie_replaced(self, bookie_index: int, new_bookie_id: str) -> None:
        assert bookie_index in self.replacing, bookie_index
        assert new_bookie_id not in self.ensemble and new_bookie_id not in self.read_ensemble, new_bookie_id
        if self.state in TERMINAL:
            return
        self._step(RecoveryEvent.BOOKIE_REPLACED)
        del self.replacing[bookie_index]
        self.ensemble[bookie_index] = new_bookie_id
        for eid in sorted(self.writes):
            wb = self.writes[eid]
            if bookie_index in wb.targets:
                wb.acked.discard(bookie_index)
                self._incomplete.add(eid)
                self._o_writes.append(RecoveryWrite(eid, bookie_index, new_bookie_id, wb.record))

    def abort(self, reason: str) -> None:
        """The adapter gives up (e.g. no bookie to replace one with)."""
        if self.state not in TERMINAL:
            self._end(RecoveryEvent.ABORT, reason)

    # -- outputs ----------------------------------------------------------------

    @property
    def result(self) -> RecoveryResult | None:
        return self._result

    def ready(self) -> RecoveryReady:
        r = RecoveryReady(self.state, self._o_fencing, self._o_reads, self._o_writes, self._o_replace,
                          self._result, self.reason)
        self._o_fencing, self._o_reads, self._o_writes, self._o_replace = [], [], [], []
        return r

    # -- internals --------------------------------------------------------------

    def _end(self, event: RecoveryEvent, reason: str) -> None:
        self._step(event)
        assert self.state in TERMINAL
        self.reason = reason
        self._drop_window(above=None)
        self._o_reads.clear()
        self._o_writes.clear()
        self._o_replace.clear()

    def _fill_window(self) -> None:
        """Issues the reads of the window: ids from ``read_top`` up to
        frontier + max_read_ahead - 1, never above a known end, and (but for
        the frontier's own read) not while the records held above the
        frontier exceed max_read_ahead_bytes.  The window is refilled once
        no more than half of it is outstanding: reads leave in large runs
        (one range read per bookie each), and an end found in the last run
        is usually known before the next one would leave."""
        assert self.state is RecoveryState.READING and self.frontier <= self.read_top
        if self.read_top - self.frontier > self.max_read_ahead // 2:
            return
        top = self.frontier + self.max_read_ahead
        if self.known_end is not None:
            top = min(top, self.known_end + 1)
        if self.held_hint is not None and self.held_hint + 1 >= self.frontier:
            top = min(top, self.held_hint + 2)
        n = len(self._o_reads)
        while self.read_top < top and (self.read_top == self.frontier or self.held_bytes < self.max_read_ahead_bytes):
            eid = self.read_top
            ws = write_set(eid, self.E, self.Qw)
            self.outcomes[eid] = EntryReadOutcome(self.Qw, self.Qa, ws,
                                                  self.mutations.absent_quorum(self.Qw, self.Qa))  # tests only
            first = self._first_reader(eid, ws)
            if first is None:
                self._ask(eid, ws)
            else:
                self._single[eid] = first
                self._ask(eid, (first,))
            self.read_top += 1
            self.reads_issued += 1
        assert len(self.outcomes) <= self.max_read_ahead and self.frontier in self.outcomes
        if len(self._o_reads) > n:
            self.mutations.strip_read_terms(self._o_reads)  # tests only

    def _first_reader(self, eid: int, ws: tuple[int, ...]) -> int | None:
        """The one bookie to read ``eid`` from first (spread reads, see the
        module doc), or None: read the whole write set."""
        E = self.E
        if self.Qw != E:
            return None  # striped: the ids one bookie is given would be scattered among those it holds
        held = self.held
        turn = (eid - self.start_entry) // READ_BLOCK
        for k in range(E):  # (Qw = E: every bookie is in the write set)
            i = (turn + k) % E
            if held.get(i, -1) >= eid:
                return i
        return None

    def _ask(self, eid: int, indexes) -> None:
        for i in indexes:
            self._o_reads.append(RecoveryRead(eid, i, self.read_ensemble[i], self.ledger_id, self.term, self.fence))

    def _ask_the_rest(self, eid: int, o: EntryReadOutcome) -> None:
        """``eid`` was read from one bookie, which did not settle it: the
        rest of its write set is asked now."""
        first = self._single.pop(eid)
        n = len(self._o_reads)
        self._ask(eid, [i for i in o.members if i != first and i not in o.answered])
        if len(self._o_reads) > n:
            self.mutations.strip_read_terms(self._o_reads)  # tests only

    def speculate(self) -> int:
        """Reads stalled (the adapter's timer): every entry of the window
        still waiting on the one bookie it was read from is asked of the rest
        of its write set.  Returns how many entries."""
        if self.state is not RecoveryState.READING:
            return 0
        waiting = sorted(self._single)
        for eid in waiting:
            self._ask_the_rest(eid, self.outcomes[eid])
        return len(waiting)

    @property
    def single_reads(self) -> int:
        """Entries of the window read from one bookie so far (speculate() would ask the rest)."""
        return len(self._single) if self.state is RecoveryState.READING else 0

    def _known_end(self, eid: int) -> None:
        """An ABSENT outcome at ``eid`` above the frontier: reading stops at
        ``eid`` at the latest, so nothing above it matters."""
        assert self.frontier < eid < self.read_top
        if self.known_end is None or eid < self.known_end:
            self.known_end = eid
            self._drop_window(above=eid)

    def _drop_window(self, above: int | None) -> None:
        """Discards the outcomes above ``above`` (None: all of them)."""
        for eid in [e for e in self.outcomes if above is None or e > above]:
            o = self.outcomes.pop(eid)
            self._single.pop(eid, None)
            if o.outcome is ReadOutcome.RECOVERABLE:
                self.held_bytes -= len(o.record)
                del self._decoded[eid]
        if above is not None:
            self.read_top = min(self.read_top, above + 1)
        assert self.held_bytes >= 0 and (self.outcomes or self.held_bytes == 0) and len(self._decoded) <= len(self.outcomes)

    def _advance(self) -> None:
        """Decides at the frontier, in entry order, as far as the complete
        outcomes (and the bound on write-backs in flight) allow; then refills
        the window."""
        start = self.frontier
        while self.state is RecoveryState.READING:
            eid = self.frontier
            o = self.outcomes.get(eid)
            if o is None or o.outcome is ReadOutcome.PENDING:
                break  # (None: frontier = read_top, its read is issued below)
            if o.outcome is ReadOutcome.UNKNOWN:
                return self._end(RecoveryEvent.ABORT, f"entry {eid}: outcome unknown, retry later")
            if o.outcome is ReadOutcome.ABSENT:
                return self._absent(eid)
            if self._inflight() >= self.max_inflight_writes:
                break
            del self.outcomes[eid]
            self.held_bytes -= len(o.record)
            self.frontier = eid + 1
            e = self._decoded.pop(eid)
            self._recovered(eid, e)
            if e.origin > self.floor:
                self.floor = self.mutations.origin_floor(e.origin)  # tests only
                self._demote_stale()
        if self.state is RecoveryState.READING and (self.frontier != start or self.frontier == self.read_top):
            self._fill_window()

    def _demote_stale(self) -> None:
        """The floor rose: the OK answers held above the frontier whose
        origin is below it are stale.  Each such outcome is made again with
        that answer as NO_SUCH_ENTRY: ABSENT above the frontier is a known
        end; PENDING asks the rest of the write set (the answers dropped
        while the outcome was RECOVERABLE were never recorded)."""
        if not self.floor:
            return  # (IGNORE_ORIGIN_TERM: nothing is ever stale)
        n = len(self._o_reads)
        for eid in sorted(self.outcomes):
            o = self.outcomes.get(eid)
            if o is None or o.outcome is not ReadOutcome.RECOVERABLE or self._decoded[eid].origin >= self.floor:
                continue  # (None: dropped above a known end found meanwhile)
            self.held_bytes -= len(o.record)
            del self._decoded[eid]
            self.stale_answers += 1
            out = o.demote()
            if out is ReadOutcome.ABSENT and eid > self.frontier:
                self._known_end(eid)
            elif out is ReadOutcome.PENDING:
                self._single.pop(eid, None)
                self._ask(eid, [i for i in o.members if i not in o.answered])
        if len(self._o_reads) > n:
            self.mutations.strip_read_terms(self._o_reads)  # tests only

    def _write(self, eid: int, record: bytes, targets: tuple[int, ...]) -> None:
        assert eid not in self.writes
        self.writes[eid] = _WriteBack(eid, record, targets)
        self._incomplete.add(eid)
        for i in targets:
            if i not in self.replacing:  # resent once replaced
                self._o_writes.append(RecoveryWrite(eid, i, self.ensemble[i], record))

    def _inflight(self) -> int:
        """Write-backs not yet complete (O(1): called on every decision and ack)."""
        return len(self._incomplete)

    def _recovered(self, eid: int, e: entry_codec.Entry) -> None:
        assert self.frozen_lac is not None
        # The truncate flag already did its work on every bookie; resending it
        # would delete the entries above, which this recovery still has to read.
        flags = e.data_flags & ~entry_codec.FLAG_TRUNCATE
        flags = self.mutations.writeback_flags(flags, e.data_flags)  # tests only
        rec = entry_codec.encode(self.ledger_id, eid, e.payload, lac=self.frozen_lac, lafr=self.frozen_lafr,
                                 data_flags=flags, req_flags=entry_codec.REQ_RECOVERY, term=self.term,
                                 origin=e.origin)  # what the entry is: copied, as the payload
        self.recovered.append(eid)
        self._write(eid, rec, write_set(eid, self.E, self.Qw))

    def _absent(self, eid: int) -> None:
        assert self.frozen_lac is not None
        if eid <= self.frozen_lac:
            return self._end(RecoveryEvent.ABORT, f"entry {eid} <= LAC {self.frozen_lac} read as absent: data loss")
        self._step(RecoveryEvent.END_FOUND)
        self.end_entry = eid
        self._drop_window(above=None)
        if self.unbounded:
            noop = entry_codec.encode(
                self.ledger_id, eid, b"", lac=self.frozen_lac, lafr=self.frozen_lafr,
                data_flags=entry_codec.FLAG_NOOP | entry_codec.FLAG_TRUNCATE,
                req_flags=entry_codec.REQ_RECOVERY, term=self.term)
            noop = self.mutations.recovery_noop(noop)  # tests only
            self._write(eid, noop, tuple(range(self.E)))  # every bookie, not just Qw
        self.mutations.after_end_found(self)  # tests only
        self._progress()

    def _progress(self) -> None:
        if self.state is RecoveryState.READING:
            self._advance()
        elif self.state is RecoveryState.FINISHING:
            if self.replacing or self._inflight():
                return
            assert all(wb.complete for wb in self.writes.values())
            self._step(RecoveryEvent.ALL_WRITTEN)
            end = self.end_entry
            last = end if self.unbounded else end - 1
            change = None
            if tuple(self.ensemble) != self.read_ensemble:
                change = (self.start_entry, tuple(self.ensemble))
            self._result = RecoveryResult(
                last_entry=last, lac=last, next_entry=last + 1,
                noop_entry=end if self.unbounded else None,
                recovered=tuple(self.recovered), ensemble_change=change)
            assert last >= self.start_entry - 1
