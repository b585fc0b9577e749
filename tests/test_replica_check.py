"""The full replica check (stream/autorecovery/replica_check.py): the pure
judgement, then ``bookstream ledgers check`` / ``streams check`` run as a
user runs them, on real bookies made to lack, lose and disagree."""
from __future__ import annotations

import json
import uuid

import pytest

from bookie import entry as E
from bookie.core import Status
from stream.autorecovery.replica_check import check_ledger, checked_fragments, tally
from stream.client import BookKeeperClient
from stream.stream import StreamConfig
from tests.conftest import run
from tests.test_recovery_cli import cli, closed_ledger, written_stream

ENS = ("a", "b", "c")


def every(first: int, last: int, held=("data", 7)) -> dict:
    return {e: held for e in range(first, last + 1)}


def test_a_full_fragment_is_clean():
    f = tally(0, 9, ENS, 3, 2, {i: every(0, 9) for i in range(3)})
    assert f.clean and not f.missing and not f.lost and not f.below_ack_quorum


def test_what_one_two_and_three_bookies_lack():
    one = tally(0, 9, ENS, 3, 2, {0: every(0, 9), 1: every(0, 9), 2: every(0, 3) | every(6, 9)})
    assert one.missing == {"c": [[4, 5]]} and one.under_replicated == [[4, 5]]
    assert not one.below_ack_quorum and not one.lost and not one.clean
    two = tally(0, 9, ENS, 3, 2, {0: every(0, 9), 1: every(0, 4) | every(6, 9), 2: every(0, 3) | every(6, 9)})
    assert two.below_ack_quorum == [[5, 5]] and two.under_replicated == [[4, 5]] and not two.lost
    three = tally(0, 9, ENS, 3, 2, {0: every(0, 8), 1: every(0, 8), 2: every(0, 8)})
    assert three.lost == [[9, 9]] == three.below_ack_quorum


def test_an_unanswered_bookie_is_unknown_not_missing():
    f = tally(0, 9, ENS, 3, 2, {0: every(0, 9), 1: None, 2: every(0, 9)})
    assert f.unanswered == ["b"] and not f.missing and not f.under_replicated and not f.clean
    # an id only the unanswered bookie could hold: not lost, but below Qa whatever it holds
    g = tally(0, 9, ENS, 3, 2, {0: every(0, 8), 1: None, 2: every(0, 8)})
    assert not g.lost and g.below_ack_quorum == [[9, 9]] and g.under_replicated == [[9, 9]]


def test_striped_write_sets_are_judged_per_id():
    # E4 Qw2: id e lives on positions e % 4 and (e + 1) % 4
    ens = ("a", "b", "c", "d")
    share = {i: {e: ("data", e) for e in range(0, 16) if i in (e % 4, (e + 1) % 4)} for i in range(4)}
    assert tally(0, 15, ens, 2, 2, share).clean
    share[2].pop(5)   # (5 lives on b and c)
    f = tally(0, 15, ens, 2, 2, share)
    assert f.missing == {"c": [[5, 5]]} and f.below_ack_quorum == [[5, 5]] and not f.lost


def test_divergent_replicas_and_noops():
    a = every(0, 3)
    b = every(0, 3) | {2: ("data", 8)}
    f = tally(0, 3, ENS, 3, 2, {0: a, 1: b, 2: a})
    assert f.divergent == [2] and not f.under_replicated
    # a truncate no-op re-signed as a plain one by a copy is the same entry: both ("noop", origin)
    n = every(0, 3) | {3: ("noop", 4)}
    assert not tally(0, 3, ENS, 3, 2, {0: n, 1: n, 2: n}).divergent


def test_only_sealed_fragments_from_the_trim_point_are_checked():
    from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState
    frags = (Fragment(0, ENS), Fragment(10, ENS), Fragment(20, ENS))
    m = LedgerMetadata(3, 3, 2, ledger_id=1, mode=LedgerMode.UNBOUNDED, trimmed_before=5, fragments=frags,
                       fragment_count=3)
    assert checked_fragments(m) == [(5, 9, ENS), (10, 19, ENS)]
    assert checked_fragments(m, lac=23) == [(5, 9, ENS), (10, 19, ENS), (20, 23, ENS)]
    assert checked_fragments(m, lac=19) == [(5, 9, ENS), (10, 19, ENS)]   # (the open one holds none yet)
    closed = m.with_(state=LedgerState.CLOSED, last_entry=24, trimmed_before=12)
    assert checked_fragments(closed) == [(12, 19, ENS), (20, 24, ENS)]


def _check(env, *args):
    p = cli(env, *args, "--format", "json", check=False)
    assert p.returncode in (0, 5), (p.returncode, p.stdout, p.stderr)
    return p.returncode, json.loads(p.stdout)


