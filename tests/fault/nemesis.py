"""The nemesis: a fault schedule derived from a seed, and its execution on a
FaultCluster.

``plan(seed, ...)`` is a pure function: the same seed gives the same list of
faults (kind, target, start time, duration, parameters), whatever happens
when it runs.  What cannot be replayed exactly is the processes' timing:
which appends are in flight when a fault lands, how long a restart takes
(a later fault on a bookie still restarting is skipped, and logged so).

Fault kinds (``KINDS``: weight, duration range in seconds):

- ``kill_bookie``: kill -9, restart after the duration;
- ``pause_bookie``: SIGSTOP, SIGCONT after the duration (some longer than
  the registration TTL);
- ``partition``: the bookie's proxy blackholes or cuts the links of every
  client, or of one writer only, healed after the duration;
- ``etcd_partition``: the bookie's link to etcd (and only its) blackholed or
  cut, healed after the duration (some longer than the registration TTL:
  its lease expires while it serves clients, and it must register again);
- ``full_disk``: the tmpfs bookie's disk is filled, freed after the duration;
- ``torn_tail``: kill -9, a record cut short appended to the journal,
  restart after the duration;
- ``kill_writer`` / ``kill_reader``: kill -9, a new incarnation after the
  duration;
- ``pause_writer``: SIGSTOP, SIGCONT after the duration (a zombie leader:
  the other writer takes over meanwhile, and its adds must then fail);
- ``takeover``: a writer is told (SIGUSR1) to take the stream over now (the
  writers also duel by themselves: a fenced writer takes it back);
- ``kill_etcd``: kill -9 of etcd, restarted after the duration (some
  outages longer than the lease TTL); ``pause_etcd``: SIGSTOP / SIGCONT
  (an outage whose connections hang);
- ``cut_tail`` (only when named in ``kinds``): kill -9, the journal's last
  bytes cut off, restart: a disk losing fsynced data, outside the fault
  model (its anomalies are attributed to it, not to a bug).

With ``slow_disks`` (left out of the draw otherwise, likewise):

- ``slow_disk``: every fsync of the bookie sleeps 50 ms to 1.5 s first
  (cluster.py: an LD_PRELOAD shim), for the duration: a bookie that answers,
  slowly (a gray failure: its adds queue up, its acks come late, it is
  never down).

With ``rot`` (left out of the draw otherwise, likewise):

- ``rot_entry``: one bit of an entry's payload flipped in a journal segment
  of a running bookie, where it was durable (cluster.py); the bookie's
  scrub (every 3 s here) or a read finds it, and autorecovery, if it runs,
  copies it back.  Rots and ``lose_bookie`` hit one bookie of a run only:
  with Qa = 2, an acknowledged entry then keeps a good copy (a rot whose
  bookie holds nothing yet goes to the one holding the most, where no lost
  disk is planned: ``Nemesis._rot_slot``).

With autorecovery processes in the cluster (``recoverers``; none, and these
kinds are left out of the draw, so the plans of earlier seeds stay as
they were):

- ``lose_bookie``: kill -9 and its data dir wiped (a disk lost for good);
  after the duration a new, empty bookie (a new id) starts in its place.
  At most one a run: with Qa = 2, one lost disk leaves every acknowledged
  entry a copy, which autorecovery must bring back to Qw before a second
  loss could take the last one (two would be outside the model);
- ``kill_autorecovery``: kill -9 of an auditor + worker process, restarted
  after the duration (a copy or a take-over cut off midway, a lock and an
  election left to their leases); ``pause_autorecovery``: SIGSTOP /
  SIGCONT (a worker that wakes up after its lock's lease ran out).

At most ``max_bookie_faults`` bookies are hurt at once, so that an
ensemble of three can still be formed from five bookies.
"""
from __future__ import annotations

import json
import logging
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

BOOKIE_KINDS = {"kill_bookie", "pause_bookie", "partition", "etcd_partition", "full_disk", "torn_tail", "cut_tail",
                "lose_bookie", "slow_disk", "rot_entry"}
AUTORECOVERY_KINDS = {"lose_bookie", "kill_autorecovery", "pause_autorecovery"}   # only with recoverers
SLOW_KINDS = {"slow_disk"}                                                       # only with slow_disks
ROT_KINDS = {"rot_entry"}                                                        # only with rot
DAMAGING_KINDS = {"lose_bookie", "rot_entry"}   # (data lost on a bookie: one bookie a run)
RESTART_MARGIN = 8.0   # a killed bookie's restart can wait for its old lease (2 x TTL)


