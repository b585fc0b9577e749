"""Issue 15: writers' lease-bound registrations -- the pure parts (the
record, whether a writer is live at a term, whether a writer may create its
key again) and the worker's decision with the writer in its plan."""
from __future__ import annotations

import pytest

from metadata.errors import CorruptMetadata
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
from stream.autorecovery.worker_core import Step, judge_task, plan_ledger
from stream.writer_lease import Liveness, Register, WriterRecord, judge_register, judge_writer


def rec(term: int) -> WriterRecord:
    return WriterRecord("w-1", "host", 42, term, 1_700_000_000_000)


def test_record_round_trips_and_a_bad_one_is_corrupt():
    r = rec(3)
    assert WriterRecord.decode(r.encode()) == r
    for bad in (b"", b"{}", b"[1]", b'{"writer_id": "x"}', b"\xff"):
        with pytest.raises(CorruptMetadata):
            WriterRecord.decode(bad)


def test_a_writer_is_live_at_its_term_stale_below_it():
    assert judge_writer(None, 4) is Liveness.NONE
    assert judge_writer(rec(4), 4) is Liveness.LIVE
    assert judge_writer(rec(5), 4) is Liveness.LIVE     # took over after the metadata was read
    assert judge_writer(rec(3), 4) is Liveness.STALE    # a fenced writer's key, until its lease goes


def test_a_writer_creates_its_key_only_while_its_term_is_the_ledgers():
    assert judge_register(4, 4, None) is Register.CREATE
    assert judge_register(4, 4, rec(4)) is Register.CREATE     # its own, from an earlier lease
    assert judge_register(4, 4, rec(3)) is Register.CREATE     # the fenced predecessor's: replaced
    assert judge_register(4, 5, None) is Register.FENCED       # a later take-over
    assert judge_register(4, 5, rec(4)) is Register.FENCED
    assert judge_register(4, 4, rec(5)) is Register.FENCED     # a later writer registered already
    assert judge_register(4, None, None) is Register.GONE      # the stream was deleted


def stream_meta(term: int = 4) -> LedgerMetadata:
    frs = (Fragment(0, ("a", "b", "c")), Fragment(10, ("d", "b", "c")))
    return LedgerMetadata(3, 3, 2, ledger_id=9, state=LedgerState.OPEN, mode=LedgerMode.UNBOUNDED, term=term,
                          fragments=frs, fragment_count=2, last_fragment_first_entry=10)


def test_an_open_fragment_of_a_live_writer_is_left_to_it_past_the_grace_up_to_the_bound():
    p = plan_ledger(stream_meta(), {"d"}, writer=judge_writer(rec(4), 4))
    assert p.open_fragment == 10 and p.writer is Liveness.LIVE
    assert judge_task(p, now=5, first_seen=0, grace=10, writer_bound=600) is Step.WAIT
    assert judge_task(p, now=10, first_seen=0, grace=10, writer_bound=600) is Step.WAIT   # past the grace
    assert judge_task(p, now=599, first_seen=0, grace=10, writer_bound=600) is Step.WAIT
    assert judge_task(p, now=600, first_seen=0, grace=10, writer_bound=600) is Step.SEAL  # the hard bound
    assert judge_task(p, now=10**9, first_seen=0, grace=10) is Step.WAIT                 # no bound given
    # a bound below the grace does not shorten the grace
    assert judge_task(p, now=5, first_seen=0, grace=10, writer_bound=1) is Step.WAIT


@pytest.mark.parametrize("writer", [Liveness.NONE, Liveness.STALE, Liveness.UNKNOWN])
def test_without_a_live_writer_the_open_fragment_is_sealed_after_the_grace(writer):
    p = plan_ledger(stream_meta(), {"d"}, writer=writer)
    assert judge_task(p, now=9.9, first_seen=0, grace=10, writer_bound=600) is Step.WAIT  # not at once
    assert judge_task(p, now=10, first_seen=0, grace=10, writer_bound=600) is Step.SEAL


def test_a_live_writer_does_not_hold_back_its_sealed_fragments_or_a_recovery():
    m = LedgerMetadata(3, 3, 2, ledger_id=9, state=LedgerState.OPEN, mode=LedgerMode.UNBOUNDED, term=4,
                       fragments=(Fragment(0, ("d", "b", "c")), Fragment(10, ("a", "b", "c"))),
                       fragment_count=2, last_fragment_first_entry=10)
    p = plan_ledger(m, {"d"}, writer=Liveness.LIVE)
    assert p.jobs and p.open_fragment is None
    assert judge_task(p, 0, 0, 10, 600) is Step.COPY          # sealed fragments are copied freely
    r = plan_ledger(stream_meta().with_(state=LedgerState.IN_RECOVERY), {"d"}, writer=Liveness.NONE)
    assert judge_task(r, 10**6, 0, 10, 600) is Step.WAIT      # a take-over under way: its own recovery
