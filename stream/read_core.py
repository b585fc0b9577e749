"""The read core: the decisions of a reader's per-entry read and of the
covering LAC read.  Pure: no I/O, no clock (time enters as ``now``, the
replicas to ask leave as return values).  ``stream.ledger_read.ReadPath``
(asyncio) and the simulator's reader (``sim/reader.py`` SimReader) both
execute it; range reads are planned in ``stream.read_plan``.

A per-entry read (:class:`EntryRead`):

- asks the replicas of the entry's write set one at a time, in
  :func:`replica_order` (healthy first, by ``stream.placement.BookieHealth``
  score: a suspect last; write-set order from ``rotation`` among equals);
- falls over to the next replica when the last one asked fails or has not
  answered ``speculate_after`` after it was asked (speculation: both stay
  in flight, the first verified answer wins);
- sorts each answer into an :class:`Answer` (the adapter verifies the
  checksum: a record that fails it is ``BAD``, never ``OK``);
- decides: one OK finds the entry (so every replica is asked before the
  read gives up: a reader prefers the data to an error); once every replica
  answered or failed without one, the entry is *missing* only if at least
  ``stream.quorum.absent_quorum`` = Qw - Qa + 1 of them said NO_SUCH_ENTRY /
  NO_SUCH_LEDGER (then at most Qa - 1 hold it: it was never confirmed in
  this write set, the rule recovery's ABSENT uses); otherwise the read
  failed (``BAD`` if a replica sent a corrupt record, else ``UNAVAILABLE``):
  never a guess that it is missing.

The covering LAC read (:class:`LacRead`): the highest LAC among answers
that cover every write quorum of the last fragment (Qw - Qa + 1 responders
each, ``stream.quorum.CoverageTracker``); NO_SUCH_LEDGER counts as an
answer (a bookie that never got an entry), errors do not.
"""
from __future__ import annotations

import enum
from typing import Mapping

from bookie.core import Status
from stream.placement import BookieHealth
from stream.quorum import ABSENT_STATUSES, CoverageTracker, absent_quorum, write_set


class Answer(enum.Enum):
    """One replica's answer to a per-entry read, sorted."""

    OK = "ok"              # the entry, its checksum verified
    ABSENT = "absent"      # NO_SUCH_ENTRY / NO_SUCH_LEDGER: the replica does not hold it
    BAD = "bad"            # a record that failed its checksum or is another entry's
    FAILED = "failed"      # no answer (unreachable, timed out) or another status


def answer_of(status: Status | None) -> Answer:
    """The :class:`Answer` of a non-OK bookie status (None: no answer).  An
    OK status is OK only once the adapter verified its record."""
    if status is Status.OK:
        raise ValueError("an OK status is sorted by its record's checksum (Answer.OK or Answer.BAD)")
    if status in ABSENT_STATUSES:
        return Answer.ABSENT
    if status is Status.CHECKSUM_MISMATCH:
        return Answer.BAD
    return Answer.FAILED


class Verdict(enum.Enum):
    """What a per-entry read concluded."""

    PENDING = "pending"
    FOUND = "found"
    MISSING = "missing"          # stream.errors.EntryMissing
    BAD = "bad"                  # stream.errors.BadChecksum
    UNAVAILABLE = "unavailable"  # stream.errors.ReadFailed


def replica_order(entry_id: int, ensemble_size: int, write_quorum: int,
                  scores: Mapping[int, float] | None = None, rotation: int = 0) -> list[int]:
    """The ensemble indexes of ``entry_id``'s write set in the order to ask
    them: those not suspect (``scores``: ensemble index -> health score,
    ``stream.placement.BookieHealth.score``; missing = 0) in write-set order
    turned by ``rotation``, then the suspects, least suspect first."""
    ws = write_set(entry_id, ensemble_size, write_quorum)
    k = rotation % len(ws)
    if k:
        ws = ws[k:] + ws[:k]
    if not scores or max(scores.get(i, 0.0) for i in ws) < BookieHealth.SUSPECT:
        return list(ws)
    healthy = [i for i in ws if scores.get(i, 0.0) < BookieHealth.SUSPECT]
    suspects = sorted((i for i in ws if scores.get(i, 0.0) >= BookieHealth.SUSPECT), key=lambda i: scores[i])
    return healthy + suspects


