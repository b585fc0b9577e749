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
draws, so a seed's run is as before).  Only this file is simulated: the metadata,
bookies and network here are models; the decisions are the shipped cores.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import sys

from bookie.core import BookieCore, Status
from bookie.entry import REQ_RECOVERY, EntryHeader
from sim.autorecovery_gc import BookieGC
from stream.autorecovery.auditor_core import AuditorConfig, AuditorCore, MootTasks, PublishTask, Scan
from stream.autorecovery.worker_core import Step, judge_task, plan_ledger
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from stream.lifecycle import Apply, Done, ReplaceBookie
from stream.quorum import write_set
from stream.writer_lease import Liveness, Register, WriterRecord, judge_register, judge_writer

MUTANTS = ("replace-before-copy", "replace-despite-absent", "ignore-writer", "no-bound", "no-copy-fence",
           "no-cas-guard", "gc-no-lock", "gc-no-touch-check", "copy-any-source")
DELAY, TTL, GRACE, BOUND = 5.0, 3.0, 1.0, 20.0
STREAMS = 2   # the last ledgers are open streams with a writer


class Violation(AssertionError):
    pass


@dataclasses.dataclass
class SimBookie:
    id: str
    alive: bool = True          # registered and serving
    dead: bool = False          # lost for good (data gone)
    back_at: float | None = None
    data: set = dataclasses.field(default_factory=set)   # (lid, eid)
    # (lid, eid) held as a leftover: a record at an id outside the bookie's
    # write sets in that fragment (an earlier term's layout), no replica's
    leftover: set = dataclasses.field(default_factory=set)
    # the shipped core: the copy fence (its copy tokens), and each ledger's
    # count of admitted requests that the over-replicated GC checks
    core: BookieCore = dataclasses.field(default_factory=BookieCore)

    def write(self, lid: int, eid: int) -> None:
        """An add admitted here by the shipped core (a recovery add at the
        ledger's term: always admitted), then held."""
        st = self.core.ledgers.get(lid)
        h = EntryHeader(lid, eid, -1, -1, 0, REQ_RECOVERY, st.term if st else 0, 0, 0, 0, 0)
        assert self.core.admit_add(h).status is Status.OK
        self.data.add((lid, eid))
        self.leftover.discard((lid, eid))

    def holds(self, lid: int, eid: int) -> bool:
        """The entry itself (a leftover record is not it)."""
        return (lid, eid) in self.data and (lid, eid) not in self.leftover


@dataclasses.dataclass
class SimWriter:
    lid: int
    term: int
    alive: bool = True                 # the process runs
    wedged: bool = False               # ... and keeps its key, but neither appends nor changes its ensemble
    cut_until: float = -1.0            # cut off from etcd until then (no refresh, no metadata change)
    fenced: bool = False               # it learnt a later term took over: it stopped
    registered_since: float | None = None   # its current key was created then (None: it has none)
    react: float = 0.5                 # per step, the chance it reacts to a lost bookie (a slow one: low)


@dataclasses.dataclass
class SimTask:
    lost: set
    unrecoverable: list = dataclasses.field(default_factory=list)


