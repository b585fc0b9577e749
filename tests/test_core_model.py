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


# a record: ledger, step from the previous id (1: consecutive), term,
# recovery add or not, data flags, LAC, LAFR
RECORDS = st.lists(st.tuples(st.integers(0, 1), st.sampled_from([1, 1, 1, 1, 0, 2, -3]), st.integers(0, 2),
                             st.booleans(), st.sampled_from([0, 0, 0, E.FLAG_NOOP, E.FLAG_NOOP | E.FLAG_TRUNCATE]),
                             st.integers(-1, 30), st.integers(-1, 30)), max_size=25)


def _frame(records) -> bytes:
    out, eid = [], 0
    for lid, step, term, recovery, dflags, lac, lafr in records:
        eid = max(0, eid + step)
        out.append(E.encode(lid, eid, b"p" * (eid % 3), lac=lac, lafr=min(lafr, lac), data_flags=dflags,
                            req_flags=E.REQ_RECOVERY if recovery else 0, term=term))
    return b"".join(out)


@settings(max_examples=300, deadline=None)
@hypothesis.given(RECORDS)
def test_scan_runs_is_scan_grouped_into_maximal_runs(records):
    """The bookie's run scan sees the same records as the one-header-per-
    entry scan, grouped into the longest runs of consecutive ids of one
    ledger, term and kind, a truncate no-op alone; LAC/LAFR the run's
    highest."""
    buf = _frame(records)
    hs, runs = E.scan(buf), E.scan_runs(buf)
    assert E.count_entries(runs) == len(hs)
    flat = [(r.ledger_id, r.first_entry + k, r.offsets[k], r.lengths[k], r.index + k)
            for r in runs for k in range(r.count)]
    assert flat == [(h.ledger_id, h.entry_id, h.offset, h.size, i) for i, h in enumerate(hs)]
    for r in runs:
        group = hs[r.index:r.index + r.count]
        assert {(h.ledger_id, h.term, h.req_flags) for h in group} == {(r.ledger_id, r.term, r.req_flags)}
        assert r.lac == max(h.lac for h in group) and r.lafr == max(h.lafr for h in group)
        assert r.data_flags == group[0].data_flags and r.is_recovery == group[0].is_recovery
        assert (r.start, r.end) == (group[0].offset, group[-1].offset + group[-1].size)
        assert not any(h.is_truncate for h in group) or r.count == 1
    for a, b in zip(runs, runs[1:]):  # maximal: no two neighbours could be one run
        assert (a.ledger_id, a.term, a.req_flags) != (b.ledger_id, b.term, b.req_flags) or (
            b.first_entry != a.last_entry + 1) or a.is_truncate or b.is_truncate


@settings(max_examples=300, deadline=None)
@hypothesis.given(RECORDS, st.integers(0, 10_000), st.integers(1, 255))
def test_scan_runs_refuses_what_scan_refuses(records, where, xor):
    """A damaged frame: the run scan fails exactly when, and as, the
    per-entry scan does."""
    buf = bytearray(_frame(records))
    if buf:
        buf[where % len(buf)] ^= xor
    outcome = []
    for scan in (E.scan, E.scan_runs):
        try:
            scan(bytes(buf), 20)
            outcome.append(None)
        except (E.MalformedEntry, E.ChecksumMismatch) as e:
            outcome.append((type(e), str(e)))
    assert outcome[0] == outcome[1]


@settings(max_examples=300, deadline=None)
@hypothesis.given(RECORDS)
def test_apply_run_is_apply_add_entry_by_entry(records):
    """A frame's runs applied at once leave the same terms, LACs, LAFRs and
    indexes, and report the same dead records, as applying its entries one
    by one."""
    from array import array
    buf = _frame(records)
    one, many = BookieCore(), BookieCore()
    base = 1 << 40
    want = []
    for h in E.scan(buf):
        want += one.apply_add(h, base + h.offset, h.size)
    got = []
    for run in E.scan_runs(buf):
        got += many.apply_run(run, array("Q", [base + o for o in run.offsets]))
    assert sorted(got) == sorted(want)
    assert one.ledgers.keys() == many.ledgers.keys()
    for lid, a in one.ledgers.items():
        b = many.ledgers[lid]
        assert (a.term, a.lac, a.lafr) == (b.term, b.lac, b.lafr)
        assert list(a.index.iter_from(0, 100)) == list(b.index.iter_from(0, 100))
