"""The open streams of the autorecovery simulation (sim/autorecovery.py):
their writers (appends to every bookie of a write set, rolls by size,
trims, their own ensemble changes when a bookie of the open fragment loses
its registration, their lease-bound key kept by ``writer_lease``'s shipped
rules) and the worker's take-over of a stream (term + 1).  Each stream's
LAC is the entry before its last add (the LAC an add carries); a take-over
makes it the last entry written."""
from __future__ import annotations

from metadata.ledgers import Fragment
from sim.autorecovery_model import BOUND, TTL, SimWriter, Violation
from stream.quorum import write_set
from stream.writer_lease import Register, WriterRecord, judge_register


class StreamWriters:
    """Mixed into ``sim.autorecovery.World`` (its bookies, metadata, clock,
    random source, ``top``: each stream's last entry written, ``lac``,
    writers and their keys)."""

    def key_record(self, lid: int) -> WriterRecord | None:
        k = self.wkeys.get(lid)
        return None if k is None else WriterRecord(f"writer-{lid}", "sim", 0, k[0], 0)

    def writer_step(self, w: SimWriter) -> None:
        lid = w.lid
        k = self.wkeys.get(lid)
        if k is not None and k[1] <= self.now:  # its lease expired: etcd deletes the key
            del self.wkeys[lid]
            if k[0] == w.term:
                w.registered_since = None
            self.note(f"writer key of {lid} (term {k[0]}) expired")
        if not w.alive or w.fenced:
            return
        m, _ = self.meta[lid]
        online = self.now >= w.cut_until
        if online:  # its keeper: refresh the key, or create it again while its term is the stream's
            k = self.wkeys.get(lid)
            if k is not None and k[0] == w.term:
                self.wkeys[lid] = (w.term, self.now + TTL)
            elif judge_register(w.term, m.term, self.key_record(lid)) is Register.CREATE:
                self.wkeys[lid] = (w.term, self.now + TTL)
                w.registered_since = self.now
                self.note(f"writer of {lid} registered again (term {w.term})")
        if w.wedged:
            return
        last = m.fragments[-1]
        if any(not self.bookies[b].alive for b in last.ensemble):
            if online and self.rng.random() < w.react:  # its registration watch: it changes its ensemble
                if m.term > w.term:
                    self._fenced(w)
                elif self.change_ensemble(lid):
                    self.writer_changes += 1
                    self.note(f"writer of {lid}: new ensemble {self.meta[lid][0].fragments[-1]}")
            return
        if self.rng.random() < 0.3:  # an append (needs every bookie of its write set here)
            if m.term > w.term:
                self._fenced(w)  # INVALID_TERM: a take-over raised the term
                return
            if online and self.top[lid] >= last.first_entry and self.rng.random() < 0.1:
                self.change_ensemble(lid, roll=True)   # a roll by size: a new ensemble, published first
                m, _ = self.meta[lid]
                last = m.fragments[-1]
            if online and len(m.fragments) > 1 and self.rng.random() < 0.05:
                self.trim(lid)   # the application trims the stream below its open fragment
                m, _ = self.meta[lid]
            eid = self.top[lid] + 1
            slow = self.slow_bookie(lid, eid, m, last) if online else None
            for i in write_set(eid, m.ensemble_size, m.write_quorum):
                if last.ensemble[i] != slow:
                    self.bookies[last.ensemble[i]].write(lid, eid)
            self.lac[lid] = self.top[lid]   # (an add carries the LAC: the entry before it, acknowledged)
            self.top[lid] = eid
            self.acked.add((lid, eid))
            if slow is not None:   # (acknowledged by the others; the slow one replaced from the next id)
                self.bookies[slow].missed.add((lid, eid))
                self.missed_writes += 1
                self.change_ensemble(lid, replace=slow)
                self.note(f"writer of {lid}: entry {eid} never reached {slow}; new ensemble "
                          f"{self.meta[lid][0].fragments[-1]}")

    def _fenced(self, w: SimWriter) -> None:
        """It learnt a later term took over: it stops and drops its key
        (revokes its lease) if the key is still its own."""
        w.fenced = True
        k = self.wkeys.get(w.lid)
        if k is not None and k[0] == w.term:
            del self.wkeys[w.lid]
        w.registered_since = None
        self.note(f"writer of {w.lid} (term {w.term}) fenced: it stops, its key goes")

    def change_ensemble(self, lid: int, roll: bool = False, replace: str | None = None) -> bool:
        """The open fragment's unregistered bookies replaced from the entry
        after the last written (every entry written reached its whole write
        set here, but for a slow bookie's missed write); an empty last
        fragment is replaced in place.  ``roll``: a new ensemble of
        registered bookies, none failed.  ``replace``: that bookie (a write
        to it failed, the others acknowledged)."""
        m, _ = self.meta[lid]
        last = m.fragments[-1]
        if roll:
            if len(self.registered()) < m.ensemble_size:
                return False
            new = self.rng.sample(sorted(self.registered()), m.ensemble_size)
        else:
            gone = [i for i, b in enumerate(last.ensemble) if not self.bookies[b].alive or b == replace]
            cands = [b for b in sorted(self.registered()) if b not in last.ensemble]
            if not gone or len(cands) < len(gone):
                return False
            new = list(last.ensemble)
            for i, b in zip(gone, self.rng.sample(cands, len(gone))):
                new[i] = b
        first = self.top[lid] + 1
        frs = tuple(f for f in m.fragments if f.first_entry != first) + (Fragment(first, tuple(new)),)
        self.meta[lid] = (m.with_(fragments=frs, fragment_count=len(frs), last_fragment_first_entry=first),
                          self._bump())
        return True

    def trim(self, lid: int) -> None:
        """Every fragment below the last removed (``remove_fragments_before``):
        their entries are no longer the stream's, their bookies hold garbage."""
        m, _ = self.meta[lid]
        first = m.fragments[-1].first_entry
        self.meta[lid] = (m.with_(fragments=m.fragments[-1:], fragment_count=1, trimmed_before=first),
                          self._bump())
        self.acked = {(l, e) for l, e in self.acked if l != lid or e >= first}
        self.note(f"stream {lid} trimmed below {first}")

    def _seal(self, w: str, lid: int) -> None:
        """The worker's take-over of a stream: term + 1 (its writer is fenced),
        recovery replacing the lost bookies of the open fragment."""
        m, _ = self.meta[lid]
        wr, k = self.writers.get(lid), self.wkeys.get(lid)
        first = self.first_seen.get(lid, self.now)
        if (wr is not None and wr.alive and not wr.fenced and k is not None and k[0] == wr.term == m.term
                and wr.registered_since is not None and wr.registered_since <= first
                and self.now - first < BOUND):
            raise Violation(f"{w}: stream {lid} taken over under its live writer (term {m.term}, registered "
                            f"since {wr.registered_since}, task first seen at {first}) before the bound")
        self.meta[lid] = (m.with_(term=m.term + 1), self._bump())
        self.lac[lid] = self.top[lid]   # (its recovery: every entry written is the stream's)
        self.seals += 1
        self.change_ensemble(lid)
        self.note(f"{w}: stream {lid} taken over at term {m.term + 1}")
