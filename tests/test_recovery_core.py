"""stream/recovery_core.py (one entry at a time, and with read-ahead: a hypothesis
test checks that the window decides exactly like one entry at a time), and a
small in-memory simulation whose bookies run bookie.core.BookieCore (the seed's
divergence counterexample)."""
from __future__ import annotations

import random

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from bookie import entry as E
from bookie.core import BookieCore, Status
from stream.quorum import write_set
from stream.recovery_core import READ_BLOCK, RecoveryCore, RecoveryState
from stream.writer_core import WriterCore, WriterState

LID = 7
OK, NSE = Status.OK, Status.NO_SUCH_ENTRY


def rec(eid, payload=b"p", **kw):
    return E.encode(LID, eid, payload, **kw)


def core(e=3, qw=3, qa=2, first=0, term=2, ahead=1, **kw):
    """A started core; ``ahead``: max_read_ahead (1: one entry at a time)."""
    r = RecoveryCore(LID, first, [f"b{i}" for i in range(e)], e, qw, qa, term=term, max_read_ahead=ahead, **kw)
    r.start()
    return r


def fence_all(r, lac=-1, lafr=-1, who=None):
    for i in (range(r.E) if who is None else who):
        r.on_lac_response(i, OK, lac, lafr)


def test_fencing_reads_carry_the_term_and_coverage_is_awaited():
    r = core()
    f = r.ready().fencing_reads
    assert [(x.bookie_id, x.term, x.fence) for x in f] == [("b0", 2, False), ("b1", 2, False), ("b2", 2, False)]
    r.on_lac_response(0, OK, 3, 1)
    assert r.state is RecoveryState.FENCING and not r.ready().reads
    r.on_lac_response(1, OK, 4, 2)  # E - Qa + 1 = 2 responders
    reads = r.ready().reads
    assert r.state is RecoveryState.READING and r.frozen_lac == 4
    assert {(x.entry_id, x.bookie_index, x.term) for x in reads} == {(3, 0, 2), (3, 1, 2), (3, 2, 2)}


def test_coverage_out_of_reach_aborts():
    r = core()
    r.on_lac_response(0, None)
    assert r.state is RecoveryState.FENCING
    r.on_lac_response(1, Status.INTERNAL_ERROR)
    assert r.state is RecoveryState.ABORTED


@pytest.mark.parametrize("lafr,first,start", [(3, 10, 10), (12, 10, 13), (-1, 0, 0)])
def test_start_is_max_of_lafr_plus_1_and_fragment_first(lafr, first, start):
    r = core(first=first)
    fence_all(r, lac=lafr, lafr=lafr)
    assert {x.entry_id for x in r.ready().reads} == {start}


@pytest.mark.parametrize("unbounded,lac,lafr,first,start", [
    (True, 7, 3, 0, 4), (False, 7, -1, 0, 8), (False, 7, 3, 10, 10), (False, -1, -1, 0, 0)])
def test_classic_mode_starts_at_lac_plus_1(unbounded, lac, lafr, first, start):
    r = core(first=first, term=0 if not unbounded else 2, fence=not unbounded, unbounded=unbounded)
    fence_all(r, lac=lac, lafr=lafr)
    assert {x.entry_id for x in r.ready().reads} == {start}


def test_one_ok_recovers_and_writes_back_to_the_whole_write_set():
    r = core(e=4, qw=3, qa=2)
    fence_all(r, lac=0, lafr=-1)
    r.ready()
    r.on_read_response(0, 0, NSE)
    r.on_read_response(0, 1, OK, rec(0, b"A", lac=-1))
    out = r.ready()
    assert {(w.entry_id, w.bookie_index) for w in out.writes} == {(0, 0), (0, 1), (0, 2)}
    h = E.parse_header(out.writes[0].record)
    assert (h.is_recovery, h.term, h.lac) == (True, 2, 0)  # the frozen LAC
    assert {x.entry_id for x in out.reads} == {1}  # reads forward, one entry at a time


