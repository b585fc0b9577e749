"""The writer's pending-add window as a pure state machine (no I/O, no time).

An adapter drives it like etcd-io/raft's RawNode: it feeds inputs (``add``,
``on_ack``, ``on_bookie_failed``, ``on_ensemble_changed``, ...) and drains a
``Ready`` (``ready()``): records to send per bookie, application acks in entry
order, entries released from memory, LAC/LAFR, and at most one ensemble change
proposal for it to publish with a metadata CAS.

Rules (../shared/notes/protocol-rules.md):

- An entry is acknowledged to the application once Qa bookies of its write
  set acked it and every lower entry was acknowledged: LAC moves up one entry
  at a time from its previous value.
- LAFR likewise moves up one entry at a time: it never jumps over an entry
  left at Qa because a later entry reached Qw.
- Guaranteed write quorum (``guaranteed_write_quorum=True``, unbounded
  streams):
  1. an entry is released only once it and every lower entry reached Qw;
  2. an ensemble change carries forward everything from LAFR+1;
  3. a failed bookie that acked a committed entry still below Qw is not
     replaced while that entry needs it (the change waits);
  4. the writer closes only with no pending adds.
  Classic mode (False) releases at LAC and changes from LAC+1; LAFR is then
  not tracked and stays where it started.
- Every pending entry lies in the current (last) fragment, because the new
  fragment starts at the first entry not yet released.
- A new fragment that starts where the current one starts replaces it.
- Rolling by size is an ensemble change with no failure, proposed once every
  sent entry was released (a clean boundary); adds wait meanwhile.
- Delayed ensemble change (BookKeeper's): while failed bookies wait for
  their replacement (held by rule 3, or *deferred*: the adapter found no
  bookie to replace them with, ``on_change_deferred``), adds go on to the
  rest of each write set and are acknowledged at Qa; rule 1 keeps them
  pending (they need Qw), so this lasts until the window is full.  The
  adapter retries after a back-off (``retry_failed``): the failed bookies
  are sent what they miss, and a new failure proposes the change again.

Writer states (h11 style; ``TRANSITIONS`` is the whole table):

================== ================= =================
state              event             next state
================== ================= =================
OPEN               ADD, ACK,         OPEN
                   BOOKIE_FAILED
OPEN               PROPOSE_CHANGE    CHANGING_ENSEMBLE
OPEN               CLOSE             CLOSED
CHANGING_ENSEMBLE  ADD, ACK,         CHANGING_ENSEMBLE
                   BOOKIE_FAILED
CHANGING_ENSEMBLE  ENSEMBLE_CHANGED, OPEN
                   CHANGE_DEFERRED
OPEN, CHANGING     INVALID_TERM,     FENCED
                   CHANGE_REJECTED
OPEN, CHANGING     FAIL              FAILED
FENCED, CLOSED,    (none: terminal; late acks and failures are ignored)
FAILED
================== ================= =================
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from bookie import entry as entry_codec
from bookie.core import Status
from stream.quorum import validate_quorums, write_set
from stream.mutations import NONE as NO_MUTATIONS
from stream.mutations import Mutations

DEFAULT_MAX_PENDING = 10_000


class WriterState(enum.Enum):
    OPEN = "open"
    CHANGING_ENSEMBLE = "changing_ensemble"
    FENCED = "fenced"
    CLOSED = "closed"
    FAILED = "failed"


class WriterEvent(enum.Enum):
    ADD = "add"
    ACK = "ack"
    BOOKIE_FAILED = "bookie_failed"
    PROPOSE_CHANGE = "propose_change"
    ENSEMBLE_CHANGED = "ensemble_changed"
    CHANGE_REJECTED = "change_rejected"
    CHANGE_DEFERRED = "change_deferred"
    INVALID_TERM = "invalid_term"
    CLOSE = "close"
    FAIL = "fail"


S, Ev = WriterState, WriterEvent
TRANSITIONS: dict[WriterState, dict[WriterEvent, WriterState]] = {
    S.OPEN: {
        Ev.ADD: S.OPEN, Ev.ACK: S.OPEN, Ev.BOOKIE_FAILED: S.OPEN,
        Ev.PROPOSE_CHANGE: S.CHANGING_ENSEMBLE, Ev.CLOSE: S.CLOSED,
        Ev.INVALID_TERM: S.FENCED, Ev.CHANGE_REJECTED: S.FENCED, Ev.FAIL: S.FAILED,
    },
    S.CHANGING_ENSEMBLE: {
        Ev.ADD: S.CHANGING_ENSEMBLE, Ev.ACK: S.CHANGING_ENSEMBLE, Ev.BOOKIE_FAILED: S.CHANGING_ENSEMBLE,
        Ev.ENSEMBLE_CHANGED: S.OPEN, Ev.CHANGE_DEFERRED: S.OPEN,
        Ev.INVALID_TERM: S.FENCED, Ev.CHANGE_REJECTED: S.FENCED, Ev.FAIL: S.FAILED,
    },
    S.FENCED: {},
    S.CLOSED: {},
    S.FAILED: {},
}
TERMINAL = frozenset(s for s, t in TRANSITIONS.items() if not t)
del S, Ev


# -- errors ---------------------------------------------------------------------

class WriterError(Exception):
    """Base class; carries the writer state the error was raised in."""

    retriable = False

    def __init__(self, message: str, state: WriterState):
        super().__init__(f"{message} (writer {state.value})")
        self.state = state


class WindowFull(WriterError):
    """Backpressure: the pending-add window is full; retry after acks."""

    retriable = True


class WriterFenced(WriterError):
    """A newer term (or a fence, or a lost metadata CAS) took the ledger over.
    The outcome of a failed pending add is unknown until recovery."""

    def __init__(self, message: str, state: WriterState, term: int = 0):
        super().__init__(message, state)
        self.term = term


class WriterFailed(WriterError):
    """The writer gave up (fatal bookie answer, or the adapter failed it)."""


class WriterUnauthorized(WriterFailed):
    """A bookie refused the ledger's master key (UNAUTHORIZED_ACCESS): no
    other bookie would take it either."""


class WriterClosed(WriterError):
    """The writer was closed."""


class InvalidTransition(WriterError):
    def __init__(self, state: WriterState, event: WriterEvent):
        super().__init__(f"{event.value} not allowed", state)
        self.event = event


# -- outputs --------------------------------------------------------------------

class ChangeReason(enum.Enum):
    FAILURE = "failure"
    ROLL = "roll"


@dataclass(frozen=True, slots=True)
class EnsembleChange:
    """A proposal for the adapter: choose bookies for ``replace`` (indexes of
    ``ensemble``; ROLL: any new ensemble), CAS the fragment into the metadata,
    then call ``on_ensemble_changed(first_entry, new_ensemble)``."""

    first_entry: int
    reason: ChangeReason
    replace: tuple[int, ...]
    ensemble: tuple[str, ...]
    replaces_fragment: bool  # first_entry == the current fragment's first entry


@dataclass(slots=True)
class Send:
    """One batch for one bookie, records in entry order."""

    bookie_index: int
    bookie_id: str
    entry_ids: list[int] = field(default_factory=list)
    records: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class Ready:
    state: WriterState
    lac: int
    lafr: int
    sends: list[Send]
    acked: list[int]                                 # application acks, in order
    failed: list[tuple[int, WriterError]]            # pending adds that failed
    released: list[int]                              # freed from memory
    ensemble_change: EnsembleChange | None


class _Pending:
    """An add not yet released (a plain class: one is made per add, and a
    dataclass with a default factory costs twice as much to make)."""

    __slots__ = ("entry_id", "payload", "record", "acks")

    def __init__(self, entry_id: int, payload: bytes):
        self.entry_id = entry_id
        self.payload = payload
        self.record: bytes | None = None  # encoded (LAC/LAFR/term) when first sent
        self.acks: set[int] = set()       # ensemble indexes of its write set

    def __repr__(self) -> str:
        return f"_Pending({self.entry_id}, acks={sorted(self.acks)})"


class WriterCore:
    def __init__(
        self,
        ledger_id: int,
        term: int,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        fragment_first: int,
        ensemble: list[str],
        *,
        next_entry: int | None = None,
        guaranteed_write_quorum: bool = True,
        max_pending: int = DEFAULT_MAX_PENDING,
        fragment_max_entries: int | None = None,
        fragment_max_bytes: int | None = None,
        mutations: Mutations = NO_MUTATIONS,
    ):
        validate_quorums(ensemble_size, write_quorum, ack_quorum)
        assert len(ensemble) == ensemble_size and len(set(ensemble)) == ensemble_size, ensemble
        assert term >= 0 and max_pending >= 1 and fragment_first >= 0
        next_entry = fragment_first if next_entry is None else next_entry
        assert next_entry >= fragment_first, (next_entry, fragment_first)
        assert fragment_max_entries is None or fragment_max_entries >= 1
        assert fragment_max_bytes is None or fragment_max_bytes >= 1
        self.ledger_id, self.term = ledger_id, term
        self.E, self.Qw, self.Qa = ensemble_size, write_quorum, ack_quorum
        self.gwq = guaranteed_write_quorum
        self.max_pending = max_pending
        self.mutations = mutations  # broken rules, tests only (stream/mutations.py)
        self.fragment_max_entries = fragment_max_entries
        self.fragment_max_bytes = fragment_max_bytes
        self.state = WriterState.OPEN
        self.fragment_first = fragment_first
        self.ensemble = list(ensemble)
        # Everything below next_entry was fully replicated (a fresh ledger, or
        # one whose recovery wrote its no-op to every bookie).
        self.next_entry = next_entry
        self.next_to_send = next_entry
        self.lac = self.lafr = next_entry - 1
        self.pending: dict[int, _Pending] = {}
        self.failed: dict[int, str] = {}       # index -> failed bookie id, awaiting replacement
        self.proposal: EnsembleChange | None = None
        self.deferred = False                  # no replacement found: wait for retry_failed()
        self.fragment_entries = 0
        self.fragment_bytes = 0
        self._out_sends: dict[int, Send] = {}
        self._out_acked: list[int] = []
        self._out_failed: list[tuple[int, WriterError]] = []
        self._out_released: list[int] = []
        self._out_change: EnsembleChange | None = None

    # -- state table ------------------------------------------------------------

    def _step(self, event: WriterEvent) -> None:
        nxt = TRANSITIONS[self.state].get(event)
        if nxt is None:
            raise InvalidTransition(self.state, event)
        self.state = nxt

    @property
    def release_mark(self) -> int:
        """The highest released entry: every entry up to it is freed."""
        return self.lafr if self.gwq else self.lac

    # -- inputs -----------------------------------------------------------------

    def add(self, payload: bytes) -> int:
        """Assigns the next entry id; raises WindowFull when the window is full."""
        return self.add_many((payload,))

    def add_many(self, payloads) -> int:
        """Assigns consecutive entry ids to ``payloads`` (all or none) and
        returns the first; raises WindowFull when they do not all fit."""
        n = len(payloads)
        self.check_room(n)
        self._step(WriterEvent.ADD)
        first = eid = self.next_entry
        pending = self.pending
        for payload in payloads:
            pending[eid] = _Pending(eid, bytes(payload))
            eid += 1
        self.next_entry = eid
        self._pump()
        return first

    def check_room(self, n: int) -> None:
        """Raises what ``add_many`` of ``n`` payloads would raise now (a
        terminal state, WindowFull), adding nothing."""
        if self.state in TERMINAL:
            raise self._terminal_error("add refused")
        if len(self.pending) + n > self.max_pending:
            raise WindowFull(f"{len(self.pending)} adds pending, {n} more (limit {self.max_pending})", self.state)

    def on_ack(self, entry_id: int, bookie_index: int, status: Status = Status.OK, *,
               bookie_id: str | None = None, term: int = 0) -> None:
        """A bookie's answer for one entry.  ``bookie_id``, when given, lets
        the core drop a late answer from a bookie that was replaced since."""
        assert 0 <= bookie_index < self.E, bookie_index
        if self.state in TERMINAL:
            return
        if bookie_id is not None and bookie_id != self.ensemble[bookie_index]:
            return  # stale: from a bookie no longer at that index
        if status in (Status.INVALID_TERM, Status.FENCED):
            self._fence(f"bookie {self.ensemble[bookie_index]} answered {status.name} for entry {entry_id}",
                        WriterEvent.INVALID_TERM, term)
            return
        if status in (Status.BAD_REQUEST, Status.TOO_LARGE, Status.UNAUTHORIZED_ACCESS):
            self.fail(f"bookie {self.ensemble[bookie_index]} answered {status.name} for entry {entry_id}",
                      WriterUnauthorized if status is Status.UNAUTHORIZED_ACCESS else WriterFailed)
            return
        if status is not Status.OK:  # READ_ONLY, INTERNAL_ERROR, CHECKSUM_MISMATCH, ...
            self.on_bookie_failed(bookie_index)
            return
        self._step(WriterEvent.ACK)
        assert entry_id < self.next_to_send, f"ack for unsent entry {entry_id}"
        p = self.pending.get(entry_id)
        if p is None or bookie_index in self.failed:
            return  # already released, or from a bookie declared failed
        assert bookie_index in write_set(entry_id, self.E, self.Qw), (entry_id, bookie_index)
        p.acks.add(bookie_index)
        self._advance()
        self._maybe_propose()

    def on_acks(self, entry_ids: list[int], bookie_index: int, *, bookie_id: str | None = None) -> None:
        """OK answers of one bookie for a frame of entries: the same as
        ``on_ack`` for each, with the LAC/LAFR advance done once."""
        assert 0 <= bookie_index < self.E, bookie_index
        if self.state in TERMINAL:
            return
        if bookie_id is not None and bookie_id != self.ensemble[bookie_index]:
            return  # stale: from a bookie no longer at that index
        if bookie_index in self.failed:
            return  # from a bookie declared failed
        self._step(WriterEvent.ACK)
        if not entry_ids:
            return
        assert entry_ids[-1] < self.next_to_send, f"ack for unsent entry {entry_ids[-1]}"
        get, E, Qw = self.pending.get, self.E, self.Qw
        for eid in entry_ids:
            p = get(eid)
            if p is not None:
                assert E == Qw or bookie_index in write_set(eid, E, Qw), (eid, bookie_index)
                p.acks.add(bookie_index)
        self._advance()
        self._maybe_propose()

    def on_bookie_failed(self, bookie_index: int) -> None:
        """An error or a timeout from a bookie of the current ensemble."""
        assert 0 <= bookie_index < self.E, bookie_index
        if self.state in TERMINAL or bookie_index in self.failed:
            return
        self._step(WriterEvent.BOOKIE_FAILED)
        self.failed[bookie_index] = self.ensemble[bookie_index]
        self._maybe_propose()

    def on_ensemble_changed(self, first_entry: int, ensemble: list[str]) -> None:
        """The adapter published the proposed fragment (metadata CAS done)."""
        prop = self.proposal
        assert prop is not None and first_entry == prop.first_entry, (prop, first_entry)
        assert len(ensemble) == self.E and len(set(ensemble)) == self.E, ensemble
        if prop.reason is ChangeReason.FAILURE:
            for i in range(self.E):
                changed = ensemble[i] != prop.ensemble[i]
                assert changed == (i in prop.replace), (i, prop, ensemble)
        self._step(WriterEvent.ENSEMBLE_CHANGED)
        self.deferred = False
        replaced = [i for i in range(self.E) if ensemble[i] != self.ensemble[i]]
        self.fragment_first, self.ensemble, self.proposal = first_entry, list(ensemble), None
        for i in prop.replace:
            self.failed.pop(i, None)
        for p in self.pending.values():
            p.acks.difference_update(replaced)
        # Resend every sent, unreleased entry to the bookies that replaced others.
        for eid in range(self.release_mark + 1, self.next_to_send):
            p = self.pending[eid]
            assert p.record is not None and eid >= first_entry
            for i in write_set(eid, self.E, self.Qw):
                if i in replaced:
                    self._queue_send(i, eid, p.record)
        sent = range(first_entry, self.next_to_send)
        self.fragment_entries = len(sent)
        self.fragment_bytes = sum(len(self.pending[e].payload) for e in sent if e in self.pending)
        self._pump()
        self._maybe_propose()

    def on_ensemble_change_rejected(self, term: int = 0) -> None:
        """The metadata CAS found the ledger no longer ours (IN_RECOVERY, a
        newer term, CLOSED): the writer is fenced out."""
        if self.state in TERMINAL:
            return
        self._fence("ensemble change rejected by the metadata", WriterEvent.CHANGE_REJECTED, term)

    def on_change_deferred(self) -> None:
        """The adapter found no bookie for the proposed change (too few
        writable bookies): the proposal is withdrawn and the writer goes on
        without the failed bookies (delayed ensemble change) until
        :meth:`retry_failed`.  A deferred roll keeps the current fragment."""
        prop = self.proposal
        if self.state in TERMINAL or prop is None:
            return
        self._step(WriterEvent.CHANGE_DEFERRED)
        self.proposal, self.deferred = None, True
        self._pump()

    @property
    def ack_quorum_reachable(self) -> bool:
        """Every write set keeps at least Qa bookies that have not failed:
        adds can still be acknowledged without the failed ones, so a change
        with no replacement may be deferred rather than fail the writer."""
        if len(self.failed) > self.Qw - self.Qa:
            if self.E == self.Qw:
                return False
            return all(sum(i in self.failed for i in write_set(first, self.E, self.Qw)) <= self.Qw - self.Qa
                       for first in range(self.E))
        return True

    @property
    def held(self) -> bool:
        """An ensemble change is held by rule 3: every failed bookie still
        holds an ack a committed entry below Qw needs.  Nothing moves until
        one of them answers again: see :meth:`retry_failed`."""
        return (self.state is WriterState.OPEN and self.proposal is None and bool(self.failed)
                and all(self._needed(i) for i in self.failed))

    @property
    def awaiting(self) -> bool:
        """Failed bookies (or a roll) wait, held or deferred: the adapter
        must call :meth:`retry_failed` after a back-off."""
        return self.state is WriterState.OPEN and (self.deferred or self.held)

    def retry_failed(self) -> bool:
        """Liveness while :attr:`awaiting`: gives the failed bookies another
        chance (the adapter calls this after a back-off).  Every sent,
        unreleased entry they have not acked is sent to them again; a bookie
        that fails again is marked failed again, which proposes the change
        again (a deferred roll is proposed again at once).  Returns whether
        anything was retried."""
        if not self.awaiting:
            return False
        retried, self.failed, self.deferred = self.failed, {}, False
        for eid in range(self.release_mark + 1, self.next_to_send):
            p = self.pending[eid]
            for i in write_set(eid, self.E, self.Qw):
                if i in retried and i not in p.acks:
                    self._queue_send(i, eid, p.record)
        self._pump()
        return True

    retry_held = retry_failed  # (its older name)

    def on_invalid_term(self, term: int) -> None:
        """A bookie answered a request other than an add (an explicit LAC)
        with INVALID_TERM: a newer term took the ledger over."""
        if self.state in TERMINAL:
            return
        self._fence(f"a newer term ({term}) took the ledger over", WriterEvent.INVALID_TERM, term)

    def fail(self, reason: str, error: type[WriterFailed] = WriterFailed) -> None:
        """Gives up: fails every add not yet acknowledged (with ``error``)."""
        if self.state in TERMINAL:
            return
        self._step(WriterEvent.FAIL)
        self._fail_pending(error(reason, self.state))

    @property
    def may_tell_lac(self) -> bool:
        """A WriteLac (explicit or closing LAC) may go out: OPEN, or while
        an ensemble change is under way.  A roll falls due as the last entry
        of a full fragment is acknowledged, so a writer closing then is
        mid-change; the LAC is committed whatever the change's outcome, and
        the bookies of the last published fragment need it (an unpublished
        roll leaves that fragment the last one)."""
        return self.state in (WriterState.OPEN, WriterState.CHANGING_ENSEMBLE)

    def close_allowed(self) -> bool:
        """Rule 4: only with no pending add, no failure and no change under way."""
        return (self.state is WriterState.OPEN and not self.pending and not self.failed
                and self.proposal is None)

    def close(self) -> int:
        """Marks the writer closed; returns the last entry (for the close CAS)."""
        if not self.close_allowed():
            raise InvalidTransition(self.state, WriterEvent.CLOSE)
        self._step(WriterEvent.CLOSE)
        assert self.lac == self.next_entry - 1
        return self.lac

    # -- outputs ----------------------------------------------------------------

    def has_ready(self) -> bool:
        return bool(self._out_sends or self._out_acked or self._out_failed or self._out_released
                    or self._out_change)

    def ready(self) -> Ready:
        """Drains the outputs accumulated since the last call."""
        r = Ready(self.state, self.lac, self.lafr, list(self._out_sends.values()), self._out_acked,
                  self._out_failed, self._out_released, self._out_change)
        self._out_sends, self._out_acked, self._out_failed, self._out_released = {}, [], [], []
        self._out_change = None
        return r

    # -- internals --------------------------------------------------------------

    def _terminal_error(self, what: str) -> WriterError:
        if self.state is WriterState.FENCED:
            return WriterFenced(what, self.state, self.term)
        if self.state is WriterState.CLOSED:
            return WriterClosed(what, self.state)
        return WriterFailed(what, self.state)

    def _fence(self, reason: str, event: WriterEvent, term: int) -> None:
        self._step(event)
        self._fail_pending(WriterFenced(reason, self.state, term))

    def _fail_pending(self, err: WriterError) -> None:
        assert self.state in TERMINAL
        for eid in sorted(self.pending):
            if eid > self.lac:  # acknowledged ones stay acknowledged
                self._out_failed.append((eid, err))
        self.pending.clear()
        self.proposal = None
        self._out_sends.clear()

    def _queue_send(self, index: int, eid: int, record: bytes) -> None:
        s = self._out_sends.get(index)
        if s is None:
            s = self._out_sends[index] = Send(index, self.ensemble[index])
        assert not s.entry_ids or s.entry_ids[-1] < eid
        s.entry_ids.append(eid)
        s.records.append(record)
        # Fresh sends plus resends after a change; the adapter drains ready()
        # after each input, so a batch never exceeds twice the window.
        assert len(s.records) <= 2 * self.max_pending, "ready() not drained"

    def _send_run(self, index: int, ids: range, records: list[bytes]) -> None:
        s = self._out_sends.get(index)
        if s is None:
            s = self._out_sends[index] = Send(index, self.ensemble[index])
        assert not s.entry_ids or s.entry_ids[-1] < ids[0]
        s.entry_ids.extend(ids)
        s.records.extend(records)
        assert len(s.records) <= 2 * self.max_pending, "ready() not drained"

    def _roll_due(self) -> bool:
        return ((self.fragment_max_entries is not None and self.fragment_entries >= self.fragment_max_entries)
                or (self.fragment_max_bytes is not None and self.fragment_bytes >= self.fragment_max_bytes))

    def _pump(self) -> None:
        """Sends added entries, in order, unless a change is due or under
        way; while failed bookies wait (held or deferred), to the rest."""
        if self.next_to_send < self.next_entry and self.state is WriterState.OPEN:
            first = eid = self.next_to_send
            pending = self.pending
            batch = [pending[e] for e in range(first, self.next_entry)]
            size = sum(len(p.payload) for p in batch)
            if ((self.fragment_max_entries is None or self.fragment_entries + len(batch) < self.fragment_max_entries)
                    and (self.fragment_max_bytes is None or self.fragment_bytes + size < self.fragment_max_bytes)):
                # no roll falls due among them: all at once
                self.fragment_entries += len(batch)
                self.fragment_bytes += size
                eid = self.next_entry
            else:  # entry by entry, up to the one that makes the roll due
                batch = []
                while eid < self.next_entry and not self._roll_due():
                    p = pending[eid]
                    batch.append(p)
                    self.fragment_entries += 1
                    self.fragment_bytes += len(p.payload)
                    eid += 1
            if batch:
                records = entry_codec.encode_run(self.ledger_id, first, [p.payload for p in batch],
                                                 lac=self.lac, lafr=self.mutations.carried_lafr(self.lac, self.lafr),
                                                 term=self.term)
                self.next_to_send = eid
                E, Qw, failed = self.E, self.Qw, self.failed
                if E == Qw:  # every bookie gets every entry
                    ids = range(first, eid)
                    for i in write_set(first, E, Qw):  # the order entry by entry would give
                        if i not in failed:
                            self._send_run(i, ids, records)
                    for p, rec in zip(batch, records):
                        p.record = rec
                else:
                    for p, rec in zip(batch, records):
                        p.record = rec
                        for i in write_set(p.entry_id, E, Qw):
                            if i not in failed:
                                self._queue_send(i, p.entry_id, rec)
        self._maybe_propose()

    def _advance(self) -> None:
        """LAC and LAFR move up contiguously from their previous values."""
        lac0, lafr0 = self.lac, self.lafr
        pending, lac, Qa, Qw = self.pending, self.lac, self.Qa, self.Qw
        while lac + 1 < self.next_to_send and len(pending[lac + 1].acks) >= Qa:
            lac += 1
        self.lac = lac
        self._out_acked.extend(range(lac0 + 1, lac + 1))
        if self.gwq:
            lafr = self.lafr
            while lafr + 1 <= lac and len(pending[lafr + 1].acks) >= Qw:
                lafr += 1
            self.lafr = lafr
        released = range(lafr0 + 1 if self.gwq else lac0 + 1, self.release_mark + 1)
        for eid in released:
            p = pending.pop(eid)
            assert len(p.acks) >= (Qw if self.gwq else Qa), (eid, p.acks)
        self._out_released.extend(released)
        assert self.lac >= lac0 and self.lafr >= lafr0 and self.lafr <= self.lac

    def _needed(self, index: int) -> bool:
        """Rule 3: the bookie acked a committed entry that is still below Qw."""
        if not self.gwq:
            return False
        return any(eid <= self.lac and index in p.acks and len(p.acks) < self.Qw
                   for eid, p in self.pending.items())

    def _maybe_propose(self) -> None:
        if self.state is not WriterState.OPEN or self.proposal is not None or self.deferred:
            return
        first = self.release_mark + 1
        if self.failed:
            replace = tuple(sorted(i for i in self.failed if not self._needed(i)))
            if not replace:
                return  # held: every failed bookie still holds a needed ack
            for p in self.pending.values():
                assert p.entry_id >= first
                p.acks.difference_update(replace)  # only uncommitted entries lose acks here
            self._propose(ChangeReason.FAILURE, first, replace)
        elif self._roll_due() and first == self.next_to_send:
            self._propose(ChangeReason.ROLL, first, tuple(range(self.E)))

    def _propose(self, reason: ChangeReason, first: int, replace: tuple[int, ...]) -> None:
        assert first >= self.fragment_first, (first, self.fragment_first)
        self._step(WriterEvent.PROPOSE_CHANGE)
        self.proposal = self._out_change = EnsembleChange(
            first, reason, replace, tuple(self.ensemble), first == self.fragment_first)
