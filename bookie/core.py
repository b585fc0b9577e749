"""The bookie's protocol core: per-ledger state and its rules, with no I/O.

Everything a bookie *decides* lives here: whether an add is admitted (term,
fence, read-only), how a fencing or term-carrying read changes a ledger, what
a truncate no-op removes, what a read may answer.  The server (bookie/server.py)
and the storage (bookie/storage.py) only move bytes around these decisions, and
the same core replays the journal after a restart.

Adds go through two steps, as in a write-ahead log:

1. ``admit_add`` (on receipt): checks the request against the ledger's term,
   fence and the bookie's mode, and raises the ledger's term.  Nothing is
   readable yet.
2. ``apply_add`` (once the record is durable, in journal order): makes the entry
   readable, raises LAC/LAFR, and for a truncate no-op removes every higher
   entry of the ledger.

Rules (../shared/notes/protocol-rules.md):

============================== ===============================================
request                        rule
============================== ===============================================
any request carrying a term    term < ledger term: INVALID_TERM, nothing
                               changes; otherwise the ledger's term becomes
                               the request's term
normal add                     refused with FENCED on a fenced ledger, with
                               READ_ONLY on a read-only bookie
recovery add                   accepted on a fenced ledger and in read-only
truncate no-op at e            once durable, deletes every entry > e
fencing read (READ_FENCE)      sets the fence; creates the ledger if unknown,
                               so that a late writer is fenced too
normal read                    no term, no state change; unknown ledger:
                               NO_SUCH_LEDGER; missing entry: NO_SUCH_ENTRY
LAC, LAFR                      never go down
a record's LAFR and LAC        below its entry id, or BAD_REQUEST for the
                               frame (a recovery add's LAC excepted: it is
                               the LAC frozen when recovery began, rule 7)
a term above MAX_TERM          BAD_REQUEST, nothing changes (a term must leave
                               room for a successor that fences it)
============================== ===============================================
"""
from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field

from bookie.entry import FLAG_TRUNCATE, EntryHeader, EntryRun, parse_header
from bookie.index import LedgerIndex, Removed

# The highest term a request may carry.  A ledger at term T can be taken
# over only at T + 1; a term at the top of its field (u64 on the wire, i64 in
# Java's BookKeeper) would leave no successor and the ledger could never be
# recovered again.  2^63 - 1 keeps T + 1 inside every field that holds it.
MAX_TERM = (1 << 63) - 1


