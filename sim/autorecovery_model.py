"""The autorecovery simulation's model of the world (sim/autorecovery.py):
its bookies (what each holds: entries, leftovers, rotted records; the
shipped ``BookieCore`` for its copy fence and its count of admitted
requests), its stream writers, the timings and the violation raised when
an invariant breaks.  Only these are models; the decisions are the
shipped cores."""
from __future__ import annotations

import dataclasses

from bookie.core import BookieCore, Status
from bookie.entry import REQ_RECOVERY, EntryHeader

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
    # (lid, eid) -> when its record here rotted (bits flipped on disk): held,
    # and no replica (every read and copy checks the CRC) until an add of
    # that id replaces it (a fill in place)
    rotted: dict = dataclasses.field(default_factory=dict)
    # rotted records a copy wrote here (a copier forwarding a record that
    # fails its CRC: mutant copy-rotted): not damage found later, a copy's
    bad_copies: set = dataclasses.field(default_factory=set)
    # (lid, eid) a writer's add never reached here (acknowledged by the
    # others; the writer then replaced this bookie from the next id): held
    # by nobody here until the full check finds it and a worker fills it
    missed: set = dataclasses.field(default_factory=set)
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
        self.rotted.pop((lid, eid), None)
        self.bad_copies.discard((lid, eid))
        self.missed.discard((lid, eid))

    def holds(self, lid: int, eid: int) -> bool:
        """The entry itself (a leftover record is not it, nor a rotted one)."""
        return (lid, eid) in self.data and (lid, eid) not in self.leftover and (lid, eid) not in self.rotted

    def lose_data(self) -> None:
        self.data, self.leftover, self.rotted, self.bad_copies, self.missed = set(), set(), {}, set(), set()


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
