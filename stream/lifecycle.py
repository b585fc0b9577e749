"""The ledger life-cycle core: pure verdicts on ledger metadata, and the one
asyncio CAS runner that executes them.

A metadata change is an *intent* (replace a bookie in a fragment, close at an
entry, ...).  Judging an intent against the metadata as read gives one of:

- :class:`Apply`: CAS the header (and fragments) to this; the change holds.
- :class:`Done`: the metadata already shows the intent's effect (another
  process, or our own CAS whose answer was lost, did it): adopt it.
- :class:`Moot`: the intent can no longer apply (the ledger is gone, the
  fragment was trimmed, the bookie is no longer named): drop it.
- :class:`Wait`: not now (the ledger is being recovered, the fragment is
  still open): retry later; ``retriable`` errors come from here.

The verdict on a *lost CAS* is the same function applied to the metadata
read after the loss (:func:`judge_lost_cas`): a lost CAS never means
"retry blindly" nor "failed" by itself.  :func:`run_cas` reads, judges,
writes, and on a lost or unknown CAS re-reads and judges again, with one
back-off (:class:`Backoff`).  No clock, no I/O here except in ``run_cas``,
whose I/O is the three callables it is given.

Intents implemented this session: :class:`ReplaceBookie` (autorecovery's
fragment replacement) and :class:`CloseAt` (a classic close).  The take-over
(term + 1), classic recovery's begin/finish and the writer's ensemble change
and roll are to move here (issue 13 item 1); they keep their own loops in
``stream/stream.py`` and ``stream/ledger.py`` for now.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Awaitable, Callable, Protocol, Union

from metadata.ledgers import Fragment, LedgerMetadata, LedgerState

log = logging.getLogger(__name__)


# -- verdicts ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Apply:
    """CAS to ``header`` (the header fields) writing ``fragments`` (new or
    replacing ones with the same first entry)."""

    header: LedgerMetadata
    fragments: tuple[Fragment, ...] = ()


@dataclasses.dataclass(frozen=True)
class Done:
    """The metadata already shows the intent's effect."""

    why: str


@dataclasses.dataclass(frozen=True)
class Moot:
    """The intent can no longer apply; nothing to do."""

    why: str


@dataclasses.dataclass(frozen=True)
class Wait:
    """Not now; judge again later."""

    why: str


Verdict = Union[Apply, Done, Moot, Wait]


class Intent(Protocol):
    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        """The verdict on ``meta`` (None: the ledger does not exist).  Pure."""


# -- fragment replacement (autorecovery, manual recovery) --------------------------------

def fragment_end(meta: LedgerMetadata, first_entry: int) -> int | None:
    """The last entry of the loaded fragment starting at ``first_entry``:
    the next fragment's first entry - 1; for the newest fragment the
    ledger's last entry when CLOSED, else None (open: still growing)."""
    firsts = [f.first_entry for f in meta.fragments]
    i = firsts.index(first_entry)
    if i + 1 < len(firsts):
        return firsts[i + 1] - 1
    return meta.last_entry if meta.state is LedgerState.CLOSED else None


def is_sealed(meta: LedgerMetadata, first_entry: int) -> bool:
    """A fragment is sealed when no writer can add to it any more: every
    fragment but the newest, and the newest of a CLOSED ledger."""
    return fragment_end(meta, first_entry) is not None


