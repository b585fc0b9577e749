"""Recovery's log matching on origin terms (issue 12 item 0, the recovery
hole): an OK answer whose record's origin term is below the highest origin
decided so far is stale and counts as NO_SUCH_ENTRY.

First as schedules of answers fed to ``RecoveryCore``, then the issue's
schedule end to end over bookies that run ``bookie.core.BookieCore``: writer
A (term 1) has 0..1 acknowledged, its 2..4 reach b2 only; take-over 2 (b2
paused) writes its truncate no-op at 2 to b0, b1 and aborts; take-over 3
reads 2 and then 3, 4 in both answer orders, and once more after a take-over
3 that aborted with its write-back of 2 on one bookie only.  Each schedule
also runs with the ``IGNORE_ORIGIN_TERM`` mutant (the rule before the fix),
which must show the hole.
"""
from __future__ import annotations

import pytest

from bookie import entry as E
from stream import mutations
from stream.recovery_core import RecoveryCore, RecoveryState
from stream.writer_core import WriterCore
from tests.test_recovery_core import LID, NSE, OK, SimBookie, core, deliver_writer, fence_all

IGNORE = mutations.Mutations.of(mutations.IGNORE_ORIGIN_TERM)

NOOP, TRUNC = E.FLAG_NOOP, E.FLAG_NOOP | E.FLAG_TRUNCATE
LIVE = (RecoveryState.FENCING, RecoveryState.READING, RecoveryState.FINISHING)


def rec(eid, payload=b"p", *, origin, term=None, flags=0):
    return E.encode(LID, eid, payload, data_flags=flags, term=origin if term is None else term, origin=origin)


# -- schedules of answers ----------------------------------------------------------------

def test_the_record_carries_its_origin_term_and_a_write_back_copies_it():
    r = core(term=5)
    fence_all(r, lac=-1, lafr=-1)
    r.on_read_response(0, 0, OK, rec(0, b"x", origin=2, term=4))
    w = r.ready().writes[0]
    h = E.parse_header(w.record)
    assert (h.term, h.origin, h.is_recovery, E.decode(w.record).payload) == (5, 2, True, b"x")
    assert r.floor == 2
    r.on_read_response(1, 0, NSE)
    r.on_read_response(1, 1, NSE)
    noop = [x for x in r.ready().writes if x.entry_id == 1][0]
    h = E.parse_header(noop.record)
    assert (h.is_truncate, h.term, h.origin) == (True, 5, 5)  # the recovery's own entry: its term


def test_an_ok_below_the_floor_counts_as_no_such_entry():
    """T'' reads the aborted T' no-op at 2 first, then b2's leftover of A
    at 3 first: stale, so two NO_SUCH_ENTRY make 3 absent."""
    r = core(term=3)
    fence_all(r, lac=1, lafr=1)
    r.on_read_response(2, 0, OK, rec(2, b"", origin=2, flags=TRUNC))
    assert r.recovered == [2] and r.floor == 2
    r.on_read_response(3, 2, OK, rec(3, b"late3", origin=1))
    assert r.state is RecoveryState.READING and r.stale_answers == 1
    r.on_read_response(3, 0, NSE)
    assert r.state is RecoveryState.FINISHING and r.end_entry == 3 and r.recovered == [2]


def test_without_the_rule_the_leftover_is_recovered_above_the_noop():
    r = core(term=3, mutations=IGNORE)
    fence_all(r, lac=1, lafr=1)
    r.on_read_response(2, 0, OK, rec(2, b"", origin=2, flags=TRUNC))
    r.on_read_response(3, 2, OK, rec(3, b"late3", origin=1))
    assert r.recovered == [2, 3] and r.stale_answers == 0  # the hole


def test_a_leftover_read_first_at_the_noop_id_recovers_the_older_writer_instead():
    """The other answer order at 2: A's own entry 2 (origin 1) first; its
    3 and 4 follow it, the T' no-op is overwritten: a prefix of A again."""
    r = core(term=3)
    fence_all(r, lac=1, lafr=1)
    r.on_read_response(2, 2, OK, rec(2, b"late2", origin=1))
    r.on_read_response(3, 2, OK, rec(3, b"late3", origin=1))
    r.on_read_response(4, 2, OK, rec(4, b"late4", origin=1))
    r.on_read_response(5, 0, NSE)
    r.on_read_response(5, 1, NSE)
    assert r.recovered == [2, 3, 4] and r.end_entry == 5 and r.floor == 1 and r.stale_answers == 0


