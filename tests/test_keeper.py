"""KeptKey on a key of its own (not a bookie registration), as an auditor's
election key or a worker's lock would use it, against a real etcd."""
from __future__ import annotations

from metadata.keeper import KeptKey
from metadata.keeper_core import KeeperState
from metadata.store import Put, absent, TxnConflict
from metadata.errors import KeyExists
from tests.etcd_fixture import Collector

WAIT = 15.0


def lock_creator(store, key: str, value: bytes):
    """create(lease, ours): the key if absent, or if held under one of our leases."""
    def create(lease, ours):
        cur = store.get(key)
        if cur is not None and cur.lease not in ours:
            raise KeyExists(key, cur)
        cond = [absent(key)] if cur is None else []
        try:
            return store.txn(cond, [Put(key, value, lease.id)]).revision
        except TxnConflict as c:
            raise KeyExists(key, c.current.get(key)) from None
    return create


def test_a_lock_is_kept_created_again_after_loss_and_released(store, prefix):
    key = prefix + "lock"
    changes: Collector = Collector()
    created: Collector = Collector()
    k = KeptKey(store, 2, lock_creator(store, key, b"worker-1"), name="lock", on_change=changes,
                on_created=created)
    try:
        assert k.wait_registered(WAIT)
        first = k.lease.id
        assert store.get(key).lease == first and store.get(key).value == b"worker-1"
        k.lease.revoke()                     # lost behind its back
        changes.wait_for(lambda c: c.new is KeeperState.LOST, WAIT)
        assert k.wait_for(lambda kk: kk.registered and kk.lease.id != first, WAIT)
        assert store.get(key).lease == k.lease.id
        assert [lease.id for lease in created.wait_count(2, WAIT)][-1] == k.lease.id
        # a second holder waits: it cannot take a key held by a lease not its own
        other = KeptKey(store, 2, lock_creator(store, key, b"worker-2"), name="lock-2")
        try:
            assert other.wait_for(lambda kk: kk.core.attempts >= 2, WAIT) and not other.registered
            assert "KeyExists" in other.status()["last_error"]
            k.stop()                          # released: revoked, the key is gone at once ...
            assert other.wait_registered(WAIT)  # ... and the other takes it
            assert store.get(key).value == b"worker-2"
        finally:
            other.stop()
        assert store.get(key) is None
    finally:
        k.stop()