@dataclasses.dataclass(frozen=True)
class ReplaceBookie:
    """Replace ``lost`` by ``target`` in the fragment of ledger ``ledger_id``
    starting at ``first_entry``, once ``target`` holds the fragment's
    entries.  ``ensemble`` is the fragment's ensemble when the copy was
    planned: if it changed since (other than by this very replacement), the
    copy may not match the fragment any more and the verdict is Moot.

    Rules (judged on the metadata with *all* fragments loaded):
    - no ledger, or no fragment at ``first_entry`` (trimmed): Moot;
    - the fragment already names ``target`` where it named ``lost``: Done
      (our CAS went through, or another worker did the same);
    - the fragment no longer names ``lost``, or changed otherwise: Moot;
    - the fragment is not sealed (the newest of an OPEN ledger: its writer
      owns it): Wait;
    - the ledger is IN_RECOVERY (a recovery will CAS it): Wait;
    - ``target`` is already in the fragment: Moot (the copy was for another
      position; a second copy of a replica adds no durability);
    - else Apply: the same header fields, the fragment with ``target`` at
      ``lost``'s index.
    """

    ledger_id: int
    first_entry: int
    lost: str
    target: str
    ensemble: tuple[str, ...]

    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        assert self.lost != self.target, "a bookie cannot replace itself"
        if meta is None:
            return Moot(f"ledger {self.ledger_id} is gone")
        assert meta.ledger_id == self.ledger_id and meta.fragments_complete, "judge on all fragments"
        frag = next((f for f in meta.fragments if f.first_entry == self.first_entry), None)
        if frag is None:
            return Moot(f"ledger {self.ledger_id}: no fragment at {self.first_entry} (trimmed)")
        wanted = tuple(self.target if b == self.lost else b for b in self.ensemble)
        if frag.ensemble == wanted:
            return Done(f"ledger {self.ledger_id}: fragment {self.first_entry} already on {self.target}")
        if frag.ensemble != self.ensemble:
            return Moot(f"ledger {self.ledger_id}: fragment {self.first_entry} changed to {list(frag.ensemble)}")
        if self.lost not in frag.ensemble:  # pragma: no cover - ensemble equality covers it
            return Moot(f"ledger {self.ledger_id}: fragment {self.first_entry} no longer names {self.lost}")
        if self.target in frag.ensemble:
            return Moot(f"ledger {self.ledger_id}: {self.target} already in fragment {self.first_entry}")
        if meta.state is LedgerState.IN_RECOVERY:
            return Wait(f"ledger {self.ledger_id} is in recovery")
        if not is_sealed(meta, self.first_entry):
            return Wait(f"ledger {self.ledger_id}: fragment {self.first_entry} is open (its writer owns it)")
        return Apply(meta, (Fragment(self.first_entry, wanted),))


@dataclasses.dataclass(frozen=True)
class CloseAt:
    """A classic close at ``last_entry``: OPEN -> CLOSED.  CLOSED at the
    same entry: Done; at another: Moot (the caller raises CloseMismatch);
    IN_RECOVERY: Moot (a recoverer owns the ledger now)."""

    ledger_id: int
    last_entry: int

    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        if meta is None:
            return Moot(f"ledger {self.ledger_id} is gone")
        if meta.state is LedgerState.CLOSED:
            if meta.last_entry == self.last_entry:
                return Done(f"ledger {self.ledger_id} closed at {self.last_entry}")
            return Moot(f"ledger {self.ledger_id} closed at {meta.last_entry}, not {self.last_entry}")
        if meta.state is LedgerState.IN_RECOVERY:
            return Moot(f"ledger {self.ledger_id} is in recovery")
        return Apply(meta.with_(state=LedgerState.CLOSED, last_entry=self.last_entry))


def judge_lost_cas(intent: Intent, current: LedgerMetadata | None) -> Verdict:
    """The verdict after a CAS was lost (or its outcome is unknown), on the
    metadata read afterwards: Done means the change is there (adopt it, it
    may be our own); Apply means retry on this revision; Moot and Wait as
    for any judgement.  The same rule as the first judgement, on purpose:
    one rule, not a second one for the retry path."""
    return intent.judge(current)


# -- the CAS runner ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Backoff:
    """The one back-off of metadata retries: ``base * factor**attempt``,
    capped; ``attempts`` bounds the loop."""

    base: float = 0.05
    factor: float = 2.0
    cap: float = 1.0
    attempts: int = 10

    def delay(self, attempt: int) -> float:
        assert attempt >= 0
        return min(self.cap, self.base * self.factor ** attempt)


