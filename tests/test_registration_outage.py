"""Issue 12.1: a bookie keeps its registration through an etcd outage longer
than its TTL, and through being paused (SIGSTOP) longer than its TTL.

Real etcd (one of this test's own, stopped and started again on the same
ports and data), real bookie processes.  Waits are on events (watch events,
the bookie's Info answering with the state asked for), each with a deadline.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from bookstream.processes import BookieProcess
from metadata.etcd_server import ManagedEtcd
from metadata.layout import KeyLayout
from metadata.store import EventType, MetadataStore
from stream.bookie_client import BookieClient
from tests.etcd_fixture import Collector

TTL = 2
WAIT = 30.0


def _info(address: str):
    async def go():
        c = BookieClient(address)
        try:
            return await c.info(timeout=5.0)
        finally:
            await c.close()
    return asyncio.run(go())


def wait_info(address: str, predicate, timeout: float = WAIT):
    """The bookie's Info once `predicate(info)` holds (asked again as soon as
    each answer comes, with a short pause between calls), within `timeout`."""
    deadline = time.monotonic() + timeout
    info = None
    while time.monotonic() < deadline:
        info = _info(address)
        if predicate(info):
            return info
        time.sleep(0.1)  # between two calls of a condition poll, not a synchronisation
    pytest.fail(f"bookie {address}: condition not reached in {timeout}s; last Info: {info}")


@pytest.fixture
def private_etcd(tmp_path):
    etcd = ManagedEtcd(tmp_path / "etcd").start()
    yield etcd
    etcd.stop()


def test_bookie_registers_again_after_an_etcd_outage_longer_than_its_ttl(private_etcd, tmp_path, cluster):
    bookie = BookieProcess(tmp_path / "b0", etcd=private_etcd.endpoint, cluster=cluster,
                           extra_args=["--registration-ttl", str(TTL)]).start()
    try:
        key = KeyLayout(cluster).bookie_key(bookie.bookie_id, False)
        with MetadataStore(private_etcd.endpoint, timeout=2.0) as store:
            first = store.get(key)
            assert first is not None
            events: Collector = Collector()
            cancel = store.watch_key(key, events, start_revision=first.mod_revision + 1)
            try:
                assert wait_info(bookie.address, lambda i: i.registration_state == "held")
                private_etcd.stop()  # the outage begins
                # The bookie notices, says so in its Info, and keeps serving.
                lost = wait_info(bookie.address, lambda i: i.registration_state == "lost")
                wait_info(bookie.address, lambda i: i.unregistered_seconds >= TTL)
                assert lost.bookie_id == bookie.bookie_id
                private_etcd.start()  # same ports, same data
                back = events.wait_for(lambda e: e.type is EventType.PUT and e.lease != first.lease, WAIT)
                held = wait_info(bookie.address, lambda i: i.registration_state == "held")
                assert held.unregistered_seconds == 0
                # The old lease is gone (revoked by the bookie, or expired) and
                # the key stays, under the new one.
                assert store.get(key).lease == back.lease
                assert store._lease_ttl(first.lease) == -1
                assert not any(e.type is EventType.DELETE for e in events.items)
            finally:
                cancel()
        log = bookie.log_path.read_text()
        assert "LOST its registration" in log and "registered again" in log
    finally:
        bookie.kill()


def test_bookie_paused_longer_than_its_ttl_registers_again(private_etcd, tmp_path, cluster):
    bookie = BookieProcess(tmp_path / "b0", etcd=private_etcd.endpoint, cluster=cluster,
                           extra_args=["--registration-ttl", str(TTL)]).start()
    try:
        key = KeyLayout(cluster).bookie_key(bookie.bookie_id, False)
        with MetadataStore(private_etcd.endpoint, timeout=2.0) as store:
            first = store.get(key)
            events: Collector = Collector()
            cancel = store.watch_key(key, events, start_revision=first.mod_revision + 1)
            try:
                os.kill(bookie.pid, signal.SIGSTOP)
                try:
                    # etcd drops the key once the lease expires
                    events.wait_for(lambda e: e.type is EventType.DELETE, WAIT)
                finally:
                    os.kill(bookie.pid, signal.SIGCONT)
                back = events.wait_for(lambda e: e.type is EventType.PUT, WAIT)
                assert back.lease != first.lease and store.get(key).lease == back.lease
                wait_info(bookie.address, lambda i: i.registration_state == "held")
            finally:
                cancel()
    finally:
        bookie.kill()


def test_bookie_restarted_after_kill_replaces_its_stale_registration_at_once(private_etcd, tmp_path, cluster):
    """12.5: no wait for the previous run's lease to expire."""
    bookie = BookieProcess(tmp_path / "b0", etcd=private_etcd.endpoint, cluster=cluster,
                           extra_args=["--registration-ttl", "60"]).start()
    try:
        key = KeyLayout(cluster).bookie_key(bookie.bookie_id, False)
        with MetadataStore(private_etcd.endpoint, timeout=2.0) as store:
            first = store.get(key)
            bookie.kill()  # its key lives on for 60 s
            assert store.get(key).lease == first.lease
            t0 = time.monotonic()
            bookie.start()
            assert time.monotonic() - t0 < 30  # well under the 60 s TTL (start-up only)
            now = store.get(key)
            assert now.lease != first.lease and store._lease_ttl(first.lease) == -1
    finally:
        bookie.kill()