class EntryRead:
    """One per-entry read (see the module doc).  ``start(now)`` returns the
    replicas (ensemble indexes) to ask first; feed each answer once with
    ``on_answer``, and call ``tick(now)`` at ``deadline``; both return the
    replicas to ask next.  Done once ``verdict`` leaves PENDING (``value``:
    the entry found, ``found_at``: from which replica); answers after that
    are ignored, and requests still in flight may be dropped."""

    def __init__(self, entry_id: int, ensemble_size: int, write_quorum: int, ack_quorum: int, *,
                 scores: Mapping[int, float] | None = None, rotation: int = 0,
                 speculate_after: float | None = None):
        self.entry_id = entry_id
        self.order = replica_order(entry_id, ensemble_size, write_quorum, scores, rotation)
        self.speculate_after = speculate_after if speculate_after is not None and speculate_after >= 0 else None
        self.absent_needed = absent_quorum(write_quorum, ack_quorum)
        self.asked: list[int] = []
        self.answers: dict[int, Answer] = {}
        self.value: object = None
        self.found_at: int | None = None
        self.verdict = Verdict.PENDING
        self._asked_at = 0.0

    def _decide(self) -> Verdict:
        """The verdict from the answers so far."""
        if self.found_at is not None:
            return Verdict.FOUND
        if len(self.answers) < len(self.order):
            return Verdict.PENDING
        got = list(self.answers.values())
        if got.count(Answer.ABSENT) >= self.absent_needed:
            return Verdict.MISSING
        return Verdict.BAD if Answer.BAD in got else Verdict.UNAVAILABLE

    @property
    def deadline(self) -> float | None:
        """When to ask the next replica if nothing answers (None: no timer)."""
        if self.verdict is not Verdict.PENDING or self.speculate_after is None or not self._more():
            return None
        return self._asked_at + self.speculate_after

    def start(self, now: float) -> list[int]:
        assert not self.asked, "started twice"
        return self._ask_next(now)

    def on_answer(self, index: int, answer: Answer, now: float, value: object = None) -> list[int]:
        """The answer of the replica at ensemble ``index`` (``value``: the
        verified entry, with OK)."""
        assert index in self.asked, (index, self.asked)
        if self.verdict is not Verdict.PENDING or index in self.answers:
            return []
        self.answers[index] = answer
        if answer is Answer.OK:
            self.value, self.found_at = value, index
        self.verdict = self._decide()
        return self._ask_next(now) if self.verdict is Verdict.PENDING else []

    def tick(self, now: float) -> list[int]:
        d = self.deadline
        return self._ask_next(now) if d is not None and now >= d else []

    def _more(self) -> bool:
        return len(self.asked) < len(self.order)

    def _ask_next(self, now: float) -> list[int]:
        if not self._more():
            return []
        i = self.order[len(self.asked)]
        self.asked.append(i)
        self._asked_at = now
        return [i]


class LacRead:
    """The covering LAC read of a fragment's ensemble (plain reads: no fence,
    no term).  ``lac`` starts at the fragment's first entry - 1 (confirmed
    by the change that made it).  Feed each bookie's answer once."""

    def __init__(self, first_entry: int, ensemble_size: int, write_quorum: int, ack_quorum: int):
        self.tracker = CoverageTracker(ensemble_size, write_quorum, ack_quorum)
        self.lac = first_entry - 1

    def on_answer(self, index: int, status: Status | None, lac: int = -1) -> None:
        if status is Status.OK:
            self.lac = max(self.lac, lac)
            self.tracker.on_response(index)
        elif status is Status.NO_SUCH_LEDGER:
            self.tracker.on_response(index)
        else:
            self.tracker.on_failure(index)

    @property
    def covered(self) -> bool:
        return self.tracker.covered

    @property
    def impossible(self) -> bool:
        return self.tracker.impossible


__all__ = ["Answer", "EntryRead", "LacRead", "Verdict", "answer_of", "replica_order"]