class Status(enum.IntEnum):
    """The protocol's status codes (values equal proto StatusCode's)."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    INVALID_TERM = 4
    BAD_REQUEST = 5
    READ_ONLY = 6
    CHECKSUM_MISMATCH = 7
    TOO_LARGE = 8
    UNKNOWN_ENTRY = 9
    INTERNAL_ERROR = 10


@dataclass(slots=True)
class BookieLedger:
    """What a bookie keeps for one ledger besides its entries' bytes."""

    term: int = 0
    fenced: bool = False
    lac: int = -1
    lafr: int = -1
    index: LedgerIndex = field(default_factory=LedgerIndex)

    @property
    def last_entry(self) -> int:
        return self.index.last_entry


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to a request, and whether the ledger's persisted state
    (term, fence) changed, in which case it must be journalled before the
    answer goes out."""

    status: Status
    term: int = 0
    state_changed: bool = False


@dataclass(frozen=True, slots=True)
class LacInfo:
    lac: int
    lafr: int
    last_entry: int
    term: int
    fenced: bool


class BookieCore:
    """Per-ledger state of one bookie.  Deterministic; no I/O."""

    def __init__(self) -> None:
        self.ledgers: dict[int, BookieLedger] = {}
        self.read_only = False

    # -- adds ----------------------------------------------------------------

    def admit_add(self, h: EntryHeader | EntryRun) -> Verdict:
        """Step 1 of an add: the term and fence rules, on receipt."""
        st = self.ledgers.get(h.ledger_id)
        if h.term > MAX_TERM:
            return Verdict(Status.BAD_REQUEST, st.term if st else 0)
        if st is not None and h.term < st.term:
            return Verdict(Status.INVALID_TERM, st.term)
        if not h.is_recovery:
            if st is not None and st.fenced:
                return Verdict(Status.FENCED, st.term)
            if self.read_only:
                return Verdict(Status.READ_ONLY, st.term if st else 0)
        if st is None:
            st = self.ledgers[h.ledger_id] = BookieLedger()
        changed = h.term > st.term
        st.term = h.term if changed else st.term
        return Verdict(Status.OK, st.term, changed)

    @staticmethod
    def check_positions(runs: list[EntryRun], buf) -> str | None:
        """Every record of a scanned frame claims a LAFR below its own entry
        id, and, unless it is a recovery add, a LAC below it too: a writer
        can only have confirmed entries it sent before.  (A recovery add
        carries the LAC frozen when recovery began, which may be above the
        entries it writes back.)  Otherwise a bookie's LAC would jump to a
        claimed 10^9 for good.  Returns why the frame is refused, or None.
        Per run first: every record's LAC/LAFR is at most the run's and its
        id at least the run's first, so one comparison clears a usual run;
        only a run that fails it is checked record by record."""
        for run in runs:
            first, recovery = run.first_entry, run.is_recovery
            if run.lafr < first and (recovery or run.lac < first):
                continue
            for off in run.offsets:
                h = parse_header(buf, off)
                if h.lafr >= h.entry_id or (not recovery and h.lac >= h.entry_id):
                    return (f"entry {h.entry_id} of ledger {h.ledger_id} claims LAC {h.lac} / LAFR {h.lafr}: "
                            f"both must be below its id (a recovery add's LAC excepted)")
        return None

    def _applying(self, ledger_id: int, term: int, lac: int, lafr: int) -> BookieLedger:
        """The ledger durable adds apply to, its term, LAC and LAFR raised
        to theirs (never lowered)."""
        st = self.ledgers.get(ledger_id)
        if st is None:  # replay of a ledger deleted after the add was admitted
            st = self.ledgers[ledger_id] = BookieLedger()
        if term > st.term:
            st.term = term
        if lac > st.lac:
            st.lac = lac
        if lafr > st.lafr:
            st.lafr = lafr
        return st

    def apply_add(self, h: EntryHeader, loc: int, length: int) -> Removed:
        """Step 2 of an add, once its record is durable (and on replay).

        Returns the (location, length) of every record the add made dead: an
        overwritten copy, and for a truncate no-op all higher entries."""
        st = self._applying(h.ledger_id, h.term, h.lac, h.lafr)
        dead: Removed = []
        if h.is_truncate:
            dead = st.index.truncate_after(h.entry_id)
        old = st.index.put(h.entry_id, loc, length)
        if old is not None:
            dead.append(old)
        return dead

    def apply_run(self, run: EntryRun, locs: array) -> Removed:
        """``apply_add`` for a run of consecutive entries of one ledger
        (``entry.EntryRun``: a frame's usual content; a truncate no-op is a
        run of its own), at ``locs``: the same state after it, with the
        ledger looked up and the index extended once."""
        st = self._applying(run.ledger_id, run.term, run.lac, run.lafr)
        if run.data_flags & FLAG_TRUNCATE:
            dead = st.index.truncate_after(run.first_entry)
            dead += st.index.put_run(run.first_entry, locs, run.lengths)
            return dead
        return st.index.put_run(run.first_entry, locs, run.lengths)

    def apply_relocation(self, ledger_id: int, entry_id: int, old_loc: int, new_loc: int, length: int) -> bool:
        """Compaction moved a record: follow it, unless the entry changed
        since (deleted, truncated, or rewritten elsewhere)."""
        st = self.ledgers.get(ledger_id)
        if st is None:
            return False
        cur = st.index.get(entry_id)
        if cur is None or cur[0] != old_loc:
            return False
        st.index.put(entry_id, new_loc, length)
        return True

    def admit_lac(self, ledger_id: int, term: int) -> Verdict:
        """An explicit LAC from the writer: the same term and fence rules as
        a normal add (it never creates a ledger: NO_SUCH_LEDGER)."""
        st = self.ledgers.get(ledger_id)
        if term > MAX_TERM:
            return Verdict(Status.BAD_REQUEST, st.term if st else 0)
        if st is None:
            return Verdict(Status.NO_SUCH_LEDGER)
        if term < st.term:
            return Verdict(Status.INVALID_TERM, st.term)
        if st.fenced:
            return Verdict(Status.FENCED, st.term)
        return Verdict(Status.OK, st.term)

    def apply_lac(self, ledger_id: int, lac: int, lafr: int) -> None:
        """Once durable (and on replay): LAC and LAFR only go up."""
        st = self.ledgers.get(ledger_id)
        if st is None:
            return
        st.lac = max(st.lac, lac)
        st.lafr = max(st.lafr, lafr)

    # -- term-carrying and fencing requests ----------------------------------

    def fence(self, ledger_id: int, term: int, fence: bool) -> Verdict:
        """A fencing LAC read or a recovery read (ReadEntry, or ReadRange
        with its sparse read-ahead: the same rule): raise the term and/or set
        the classic fence.  Creates the ledger's state if the bookie has never
        seen it, so that a writer that reaches this bookie later is refused."""
        assert term >= 0
        st = self.ledgers.get(ledger_id)
        if term > MAX_TERM:
            return Verdict(Status.BAD_REQUEST, st.term if st else 0)
        if st is not None and term < st.term:
            return Verdict(Status.INVALID_TERM, st.term)
        created = st is None
        if st is None:
            st = self.ledgers[ledger_id] = BookieLedger()
        changed = created or term > st.term or (fence and not st.fenced)
        st.term = max(st.term, term)
        st.fenced = st.fenced or fence
        return Verdict(Status.OK, st.term, changed)

    def prepare(self, ledger_id: int, first_entry: int, term: int) -> Verdict:
        """A bookie joining a fragment (term mode) that starts at
        ``first_entry``: the term rule of :meth:`fence` (a lower term gets
        INVALID_TERM; the ledger's term is raised).  Once the change is
        journalled, :meth:`apply_prepare` deletes the entries >= first_entry:
        an older term's leftovers, never entries of the new fragment."""
        assert first_entry >= 0
        return self.fence(ledger_id, term, False)

    def apply_prepare(self, ledger_id: int, first_entry: int) -> Removed:
        return self.delete(ledger_id, (first_entry, (1 << 63) - 1)) if ledger_id in self.ledgers else []

    def apply_state(self, ledger_id: int, term: int, fenced: bool) -> None:
        """Replay of a journalled state change."""
        st = self.ledgers.setdefault(ledger_id, BookieLedger())
        st.term = max(st.term, term)
        st.fenced = st.fenced or fenced

    # -- reads ---------------------------------------------------------------

    def lookup(self, ledger_id: int, entry_id: int) -> tuple[Status, tuple[int, int] | None]:
        st = self.ledgers.get(ledger_id)
        if st is None:
            return Status.NO_SUCH_LEDGER, None
        loc = st.index.get(entry_id)
        if loc is None:
            return Status.NO_SUCH_ENTRY, None
        return Status.OK, loc

    def lac_info(self, ledger_id: int) -> LacInfo | None:
        st = self.ledgers.get(ledger_id)
        if st is None:
            return None
        return LacInfo(st.lac, st.lafr, st.last_entry, st.term, st.fenced)

    # -- deletion ------------------------------------------------------------

    def delete(self, ledger_id: int, entry_range: tuple[int, int] | None = None) -> Removed:
        """Deletes a ledger (state included), or the entries of a range."""
        st = self.ledgers.get(ledger_id)
        if st is None:
            return []
        if entry_range is None:
            del self.ledgers[ledger_id]
            return list((loc, ln) for _, loc, ln in st.index.iter_all())
        first, last = entry_range
        return st.index.delete_range(first, last)

    @property
    def entry_count(self) -> int:
        return sum(len(st.index) for st in self.ledgers.values())