def test_absent_writes_a_truncate_noop_that_needs_every_bookie():
    r = core(e=5, qw=3, qa=2)
    fence_all(r)
    r.ready()
    r.on_read_response(0, 0, NSE)
    assert r.state is RecoveryState.READING
    r.on_read_response(0, 1, Status.NO_SUCH_LEDGER)  # Qw - Qa + 1 = 2
    out = r.ready()
    assert r.state is RecoveryState.FINISHING
    assert sorted(w.bookie_index for w in out.writes) == [0, 1, 2, 3, 4]
    h = E.parse_header(out.writes[0].record)
    assert h.is_noop and h.is_truncate and h.is_recovery and h.entry_id == 0
    for i in range(4):
        r.on_write_ack(0, i)
    assert r.state is RecoveryState.FINISHING and r.result is None
    r.on_write_ack(0, 4)
    assert r.state is RecoveryState.DONE
    assert (r.result.last_entry, r.result.next_entry, r.result.noop_entry) == (0, 1, 0)


def test_unknown_aborts_never_guesses():
    r = core()
    fence_all(r)
    r.on_read_response(0, 0, NSE)
    r.on_read_response(0, 1, Status.UNKNOWN_ENTRY)
    r.on_read_response(0, 2, None)
    assert r.state is RecoveryState.ABORTED and "unknown" in r.ready().reason


def test_absent_below_frozen_lac_is_data_loss():
    r = core()
    fence_all(r, lac=5, lafr=4)
    r.on_read_response(5, 0, NSE)
    r.on_read_response(5, 1, NSE)
    assert r.state is RecoveryState.ABORTED and "data loss" in r.reason


def test_invalid_term_ends_fenced_out():
    r = core()
    r.on_lac_response(0, Status.INVALID_TERM)
    assert r.state is RecoveryState.FENCED_OUT


def test_recovered_noop_loses_its_truncate_flag():
    r = core()
    fence_all(r)
    r.on_read_response(0, 0, OK, rec(0, b"", data_flags=E.FLAG_NOOP | E.FLAG_TRUNCATE))
    h = E.parse_header(r.ready().writes[0].record)
    assert h.is_noop and not h.is_truncate


def test_failed_write_replaces_the_bookie_published_only_at_the_end():
    r = core(first=0)
    fence_all(r)
    r.on_read_response(0, 0, OK, rec(0))
    r.on_read_response(1, 1, NSE), r.on_read_response(1, 2, NSE)
    r.ready()
    for eid in (0, 1):
        r.on_write_ack(eid, 0), r.on_write_ack(eid, 1)
    r.on_write_failed(0, 2)
    out = r.ready()
    assert [(x.bookie_index, x.bookie_id) for x in out.replacements] == [(2, "b2")]
    r.on_bookie_replaced(2, "b9")
    out = r.ready()
    assert {(w.entry_id, w.bookie_id) for w in out.writes} == {(0, "b9"), (1, "b9")}
    r.on_write_ack(0, 2, bookie_id="b2")  # stale
    r.on_write_ack(0, 2, bookie_id="b9")
    assert r.state is RecoveryState.FINISHING
    r.on_write_ack(1, 2)
    assert r.state is RecoveryState.DONE
    assert r.result.ensemble_change == (0, ("b0", "b1", "b9")) and r.result.recovered == (0,)


def test_classic_mode_fences_and_closes_at_the_last_recovered_entry():
    r = core(term=0, fence=True, unbounded=False)
    assert all(f.fence for f in r.ready().fencing_reads)
    fence_all(r)
    r.on_read_response(0, 0, OK, rec(0))
    r.on_read_response(1, 0, NSE), r.on_read_response(1, 1, NSE)
    for i in range(3):
        r.on_write_ack(0, i)
    assert r.state is RecoveryState.DONE and r.result.last_entry == 0 and r.result.noop_entry is None


