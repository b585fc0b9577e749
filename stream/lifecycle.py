"""The ledger life-cycle core: every metadata step of a ledger's life as a
pure verdict on its metadata, and the one asyncio CAS runner that executes
them.

A metadata change is an *intent*; judging it against the metadata as read
gives one of:

- :class:`Apply`: CAS the header (and fragments) to this; the change holds.
- :class:`Done`: the metadata already shows the intent's effect (another
  process, or our own CAS whose answer was lost, did it): adopt it.
- :class:`Moot`: the intent can no longer apply; ``kind`` says why, for the
  adapter's typed error: GONE (no ledger), FENCED (a recoverer or a newer
  term owns the ledger), CLOSED_ELSEWHERE (closed at another entry),
  ALREADY_CLOSED (nothing to recover), WRONG_MODE, CHANGED (the fragment
  or state changed since the intent was planned).
- :class:`Wait`: not now (the ledger is being recovered, the fragment is
  still open): retry later; ``retriable`` errors come from here.

The intents, one per step (every path runs them through :func:`run_cas`):

============================ =============================================== ==================================
intent                       the step                                        who runs it
============================ =============================================== ==================================
:class:`TakeOver`            unbounded: term + 1, any state -> IN_RECOVERY   ``stream.stream.take_over``, sim
:class:`FinishTakeOver`      IN_RECOVERY at our term -> OPEN (+ the          ``stream.stream.take_over``, sim
                             recovery's fragment); a newer term: FENCED
:class:`BeginRecovery`       classic: OPEN -> IN_RECOVERY (IN_RECOVERY:      ``ledger_recovery.recover_ledger``,
                             recover anyway; CLOSED: nothing to do)    sim
:class:`CloseRecovered`      classic: IN_RECOVERY -> CLOSED at the last      ``ledger_recovery.recover_ledger``,
                             entry (+ fragment); CLOSED: Done (adopt its     sim
                             last entry: recoverers converge)
:class:`CloseAt`             a writer's close: OPEN -> CLOSED                ``LedgerHandle._close_metadata``, sim
:class:`ChangeEnsemble`      the writer's ensemble change or roll: a new     ``LedgerWriter._publish_change``,
                             fragment while OPEN at its term                 sim
:class:`ReplaceBookie`       re-replication of a sealed fragment             autorecovery, ``bookstream recover``
============================ =============================================== ==================================

The verdict on a *lost CAS* is the same function applied to the metadata
read after the loss (:func:`judge_lost_cas`): a lost CAS never means "retry
blindly" nor "failed" by itself; e.g. a lost ensemble change is retried on
the new revision while the ledger is still OPEN at the writer's term, and is
FENCED otherwise.  :func:`run_cas` reads (or starts from metadata the caller
holds), judges, writes, and on a lost or unknown CAS re-reads and judges
again, with one back-off (:class:`Backoff`).  No clock, no I/O here except
in ``run_cas``, whose I/O is the callables it is given (the simulator
executes an Apply on its own metadata store).  Broken rules for tests come
in as an explicit :class:`stream.mutations.Mutations` field of an intent.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Awaitable, Callable, Protocol, Union

from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from stream import mutations as M
from stream.mutations import NONE as NO_MUTATIONS
from stream.mutations import Mutations

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


# Moot kinds: why an intent can no longer apply (the adapter's typed error)
GONE = "gone"                          # the ledger does not exist
FENCED = "fenced"                      # a recoverer or a newer term owns the ledger
CLOSED_ELSEWHERE = "closed_elsewhere"  # CLOSED at another last entry
WRONG_MODE = "wrong_mode"              # e.g. a take-over of a classic ledger
CHANGED = "changed"                    # the fragment changed since the intent was planned
ALREADY_CLOSED = "already_closed"      # CLOSED: nothing to recover (adopt its last entry)


@dataclasses.dataclass(frozen=True)
class Moot:
    """The intent can no longer apply; nothing to do (``kind``: why)."""

    why: str
    kind: str = CHANGED


@dataclasses.dataclass(frozen=True)
class Wait:
    """Not now; judge again later."""

    why: str


Verdict = Union[Apply, Done, Moot, Wait]


class Intent(Protocol):
    ledger_id: int

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
            return Moot(f"ledger {self.ledger_id} is gone", GONE)
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
    mutations: Mutations = NO_MUTATIONS

    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        if meta is None:
            return Moot(f"ledger {self.ledger_id} is gone", GONE)
        if meta.state is LedgerState.CLOSED:
            if meta.last_entry == self.last_entry:
                return Done(f"ledger {self.ledger_id} closed at {self.last_entry}")
            return Moot(f"ledger {self.ledger_id} closed at {meta.last_entry}, not {self.last_entry}",
                        CLOSED_ELSEWHERE)
        if meta.state is LedgerState.IN_RECOVERY and M.CLOSE_DESPITE_RECOVERY not in self.mutations:
            return Moot(f"ledger {self.ledger_id} is in recovery", FENCED)
        return Apply(meta.with_(state=LedgerState.CLOSED, last_entry=self.last_entry))


# -- the writer's steps: ensemble change, roll ------------------------------------------

def writer_verdict(meta: LedgerMetadata | None, ledger_id: int, term: int,
                   mutations: Mutations = NO_MUTATIONS) -> Moot | None:
    """A writer at ``term`` (0: classic) still owns the ledger when it is
    OPEN at that term; else a Moot: GONE, or FENCED (closed, being recovered,
    or a newer term took over)."""
    if meta is None:
        return Moot(f"ledger {ledger_id} is gone", GONE)
    if (meta.state is not LedgerState.OPEN or meta.term != term) and M.CHANGE_DESPITE_FENCE not in mutations:
        return Moot(f"ledger {ledger_id} is {meta.state.name} at term {meta.term}", FENCED)
    return None


@dataclasses.dataclass(frozen=True)
class ChangeEnsemble:
    """The writer's ensemble change or roll: publish ``fragment`` (a new
    last fragment, or the current last one's replacement when it starts at
    the same entry) while the ledger is OPEN at the writer's ``term``.

    - not the writer's any more (:func:`writer_verdict`): Moot FENCED/GONE;
    - the last fragment is ``fragment`` already: Done (our CAS went through);
    - else Apply on this revision (a lost CAS while still OPEN at our term:
      another change to the header, e.g. a trim or a re-replication: retry).
    """

    ledger_id: int
    term: int
    fragment: Fragment
    mutations: Mutations = NO_MUTATIONS

    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        fenced = writer_verdict(meta, self.ledger_id, self.term, self.mutations)
        if fenced is not None:
            return fenced
        assert meta is not None and meta.last_fragment is not None, "judge with the last fragment loaded"
        if meta.last_fragment == self.fragment:
            return Done(f"ledger {self.ledger_id}: fragment {self.fragment} published")
        return Apply(meta, (self.fragment,))


# -- preparing the bookies that join a fragment (term-based ledgers) -------------------------

PREPARED, PREPARE_FAILED = 0, -1


def to_prepare(ensemble, new, mutations: Mutations = NO_MUTATIONS) -> list[str]:
    """The bookies a new fragment (ensemble ``new`` after ``ensemble``: a
    writer's change or roll, a recovery's replacement) must prepare before it
    is published: those joining it.  (Classic ledgers prepare none:
    ``stream.ledger_write.prepare_bookies`` returns at term 0.)"""
    if M.JOIN_UNPREPARED in mutations:  # tests only
        return []
    return [b for b in new if b not in ensemble]


def prepare_answer(ok: bool, invalid_term: int | None) -> int:
    """One joining bookie's answer to Prepare: PREPARED; the newer term
    (> 0) when it refused with INVALID_TERM (``invalid_term``: the term it
    holds); PREPARE_FAILED otherwise (no answer, an error)."""
    if invalid_term is not None:
        return max(1, invalid_term)
    return PREPARED if ok else PREPARE_FAILED


def prepare_verdict(answers: list[int]) -> int:
    """The joining bookies' answers together: a newer term wins (the writer
    is fenced), then a failure (choose again), else PREPARED.  Classic
    ledgers (term 0) need no preparation: no answers, PREPARED."""
    if any(a > 0 for a in answers):
        return max(answers)
    return min(answers, default=PREPARED)


# -- the stream take-over: term + 1, then OPEN ----------------------------------------------

@dataclasses.dataclass(frozen=True)
class TakeOver:
    """Begin a stream take-over: term + 1 and IN_RECOVERY, whatever the
    state (a crashed or slow take-over's IN_RECOVERY is taken over too).
    Applied once per take-over: a lost CAS is judged on the new metadata,
    so the term raised is the newest one + 1.  Moot: GONE, WRONG_MODE."""

    ledger_id: int
    mutations: Mutations = NO_MUTATIONS

    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        if meta is None:
            return Moot(f"ledger {self.ledger_id} is gone", GONE)
        if meta.mode is not LedgerMode.UNBOUNDED:
            return Moot(f"ledger {self.ledger_id} is not an unbounded ledger", WRONG_MODE)
        term = meta.term if M.TAKEOVER_KEEPS_TERM in self.mutations else meta.term + 1
        return Apply(meta.with_(term=term, state=LedgerState.IN_RECOVERY))


@dataclasses.dataclass(frozen=True)
class FinishTakeOver:
    """Finish a take-over at ``term``: IN_RECOVERY -> OPEN, publishing the
    recovery's ensemble change (``change``: the last fragment with a bookie
    replaced) with it.  OPEN at ``term``: Done (our CAS went through); any
    other term: Moot FENCED (a newer take-over)."""

    ledger_id: int
    term: int
    change: Fragment | None = None
    mutations: Mutations = NO_MUTATIONS

    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        if meta is None:
            return Moot(f"ledger {self.ledger_id} is gone", GONE)
        newer = meta.term != self.term
        if newer and M.FINISH_DESPITE_NEWER_TERM not in self.mutations:
            return Moot(f"ledger {self.ledger_id}: term {meta.term} took over", FENCED)
        if meta.state is LedgerState.OPEN and not newer:
            return Done(f"ledger {self.ledger_id}: term {self.term} open")
        return Apply(meta.with_(state=LedgerState.OPEN, term=self.term), () if self.change is None else (self.change,))


# -- classic recovery: fence, then CLOSED at the last entry ---------------------------------

@dataclasses.dataclass(frozen=True)
class BeginRecovery:
    """Begin a classic recovery: OPEN -> IN_RECOVERY.  IN_RECOVERY already:
    Done (another recoverer, or one that crashed: recover anyway); CLOSED:
    Moot ALREADY_CLOSED (nothing to recover: the caller adopts its last
    entry)."""

    ledger_id: int

    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        if meta is None:
            return Moot(f"ledger {self.ledger_id} is gone", GONE)
        if meta.state is LedgerState.OPEN:
            return Apply(meta.with_(state=LedgerState.IN_RECOVERY))
        if meta.state is LedgerState.CLOSED:
            return Moot(f"ledger {self.ledger_id} closed at {meta.last_entry}", ALREADY_CLOSED)
        return Done(f"ledger {self.ledger_id} is being recovered")


@dataclasses.dataclass(frozen=True)
class CloseRecovered:
    """Finish a classic recovery: IN_RECOVERY -> CLOSED at ``last_entry``,
    publishing the recovery's ensemble change with it.  CLOSED: Done at
    whatever last entry it has (a concurrent recoverer closed it: adopt it,
    recoverers converge); OPEN: Moot CHANGED (begin again)."""

    ledger_id: int
    last_entry: int
    change: Fragment | None = None

    def judge(self, meta: LedgerMetadata | None) -> Verdict:
        if meta is None:
            return Moot(f"ledger {self.ledger_id} is gone", GONE)
        if meta.state is LedgerState.CLOSED:
            return Done(f"ledger {self.ledger_id} closed at {meta.last_entry}")
        if meta.state is LedgerState.OPEN:
            return Moot(f"ledger {self.ledger_id} is OPEN again", CHANGED)
        return Apply(meta.with_(state=LedgerState.CLOSED, last_entry=self.last_entry),
                     () if self.change is None else (self.change,))


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
                  sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                  known: tuple[LedgerMetadata, int] | None = None) -> CasResult:
    """Executes ``intent``: read, judge, write on Apply; after a lost or
    unknown CAS, back off, re-read and judge again (:func:`judge_lost_cas`).
    ``known``: the metadata and header revision the caller holds, judged
    first instead of a read (a stale one only costs a lost CAS).  Returns
    on Done / Moot / Wait or a successful write; after ``backoff.attempts``
    lost rounds returns ``Wait("CAS kept failing")``.  ``read`` returns
    (None, 0) for a missing ledger."""
    meta: LedgerMetadata | None = None
    rev = 0
    for attempt in range(backoff.attempts):
        try:
            if attempt == 0 and known is not None:
                meta, rev = known
            else:
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


async def read_known(read: Read, backoff: Backoff = Backoff(),
                     sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> tuple[LedgerMetadata | None, int]:
    """``read()``, etcd's unavailability (``CasUnknown``) waited out with
    ``backoff`` as :func:`run_cas` waits it out, then raised: a metadata
    read that one slow connection to etcd should not fail."""
    for attempt in range(backoff.attempts):
        try:
            return await read()
        except CasUnknown as e:
            if attempt + 1 == backoff.attempts:
                raise
            log.info("metadata unavailable (%s), attempt %d", e, attempt + 1)
            await sleep(backoff.delay(attempt))
    raise AssertionError("unreachable")


def ledger_store_io(client, ledger_id: int, fragments: str = "all", guards=()) -> tuple[Read, Write]:
    """``read`` / ``write`` for :func:`run_cas` over a ``BookKeeperClient``'s
    ``LedgerStore`` (``fragments``: what ``read`` loads, "all" or "last";
    an Apply with fragments is one ``add_fragments`` transaction, without
    them a header CAS).  ``guards``: the fragments' transaction's other
    conditions (``LedgerStore.add_fragments``); one failing raises
    ``GuardFailed`` out of :func:`run_cas` (judging again cannot help)."""
    from metadata import errors as me

    async def read() -> tuple[LedgerMetadata | None, int]:
        try:
            return await asyncio.to_thread(client.ledgers.read, ledger_id, fragments)
        except me.NoSuchLedger:
            return None, 0
        except (me.MetadataUnavailable, me.Compacted) as e:
            raise CasUnknown(str(e)) from e

    async def write(apply: Apply, rev: int) -> tuple[LedgerMetadata, int]:
        assert apply.fragments or not guards, "guards ride on a fragments transaction"
        try:
            if apply.fragments:
                return await asyncio.to_thread(client.ledgers.add_fragments, ledger_id, list(apply.fragments),
                                               apply.header, rev, guards)
            new_rev = await asyncio.to_thread(client.ledgers.update_header, apply.header, rev)
            return apply.header, new_rev
        except me.GuardFailed:
            raise
        except (me.ConditionFailed, me.NoFragment, me.NoSuchLedger) as e:
            raise CasLost(str(e)) from e
        except (me.MetadataUnavailable, me.Compacted) as e:
            raise CasUnknown(str(e)) from e

    return read, write


async def run_ledger_cas(client, intent: Intent, *, known: tuple[LedgerMetadata, int] | None = None,
                         fragments: str = "last") -> CasResult:
    """:func:`run_cas` over a ``BookKeeperClient`` (its ``metadata_attempts``
    bound the back-off); other metadata errors leave as ``stream.errors``
    types.  The client's paths (take-over, recovery, close, ensemble change)
    read the last fragment only: their intents judge the newest one."""
    from stream import errors as err

    read, write = ledger_store_io(client, intent.ledger_id, fragments)
    try:
        return await run_cas(intent, read, write, Backoff(attempts=client.config.metadata_attempts), known=known)
    except Exception as e:
        raise err.translate(e) from e


__all__ = [
    "Apply", "Done", "Moot", "Wait", "Verdict", "Intent", "GONE", "FENCED", "CLOSED_ELSEWHERE", "WRONG_MODE",
    "CHANGED", "ALREADY_CLOSED", "ReplaceBookie", "CloseAt", "ChangeEnsemble", "TakeOver", "FinishTakeOver", "BeginRecovery",
    "CloseRecovered", "writer_verdict", "PREPARED", "PREPARE_FAILED", "to_prepare", "prepare_answer", "prepare_verdict", "fragment_end", "is_sealed", "judge_lost_cas", "Backoff", "CasResult",
    "CasLost", "CasUnknown", "run_cas", "read_known", "ledger_store_io", "run_ledger_cas",
]
