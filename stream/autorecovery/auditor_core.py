"""The auditor's decisions, as pure code (no I/O, no clock: ``now`` is an
input, effects are outputs; etcd-io/raft's Tick/Ready style).

Inputs:

- :meth:`AuditorCore.on_registrations` -- the set of registered bookies
  (writable and read-only), whenever it changes (a watch event, or a fresh
  listing after a watch was lost);
- :meth:`AuditorCore.on_scan_page` -- one page of a metadata scan: for each
  ledger, the bookies its fragments name (the adapter pages the ledgers,
  never one huge read);
- :meth:`AuditorCore.tick` -- time passing.

Effects (returned by ``tick`` / ``on_scan_page`` / ``on_registrations``):

- :class:`Scan` -- scan every ledger's fragments (one scan at a time; a
  lost bookie found meanwhile gets a scan of its own afterwards);
- :class:`PublishTask` -- one under-replicated task per ledger, naming the
  lost bookies it still references (the adapter merges it into the task key);
- :class:`MootTasks` -- a bookie declared lost is registered again: pending
  tasks naming it are moot for it (apache/bookkeeper#2766).

Rules:

1. A bookie whose registration disappears is *missing*; only after
   ``lost_bookie_recovery_delay`` is it *lost* and scanned for (a rolling
   restart must not trigger copying).  Back within the delay: cancelled.
2. A scan also reports every bookie a fragment names: one that is not
   registered and not already missing starts its delay then (an auditor
   elected after a bookie died, or after the previous auditor was killed
   mid-scan, still finds it: the first effect of a new core is a Scan).
3. A lost bookie that comes back: MootTasks for it; it is no longer lost.
4. Each ledger gets one task per scan page, naming only lost bookies.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Union


@dataclasses.dataclass(frozen=True)
class AuditorConfig:
    lost_bookie_recovery_delay: float = 30.0
    # the periodic check (every fragment's bookies asked whether they hold
    # their entries); None: off
    check_interval: float | None = None
    # the periodic check reads every entry from every replica of the sealed
    # fragments (stream/autorecovery/replica_check.py) instead of one ReadLac
    full_check: bool = False
    # ... of that share of each fragment's ids (its first and last always;
    # BookKeeper's auditorLedgerVerificationPercentage; replica_check.sampled_ranges)
    full_check_percent: float = 100.0

    def __post_init__(self) -> None:
        assert self.lost_bookie_recovery_delay >= 0
        assert self.check_interval is None or self.check_interval > 0
        assert 0 <= self.full_check_percent <= 100


@dataclasses.dataclass(frozen=True)
class Scan:
    """Scan all ledgers; publish tasks for fragments naming ``lost``."""

    lost: frozenset[str]


@dataclasses.dataclass(frozen=True)
class PublishTask:
    ledger_id: int
    lost: frozenset[str]


@dataclasses.dataclass(frozen=True)
class MootTasks:
    bookie: str


@dataclasses.dataclass(frozen=True)
class Check:
    """Run the periodic per-fragment check (``check_interval``)."""


Effect = Union[Scan, PublishTask, MootTasks, Check]


class AuditorCore:
    """One elected auditor's state.  A new auditor starts a new core."""

    def __init__(self, cfg: AuditorConfig, now: float) -> None:
        self.cfg = cfg
        self.registered: set[str] = set()
        self.missing: dict[str, float] = {}   # bookie -> when it went missing
        self.lost: set[str] = set()           # delay passed, not back
        self.scanning: frozenset[str] | None = None
        self.to_scan: set[str] = set()        # lost, not yet scanned for
        self.cancelled = 0                    # returns within the delay
        self.tasks_published = 0
        self._first_scan = True               # rule 2: a new auditor scans at once
        self._next_check = None if cfg.check_interval is None else now + cfg.check_interval

    # -- inputs -----------------------------------------------------------------------

    def on_registrations(self, now: float, registered: Iterable[str]) -> list[Effect]:
        new = set(registered)
        out: list[Effect] = []
        for b in self.registered - new:
            if b not in self.missing and b not in self.lost:
                self.missing[b] = now
        for b in new:
            if self.missing.pop(b, None) is not None:
                self.cancelled += 1
            if b in self.lost:
                self.lost.discard(b)
                self.to_scan.discard(b)
                out.append(MootTasks(b))
        self.registered = new
        return out + self.tick(now)

    def on_scan_page(self, now: float, named: Mapping[int, Iterable[str]]) -> list[Effect]:
        """``named``: ledger id -> the bookies its fragments name."""
        assert self.scanning is not None, "a scan page without a scan"
        out: list[Effect] = []
        for lid in sorted(named):
            bookies = set(named[lid])
            for b in bookies - self.registered - self.lost:
                self.missing.setdefault(b, now)  # rule 2
            hit = frozenset(bookies & self.scanning)
            if hit:
                self.tasks_published += 1
                out.append(PublishTask(lid, hit))
        return out

    def on_scan_done(self, now: float, completed: bool = True) -> list[Effect]:
        """The scan ended; ``completed`` False (etcd failed mid-scan): its
        bookies are scanned for again."""
        assert self.scanning is not None
        if not completed:
            self.to_scan |= self.scanning & self.lost
            if not self.scanning:
                self._first_scan = True
        self.scanning = None
        return self.tick(now)

    def tick(self, now: float) -> list[Effect]:
        out: list[Effect] = []
        for b, since in sorted(self.missing.items()):
            if now - since >= self.cfg.lost_bookie_recovery_delay:
                del self.missing[b]
                self.lost.add(b)
                self.to_scan.add(b)
        if self.scanning is None and (self.to_scan or self._first_scan):
            self.scanning = frozenset(self.to_scan)
            self.to_scan = set()
            self._first_scan = False
            out.append(Scan(self.scanning))
        if self._next_check is not None and now >= self._next_check:
            assert self.cfg.check_interval is not None
            self._next_check = now + self.cfg.check_interval
            out.append(Check())
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`tick` next has something to do (None: only on input)."""
        times = [since + self.cfg.lost_bookie_recovery_delay for since in self.missing.values()]
        if self._next_check is not None:
            times.append(self._next_check)
        return min(times) if times else None


__all__ = ["AuditorConfig", "AuditorCore", "Scan", "PublishTask", "MootTasks", "Check", "Effect"]