# -- simulation -------------------------------------------------------------------

class SimBookie:
    def __init__(self):
        self.core = BookieCore()
        self.records: dict[int, bytes] = {}
        self.up = True

    def add(self, record: bytes, strip_truncate=False) -> Status:
        if strip_truncate:  # the control: a no-op without the truncate flag
            e = E.decode(record)
            h = E.parse_header(record)
            record = E.encode(LID, e.entry_id, e.payload, lac=e.lac, lafr=e.lafr,
                              data_flags=e.data_flags & ~E.FLAG_TRUNCATE, req_flags=h.req_flags, term=h.term)
        h = E.parse_header(record)
        v = self.core.admit_add(h)
        if v.status is Status.OK:
            loc = len(self.records) + 1
            self.records[loc] = record
            self.core.apply_add(h, loc, len(record))
        return v.status

    def read_lac(self, term, fence):
        v = self.core.fence(LID, term, fence)
        info = self.core.lac_info(LID)
        return v.status, info.lac, info.lafr

    def read(self, eid, term, fence):
        v = self.core.fence(LID, term, fence)
        if v.status is not Status.OK:
            return v.status, None
        status, loc = self.core.lookup(LID, eid)
        return status, self.records[loc[0]] if loc else None

    def entries(self):
        st = self.core.ledgers.get(LID)
        return {} if st is None else {e: E.decode(self.records[loc]) for e, loc, _ in st.index.iter_all()}


def deliver_writer(w, bookies, up):
    """Sends the writer's batches to the bookies in ``up``, feeding back acks."""
    for _ in range(100):
        r = w.ready()
        if not r.sends:
            return
        for s in r.sends:
            if s.bookie_index in up:
                for eid, record in zip(s.entry_ids, s.records):
                    w.on_ack(eid, s.bookie_index, bookies[s.bookie_index].add(record))


def run_recovery(bookies, term, read_up, write_up, strip_truncate=False):
    r = RecoveryCore(LID, 0, ["b0", "b1", "b2"], 3, 3, 2, term=term)
    r.start()
    for _ in range(100):
        out = r.ready()
        if r.state not in (RecoveryState.FENCING, RecoveryState.READING, RecoveryState.FINISHING):
            break
        for f in out.fencing_reads:
            if f.bookie_index in read_up:
                r.on_lac_response(f.bookie_index, *bookies[f.bookie_index].read_lac(f.term, f.fence))
            else:
                r.on_lac_response(f.bookie_index, None)
        for x in out.reads:
            if x.bookie_index in read_up:
                r.on_read_response(x.entry_id, x.bookie_index, *bookies[x.bookie_index].read(x.entry_id, x.term, x.fence))
            else:
                r.on_read_response(x.entry_id, x.bookie_index, None)
        for wr in out.writes:
            assert wr.bookie_index in write_up
            r.on_write_ack(wr.entry_id, wr.bookie_index, bookies[wr.bookie_index].add(wr.record, strip_truncate))
    return r


def divergence(bookies):
    seen: dict[int, bytes] = {}
    for b in bookies:
        for eid, e in b.entries().items():
            if seen.setdefault(eid, e.payload) != e.payload:
                return eid
    return None


def counterexample(strip_truncate):
    bookies = [SimBookie() for _ in range(3)]
    c1 = WriterCore(LID, 1, 3, 3, 2, 0, ["b0", "b1", "b2"])
    c1.add(b"A")
    deliver_writer(c1, bookies, up={0, 1, 2})
    c1.add(b"B"), c1.add(b"B2")
    deliver_writer(c1, bookies, up={0})  # entries 1 and 2 reach b0 only
    assert c1.lac == 0
    # c2 takes over with term 2; b0 does not answer its reads but takes writes
    r = run_recovery(bookies, 2, read_up={1, 2}, write_up={0, 1, 2}, strip_truncate=strip_truncate)
    assert r.state is RecoveryState.DONE and r.result.noop_entry == 1 and r.result.recovered == (0,)
    c2 = WriterCore(LID, 2, 3, 3, 2, 0, ["b0", "b1", "b2"], next_entry=r.result.next_entry)
    assert c2.add(b"C") == 2
    deliver_writer(c2, bookies, up={1, 2})  # b0 unreachable now
    assert c2.lac == 2
    # the old writer is fenced by the term
    c1.add(b"late")
    deliver_writer(c1, bookies, up={1, 2})
    assert c1.state is WriterState.FENCED
    return bookies