@dataclass(frozen=True)
class Kind:
    weight: int
    duration: tuple[float, float]


KINDS: dict[str, Kind] = {
    "kill_bookie": Kind(3, (0.5, 5.0)),
    "pause_bookie": Kind(2, (0.5, 6.0)),
    "partition": Kind(3, (1.0, 8.0)),
    "etcd_partition": Kind(2, (1.0, 8.0)),
    "full_disk": Kind(1, (1.0, 6.0)),
    "torn_tail": Kind(1, (0.3, 3.0)),
    "kill_writer": Kind(2, (0.2, 2.0)),
    "pause_writer": Kind(2, (0.5, 6.0)),
    "kill_reader": Kind(1, (0.2, 2.0)),
    "takeover": Kind(2, (0.0, 0.0)),
    "kill_etcd": Kind(1, (0.5, 7.0)),
    "pause_etcd": Kind(1, (0.5, 6.0)),
    # outside the fault model (cluster.cut_journal_tail): only when named in ``kinds``
    "cut_tail": Kind(0, (0.3, 3.0)),
    # with autorecovery processes only (``plan(recoverers=...)``)
    "lose_bookie": Kind(2, (0.5, 3.0)),
    "kill_autorecovery": Kind(2, (0.5, 4.0)),
    "pause_autorecovery": Kind(1, (0.5, 6.0)),
    # with slow_disks only
    "slow_disk": Kind(2, (1.0, 8.0)),
    # with rot only (instant: what it did stays, until autorecovery mends it)
    "rot_entry": Kind(2, (0.0, 0.0)),
}


@dataclass
class Fault:
    t: float
    kind: str
    target: object
    duration: float
    params: dict = field(default_factory=dict)


def plan(seed: int, seconds: float, *, bookies: int, writers: list[str], readers: list[str],
         tmpfs_bookie: int | None, kinds: list[str] | None = None, max_bookie_faults: int = 2,
         mean_gap: float = 1.5, recoverers: list[str] = (), slow_disks: bool = False,
         rot: bool = False) -> list[Fault]:
    """The fault schedule of a seed (pure: no clock, no I/O)."""
    rng = random.Random(seed)
    names = [k for k in (kinds or KINDS) if (k != "full_disk" or tmpfs_bookie is not None)
             and (k not in AUTORECOVERY_KINDS or recoverers) and (k not in SLOW_KINDS or slow_disks)
             and (k not in ROT_KINDS or rot)]
    weights = [KINDS[k].weight or (1 if kinds else 0) for k in names]  # a named kind runs, weight 0 or not
    bookie_free = [0.0] * bookies
    worker_free = {w: 0.0 for w in [*writers, *readers, *recoverers]}
    etcd_free = 0.0
    lost = False   # (one lose_bookie a run)
    damaged = None   # the one bookie whose data a run's damaging faults hit
    out: list[Fault] = []
    t = rng.uniform(0.5, 2.0)
    while t < seconds:
        kind = rng.choices(names, weights)[0]
        lo, hi = KINDS[kind].duration
        d = round(min(rng.uniform(lo, hi), max(lo, seconds - t)), 2)
        f = None
        if kind in BOOKIE_KINDS:
            hurt = sum(1 for x in bookie_free if x > t)
            free = [i for i in range(bookies) if bookie_free[i] <= t]
            if kind == "full_disk":
                free = [i for i in free if i == tmpfs_bookie]
            if kind == "lose_bookie" and lost:
                free = []
            if kind in DAMAGING_KINDS and damaged is not None:
                free = [i for i in free if i == damaged]
            if free and hurt < max_bookie_faults:
                i = rng.choice(free)
                params = {}
                if kind == "partition":
                    params = {"mode": rng.choice(["blackhole", "cut"]),
                              "scope": rng.choice(["all", "all"] + writers)}
                elif kind == "etcd_partition":
                    params = {"mode": rng.choice(["blackhole", "cut"])}
                elif kind == "slow_disk":
                    params = {"delay_ms": rng.choice([50, 200, 500, 1500])}
                f = Fault(round(t, 2), kind, i, d, params)
                lost = lost or kind == "lose_bookie"
                damaged = i if kind in DAMAGING_KINDS else damaged
                margin = RESTART_MARGIN if kind in ("kill_bookie", "torn_tail", "cut_tail", "lose_bookie") else 0.5
                bookie_free[i] = t + d + margin
        elif kind in ("kill_writer", "kill_reader", "takeover", "pause_writer", "kill_autorecovery",
                      "pause_autorecovery"):
            group = {"kill_reader": readers, "kill_autorecovery": recoverers, "pause_autorecovery": recoverers}
            pool = [w for w in group.get(kind, writers) if worker_free[w] <= t]
            if pool:
                w = rng.choice(pool)
                f = Fault(round(t, 2), kind, w, d)
                worker_free[w] = t + d + 1.0
        elif kind in ("kill_etcd", "pause_etcd") and etcd_free <= t:
            f = Fault(round(t, 2), kind, "etcd", d)
            etcd_free = t + d + 3.0
        if f is not None:
            out.append(f)
        t += rng.expovariate(1.0 / mean_gap)
    return out


