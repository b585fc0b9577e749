"""The kept-key policy (metadata/keeper_core.py), driven by hand: time is an input."""
from __future__ import annotations

from metadata.keeper_core import Action, KeeperCore, KeeperState


def held(ttl=9, now=0.0) -> KeeperCore:
    c = KeeperCore(ttl, now)
    step, _ = c.next(now)
    assert step == (step.__class__(Action.CREATE, now)) and c.state is KeeperState.CREATING
    assert not c.registered and c.unregistered_for(now + 1) == 1
    change = c.created(now, ttl)
    assert change.new is KeeperState.HELD and c.registered
    return c


def test_refreshes_every_third_of_the_ttl():
    c = held(9)
    step, change = c.next(1.0)
    assert change is None and step.action is Action.REFRESH and step.at == 3.0
    c.refreshed(3.1, 3.0, 9)
    assert c.next(3.1)[0].at == 3.1 + 3.0 and c.state is KeeperState.HELD


def test_an_outage_shorter_than_the_ttl_is_only_suspect():
    c = held(9)
    ch = c.refresh_failed(3.0, "etcd away")
    assert ch.new is KeeperState.SUSPECT and c.registered
    assert c.next(3.0)[0] == c.next(3.0)[0].__class__(Action.REFRESH, 3.25)   # retried soon
    assert c.refresh_failed(8.9, "etcd away") is None and c.registered
    ch = c.refreshed(9.0, 8.95, 9)
    assert ch.new is KeeperState.HELD and ch.old is KeeperState.SUSPECT
    assert c.creations == 1


def test_an_outage_longer_than_the_ttl_loses_the_lease_and_creates_again_with_backoff():
    c = held(9)
    c.refresh_failed(3.0, "etcd away")
    ch = c.refresh_failed(9.0, "etcd away")
    assert ch.new is KeeperState.LOST and "presumed expired" in ch.reason and not c.registered
    assert c.next(9.0)[0].action is Action.CREATE and c.next(9.0)[0].at == 9.0
    delays = []
    now = 9.0
    for _ in range(8):
        c.create_failed(now, "MetadataUnavailable: etcd away")
        step, _ = c.next(now)
        delays.append(round(step.at - now, 3))
        now = step.at
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0] and c.attempts == 8
    assert c.unregistered_for(now) == now - 9.0
    ch = c.created(now, 9)
    assert ch.old is KeeperState.LOST and ch.new is KeeperState.HELD and "again" in ch.reason
    assert c.creations == 2 and c.attempts == 0 and c.unregistered_for(now + 5) == 0


def test_a_pause_longer_than_the_ttl_is_noticed_before_any_refresh():
    """SIGSTOP: the thread wakes long after its refresh was due."""
    c = held(9)
    step, change = c.next(30.0)
    assert change.new is KeeperState.LOST and step.action is Action.CREATE
    # the refresh that was in flight before the pause answers late: ignored
    assert c.refreshed(30.1, 2.0, 9) is None and c.state is KeeperState.LOST


def test_etcd_saying_the_lease_is_gone_loses_it_at_once():
    c = held(9)
    ch = c.lease_gone(1.0, "lease expired")
    assert ch.new is KeeperState.LOST and c.next(1.0)[0].action is Action.CREATE
    assert c.lease_gone(1.5, "again") is None  # once


def test_alarms_repeat_while_unregistered_and_stop_when_held():
    c = held(9)
    c.lease_gone(10.0, "gone")
    assert c.alarm(12.0) is None
    a = c.alarm(15.0)
    assert a is not None and a.unregistered_for == 5.0 and a.state is KeeperState.LOST
    assert c.alarm(16.0) is None and c.alarm(20.0) is not None
    c.created(21.0, 9)
    assert c.alarm(40.0) is None


def test_stopped_keeper_does_nothing():
    c = held(9)
    assert c.stop(1.0).new is KeeperState.STOPPED
    assert c.next(100.0)[0].action is Action.NONE
    assert c.created(101.0, 9) is None and c.refresh_failed(102.0, "x") is None