def test_seed_counterexample_does_not_diverge():
    bookies = counterexample(strip_truncate=False)
    assert divergence(bookies) is None
    assert 2 not in bookies[0].entries()  # truncated by the no-op


def test_without_the_truncate_flag_the_logs_diverge():
    assert divergence(counterexample(strip_truncate=True)) == 2


# -- read-ahead ---------------------------------------------------------------------

def reads_of(out):
    return sorted({x.entry_id for x in out.reads})


def test_read_ahead_issues_a_window_of_reads_at_once():
    r = core(ahead=8)
    fence_all(r, lac=1, lafr=1)
    out = r.ready()
    assert reads_of(out) == list(range(2, 10))
    assert {(x.bookie_index, x.term) for x in out.reads if x.entry_id == 5} == {(0, 2), (1, 2), (2, 2)}


# -- spread reads (Qw = E) ---------------------------------------------------------

def asked(out):
    return sorted((x.entry_id, x.bookie_index) for x in out.reads)


def test_spread_reads_ask_one_bookie_per_held_entry_in_blocks():
    n = READ_BLOCK * 2 + 10
    r = core(ahead=1024)
    for i in range(3):
        r.on_lac_response(i, OK, -1, -1, n - 1)  # bookies hold 0 .. n-1; 0 and 1 answer first (coverage)
    by_entry: dict[int, list[int]] = {}
    for x in r.ready().reads:
        by_entry.setdefault(x.entry_id, []).append(x.bookie_index)
    turn = {0: 0, 1: 1, 2: 0}  # block turns of bookie 2 (no fencing answer) go to the next responder
    assert all(by_entry[e] == [turn[e // READ_BLOCK % 3]] for e in range(n))
    assert sorted(by_entry[n]) == [0, 1, 2]  # held by nobody: its whole write set
    assert r.single_reads == n


def test_striped_ensembles_read_the_whole_write_set():
    r = core(e=4, qw=3, qa=2, ahead=16)
    for i in range(4):
        r.on_lac_response(i, OK, -1, -1, 9)
    assert asked(r.ready()) == sorted((e, i) for e in range(11) for i in write_set(e, 4, 3))
    assert r.single_reads == 0


def test_the_first_reader_is_a_responder_holding_the_entry():
    r = core(ahead=8)
    r.on_lac_response(0, OK, -1, -1, 1)   # bookie 0 holds up to 1
    r.on_lac_response(1, OK, -1, -1, 3)   # covered: bookie 2 never answered
    assert asked(r.ready()) == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 0), (4, 1), (4, 2)]


def test_an_unsettling_answer_or_a_stall_asks_the_rest_of_the_write_set():
    r = core(ahead=8)
    for i in range(3):
        r.on_lac_response(i, OK, -1, -1, 3)
    assert asked(r.ready()) == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (4, 1), (4, 2)]
    r.on_read_response(1, 0, NSE)
    assert asked(r.ready()) == [(1, 1), (1, 2)]
    r.on_read_response(2, 0, None)  # timed out
    assert asked(r.ready()) == [(2, 1), (2, 2)]
    r.on_read_response(0, 0, OK, rec(0))
    assert asked(r.ready()) == []   # an OK settles it: nobody else is asked
    assert r.single_reads == 1      # 3 still waits on bookie 0
    assert r.speculate() == 1 and asked(r.ready()) == [(3, 1), (3, 2)]
    assert r.single_reads == 0 and r.speculate() == 0
    # the rest decide as before: 1 and 2 on the others, 3 and 4 absent (2 answers each)
    for eid in (1, 2):
        r.on_read_response(eid, 1, OK, rec(eid))
    for eid, i in ((3, 1), (3, 2), (4, 1), (4, 2)):
        r.on_read_response(eid, i, NSE)
    assert r.state is RecoveryState.FINISHING and r.end_entry == 3 and r.recovered == [0, 1, 2]


