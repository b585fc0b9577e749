"""A simulated bookie: the real ``bookie.core.BookieCore`` over a simulated disk.

Every decision is the core's, executed here as ``bookie/storage.py`` executes
it: admission, the fence barrier (``fence_read``), the pending normal adds,
and replay (``replay`` of the same journal record types and bodies as
``bookie/journal_record.py``'s, a record's location being its index in the list
shifted by ``bookie.index.OFFSET_BITS``).  The order of effects:

- an add is admitted on receipt (``admit_add``: term/fence rules; raises the
  in-memory term), appended to the journal's *unsynced* tail, and applied
  (``apply_add``: index, LAC/LAFR, truncation) only once a simulated fsync
  made it durable; its answer goes out after that;
- a term-carrying or fencing read changes the term/fence at once and waits
  for the core's barrier (``BookieCore.fence_read``): ``sim/world.py``
  answers it after the journal's next scheduled sync while normal adds
  admitted before it are pending (the pending add window), at once
  otherwise;
- a plain read (term 0, no fence flag) answers from the applied state;
- a crash drops the unsynced tail (and with it the in-memory term raises of
  adds admitted but not yet durable); a restart rebuilds a fresh
  ``BookieCore`` by replaying the durable journal through
  ``BookieCore.replay``, as ``Storage.open`` does.  No disk is ever lost.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bookie import entry as E
from bookie.core import Barrier, BookieCore, Status
from bookie.index import OFFSET_BITS
from bookie.journal_record import DELETE_BODY, LAC_BODY, R_DELETE, R_ENTRIES, R_LAC, R_STATE

_BARRIER = {Barrier.NONE: None, Barrier.SYNC: "sync", Barrier.JOURNAL_STATE: "state"}


@dataclass(slots=True)
class AddResult:
    """The answer to one entry of an add frame."""

    entry_id: int
    status: Status
    term: int = 0


@dataclass(slots=True)
class _PendingFrame:
    results: list[AddResult]
    waiting: int                     # accepted entries not yet durable
    reply: object                    # callback(results)


@dataclass(slots=True)
class SimBookie:
    bid: str
    ledger_id: int
    core: BookieCore = field(default_factory=BookieCore)
    # durable: (record type, body), bookie/journal_record.py's (an R_ENTRIES body holds one record)
    journal: list[tuple[int, bytes]] = field(default_factory=list)
    # (record, header, frame, pending counts) | ((lac, lafr), None, frame, None)
    unsynced: list[tuple] = field(default_factory=list)
    up: bool = True
    incarnation: int = 0
    durable_term: int = 0                                  # the term a restart would rebuild
    fsyncs: int = 0
    truncated: int = 0                                     # entries a truncate no-op removed

    # -- adds ---------------------------------------------------------------------

    def add_frame(self, records: list[bytes], reply) -> list[bool]:
        """Admits each record; returns which were admitted.  The frame is
        answered once those are durable (at once if none was)."""
        frame = _PendingFrame([], 0, reply)
        for rec in records:
            h = E.parse_header(rec)
            v = self.core.admit_add(h)
            if v.status is Status.OK:
                frame.results.append(AddResult(h.entry_id, Status.OK))
                frame.waiting += 1
                self.unsynced.append((rec, h, frame, self.core.adds_pending(E.scan_runs(rec))))
            else:
                frame.results.append(AddResult(h.entry_id, v.status, v.term))
        if frame.waiting == 0:
            reply(frame.results)
        return [r.status is Status.OK for r in frame.results]

    def write_lac(self, lac: int, lafr: int, term: int, reply):
        """``Storage.write_lac``: admitted like an add (term, fence; never
        creates the ledger), journalled, applied once durable."""
        v = self.core.admit_lac(self.ledger_id, term)
        if v.status is Status.OK:
            self.unsynced.append(((lac, lafr), None, _PendingFrame([AddResult(-1, Status.OK)], 1, reply), None))
        return v

    def fsync(self) -> list[tuple[bytes, object]]:
        """Makes the unsynced tail durable and applies it in journal order;
        answers the frames it completes.  Returns what it applied, for the
        trace: (record, header) for an add, ((lac, lafr), None) for an
        explicit LAC."""
        applied = []
        done = []
        for rec, h, frame, pending in self.unsynced:
            if h is None:
                self._journal(R_LAC, LAC_BODY.pack(self.ledger_id, *rec))
            else:
                if h.is_truncate:
                    st = self.core.ledgers.get(self.ledger_id)
                    self.truncated += sum(1 for _ in st.index.iter_from(h.entry_id + 1, 1 << 62)) if st else 0
                self._journal(R_ENTRIES, rec)
                self.core.adds_settled(pending)
                self.durable_term = max(self.durable_term, h.term)
            applied.append((rec, h))
            frame.waiting -= 1
            if frame.waiting == 0:
                done.append(frame)
        self.unsynced = []
        self.fsyncs += 1
        for frame in done:
            frame.reply(frame.results)
        return applied

    def prepare(self, first_entry: int, term: int):
        """``Storage.prepare`` for a bookie joining a fragment: the term rule
        of a fencing read, then the entries >= first_entry go, journalled
        after everything admitted before (the caller fsyncs first, so this
        bookie's unsynced tail is empty)."""
        assert not self.unsynced, "prepare goes after the adds admitted before it"
        v = self.core.prepare(self.ledger_id, first_entry, term)
        if v.status is Status.OK:
            self.journal_state()
            self.journal.append((R_DELETE, DELETE_BODY.pack(self.ledger_id, True, first_entry, (1 << 63) - 1)))
            self.core.apply_prepare(self.ledger_id, first_entry)
        return v

    # -- reads ----------------------------------------------------------------------

    def fence_request(self, term: int, fence: bool):
        """``Storage.fence`` for a term-carrying or fencing read: the term and
        fence change at once.  Returns (verdict, barrier): "state" when the
        change must be journalled (its sync makes everything before it durable
        first), "sync" while normal adds of the ledger admitted before it, or
        its term/fence, are not yet durable, None otherwise (the core's
        ``fence_read``).  The caller fsyncs for a barrier, then calls journal_state()
        for "state", then answers."""
        v, barrier = self.core.fence_read(self.ledger_id, term, fence)
        return v, _BARRIER[barrier]

    def journal_state(self) -> None:
        assert not self.unsynced, "the state record goes after the adds before it"
        self._journal(R_STATE, self.core.state_body(self.ledger_id))
        self.durable_term = max(self.durable_term, self.core.term_of(self.ledger_id))

    def _journal(self, rtype: int, body: bytes) -> None:
        """Appends a durable record and applies it as replay will."""
        loc = len(self.journal) << OFFSET_BITS
        self.journal.append((rtype, body))
        self.core.replay(rtype, body, loc)

    def lac_answer(self) -> tuple[Status, int, int, int, int]:
        """(status, lac, lafr, term, last entry held) from the applied state."""
        info = self.core.lac_info(self.ledger_id)
        if info is None:
            return Status.NO_SUCH_LEDGER, -1, -1, 0, -1
        return Status.OK, info.lac, info.lafr, info.term, info.last_entry

    def entry_answer(self, entry_id: int) -> tuple[Status, bytes | None]:
        """(status, record) from the applied state."""
        status, loc = self.core.lookup(self.ledger_id, entry_id)
        if status is not Status.OK:
            return status, None
        return Status.OK, self.record_at(loc[0])

    # -- crash and restart -----------------------------------------------------------

    def crash(self) -> int:
        """Loses the unsynced tail and all memory; rebuilds the core from the
        durable journal (what a restart will serve).  Returns how many
        admitted adds were lost."""
        lost = len(self.unsynced)
        self.unsynced = []
        self.up = False
        self.incarnation += 1
        self.core = self.replay()
        return lost

    def restart(self) -> None:
        assert not self.up
        self.up = True

    def replay(self) -> BookieCore:
        core = BookieCore()
        for i, (rtype, body) in enumerate(self.journal):
            core.replay(rtype, body, i << OFFSET_BITS)
        return core

    # -- state, for invariants and the trace checker -----------------------------------

    def record_at(self, loc: int) -> bytes:
        rtype, rec = self.journal[loc >> OFFSET_BITS]
        assert rtype == R_ENTRIES and loc & ((1 << OFFSET_BITS) - 1) == 0
        return rec

    def entries(self) -> dict[int, int]:
        """entry id -> journal location, of the applied (durable) entries."""
        st = self.core.ledgers.get(self.ledger_id)
        if st is None:
            return {}
        return {eid: loc for eid, loc, _ in st.index.iter_all()}