def test_ledgers_check_finds_what_real_bookies_lack_lose_and_hold_differently(own):
    procs = own.start(3)
    lid, ens = closed_ledger(own, [b"p%d" % i for i in range(50)])
    code, out = _check(own, "ledgers", "check", str(lid))
    assert code == 0 and out["entries_checked"] == 50 and out["under_replicated"] == 0, out

    async def hurt():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        for b, rng in ((ens[0], (10, 19)), (ens[1], (15, 24)), (ens[2], (18, 18))):
            r = await (await bk.bookie(b)).delete(lid, rng)
            assert r.status == Status.OK, r
        # ens[0] gets a different entry 30: deleted, then written again with another payload
        bc = await bk.bookie(ens[0])
        assert (await bc.delete(lid, (30, 30))).status == Status.OK
        rec = E.encode(lid, 30, b"not what was written", lac=29, req_flags=E.REQ_RECOVERY)
        ack = await bc.add_records([rec])
        assert ack.status == Status.OK, ack
        await bk.close()

    run(hurt())
    code, out = _check(own, "ledgers", "check", str(lid))
    assert code == 5, out
    (frag,) = out["fragments"]
    assert frag["missing"] == {ens[0]: [[10, 19]], ens[1]: [[15, 24]], ens[2]: [[18, 18]]}, frag
    assert frag["under_replicated"] == [[10, 24]] and frag["below_ack_quorum"] == [[15, 19]]
    assert frag["lost"] == [[18, 18]] and frag["divergent"] == [30]
    assert out["under_replicated"] == 15 and out["below_ack_quorum"] == 5 and out["lost"] == 1

    async def in_chunks():   # (ids judged 7 at a time: the ranges above cross the chunks' edges)
        bk = BookKeeperClient(own.endpoint, own.cluster)
        meta, _ = await bk.meta_call(bk.ledgers.read, lid)
        whole, chunked = await check_ledger(bk, meta), await check_ledger(bk, meta, chunk=7)
        await bk.close()
        return [f.as_json() for f in whole], [f.as_json() for f in chunked]

    whole, chunked = run(in_chunks())
    assert chunked == whole and whole[0]["missing"] == frag["missing"]

    next(p for p in procs if p.bookie_id == ens[2]).kill()
    code, out = _check(own, "ledgers", "check", str(lid), "--read-timeout", "3")
    assert code == 5 and out["unanswered"] == [ens[2]], out
    assert out["fragments"][0]["lost"] == [] and out["fragments"][0]["below_ack_quorum"] == [[15, 19]]


def test_a_record_rotted_on_one_bookie_is_counted_and_names_it_damaged(own):
    """One byte of a stored record flipped under a running bookie: the
    check counts the bad record on that bookie, the id missing there (its
    other answers stand), and the periodic full check's verdict names the
    bookie damaged.  (Before, the bookie stopped its answer at the record,
    CHECKSUM_MISMATCH, and was counted as not answering: no verdict.)"""
    from stream.autorecovery.replica_check import damaged
    from tests.test_ledger_replicas import overwrite

    procs = own.start(3)
    lid, ens = closed_ledger(own, [b"rot-check-%03d" % i for i in range(50)], ack_quorum=3)
    victim = next(p for p in procs if p.bookie_id == ens[1])
    overwrite(victim, b"rot-check-020", b"rot-check-02X")   # (its page cache sees it at once)
    code, out = _check(own, "ledgers", "check", str(lid))
    assert code == 5 and out["unanswered"] == [], out
    (frag,) = out["fragments"]
    assert frag["bad_records"] == {ens[1]: 1} and frag["missing"] == {ens[1]: [[20, 20]]}, frag
    assert frag["under_replicated"] == [[20, 20]] and frag["below_ack_quorum"] == [[20, 20]]   # (Qa 3: two intact)

    async def verdict():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        meta, _ = await bk.meta_call(bk.ledgers.read, lid)
        frags = await check_ledger(bk, meta)
        await bk.close()
        return damaged(frags, {p.bookie_id for p in procs})

    assert run(verdict()) == {ens[1]}


def test_streams_check_of_a_striped_stream(own):
    own.start(4)
    name = f"s-{uuid.uuid4().hex[:8]}"
    lid = written_stream(own, name, StreamConfig(4, 2, 2, fragment_size_entries=40), [b"e%d" % i for i in range(130)])
    code, out = _check(own, "streams", "check", name)
    assert code == 0 and out["ledger_id"] == lid and out["fragments_checked"] >= 3, out
    assert out["entries_checked"] >= 120 and not out["unanswered"], out
    frag = out["fragments"][1]
    victim, lo = frag["ensemble"][1], frag["first_entry"]

    async def hurt():   # (a striped bookie's range delete drops only the ids it holds)
        bk = BookKeeperClient(own.endpoint, own.cluster)
        assert (await (await bk.bookie(victim)).delete(lid, (lo, lo + 7))).status == Status.OK
        await bk.close()

    run(hurt())
    code, out = _check(own, "streams", "check", name)
    f = out["fragments"][1]
    held = [e for e in range(lo, lo + 8) if 1 in ((e % 4), (e + 1) % 4)]   # position 1's ids there
    spans = [[e, e] for e in held if e - 1 not in held]
    for sp in spans:
        while sp[1] + 1 in held:
            sp[1] += 1
    assert len(held) == 4 and code == 5 and f["missing"] == {victim: spans}, f
    assert f["below_ack_quorum"] == f["under_replicated"] == spans and not f["lost"]


