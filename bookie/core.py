"""The bookie's protocol core: per-ledger state and its rules, with no I/O.

Everything a bookie *decides* lives here: whether an add is admitted (term,
fence, read-only), how a fencing or term-carrying read changes a ledger, what
a truncate no-op removes, what a read may answer.  The server (bookie/server.py)
and the storage (bookie/storage.py) only move bytes around these decisions, and
the same core replays the journal after a restart.

Adds go through two steps, as in a write-ahead log:

1. ``admit_add`` (on receipt): checks the request against the ledger's term,
   fence and the bookie's mode, and raises the ledger's term.  Nothing is
   readable yet.  A normal add counts as *pending* (``adds_pending``) until
   it is applied or its write failed (``adds_settled``).
2. ``apply_add`` (once the record is durable, in journal order): makes the entry
   readable, raises LAC/LAFR, and for a truncate no-op removes every higher
   entry of the ledger.

The core also owns the fence barrier (``fence_read``: what a fencing or
term-carrying read must wait for before it answers), the read-only
transitions (``judge_disk``), and the decoding of journal records on replay
(``replay``: the same code for ``bookie/storage.py`` and ``sim/bookie.py``).

Rules (../shared/notes/protocol-rules.md):

============================== ===============================================
request                        rule
============================== ===============================================
any request carrying a term    term < ledger term: INVALID_TERM, nothing
                               changes; otherwise the ledger's term becomes
                               the request's term
normal add                     refused with FENCED on a fenced ledger, with
                               READ_ONLY on a read-only bookie, and with
                               READ_ONLY for a ledger older than the
                               bookie's rejoin (below)
recovery add                   accepted on a fenced ledger and in read-only
truncate no-op at e            once durable, deletes every entry > e
fencing read (READ_FENCE)      sets the fence; creates the ledger if unknown,
                               so that a late writer is fenced too
fencing or term-carrying read  a changed term/fence is journalled before the
                               answer (barrier JOURNAL_STATE); unchanged, it
                               waits for the ledger's pending *normal* adds,
                               and for a term/fence not yet durable (barrier
                               SYNC), so that it never answers NO_SUCH_ENTRY
                               for an entry about to be acked, nor from a
                               state a restart would forget
delete                         unknown ledger: NO_SUCH_LEDGER
copy's clearing (a range       token < the ledger's copy token: FENCED,
delete with a copy token)      nothing changes; otherwise the ledger's copy
                               token becomes the request's, and the range is
                               deleted once durable; an unknown ledger's
                               state is created to hold the token (a copier
                               paused past its etcd lock must not clear what
                               a later copy published)
the bookie's own clearing of   a range reaching past the last fragment's
over-replicated entries        start and a request admitted for the ledger
(``admit_gc_clear``)           since the collector read its metadata:
                               nothing changes; its lock's token < the copy
                               token: FENCED; otherwise a copy's clearing of
                               each range (the state stays)
disk usage                     read-only at >= threshold; writable again
                               below threshold - margin
``halt`` (etcd no longer the   read-only for good (until a restart, which
one the cookie names, gone     its cookie check then refuses: bookie/cookie.py
back in time, or lost writes;  ``halt``; a broken journal's until a restart),
a journal broken)              prepares READ_ONLY too
normal read                    no term, no state change; unknown ledger:
                               NO_SUCH_LEDGER; missing entry: NO_SUCH_ENTRY
LAC, LAFR                      never go down
a record's LAFR and LAC        below its entry id, or BAD_REQUEST for the
                               frame (a recovery add's LAC excepted: it is
                               the LAC frozen when recovery began, rule 7)
a term above MAX_TERM          BAD_REQUEST, nothing changes (a term must leave
                               room for a successor that fences it)
master key (ledger password)   the request that creates a ledger's state sets
                               its verifier (``verifier_of`` its key; none
                               for an empty key); an add, fencing or
                               term-carrying read, explicit LAC, prepare or
                               delete whose key's verifier differs:
                               UNAUTHORIZED_ACCESS, checked first, nothing
                               changes.  Normal reads are not checked.
============================== ===============================================

A bookie that lost its disk and took its old id again (bookie/cookie.py:
once no ledger names it, by ``--on-lost-disk rejoin`` or ``bookies cookie
delete``) lost the fences and terms it held.  A writer cut off since (a zombie: its ledger recovered or
taken over without it, then the lost bookie replaced in that fragment)
still holds an ensemble naming it, and the fence it raised there counted
among the Qw - Qa + 1 of its write set: its normal adds would find one more
bookie accepting them than the recovery left, Qa with one that was never
fenced, and be acknowledged past the ledger's end.  So ``rejoined_at`` (the
etcd revision its cookie was stamped over the released one at; 0: never): a
normal add or a prepare for a ledger whose id (a revision too) is below it
gets READ_ONLY, state or not; recovery adds (autorecovery's copies),
fencing and term-carrying reads and reads are as on any bookie.  Its
registration carries ``rejoined_at`` and placement leaves it out of those
ledgers' changes and rolls (``stream.placement.rejoined_after``); a writer
that chose it before seeing the registration has its add replaced
elsewhere (classic ledgers), a stream's joining bookie chosen again.  The
ledgers created after the rejoin use it fully.  (tla/BookstreamRejoin.tla:
without the rule, mutant ``no_barrier``, TLC finds the zombie's add
acknowledged past the closed end.)

The master key is BookKeeper's: the client derives it from the ledger's
password (stream/password.py) and never sends the password.  The bookie keeps
a verifier, SHA-256 over a domain tag and the key, not the key itself: its
disk (journal R_KEY records, checkpoints) holds nothing a request could
carry.  Adds pay one hash per frame (``Storage.admit_frame``) and one bytes
compare per run; a ledger without a password compares two empty strings.
"""
from __future__ import annotations

