"""The bookie's per-ledger state machine against a plain model (hypothesis).

The model is the rule table of bookie/core.py written the obvious way: dicts
of entries, a term and a fence per ledger.  The core runs with its real index
(runs of arrays); locations stand in for the bytes on disk.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis.strategies as st
import hypothesis
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from bookie import entry as E
from bookie.core import BookieCore, Status

LEDGERS = st.integers(0, 2)
ENTRIES = st.integers(0, 40)
TERMS = st.integers(0, 4)


@dataclass
class ModelLedger:
    term: int = 0
    fenced: bool = False
    lac: int = -1
    entries: dict = field(default_factory=dict)


class BookieModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.core = BookieCore()
        self.model: dict[int, ModelLedger] = {}
        self.read_only = False
        self.next_loc = 1
        self.payload_at: dict[int, bytes] = {}  # location -> payload
        self.max_term: dict[int, int] = {}

    def _header(self, ledger, entry, term, recovery, noop, truncate, lac, payload):
        flags = (E.FLAG_NOOP if noop or truncate else 0) | (E.FLAG_TRUNCATE if truncate else 0)
        rec = E.encode(ledger, entry, payload, lac=lac, data_flags=flags,
                       req_flags=E.REQ_RECOVERY if recovery else 0, term=term)
        return E.parse_header(rec)

    @rule(ledger=LEDGERS, entry=ENTRIES, term=TERMS, recovery=st.booleans(), truncate=st.booleans(),
          lac=st.integers(-1, 40), payload=st.binary(max_size=3))
    def add(self, ledger, entry, term, recovery, truncate, lac, payload):
        h = self._header(ledger, entry, term, recovery, False, truncate, lac, payload)
        v = self.core.admit_add(h)
        m = self.model.get(ledger)
        # the model's rules
        if m is not None and term < m.term:
            expect = Status.INVALID_TERM
        elif not recovery and m is not None and m.fenced:
            expect = Status.FENCED
        elif not recovery and self.read_only:
            expect = Status.READ_ONLY
        else:
            expect = Status.OK
        assert v.status is expect, (v, expect)
        if expect is not Status.OK:
            if m is not None:
                assert v.term == m.term
            return
        m = self.model.setdefault(ledger, ModelLedger())
        m.term = max(m.term, term)
        assert v.term == m.term
        loc = self.next_loc
        self.next_loc += 1
        self.payload_at[loc] = payload
        self.core.apply_add(h, loc, h.size)
        if truncate:
            for e in [e for e in m.entries if e > entry]:
                del m.entries[e]
        m.entries[entry] = payload
        m.lac = max(m.lac, lac)

    @rule(ledger=LEDGERS, term=TERMS, fence=st.booleans())
    def fence(self, ledger, term, fence):
        v = self.core.fence(ledger, term, fence)
        m = self.model.get(ledger)
        if m is not None and term < m.term:
            assert v.status is Status.INVALID_TERM and v.term == m.term
            return
        assert v.status is Status.OK
        before = (m.term, m.fenced) if m else None
        m = self.model.setdefault(ledger, ModelLedger())
        m.term = max(m.term, term)
        m.fenced = m.fenced or fence
        assert v.state_changed == (before != (m.term, m.fenced))

    @rule(ledger=LEDGERS, entry=ENTRIES)
    def read(self, ledger, entry):
        status, loc = self.core.lookup(ledger, entry)
        m = self.model.get(ledger)
        if m is None:
            assert status is Status.NO_SUCH_LEDGER
        elif entry not in m.entries:
            assert status is Status.NO_SUCH_ENTRY
        else:
            assert status is Status.OK and self.payload_at[loc[0]] == m.entries[entry]

    @rule(ledger=LEDGERS, first=ENTRIES, span=st.integers(0, 10))
    def delete_range(self, ledger, first, span):
        self.core.delete(ledger, (first, first + span))
        m = self.model.get(ledger)
        if m is not None:
            for e in [e for e in m.entries if first <= e <= first + span]:
                del m.entries[e]

    @rule(ledger=LEDGERS)
    def delete_ledger(self, ledger):
        self.core.delete(ledger)
        self.model.pop(ledger, None)

    @rule(ro=st.booleans())
    def set_read_only(self, ro):
        self.core.read_only = self.read_only = ro

    @invariant()
    def same_ledgers_and_entries(self):
        assert set(self.core.ledgers) == set(self.model)
        for lid, m in self.model.items():
            s = self.core.ledgers[lid]
            assert (s.term, s.fenced, s.lac) == (m.term, m.fenced, m.lac)
            assert len(s.index) == len(m.entries)
            assert s.last_entry == (max(m.entries) if m.entries else -1)
            got = [(e, self.payload_at[loc]) for e, loc, _ in s.index.iter_all()]
            assert got == sorted(m.entries.items())

    @invariant()
    def terms_never_go_down(self):
        for lid, s in self.core.ledgers.items():
            assert s.term >= self.max_term.get(lid, 0) or lid not in self.max_term
            self.max_term[lid] = s.term
        for lid in list(self.max_term):
            if lid not in self.core.ledgers:  # a deleted ledger starts over
                del self.max_term[lid]


TestBookieCore = BookieModel.TestCase
TestBookieCore.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


@settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 8), st.integers(0, 3),
                                     st.integers(-1, 25), st.integers(-1, 25)), max_size=10))
def test_apply_run_is_apply_add_entry_by_entry(runs):
    """A frame's run of consecutive entries applied at once leaves the same
    term, LAC, LAFR and index as applying them one by one."""
    from array import array
    one, many = BookieCore(), BookieCore()
    loc = 0
    for first, n, term, lac, lafr in runs:
        hs = [E.parse_header(E.encode(5, first + k, b"p", lac=lac, lafr=min(lafr, lac) if lafr >= 0 else -1,
                                      term=term)) for k in range(n)]
        locs = array("Q", range(loc, loc + n))
        lens = array("I", [E.HEADER_SIZE + 1] * n)
        loc += n
        want = []
        for h, lo, ln in zip(hs, locs, lens):
            want += one.apply_add(h, lo, ln)
        assert many.apply_run(hs, locs, lens) == want
        a, b = one.ledgers[5], many.ledgers[5]
        assert (a.term, a.lac, a.lafr) == (b.term, b.lac, b.lafr)
        assert list(a.index.iter_from(0, 100)) == list(b.index.iter_from(0, 100))
