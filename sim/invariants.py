"""The spec's safety invariants, checked on the REAL state of a simulated run
(the bookies' cores and durable journals, the metadata store, the writers'
cores, what applications were acknowledged and what readers read).

================== =============================================================
invariant          meaning (tla/BookstreamLedger.tla)
================== =============================================================
NoDivergence       every entry at or below the committed bound (any bookie's
                   LAC, a live writer's LAC, a closed ledger's last entry, any
                   acknowledged entry) is held, with one value only, by the
                   bookies of its write set in the metadata
AckedDurable       every acknowledged entry is on >= Qa bookies of its write
                   set in the metadata, with its acknowledged value
AckedUnique        an entry id is never acknowledged with two values
LafrFullyReplicated entries up to a bookie's LAFR, or up to the LAFR of the
                   writer of the current term, are on every bookie of their
                   write set
ReadersAgree       all readers that read entry n got the same value, and the
                   acknowledged one
AckedReadable      a committed entry never reads as missing on every replica
Monotonic          the metadata term, and each bookie's durable term, LAC and
                   LAFR never go down (a crash may forget an in-memory term
                   raised by an add that never became durable: not a reply)
ClosedCoversAcked  classic: a closed ledger's last entry >= every acknowledged
                   entry
TruncatedAtFinish  unbounded: when a recovery of term t ends (its final CAS),
                   no bookie of the ensemble it wrote its no-op to holds an
                   entry above the no-op written in a term < t (what the
                   truncate flag and the guaranteed write quorum promise:
                   protocol-rules.md, steps 5 and 6)
NoHole             unbounded: when a recovery ends, what survives of each
                   writer term's adds up to its no-op is a prefix of what
                   that writer sent, at the same consecutive positions
                   (issue 12: a recovery must not keep an older term's
                   entries above a newer term's no-op)
================== =============================================================
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from sim.metadata import CLOSED, frag_of
from stream.quorum import write_set

if TYPE_CHECKING:  # pragma: no cover
    from sim.world import World

LID = 7


class InvariantViolation(AssertionError):
    def __init__(self, invariant: str, detail: str):
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


class State:
    def __init__(self, world: "World"):
        self.w = world
        self.dirty = False
        self._mono: dict[str, tuple[int, int, int]] = {}
        self._meta_term = world.meta.term

    # -- notifications -------------------------------------------------------------------

    def bookie_changed(self, b: str) -> None:
        sb = self.w.bookies[b]
        st = sb.core.ledgers.get(LID)
        cur = (sb.durable_term, st.lac if st else -1, st.lafr if st else -1)
        prev = self._mono.get(b, (0, -1, -1))
        for name, p, c in zip(("durable term", "LAC", "LAFR"), prev, cur):
            if c < p:
                raise InvariantViolation("Monotonic", f"bookie {b}: {name} went down from {p} to {c}")
        self._mono[b] = cur
        self.dirty = True

    def acked_changed(self) -> None:
        w = self.w
        for n, v in w.acked.items():
            r = w.read_values.get(n)
            if r is not None and r != v:
                raise InvariantViolation("ReadersAgree", f"entry {n} read as {r}, acknowledged as {v}")
        self.dirty = True

    def read_value(self, n: int, v: tuple, bid: str) -> None:
        w = self.w
        prev = w.read_values.setdefault(n, v)
        if prev != v:
            raise InvariantViolation("ReadersAgree", f"entry {n} read as {v} from {bid}, earlier as {prev}")
        a = w.acked.get(n)
        if a is not None and a != v:
            raise InvariantViolation("ReadersAgree", f"entry {n} read as {v} from {bid}, acknowledged as {a}")

    def read_missing(self, n: int, bound: int, replicas: list[str]) -> None:
        raise InvariantViolation("AckedReadable", f"committed entry {n} (bound {bound}) missing on every "
                                                  f"replica {replicas}")

    def recovery_finished(self, term: int, noop: int, ensemble) -> None:
        from bookie import entry as E

        w = self.w
        for b in ensemble:
            st = w.bookies[b].core.ledgers.get(LID)
            if st is None:
                continue
            for eid, loc, _ in st.index.iter_all():
                if eid > noop:
                    t = E.parse_header(w.bookies[b].record_at(loc)).term
                    if t < term:
                        raise InvariantViolation(
                            "TruncatedAtFinish", f"recovery of term {term} ended with its no-op at {noop}, but "
                                                 f"{b} holds entry {eid} of term {t}")
        self.no_hole(term, noop)

    def no_hole(self, term: int, noop: int) -> None:
        """Entries 0..noop are decided: per origin term, the data entries
        kept must be what its writer sent first, at the same positions."""
        w = self.w
        kept: dict[int, list] = {}
        for n in range(noop + 1):
            values = {x for _, x in self._holders(n, w.meta.frags) if x is not None}
            if len(values) == 1:  # (more than one: NoDivergence's finding)
                v = values.pop()
                if v[0] == "data":
                    kept.setdefault(v[-1], []).append((n, v))
        for t, got in sorted(kept.items()):
            sent = w.sent.get(t, [])
            if got != sent[:len(got)]:
                bad = next(k for k, x in enumerate(got) if k >= len(sent) or x != sent[k])
                want = sent[bad] if bad < len(sent) else None
                raise InvariantViolation(
                    "NoHole", f"recovery of term {term} ended with its no-op at {noop}: term {t}'s entries kept "
                              f"are {[(n, _fmt(v)) for n, v in got]}, not a prefix of what it sent (at "
                              f"{got[bad][0]}: {_fmt(got[bad][1])}, expected "
                              f"{(want[0], _fmt(want[1])) if want else 'nothing'})")

    # -- the checks ----------------------------------------------------------------------------

    def committed_bound(self) -> int:
        w = self.w
        bound = max(w.acked, default=-1)
        for sb in w.bookies.values():
            st = sb.core.ledgers.get(LID)
            if st is not None:
                bound = max(bound, st.lac)
        for c in w.clients.values():
            if c.phase == "open":
                bound = max(bound, c.writer.lac)
        if w.meta.state == CLOSED:
            bound = max(bound, w.meta.last)
        return bound

    def _holders(self, n: int, frags) -> list[tuple[str, tuple | None]]:
        w = self.w
        ens = frag_of(frags, n)[1]
        out = []
        for i in write_set(n, w.sc.E, w.sc.Qw):
            b = ens[i]
            st = w.bookies[b].core.ledgers.get(LID)
            loc = st.index.get(n) if st is not None else None
            out.append((b, w.value_at(b, loc[0]) if loc is not None else None))
        return out

    def check_all(self, final: bool = False) -> None:
        w = self.w
        self.dirty = False
        m = w.meta
        if m.term < self._meta_term:
            raise InvariantViolation("Monotonic", f"metadata term went down from {self._meta_term} to {m.term}")
        self._meta_term = m.term
        for n, v in w.acked.items():
            held = self._holders(n, m.frags)
            good = sum(1 for _, x in held if x == v)
            if good < w.sc.Qa:
                raise InvariantViolation("AckedDurable", f"acknowledged entry {n}={_fmt(v)} on {good} < Qa={w.sc.Qa} "
                                                         f"bookies of its write set: {_fmt_held(held)}")
        bound = self.committed_bound()
        for n in range(bound + 1):
            held = self._holders(n, m.frags)
            values = {x for _, x in held if x is not None}
            if len(values) != 1:
                raise InvariantViolation("NoDivergence", f"entry {n} <= committed bound {bound}: "
                                                         f"{_fmt_held(held)}")
        lafr = -1
        for sb in w.bookies.values():
            st = sb.core.ledgers.get(LID)
            if st is not None:
                lafr = max(lafr, st.lafr)
        for n in range(lafr + 1):
            held = self._holders(n, m.frags)
            if any(x is None for _, x in held):
                raise InvariantViolation("LafrFullyReplicated", f"entry {n} <= a bookie's LAFR {lafr}: "
                                                                f"{_fmt_held(held)}")
        for c in w.clients.values():
            # A writer's own LAFR is a claim about its ensemble while it is
            # the ledger's writer; once a newer term took over, the new
            # term's fragments govern those entries (and a bookie re-joining
            # them is prepared: its older copies go).
            if c.phase == "open" and (not w.unbounded or c.term == m.term):
                for n in range(c.writer.lafr + 1):
                    held = self._holders(n, c.frags)
                    if any(x is None for _, x in held):
                        raise InvariantViolation("LafrFullyReplicated", f"entry {n} <= writer {c.name}'s LAFR "
                                                                        f"{c.writer.lafr}: {_fmt_held(held)}")
        if m.state == CLOSED and w.acked:
            top = max(w.acked)
            if top > m.last:
                raise InvariantViolation("ClosedCoversAcked", f"closed at {m.last}, entry {top} acknowledged")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if v[0] == "noop":
        return f"noop/t{v[-1]}"
    return v[1].decode(errors="replace")


def _fmt_held(held) -> str:
    return ", ".join(f"{b}:{_fmt(x)}" for b, x in held)