import enum
import hashlib
import struct
from array import array
from dataclasses import dataclass, field

from bookie.entry import FLAG_TRUNCATE, REQ_RECOVERY, EntryHeader, EntryRun, parse_header, scan_runs
from bookie.index import LedgerIndex, Removed
from bookie.journal_record import (
    CLEAR_BODY, DELETE_BODY, KEY_BODY, LAC_BODY, R_CLEAR, R_DELETE, R_ENTRIES, R_KEY, R_LAC, R_RELOCATED, R_STATE,
    STATE_BODY,
)

# The highest term a request may carry.  A ledger at term T can be taken
# over only at T + 1; a term at the top of its field (u64 on the wire, i64 in
# Java's BookKeeper) would leave no successor and the ledger could never be
# recovered again.  2^63 - 1 keeps T + 1 inside every field that holds it.
MAX_TERM = (1 << 63) - 1

_U32 = struct.Struct("<I")

_KEY_DOMAIN = b"bookstream ledger master key\0"
VERIFIER_SIZE = 32


def verifier_of(master_key) -> bytes:
    """What a bookie keeps of a ledger's master key: SHA-256 over a domain
    tag and the key (b"" for an empty key: a ledger without a password)."""
    if not master_key:
        return b""
    return hashlib.sha256(_KEY_DOMAIN + bytes(master_key)).digest()


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
    UNAUTHORIZED_ACCESS = 11


@dataclass(slots=True)
class BookieLedger:
    """What a bookie keeps for one ledger besides its entries' bytes."""

    term: int = 0
    fenced: bool = False
    lac: int = -1
    lafr: int = -1
    index: LedgerIndex = field(default_factory=LedgerIndex)
    verifier: bytes = b""   # verifier_of(the ledger's master key); b"": no password
    # The term and fence as far as they are durable (a journalled state
    # change or a durable add made them so): what a restart would rebuild.
    # ``term``/``fenced`` above run ahead of them while a change is on its
    # way to the disk; ``fence_read`` makes a read wait for that.
    durable_term: int = 0
    durable_fenced: bool = False
    # The highest fencing token of a copy's clearing admitted (``admit_clear``):
    # the revision of the etcd lock the ledger's copies run under.
    copy_token: int = 0
    # Requests admitted that may bring entries or change the state (adds,
    # LACs, fencing and term-carrying requests, prepares, clearings,
    # deletions), in memory only: the over-replicated collection
    # (``admit_gc_clear``) clears a ledger only if none came since it read
    # the metadata.
    touched: int = 0

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
    key_learned: bool = False   # the request created the ledger's state with a verifier: journal it (R_KEY)


