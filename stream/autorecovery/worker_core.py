"""The replication worker's decisions, as pure code (no I/O, no clock).

Given a ledger's metadata (all fragments) and the set of lost bookies,
:func:`plan_ledger` says, per fragment naming a lost bookie:

- :class:`FragmentJob` -- a sealed fragment to copy: which entries (the
  fragment's range), which ensemble position the lost bookie held, and
  which surviving bookies hold copies of those entries (the other members
  of the write sets that include that position);
- :class:`Unrecoverable` -- some entries of the fragment have no surviving
  replica (Qw = 1, or every member of a write set is lost): reported and
  counted, never "recovered" with made-up data (apache/bookkeeper#4872);
- ``open_fragment`` -- the newest fragment of an OPEN ledger names a lost
  bookie: its writer owns it.  :func:`judge_task` waits ``grace`` for the
  writer to change its ensemble, then asks for the ledger to be sealed
  (classic: fence and recover; stream: take-over, term + 1, whose recovery
  replaces the lost bookie and seals the fragment).

Who the writer is comes with the plan (``LedgerPlan.writer``, what etcd
says: ``stream.writer_lease.judge_writer`` of the stream's lease-bound
writer key, read beside the metadata):

- *A live writer at the stream's current term*: the open fragment is left to
  it, past the grace too (WAIT): it changes its ensemble itself, as soon as a
  bookie can replace the lost one (its registration watch), and sealing
  would fence a working writer.  What bounds the wait is ``writer_bound``
  (far longer than the grace; default 10 minutes in ``WorkerConfig``): a
  lease proves the process and its keeper thread run, not that its writer
  makes progress (a wedged event loop keeps refreshing), so after the bound
  the fragment is sealed anyway; the writer then sees WriterFenced on its
  next append, an error it can act on, rather than a fragment left with one
  replica less for ever.  Not "never" for that reason; not the grace,
  because a writer that cannot change its ensemble has no spare bookie, and
  then neither has the worker: sealing early only takes the stream from it.
- *No live writer* (no key, or a STALE one naming an older term: a fenced
  writer's, until its lease ends): SEAL after the grace, as without
  registrations.  Not at once when the key is known gone: a writer registers
  just after its take-over's final CAS, and creates its key again after an
  etcd outage longer than its TTL; in both windows it is alive without a key,
  and the grace (counted from the task's first sight, after the auditor's
  delay) covers them.  A writer dead for good costs the grace once.
- *Unknown* (classic ledgers, whose writers do not register; manual
  recovery): as before, SEAL after the grace.

Sealed fragments come first, in entry order.  :func:`judge_task` turns a
plan into the one next step of the task (copy, seal, wait, report, done).
Replacing the bookie in the metadata once the copy is done is the life-cycle
core's verdict (``stream.lifecycle.ReplaceBookie``), not decided here.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Iterable

from metadata.ledgers import LedgerMetadata, LedgerMode, LedgerState
from stream import password as ledger_password
from stream.lifecycle import fragment_end
from stream.quorum import write_set
from stream.writer_lease import Liveness


@dataclasses.dataclass(frozen=True)
class FragmentJob:
    ledger_id: int
    first_entry: int
    last_entry: int                 # inclusive; < first_entry: no entries (replace only)
    ensemble: tuple[str, ...]
    index: int                      # the lost bookie's position
    lost: str
    sources: tuple[str, ...]        # surviving bookies sharing a write set with ``index``
    ensemble_size: int
    write_quorum: int
    term: int                       # the ledger's term (0: classic)
    mode: LedgerMode
    # the ledger's master key from its metadata (stream/password.py: the copy
    # credential; b"": no password), sent with the target's clearing and copies
    master_key: bytes = dataclasses.field(default=b"", repr=False)
    # a damaged bookie's known ids filled in place: the range is only those
    # ids (within the fragment starting at ``fragment_first``), the target
    # the bookie itself, nothing cleared, nothing replaced in the metadata
    fill: bool = False
    fragment_first: int | None = None

    @property
    def entries(self) -> int:
        """Entry ids of the range that the lost position held."""
        n = max(0, self.last_entry - self.first_entry + 1)
        if self.write_quorum == self.ensemble_size:
            return n
        full, rest = divmod(n, self.ensemble_size)
        held = full * self.write_quorum
        held += sum(1 for k in range(rest)
                    if self.index in write_set(self.first_entry + k, self.ensemble_size, self.write_quorum))
        return held

    def holds(self, entry_id: int) -> bool:
        """Whether the lost position held ``entry_id`` (its write set)."""
        return self.index in write_set(entry_id, self.ensemble_size, self.write_quorum)

    def replica_of(self, source: str, entry_id: int) -> bool:
        """Whether ``source`` is a replica of ``entry_id`` (its position is
        in the id's write set).  Only a replica's record is copied: a bookie
        may hold records at other ids of the range, which are no replica's
        (a leftover of an earlier term's fragment that a later one replaced
        from the same first entry, e.g. a recovery's truncate no-op where
        the next term recovered the entry), and which a reader never asks it
        for."""
        ws = write_set(entry_id, self.ensemble_size, self.write_quorum)
        return any(self.ensemble[i] == source for i in ws)


@dataclasses.dataclass(frozen=True)
class Unrecoverable:
    ledger_id: int
    first_entry: int
    last_entry: int | None
    lost: frozenset[str]
    why: str


@dataclasses.dataclass(frozen=True)
class LedgerPlan:
    ledger_id: int
    jobs: tuple[FragmentJob, ...]                 # sealed fragments, in entry order
    unrecoverable: tuple[Unrecoverable, ...]
    open_fragment: int | None                     # first entry of an open fragment naming a lost bookie
    state: LedgerState
    mode: LedgerMode
    writer: Liveness = Liveness.UNKNOWN            # the stream's writer, as its lease-bound key says
    # a damaged bookie's known bad ids in the open fragment above the LAC
    # the plan was given (``open_lac``; None: all of them): the task waits
    # for them (never seals for them: its writer may still be sending them)
    held_open: bool = False

    @property
    def clean(self) -> bool:
        return not self.jobs and not self.unrecoverable and self.open_fragment is None and not self.held_open


def plan_ledger(meta: LedgerMetadata, lost: Iterable[str], damaged: Iterable[str] = (),
                writer: Liveness = Liveness.UNKNOWN, damaged_ids: dict | None = None,
                open_lac: int | None = None, open_end: int | None = None) -> LedgerPlan:
    """The work ``lost`` leaves on ledger ``meta`` (all fragments loaded).
    ``damaged``: registered bookies the periodic check found lacking
    entries; their sealed fragments are copied like a lost bookie's, but an
    open fragment naming one stays its writer's (the bookie is alive).  A
    damaged bookie is alive and holds most of its entries: it is a source
    for the others' copies (after the healthy replicas) and, last, for its
    own; a write set of damaged bookies is no reason to report a fragment
    (the copy counts the ids no replica holds).  ``damaged_ids``: a damaged
    bookie's ids known bad (bookie -> inclusive ranges: the ids its scrub
    found rotted, or a full check found it lacking): only those are copied,
    back onto it (``FragmentJob.fill``), in its sealed fragments and in the
    open one up to ``open_lac`` (a LAC read from its bookies: ids up to it
    were acknowledged and are final, its writer's adds are above; ids above
    it wait: ``held_open``, for the LAC to pass them or, with no live
    writer, for the ledger's seal); a damaged bookie without ranges has its
    whole share of each copied.  ``open_end``: the end a take-over's
    recovery found (this worker's seal of the stream): every id up to it
    final (written back whole by the recovery), the ids above it no entries
    (every bookie deleted its records above the recovery's truncate no-op,
    and a later writer's adds write them anew): not held.
    ``writer``: what the stream's writer key says (``judge_writer``)."""
    assert meta.fragments_complete, "plan on all fragments"
    damaged = frozenset(damaged)
    scoped = {b: rs for b, rs in (damaged_ids or {}).items() if b in damaged and rs}
    away = frozenset(lost) - damaged   # unregistered: what they held is gone
    lost = away | damaged
    E, Qw = meta.ensemble_size, meta.write_quorum
    jobs: list[FragmentJob] = []
    bad: list[Unrecoverable] = []
    open_first: int | None = None
    held_open = False
    for frag in meta.fragments:
        gone = [i for i, b in enumerate(frag.ensemble) if b in lost]
        if not gone:
            continue
        end = fragment_end(meta, frag.first_entry)
        sealed = end is not None
        if not sealed:
            if any(frag.ensemble[i] not in damaged for i in gone):
                open_first = frag.first_entry
            above = frag.first_entry if open_lac is None else max(frag.first_entry, open_lac + 1)
            held_open = held_open or any(
                i in write_set(e, E, Qw) for i in gone for a, b in scoped.get(frag.ensemble[i], ())
                for e in range(max(a, above), min(b, max(a, above) + E - 1,
                                                  b if open_end is None else open_end) + 1))
            if open_lac is None or open_lac < frag.first_entry:
                continue
            end = open_lac   # (below: only the scoped bookies' fill jobs, up to the LAC)
            gone = [i for i in gone if frag.ensemble[i] in scoped]
        count = end - frag.first_entry + 1
        # the write sets the fragment's entries use (at most E distinct ones)
        sets = {write_set(e, E, Qw) for e in range(frag.first_entry, frag.first_entry + min(count, E))}
        dead = [ws for ws in sets if all(frag.ensemble[i] in away for i in ws)]
        if dead and sealed:   # (an open fragment's are its seal's to find)
            bad.append(Unrecoverable(meta.ledger_id, frag.first_entry, end,
                                     frozenset(frag.ensemble[i] for i in gone),
                                     f"no surviving replica of the entries on write set "
                                     f"{[frag.ensemble[i] for i in dead[0]]}"))
            continue
        for i in gone:
            src = sorted({j for ws in sets if i in ws for j in ws if j != i and frag.ensemble[j] not in away},
                         key=lambda j: (frag.ensemble[j] in damaged, j))
            bookie = frag.ensemble[i]
            if bookie in damaged and bookie not in scoped:
                src.append(i)   # last: what only the damaged bookie itself still holds
            job = FragmentJob(meta.ledger_id, frag.first_entry, end, frag.ensemble, i, bookie,
                              tuple(frag.ensemble[j] for j in src), E, Qw, meta.term, meta.mode,
                              ledger_password.master_key(meta.custom))
            if bookie not in scoped:
                jobs.append(job)
                continue
            for a, b in scoped[bookie]:   # (its own bad copy is no source)
                lo, hi = max(a, frag.first_entry), min(b, end)
                part = dataclasses.replace(job, first_entry=lo, last_entry=hi, fill=True,
                                           fragment_first=frag.first_entry)
                if lo <= hi and part.entries:
                    jobs.append(part)
    return LedgerPlan(meta.ledger_id, tuple(jobs), tuple(bad), open_first, meta.state, meta.mode, writer, held_open)


def restrict_plan(plan: LedgerPlan, firsts: Iterable[int]) -> LedgerPlan:
    """The part of ``plan`` about the fragments starting at ``firsts`` (a
    Spark task's one fragment): the others' jobs, unrecoverable reports and
    open fragment belong to other tasks."""
    keep = frozenset(firsts)
    return dataclasses.replace(
        plan, jobs=tuple(j for j in plan.jobs if (j.fragment_first if j.fill else j.first_entry) in keep),
        unrecoverable=tuple(u for u in plan.unrecoverable if u.first_entry in keep),
        open_fragment=plan.open_fragment if plan.open_fragment in keep else None, held_open=False)


class Step(enum.Enum):
    COPY = "copy"          # copy plan.jobs[0] and replace it (then plan again)
    SEAL = "seal"          # fence/recover (classic) or take over (stream) the ledger
    WAIT = "wait"          # release the lock, retry later (open fragment within grace, recovery running)
    REPORT = "report"      # only unrecoverable fragments left: keep the task, marked
    DONE = "done"          # nothing names a lost bookie: delete the task


def judge_task(plan: LedgerPlan, now: float, first_seen: float, grace: float,
               writer_bound: float = float("inf")) -> Step:
    """The next step for one task.  ``first_seen``: when this worker first
    saw the task with the open fragment; the writer has ``grace`` to change
    its ensemble itself, and a writer live at the stream's term (``plan.writer``)
    has until ``writer_bound`` (see the module docstring).  A damaged
    bookie's ids in the open fragment above its LAC (``plan.held_open``)
    are waited for the same way: a live writer's adds pass them (its
    explicit LAC too, once they go quiet); with no live writer (one that
    crashed before its LAC went out: the LAC stays below its last entries
    for good) the seal decides them, as it does a lost bookie's."""
    if plan.jobs:
        return Step.COPY
    if plan.open_fragment is not None or plan.held_open:
        if plan.state is LedgerState.IN_RECOVERY:
            return Step.WAIT
        waited = now - first_seen
        if plan.writer is Liveness.LIVE:
            return Step.SEAL if waited >= max(grace, writer_bound) else Step.WAIT
        return Step.SEAL if waited >= grace else Step.WAIT
    if plan.unrecoverable:
        return Step.REPORT
    return Step.DONE


def jobs_left(jobs: Iterable[FragmentJob], waiting: Iterable[tuple[int, str]],
              done: Iterable[tuple[int, int, str]]) -> list[FragmentJob]:
    """The jobs of a plan a worker's call still has to do.  ``waiting``:
    (first entry, bookie) of replacements that must wait (their CAS judged
    so); ``done``: (first, last, bookie) of ranges copied in place this
    call.  A fill is done for the range it copied only: an open fragment's
    range grows as its LAC passes more of the damaged ids (the next round's
    job starts at the same id and ends higher), and those ids are not yet
    filled."""
    waiting, done = set(waiting), set(done)
    return [j for j in jobs if (j.first_entry, j.lost) not in waiting
            and (j.first_entry, j.last_entry, j.lost) not in done]


@dataclasses.dataclass(frozen=True)
class Round:
    """One round of a worker's call on a ledger (``judge_round``)."""
    step: Step
    jobs: tuple[FragmentJob, ...]    # left to do, in order (COPY: the first)
    unrecoverable: tuple[dict, ...]  # the fragments to report: {"first", "last", "lost", "why"}


def judge_round(plan: LedgerPlan, now: float, first_seen: float, grace: float,
                writer_bound: float = float("inf"), *, known: Iterable[tuple[int, int]] = (),
                absent: dict | None = None,
                waiting: Iterable[tuple[int, str]] = (), filled: Iterable[tuple[int, int, str]] = (),
                seal: bool = True) -> Round:
    """The next step of a worker's call (``service.recover_ledger_fragments``,
    and the simulation's worker) on a fresh ``plan``, given what the call
    has done so far: ``known`` ((first, last) of the ranges its task reports
    unrecoverable already, while every bookie they name is still lost: not
    copied again), ``absent`` ((first, last) -> the report of a range this
    call's copy found entries of on no replica), ``waiting`` and ``filled``
    (``jobs_left``).  ``seal``: False waits instead (no take-over); a call
    seals a ledger once at most: its lost bookies are those of its start,
    and one registered again since (a restart) is no bookie the seal's
    recovery replaces, so a plan naming it in the open fragment after the
    seal would seal it again, and again (the next call judges it afresh).  A call
    never ends DONE with a replacement waiting (WAIT) or a report to make
    (REPORT).  A report is known by its range: a fragment's (no replica
    of a write set), or a fill's (some of a damaged bookie's ids held by no
    other replica), which may start at the same id."""
    known, absent, waiting = frozenset(known), absent or {}, set(waiting)
    unrec = [{"first": u.first_entry, "last": u.last_entry, "lost": sorted(u.lost), "why": u.why}
             for u in plan.unrecoverable]
    reported = known | absent.keys()
    skipped = [j for j in plan.jobs if (j.first_entry, j.last_entry) in reported]
    unrec += [absent[j.first_entry, j.last_entry] for j in skipped if (j.first_entry, j.last_entry) in absent]
    unrec += [{"first": j.first_entry, "last": j.last_entry, "lost": [j.lost], "why": "reported before"}
              for j in skipped if (j.first_entry, j.last_entry) not in absent]
    jobs = tuple(jobs_left((j for j in plan.jobs if j not in skipped), waiting, filled))
    step = judge_task(dataclasses.replace(plan, jobs=jobs), now, first_seen, grace, writer_bound)
    if step is Step.SEAL and not seal:
        step = Step.WAIT
    if step in (Step.DONE, Step.REPORT) and waiting:
        step = Step.WAIT
    elif step is Step.DONE and unrec:
        step = Step.REPORT
    return Round(step, jobs, tuple(unrec))


def expected_last_entries(meta: LedgerMetadata) -> dict[str, int]:
    """For the periodic check: per bookie, the highest entry id it must
    hold in the ledger's *sealed* fragments (the top of each fragment's range
    among the ids whose write set includes its position).  Trimmed ledgers
    and empty fragments need nothing."""
    assert meta.fragments_complete
    out: dict[str, int] = {}
    E, Qw = meta.ensemble_size, meta.write_quorum
    for frag in meta.fragments:
        end = fragment_end(meta, frag.first_entry)
        if end is None or end < max(frag.first_entry, meta.trimmed_before):
            continue
        for i, b in enumerate(frag.ensemble):
            top = next((e for e in range(end, max(frag.first_entry, end - E + 1) - 1, -1)
                        if i in write_set(e, E, Qw)), None)
            if top is not None:
                out[b] = max(out.get(b, -1), top)
    return out


def judge_check(expected: dict[str, int], answers: dict[str, int | None]) -> frozenset[str]:
    """The bookies the check finds lacking entries.  ``answers``: bookie ->
    the highest entry id it says it holds of the ledger (None: it does not
    know the ledger); a bookie that did not answer is absent from
    ``answers`` and judged by nothing (unknown is not missing)."""
    return frozenset(b for b, need in expected.items()
                     if b in answers and (answers[b] is None or answers[b] < need))


def missing_tails(expected: dict[str, int], answers: dict[str, int | None]) -> dict[str, list[list[int]]]:
    """The ids the check knows each bookie it finds lacking entries lacks:
    above the highest it holds, up to the highest it must (``plan_ledger``
    keeps of the range only the ids its positions hold, in the sealed
    fragments naming it), to be filled in place (``Task.damaged_ids``).  A
    bookie that does not know the ledger has none: its whole share is
    moved, as for a wiped disk.  A gap below what it holds is not seen
    here (the full check's)."""
    return {b: [[answers[b] + 1, expected[b]]] for b in judge_check(expected, answers)
            if answers[b] is not None}


def choose_target(job: FragmentJob, candidates: Iterable[str], excluded: Iterable[str] = ()) -> str | None:
    """A target for ``job`` among ``candidates`` (writable bookies, in the
    placement policy's order): never a member of the fragment, never
    excluded (lost, quarantined)."""
    skip = set(job.ensemble) | set(excluded)
    return next((b for b in candidates if b not in skip), None)


class Pace:
    """Re-replication's rate limit (BookKeeper's ``replicationRateByBytes``):
    copies go at ``rate`` bytes/s on average, so a lost bookie's data does
    not take the surviving bookies' disks and network from the writers and
    readers.  A token bucket in its GCRA form, as pure code: the clock is
    an input.  :meth:`take` books ``n`` bytes sent at ``now`` and says how
    long to wait before sending them; up to ``burst`` bytes go at once.
    One ``Pace`` per worker (or manual recovery) spans all its copies.
    ``held``: the seconds during which some frame was waiting its turn (the
    union of the waits: at most the time gone by; about all of it when the
    limit, not the disks, bounds the copies)."""

    def __init__(self, rate: float, burst: int = 1 << 20) -> None:
        if not rate > 0:
            raise ValueError(f"a rate limit must be positive, not {rate!r}")
        if burst <= 0:
            raise ValueError(f"a burst must be positive, not {burst!r}")
        self.rate, self.burst = float(rate), burst
        self._tat = float("-inf")   # the theoretical arrival time of the next byte
        self.held = 0.0
        self._held_until = float("-inf")

    @classmethod
    def of(cls, rate: float) -> "Pace | None":
        """The limit of ``rate`` bytes/s; None for 0 (no limit: the
        settings' default)."""
        return cls(rate) if rate else None

    def take(self, now: float, n: int) -> float:
        tat = max(self._tat, now)
        self._tat = tat + n / self.rate
        wait = max(0.0, tat - now - self.burst / self.rate)
        if wait:
            self.held += now + wait - max(now, self._held_until)
            self._held_until = now + wait
        return wait


__all__ = ["FragmentJob", "Unrecoverable", "LedgerPlan", "plan_ledger", "restrict_plan", "jobs_left", "Round",
           "judge_round", "Step", "judge_task", "choose_target", "expected_last_entries", "judge_check", "missing_tails", "Pace"]
