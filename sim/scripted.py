"""Fixed scenarios, scripted step by step on the simulated world (no random
faults; every message takes one tick; links are blocked by hand).

- ``seed_counterexample``: the divergence counterexample of
  ../shared/seeds/unbounded-ledgers-terms.txt and protocol-rules.md ("Why the
  truncate flag matters"), on the real cores.
- ``reused_bookie``: a bookie replaced during a recovery keeps the old term's
  uncommitted entries; a later ensemble change of the new writer picks it
  again; it then holds a stale value for an entry the new writer commits
  without it (the spec's EnsembleChange prepares the new bookie; the
  implementation has no such step).
- ``recovery_hole``: issue 12's hole.  An aborted take-over's truncate no-op
  at p+1 on two bookies, the old writer's p+1..p+3 on the third; the next
  take-over reads p+1 as the no-op and must not recover p+2, p+3 above it
  (log matching on origin terms; without it: NoHole).
- ``classic_change_after_release``: a classic writer's add reaches Qa and is
  released; the third bookie's ack is lost, its frame times out, and the
  writer replaces that bookie with nothing pending (the spec once allowed an
  ensemble change only for an unreleased add: TLC rejected such traces).
- ``fence_barrier``: the pending add window.  A take-over's fencing read and
  then its recovery read reach a bookie while the old writer's add there is
  admitted but not yet durable: both wait for the journal's sync (the
  bookie core's barrier); a core that does not make the recovery read wait
  answers NO_SUCH_ENTRY for an add it then stores with the old term.
"""
from __future__ import annotations

from sim.scenario import Scenario
from sim.world import World
from stream.mutations import NONE as NO_MUTATIONS
from stream.mutations import Mutations

SCRIPTED = dict(p_loss=0.0, p_slow=0.0, delay_min=1, delay_max=1, fsync_min=0, fsync_max=0, crashes=0,
                client_crashes=0, partitions=0, reads=0, timeout=30, E=3, Qw=3, Qa=2, clients=2)


def seed_counterexample(*, check_trace: bool = True, attach=None, mutations: Mutations = NO_MUTATIONS) -> World:
    """1. c0 (term 1) writes entry 0 to b0, b1, b2; entries 1 and 2 reach b0 only.
    2. c1 takes over with term 2; b0 does not answer its reads, but takes its
       writes: b1 and b2 say entry 1 does not exist: a truncate no-op at 1.
    3. c1 writes entry 2; b1 and b2 acknowledge it (b0 unreachable).
    Without the truncate flag, b0 keeps c0's entry 2: divergence at 2."""
    w = World(Scenario(seed=0, bookies=3, **SCRIPTED), scripted=True, check_trace=check_trace,
              mutations=mutations)
    if attach is not None:
        attach(w)
    c0, c1 = w.clients["c0"], w.clients["c1"]
    w.do(c0.add)
    w.run(until=10)
    assert set(w.acked) == {0}
    w.blocked |= {("c0", "b1", "add"), ("c0", "b2", "add")}
    w.do(c0.add)
    w.do(c0.add)
    w.run(until=20)
    w.blocked |= {("c1", "b0", "lac"), ("c1", "b0", "read")}
    assert w.do(c1.takeover)
    w.run(until=200)
    w.blocked |= {("c1", "b0", "add")}
    w.do(c1.add)
    w.run(until=300)
    w.run()
    return w


def reused_bookie(*, check_trace: bool = True, attach=None, mutations: Mutations = NO_MUTATIONS) -> World:
    """1. c0 (term 1) writes entry 0 to b0, b1, b2; entries 1..3 reach b0 only.
    2. c1 takes over with term 2; b0 is unreachable: the recovery replaces it
       with b3 and truncates at 1 on b3, b1, b2; b0 keeps c0's 1..3.
    3. c1 writes entry 2; b1 fails: the change from 2 picks the only spare, b0,
       which still holds c0's entry 2 (and 3) while c1's entry 2 is committed."""
    w = World(Scenario(seed=0, bookies=4, **SCRIPTED), scripted=True, check_trace=check_trace,
              mutations=mutations)
    if attach is not None:
        attach(w)
    c0, c1 = w.clients["c0"], w.clients["c1"]
    w.do(c0.add)
    w.run(until=10)
    w.blocked |= {("c0", "b1", "add"), ("c0", "b2", "add")}
    for _ in range(3):
        w.do(c0.add)
    w.run(until=20)
    w.blocked |= {("c1", "b0", "lac"), ("c1", "b0", "read"), ("c1", "b0", "add")}
    assert w.do(c1.takeover)
    w.run(until=200)
    # (from 1: c0 told the ensemble its LAC and LAFR, 0 and 0, once entry 0 reached Qw)
    assert w.meta.last_frag == (1, ("b3", "b1", "b2")), w.meta
    w.blocked -= {("c1", "b0", "add")}
    w.blocked |= {("c1", "b1", "add")}
    w.do(c1.add)
    w.run(until=300)
    w.blocked -= {("c1", "b1", "add")}
    w.do(c1.add)
    w.run()
    return w


