"""Deterministic simulation of bookstream's protocol cores (see sim/world.py).

    from sim import Scenario, run
    world = run(Scenario.random(seed=42))      # raises sim.Violation

The real ``BookieCore``, ``WriterCore`` and ``RecoveryCore`` run over a
simulated network, disks and metadata store, with faults, from one seed.
After every step the spec's invariants are checked on the real state, and the
step is checked as a spec action (sim/spec.py).
"""
from __future__ import annotations

from sim.scenario import Scenario
from sim.world import Violation, World
from stream.mutations import NONE as NO_MUTATIONS
from stream.mutations import Mutations


def run(sc: Scenario, *, check_trace: bool = True, check_invariants: bool = True,
        mutations: Mutations = NO_MUTATIONS) -> World:
    """Runs one simulated run to the end; raises Violation on any failure.
    ``mutations``: broken rules the cores run with (stream/mutations.py)."""
    return World(sc, check_trace=check_trace, check_invariants=check_invariants, mutations=mutations).run()


__all__ = ["Scenario", "Violation", "World", "run"]