@dataclasses.dataclass(frozen=True)
class CasResult:
    """What :func:`run_cas` ended with: the last verdict, and the metadata
    and header revision it was judged on (after an Apply: as written)."""

    verdict: Verdict
    meta: LedgerMetadata | None
    revision: int
    attempts: int

    @property
    def applied(self) -> bool:
        """The intent's effect is in the metadata (written now, or adopted)."""
        return isinstance(self.verdict, (Apply, Done))


class CasLost(Exception):
    """Raised by a ``write`` callable when the CAS lost (BadVersion, a
    missing fragment): the runner re-reads and judges again."""


class CasUnknown(Exception):
    """Raised by ``read`` or ``write`` when etcd could not be reached (the
    write's outcome is unknown): the runner backs off, re-reads, judges."""


Read = Callable[[], Awaitable[tuple[LedgerMetadata | None, int]]]
Write = Callable[[Apply, int], Awaitable[tuple[LedgerMetadata, int]]]


async def run_cas(intent: Intent, read: Read, write: Write, backoff: Backoff = Backoff(),
                  sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> CasResult:
    """Executes ``intent``: read, judge, write on Apply; after a lost or
    unknown CAS, back off, re-read and judge again (:func:`judge_lost_cas`).
    Returns on Done / Moot / Wait or a successful write; after
    ``backoff.attempts`` lost rounds returns the last Wait-like verdict
    (``Wait("CAS kept failing")``).  ``read`` returns (None, 0) for a
    missing ledger."""
    meta: LedgerMetadata | None = None
    rev = 0
    for attempt in range(backoff.attempts):
        try:
            meta, rev = await read()
        except CasUnknown as e:
            log.info("%r: metadata unavailable (%s), attempt %d", intent, e, attempt + 1)
            await sleep(backoff.delay(attempt))
            continue
        verdict = intent.judge(meta) if attempt == 0 else judge_lost_cas(intent, meta)
        if not isinstance(verdict, Apply):
            return CasResult(verdict, meta, rev, attempt + 1)
        try:
            written, new_rev = await write(verdict, rev)
            return CasResult(verdict, written, new_rev, attempt + 1)
        except CasLost as e:
            log.info("%r: CAS lost (%s), judging again", intent, e)
        except CasUnknown as e:
            log.info("%r: CAS outcome unknown (%s), judging again", intent, e)
            await sleep(backoff.delay(attempt))
    return CasResult(Wait(f"CAS kept failing after {backoff.attempts} attempts"), meta, rev, backoff.attempts)


def ledger_store_io(client, ledger_id: int) -> tuple[Read, Write]:
    """``read`` / ``write`` for :func:`run_cas` over a ``BookKeeperClient``'s
    ``LedgerStore`` (all fragments read; an Apply with fragments is one
    ``add_fragments`` transaction, without them a header CAS)."""
    from metadata import errors as me

    async def read() -> tuple[LedgerMetadata | None, int]:
        try:
            return await asyncio.to_thread(client.ledgers.read, ledger_id)
        except me.NoSuchLedger:
            return None, 0
        except (me.MetadataUnavailable, me.Compacted) as e:
            raise CasUnknown(str(e)) from e

    async def write(apply: Apply, rev: int) -> tuple[LedgerMetadata, int]:
        try:
            if apply.fragments:
                return await asyncio.to_thread(client.ledgers.add_fragments, ledger_id, list(apply.fragments),
                                               apply.header, rev)
            new_rev = await asyncio.to_thread(client.ledgers.update_header, apply.header, rev)
            return apply.header, new_rev
        except (me.ConditionFailed, me.NoFragment, me.NoSuchLedger) as e:
            raise CasLost(str(e)) from e
        except (me.MetadataUnavailable, me.Compacted) as e:
            raise CasUnknown(str(e)) from e

    return read, write


__all__ = [
    "Apply", "Done", "Moot", "Wait", "Verdict", "Intent", "ReplaceBookie", "CloseAt", "fragment_end",
    "is_sealed", "judge_lost_cas", "Backoff", "CasResult", "CasLost", "CasUnknown", "run_cas",
    "ledger_store_io",
]