def test_read_ahead_judges_held_answers_again_when_the_floor_rises():
    """Answers above the frontier arrive first and are held as RECOVERABLE;
    the decision at 2 raises the floor: they are demoted, the rest of their
    write sets asked, and 3 ends the recovery."""
    r = core(term=3, ahead=8)
    fence_all(r, lac=1, lafr=1)
    r.ready()
    r.on_read_response(3, 2, OK, rec(3, b"late3", origin=1))
    r.on_read_response(4, 2, OK, rec(4, b"late4", origin=1))
    r.on_read_response(3, 0, NSE)  # dropped: 3 was RECOVERABLE already
    assert r.recovered == [] and not r.wants(3, 1)
    r.ready()
    r.on_read_response(2, 0, OK, rec(2, b"", origin=2, flags=TRUNC))
    assert r.recovered == [2] and r.stale_answers == 2
    asked = {(x.entry_id, x.bookie_index) for x in r.ready().reads}
    assert {(3, 0), (3, 1), (4, 0), (4, 1)} <= asked and r.wants(3, 0) and not r.wants(3, 2)
    r.on_read_response(3, 1, NSE)  # with the stale OK of b2: Qw - Qa + 1 = 2 NO_SUCH_ENTRY
    assert r.state is RecoveryState.FINISHING and r.end_entry == 3 and r.recovered == [2]


def test_a_demoted_answer_can_complete_an_absent_outcome_above_the_frontier():
    """Held OK at 4 with one NO_SUCH_ENTRY already: once stale it makes 4
    ABSENT at once, a known end (no read above 4 is issued any more)."""
    r = core(term=3, ahead=8)
    fence_all(r, lac=1, lafr=1)
    r.ready()
    r.on_read_response(4, 0, NSE)
    r.on_read_response(4, 2, OK, rec(4, b"late4", origin=1))
    r.on_read_response(2, 0, OK, rec(2, b"", origin=2, flags=TRUNC))
    assert r.known_end == 4 and max(r.outcomes) == 4
    r.on_read_response(3, 0, OK, rec(3, b"", origin=2))
    assert r.state is RecoveryState.FINISHING and r.end_entry == 4 and r.recovered == [2, 3]


def test_classic_ledgers_have_origin_zero_and_nothing_is_stale():
    r = core(term=0, fence=True, unbounded=False)
    fence_all(r, lac=-1)
    for eid in range(3):
        r.on_read_response(eid, 0, OK, rec(eid, b"c", origin=0))
    r.on_read_response(3, 0, NSE)
    r.on_read_response(3, 1, NSE)
    assert r.recovered == [0, 1, 2] and r.floor == 0


# -- the issue's schedule over BookieCore bookies ----------------------------------------------

def recover(bookies, term, *, up=(0, 1, 2), write_up=None, first=None, ahead=1, deliver=None,
            mutations=mutations.NONE):
    """Runs a take-over's recovery over ``bookies``.  Reads of bookies not
    in ``up`` time out; each entry's reads are answered one at a time, the
    bookie ``first[entry]`` first (if asked), then in index order, lower
    entries first.  Writes to bookies not in ``write_up`` (default ``up``)
    are never answered (a paused bookie), nor those ``deliver`` (a
    predicate on a RecoveryWrite) refuses.  When nothing else can happen, the adapter gives up ("no bookie
    to replace it with"), as on a cluster of exactly E bookies."""
    write_up = set(up if write_up is None else write_up)
    first = first or {}
    r = RecoveryCore(LID, 0, ["b0", "b1", "b2"], 3, 3, 2, term=term, max_read_ahead=ahead, mutations=mutations)
    r.start()
    reads = []
    while r.state in LIVE:
        out = r.ready()
        for f in out.fencing_reads:
            i = f.bookie_index
            r.on_lac_response(i, *(bookies[i].read_lac(f.term, f.fence) if i in up else (None,)))
        reads += out.reads
        for w in out.writes:
            if w.bookie_index in write_up and (deliver is None or deliver(w)):
                r.on_write_ack(w.entry_id, w.bookie_index, bookies[w.bookie_index].add(w.record))
        if out.fencing_reads or out.writes or r.state not in LIVE:
            continue
        if not reads:
            r.abort("no bookie to replace the one that does not answer")
            break
        reads.sort(key=lambda x: (x.entry_id, x.bookie_index != first.get(x.entry_id), x.bookie_index))
        x = reads.pop(0)
        i = x.bookie_index
        r.on_read_response(x.entry_id, i, *(bookies[i].read(x.entry_id, x.term, x.fence) if i in up else (None,)))
    return r


A = [b"a0", b"a1", b"late2", b"late3", b"late4"]