class Nemesis:
    """Runs a plan against a FaultCluster, logging every action (with its
    actual time and result) to ``log_path``."""

    def __init__(self, cluster, faults: list[Fault], log_path: Path, seed: int):
        self.c = cluster
        self.faults = faults
        self.log_path = Path(log_path)
        self.rng = random.Random(seed ^ 0x5EED)
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="nemesis")
        self.pending = []
        self.t0 = 0.0
        self.done: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.rot_slot: int | None = None   # (_rot_slot)
        self.lock = threading.Lock()

    def _log(self, **rec) -> None:
        rec["at"] = round(time.monotonic() - self.t0, 3)
        with self.lock, open(self.log_path, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")

    def _worker(self, name: str):
        return next(w for w in self.c.workers if w.name == name)

    def run(self) -> None:
        """Executes the schedule; returns when its last action is due
        (restarts may still be under way: ``settle`` waits for them)."""
        steps = []
        for n, f in enumerate(self.faults):
            steps.append((f.t, n, "start", f))
            if f.duration > 0 and f.kind != "takeover":
                steps.append((f.t + f.duration, n, "end", f))
        steps.sort(key=lambda s: (s[0], s[1], s[2] == "start"))
        self.t0 = time.monotonic()
        for at, n, phase, f in steps:
            delay = self.t0 + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the schedule's own clock, not a synchronisation
            try:
                result = self._apply(f, phase, n)
            except Exception as e:  # a fault that could not be done is logged, never fatal
                log.exception("nemesis %s %s", phase, f)
                result = {"error": repr(e)}
            self._log(n=n, phase=phase, fault=asdict(f), result=result)

    def _apply(self, f: Fault, phase: str, n: int) -> dict:
        c, k = self.c, f.kind
        if phase == "start":
            if k in BOOKIE_KINDS:
                b = c.bookies[f.target]
                if b.state != "up" or not b.proc.alive():
                    self.skipped[k] = self.skipped.get(k, 0) + 1
                    f.params["skipped"] = True
                    return {"skipped": f"bookie {f.target} is {b.state}"}
            self.done[k] = self.done.get(k, 0) + 1
            if k == "kill_bookie":
                c.kill_bookie(f.target)
            elif k == "pause_bookie":
                c.stop_bookie(f.target)
            elif k == "partition":
                scope = f.params["scope"]
                pids = None if scope == "all" else [p for p in [self._worker(scope).pid] if p]
                c.partition(f.target, f.params["mode"], pids)
                return {"pids": pids}
            elif k == "etcd_partition":
                c.partition_from_etcd(f.target, f.params["mode"])
            elif k == "full_disk":
                return c.fill_disk(f.target)
            elif k == "torn_tail":
                c.kill_bookie(f.target)
                return c.tear_journal_tail(f.target, self.rng)
            elif k == "cut_tail":
                c.kill_bookie(f.target)
                return c.cut_journal_tail(f.target, self.rng)
            elif k == "lose_bookie":
                c.kill_bookie(f.target)
                return c.wipe_bookie(f.target)
            elif k == "slow_disk":
                return c.slow_disk(f.target, f.params["delay_ms"])
            elif k == "rot_entry":
                return c.rot_entry(self._rot_slot(f), self.rng)
            elif k == "kill_autorecovery":
                c.recoverer(f.target).kill()
            elif k == "pause_autorecovery":
                c.recoverer(f.target).signal(signal.SIGSTOP)
            elif k in ("kill_writer", "kill_reader"):
                self._worker(f.target).kill()
            elif k == "takeover":
                self._worker(f.target).signal(signal.SIGUSR1)
            elif k == "pause_writer":
                self._worker(f.target).signal(signal.SIGSTOP)
            elif k == "kill_etcd":
                c.kill_etcd()
            elif k == "pause_etcd":
                c.stop_etcd()
            return {}
        if f.params.get("skipped"):
            return {"skipped": True}
        if k in ("kill_bookie", "torn_tail", "cut_tail"):
            self.pending.append(self.pool.submit(self._logged, n, "restarted", c.start_bookie, f.target))
        elif k == "lose_bookie":
            self.pending.append(self.pool.submit(self._logged, n, "restarted", c.start_wiped_bookie, f.target))
        elif k == "kill_autorecovery":
            self.pending.append(self.pool.submit(self._logged, n, "restarted", c.recoverer(f.target).start))
        elif k == "pause_autorecovery":
            c.recoverer(f.target).signal(signal.SIGCONT)
        elif k == "pause_bookie":
            c.cont_bookie(f.target)
        elif k == "partition":
            c.heal(f.target)
        elif k == "etcd_partition":
            c.heal_etcd_link(f.target)
        elif k == "full_disk":
            c.free_disk(f.target)
        elif k == "slow_disk":
            c.fast_disk(f.target)
        elif k in ("kill_writer", "kill_reader"):
            self.pending.append(self.pool.submit(self._logged, n, "restarted", self._worker(f.target).start))
        elif k == "pause_writer":
            self._worker(f.target).signal(signal.SIGCONT)
        elif k == "kill_etcd":
            self.pending.append(self.pool.submit(self._logged, n, "restarted", c.start_etcd))
        elif k == "pause_etcd":
            c.cont_etcd()
        return {}

    def _rot_slot(self, f: Fault) -> int:
        """The bookie a run's rots hit: the planned one, unless the first
        rot finds it holding nothing to rot (not in any ensemble yet) and
        no lost disk is planned (which must hit the same bookie): then the
        live bookie holding the most (the run's one damaged bookie still)."""
        if self.rot_slot is None:
            c = self.c
            if c.rot_candidates(f.target) or any(x.kind == "lose_bookie" for x in self.faults):
                self.rot_slot = f.target
            else:
                up = [b.index for b in c.bookies if b.state == "up" and b.proc.alive()]
                self.rot_slot = max(up, key=lambda i: (len(c.rot_candidates(i)), i == f.target))
        return self.rot_slot

    def _logged(self, n: int, phase: str, fn, *args):
        """A restart in the background, logged when done (how long an
        outage really lasted: the planned duration plus the start-up)."""
        try:
            result = fn(*args)
            self._log(n=n, phase=phase, ok=result is not False)
        except Exception as e:
            self._log(n=n, phase=phase, ok=False, error=repr(e))
            raise

    def heal_all(self) -> dict:
        """Ends every fault still on: what a final check needs (live
        bookies are not restarted: a bookie that lost its registration
        stays unregistered, which the check must see)."""
        for p in self.pending:
            try:
                p.result(120)
            except Exception as e:
                self._log(phase="heal", error=repr(e))
        c = self.c
        if c.etcd_state == "stopped":
            c.cont_etcd()
        elif c.etcd_state != "up":
            c.start_etcd()
        restarted = []
        for b in c.bookies:
            c.heal(b.index)
            c.heal_etcd_link(b.index)
            c.free_disk(b.index)
            c.fast_disk(b.index)
            if b.state == "stopped":
                c.cont_bookie(b.index)
            if b.state == "killed" or not b.proc.alive():
                restarted.append((b.index, c.start_bookie(b.index)))
        for w in [*c.workers, *c.recoverers]:
            if w.pid is None:
                w.start()
            else:
                w.signal(signal.SIGCONT)
        self.pool.shutdown(wait=True)
        self._log(phase="heal_all", restarted=restarted)
        return {"restarted": restarted}
