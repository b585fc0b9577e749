"""Rot in the autorecovery simulation (sim/autorecovery.py): records that
rot on a running bookie (a run of one to three ids it holds, half the time
among a stream's newest entries, so above its LAC), each bookie's scrub
reporting the ids it finds rotted (``bookie.scrub.damaged_publisher``: the
ledger's task names the bookie damaged at those ids, through the shipped
``Task.reported``), and the invariant the worker's fill in place answers
to: *a task deleted as done leaves none of the ids it named rotted on its
bookie* where a fragment still names the bookie at a position holding the
id (an id that rotted again since the task was read excepted).  A rotted
record is no replica: a copy (and a fill) reads each id from a replica
whose record is good, as the copier's CRC check does (mutant
``copy-rotted``: it forwards a bad record)."""
from __future__ import annotations

from sim.autorecovery_model import Violation
from stream.autorecovery.keys import merge_ranges
from stream.quorum import write_set


SCRUB_STEPS = 20   # a scrub pass's length, in the simulation's steps


class Rot:
    """Mixed into ``sim.autorecovery.World`` (its bookies, metadata, tasks,
    clock and ``STEP``, ``rot_rng``: rot's own random source, ``scrub_phase``,
    ``publish``)."""

    def rot(self) -> None:
        """Bits flipped in a live bookie's records: a run of one to three
        consecutive ids of one ledger, half the time at a stream's newest."""
        rng = self.rot_rng
        live = [b for b in sorted(self.bookies.values(), key=lambda b: b.id)
                if b.alive and any(k not in b.rotted for k in b.data)]
        if not live:
            return
        b = rng.choice(live)
        held = sorted(k for k in b.data if k not in b.rotted)
        newest = [k for k in held if k[0] in self.top and k[1] >= self.top[k[0]] - 3]
        lid, eid = rng.choice(newest if newest and rng.random() < 0.5 else held)
        run = [e for e in range(eid, eid + rng.randint(1, 3)) if (lid, e) in b.data and (lid, e) not in b.rotted]
        for e in run:
            b.rotted[(lid, e)] = self.now
        self.rots += len(run)
        self.note(f"{b.id}: ledger {lid} entries {run} rotted")

    def scrub_step(self) -> None:
        """A live bookie's scrub pass ends every ``SCRUB_STEPS`` steps (each
        bookie at its own phase): each ledger's ids it holds rotted are
        reported, the task naming it damaged at them."""
        step = round(self.now / self.STEP)
        for b in sorted(self.bookies.values(), key=lambda b: b.id):
            if not b.alive or (step + self.scrub_phase[b.id]) % SCRUB_STEPS:
                continue
            found: dict[int, list] = {}
            for lid, e in b.rotted:
                if (lid, e) in b.data and lid in self.meta:
                    found.setdefault(lid, []).append((e, e))
            for lid, ids in sorted(found.items()):
                self.publish(lid, {b.id}, damaged=True, ids={b.id: merge_ranges(ids)})
                self.note(f"{b.id}'s scrub: ledger {lid} rotted at {merge_ranges(ids)}")

    def check_filled(self, task, since: float, done: dict | None = None) -> None:
        """At ``task``'s deletion as done, or as a call's fills are taken
        off it (``done``: bookie -> the ranges filled; None: every range it
        names), read at ``since``: none of those ids of a damaged bookie is
        rotted there since before, nor a write it missed, where a fragment
        names the bookie at a position holding the id."""
        lid = task.ledger_id
        m, _ = self.meta[lid]
        top = self.top.get(lid, m.last_entry)
        for b, ranges in (task.damaged_ids if done is None else done).items():
            if b not in task.damaged:
                continue
            bk = self.bookies[b]
            bad = [(e, "rotted") for (l, e), at in bk.rotted.items() if l == lid and at <= since]
            bad += [(e, "missed") for l, e in bk.missed if l == lid]
            for e, why in sorted(bad):
                if not m.trimmed_before <= e <= top or not any(a <= e <= z for a, z in ranges):
                    continue
                f = m.fragment_at(e)
                if any(f.ensemble[i] == b for i in write_set(e, m.ensemble_size, m.write_quorum)):
                    raise Violation(f"task {lid} {'deleted as done' if done is None else 'mended'} with {b}'s "
                                    f"entry {e} still {why} (named damaged at {list(ranges)})")
