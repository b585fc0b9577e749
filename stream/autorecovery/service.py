"""The auditor and replication-worker processes, and the per-ledger recovery
they and manual recovery (``bookstream recover``) share.  Adapters: every
decision comes from the pure cores (``auditor_core``, ``worker_core``,
``stream.lifecycle``).

- :func:`recover_ledger_fragments` -- one ledger: plan, copy each sealed
  fragment naming a lost bookie (sealed ones first), replace the bookie by
  CAS (``ReplaceBookie`` through ``run_cas``), seal an open fragment past
  the grace period (classic: fence and recover; stream: take-over), report
  fragments with no surviving replica.
- :class:`ReplicationWorker` -- takes tasks under lease-bound locks, runs
  the above, deletes a task once its ledger is clean, marks unrecoverable
  fragments, releases the lock otherwise.
- :class:`Auditor` -- elected through a lease-bound key; drives
  ``AuditorCore`` with registrations and paged metadata scans; publishes
  one task per ledger; makes tasks moot for a bookie that comes back.
- :func:`scan_bookie` / :func:`recover_bookie` -- manual recovery.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import socket
import time
import uuid
from typing import Callable, Iterable

from bookie.core import Status
from metadata.errors import GuardFailed
from metadata.layout import KeyLayout
from metadata.ledgers import LedgerMode
from metadata.txn import created_at
from stream import errors as err
from stream.lifecycle import Apply, Backoff, Done, Moot, ReplaceBookie, ledger_store_io, read_known, run_cas
from stream.metrics import AutorecoveryMetrics
from stream.writer_lease import Liveness, judge_writer, read_writer

from stream.autorecovery.auditor_core import AuditorConfig, AuditorCore, Check, MootTasks, PublishTask, Scan
from stream.autorecovery.copier import CopyFailed, copy_fragment
from stream.autorecovery.keys import AutorecoveryKeys, LeaseSource, Task
from stream.autorecovery.replica_check import check_ledger, damaged, missing_ids
from stream.autorecovery.worker_core import (LedgerPlan, Pace, Step, expected_last_entries, judge_check,
                                             judge_round, missing_tails, plan_ledger, restrict_plan)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LedgerOutcome:
    ledger_id: int
    step: Step
    replaced: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)  # (first, lost, target)
    filled: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)  # (first, last, damaged bookie)
    entries: int = 0
    bytes: int = 0
    unrecoverable: list[dict] = dataclasses.field(default_factory=list)
    open_fragment: int | None = None
    sealed: bool = False
    note: str = ""
    writer: str = Liveness.UNKNOWN.value   # the stream's writer as its key said (writer_lease.Liveness)
    paced_seconds: float = 0.0   # time some frame of its copies waited under the rate limit (Pace.held)

    def as_json(self) -> dict:
        return {"ledger_id": self.ledger_id, "step": self.step.value, "entries": self.entries,
                "bytes": self.bytes, "replaced": [list(r) for r in self.replaced],
                "filled": [list(f) for f in self.filled],
                "unrecoverable": self.unrecoverable, "open_fragment": self.open_fragment,
                "sealed": self.sealed, "note": self.note, "writer": self.writer,
                "paced_seconds": round(self.paced_seconds, 3)}


async def _read_meta(client, lid: int):
    """The ledger's metadata, every fragment; etcd unavailable for a moment
    (a task's first connection on a loaded executor) waited out."""
    read, _ = ledger_store_io(client, lid)
    return await read_known(read)


async def recover_ledger_fragments(client, lid: int, lost: Iterable[str], *, damaged: Iterable[str] = (),
                                   damaged_ids: dict | None = None, target: str | None = None,
                                   dry_run: bool = False, grace: float = 0.0, first_seen: float | None = None,
                                   seal: bool = True, now: Callable[[], float] = time.monotonic,
                                   progress: Callable[[str, int, int], None] | None = None,
                                   keep_going: Callable[[], bool] = lambda: True,
                                   copy_token: int = 0,
                                   known_unrecoverable: Iterable[tuple[int, int]] = (),
                                   only: Iterable[int] | None = None,
                                   writer_bound: float | None = None,
                                   pace: Pace | None = None,
                                   max_rounds: int = 1000) -> LedgerOutcome:
    """Brings ledger ``lid`` back to full replication without the ``lost``
    bookies, as far as it can now.  ``progress(kind, entries, bytes)``:
    ``kind`` is "copy" (entries copied) or "fragment" (a fragment done).
    ``keep_going()`` is asked before each step and before a copy clears its
    target (a worker whose lock is gone stops: a read of the lock in etcd,
    so that a worker paused past its lease finds out when it wakes up).
    ``copy_token``: the fencing token of the ledger's lock held
    (``AutorecoveryKeys.try_lock``, the lock key's create revision).  Each
    copy's clearing of its target carries it (a bookie refuses it below a
    token it has seen: a copier paused past its lock cannot clear what a
    later holder's copy published), and each replacement's transaction
    guards on it (the lock key still created at that revision: a copier
    paused past its lock cannot publish a target a later holder has since
    cleared and is filling).  ``keep_going`` stops such a copier early; the
    token closes the windows between its read and the step.  0: no lock
    held, no fence (tests only).
    ``only``: the first entries of the fragments to work on (a Spark task's
    fragment); the ledger's other fragments are left alone.
    ``writer_bound``: a stream's writer key is read with its metadata, and
    an open fragment of a writer live at the stream's term is left to it up
    to this long (``worker_core.judge_task``); None (manual recovery): not
    asked, sealed after ``grace``.  ``pace``: the copies' rate limit
    (``worker_core.Pace``; None: none).  ``damaged_ids``: the ids of
    damaged bookies known bad, filled in place (``worker_core.plan_ledger``)."""
    damaged = frozenset(damaged)
    lost = frozenset(lost) | damaged
    guards = [created_at(KeyLayout(client.cluster).recovery_lock_key(lid), copy_token)] if copy_token else []
    first_seen = now() if first_seen is None else first_seen
    out = LedgerOutcome(lid, Step.DONE)
    waiting: set[tuple[int, str]] = set()   # fragments whose replacement must wait (this call)
    filled: set[tuple[int, int, str]] = set()   # ranges filled in place (this call): done
    absent: dict[tuple[int, int], dict] = {}   # (first, last) the copy found entries of on no replica
    known = set(known_unrecoverable)         # (first, last) already reported (the task): not copied again
    sealed_end: int | None = None            # a stream this call took over: its recovered end
    for _ in range(max_rounds):
        meta, _rev = await _read_meta(client, lid)
        if meta is None:
            out.step, out.note = Step.DONE, "ledger deleted"
            return out
        writer, record = Liveness.UNKNOWN, None
        if writer_bound is not None and meta.mode is LedgerMode.UNBOUNDED:
            record, _lease = await client.meta_call(read_writer, client.store, client.ledgers.layout, lid)
            writer = judge_writer(record, meta.term)
        plan = plan_ledger(meta, lost - damaged, damaged, writer, damaged_ids)
        if plan.held_open:   # a damaged bookie's ids in the open fragment: those up to its LAC are final
            lac = await _open_lac(client, meta)
            if lac is not None or sealed_end is not None:
                plan = plan_ledger(meta, lost - damaged, damaged, writer, damaged_ids,
                                   open_lac=max(-1 if lac is None else lac, -1 if sealed_end is None else sealed_end),
                                   open_end=sealed_end)
        if only is not None:
            plan = restrict_plan(plan, only)
        rnd = judge_round(plan, now(), first_seen, grace, float("inf") if writer_bound is None else writer_bound,
                          known=known, absent=absent, waiting=waiting, filled=filled,
                          seal=seal and not out.sealed)   # (once a call: see judge_round)
        step, jobs = rnd.step, rnd.jobs
        out.unrecoverable, out.open_fragment = list(rnd.unrecoverable), plan.open_fragment
        out.writer = writer.value
        out.step = step
        if dry_run or step in (Step.DONE, Step.WAIT, Step.REPORT) or not keep_going():
            if step is Step.WAIT and plan.open_fragment is not None and writer is Liveness.LIVE:
                out.note = (f"open fragment {plan.open_fragment} left to its live writer "
                            f"{record.writer_id} (term {record.term})")
            elif step is Step.WAIT and out.sealed and (plan.open_fragment is not None or plan.held_open):
                out.note = "sealed once in this call (a bookie it takes as lost may be back): judged again next call"
            elif step is Step.WAIT and plan.held_open and not jobs:
                out.note = ("a damaged bookie's ids in the open fragment above its LAC: filled once it passes them "
                            "(or, with no live writer, once the stream is sealed after the grace)")
            if dry_run:
                out.note = f"{len(jobs)} fragment(s) to copy ({sum(j.entries for j in jobs)} entries)"
            return out
        if step is Step.SEAL:
            end = await seal_ledger(client, lid, meta.mode)
            sealed_end = end if sealed_end is None or end is None else max(sealed_end, end)
            out.sealed = True
            continue
        job = jobs[0]
        tgt = target if target is not None and target not in job.ensemble and target not in lost else None
        fill = job.fill
        if fill:   # a damaged bookie's known bad ids: back onto it
            tgt = job.lost
        elif tgt is None:  # no target given, or the given one is in this fragment already
            # (a damaged bookie is registered and writable: a target like any other, but
            # an unregistered one is not, nor one of the fragment)
            exclude = set(job.ensemble) | (lost - damaged) | client.quarantined()
            try:
                (tgt,) = await client.choose_bookies(1, exclude, None)
            except err.NotEnoughBookies as e:
                if job.lost not in damaged:
                    out.step, out.note = Step.WAIT, f"no target for fragment {job.first_entry}: {e}"
                    return out
                # a damaged bookie and no spare one: it is alive, it takes the
                # copy itself (every entry of its position again, no clearing)
                tgt, fill = job.lost, True
        log.info("ledger %d: copying fragment %d..%d (%s at position %d) to %s%s from %s", lid, job.first_entry,
                 job.last_entry, job.lost, job.index, tgt, " in place" if fill else "", list(job.sources))
        try:
            stats = await copy_fragment(client, job, tgt, progress=(
                None if progress is None else lambda n, b: progress("copy", n, b)), pace=pace, keep_going=keep_going,
                copy_token=copy_token, clear=not fill)
        except CopyFailed as e:
            client.mark_failed(tgt)
            out.step, out.note = Step.WAIT, str(e)
            return out
        out.entries += stats.entries
        out.bytes += stats.bytes
        out.paced_seconds += stats.paced_seconds
        if stats.absent:
            # entries of the lost position that no surviving replica holds:
            # never "recovered" with a fragment naming a bookie without them
            absent[job.first_entry, job.last_entry] = {
                "first": job.first_entry, "last": job.last_entry, "lost": [job.lost],
                "why": f"{stats.absent} entries held by no surviving replica"}
            continue
        if fill:  # nothing to publish: the fragment names it already
            filled.add((job.first_entry, job.last_entry, job.lost))
            out.filled.append((job.first_entry, job.last_entry, job.lost))
            continue
        if not keep_going():
            out.step, out.note = Step.WAIT, "lock lost before the replacement"
            return out
        read, write = ledger_store_io(client, lid, guards=guards)
        try:
            res = await run_cas(ReplaceBookie(lid, job.first_entry, job.lost, tgt, job.ensemble), read, write,
                                Backoff())
        except GuardFailed as e:
            out.step, out.note = Step.WAIT, f"lock lost before the replacement: {e}"
            return out
        if isinstance(res.verdict, (Apply, Done)):
            out.replaced.append((job.first_entry, job.lost, tgt))
            if progress is not None:
                progress("fragment", 0, 0)
        elif isinstance(res.verdict, Moot):
            log.info("ledger %d: replacement moot: %s", lid, res.verdict.why)
        else:
            waiting.add((job.first_entry, job.lost))
    out.step, out.note = Step.WAIT, "too many rounds"
    return out


async def _open_lac(client, meta) -> int | None:
    """The open fragment's LAC, read from a covering set of its bookies (no
    term, no fence: nothing changes); None when none could be read."""
    from stream.ledger_read import read_lac_covering
    try:
        return await read_lac_covering(client, meta)
    except err.BookKeeperError as e:
        log.info("ledger %d: its LAC could not be read (%s): its open fragment's damaged ids wait", meta.ledger_id, e)
        return None


async def seal_ledger(client, lid: int, mode: LedgerMode) -> int | None:
    """Seals an open last fragment: classic ledgers are fenced and recovered
    (closed); a stream is taken over (term + 1, recovery with the truncate
    no-op; the recovery replaces the lost bookie) and left OPEN with no
    writer: a writer that opens it later takes it over again.  Returns a
    stream's recovered end: every id up to it is final (the recovery wrote
    each back to its whole write set, and the no-op after it to every
    bookie), though the LAC its bookies report stays where it was (None
    for a classic ledger: closed, its last entry in the metadata)."""
    if mode is LedgerMode.CLASSIC:
        from stream.ledger import recover_ledger
        await recover_ledger(client, lid)
        end = None
    else:
        from stream.stream import take_over
        _meta, _rev, first_free = await take_over(client, lid)
        end = first_free - 1
    log.info("ledger %d: sealed its open fragment (%s)", lid, mode.name)
    return end


async def plan_bookie(client, bookie: str) -> list[tuple[int, LedgerPlan]]:
    """(ledger id, plan) for every ledger whose fragments name ``bookie``
    (ledgers read page by page): what manual recovery of ``bookie`` does."""
    out = []
    async for named in scan_pages(client):
        for lid in sorted(lid for lid, bookies in named.items() if bookie in bookies):
            meta, _ = await client.meta_call(client.ledgers.read, lid)
            out.append((lid, plan_ledger(meta, {bookie})))
    return out


# -- the worker ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    grace: float = 30.0        # an open fragment's writer has this long to change its ensemble
    writer_bound: float = 600.0  # ... and a writer live at the stream's term this long (worker_core)
    poll: float = 2.0          # re-list tasks at least this often
    retry: float = 5.0         # a task released unfinished is not retried by this worker sooner
    rate: float = 0.0          # bytes/s this worker copies at, at most (worker_core.Pace); 0: no limit


def default_id(kind: str) -> str:
    return f"{kind}-{socket.gethostname()}-{os.getpid()}"


LOCK_TTL = 10  # s: a manual recovery's lease; a dead one's ledgers are free again after it


class RecoveryLocks:
    """The replication workers' per-ledger locks (``autorecovery/locks/``),
    held by a manual recovery (``bookstream recover``, with or without
    ``--spark``) under one lease: a worker, or another recovery, does not
    copy the same fragments at the same time (a second copy to the same
    target clears entries the first one's CAS already published).  Steps
    check the lock is still theirs (:meth:`still_mine`)."""

    def __init__(self, client, cluster: str, kind: str = "recover") -> None:
        from stream.autorecovery.keys import StoreLeases

        self.keys = AutorecoveryKeys(client.store, cluster)
        self.lease = StoreLeases(client.store, LOCK_TTL).acquire()
        self.holder = f"{default_id(kind)}-{uuid.uuid4().hex[:6]}"  # one holder per run
        self.held: dict[int, int] = {}   # ledger -> the hold's fencing token (``try_lock``)

    def take(self, lid: int) -> str | None:
        """None once this recovery holds ``lid``'s lock; else who holds it."""
        if lid in self.held:
            return None
        token = self.keys.try_lock(lid, self.holder, self.lease.id)
        if token is not None:
            self.held[lid] = token
            return None
        return self.keys.lock_holder(lid) or "someone"

    def still_mine(self, lid: int) -> bool:
        return self.keys.still_mine(lid, self.holder)

    def release(self) -> None:
        for lid in sorted(self.held):
            self.keys.unlock(lid, self.holder)
        self.held.clear()
        self.lease.close()


class ReplicationWorker:
    def __init__(self, client, keys: AutorecoveryKeys, leases: LeaseSource, cfg: WorkerConfig = WorkerConfig(),
                 worker_id: str | None = None) -> None:
        self.client, self.keys, self.leases, self.cfg = client, keys, leases, cfg
        self.id = worker_id or default_id("worker")
        self.first_seen: dict[int, float] = {}
        self.not_before: dict[int, float] = {}
        self.outcomes: list[LedgerOutcome] = []
        self.pace = Pace.of(cfg.rate)  # one limit over all this worker's copies
        AutorecoveryMetrics.default().rate_limit.set(cfg.rate)
        self._lease = None
        self._wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        cancel = await asyncio.to_thread(
            self.keys.store.watch_prefix, self.keys.layout.underreplicated_prefix(),
            lambda _e: loop.call_soon_threadsafe(self._wake.set), on_error=lambda _e: None)
        try:
            while not stop.is_set():
                try:
                    await self.round()
                except err.BookKeeperError as e:
                    log.warning("worker %s: %s", self.id, e)
                except Exception as e:  # etcd errors below the client's translation
                    log.warning("worker %s: %r", self.id, e)
                self._wake.clear()
                waiter = asyncio.ensure_future(self._wake.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait([waiter, stopper], timeout=self.cfg.poll, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
        finally:
            cancel()
            if self._lease is not None:
                await asyncio.to_thread(self._lease.close)

    async def _held_lease(self):
        if self._lease is None or self._lease.lost:
            self._lease = await asyncio.to_thread(self.leases.acquire)
        return self._lease

    async def round(self) -> int:
        """One pass over the tasks; returns how many were worked on."""
        if not await asyncio.to_thread(self.keys.enabled):
            return 0
        tasks = await asyncio.to_thread(lambda: list(self.keys.tasks()))
        worked = 0
        for task in tasks:
            if self.not_before.get(task.ledger_id, 0) > time.monotonic():
                continue
            lease = await self._held_lease()
            token = await asyncio.to_thread(self.keys.try_lock, task.ledger_id, self.id, lease.id)
            if token is None:
                continue
            worked += 1
            try:
                await self._work(task, lease, token)
            finally:
                await asyncio.to_thread(self.keys.unlock, task.ledger_id, self.id)
        return worked

    async def _work(self, task: Task, lease, token: int) -> None:
        task = await asyncio.to_thread(self.keys.get_task, task.ledger_id)  # as of holding the lock
        if task is None:
            return
        regs = await asyncio.to_thread(self.client.registry.list_bookies, False)
        back = ({r.bookie_id for r in regs} & task.lost) - task.damaged
        lost = task.lost - back  # a bookie back after its tasks were published: moot for it
        lid = task.ledger_id
        first = self.first_seen.setdefault(lid, time.monotonic())
        # fragments reported before stay reported while every bookie named in
        # the report is still lost: one back (a kill, not a lost disk) may
        # hold the only other copy, and the fragment is recoverable again
        known = {(u.get("first"), u.get("last")) for u in task.unrecoverable if set(u.get("lost", ())) <= lost}
        out = await recover_ledger_fragments(self.client, lid, lost - task.damaged, damaged=task.damaged,
                                             damaged_ids=task.damaged_ids,
                                             grace=self.cfg.grace, first_seen=first, known_unrecoverable=known,
                                             writer_bound=self.cfg.writer_bound, pace=self.pace,
                                             keep_going=lambda: not lease.lost and self.keys.still_mine(lid, self.id),
                                             copy_token=token)
        self.outcomes.append(out)
        AutorecoveryMetrics.default().task(out)  # stream/metrics.py
        log.info("worker %s: ledger %d: %s (%d replaced, %d entries) %s", self.id, lid, out.step.value,
                 len(out.replaced), out.entries, out.note)
        # A target lost between its copy and the replacement's CAS, after the
        # auditor's scan for it read this ledger, is found by nobody else:
        # the task stays, naming it too (its registration went before the CAS).
        gone: set[str] = set()
        if out.replaced:
            now_regs = await asyncio.to_thread(self.client.registry.list_bookies, False)
            gone = {t for _, _, t in out.replaced} - {r.bookie_id for r in now_regs}
        if out.step is Step.DONE and not gone:
            if await asyncio.to_thread(self.keys.delete_task, task):
                self.first_seen.pop(lid, None)
                return
        changes: dict = {}
        new = [u for u in out.unrecoverable if (u["first"], u["last"]) not in known]
        standing = tuple(u for u in task.unrecoverable if (u.get("first"), u.get("last")) in known)
        if new or len(standing) != len(task.unrecoverable):
            # reported: visible in the task, counted by `autorecovery status`;
            # a report naming a bookie since back no longer stands
            changes["unrecoverable"] = standing + tuple(new)
        if back and out.step is Step.REPORT:
            changes["lost"] = lost
        if gone:
            changes["lost"] = frozenset(changes.get("lost", task.lost)) | gone
            log.warning("worker %s: ledger %d: target(s) %s gone since their copy: kept in the task", self.id,
                        lid, sorted(gone))
        # ids filled in place, the task waiting on: off it, so as not to be copied again each round
        new = dataclasses.replace(task, **changes).mended(out.filled)
        if new != task:  # one CAS; lost to a concurrent change, it is redone next round
            await asyncio.to_thread(self.keys.update_task, new)
        self.not_before[lid] = time.monotonic() + (self.cfg.retry if out.step is not Step.WAIT or
                                                   out.open_fragment is None else 0.5)


# -- the auditor --------------------------------------------------------------------------

async def scan_pages(client, page: int = 100):
    """Yields ``{ledger id: bookies its fragments name}`` a page of ledgers
    at a time: one scan of the ledgers' keys (``LedgerStore.named_bookies``,
    each page of keys at the then current revision), read lazily."""
    it = client.ledgers.named_bookies()
    while True:
        named = await asyncio.to_thread(lambda: dict(itertools.islice(it, page)))
        if not named:
            return
        yield named


async def run_check(client, keys: AutorecoveryKeys, page: int = 100, timeout: float = 5.0,
                    full: bool = False, percent: float = 100.0, pass_no: int | None = None) -> int:
    """The periodic check: every registered bookie named by a sealed
    fragment is asked, with one ``ReadLac`` per ledger (the existing RPC;
    without a term or the fence it changes nothing), the highest entry it
    holds; one below what its fragments need, or a ledger it does not know,
    publishes a task naming it as damaged.  Cheap (one small RPC per ledger
    and bookie, no entry read): it finds a wiped disk, a lost ledger or a
    missing tail (a classic fragment's failed bookie: its ids published,
    to be filled in place, ``missing_tails``), not one entry missing in
    the middle of a range.  ``full``: every entry read from every replica
    instead (``replica_check``, BookKeeper's LedgerChecker), which finds
    those too, and records failing their checksum, at the cost of reading
    every sealed fragment Qw times; ``percent`` below 100 reads only that
    share of each fragment's ids (its first and last always:
    ``replica_check.sampled_ranges``: the windows of the ``pass_no``-th
    pass, taken in turn, every id read within ``ceil(100 / percent)``
    passes; None: drawn at random).  Returns the ledgers found damaged."""
    registered = {r.bookie_id for r in await asyncio.to_thread(client.registry.list_bookies, False)}
    found = 0
    async for named in scan_pages(client, page):
        for lid in named:
            meta, _ = await _read_meta(client, lid)
            if meta is None:
                continue
            if full:
                frags = await check_ledger(client, meta, timeout=timeout, percent=percent, pass_no=pass_no)
                bad = damaged(frags, registered)
                if bad:
                    found += 1
                    ids = missing_ids(frags, bad)
                    await asyncio.to_thread(keys.publish, lid, bad, True, ids)
                    lacking = {b: sum(z - a + 1 for a, z in ids[b]) for b in bad}
                    log.warning("full check: ledger %d: %s lack entries or hold bad records (ids lacking: %s)", lid,
                                sorted(bad), lacking)
                continue
            expected = {b: e for b, e in expected_last_entries(meta).items() if b in registered}
            answers: dict[str, int | None] = {}

            async def ask(b: str) -> None:
                bc = await client.bookie(b)
                if bc is None:
                    return
                try:
                    r = await bc.read_lac(lid, timeout=timeout)
                except Exception:
                    return  # unknown is not missing
                if r.status == Status.NO_SUCH_LEDGER:
                    answers[b] = None
                elif r.status == Status.OK:
                    answers[b] = r.last_entry
            await asyncio.gather(*(ask(b) for b in expected))
            bad = judge_check(expected, answers)
            if bad:
                found += 1
                await asyncio.to_thread(keys.publish, lid, bad, True, missing_tails(expected, answers))
                log.warning("check: ledger %d: %s lack entries (need %s, hold %s)", lid, sorted(bad),
                            {b: expected[b] for b in bad}, {b: answers[b] for b in bad})
    return found


class Auditor:
    def __init__(self, client, keys: AutorecoveryKeys, leases: LeaseSource, cfg: AuditorConfig = AuditorConfig(),
                 auditor_id: str | None = None, address: str = "", poll: float = 1.0, page: int = 100) -> None:
        self.client, self.keys, self.leases, self.cfg = client, keys, leases, cfg
        self.id = auditor_id or default_id("auditor")
        self.me = {"id": self.id, "address": address}
        self.poll, self.page = poll, page
        self.core: AuditorCore | None = None
        self.elected = asyncio.Event()
        self._wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        wake = lambda _e: loop.call_soon_threadsafe(self._wake.set)  # noqa: E731
        cancels = [await asyncio.to_thread(self.keys.store.watch_key, self.keys.layout.auditor_key(), wake,
                                           on_error=lambda _e: None),
                   await asyncio.to_thread(self.keys.store.watch_prefix, self.keys.layout.bookies_prefix(), wake,
                                           on_error=lambda _e: None)]
        lease = None
        try:
            while not stop.is_set():
                try:
                    if lease is None or lease.lost:
                        lease = await asyncio.to_thread(self.leases.acquire)
                    if await asyncio.to_thread(self.keys.campaign, self.me, lease.id):
                        log.info("auditor %s elected", self.id)
                        self.elected.set()
                        await self._lead(lease, stop)
                        self.elected.clear()
                        self.core = None
                        continue
                except Exception as e:
                    log.warning("auditor %s: %r", self.id, e)
                await self._sleep(stop, self.poll)  # the key's deletion wakes us (watch)
        finally:
            for c in cancels:
                c()
            if lease is not None:
                await asyncio.to_thread(self.keys.resign, self.me)
                await asyncio.to_thread(lease.close)

    async def _sleep(self, stop: asyncio.Event, timeout: float | None) -> None:
        self._wake.clear()
        waiter, stopper = asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())
        await asyncio.wait([waiter, stopper], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()

    async def _registered(self) -> set[str]:
        regs = await asyncio.to_thread(self.client.registry.list_bookies, False)
        return {r.bookie_id for r in regs}

    async def _lead(self, lease, stop: asyncio.Event) -> None:
        core = self.core = AuditorCore(self.cfg, time.monotonic())
        pending: Scan | None = None
        while not stop.is_set() and not lease.lost:
            if await asyncio.to_thread(self.keys.auditor) != self.me:
                log.info("auditor %s: no longer elected", self.id)
                return
            effects = core.on_registrations(time.monotonic(), await self._registered())
            for fx in effects:
                if isinstance(fx, Scan):
                    pending = fx
                elif isinstance(fx, Check):
                    if await asyncio.to_thread(self.keys.enabled):
                        sampled = self.cfg.full_check and self.cfg.full_check_percent < 100
                        pass_no = await asyncio.to_thread(self.keys.check_pass) if sampled else None
                        found = await run_check(self.client, self.keys, self.page, full=self.cfg.full_check,
                                                percent=self.cfg.full_check_percent, pass_no=pass_no)
                        if pass_no is not None:  # only a pass that ran to its end: a failed one runs again
                            await asyncio.to_thread(self.keys.check_pass_done, pass_no)
                        log.info("auditor: periodic check%s: %d ledger(s) with damaged replicas",
                                 "" if pass_no is None else f" (sampled, pass {pass_no})", found)
                elif isinstance(fx, MootTasks):
                    n = await asyncio.to_thread(self.keys.moot, fx.bookie)
                    log.info("auditor: %s is back: %d task(s) moot for it", fx.bookie, n)
            if pending is not None and await asyncio.to_thread(self.keys.enabled):
                scan, pending = pending, None
                for fx in await self._scan(core, scan, lease):
                    if isinstance(fx, Scan):
                        pending = fx
            deadline = core.next_deadline()
            timeout = self.poll if deadline is None else max(0.0, min(self.poll, deadline - time.monotonic()))
            await self._sleep(stop, timeout)

    async def _scan(self, core: AuditorCore, scan: Scan, lease) -> list:
        log.info("auditor: scanning for %s", sorted(scan.lost) or "unregistered bookies")
        completed = True
        try:
            async for named in scan_pages(self.client, self.page):
                if lease.lost:
                    completed = False
                    break
                for fx in core.on_scan_page(time.monotonic(), named):
                    if isinstance(fx, PublishTask):
                        await asyncio.to_thread(self.keys.publish, fx.ledger_id, fx.lost)
                        log.info("auditor: ledger %d under-replicated (%s)", fx.ledger_id, sorted(fx.lost))
        except Exception as e:
            log.warning("auditor: scan failed: %r", e)
            completed = False
        return core.on_scan_done(time.monotonic(), completed)


__all__ = ["LedgerOutcome", "recover_ledger_fragments", "seal_ledger", "plan_bookie", "WorkerConfig",
           "ReplicationWorker", "Auditor", "scan_pages"]