def test_out_of_order_answers_are_decided_in_entry_order():
    r = core(ahead=4)
    fence_all(r)
    r.ready()
    r.on_read_response(2, 1, OK, rec(2, b"C"))
    r.on_read_response(1, 0, OK, rec(1, b"B"))
    assert r.frontier == 0 and r.recovered == [] and not r.ready().writes  # nothing above 0 is decided
    r.on_read_response(0, 2, OK, rec(0, b"A"))
    out = r.ready()
    assert r.recovered == [0, 1, 2] and r.frontier == 3  # the frontier consumed the complete outcomes
    assert [w.entry_id for w in out.writes] == [0] * 3 + [1] * 3 + [2] * 3  # written back in order
    assert reads_of(out) == [4, 5, 6]                  # the window moved with the frontier


def test_unknown_above_the_frontier_does_not_abort_when_the_frontier_turns_absent():
    r = core(ahead=4)
    fence_all(r)
    r.ready()
    for i in range(3):
        r.on_read_response(1, i, Status.UNKNOWN_ENTRY if i else None)  # entry 1: UNKNOWN
    assert r.outcomes[1].outcome.value == "unknown" and r.state is RecoveryState.READING
    r.on_read_response(0, 0, NSE)
    r.on_read_response(0, 1, NSE)                      # the frontier is absent: the end
    assert r.state is RecoveryState.FINISHING and r.end_entry == 0 and not r.outcomes


def test_unknown_counts_once_the_frontier_reaches_it():
    r = core(ahead=4)
    fence_all(r)
    for i in range(3):
        r.on_read_response(1, i, None)
    r.on_read_response(0, 0, OK, rec(0))
    assert r.state is RecoveryState.ABORTED and "entry 1: outcome unknown" in r.reason


def test_absent_above_the_frontier_is_a_known_end():
    r = core(ahead=8)
    fence_all(r)
    r.ready()
    r.on_read_response(5, 1, OK, rec(5))
    r.on_read_response(3, 0, NSE)
    r.on_read_response(3, 2, NSE)                      # 3 is absent: nothing above matters
    assert r.state is RecoveryState.READING and r.known_end == 3 and sorted(r.outcomes) == [0, 1, 2, 3]
    assert r.held_bytes == 0                           # entry 5's record was discarded
    r.on_read_response(5, 0, OK, rec(5))               # late: ignored
    r.on_read_response(6, 0, Status.INVALID_TERM)      # late: ignored too
    assert r.state is RecoveryState.READING
    for eid in (0, 1, 2):
        r.on_read_response(eid, 0, OK, rec(eid))
    assert reads_of(r.ready()) == []                   # never a read above the known end
    assert r.state is RecoveryState.FINISHING and r.end_entry == 3 and r.recovered == [0, 1, 2]


def test_a_lower_known_end_replaces_a_higher_one_and_no_read_goes_above():
    r = core(ahead=8)
    fence_all(r)
    r.ready()
    r.on_read_response(6, 0, NSE), r.on_read_response(6, 1, NSE)
    r.on_read_response(0, 0, OK, rec(0))
    assert reads_of(r.ready()) == []                   # the window ends at 6
    r.on_read_response(2, 0, NSE), r.on_read_response(2, 1, NSE)
    assert r.known_end == 2 and max(r.outcomes) == 2
    r.on_read_response(1, 2, OK, rec(1))
    assert r.state is RecoveryState.FINISHING and r.end_entry == 2


