"""Quorum arithmetic of the BookKeeper protocol: pure functions, no I/O.

- ``write_set``: the Qw ensemble indexes an entry is written to, starting at
  ``entry_id mod E`` and wrapping (the seed's "write quorums" table).
- ``CoverageTracker``: the fencing / LAC-read condition.  Responses from at
  least Qw - Qa + 1 bookies of *every* write quorum: then no Qa-subset of any
  write quorum lies wholly among the bookies that did not answer, so an older
  writer cannot get an add acknowledged without one of the responders, which
  now refuse it (fence or term).  With E = Qw that is E - Qa + 1 bookies.
- ``EntryReadOutcome``: recovery's decision on one entry read over its write
  set:

  ======================================= ===========
  answers                                 outcome
  ======================================= ===========
  one OK                                  RECOVERABLE (the record is kept)
  Qw - Qa + 1 NO_SUCH_ENTRY/NO_SUCH_LEDGER ABSENT
  all answered or timed out, neither      UNKNOWN (abort, retry later)
  otherwise                               PENDING
  ======================================= ===========

  Errors, UNKNOWN_ENTRY and timeouts never count as "absent" (BookKeeper
  #2908): absent means fewer than Qa bookies of the write set can hold the
  entry, so it was never acknowledged.

  A *stale* OK (its record's origin term is below the recovery's floor:
  ``stream/recovery_core.py``, "Log matching") counts as NO_SUCH_ENTRY: the
  caller feeds it as one, or ``demote``s the OK an outcome holds once the
  floor has risen above its origin.
"""
from __future__ import annotations

import functools

import enum

from bookie.core import Status

MAX_ENSEMBLE = 64  # an explicit bound on E, so every loop here is bounded


class QuorumError(ValueError):
    """Base class of the typed errors of this module."""


class InvalidQuorum(QuorumError):
    """E >= Qw >= Qa >= 1 does not hold."""

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int):
        super().__init__(
            f"need E >= Qw >= Qa >= 1 (and E <= {MAX_ENSEMBLE}), got "
            f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}"
        )
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum


def validate_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Raises InvalidQuorum unless E >= Qw >= Qa >= 1."""
    ok = all(isinstance(x, int) for x in (ensemble_size, write_quorum, ack_quorum))
    if not ok or not (MAX_ENSEMBLE >= ensemble_size >= write_quorum >= ack_quorum >= 1):
        raise InvalidQuorum(ensemble_size, write_quorum, ack_quorum)


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """The ensemble indexes of an entry's write quorum."""
    assert entry_id >= 0, entry_id
    return _write_set(entry_id % ensemble_size, ensemble_size, write_quorum)