def test_sampled_ranges_take_the_ends_and_a_share_of_the_windows():
    import random

    from stream.autorecovery.replica_check import sampled_ranges

    assert sampled_ranges(5, 9000, 100, random.Random(1)) == [(5, 9000)]
    assert sampled_ranges(5, 9000, 0, random.Random(1)) == [(5, 5), (9000, 9000)]      # BookKeeper's default
    assert sampled_ranges(7, 7, 0, random.Random(1)) == [(7, 7)]
    for seed in range(20):
        got = sampled_ranges(0, 6399, 10, random.Random(seed), window=64)         # 100 windows, 10 drawn
        assert got[0][0] == 0 and got[-1][1] == 6399
        assert all(a <= b for a, b in got) and all(x[1] + 1 < y[0] for x, y in zip(got, got[1:]))
        ids = sum(b - a + 1 for a, b in got)
        assert 640 <= ids <= 640 + 2 * 64, ids   # ten windows, and the two ends (maybe inside one)
        assert all(a % 64 == 0 or a in (0, 6399) for a, _ in got)
    assert sampled_ranges(0, 6399, 10, random.Random(3)) != sampled_ranges(0, 6399, 10, random.Random(4))


@pytest.mark.parametrize("first,last,percent", [(0, 6399, 10), (5, 9000, 7.5), (0, 63, 50), (3, 1000, 33),
                                                 (0, 640, 1), (100, 100 + 64 * 7 - 1, 20), (0, 1 << 16, 99)])
def test_a_periodic_checks_passes_take_the_windows_in_turn(first, last, percent):
    """The periodic check's sampled passes: each reads at least its share
    (and less than one window more, with the ends), and any ceil(100 / P)
    consecutive passes read every id, from any pass on (drawn at random, a
    window could go unread for many passes)."""
    import math

    from stream.autorecovery.replica_check import sampled_ranges

    whole = last - first + 1
    turn = math.ceil(100 / percent)
    for start in (0, 1, 17, 10 ** 6 + 3):
        seen: set[int] = set()
        for p in range(start, start + turn):
            got = sampled_ranges(first, last, percent, pass_no=p, window=64)
            assert got[0][0] == first and got[-1][1] == last
            assert all(a <= b for a, b in got) and all(x[1] + 1 < y[0] for x, y in zip(got, got[1:]))
            ids = {i for a, b in got for i in range(a, b + 1)}
            windows = math.ceil(whole / 64)
            assert len(ids) >= min(whole, (math.ceil(windows * percent / 100) - 1) * 64 + 1), (p, len(ids))
            assert len(ids) <= math.ceil(windows * percent / 100) * 64 + 2, (p, len(ids))
            seen |= ids
        assert len(seen) == whole, (start, whole - len(seen))
    assert sampled_ranges(first, last, percent, pass_no=4) == sampled_ranges(first, last, percent, pass_no=4)


def test_a_sampled_check_reads_the_ends_and_what_it_draws(own):
    """A closed ledger whose first bookie lacks its last entry and ids 40-49.
    ``--percent 0`` (BookKeeper's default: the first and last id of each
    fragment) finds the last entry missing and reads 2 ids, not the middle;
    ``--percent 100`` finds both; a 50 % sample reads about half, and what
    it finds is what it read."""
    own.start(3)
    lid, ens = closed_ledger(own, [b"s%d" % i for i in range(200)], ack_quorum=3)

    async def hurt():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        bc = await bk.bookie(ens[0])
        for r in ((40, 49), (199, 199)):
            assert (await bc.delete(lid, r)).status == Status.OK
        await bk.close()

    run(hurt())
    code, out = _check(own, "ledgers", "check", str(lid), "--percent", "0")
    assert code == 5 and out["entries_checked"] == 2 and out["entries_spanned"] == 200, out
    assert out["fragments"][0]["missing"] == {ens[0]: [[199, 199]]}
    code, out = _check(own, "ledgers", "check", str(lid))
    assert code == 5 and out["entries_checked"] == 200
    assert out["fragments"][0]["missing"] == {ens[0]: [[40, 49], [199, 199]]}
    code, out = _check(own, "ledgers", "check", str(lid), "--percent", "50")
    assert code == 5 and 2 + 64 <= out["entries_checked"] <= 2 + 128, out     # two of four windows of 64
    missing = out["fragments"][0]["missing"][ens[0]]
    assert [199, 199] in missing and all(r in ([40, 49], [199, 199]) for r in missing), missing