def test_absent_above_the_frontier_at_or_below_the_lac_is_data_loss_only_at_the_frontier():
    r = core(ahead=8)
    fence_all(r, lac=5, lafr=0)
    r.on_read_response(3, 0, NSE), r.on_read_response(3, 1, NSE)
    assert r.state is RecoveryState.READING            # not by itself
    r.on_read_response(1, 0, OK, rec(1))
    r.on_read_response(2, 2, OK, rec(2))
    assert r.state is RecoveryState.ABORTED and "entry 3 <= LAC 5" in r.reason


def test_invalid_term_from_a_read_ahead_ends_fenced_out():
    r = core(ahead=8)
    fence_all(r)
    r.on_read_response(6, 2, Status.INVALID_TERM)
    assert r.state is RecoveryState.FENCED_OUT


def test_late_and_duplicate_answers_are_ignored():
    r = core(ahead=2)
    fence_all(r)
    r.on_read_response(0, 0, OK, rec(0))
    r.on_read_response(0, 1, NSE)                      # decided already
    r.on_read_response(9, 0, OK, rec(9))               # never asked
    r.on_read_response(1, 0, NSE)
    r.on_read_response(1, 0, NSE)                      # a duplicate does not count twice
    assert r.state is RecoveryState.READING and r.outcomes[1].no_such == 1
    assert not r.wants(0, 1) and not r.wants(1, 0) and r.wants(1, 1) and r.wants(2, 0)


def test_the_window_waits_for_write_backs_in_flight():
    r = core(ahead=4, max_inflight_writes=2)
    fence_all(r)
    r.ready()
    for eid in range(4):
        r.on_read_response(eid, 0, OK, rec(eid))
    assert r.recovered == [0, 1] and r.frontier == 2   # two write-backs in flight: the frontier waits
    for i in range(3):
        r.on_write_ack(0, i)
    assert r.recovered == [0, 1, 2]
    assert len(r.outcomes) <= 4


def test_the_window_is_refilled_once_half_of_it_is_answered():
    r = core(ahead=8)
    fence_all(r)
    assert reads_of(r.ready()) == list(range(8))
    for eid in range(4):
        r.on_read_response(eid, 0, OK, rec(eid))
    assert r.frontier == 4 and reads_of(r.ready()) == list(range(8, 12))
    r.on_read_response(4, 0, OK, rec(4))
    assert r.frontier == 5 and reads_of(r.ready()) == []   # 7 outstanding: more than half
    for eid in (5, 6):
        r.on_read_response(eid, 0, OK, rec(eid))
    assert reads_of(r.ready()) == []
    r.on_read_response(7, 0, OK, rec(7))                 # 4 outstanding: half
    assert r.frontier == 8 and reads_of(r.ready()) == list(range(12, 16))


def test_the_window_stops_growing_over_its_byte_budget():
    r = core(ahead=8, max_read_ahead_bytes=200)
    fence_all(r)
    r.ready()
    for eid in range(1, 4):
        r.on_read_response(eid, 0, OK, rec(eid, b"x" * 100))
    assert r.held_bytes > 200
    r.on_read_response(0, 2, NSE)
    r.on_read_response(0, 1, OK, rec(0, b"x" * 100))   # the frontier moves: four write-backs ...
    out = r.ready()
    assert r.frontier == 4 and reads_of(out) == list(range(8, 12))  # ... and the window with it
    for eid in range(5, 8):
        r.on_read_response(eid, 0, OK, rec(eid, b"x" * 100))
    r.on_read_response(4, 0, OK, rec(4, b"x" * 100))
    assert r.frontier == 8 and reads_of(r.ready()) == list(range(12, 16))
    r2 = core(ahead=8, max_read_ahead_bytes=200)
    fence_all(r2)
    r2.ready()
    for eid in range(2, 6):
        r2.on_read_response(eid, 0, OK, rec(eid, b"x" * 300))  # 1200 bytes held above the frontier
    r2.on_read_response(0, 0, OK, rec(0))
    assert r2.frontier == 1 and reads_of(r2.ready()) == []
    r2.on_read_response(1, 0, OK, rec(1))
    assert r2.frontier == 6 and reads_of(r2.ready()) == list(range(8, 14))  # under budget again


