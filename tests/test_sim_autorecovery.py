"""The autorecovery simulation (sim/autorecovery.py): the shipped auditor,
worker and fragment-replacement cores under bookie losses, outages, worker
crashes and pauses, auditor failover, and open streams whose writers hold
lease-bound registrations (crashed, cut off from etcd, wedged); each mutant
caught (``ignore-writer``: a live writer fenced before the bound;
``no-bound``: a wedged writer's stream never sealed; ``no-copy-fence`` and
``no-cas-guard``: a worker paused past its lock clearing or publishing a
target another worker has since used; ``gc-no-lock`` and
``gc-no-touch-check``: a bookie's over-replicated GC clearing a copy's
target before its publication, or a fragment a writer rolled onto it since
the GC's read; ``fill-done-by-first``, ``copy-rotted`` and
``damaged-stays-lost``: a rotted id left unfilled as its task is deleted, a
bad record copied, a fill waiting for ever on a bookie gone; ``no-check``:
an add that missed a bookie never found (neither periodic check runs);
``mend-whole``: ids taken off a task that were never filled)."""
from __future__ import annotations

import pytest

from sim.autorecovery import MUTANTS, Violation, run_seed


def test_seeded_runs_are_clean_and_do_recover():
    replaced = fenced = guarded = seals = waits = changes = gc_cleared = gc_refused = 0
    rots = filled = damaged_lost = missed = found = mended = cheap = 0
    for seed in range(40):
        w = run_seed(seed)
        rots, filled, damaged_lost = rots + w.rots, filled + w.filled, damaged_lost + w.damaged_lost
        missed, found = missed + w.missed_writes, found + w.check_found
        mended, cheap = mended + w.mended, cheap + w.cheap_found
        replaced += w.replaced
        fenced, guarded = fenced + w.fenced_clears, guarded + w.guarded_cas
        gc_cleared, gc_refused = gc_cleared + w.gc_cleared, gc_refused + w.gc_refused
        seals, waits, changes = seals + w.seals, waits + w.writer_waits, changes + w.writer_changes
    # the runs exercise copies, and workers paused past their lock: their
    # clearings fenced by a target, their replacements refused by the guard
    # (a stale worker's CAS, once the common lost CAS, no longer reaches etcd)
    assert replaced > 50 and fenced > 0 and guarded > 0, (replaced, fenced, guarded)
    # ... and the streams' paths: writers changing their ensembles themselves,
    # workers leaving an open fragment to its live writer past the grace, and
    # taking streams with no live writer (or past the bound) over
    assert changes > 10 and waits > 0 and seals > 0, (changes, waits, seals)
    # ... and the bookies' over-replicated GC: clearings, and some refused
    # (the ledger written since its read, or a later copy's token there)
    assert gc_cleared > 50 and gc_refused > 0, (gc_cleared, gc_refused)
    # ... and rot: records rotted, their ids filled in place on their bookie, and
    # damaged bookies the auditor declared lost before their fill
    assert rots > 100 and filled > 100 and damaged_lost > 0, (rots, filled, damaged_lost)
    # ... and adds that missed a bookie, which the auditor's full check found
    assert missed > 10 and found > 10, (missed, found)
    # ... and the cheap check's missing tails, and fills taken off tasks still waiting
    assert cheap > 5 and mended > 5, (cheap, mended)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_mutant_is_caught(mutant):
    for seed in range(50):
        try:
            run_seed(seed, mutant)
        except Violation:
            return
    pytest.fail(f"mutant {mutant} not caught in 50 seeds")


def test_a_seed_replays_exactly():
    a, b = run_seed(7), run_seed(7)
    assert a.log == b.log
