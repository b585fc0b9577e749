"""The simulator runs the shipped timing rules (stream/timers.py WriterClock
and RecoveryClock), not a copy: a change to a rule there changes what the
simulated writers and recoveries do."""
from collections import Counter

import sim
from sim.scenario import Scenario
from stream.timers import RecoveryClock, WriterClock

SEEDS = range(40)


def _stats():
    stats = Counter()
    for seed in SEEDS:
        stats.update(sim.run(Scenario.random(seed, mode="unbounded")).stats)
    return stats


def test_the_simulated_writers_send_explicit_lacs_by_the_shipped_rule(monkeypatch):
    told = []
    real = WriterClock.tick

    def tick(self, now):
        t = real(self, now)
        if t.tell_lac is not None:
            told.append(t.tell_lac)
        return t

    monkeypatch.setattr(WriterClock, "tick", tick)
    stats = _stats()
    assert told and stats["msg_wlac"] > 0
    assert stats["msg_wlac"] >= len(told)  # each told LAC went to the ensemble


def test_a_mutant_of_the_shipped_rule_changes_the_simulation(monkeypatch):
    """Mutant: the clock never tells the LAC (a rule broken in stream/timers.py
    alone): the simulated writers send no explicit LAC at all."""
    real = WriterClock.tick

    def tick(self, now):
        t = real(self, now)
        t.tell_lac = None
        return t

    monkeypatch.setattr(WriterClock, "tick", tick)
    assert _stats()["msg_wlac"] == 0


def test_the_simulated_recoveries_speculate_by_the_shipped_rule(monkeypatch):
    """RecoveryClock in simulated time: reads that stalled (one bookie asked
    first, no answer for timeout // 3) are asked of the rest of their write
    sets; a mutant of the rule (never speculate) leaves none."""
    asked = []
    real = RecoveryClock.tick

    def tick(self, now):
        n = real(self, now)
        asked.append(n)
        return n

    monkeypatch.setattr(RecoveryClock, "tick", tick)
    stats = _stats()
    assert sum(asked) > 0 and stats["recovery_speculations"] == sum(1 for n in asked if n)
    monkeypatch.setattr(RecoveryClock, "tick", real)
    init = RecoveryClock.__init__
    monkeypatch.setattr(RecoveryClock, "__init__", lambda self, core, timeout: init(self, core, 10 ** 9))
    assert _stats()["recovery_speculations"] == 0