def test_the_responders_highest_held_entries_bound_the_first_window():
    r = core(ahead=64)
    r.on_lac_response(0, OK, 4, 3, 6)
    r.on_lac_response(1, Status.NO_SUCH_LEDGER, -1, -1, -1)   # coverage: E - Qa + 1 = 2
    assert reads_of(r.ready()) == [4, 5, 6, 7]                 # up to H + 1 = 7, not 4 + 64
    for eid in (4, 5, 6, 7):
        r.on_read_response(eid, 2, OK, rec(eid))               # a non-responder holds more
    assert r.frontier == 8 and reads_of(r.ready()) == list(range(8, 72))  # past H: the whole window
    r2 = core(ahead=64)
    r2.on_lac_response(0, OK, 4, 3, 6)
    r2.on_lac_response(1, OK, 4, 3)                            # one responder did not say: no bound
    assert reads_of(r2.ready()) == list(range(4, 68))


def test_read_ahead_one_is_the_protocol_as_written():
    r = core(ahead=1)
    fence_all(r)
    assert reads_of(r.ready()) == [0]
    r.on_read_response(1, 0, OK, rec(1))               # not asked: ignored
    r.on_read_response(0, 0, OK, rec(0))
    assert reads_of(r.ready()) == [1] and r.recovered == [0]
    r.on_read_response(1, 0, NSE), r.on_read_response(1, 1, NSE)
    assert r.state is RecoveryState.FINISHING and r.end_entry == 1


# -- windowed vs one at a time: the same result on any bookie contents ---------------------

