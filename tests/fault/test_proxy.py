"""The partitioning proxy (tests/fault/proxy.py) on a plain TCP echo server:
it forwards, holds a blackholed link's bytes until healed, resets a cut
one, and touches only the client processes it is told to."""
from __future__ import annotations

import os
import socket
import socketserver
import threading

import pytest

from tests.fault.proxy import BookieProxy, ProxyLoop, socket_owner

pytestmark = pytest.mark.fault


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:  # the proxy reset the link: what the test does
            pass


@pytest.fixture
def proxy():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ploop = ProxyLoop()
    p = BookieProxy(ploop, server.server_address[1], lambda: [os.getpid()])
    yield p
    p.close()
    ploop.close()
    server.shutdown()
    server.server_close()


def connect(p: BookieProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    s.sendall(b"hello")
    assert s.recv(5) == b"hello"  # the link is set up (and attributed) once this returns
    return s


def test_socket_owner_finds_this_process():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        c = socket.create_connection(srv.getsockname())
        try:
            assert socket_owner(c.getsockname()[1], [1, os.getpid()]) == os.getpid()
            assert socket_owner(c.getsockname()[1], [1]) is None
        finally:
            c.close()


def test_blackhole_holds_the_bytes_until_healed(proxy):
    s = connect(proxy)
    proxy.blackhole([os.getpid()])
    s.sendall(b"held")
    s.settimeout(0.5)
    with pytest.raises(socket.timeout):  # nothing comes back while the link is held
        s.recv(4)
    proxy.heal()
    s.settimeout(5)
    assert s.recv(4) == b"held"  # ... and it flows once healed, as after TCP's retransmissions
    s.close()


def test_a_partition_of_other_processes_leaves_this_one_alone(proxy):
    s = connect(proxy)
    proxy.blackhole([1])
    proxy.cut([1])
    s.sendall(b"still")
    assert s.recv(5) == b"still"
    s.close()


def test_cut_resets_the_links_and_refuses_new_ones(proxy):
    s = connect(proxy)
    proxy.cut()
    s.settimeout(5)
    with pytest.raises((ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        s.sendall(b"x")
        if s.recv(1) == b"":  # an orderly close counts as cut too
            raise ConnectionResetError
    s.close()
    s2 = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    s2.sendall(b"x")
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        if s2.recv(1) == b"":
            raise ConnectionResetError
    s2.close()
    proxy.heal()
    connect(proxy).close()


@pytest.mark.parametrize("mode", ["blackhole", "cut"])
def test_a_bookie_partitioned_from_etcd_loses_its_registration_and_registers_again(tmp_path, mode):
    """The nemesis's ``etcd_partition``: the bookie keeps running and serving,
    but its lease runs out (its etcd link is its proxy), so its registration
    goes; once healed, it registers again by itself (metadata/keeper.py)."""
    import queue

    from metadata.registration import BookieRegistry, MembershipChange
    from metadata.store import MetadataStore
    from tests.fault.cluster import FaultCluster

    c = FaultCluster(tmp_path, seed=1, bookies=1, ttl=2, tmpfs_bookie=None).start()
    store = MetadataStore(c.etcd.endpoint)
    try:
        bid = c.bookies[0].proc.bookie_id
        registry = BookieRegistry(store, c.name)
        regs, rev = registry.snapshot()
        assert [r.bookie_id for r in regs] == [bid]
        events: queue.SimpleQueue = queue.SimpleQueue()
        cancel = registry.watch(events.put, start_revision=rev + 1)
        c.partition_from_etcd(0, mode)
        ev = events.get(timeout=30)  # the lease (TTL 2 s) expires: etcd deletes the key
        assert (ev.change, ev.bookie_id) == (MembershipChange.REMOVED, bid)
        assert c.bookies[0].proc.alive()  # the bookie itself runs on
        c.heal_etcd_link(0)
        ev = events.get(timeout=30)
        assert (ev.change, ev.bookie_id) == (MembershipChange.ADDED, bid)
        cancel()
    finally:
        store.close()
        c.close()


def test_a_slow_disk_slows_that_bookie_s_fsyncs_only_while_on(tmp_path):
    """The nemesis's ``slow_disk``: the bookies carry an LD_PRELOAD shim
    (tests/fault/slow_disk.c); once the fault is on, each group commit of
    that bookie takes at least the delay (its journal's own histogram of
    group commits); once off, the bookie commits on."""
    import asyncio

    from stream.client import BookKeeperClient
    from tests.fault.cluster import FaultCluster

    c = FaultCluster(tmp_path, seed=1, bookies=3, tmpfs_bookie=None, slow_disks=True).start()
    assert all(b.slow_path is not None for b in c.bookies), "no cc to build the shim"

    async def go():
        bk = BookKeeperClient(c.etcd.endpoint, c.name)
        slow = c.bookies[0].proc.bookie_id
        lh = await bk.create_ledger(3, 3, 3)   # (Qa 3: each add waits for the slow bookie too)
        await lh.add_entries([b"before"] * 5)
        bc = await bk.bookie(slow)
        before = await bc.info()
        c.slow_disk(0, 400)
        await lh.add_entry(b"slow")
        during = await bc.info()
        c.fast_disk(0)
        await lh.add_entries([b"after"] * 5)
        after = await bc.info()
        await bk.close()
        return before, during, after

    try:
        before, during, after = asyncio.run(go())
        # element 13 on: commits of 64 << 12 us (0.26 s) and more
        assert sum(during.journal_sync_histogram[13:]) > sum(before.journal_sync_histogram[13:])
        assert during.journal_sync_max_seconds >= 0.4
        assert after.journal_fsyncs > during.journal_fsyncs   # (the bookie commits on)
    finally:
        c.close()
