"""A deterministic simulation of autorecovery: the real pure cores
(``autorecovery.auditor_core``, ``autorecovery.worker_core`` and the
fragment-replacement verdict of ``stream.lifecycle``) over simulated
bookies, metadata with CAS, tasks and lease-bound locks, from one seed.

Faults: bookies lost for good (their data gone), bookies out for a while
(back before or after ``lost_bookie_recovery_delay``), workers crashing in
the middle of a copy (their lock stays until its lease expires), workers
paused past their lease (another takes the task; the paused one resumes and
CASes what it planned), workers paused just before clearing their target's
range (another may have copied to the same target and published it: the
target's copy fence, the shipped ``BookieCore.admit_clear``, refuses the
older lock's token; a paused worker's replacement CAS is guarded by its lock,
as ``LedgerStore.add_fragments``'s ``guards``), the auditor
crashing mid-scan (a new one is elected with a fresh core), several workers
interleaving their reads, copies and CASes.  The bookies' over-replicated
GC (sim/autorecovery_gc.py: ``bookie.ledger_gc.unnamed_ranges`` and the
shipped ``BookieCore.admit_gc_clear``) clears the entries it holds where no
fragment names it, paused at times before its clearing, past its lock too;
writers roll their streams' fragments and trim them.

Streams (issue 15): some ledgers are open streams with a writer that
appends, holds a lease-bound registration (its key names its term, lives
``TTL`` past its last refresh), and changes its ensemble itself, sooner or
later, when a bookie of its open fragment loses its registration.  Writer
faults: crashed (its key expires with the lease), cut off from etcd for a
while (its key expires; back, it creates it again only while its term is
the stream's: ``writer_lease.judge_register``), wedged (its keeper keeps
the key alive, the writer does nothing).  The worker's plan carries what
the key says (``writer_lease.judge_writer``); its SEAL is a take-over (term
+ 1, the lost bookie replaced from LAFR + 1 = the last entry written); a
writer learns it was fenced at its next append and drops its key.

Invariants, checked after every step:

- *no fragment names a live bookie lacking its entries* (a leftover is
  not the entry): a fragment's bookie is replaced only once the target
  holds every entry of its position;
- *no acknowledged entry is lost while a replica survives*: an entry with
  no replica left is reported (the task says unrecoverable);
- *a task deleted as done leaves its ledger clean* at that moment;
- *a writer registered at the stream's term since before its task was first
  seen is not fenced by a seal before* ``BOUND``;
- at the end (faults stopped, time run on), every task is gone or reports
  only unrecoverable fragments, and every fragment's bookies hold their
  entries (liveness).

``python -m sim.autorecovery --seed 0 --runs 500`` sweeps seeds;
``--mutant replace-before-copy`` (or ``replace-despite-absent``: a fragment
"recovered" without the entries no replica holds; ``ignore-writer``: the
plan without the writer's registration; ``no-bound``: a live writer waited
for without end; ``no-copy-fence``: a target clears its range for any
token; ``no-cas-guard``: a replacement published without its lock; ``gc-no-lock``:
a bookie's over-replicated GC clears without the ledger's recovery lock;
``gc-no-touch-check``: it clears a ledger written since its read;
``copy-any-source``: a copy takes an id from any source holding a record
there, a leftover too) breaks a rule, which the invariants must catch.
Bookies hold leftovers from the start: records at ids outside their write
sets (an earlier term's layout), which are no replica (its own random
draws, so a seed's run is as before).

Rot (sim/autorecovery_rot.py): records rot on running bookies, their scrub
reports the ids (the task names the bookie damaged at them), and the worker
fills them in place from the other replicas (``plan_ledger``'s fill jobs:
sealed fragments, and the open one up to its LAC; ``jobs_left``), or, with
the bookie declared lost meanwhile, moves its whole share (``Task.reported``).
Invariants: *a task deleted as done leaves none of the ids it named rotted*;
a rotted record is no replica (a copy never forwards one); at the end no
fragment names a bookie holding a rotted record at a position it holds.
Mutants: ``fill-done-by-first`` (a fill counted done for its first id: the
ids the LAC passed later in the same call left), ``copy-rotted`` (a copy
forwards a record failing its CRC), ``damaged-stays-lost`` (a damaged bookie
declared lost stays damaged: its fill waits for ever on a bookie gone).
Lost writes and the full check (sim/autorecovery_check.py): a stream's add
now and then misses one bookie (the writer replaces it from the next id),
and the auditor's periodic full check (the shipped ``tally``) names it
damaged at the ids it lacks; mutant ``no-check`` (neither periodic check
runs).  The cheap (ReadLac) check runs too: a bookie below what it must
hold is named damaged at its missing tail (``missing_tails``).
The tasks are the shipped ``Task`` values (``reported``, ``without``,
``mended``): a worker reads its task once as it takes the lock, deletes it
at that revision (a CAS) when done, and otherwise takes the ranges its
call filled off it (at that revision), as ``service.ReplicationWorker``
does.  Invariant: *ids taken off a task are filled* (none rotted since the
call began, none a write the bookie missed); mutant ``mend-whole`` (any
fill taken as the bookie's whole damage mended).

The simulated parts (the metadata, the bookies, the network) are models
(sim/autorecovery_model.py); the decisions are the shipped cores.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import sys

from bookie.core import Status
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from sim.autorecovery_check import FullCheck
from sim.autorecovery_gc import BookieGC
from sim.autorecovery_model import BOUND, DELAY, GRACE, STREAMS, TTL, SimBookie, SimWriter, Violation
from sim.autorecovery_rot import SCRUB_STEPS, Rot
from sim.autorecovery_writers import StreamWriters
from stream.autorecovery.auditor_core import AuditorConfig, AuditorCore, MootTasks, PublishTask, Scan
from stream.autorecovery.keys import Task, subtract_range
from stream.autorecovery.worker_core import Step, judge_round, plan_ledger
from stream.lifecycle import Apply, Done, ReplaceBookie
from stream.quorum import write_set
from stream.writer_lease import Liveness, judge_writer

MUTANTS = ("replace-before-copy", "replace-despite-absent", "ignore-writer", "no-bound", "no-copy-fence",
           "no-cas-guard", "gc-no-lock", "gc-no-touch-check", "copy-any-source", "fill-done-by-first",
           "copy-rotted", "damaged-stays-lost", "no-check", "mend-whole")
__all__ = ["MUTANTS", "Violation", "World", "run_seed"]


class World(BookieGC, StreamWriters, Rot, FullCheck):
    TTL = TTL   # the leases of locks and keys (sim/autorecovery_gc.py reads it here)
    STEP = 0.25  # the clock's step

    def __init__(self, seed: int, mutant: str | None = None, ledgers: int = 6, bookies: int = 7) -> None:
        self.rng = random.Random(seed)
        self.seed, self.mutant = seed, mutant
        self.now = 0.0
        self.bookies = {f"b{i}": SimBookie(f"b{i}") for i in range(bookies)}
        self.meta: dict[int, tuple[LedgerMetadata, int]] = {}
        self.tasks: dict[int, Task] = {}
        self.locks: dict[int, tuple[str, float]] = {}     # lid -> (worker, lease expiry)
        self.lock_token: dict[int, int] = {}               # lid -> the lock's create revision (its fencing token)
        self.rev = 1
        self.replaced = 0
        self.faults_on = True
        self.lost_cas = 0
        self.fenced_clears = 0   # copies' clearings a target refused (a later copy's token seen)
        self.guarded_cas = 0     # replacements refused by their guard (the lock gone)
        self.gc_cleared = 0      # ledgers a bookie's over-replicated GC cleared
        self.gc_refused = 0      # ... found touched since its read, or under a later copy's token
        self.gcs: dict[str, object] = {}   # bookie -> its running over-replicated GC pass
        self.seals = 0             # streams taken over by a worker
        self.writer_waits = 0      # decisions past the grace left to a live writer
        self.writer_changes = 0    # ensemble changes writers made themselves
        self.rots = 0              # records rotted
        self.filled = 0            # ids filled in place (a damaged bookie's own)
        self.damaged_lost = 0      # damaged bookies of a task the auditor declared lost
        self.missed_writes = 0     # adds that never reached one bookie of their write set
        self.check_found = 0       # ledgers the full check found a bookie of lacking ids
        self.cheap_found = 0       # ledgers the cheap check found a bookie of lacking a tail
        self.mended = 0            # tasks a call's fills were taken off, the rest waiting
        self.calls: dict = {}      # worker -> (task, since, ranges filled) of its call under way
        self.rot_rng = random.Random(seed + 104729)   # (rot's own draws)
        self.scrubbing = True
        self.scrub_phase = {b: self.rot_rng.randrange(SCRUB_STEPS) for b in sorted(self.bookies)}
        self.log: list[str] = []
        ids = sorted(self.bookies)
        leftovers = random.Random(seed + 7919)
        for lid in range(1, ledgers + 1):
            e = self.rng.choice((1, 2, 3, 3))
            qw = self.rng.randint(1, e) if e > 1 else 1
            frags, first = [], 0
            for _ in range(self.rng.randint(1, 4)):
                frags.append(Fragment(first, tuple(self.rng.sample(ids, e))))
                first += self.rng.randint(0, 8)
            frags = [f for k, f in enumerate(frags) if k == 0 or f.first_entry > frags[k - 1].first_entry]
            last = first + self.rng.randint(-1, 6)
            last = max(last, frags[-1].first_entry - 1)
            m = LedgerMetadata(e, qw, 1, ledger_id=lid, state=LedgerState.CLOSED, last_entry=last,
                               fragments=tuple(frags), fragment_count=len(frags),
                               last_fragment_first_entry=frags[-1].first_entry)
            self.meta[lid] = (m, self._bump())
            for eid in range(0, last + 1):
                f = m.fragment_at(eid)
                for i in write_set(eid, e, qw):
                    self.bookies[f.ensemble[i]].write(lid, eid)
                for i in set(range(e)) - set(write_set(eid, e, qw)):   # (its own draws: seeds unchanged)
                    if leftovers.random() < 0.3:
                        self.bookies[f.ensemble[i]].data.add((lid, eid))
                        self.bookies[f.ensemble[i]].leftover.add((lid, eid))
        self.top: dict[int, int] = {}                 # an open stream's last entry written
        self.lac: dict[int, int] = {}                 # ... and its LAC (read from its bookies)
        self.writers: dict[int, SimWriter] = {}
        self.wkeys: dict[int, tuple[int, float]] = {}  # lid -> (the term its writer key names, lease expiry)
        self.first_seen: dict[int, float] = {}         # lid -> when a worker first saw its task
        for lid in range(ledgers - STREAMS + 1, ledgers + 1):
            m, _ = self.meta[lid]
            self.top[lid] = m.last_entry
            self.lac[lid] = m.last_entry
            self.meta[lid] = (m.with_(state=LedgerState.OPEN, last_entry=-1, mode=LedgerMode.UNBOUNDED, term=1),
                              self._bump())
            self.writers[lid] = SimWriter(lid, 1, registered_since=0.0, react=self.rng.choice((0.5, 0.05)))
            self.wkeys[lid] = (1, self.now + TTL)
        self.acked = {(lid, eid) for lid, (m, _) in self.meta.items()
                      for eid in range(self.top.get(lid, m.last_entry) + 1)}
        self.auditor = AuditorCore(AuditorConfig(DELAY), self.now)
        self.scan: list | None = None       # ledgers left to scan (pages)
        self.workers = {f"w{i}": None for i in range(3)}   # worker -> its running generator
        self.paused: dict[str, float] = {}                 # worker -> when it resumes

    def _bump(self) -> int:
        self.rev += 1
        return self.rev

    def registered(self) -> set[str]:
        return {b.id for b in self.bookies.values() if b.alive}

    def note(self, s: str) -> None:
        self.log.append(f"t={self.now:.1f} {s}")

    # -- invariants ------------------------------------------------------------------------

    def holds_position(self, b: str, m: LedgerMetadata, frag: Fragment, i: int, rot_ok: bool = True) -> bool:
        """Whether ``b`` holds every entry of position ``i`` of ``frag``;
        ``rot_ok``: a record that rotted there counts (damage its scrub
        will find), not one a copy wrote rotted."""
        end = (self.top.get(m.ledger_id, m.last_entry) if frag is m.fragments[-1]
               else m.fragments[m.fragments.index(frag) + 1].first_entry - 1)
        bk, lid = self.bookies[b], m.ledger_id
        return all(bk.holds(lid, e) or (rot_ok and (lid, e) in bk.missed)
                   or (rot_ok and (lid, e) in bk.data and (lid, e) in bk.rotted and (lid, e) not in bk.bad_copies)
                   for e in range(frag.first_entry, end + 1) if i in write_set(e, m.ensemble_size, m.write_quorum))

    def dirty(self, lid: int, rot_ok: bool = True) -> list:
        m, _ = self.meta[lid]
        return [(f.first_entry, b) for f in m.fragments for i, b in enumerate(f.ensemble)
                if not self.holds_position(b, m, f, i, rot_ok)]

    def check(self) -> None:
        for lid, (m, _) in self.meta.items():
            for first, b in self.dirty(lid):
                if self.bookies[b].alive and not self.bookies[b].dead and b not in self._wiped:
                    raise Violation(f"ledger {lid} fragment {first} names live {b} lacking entries")
        for lid, eid in self.acked:
            if not any(b.holds(lid, eid) for b in self.bookies.values() if not b.dead):
                t = self.tasks.get(lid)
                if t is not None and any(u["first"] <= eid <= u["last"] for u in t.unrecoverable):
                    continue
                if self._reportable(lid, eid):
                    continue
                raise Violation(f"entry {lid}:{eid} lost without a report")

    _wiped: set = set()

    def _reportable(self, lid: int, eid: int) -> bool:
        """Lost with all its replicas: fine until the worker reports it
        (checked at the end)."""
        return True

    # -- faults ----------------------------------------------------------------------------

    def fault(self) -> None:
        r = self.rng.random()
        live = [b for b in self.bookies.values() if b.alive]
        if r < 0.3 and len(live) > 4:
            # (a disk that rots is one that may fail: half the time a bookie a task names damaged)
            damaged = [b for b in live if any(b.id in t.damaged for t in self.tasks.values())]
            b = self.rng.choice(damaged if damaged and self.rng.random() < 0.5 else live)
            b.alive, b.dead = False, True
            b.lose_data()
            self.note(f"{b.id} lost for good")
        elif r < 0.55 and len(live) > 4:
            b = self.rng.choice(live)
            b.alive, b.back_at = False, self.now + self.rng.choice((1.0, 2.0, DELAY + 2, DELAY + 5))
            self.note(f"{b.id} out until {b.back_at}")
        elif r < 0.7:
            running = [w for w, g in self.workers.items() if g is not None]
            if running:
                w = self.rng.choice(running)
                self.workers[w] = None  # crashed: its lock stays until the lease expires
                self.note(f"worker {w} crashed")
        elif r < 0.8:
            running = [w for w, g in self.workers.items() if g is not None and w not in self.paused]
            if running:  # paused past its lease (GC, SIGSTOP): its lock goes, it resumes unaware
                w = self.rng.choice(running)
                self.paused[w] = self.now + TTL + self.rng.choice((1.0, 4.0))
                self.note(f"worker {w} paused")
        elif r < 0.85:
            self.auditor = AuditorCore(AuditorConfig(DELAY), self.now)
            self.scan = None
            self.note("auditor crashed; a new one elected")
        else:
            ws = [w for w in self.writers.values() if w.alive and not w.wedged and not w.fenced]
            if ws:
                w = self.rng.choice(ws)
                k = self.rng.random()
                if k < 0.4:
                    w.alive = False
                    self.note(f"writer of {w.lid} crashed")
                elif k < 0.7:
                    w.cut_until = self.now + TTL + self.rng.choice((1.0, 6.0))
                    self.note(f"writer of {w.lid} cut off from etcd until {w.cut_until}")
                else:
                    w.wedged = True
                    self.note(f"writer of {w.lid} wedged (its key kept alive)")

    # -- the auditor -----------------------------------------------------------------------

    def auditor_step(self) -> None:
        fx = self.auditor.on_registrations(self.now, self.registered())
        for e in fx:
            self._effect(e)
        if self.scan is not None:
            page, self.scan = self.scan[:2], self.scan[2:]
            named = {lid: {b for f in self.meta[lid][0].fragments for b in f.ensemble} for lid in page}
            for e in self.auditor.on_scan_page(self.now, named):
                self._effect(e)
            if not self.scan:
                self.scan = None
                for e in self.auditor.on_scan_done(self.now):
                    self._effect(e)

    def _effect(self, e) -> None:
        if isinstance(e, Scan):
            self.scan = sorted(self.meta)
        elif isinstance(e, PublishTask):
            self.publish(e.ledger_id, e.lost)
            self.note(f"task {e.ledger_id} {sorted(self.tasks[e.ledger_id].lost)}")
        elif isinstance(e, MootTasks):   # (``AutorecoveryKeys.moot``)
            for lid, t in list(self.tasks.items()):
                after = t.without(e.bookie)
                if after is None:
                    del self.tasks[lid]
                    self.first_seen.pop(lid, None)
                elif after is not t:
                    self._put_task(after)

    # -- tasks (``AutorecoveryKeys``: each change a new revision) ----------------------------

    def _put_task(self, task: Task) -> None:
        self.tasks[task.ledger_id] = dataclasses.replace(task, revision=self._bump())

    def publish(self, lid: int, lost, damaged: bool = False, ids: dict | None = None) -> None:
        cur = self.tasks.get(lid)
        new = (cur or Task(lid, frozenset(), 0)).reported(lost, damaged, ids)
        if self.mutant == "damaged-stays-lost" and cur is not None and not damaged:
            new = dataclasses.replace(new, damaged=cur.damaged, damaged_ids=cur.damaged_ids)
        if cur is not None and cur.damaged - new.damaged:
            self.damaged_lost += 1   # (declared lost: its share moved whole)
        if cur is None or new != cur:
            self._put_task(new)

    # -- workers ---------------------------------------------------------------------------

    def worker_body(self, w: str, lid: int, token: int):
        """One task under the lock, as a generator (``service.ReplicationWorker._work``
        and ``recover_ledger_fragments``): yields between steps so that
        other workers, faults and the auditor interleave."""
        task = self.tasks.get(lid)   # as of holding the lock
        if task is None:
            return
        since = self.now
        lost = task.lost - (self.registered() - task.damaged)   # a bookie back since: moot for it
        damaged = task.damaged
        # fragments reported before stay so while every bookie they name is still lost
        known = {(u["first"], u["last"]) for u in task.unrecoverable if set(u["lost"]) <= lost}
        filled: set = set()          # ranges filled in place (this call)
        self.calls[w] = (task, since, filled)   # (taken off the task after the call: ``_locked``)
        absent: dict = {}            # fragments this call's copy found entries of on no replica
        sealed_end = None            # a stream this call took over: its recovered end
        while True:
            m, rev = self.meta[lid]
            writer = Liveness.UNKNOWN
            if m.mode is LedgerMode.UNBOUNDED and self.mutant != "ignore-writer":
                writer = judge_writer(self.key_record(lid), m.term)   # the key, read beside the metadata
            plan = plan_ledger(m, lost - damaged, damaged, writer, task.damaged_ids)
            if plan.held_open and lid in self.lac:   # (its LAC, read from its bookies)
                plan = plan_ledger(m, lost - damaged, damaged, writer, task.damaged_ids,
                                   open_lac=max(self.lac[lid], -1 if sealed_end is None else sealed_end),
                                   open_end=sealed_end)
            first = self.first_seen.setdefault(lid, self.now)
            done = ({(f, j.last_entry, b) for f, _, b in filled for j in plan.jobs if (j.first_entry, j.lost) == (f, b)}
                    if self.mutant == "fill-done-by-first" else filled)   # (done for its first id)
            rnd = judge_round(plan, self.now, first, GRACE, float("inf") if self.mutant == "no-bound" else BOUND,
                              known=known, absent=absent, filled=done, seal=sealed_end is None)
            step = rnd.step
            if step is Step.DONE:
                cur = self.tasks.get(lid)
                if cur is not None and cur.revision == task.revision:   # (deleted at its revision)
                    scope = lost - set(task.damaged_ids)   # (a bookie damaged at some ids: check_filled)
                    if self.dirty_by(lid, scope):
                        raise Violation(f"task {lid} deleted with {self.dirty_by(lid, scope)}")
                    self.check_filled(task, since)
                    del self.tasks[lid]
                    self.first_seen.pop(lid, None)
                    self.note(f"{w}: task {lid} done")
                return
            if (step is Step.WAIT and plan.open_fragment is not None and writer is Liveness.LIVE
                    and self.now - first >= GRACE):
                self.writer_waits += 1
            if step is Step.SEAL:
                yield  # between its read and the take-over's CAS, the writer moves on
                self._seal(w, lid)
                sealed_end = self.top[lid]
                continue
            if step is Step.REPORT:   # (kept in the task at its revision; a bookie back since: not lost)
                cur = self.tasks.get(lid)
                if cur is not None and cur.revision == task.revision:
                    standing = tuple(u for u in task.unrecoverable if (u["first"], u["last"]) in known)
                    new = tuple(u for u in rnd.unrecoverable if (u["first"], u["last"]) not in known)
                    self._put_task(self._mended(dataclasses.replace(task, lost=lost, unrecoverable=standing + new),
                                                filled, since))
                return
            if step is not Step.COPY:
                return
            job = rnd.jobs[0]
            fill = job.fill
            if fill:   # a damaged bookie's known bad ids: back onto it, nothing cleared
                target = job.lost
            else:
                cands = [b for b in sorted(self.registered()) if b not in job.ensemble and b not in lost - damaged]
                if not cands and job.lost not in damaged:
                    return
                # (no spare for a damaged bookie: it takes its whole share again itself)
                target, fill = (self.rng.choice(cands), False) if cands else (job.lost, True)
            if self.mutant == "replace-before-copy" and not fill:
                yield from self._replace(w, lid, job, target, token)
            if not fill:
                if self.faults_on and self.rng.random() < 0.2:  # between its lock's last read and its clearing
                    self.paused[w] = self.now + TTL + self.rng.choice((1.0, 4.0))
                    self.note(f"worker {w} paused before clearing {target}")
                    yield
                # the clearing of the target's range, under the lock's fencing token
                if not self.bookies[target].alive:
                    return
                if (self.bookies[target].core.admit_clear(lid, token).status is Status.FENCED
                        and self.mutant != "no-copy-fence"):
                    self.fenced_clears += 1
                    self.note(f"{w}: clearing {target} for ledger {lid} fenced (token {token})")
                    return  # the copy fails; the lock is released
                self.bookies[target].data -= {(lid, e) for e in range(job.first_entry, job.last_entry + 1)}
                yield
            missing = 0
            for e in range(job.first_entry, job.last_entry + 1):
                if not job.holds(e):
                    continue
                src = next((self.bookies[s] for s in job.sources
                            if (job.replica_of(s, e) or self.mutant == "copy-any-source")
                            and self.bookies[s].alive and (lid, e) in self.bookies[s].data
                            and ((lid, e) not in self.bookies[s].rotted or self.mutant == "copy-rotted")), None)
                if src is None:
                    missing += 1
                    continue
                tgt = self.bookies[target]
                if not tgt.alive:
                    return  # the copy fails; the lock is released
                tgt.write(lid, e)
                if (lid, e) in src.leftover:   # (what the source holds is what is copied)
                    tgt.leftover.add((lid, e))
                if (lid, e) in src.rotted:
                    tgt.rotted[(lid, e)] = self.now
                    tgt.bad_copies.add((lid, e))
                self.filled += fill
                yield
            if missing and self.mutant != "replace-despite-absent":
                absent[job.first_entry, job.last_entry] = {
                    "first": job.first_entry, "last": job.last_entry, "lost": [job.lost],
                    "why": f"{missing} entries held by no surviving replica"}
                continue
            if fill:   # nothing to publish: the fragment names it already
                self.note(f"{w}: ledger {lid} {job.first_entry}..{job.last_entry} filled in place on {target}")
                filled.add((job.first_entry, job.last_entry, job.lost))
                continue
            if self.mutant != "replace-before-copy":
                replaced = yield from self._replace(w, lid, job, target, token)
                if replaced and not self.bookies[target].alive:
                    # lost between its copy and the CAS, after the auditor's
                    # scan read this ledger: the worker's check after the CAS
                    cur = self.tasks.get(lid)
                    if cur is not None:
                        self._put_task(dataclasses.replace(cur, lost=cur.lost | {target}))
                    self.note(f"{w}: target {target} of ledger {lid} gone: added to the task")

    def lock_held(self, lid: int, token: int) -> bool:
        """The replacement's guard (``metadata.txn.created_at``): the lock
        key exists, created at ``token`` (not expired, not taken since)."""
        return self.locks.get(lid, (None, -1.0))[1] >= self.now and self.lock_token.get(lid) == token

    def _replace(self, w: str, lid: int, job, target: str, token: int):
        intent = ReplaceBookie(lid, job.first_entry, job.lost, target, job.ensemble)
        m, rev = self.meta[lid]
        if self.faults_on and self.rng.random() < 0.2:  # paused between its read and its CAS
            # within its lease (its CAS may lose to a writer's change and is
            # judged again) or past it (its guard refuses the CAS)
            self.paused[w] = self.now + self.rng.choice((0.5, 1.5, TTL + 1.0, TTL + 4.0))
            self.note(f"worker {w} paused before its CAS")
        yield  # the CAS races with others
        for _ in range(5):
            if not self.lock_held(lid, token) and self.mutant != "no-cas-guard":
                self.guarded_cas += 1
                self.note(f"{w}: replacement in ledger {lid} refused: its lock (token {token}) is gone")
                return False
            cur, cur_rev = self.meta[lid]
            v = intent.judge(m) if cur_rev == rev else intent.judge(cur)
            if isinstance(v, Apply) and cur_rev == rev:
                frs = {f.first_entry: f for f in cur.fragments}
                frs.update({f.first_entry: f for f in v.fragments})
                new = cur.with_(fragments=tuple(frs[k] for k in sorted(frs)))
                self.meta[lid] = (new, self._bump())
                self.replaced += 1
                self.note(f"{w}: ledger {lid} fragment {job.first_entry}: {job.lost} -> {target}")
                return True
            if cur_rev != rev:
                self.lost_cas += 1
            if isinstance(v, Apply):
                m, rev = cur, cur_rev  # lost CAS: judged again on the fresh metadata
                continue
            if isinstance(v, Done):
                return False
            return False
        return False

    def dirty_by(self, lid: int, lost: set) -> list:
        return [(f, b) for f, b in self.dirty(lid) if b in lost or self.bookies[b].alive]

    def worker_step(self, w: str) -> None:
        if w in self.paused:
            if self.now < self.paused[w]:
                return
            del self.paused[w]
        g = self.workers[w]
        if g is None:
            free = [lid for lid in sorted(self.tasks)
                    if lid not in self.locks or self.locks[lid][1] < self.now]
            if not free:
                return
            lid = self.rng.choice(free)
            self.locks[lid] = (w, self.now + TTL)
            self.lock_token[lid] = self._bump()   # a new key: a new create revision
            g = self.workers[w] = self._locked(w, lid, self.lock_token[lid])
        try:
            next(g)
        except StopIteration:
            self.workers[w] = None

    def _locked(self, w: str, lid: int, token: int):
        try:
            for _ in self.worker_body(w, lid, token):
                if self.locks.get(lid, (None,))[0] == w:
                    self.locks[lid] = (w, self.now + TTL)   # keep-alive
                yield
            task, since, filled = self.calls.pop(w, (None, 0.0, ()))
            cur = self.tasks.get(lid)
            if task is not None and cur is not None and cur.revision == task.revision:   # (a CAS)
                new = self._mended(task, filled, since)
                if new != task:
                    self._put_task(new)
        finally:
            if self.locks.get(lid, (None,))[0] == w:
                del self.locks[lid]

    def _mended(self, task: Task, filled, since: float) -> Task:
        """``task`` with the ranges a call filled in place taken off
        (``Task.mended``, as ``ReplicationWorker._work`` does)."""
        new = task.mended(filled)
        if self.mutant == "mend-whole":   # any fill taken as the bookie's whole damage mended
            new = task.mended([(0, 1 << 62, b) for _, _, b in filled])
        if new.damaged_ids != task.damaged_ids:   # the ids taken off: filled, and still so
            off = {}
            for b, ranges in task.damaged_ids.items():
                left = list(ranges)
                for a, z in new.damaged_ids.get(b, ()):
                    left = [r for x, y in left for r in subtract_range([(x, y)], a, z)]
                off[b] = left
            self.check_filled(task, since, off)
            self.mended += 1
        return new

    # -- the run ---------------------------------------------------------------------------

    def step(self, faults: bool) -> None:
        self.now += self.STEP
        for b in self.bookies.values():
            if b.back_at is not None and self.now >= b.back_at:
                b.alive, b.back_at = True, None
                self.note(f"{b.id} back")
        if faults and self.rng.random() < 0.04:
            self.fault()
        if faults and self.rot_rng.random() < 0.03:
            self.rot()
        if self.scrubbing:
            self.scrub_step()
            self.check_step()
            self.cheap_check_step()
        actors = ["auditor", "gc"] + list(self.workers) + [f"writer-{lid}" for lid in sorted(self.writers)]
        self.rng.shuffle(actors)
        for a in actors:
            if a == "auditor":
                self.auditor_step()
            elif a == "gc":
                self.gc_step()
            elif a.startswith("writer-"):
                self.writer_step(self.writers[int(a[len("writer-"):])])
            else:
                self.worker_step(a)
        self.check()

    def run(self, steps: int = 200) -> None:
        for _ in range(steps):
            self.step(faults=True)
        self.faults_on = False
        for k in range(steps):
            # the scrubs' last passes in the first half (each pass reports again a rotted
            # leftover, which no fill mends: a task its worker then finds done)
            self.scrubbing = k < steps // 2
            self.step(faults=False)
        self.final_check()

    def final_check(self) -> None:
        for lid, t in self.tasks.items():
            if not t.unrecoverable:
                raise Violation(f"task {lid} {sorted(t.lost)} still pending at the end")
        for lid in self.meta:
            for first, b in self.dirty(lid, rot_ok=False):   # (a rotted record too: filled by now)
                t = self.tasks.get(lid)
                if t is None or not t.unrecoverable:
                    raise Violation(f"ledger {lid} fragment {first} names {b} lacking entries at the end")
        for lid, eid in self.acked:
            if not any(b.holds(lid, eid) for b in self.bookies.values() if not b.dead):
                t = self.tasks.get(lid)
                if t is None or not any(u["first"] <= eid <= u["last"] for u in t.unrecoverable):
                    raise Violation(f"entry {lid}:{eid} lost and not reported")


def run_seed(seed: int, mutant: str | None = None) -> World:
    w = World(seed, mutant)
    w.run()
    return w


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--mutant", choices=MUTANTS)
    p.add_argument("--trace", action="store_true")
    a = p.parse_args(argv)
    bad = replaced = unrecoverable = lost_cas = fenced = guarded = gc_cleared = gc_refused = rots = filled = 0
    mended = cheap = 0
    for seed in range(a.seed, a.seed + a.runs):
        try:
            w = run_seed(seed, a.mutant)
            replaced += w.replaced
            lost_cas += w.lost_cas
            fenced += w.fenced_clears
            guarded += w.guarded_cas
            gc_cleared += w.gc_cleared
            gc_refused += w.gc_refused
            rots, filled = rots + w.rots, filled + w.filled
            mended, cheap = mended + w.mended, cheap + w.cheap_found
            unrecoverable += sum(1 for t in w.tasks.values() if t.unrecoverable)
            if a.trace:
                print("\n".join(w.log))
        except Violation as e:
            bad += 1
            print(f"seed {seed}: {e}")
            if a.mutant is not None:
                break
    print(f"{a.runs if not bad or a.mutant is None else seed - a.seed + 1} run(s), {bad} violation(s); "
          f"{replaced} fragment(s) replaced, {lost_cas} lost CAS(es) judged again, {fenced} clearing(s) fenced, "
          f"{guarded} replacement(s) refused by their guard, "
          f"{unrecoverable} ledger(s) reported unrecoverable, {gc_cleared} over-replicated clearing(s) by a "
          f"bookie's GC, {gc_refused} such clearing(s) refused, {rots} record(s) rotted, {filled} id(s) "
          f"filled in place, {mended} task(s) with fills taken off, {cheap} missing tail(s) found by ReadLac")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