@functools.lru_cache(maxsize=4096)
def _write_set(start: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    # there are only E distinct write sets: computed once each (hot path)
    assert 1 <= write_quorum <= ensemble_size <= MAX_ENSEMBLE
    ws = tuple((start + k) % ensemble_size for k in range(write_quorum))
    assert len(set(ws)) == write_quorum
    return ws


def write_quorums(ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """The E distinct write quorums of an ensemble (one if E = Qw)."""
    seen: dict[frozenset[int], tuple[int, ...]] = {}
    for s in range(ensemble_size):
        ws = write_set(s, ensemble_size, write_quorum)
        seen.setdefault(frozenset(ws), ws)
    return list(seen.values())


class CoverageTracker:
    """Counts responses per ensemble index; covered once every write quorum
    has at least Qw - Qa + 1 responders.

    ``on_failure`` records a bookie that will not answer (error, timeout);
    ``impossible`` then says when coverage can no longer be reached: some
    write quorum has Qa failures, i.e. fewer than Qw - Qa + 1 left."""

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int):
        validate_quorums(ensemble_size, write_quorum, ack_quorum)
        self.E, self.Qw, self.Qa = ensemble_size, write_quorum, ack_quorum
        self.needed = write_quorum - ack_quorum + 1
        self._quorums = write_quorums(ensemble_size, write_quorum)
        self.responders: set[int] = set()
        self.failed: set[int] = set()

    def on_response(self, bookie_index: int) -> bool:
        assert 0 <= bookie_index < self.E, bookie_index
        if bookie_index not in self.failed:
            self.responders.add(bookie_index)
        return self.covered

    def on_failure(self, bookie_index: int) -> bool:
        """Returns True while coverage is still reachable."""
        assert 0 <= bookie_index < self.E, bookie_index
        if bookie_index not in self.responders:
            self.failed.add(bookie_index)
        return not self.impossible

    @property
    def covered(self) -> bool:
        return all(sum(1 for i in q if i in self.responders) >= self.needed for q in self._quorums)

    @property
    def impossible(self) -> bool:
        return any(sum(1 for i in q if i in self.failed) > self.Qw - self.needed for q in self._quorums)


class ReadOutcome(enum.Enum):
    PENDING = "pending"
    RECOVERABLE = "recoverable"
    ABSENT = "absent"
    UNKNOWN = "unknown"


ABSENT_STATUSES = frozenset({Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER})


def absent_quorum(write_quorum: int, ack_quorum: int) -> int:
    """How many absent answers (ABSENT_STATUSES) from an entry's write set
    prove it was never confirmed there: Qw - Qa + 1, so that at most Qa - 1
    replicas may hold it (recovery's ABSENT, a reader's EntryMissing)."""
    return write_quorum - ack_quorum + 1


class EntryReadOutcome:
    """Recovery's read of one entry over its write set (see module doc).

    Feed each bookie's answer once (``on_response``; ``None`` status = timed
    out).  The outcome is final once it leaves PENDING; later answers are
    ignored."""

    def __init__(self, write_quorum: int, ack_quorum: int, members: tuple[int, ...] | None = None,
                 absent: int | None = None):
        assert write_quorum >= ack_quorum >= 1
        assert members is None or len(members) == write_quorum
        self.Qw, self.Qa = write_quorum, ack_quorum
        # NO_SUCH answers that read ABSENT: absent_quorum's (the recovery core passes
        # its mutations' count: stream/mutations.py ABSENT_BELOW_COVERAGE, tests only)
        self.absent = absent_quorum(write_quorum, ack_quorum) if absent is None else absent
        self.members = members
        self.answered: dict[int, Status | None] = {}
        self.no_such = 0
        self.record: bytes | None = None
        self.record_from: int | None = None  # the bookie whose OK made it RECOVERABLE
        self.outcome = ReadOutcome.PENDING

    def on_response(self, bookie_index: int, status: Status | None, record: bytes | None = None) -> ReadOutcome:
        assert self.members is None or bookie_index in self.members, (bookie_index, self.members)
        assert (status is Status.OK) == (record is not None), (status, record is None)
        if self.outcome is not ReadOutcome.PENDING or bookie_index in self.answered:
            return self.outcome
        assert len(self.answered) < self.Qw
        self.answered[bookie_index] = status
        if status is Status.OK:
            self.record, self.record_from = bytes(record), bookie_index
            self.outcome = ReadOutcome.RECOVERABLE
        elif status in ABSENT_STATUSES:
            self.no_such += 1
        self._settle()
        return self.outcome

    def _settle(self) -> None:
        if self.outcome is ReadOutcome.PENDING:
            if self.no_such >= self.absent:
                self.outcome = ReadOutcome.ABSENT
            elif len(self.answered) == self.Qw:
                self.outcome = ReadOutcome.UNKNOWN

    def demote(self) -> ReadOutcome:
        """The OK this RECOVERABLE outcome holds is stale: it counts as
        NO_SUCH_ENTRY from its bookie, and the outcome is made again from
        the answers (PENDING: the bookies that have not answered are still
        to be asked; answers dropped while it was RECOVERABLE were never
        recorded)."""
        assert self.outcome is ReadOutcome.RECOVERABLE and self.record_from is not None
        self.answered[self.record_from] = Status.NO_SUCH_ENTRY
        self.no_such += 1
        self.record = self.record_from = None
        self.outcome = ReadOutcome.PENDING
        self._settle()
        return self.outcome

    def on_timeout(self, bookie_index: int) -> ReadOutcome:
        return self.on_response(bookie_index, None)
