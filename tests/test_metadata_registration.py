"""Bookie registration, against a real etcd (and a real child process)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bookstream_pb import metadata_pb2 as pb
from metadata.cluster import get_cluster_info, init_cluster
from metadata.errors import BookieIdInUse, InvalidName, LeaseExpired, MetadataError, RegistrationLost
from metadata.registration import BookieRegistry, MembershipChange, MembershipEvent
from tests.etcd_fixture import Collector

WAIT = 10.0
REPO = Path(__file__).resolve().parent.parent


def _reg(bookie_id: str, read_only: bool = False) -> pb.BookieRegistration:
    return pb.BookieRegistration(bookie_id=bookie_id, address=f"{bookie_id}.local:3181", read_only=read_only,
                                 free_bytes=100, total_bytes=1000, version="test")


def test_register_list_move_and_close(store, cluster):
    reg = BookieRegistry(store, cluster)
    events: Collector[MembershipEvent] = Collector()
    cancel = reg.watch(events)
    try:
        r1 = reg.register(_reg("b1"), ttl=5)
        r2 = reg.register(_reg("b2", read_only=True), ttl=5)
        assert [b.bookie_id for b in reg.list_bookies()] == ["b1", "b2"]
        assert [b.bookie_id for b in reg.list_bookies(writable_only=True)] == ["b1"]
        listed = {b.bookie_id: b for b in reg.list_bookies()}
        assert listed["b1"].address == "b1.local:3181" and not listed["b1"].read_only
        assert listed["b2"].read_only and listed["b1"].started_ms > 0

        # Move b1 to read-only: one transaction, same lease.
        rev = r1.set_read_only(True)
        assert r1.read_only and r1.set_read_only(True) == rev
        assert store.get(reg.layout.bookie_key("b1", False)) is None
        moved = store.get(reg.layout.bookie_key("b1", True))
        assert moved is not None and moved.lease == r1.lease.id and moved.mod_revision == rev
        assert reg.list_bookies(writable_only=True) == []
        removed = events.wait_for(lambda e: e.change is MembershipChange.REMOVED and e.bookie_id == "b1", WAIT)
        added = events.wait_for(lambda e: e.bookie_id == "b1" and e.read_only
                                and e.change is MembershipChange.ADDED, WAIT)
        assert removed.revision == added.revision == rev and not removed.read_only
        assert added.registration is not None and added.registration.address == "b1.local:3181"
        r1.set_read_only(False)
        assert [b.bookie_id for b in reg.list_bookies(writable_only=True)] == ["b1"]
        r1.update(free_bytes=42)
        assert {b.bookie_id: b.free_bytes for b in reg.list_bookies()}["b1"] == 42

        r2.close()
        events.wait_for(lambda e: e.change is MembershipChange.REMOVED and e.bookie_id == "b2", WAIT)
        assert [b.bookie_id for b in reg.list_bookies()] == ["b1"]
        r1.close()
        r1.close()
        assert reg.list_bookies() == []
    finally:
        cancel()


def test_bookie_id_in_use(store, cluster):
    reg = BookieRegistry(store, cluster)
    first = reg.register(_reg("b1"), ttl=5)
    try:
        with pytest.raises(BookieIdInUse) as info:
            reg.register(_reg("b1", read_only=True), ttl=5)
        assert info.value.current is not None and info.value.current.lease == first.lease.id
        assert [b.bookie_id for b in reg.list_bookies()] == ["b1"]
        assert not first.lost
    finally:
        first.close()
    second = reg.register(_reg("b1"), ttl=5)
    second.close()
    with pytest.raises(InvalidName):
        reg.register(_reg("bad/id"))


def test_restarted_bookie_waits_for_its_stale_registration(store, cluster):
    reg = BookieRegistry(store, cluster)
    old = reg.register(_reg("b1"), ttl=1)
    old.keeper.stop(revoke=False)  # the old process "dies": no more refreshes, no revoke
    new = reg.register(_reg("b1"), ttl=5, wait_for_stale=old.lease.ttl + WAIT)
    try:
        assert new.lease.id != old.lease.id
        assert store.get(reg.layout.bookie_key("b1", False)).lease == new.lease.id
    finally:
        new.close()


def test_restarted_bookie_replaces_its_own_stale_registration_at_once(store, cluster):
    reg = BookieRegistry(store, cluster)
    old = reg.register(_reg("b1"), ttl=30)
    old.keeper.stop(revoke=False)  # killed: its key lives on for 30 s
    t0 = time.monotonic()
    # a stranger's lease is not replaced
    with pytest.raises(BookieIdInUse):
        reg.register(_reg("b1"), ttl=5, replace_leases=[old.lease.id + 1])
    new = reg.register(_reg("b1", read_only=True), ttl=5, replace_leases=[old.lease.id])
    try:
        assert time.monotonic() - t0 < 10  # not the 30 s of the old lease
        assert store.get(reg.layout.bookie_key("b1", False)) is None
        assert store.get(reg.layout.bookie_key("b1", True)).lease == new.lease.id
        assert old.lease.remaining() == -1  # the old lease was revoked
    finally:
        new.close()


def test_lost_lease_is_reported_and_the_key_created_again(store, cluster):
    reg = BookieRegistry(store, cluster)
    lost: Collector[MetadataError] = Collector()
    r = reg.register(_reg("b1"), ttl=3, on_lost=lost)
    first = r.lease.id
    r.lease.revoke()  # e.g. an operator, or an expiry during a long pause
    err = lost.wait_for(lambda e: True, WAIT)
    assert isinstance(err, LeaseExpired)
    assert r.keeper.wait_for(lambda k: k.registered and k.lease.id != first, WAIT)
    assert store.get(reg.layout.bookie_key("b1", False)).lease == r.lease.id
    assert r.status()["creations"] == 2 and r.status()["registered"]
    # a key removed behind its back is noticed on the next write, and created again
    store.delete(reg.layout.bookie_key("b1", False))
    with pytest.raises(RegistrationLost):
        r.set_read_only(True)
    assert r.keeper.wait_for(lambda k: k.registered and k.core.creations == 3, WAIT)
    assert [(b.bookie_id, b.read_only) for b in reg.list_bookies()] == [("b1", True)]
    r.close()
    assert reg.list_bookies() == []


_CHILD = textwrap.dedent("""
    import sys, threading
    from bookstream_pb import metadata_pb2 as pb
    from metadata.registration import BookieRegistry
    from metadata.store import MetadataStore
    endpoint, cluster, bookie_id = sys.argv[1:4]
    store = MetadataStore(endpoint)
    BookieRegistry(store, cluster).register(pb.BookieRegistration(bookie_id=bookie_id, address="child"), ttl=2)
    print("registered", flush=True)
    threading.Event().wait()
""")


def test_registration_disappears_when_its_process_dies(store, cluster, etcd_server):
    reg = BookieRegistry(store, cluster)
    events: Collector[MembershipEvent] = Collector()
    cancel = reg.watch(events)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, etcd_server.endpoint, cluster, "child-bookie"],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        try:
            events.wait_for(lambda e: e.change is MembershipChange.ADDED, 30)
        except BaseException:
            child.kill()
            out, err = child.communicate(timeout=10)
            raise AssertionError(f"child did not register: {out!r} {err[-2000:]!r}")
        assert [b.address for b in reg.list_bookies()] == ["child"]
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
        gone = events.wait_for(lambda e: e.change is MembershipChange.REMOVED, 2 + WAIT)
        assert gone.bookie_id == "child-bookie"
        assert reg.list_bookies() == []
    finally:
        cancel()
        if child.poll() is None:
            child.kill()
            child.wait(10)
        child.stdout.close()
        child.stderr.close()


def test_cluster_info_is_created_once(store, cluster):
    assert get_cluster_info(store, cluster) is None
    a = init_cluster(store, cluster)
    b = init_cluster(store, cluster)
    assert a.cluster_id and a == b and a.layout_version == 1
    assert get_cluster_info(store, cluster) == a