class World(BookieGC):
    TTL = TTL   # the leases of locks and keys (sim/autorecovery_gc.py reads it here)

    def __init__(self, seed: int, mutant: str | None = None, ledgers: int = 6, bookies: int = 7) -> None:
        self.rng = random.Random(seed)
        self.seed, self.mutant = seed, mutant
        self.now = 0.0
        self.bookies = {f"b{i}": SimBookie(f"b{i}") for i in range(bookies)}
        self.meta: dict[int, tuple[LedgerMetadata, int]] = {}
        self.tasks: dict[int, SimTask] = {}
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
        self.writers: dict[int, SimWriter] = {}
        self.wkeys: dict[int, tuple[int, float]] = {}  # lid -> (the term its writer key names, lease expiry)
        self.first_seen: dict[int, float] = {}         # lid -> when a worker first saw its task
        for lid in range(ledgers - STREAMS + 1, ledgers + 1):
            m, _ = self.meta[lid]
            self.top[lid] = m.last_entry
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

    def holds_position(self, b: str, m: LedgerMetadata, frag: Fragment, i: int) -> bool:
        end = (self.top.get(m.ledger_id, m.last_entry) if frag is m.fragments[-1]
               else m.fragments[m.fragments.index(frag) + 1].first_entry - 1)
        return all(self.bookies[b].holds(m.ledger_id, e) for e in range(frag.first_entry, end + 1)
                   if i in write_set(e, m.ensemble_size, m.write_quorum))

    def dirty(self, lid: int) -> list:
        m, _ = self.meta[lid]
        return [(f.first_entry, b) for f in m.fragments for i, b in enumerate(f.ensemble)
                if not self.holds_position(b, m, f, i)]

    def check(self) -> None:
        for lid, (m, _) in self.meta.items():
            for first, b in self.dirty(lid):
                if self.bookies[b].alive and not self.bookies[b].dead and b not in self._wiped:
                    raise Violation(f"ledger {lid} fragment {first} names live {b} lacking entries")
        for lid, eid in self.acked:
            if not any(b.holds(lid, eid) for b in self.bookies.values() if not b.dead):
                t = self.tasks.get(lid)
                if t is not None and any(u[0] <= eid <= u[1] for u in t.unrecoverable):
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
            b = self.rng.choice(live)
            b.alive, b.dead, b.data = False, True, set()
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
            t = self.tasks.setdefault(e.ledger_id, SimTask(set()))
            t.lost |= e.lost
            self.note(f"task {e.ledger_id} {sorted(t.lost)}")
        elif isinstance(e, MootTasks):
            for lid, t in list(self.tasks.items()):
                t.lost.discard(e.bookie)
                if not t.lost and not t.unrecoverable:
                    del self.tasks[lid]
                    self.first_seen.pop(lid, None)

    # -- stream writers --------------------------------------------------------------------

    def key_record(self, lid: int) -> WriterRecord | None:
        k = self.wkeys.get(lid)
        return None if k is None else WriterRecord(f"writer-{lid}", "sim", 0, k[0], 0)

    def writer_step(self, w: SimWriter) -> None:
        lid = w.lid
        k = self.wkeys.get(lid)
        if k is not None and k[1] <= self.now:  # its lease expired: etcd deletes the key
            del self.wkeys[lid]
            if k[0] == w.term:
                w.registered_since = None
            self.note(f"writer key of {lid} (term {k[0]}) expired")
        if not w.alive or w.fenced:
            return
        m, _ = self.meta[lid]
        online = self.now >= w.cut_until
        if online:  # its keeper: refresh the key, or create it again while its term is the stream's
            k = self.wkeys.get(lid)
            if k is not None and k[0] == w.term:
                self.wkeys[lid] = (w.term, self.now + TTL)
            elif judge_register(w.term, m.term, self.key_record(lid)) is Register.CREATE:
                self.wkeys[lid] = (w.term, self.now + TTL)
                w.registered_since = self.now
                self.note(f"writer of {lid} registered again (term {w.term})")
        if w.wedged:
            return
        last = m.fragments[-1]
        if any(not self.bookies[b].alive for b in last.ensemble):
            if online and self.rng.random() < w.react:  # its registration watch: it changes its ensemble
                if m.term > w.term:
                    self._fenced(w)
                elif self.change_ensemble(lid):
                    self.writer_changes += 1
                    self.note(f"writer of {lid}: new ensemble {self.meta[lid][0].fragments[-1]}")
            return
        if self.rng.random() < 0.3:  # an append (needs every bookie of its write set here)
            if m.term > w.term:
                self._fenced(w)  # INVALID_TERM: a take-over raised the term
                return
            if online and self.top[lid] >= last.first_entry and self.rng.random() < 0.1:
                self.change_ensemble(lid, roll=True)   # a roll by size: a new ensemble, published first
                m, _ = self.meta[lid]
                last = m.fragments[-1]
            if online and len(m.fragments) > 1 and self.rng.random() < 0.05:
                self.trim(lid)   # the application trims the stream below its open fragment
                m, _ = self.meta[lid]
            eid = self.top[lid] + 1
            for i in write_set(eid, m.ensemble_size, m.write_quorum):
                self.bookies[last.ensemble[i]].write(lid, eid)
            self.top[lid] = eid
            self.acked.add((lid, eid))

    def _fenced(self, w: SimWriter) -> None:
        """It learnt a later term took over: it stops and drops its key
        (revokes its lease) if the key is still its own."""
        w.fenced = True
        k = self.wkeys.get(w.lid)
        if k is not None and k[0] == w.term:
            del self.wkeys[w.lid]
        w.registered_since = None
        self.note(f"writer of {w.lid} (term {w.term}) fenced: it stops, its key goes")

    def change_ensemble(self, lid: int, roll: bool = False) -> bool:
        """The open fragment's unregistered bookies replaced from the entry
        after the last written (= LAFR + 1: every entry written reached its
        whole write set here); an empty last fragment is replaced in place.
        ``roll``: a new ensemble of registered bookies, none failed."""
        m, _ = self.meta[lid]
        last = m.fragments[-1]
        if roll:
            if len(self.registered()) < m.ensemble_size:
                return False
            new = self.rng.sample(sorted(self.registered()), m.ensemble_size)
        else:
            gone = [i for i, b in enumerate(last.ensemble) if not self.bookies[b].alive]
            cands = [b for b in sorted(self.registered()) if b not in last.ensemble]
            if not gone or len(cands) < len(gone):
                return False
            new = list(last.ensemble)
            for i, b in zip(gone, self.rng.sample(cands, len(gone))):
                new[i] = b
        first = self.top[lid] + 1
        frs = tuple(f for f in m.fragments if f.first_entry != first) + (Fragment(first, tuple(new)),)
        self.meta[lid] = (m.with_(fragments=frs, fragment_count=len(frs), last_fragment_first_entry=first),
                          self._bump())
        return True

    def trim(self, lid: int) -> None:
        """Every fragment below the last removed (``remove_fragments_before``):
        their entries are no longer the stream's, their bookies hold garbage."""
        m, _ = self.meta[lid]
        first = m.fragments[-1].first_entry
        self.meta[lid] = (m.with_(fragments=m.fragments[-1:], fragment_count=1, trimmed_before=first),
                          self._bump())
        self.acked = {(l, e) for l, e in self.acked if l != lid or e >= first}
        self.note(f"stream {lid} trimmed below {first}")

    def _seal(self, w: str, lid: int) -> None:
        """The worker's take-over of a stream: term + 1 (its writer is fenced),
        recovery replacing the lost bookies of the open fragment."""
        m, _ = self.meta[lid]
        wr, k = self.writers.get(lid), self.wkeys.get(lid)
        first = self.first_seen.get(lid, self.now)
        if (wr is not None and wr.alive and not wr.fenced and k is not None and k[0] == wr.term == m.term
                and wr.registered_since is not None and wr.registered_since <= first
                and self.now - first < BOUND):
            raise Violation(f"{w}: stream {lid} taken over under its live writer (term {m.term}, registered "
                            f"since {wr.registered_since}, task first seen at {first}) before the bound")
        self.meta[lid] = (m.with_(term=m.term + 1), self._bump())
        self.seals += 1
        self.change_ensemble(lid)
        self.note(f"{w}: stream {lid} taken over at term {m.term + 1}")

    # -- workers ---------------------------------------------------------------------------

    def worker_body(self, w: str, lid: int, token: int):
        """One task under the lock, as a generator: yields between steps so
        that other workers, faults and the auditor interleave."""
        while True:
            t = self.tasks.get(lid)
            if t is None:
                return
            lost = t.lost - self.registered()
            m, rev = self.meta[lid]
            writer = Liveness.UNKNOWN
            if m.mode is LedgerMode.UNBOUNDED and self.mutant != "ignore-writer":
                writer = judge_writer(self.key_record(lid), m.term)   # the key, read beside the metadata
            plan = plan_ledger(m, lost, writer=writer)
            first = self.first_seen.setdefault(lid, self.now)
            step = judge_task(plan, self.now, first, GRACE, float("inf") if self.mutant == "no-bound" else BOUND)
            if step is Step.DONE:
                if not t.unrecoverable and self.tasks.get(lid) is t:
                    if self.dirty_by(lid, lost):
                        raise Violation(f"task {lid} deleted with {self.dirty_by(lid, lost)}")
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
                continue
            if step is Step.REPORT:
                t.unrecoverable = [(u.first_entry, u.last_entry) for u in plan.unrecoverable]
                return
            if step is not Step.COPY:
                return
            job = plan.jobs[0]
            cands = [b for b in sorted(self.registered()) if b not in job.ensemble and b not in lost]
            if not cands:
                return
            target = self.rng.choice(cands)
            if self.mutant == "replace-before-copy":
                yield from self._replace(w, lid, job, target, token)
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
            absent = 0
            for e in range(job.first_entry, job.last_entry + 1):
                if not job.holds(e):
                    continue
                src = next((self.bookies[s] for s in job.sources
                            if (job.replica_of(s, e) or self.mutant == "copy-any-source")
                            and self.bookies[s].alive and (lid, e) in self.bookies[s].data), None)
                if src is None:
                    absent += 1
                    continue
                if not self.bookies[target].alive:
                    return  # the copy fails; the lock is released
                self.bookies[target].write(lid, e)
                if (lid, e) in src.leftover:   # (what the source holds is what is copied)
                    self.bookies[target].leftover.add((lid, e))
                yield
            if absent and self.mutant != "replace-despite-absent":
                t.unrecoverable.append((job.first_entry, job.last_entry))
                return
            if self.mutant != "replace-before-copy":
                replaced = yield from self._replace(w, lid, job, target, token)
                if replaced and not self.bookies[target].alive:
                    # lost between its copy and the CAS, after the auditor's
                    # scan read this ledger: the worker's check after the CAS
                    t.lost.add(target)
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
        finally:
            if self.locks.get(lid, (None,))[0] == w:
                del self.locks[lid]

    # -- the run ---------------------------------------------------------------------------

    def step(self, faults: bool) -> None:
        self.now += 0.25
        for b in self.bookies.values():
            if b.back_at is not None and self.now >= b.back_at:
                b.alive, b.back_at = True, None
                self.note(f"{b.id} back")
        if faults and self.rng.random() < 0.04:
            self.fault()
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
        for _ in range(steps):
            self.step(faults=False)
        self.final_check()

    def final_check(self) -> None:
        for lid, t in self.tasks.items():
            if not t.unrecoverable:
                raise Violation(f"task {lid} {sorted(t.lost)} still pending at the end")
        for lid in self.meta:
            for first, b in self.dirty(lid):
                t = self.tasks.get(lid)
                if t is None or not t.unrecoverable:
                    raise Violation(f"ledger {lid} fragment {first} names {b} lacking entries at the end")
        for lid, eid in self.acked:
            if not any(b.holds(lid, eid) for b in self.bookies.values() if not b.dead):
                t = self.tasks.get(lid)
                if t is None or not any(a <= eid <= z for a, z in t.unrecoverable):
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
    bad = replaced = unrecoverable = lost_cas = fenced = guarded = gc_cleared = gc_refused = 0
    for seed in range(a.seed, a.seed + a.runs):
        try:
            w = run_seed(seed, a.mutant)
            replaced += w.replaced
            lost_cas += w.lost_cas
            fenced += w.fenced_clears
            guarded += w.guarded_cas
            gc_cleared += w.gc_cleared
            gc_refused += w.gc_refused
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
          f"bookie's GC, {gc_refused} such clearing(s) refused")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
