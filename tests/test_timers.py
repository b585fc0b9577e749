"""The cores' timing rules as pure code (stream/timers.py): time is an input."""
from types import SimpleNamespace

import pytest

from stream.timers import RecoveryClock, WriterClock
from stream.writer_core import WriterCore


def writer(E=3, Qw=3, Qa=2, **kw):
    core = WriterCore(1, 1, E, Qw, Qa, 0, [f"b{i}" for i in range(E)], guaranteed_write_quorum=True, **kw)
    return core, WriterClock(core, frame_timeout=10.0, lac_delay=0.5, retry_min=0.1, retry_max=0.4)


def drain(core, clock, now):
    r = core.ready()
    clock.after_ready(r, now)
    return r


def test_a_frame_not_acked_in_time_times_out_in_send_order():
    core, clock = writer()
    clock.frame_sent("f1", 0, "b0", now=0.0)
    clock.frame_sent("f2", 1, "b1", now=1.0)
    clock.frame_done("f1")
    assert clock.next_deadline() == 11.0
    assert clock.tick(10.9).timed_out == []
    assert clock.tick(11.0).timed_out == [("f2", 1, "b1")] and clock.next_deadline() is None


def test_the_explicit_lac_goes_once_adds_are_quiet_and_holds_while_adds_are_in_flight():
    core, clock = writer()
    core.add(b"a")
    drain(core, clock, 0.0)  # sends: nothing to tell yet
    assert clock.next_deadline() is None
    for i in range(3):
        core.on_ack(0, i)
    core.add(b"b")  # entry 1 in flight when the quiet period ends
    r = core.ready()
    assert r.sends
    clock.after_ready(SimpleNamespace(sends=[], lac=r.lac, lafr=r.lafr), 1.0)  # a drain with nothing sent
    assert clock.next_deadline() == 1.5
    assert clock.tick(1.5).tell_lac is None  # entry 1 is in flight: its ack arms it again
    for i in range(3):
        core.on_ack(1, i)
    drain(core, clock, 2.0)
    assert clock.tick(2.4).tell_lac is None and clock.tick(2.5).tell_lac == (1, 1)
    drain(core, clock, 3.0)
    assert clock.next_deadline() is None  # told already: (LAC, LAFR) did not move


def test_the_explicit_lac_compares_the_pair_not_the_lac_alone():
    """LAC told at Qa (LAFR behind); once the last bookie acks, LAFR moves
    with the LAC unchanged: the pair is told again (a take-over reads from
    LAFR + 1)."""
    core, clock = writer()
    core.add(b"a")
    drain(core, clock, 0.0)
    core.on_ack(0, 0)
    core.on_ack(0, 1)
    drain(core, clock, 0.0)
    assert (core.lac, core.lafr) == (0, -1)
    assert clock.tick(0.5).tell_lac is None  # entry 0 not released (below Qw): in flight
    core.on_ack(0, 2)
    drain(core, clock, 1.0)
    assert clock.tick(1.5).tell_lac == (0, 0)


def test_waiting_bookies_are_retried_backing_off_and_an_answer_resets_it():
    core, clock = writer(E=3, Qw=3, Qa=2)
    core.add(b"a")
    drain(core, clock, 0.0)
    core.on_ack(0, 0)
    core.on_ack(0, 1)  # committed at Qa, below Qw: b0 and b1 hold needed acks
    core.on_bookie_failed(0)
    core.on_bookie_failed(1)  # both needed: the change is held (rule 3)
    assert core.awaiting
    drain(core, clock, 0.0)
    assert clock.next_deadline() == 0.1
    t = clock.tick(0.1)
    assert t.retried == ["b0", "b1"] and not core.failed
    r = core.ready()  # (nothing to resend: both hold entry 0)
    core.on_bookie_failed(0)
    core.on_bookie_failed(1)
    clock.after_ready(r, 0.1)
    assert clock.next_deadline() == pytest.approx(0.1 + 0.2)  # doubled
    clock.answered("b0")  # a retried bookie answered: back to the minimum next time
    assert clock.retry_delay == 0.0


def test_recovery_speculates_after_reads_stay_quiet():
    core = SimpleNamespace(single_reads=2, speculate=lambda: 2)
    clock = RecoveryClock(core, 0.1)
    clock.read_activity(0.0)
    clock.after_ready(0.0)
    assert clock.next_deadline() == 0.1
    clock.read_activity(0.05)  # an answer: quiet counted from here
    assert clock.tick(0.1) == 0 and clock.next_deadline() == pytest.approx(0.15)
    assert clock.tick(0.16) == 2 and clock.speculations == 1
    core.single_reads = 0
    clock.after_ready(0.2)
    assert clock.next_deadline() is None


# -- a reader's rate bound (ReadPacer) ---------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from stream.timers import ReadPacer  # noqa: E402


def test_a_pacer_spaces_reads_at_its_rate_after_a_burst():
    p = ReadPacer(1000, burst_seconds=0.1)   # 1,000 bytes/s, 100 bytes of burst
    assert p.take(100, now=0.0) == 0.0         # the burst: no wait
    assert p.take(100, now=0.0) == pytest.approx(0.1)
    assert p.take(500, now=0.1) == pytest.approx(0.5)   # paid for until 0.7: 0.6 on, less the burst
    assert p.take(0, now=10.0) == 0.0           # idle: the burst again, not ten seconds' worth
    assert p.take(300, now=10.0) == pytest.approx(0.2)


@settings(max_examples=300, deadline=None)
@given(st.floats(100, 1e9), st.floats(0, 1), st.lists(st.tuples(st.integers(0, 10**7), st.floats(0, 2)),
                                                         min_size=1, max_size=40))
def test_a_reader_that_waits_as_told_keeps_to_the_rate_in_every_window(rate, burst, steps):
    """Reads of any sizes, each started at least the pacer's wait after the
    one before (and any idle time more): over every window [t_i, t_j], the
    bytes of the reads started at t_i..t_j are at most rate * (t_j - t_i) +
    the burst + the last read's bytes."""
    p = ReadPacer(rate, burst_seconds=burst)
    now, wait, log = 0.0, 0.0, []
    for nbytes, idle in steps:
        now += wait + idle
        log.append((now, nbytes))
        wait = p.take(nbytes, now)
        assert wait >= 0
    for i in range(len(log)):
        total = 0
        for j in range(i, len(log)):
            total += log[j][1]
            assert total <= rate * (log[j][0] - log[i][0]) + rate * burst + log[j][1] + 1e-6 * total + 1e-6