def issue_schedule():
    """Writer A (term 1): 0..1 acknowledged, 2..4 on b2 only.  Take-over 2
    with b2 paused: its truncate no-op at 2 reaches b0 and b1; no spare
    bookie: it aborts."""
    b = [SimBookie() for _ in range(3)]
    a = WriterCore(LID, 1, 3, 3, 2, 0, ["b0", "b1", "b2"])
    for p in A[:2]:
        a.add(p)
    deliver_writer(a, b, up={0, 1, 2})
    for p in A[2:]:
        a.add(p)
    deliver_writer(a, b, up={2})
    assert a.lac == 1
    r = recover(b, 2, up={0, 1})
    assert r.state is RecoveryState.ABORTED and r.end_entry == 2
    for i in (0, 1):
        e = b[i].entries()[2]
        assert e.is_noop and e.origin == 2
    assert {e: x.payload for e, x in b[2].entries().items()} == dict(enumerate(A))
    return b


def stream_of(bookies, result):
    """What a reader gets from 0 to the recovery's no-op (one value per id,
    checked the same on every bookie holding it)."""
    out = []
    for eid in range(result.noop_entry + 1):
        vals = {("noop",) if e.is_noop else e.payload for bk in bookies for i, e in bk.entries().items() if i == eid}
        assert len(vals) == 1, (eid, vals)
        out.append(vals.pop())
    return out


def assert_no_hole(stream):
    """What survives of A is a prefix of what it sent, at consecutive ids."""
    mine = [(i, v) for i, v in enumerate(stream) if v in A]
    assert mine == list(enumerate(A[:len(mine)])), stream


# (first answers at 2 and 3, read-ahead) -> the stream T'' leaves
ORDERS = {
    "noop_first": ({2: 0, 3: 2, 4: 2}, [b"a0", b"a1", ("noop",), ("noop",)]),
    "leftover_first": ({2: 2, 3: 2, 4: 2}, A + [("noop",)]),
}


@pytest.mark.parametrize("ahead", [1, 8])
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_issue_schedule_leaves_no_hole(order, ahead):
    first, want = ORDERS[order]
    b = issue_schedule()
    r = recover(b, 3, first=first, ahead=ahead)
    assert r.state is RecoveryState.DONE, r.reason
    s = stream_of(b, r.result)
    assert s == want
    assert_no_hole(s)


def test_issue_schedule_with_the_mutant_shows_the_hole():
    b = issue_schedule()
    r = recover(b, 3, first=ORDERS["noop_first"][0], mutations=IGNORE)
    assert r.state is RecoveryState.DONE
    s = stream_of(b, r.result)
    assert s == [b"a0", b"a1", ("noop",), b"late3", b"late4", ("noop",)]  # the issue's stream
    with pytest.raises(AssertionError):
        assert_no_hole(s)


@pytest.mark.parametrize("mutant", [False, True])
@pytest.mark.parametrize("order,written_to", [("noop_first", 2), ("leftover_first", 0)])
def test_a_take_over_that_aborted_after_a_partial_write_back(order, written_to, mutant):
    """The sibling: T'' decides 2 and writes it back to one bookie only
    (b2: the T' no-op, now without its truncate flag, under A's 3 and 4;
    or b0: A's entry 2 over the no-op), then aborts.  T''' reads 2 from
    that bookie first and 3 from b2 first."""
    b = issue_schedule()
    first = ORDERS[order][0]
    r = recover(b, 3, first=first, deliver=lambda w: w.entry_id < 2 or (w.entry_id, w.bookie_index) == (2, written_to))
    assert r.state is RecoveryState.ABORTED and 2 in r.recovered
    e = b[written_to].entries()[2]
    assert e.origin == (2 if order == "noop_first" else 1) and not E.parse_header(
        b[written_to].records[b[written_to].core.lookup(LID, 2)[1][0]]).is_truncate
    r = recover(b, 4, first={2: written_to, 3: 2, 4: 2}, mutations=IGNORE if mutant else mutations.NONE)
    assert r.state is RecoveryState.DONE
    s = stream_of(b, r.result)
    if mutant and order == "noop_first":
        with pytest.raises(AssertionError):
            assert_no_hole(s)
    else:
        assert_no_hole(s)


def test_a_record_of_a_newer_term_means_a_newer_term_took_over():
    """(A bookie holding it must have refused this read with INVALID_TERM;
    the core does not take it for data of its own term.)"""
    r = core(term=3)
    fence_all(r, lac=-1, lafr=-1)
    r.on_read_response(0, 0, OK, rec(0, b"x", origin=4))
    assert r.state is RecoveryState.FENCED_OUT and "term 4" in r.reason and r.recovered == []
