"""The simulator's reader: plain reads of committed entries, as the shipped
read core (``stream.read_core.EntryRead``) decides them; this module only
routes the core's requests and answers through the world."""
from __future__ import annotations

from typing import TYPE_CHECKING

from bookie.core import Status
from sim.metadata import frag_of
from sim.spec import value_of
from stream.read_core import Answer, EntryRead, Verdict, answer_of

if TYPE_CHECKING:  # pragma: no cover
    from sim.world import World


class SimReader:
    """Reads committed entries (at or below a LAC some bookie reported, or an
    acknowledged one) with plain reads, as ``stream.read_core.EntryRead``
    decides (the shipped read core: replica order, the next replica on a
    failure or after ``timeout // 3`` of silence (speculation), "missing"
    only on Qw - Qa + 1 absent answers); records
    what it read.  This class only routes the core's requests and answers."""

    def __init__(self, world: "World", name: str):
        self.w = world
        self.name = name

    def schedule_reads(self, n: int) -> None:
        w = self.w
        for _ in range(n):
            w.at(w.rng.randint(1, w.sc.horizon + 500), self.read_some)

    def read_some(self) -> None:
        w = self.w
        bound = w.committed_bound()
        if bound < 0:
            return
        self.read(w.rng.randint(0, bound), bound)

    def read(self, n: int, bound: int) -> None:

        w = self.w
        ens = frag_of(w.meta.frags, n)[1]
        # The first replica at random, and speculation as the handle's
        # (``speculative_read_timeout``): the next replica once the last one
        # asked stayed silent a third of a request's timeout.
        r = EntryRead(n, w.sc.E, w.sc.Qw, w.sc.Qa, rotation=w.rng.randrange(w.sc.Qw),
                      speculate_after=w.sc.timeout // 3)
        self._send(r, ens, bound, r.start(w.now))

    def _send(self, r, ens, bound: int, indexes: list[int]) -> None:
        w = self.w
        for i in indexes:
            def on_reply(req, reply, i=i):
                status, record, _ = reply
                if status is Status.OK:
                    self._answer(r, ens, bound, i, Answer.OK, value_of(record), req.bid)
                else:
                    self._answer(r, ens, bound, i, answer_of(status), None, req.bid)

            def on_timeout(req, i=i):
                self._answer(r, ens, bound, i, Answer.FAILED, None, req.bid)

            w.request(self.name, 0, ens[i], "read", {"entry": r.entry_id, "term": 0, "fence": False}, {},
                      on_reply, on_timeout, w.sc.timeout)
        d = r.deadline
        if indexes and d is not None:
            w.at(max(0, d - w.now), lambda: self._send(r, ens, bound, r.tick(w.now)))

    def _answer(self, r, ens, bound: int, i: int, answer, value, bid: str) -> None:
        w = self.w
        if r.verdict is not Verdict.PENDING:
            return
        nxt = r.on_answer(i, answer, w.now, value)
        v = r.verdict
        if v is Verdict.FOUND:
            w.count("reads_ok")
            if w.check_invariants:
                w.inv.read_value(r.entry_id, value, bid)
        elif v is Verdict.MISSING:
            w.count("reads_missing")
            if w.check_invariants:
                w.inv.read_missing(r.entry_id, bound, [ens[k] for k in r.order])
        elif v is not Verdict.PENDING:
            w.count("reads_unavailable")
        self._send(r, ens, bound, nxt)


__all__ = ["SimReader"]
