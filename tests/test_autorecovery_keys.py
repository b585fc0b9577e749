"""The autorecovery's lease-bound keys in real etcd (stream/autorecovery/keys.py):
a worker's per-ledger lock and the auditor's election key."""
from __future__ import annotations

import dataclasses

from stream.autorecovery.keys import AutorecoveryKeys


def test_a_holder_finds_its_own_lock_again_and_nobody_else_takes_it(store, cluster):
    """A worker whose release failed in an etcd outage its lease outlived
    (or whose create's answer was lost) holds the lock still: taking it
    again must say so, or that worker, and every other, waits for the
    lock for as long as the process runs."""
    keys = AutorecoveryKeys(store, cluster)
    mine, other = store.lease(10), store.lease(10)
    try:
        token = keys.try_lock(7, "w1", mine.id)
        assert token is not None
        assert keys.try_lock(7, "w1", mine.id) == token   # (ours: the release that never happened)
        assert keys.try_lock(7, "w2", other.id) is None   # someone else's
        assert keys.try_lock(7, "w1", other.id) is None   # our name on a lease that is not the lock's
        assert keys.lock_holder(7) == "w1"
        keys.unlock(7, "w1")
        # a later holder's fencing token is higher (a copy's clearing carries it)
        assert keys.try_lock(7, "w2", other.id) > token and keys.try_lock(7, "w1", mine.id) is None
    finally:
        mine.revoke()
        other.revoke()


def test_an_auditor_that_left_its_lead_on_an_error_is_still_the_auditor(store, cluster):
    """An elected auditor whose lead loop ended on an etcd error keeps its
    key while its lease lives: campaigning again must find it elected (with
    KeyExists alone it waited for its own key's deletion, and so did every
    other candidate: no auditor, found by the fault suite after an etcd kill)."""
    keys = AutorecoveryKeys(store, cluster)
    mine, other = store.lease(10), store.lease(10)
    a, b = {"id": "auditor-a", "address": ""}, {"id": "auditor-b", "address": ""}
    try:
        assert keys.campaign(a, mine.id)
        assert keys.campaign(a, mine.id)
        assert not keys.campaign(b, other.id) and not keys.campaign(a, other.id)
        assert keys.auditor() == a
        mine.revoke()   # (its key goes with its lease)
        assert keys.campaign(b, other.id) and keys.auditor() == b
    finally:
        other.revoke()


def test_a_bookie_back_takes_the_reports_naming_it_with_it(store, cluster):
    """A fragment reported unrecoverable because every replica of its write
    set was lost is recoverable again once one of them is back (it may hold
    the only copy): ``moot`` drops that report with the bookie, keeps the
    others, and deletes a task left naming nothing."""
    keys = AutorecoveryKeys(store, cluster)
    t = keys.publish(31, {"a", "b", "c"})
    t = keys.update_task(dataclasses.replace(t, unrecoverable=(
        {"first": 0, "last": 9, "lost": ["a", "b"]}, {"first": 10, "last": 19, "lost": ["c"]})))
    assert keys.moot("a") == 1
    t = keys.get_task(31)
    assert t.lost == {"b", "c"} and [u["first"] for u in t.unrecoverable] == [10]
    assert keys.moot("b") == 1 and keys.get_task(31).lost == {"c"}
    assert keys.moot("c") == 1 and keys.get_task(31) is None


def test_a_damaged_bookie_the_auditor_declares_lost_is_moved_whole(store, cluster):
    """Its scrub reported a bookie's rotted ids (damaged, filled in place
    onto it); then the auditor declares it lost (gone past its delay): the
    task names it lost and no longer damaged, its ids dropped (its whole
    share is moved: a fill onto a bookie that never answers would wait for
    ever), and its return makes it moot like any lost bookie's."""
    keys = AutorecoveryKeys(store, cluster)
    keys.publish(32, {"a"}, damaged=True, ids={"a": [(5, 5)]})
    keys.publish(32, {"b"}, damaged=True, ids={"b": [(7, 8)]})
    assert keys.moot("a") == 0                       # registered all along: its damage stands
    keys.publish(32, {"a"})
    t = keys.get_task(32)
    assert (t.lost, t.damaged, t.damaged_ids) == ({"a", "b"}, {"b"}, {"b": ((7, 8),)})
    assert keys.moot("a") == 1 and keys.get_task(32).lost == {"b"}


def test_the_sampled_checks_pass_numbers_go_on_across_auditors(store, cluster):
    """Each sampled full check's pass runs the number after the last one
    completed, whichever auditor completed it (an elected one after
    another's lease ran out), so that the windows read go on where the last
    pass left them; a pass that fails midway records nothing, and the next
    runs its number again.  Two auditors at once for a moment: the number
    recorded never goes back."""
    from concurrent.futures import ThreadPoolExecutor

    a, b = AutorecoveryKeys(store, cluster), AutorecoveryKeys(store, cluster)
    assert a.check_pass() == 0 and b.check_pass() == 0
    a.check_pass_done(0)
    assert b.check_pass() == 1
    n = b.check_pass()              # this pass fails midway: nothing recorded
    assert a.check_pass() == n == 1
    a.check_pass_done(1)
    b.check_pass_done(1)            # the same pass run twice: recorded once
    assert a.check_pass() == 2
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda kn: kn[0].check_pass_done(kn[1]), [(a, n) for n in range(2, 14)] + [(b, 7)]))
    assert store.get(a.layout.check_pass_key()).value == b"13"
    b.check_pass_done(9)            # a slow auditor's older pass
    assert a.check_pass() == 14
