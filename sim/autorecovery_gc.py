"""The bookies' over-replicated GC in the autorecovery simulation
(sim/autorecovery.py): each bookie's pass of
``bookie.ledger_gc.collect_over_replicated`` as a generator, a yield
between its steps (read, lock, count, read again, clear), paused at times
before its clearing, within its lock or past it.
The decisions are the shipped ones: ``unnamed_ranges``, ``reaches_open_end``
and ``BookieCore.admit_gc_clear``.  Mutants (``World.mutant``):
``gc-no-lock`` (no recovery lock taken: a fresh token instead) and
``gc-no-touch-check`` (the count of admitted requests never asked)."""
from __future__ import annotations

from bookie.core import Status
from bookie.ledger_gc import reaches_open_end, unnamed_ranges


class BookieGC:
    """Mixed into ``sim.autorecovery.World`` (its bookies, metadata, locks,
    clock, random source, pauses and ``TTL``, the locks' lease)."""

    def gc_step(self) -> None:
        """The running passes step on (a paused one waits); now and then an
        idle bookie starts one."""
        for bid, g in list(self.gcs.items()):
            if bid in self.paused and self.now < self.paused[bid]:
                continue
            self.paused.pop(bid, None)
            try:
                next(g)
            except StopIteration:
                del self.gcs[bid]
        idle = [b for b in self.bookies.values() if b.alive and b.id not in self.gcs]
        if idle and self.rng.random() < 0.2:
            b = self.rng.choice(idle)
            self.gcs[b.id] = self.gc_pass(b)

    def gc_pass(self, b):   # b: sim.autorecovery.SimBookie
        """``collect_over_replicated`` on one bookie, a yield between its
        steps: read, lock, count, read again, clear.  (Its first read and
        the filter on what the bookie holds are one: the second read decides.)"""
        owner = f"gc-{b.id}"

        def held(lid: int) -> list[tuple[int, int]]:
            return [(a, z) for a, z in unnamed_ranges(self.meta[lid][0], b.id)
                    if any(l == lid and a <= e <= z for l, e in b.data)]

        for lid in sorted({lid for lid, _ in b.data}):
            if not held(lid):
                continue
            yield
            lock = self.locks.get(lid)
            if self.mutant == "gc-no-lock":
                token = self._bump()   # a token above every copy's, no lock taken
            elif lock is not None and lock[1] >= self.now:
                continue
            else:
                self.locks[lid] = (owner, self.now + self.TTL)
                token = self.lock_token[lid] = self._bump()
            try:
                touched = b.core.touched_of(lid)
                ranges = held(lid)
                if touched is None or not ranges:
                    continue
                if self.faults_on and self.rng.random() < 0.3:  # paused before its clearing, maybe past its lock
                    self.paused[b.id] = self.now + self.rng.choice((0.5, self.TTL + 1.0, self.TTL + 4.0))
                    self.note(f"{b.id}'s GC paused before clearing ledger {lid}")
                for _ in range(self.rng.randint(1, 4)):
                    yield  # writers, copies and take-overs move on meanwhile
                    if self.locks.get(lid, (None,))[0] == owner and self.locks[lid][1] >= self.now:
                        self.locks[lid] = (owner, self.now + self.TTL)   # keep-alive
                if not b.alive:
                    return
                if self.mutant == "gc-no-touch-check" or not reaches_open_end(self.meta[lid][0], ranges):
                    touched = None
                if b.core.admit_gc_clear(lid, token, touched) is not Status.OK:
                    self.gc_refused += 1
                    self.note(f"{b.id}'s GC: ledger {lid} touched since its read (or a later token): kept")
                    continue
                b.data = {(l, e) for l, e in b.data if l != lid or not any(a <= e <= z for a, z in ranges)}
                self.gc_cleared += 1
                self.note(f"{b.id}'s GC cleared {ranges} of ledger {lid}, where no fragment names it")
            finally:
                if self.locks.get(lid, (None,))[0] == owner:
                    del self.locks[lid]