def recovery_hole(*, check_trace: bool = True, attach=None, mutations: Mutations = NO_MUTATIONS) -> World:
    """E3 Qw3 Qa2 on exactly three bookies (no spare).
    1. c0 (term 1) writes entries 0, 1 to b0, b1, b2 (acknowledged); its
       2, 3, 4 reach b2 only.
    2. c1 takes over with term 2; b2 is paused for it: c1 reads 2 as absent
       on b0 and b1, writes its truncate no-op at 2 to them, times out on
       b2, has no bookie to replace it with, and aborts.
    3. c2 takes over with term 3; its fencing read to b0 is lost, so b1
       and b2 make the coverage: they say b1 holds up to 2 and b2 up to 4,
       so 2 is read from b1 first (the no-op, origin 2) and 3, 4 from b2
       first (c0's, origin 1): stale, since the floor is 2 once 2 is
       decided.  The end is 3 (without log matching: 3, 4 are recovered
       above the no-op, and the stream has a hole)."""
    w = World(Scenario(seed=0, bookies=3, **{**SCRIPTED, "clients": 3}), scripted=True, check_trace=check_trace,
              mutations=mutations)
    if attach is not None:
        attach(w)  # e.g. a sim.trace.Tracer, before the first event
    c0, c1, c2 = w.clients["c0"], w.clients["c1"], w.clients["c2"]
    w.do(c0.add)
    w.do(c0.add)
    w.run(until=10)
    assert set(w.acked) == {0, 1}
    w.blocked |= {("c0", "b0", "add"), ("c0", "b1", "add")}
    for _ in range(3):
        w.do(c0.add)
    w.run(until=20)
    w.blocked |= {("c1", "b2", kind) for kind in ("lac", "read", "add")}
    assert w.do(c1.takeover)
    w.run(until=200)
    assert w.stats.get("recovery_aborted") == 1 and w.meta.state == "IN_RECOVERY", w.stats
    for b in ("b0", "b1"):
        assert w.bookie_state(b)[2][2] == ("noop", 2), w.bookie_state(b)
    assert {n for n in w.bookie_state("b2")[2]} == {0, 1, 2, 3, 4}
    w.blocked = {("c2", "b0", "lac")}
    assert w.do(c2.takeover)
    w.run()
    return w


def classic_change_after_release(*, check_trace: bool = True, attach=None,
                                 mutations: Mutations = NO_MUTATIONS) -> World:
    """Classic, E3 Qw3 Qa2, four bookies.
    1. c0 writes entry 0; b0 and b1 acknowledge it (Qa: acknowledged and
       released, classic releases at the LAC); b2 stores it, but its answer
       is lost.
    2. The frame to b2 times out: b2 failed, with no add pending; the
       writer replaces it with b3 from entry 1 (LAC + 1).
    3. c0 writes entry 1 to the new ensemble; c1 recovers and closes at 1."""
    w = World(Scenario(seed=0, mode="classic", bookies=4, **SCRIPTED), scripted=True, check_trace=check_trace,
              mutations=mutations)
    if attach is not None:
        attach(w)
    c0, c1 = w.clients["c0"], w.clients["c1"]
    w.blocked |= {("b2", "c0", "add")}
    w.do(c0.add)
    w.run(until=10)
    assert set(w.acked) == {0} and 0 in w.bookie_state("b2")[2]
    assert c0.writer is not None and not c0.writer.pending  # released at Qa
    w.run(until=100)
    assert w.meta.last_frag == (1, ("b0", "b1", "b3")), w.meta
    w.blocked = set()
    w.do(c0.add)
    w.run(until=200)
    assert set(w.acked) == {0, 1}
    assert w.do(c1.takeover)
    w.run()
    assert w.meta.state == "CLOSED" and w.meta.last == 1, w.meta
    return w


def fence_barrier(*, check_trace: bool = True, attach=None, mutations: Mutations = NO_MUTATIONS) -> World:
    """E3 Qw3 Qa2 on three bookies; every fsync 5 ticks after what it syncs.
    1. c0 (term 1) writes entry 0 (acknowledged, its LAC told); its entry 1
       reaches b0 only, at t, synced at t + 5.
    2. c1 takes over (term 2) at t: its fencing read reaches b0 at t + 1
       (the term changes: a state record, after the pending add) and its
       read of entry 1 at t + 3 (the term unchanged, the add still pending:
       the barrier); both are answered after the sync at t + 5, with entry
       1.  (b1 and b2 say entry 1 does not exist: the end is 1.)"""
    w = World(Scenario(seed=0, bookies=3, **{**SCRIPTED, "fsync_min": 5, "fsync_max": 5}), scripted=True,
              check_trace=check_trace, mutations=mutations)
    if attach is not None:
        attach(w)
    c0, c1 = w.clients["c0"], w.clients["c1"]
    w.do(c0.add)
    w.run(until=40)
    assert set(w.acked) == {0}
    w.blocked |= {("c0", "b1", "add"), ("c0", "b2", "add")}
    w.do(c0.add)
    w.run(until=w.now + 1)
    assert w.bookies["b0"].unsynced and 1 not in w.bookie_state("b0")[2]
    assert w.do(c1.takeover)
    w.run()
    return w


SCRIPTS = {"seed_counterexample": seed_counterexample, "reused_bookie": reused_bookie,
           "recovery_hole": recovery_hole, "classic_change_after_release": classic_change_after_release,
           "fence_barrier": fence_barrier}
