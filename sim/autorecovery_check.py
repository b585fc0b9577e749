"""Lost writes and the auditor's full check in the autorecovery simulation
(sim/autorecovery.py).  A stream's add now and then never reaches one
bookie of its write set (a write that timed out there after the others
acknowledged it), and the writer replaces that bookie from the next id:
the fragment it stays in names it at an id it lacks, which the cheap
ReadLac check cannot see (it holds later ids) and no scrub reports (it has
no record).  The auditor's periodic full check (``run_check(full=True)``)
finds it: the shipped ``replica_check.checked_fragments``, ``tally`` and
``damaged`` judge what each bookie of each sealed fragment holds (a rotted
record counted bad, its id missing), and the task names the bookie
damaged at the ids it lacks, which a worker fills in place.  At the end
every missed write is filled (the final check); mutant ``no-check``
(neither periodic check runs) leaves them.  The cheap check runs too (its own
period: ``run_check``'s ReadLac path, the shipped ``expected_last_entries``,
``judge_check`` and ``missing_tails``): a bookie whose highest id held, a
leftover or rotted record counted, is below what it must hold is named
damaged at the ids above it, or as a whole when it holds nothing."""
from __future__ import annotations

from stream.autorecovery.replica_check import checked_fragments, damaged, missing_ids, tally
from stream.autorecovery.worker_core import expected_last_entries, judge_check, missing_tails
from stream.quorum import write_set

CHECK_STEPS = 40   # the full check's period, in the simulation's steps
CHEAP_STEPS = 25   # the cheap (ReadLac) check's


class FullCheck:
    """Mixed into ``sim.autorecovery.World`` (its bookies, metadata, clock,
    ``STEP``, ``rot_rng``, ``registered``, ``publish``, ``mutant``)."""

    def slow_bookie(self, lid: int, eid: int, m, last) -> str | None:
        """Now and then the bookie of ``eid``'s write set that its add will
        miss (one the writer can replace: a spare is registered)."""
        if not self.faults_on or m.write_quorum < 2 or self.rot_rng.random() >= 0.03:
            return None
        if not set(self.registered()) - set(last.ensemble):
            return None
        return last.ensemble[self.rot_rng.choice(write_set(eid, m.ensemble_size, m.write_quorum))]

    def check_step(self) -> None:
        """Every ``CHECK_STEPS`` steps, every ledger's sealed fragments asked
        of every bookie (a live one answers what it holds of its write
        sets' ids, good or rotted); each ledger with a bookie lacking ids
        is published with it damaged at those ids (``run_check``)."""
        if self.mutant == "no-check" or round(self.now / self.STEP) % CHECK_STEPS:
            return
        registered = self.registered()
        for lid in sorted(self.meta):
            m, _ = self.meta[lid]
            E, Qw = m.ensemble_size, m.write_quorum
            frags = []
            for first, last, ensemble in checked_fragments(m):
                answers, bad = {}, {}
                for i, b in enumerate(ensemble):
                    bk = self.bookies[b]
                    if not bk.alive:
                        continue   # (did not answer: unknown, never missing)
                    ids = [e for e in range(first, last + 1) if i in write_set(e, E, Qw)]
                    answers[i] = {e: ("data", 0) for e in ids if bk.holds(lid, e)}
                    bad[i] = sum(1 for e in ids if (lid, e) in bk.data and (lid, e) in bk.rotted)
                frags.append(tally(first, last, ensemble, Qw, m.ack_quorum, answers, bad))
            found = damaged(frags, registered)
            if found:
                ids = missing_ids(frags, found)
                self.publish(lid, found, damaged=True, ids=ids)
                self.check_found += 1
                self.note(f"full check: ledger {lid}: {sorted(found)} lack {ids}")

    def cheap_check_step(self) -> None:
        """Every ``CHEAP_STEPS`` steps, each live bookie a ledger's sealed
        fragments name asked its highest id held (ReadLac's last entry;
        None: nothing held); a ledger with a bookie below what it must hold
        is published with it damaged at its missing tail."""
        if self.mutant == "no-check" or round(self.now / self.STEP) % CHEAP_STEPS:
            return
        registered = self.registered()
        for lid in sorted(self.meta):
            m, _ = self.meta[lid]
            expected = {b: e for b, e in expected_last_entries(m).items() if b in registered}
            answers = {}
            for b in expected:
                if self.bookies[b].alive:
                    held = [e for l, e in self.bookies[b].data if l == lid]
                    answers[b] = max(held) if held else None
            found = judge_check(expected, answers)
            if found:
                ids = missing_tails(expected, answers)
                self.publish(lid, found, damaged=True, ids=ids)
                self.cheap_found += 1
                self.note(f"cheap check: ledger {lid}: {sorted(found)} hold up to "
                          f"{ {b: answers[b] for b in found} }, need {ids}")