def drive(r, contents, down, order, batched: bool = False):
    """Runs a core against static bookie contents (index -> {entry: record});
    bookies in ``down`` time out; write-backs are acked at once.  Answers
    for different entries interleave as ``order`` (a random.Random) picks,
    but each entry's answers come in one fixed bookie order (when Qa = Qw, an
    entry on one bookie is recoverable or absent depending on which answer
    comes first, windowed or not; so is an entry whose held answer a rising
    floor made stale, the rest of its write set asked again).  ``batched``:
    a few answers at a time, each run of one bookie's handed over by
    ``on_read_responses``; a read the core issues between two runs (such a
    re-ask) takes its place in its entry's order before the answers still
    to be handed over."""
    r.start()
    queues: dict[int, list] = {}  # entry -> its reads not yet answered, in a fixed bookie order
    place = lambda y: (y.bookie_index * 7 + y.entry_id * 3) % r.E   # noqa: E731

    def take() -> bool:
        """The core's output handled; False once it has ended."""
        out = r.ready()
        for f in out.fencing_reads:
            i = f.bookie_index
            r.on_lac_response(i, *((None,) if i in down else (OK, -1, -1, max(contents[i], default=-1))))
        for x in out.reads:
            q = queues.setdefault(x.entry_id, [])
            q.append(x)
            q.sort(key=place)
        for wr in out.writes:
            r.on_write_ack(wr.entry_id, wr.bookie_index)
        return r.state in (RecoveryState.FENCING, RecoveryState.READING, RecoveryState.FINISHING)

    def answer(x) -> tuple:
        i = x.bookie_index
        return (x.entry_id, *((None, None) if i in down else (OK, contents[i][x.entry_id])
                              if x.entry_id in contents[i] else (NSE, None)))

    for _ in range(100_000):
        if not take():
            return r
        picked = []
        for _ in range(order.randint(1, 6) if batched else 1):
            live = sorted(e for e, q in queues.items() if q)
            if not live:
                break
            picked.append(queues[order.choice(live)].pop(0))
        if not batched:
            for x in picked:
                eid, *rest = answer(x)
                r.on_read_response(eid, x.bookie_index, *rest)
            continue
        while picked:  # runs of one bookie, in the order picked
            i = picked[0].bookie_index
            n = next((k for k, y in enumerate(picked) if y.bookie_index != i), len(picked))
            r.on_read_responses(i, [answer(y) for y in picked[:n]])
            del picked[:n]
            if not take():
                return r
            keep = []
            for y in picked:   # behind a read issued since: back to its entry's queue, in its place
                q = queues.get(y.entry_id)
                if q and place(q[0]) < place(y):
                    q.append(y)
                    q.sort(key=place)
                else:
                    keep.append(y)
            picked = keep
    raise AssertionError("recovery did not end")


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data(), e=st.integers(3, 5), ahead=st.integers(2, 40), inflight=st.sampled_from([1, 3, 1000]))
def test_read_ahead_decides_like_one_at_a_time(data, e, ahead, inflight):
    qw = data.draw(st.integers(2, e))
    qa = data.draw(st.integers(1, qw))
    # which bookies hold which entries (each entry on some subset of its write set), with
    # which origin terms (older terms' leftovers: answers below the floor are stale)
    n = data.draw(st.integers(0, 25))
    contents = {i: {} for i in range(e)}
    for eid in range(n):
        for i in write_set(eid, e, qw):
            if data.draw(st.booleans()):
                o = data.draw(st.sampled_from([1, 1, 0, 2]))
                contents[i][eid] = rec(eid, b"v%d/%d" % (eid, o), term=o)
    down = set(data.draw(st.lists(st.integers(0, e - 1), max_size=1)))
    seed = data.draw(st.integers(0, 2**32))

    batched = data.draw(st.booleans())  # the windowed run takes a range read's answers by frame

    def run(window, batched=False):
        r = RecoveryCore(LID, 0, [f"b{i}" for i in range(e)], e, qw, qa, term=2, max_read_ahead=window,
                         max_inflight_writes=inflight)
        return drive(r, contents, down, random.Random(seed), batched)

    one, many = run(1), run(ahead, batched)
    assert many.state is one.state, (one.reason, many.reason)
    assert many.result == one.result
    if one.state is RecoveryState.ABORTED:
        assert many.reason == one.reason
    assert many.reads_issued >= one.reads_issued


@pytest.mark.parametrize("e,qw,qa", [(3, 3, 2), (5, 3, 2)])
def test_acks_by_frame_reach_what_acks_one_by_one_reach(e, qw, qa):
    """on_write_acks (a bookie's frame of OK answers) = on_write_ack for
    each, with the progress made once: the same result and outputs."""
    def run(by_frame: bool):
        r = core(e=e, qw=qw, qa=qa, ahead=64)
        fence_all(r, lac=2, lafr=-1)
        reads = r.ready().reads
        for rd in reads:  # entries 0..5 on their whole write sets, 6 absent everywhere
            r.on_read_response(rd.entry_id, rd.bookie_index, *((OK, rec(rd.entry_id, lac=2)) if rd.entry_id < 6
                                                                else (NSE,)))
        outs = []
        while r.state not in (RecoveryState.DONE, RecoveryState.ABORTED):
            out = r.ready()
            outs.append(sorted((w.entry_id, w.bookie_index) for w in out.writes))
            by_bookie: dict[int, list[int]] = {}
            for w in out.writes:
                by_bookie.setdefault(w.bookie_index, []).append(w.entry_id)
            for i, ids in sorted(by_bookie.items()):
                if by_frame:
                    r.on_write_acks(ids, i)
                else:
                    for eid in ids:
                        r.on_write_ack(eid, i)
            if not out.writes and not out.reads:
                break
        return r.state, r.result, outs

    assert run(True) == run(False)
    state, result, _ = run(True)
    assert state is RecoveryState.DONE and result.recovered == tuple(range(6)) and result.noop_entry == 6