class Barrier(enum.Enum):
    """What a fencing or term-carrying read waits for before it answers."""

    NONE = "none"                    # answer at once
    SYNC = "sync"                    # pending normal adds, or the state, durable (a journal sync)
    JOURNAL_STATE = "journal_state"  # its changed term/fence journalled (``state_body``), then answer


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
        self.halted = ""       # why it is read-only for good (``halt``); "" while not
        self.rejoined_at = 0   # ledgers below it take no normal add, no prepare (the module's doc)
        # ledger -> normal adds admitted but not yet applied (the fence barrier)
        self.pending: dict[int, int] = {}

    # -- adds ----------------------------------------------------------------

    def admit_add(self, h: EntryHeader | EntryRun, verifier: bytes = b"") -> Verdict:
        """Step 1 of an add: the master key, term and fence rules, on
        receipt.  ``verifier``: ``verifier_of`` the frame's master key."""
        st = self.ledgers.get(h.ledger_id)
        if st is not None and st.verifier != verifier:
            return Verdict(Status.UNAUTHORIZED_ACCESS)
        if h.term > MAX_TERM:
            return Verdict(Status.BAD_REQUEST, st.term if st else 0)
        if st is not None and h.term < st.term:
            return Verdict(Status.INVALID_TERM, st.term)
        if not h.is_recovery:
            if st is not None and st.fenced:
                return Verdict(Status.FENCED, st.term)
            if self.read_only or h.ledger_id < self.rejoined_at:
                return Verdict(Status.READ_ONLY, st.term if st else 0)
        learned = False
        if st is None:
            st = self.ledgers[h.ledger_id] = BookieLedger(verifier=verifier)
            learned = bool(verifier)
        changed = h.term > st.term
        st.term = h.term if changed else st.term
        st.touched += 1
        return Verdict(Status.OK, st.term, changed, learned)

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
        if term > st.durable_term:
            st.durable_term = term
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
            dead += st.index.put_run(run.first_entry, locs, run.lengths, adjacent=True)
            return dead
        return st.index.put_run(run.first_entry, locs, run.lengths, adjacent=True)  # (a run's records: one span)

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

    def admit_lac(self, ledger_id: int, term: int, verifier: bytes = b"") -> Verdict:
        """An explicit LAC from the writer: the same key, term and fence
        rules as a normal add (it never creates a ledger: NO_SUCH_LEDGER)."""
        st = self.ledgers.get(ledger_id)
        if st is not None and st.verifier != verifier:
            return Verdict(Status.UNAUTHORIZED_ACCESS)
        if term > MAX_TERM:
            return Verdict(Status.BAD_REQUEST, st.term if st else 0)
        if st is None:
            return Verdict(Status.NO_SUCH_LEDGER)
        if term < st.term:
            return Verdict(Status.INVALID_TERM, st.term)
        if st.fenced:
            return Verdict(Status.FENCED, st.term)
        st.touched += 1
        return Verdict(Status.OK, st.term)

    def apply_lac(self, ledger_id: int, lac: int, lafr: int) -> None:
        """Once durable (and on replay): LAC and LAFR only go up."""
        st = self.ledgers.get(ledger_id)
        if st is None:
            return
        st.lac = max(st.lac, lac)
        st.lafr = max(st.lafr, lafr)

    # -- term-carrying and fencing requests ----------------------------------

    def fence(self, ledger_id: int, term: int, fence: bool, verifier: bytes = b"") -> Verdict:
        """A fencing LAC read or a recovery read (ReadEntry, or ReadRange
        with its sparse read-ahead: the same rule): raise the term and/or set
        the classic fence.  Creates the ledger's state if the bookie has never
        seen it, so that a writer that reaches this bookie later is refused."""
        assert term >= 0
        st = self.ledgers.get(ledger_id)
        if st is not None and st.verifier != verifier:
            return Verdict(Status.UNAUTHORIZED_ACCESS)
        if term > MAX_TERM:
            return Verdict(Status.BAD_REQUEST, st.term if st else 0)
        if st is not None and term < st.term:
            return Verdict(Status.INVALID_TERM, st.term)
        created = st is None
        if st is None:
            st = self.ledgers[ledger_id] = BookieLedger(verifier=verifier)
        changed = created or term > st.term or (fence and not st.fenced)
        st.term = max(st.term, term)
        st.fenced = st.fenced or fence
        st.touched += 1
        return Verdict(Status.OK, st.term, changed, created and bool(verifier))

    def prepare(self, ledger_id: int, first_entry: int, term: int, verifier: bytes = b"") -> Verdict:
        """A bookie joining a fragment (term mode) that starts at
        ``first_entry``: the term rule of :meth:`fence` (a lower term gets
        INVALID_TERM; the ledger's term is raised).  Once the change is
        journalled, :meth:`apply_prepare` deletes the entries >= first_entry:
        an older term's leftovers, never entries of the new fragment."""
        assert first_entry >= 0
        if ledger_id < self.rejoined_at or self.halted:
            st = self.ledgers.get(ledger_id)
            return Verdict(Status.READ_ONLY, st.term if st else 0)
        return self.fence(ledger_id, term, False, verifier)

    def apply_prepare(self, ledger_id: int, first_entry: int) -> Removed:
        return self.delete(ledger_id, (first_entry, (1 << 63) - 1)) if ledger_id in self.ledgers else []

    def apply_state(self, ledger_id: int, term: int, fenced: bool) -> None:
        """A journalled state change, once durable (and on replay)."""
        st = self.ledgers.setdefault(ledger_id, BookieLedger())
        st.term = max(st.term, term)
        st.fenced = st.fenced or fenced
        st.durable_term = max(st.durable_term, term)
        st.durable_fenced = st.durable_fenced or fenced

    def fence_read(self, ledger_id: int, term: int, fence: bool, verifier: bytes = b"") -> tuple[Verdict, Barrier]:
        """:meth:`fence`, and what the read must wait for before answering
        (:class:`Barrier`): a change is journalled first (its sync makes every
        add admitted before it durable and applied first).  An unchanged state
        waits for a journal sync (SYNC) while

        - *normal* adds of the ledger are pending, so that they are readable
          when it answers (a recovery read never says NO_SUCH_ENTRY for an
          entry an older writer is about to see acked); or
        - the state itself is not durable yet (an earlier read's change, or a
          recovery add that raised the term, still on its way to the disk):
          the answer must not speak for a term a restart would forget, and
          recovery adds of an older term admitted before that change (an
          older recoverer's truncate no-op, say) are applied before it.

        Otherwise *recovery* adds pending need no wait: at the ledger's own
        term they are the reader's own write-backs, of entries that exist
        elsewhere."""
        v = self.fence(ledger_id, term, fence, verifier)
        if v.status is not Status.OK:
            return v, Barrier.NONE
        if v.state_changed:
            return v, Barrier.JOURNAL_STATE
        st = self.ledgers[ledger_id]
        if ledger_id in self.pending or st.term != st.durable_term or st.fenced != st.durable_fenced:
            return v, Barrier.SYNC
        return v, Barrier.NONE

    def state_body(self, ledger_id: int) -> bytes:
        """The R_STATE journal record of a ledger's term and fence."""
        st = self.ledgers[ledger_id]
        return STATE_BODY.pack(ledger_id, st.term, int(st.fenced))

    def key_body(self, ledger_id: int) -> bytes:
        """The R_KEY journal record of a ledger's verifier (written once,
        when a request creates the ledger's state with one: ``key_learned``)."""
        return KEY_BODY.pack(ledger_id) + self.ledgers[ledger_id].verifier

    def apply_key(self, ledger_id: int, verifier: bytes) -> None:
        """Replay of an R_KEY record (it precedes the ledger's other records)."""
        self.ledgers.setdefault(ledger_id, BookieLedger()).verifier = verifier

    # -- pending normal adds (the fence barrier) ------------------------------

    def adds_pending(self, runs: list[EntryRun]) -> dict[int, int]:
        """Counts the normal adds of admitted ``runs`` as pending until
        :meth:`adds_settled` with the returned counts (once applied, or once
        their write failed)."""
        counts: dict[int, int] = {}
        for run in runs:
            if not run.req_flags & REQ_RECOVERY:
                counts[run.ledger_id] = counts.get(run.ledger_id, 0) + run.count
        pending = self.pending
        for lid, n in counts.items():
            pending[lid] = pending.get(lid, 0) + n
        return counts

    def adds_settled(self, counts: dict[int, int]) -> None:
        pending = self.pending
        for lid, n in counts.items():
            left = pending.get(lid, 0) - n
            if left > 0:
                pending[lid] = left
            else:
                pending.pop(lid, None)

    # -- read-only mode ----------------------------------------------------------

    def judge_disk(self, used_fraction: float, threshold: float, margin: float) -> bool:
        """Read-only once the disk is used at ``threshold`` or above; writable
        again only below ``threshold - margin`` (no flapping).  Returns
        whether the mode changed."""
        before = self.read_only
        if not before and used_fraction >= threshold:
            self.read_only = True
        elif before and used_fraction < threshold - margin and not self.halted:
            self.read_only = False
        return before != self.read_only

    def halt(self, why: str) -> bool:
        """Read-only for good, whatever the disk: the metadata this bookie's
        data answers to is gone (bookie/cookie.py ``check_revision``, an
        etcd restored without its revisions bumped, or no longer the one its
        cookie names), or its journal can write nothing more (a failed write
        it could not take back: bookie/journal.py ``broken``).  Returns
        whether it was not halted before."""
        first = not self.halted
        self.halted = self.halted or why
        self.read_only = True
        return first

    # -- replay --------------------------------------------------------------

    def apply_entries(self, runs: list[EntryRun], base: int) -> Removed:
        """Applies durable entry runs (their records at ``base + offset``);
        returns what they made dead."""
        dead: Removed = []
        at = base.__add__
        for run in runs:
            d = self.apply_run(run, array("Q", map(at, run.offsets)))
            if d:
                dead += d
        return dead

    def apply_relocated(self, body, base: int, runs: list[EntryRun] | None = None) -> list[tuple[int, int, int]]:
        """Applies an R_RELOCATED body (u32 n, n x u64 old location, then the
        n records, at ``base + offset``): returns (old, new, length) of each
        record followed (the others changed since)."""
        (n,) = _U32.unpack_from(body, 0)
        olds = struct.unpack_from(f"<{n}Q", body, 4)
        rec_start = 4 + 8 * n
        if runs is None:
            runs = scan_runs(body[rec_start:])
        moved, k = [], 0
        for run in runs:
            for j, (off, size) in enumerate(zip(run.offsets, run.lengths)):
                old, k = olds[k], k + 1
                new = base + rec_start + off
                if self.apply_relocation(run.ledger_id, run.first_entry + j, old, new, size):
                    moved.append((old, new, size))
        return moved

    def replay(self, rtype: int, body, base: int, runs: list[EntryRun] | None = None) -> None:
        """Applies one durable journal record (bookie/journal_record.py
        types), its body at location ``base``: how a restart rebuilds the
        state, in ``Storage.open`` and in the simulated bookie alike."""
        if rtype == R_ENTRIES:
            self.apply_entries(runs if runs is not None else scan_runs(body), base)
        elif rtype == R_STATE:
            lid, term, fenced = STATE_BODY.unpack(body)
            self.apply_state(lid, term, bool(fenced))
        elif rtype == R_DELETE:
            lid, has_range, first, last = DELETE_BODY.unpack(body)
            self.delete(lid, (first, last) if has_range else None)
        elif rtype == R_LAC:
            self.apply_lac(*LAC_BODY.unpack(body))
        elif rtype == R_RELOCATED:
            self.apply_relocated(body, base, runs)
        elif rtype == R_KEY:
            (lid,) = KEY_BODY.unpack_from(body, 0)
            self.apply_key(lid, bytes(body[KEY_BODY.size:]))
        elif rtype == R_CLEAR:
            self.apply_clear(*CLEAR_BODY.unpack(body))
        else:
            raise ValueError(f"unknown journal record type {rtype}")

    def restore(self, ledger_id: int, term: int, fenced: bool, lac: int, lafr: int, index: LedgerIndex,
                verifier: bytes = b"", copy_token: int = 0) -> None:
        """A ledger's state as a checkpoint holds it."""
        self.ledgers[ledger_id] = BookieLedger(term, fenced, lac, lafr, index, verifier, term, fenced, copy_token)

    # -- reads ---------------------------------------------------------------

    def term_of(self, ledger_id: int) -> int:
        """The ledger's term (0 if unknown): what answers carry."""
        st = self.ledgers.get(ledger_id)
        return st.term if st is not None else 0

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

    def admit_delete(self, ledger_id: int, verifier: bytes = b"") -> Status:
        st = self.ledgers.get(ledger_id)
        if st is None:
            return Status.NO_SUCH_LEDGER
        if st.verifier != verifier:
            return Status.UNAUTHORIZED_ACCESS
        st.touched += 1
        return Status.OK

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

    def admit_clear(self, ledger_id: int, token: int, verifier: bytes = b"") -> Verdict:
        """A copy's clearing of its target's range, carrying its fencing
        token (the revision of the etcd lock the copy runs under; etcd
        revisions only grow, so a later holder's is higher).  Below the
        ledger's copy token: FENCED (a copier paused past its lock, whose
        clearing would delete what a later copy published here).  Otherwise
        the token is raised at once (a lower one arriving before this one is
        durable is refused too); :meth:`apply_clear` deletes the range once
        the R_CLEAR record is durable.  An unknown ledger's state is created
        to hold the token (``key_learned`` as for :meth:`fence`): a later
        copy may create it by its adds, and an older clearing arriving after
        them must still be refused."""
        assert token > 0
        st = self.ledgers.get(ledger_id)
        if st is not None and st.verifier != verifier:
            return Verdict(Status.UNAUTHORIZED_ACCESS)
        if st is not None and token < st.copy_token:
            return Verdict(Status.FENCED, st.term)
        created = st is None
        if st is None:
            st = self.ledgers[ledger_id] = BookieLedger(verifier=verifier)
        st.copy_token = token
        st.touched += 1
        return Verdict(Status.OK, st.term, True, created and bool(verifier))

    def admit_gc_clear(self, ledger_id: int, token: int, touched: int | None) -> Status | None:
        """The bookie's own clearing of entry ranges of a ledger whose
        metadata, read under the ledger's recovery lock, names this bookie
        for none of them (bookie/ledger_gc.py).  ``touched``: the ledger's
        count as it stood before that read, when a range reaches past the
        last fragment's start (a fragment naming this bookie may be published
        there after the read; below it fragments are sealed); None: not
        asked.  A request admitted since (a writer's fragment published and
        prepared or written after the read, a take-over's recovery): None,
        nothing changes.  ``token`` (the lock's) below the ledger's copy
        token: FENCED (a later holder's copy is at work here).  Otherwise OK,
        the token raised as a copy's clearing raises it (an older copier's
        clearing is refused from now on), and the caller journals an R_CLEAR
        of each range (``clear_body``).  The state (term, fence, key) stays:
        a writer fenced here stays fenced."""
        assert token > 0
        st = self.ledgers.get(ledger_id)
        if st is None or (touched is not None and st.touched != touched):
            return None
        if token < st.copy_token:
            return Status.FENCED
        st.copy_token = token
        return Status.OK

    def touched_of(self, ledger_id: int) -> int | None:
        """The ledger's count of admitted requests (None: unknown ledger)."""
        st = self.ledgers.get(ledger_id)
        return None if st is None else st.touched

    def clear_body(self, ledger_id: int, first: int, last: int) -> bytes:
        """The R_CLEAR journal record of an admitted clearing."""
        return CLEAR_BODY.pack(ledger_id, first, last, self.ledgers[ledger_id].copy_token)

    def apply_clear(self, ledger_id: int, first: int, last: int, token: int) -> Removed:
        """A durable R_CLEAR (and its replay): the token kept, the range deleted."""
        st = self.ledgers.setdefault(ledger_id, BookieLedger())
        st.copy_token = max(st.copy_token, token)
        return st.index.delete_range(first, last)

    @property
    def entry_count(self) -> int:
        return sum(len(st.index) for st in self.ledgers.values())
