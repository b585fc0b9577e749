"""The recovery machine's states, events and messages: the interface of
``stream.recovery_core.RecoveryCore`` (which decides the transitions) to the
adapters that execute it (``stream.ledger_recovery``, ``sim/clients.py``).
Pure data: no decisions here.  ``stream.recovery_core`` re-exports every name.

States (h11 style; ``TRANSITIONS`` is the whole table):

========== ============================================= ==========
state      event                                         next
========== ============================================= ==========
INIT       START                                         FENCING
FENCING    LAC_RESPONSE                                  FENCING
FENCING    COVERED                                       READING
READING    READ_RESPONSE (any id of the window),         READING
           WRITE_ACK, WRITE_FAILED, BOOKIE_REPLACED
READING    END_FOUND (ABSENT at the frontier)            FINISHING
FINISHING  WRITE_ACK, WRITE_FAILED, BOOKIE_REPLACED      FINISHING
FINISHING  ALL_WRITTEN                                   DONE
any live   ABORT (no coverage, UNKNOWN at the frontier,     ABORTED
           data loss, adapter)
any live   INVALID_TERM                                  FENCED_OUT
DONE, ABORTED, FENCED_OUT: terminal; late answers are ignored
========== ============================================= ==========
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class RecoveryState(enum.Enum):
    INIT = "init"
    FENCING = "fencing"
    READING = "reading"
    FINISHING = "finishing"
    DONE = "done"
    ABORTED = "aborted"
    FENCED_OUT = "fenced_out"


class RecoveryEvent(enum.Enum):
    START = "start"
    LAC_RESPONSE = "lac_response"
    COVERED = "covered"
    READ_RESPONSE = "read_response"
    WRITE_ACK = "write_ack"
    WRITE_FAILED = "write_failed"
    BOOKIE_REPLACED = "bookie_replaced"
    END_FOUND = "end_found"
    ALL_WRITTEN = "all_written"
    ABORT = "abort"
    INVALID_TERM = "invalid_term"


S, Ev = RecoveryState, RecoveryEvent
_LIVE_EXITS = {Ev.ABORT: S.ABORTED, Ev.INVALID_TERM: S.FENCED_OUT}
TRANSITIONS: dict[RecoveryState, dict[RecoveryEvent, RecoveryState]] = {
    S.INIT: {Ev.START: S.FENCING, Ev.ABORT: S.ABORTED},
    S.FENCING: {Ev.LAC_RESPONSE: S.FENCING, Ev.COVERED: S.READING, **_LIVE_EXITS},
    S.READING: {Ev.READ_RESPONSE: S.READING, Ev.WRITE_ACK: S.READING, Ev.WRITE_FAILED: S.READING,
                Ev.BOOKIE_REPLACED: S.READING, Ev.END_FOUND: S.FINISHING, **_LIVE_EXITS},
    S.FINISHING: {Ev.WRITE_ACK: S.FINISHING, Ev.WRITE_FAILED: S.FINISHING,
                  Ev.BOOKIE_REPLACED: S.FINISHING, Ev.ALL_WRITTEN: S.DONE, **_LIVE_EXITS},
    S.DONE: {},
    S.ABORTED: {},
    S.FENCED_OUT: {},
}
TERMINAL = frozenset(s for s, t in TRANSITIONS.items() if not t)
del S, Ev, _LIVE_EXITS


class RecoveryError(Exception):
    def __init__(self, message: str, state: RecoveryState):
        super().__init__(f"{message} (recovery {state.value})")
        self.state = state


class InvalidRecoveryTransition(RecoveryError):
    def __init__(self, state: RecoveryState, event: RecoveryEvent):
        super().__init__(f"{event.value} not allowed", state)
        self.event = event


# -- outputs --------------------------------------------------------------------

class FencingRead(NamedTuple):
    bookie_index: int
    bookie_id: str
    ledger_id: int
    term: int
    fence: bool


class RecoveryRead(NamedTuple):  # (tuples: a window makes them by the thousand)
    entry_id: int
    bookie_index: int
    bookie_id: str
    ledger_id: int
    term: int
    fence: bool


class RecoveryWrite(NamedTuple):
    entry_id: int
    bookie_index: int
    bookie_id: str
    record: bytes  # a recovery add: term set, REQ_RECOVERY, frozen LAC


@dataclass(frozen=True, slots=True)
class ReplaceBookie:
    """Choose a bookie to take ``bookie_index`` (not in the ensemble), then
    call ``on_bookie_replaced``.  Nothing is published before the end."""

    bookie_index: int
    bookie_id: str


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    last_entry: int               # classic: last recovered entry; unbounded: the no-op
    lac: int                      # the ledger's LAC after recovery (= last_entry)
    next_entry: int               # where appends continue (unbounded)
    noop_entry: int | None
    recovered: tuple[int, ...]    # entries written back
    # (first entry, ensemble) to publish with the final CAS; it replaces the
    # last fragment when first entry == that fragment's first entry.
    ensemble_change: tuple[int, tuple[str, ...]] | None


@dataclass(slots=True)
class RecoveryReady:
    state: RecoveryState
    fencing_reads: list[FencingRead]
    reads: list[RecoveryRead]
    writes: list[RecoveryWrite]
    replacements: list[ReplaceBookie]
    result: RecoveryResult | None
    reason: str | None  # why ABORTED / FENCED_OUT


__all__ = ["FencingRead", "InvalidRecoveryTransition", "RecoveryError", "RecoveryEvent", "RecoveryRead",
           "RecoveryReady", "RecoveryResult", "RecoveryState", "RecoveryWrite", "ReplaceBookie", "TERMINAL",
           "TRANSITIONS"]
