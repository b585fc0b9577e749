"""Bookies with etcd: registration under a lease, read-only moves, and the
standalone cluster."""
from __future__ import annotations

import threading

from bookie import entry as E
from bookie.core import Status
from bookstream.standalone import Standalone
from metadata.registration import BookieRegistry, MembershipChange
from stream.bookie_client import BookieClient
from tests.conftest import run


class Events:
    """Membership events, awaited with a deadline (no sleeps)."""

    def __init__(self, registry: BookieRegistry):
        self.cond = threading.Condition()
        self.events = []
        self.cancel = registry.watch(self._on)

    def _on(self, ev):
        with self.cond:
            self.events.append(ev)
            self.cond.notify_all()

    def wait_for(self, pred, timeout=20.0):
        with self.cond:
            ok = self.cond.wait_for(lambda: any(pred(e) for e in self.events), timeout)
        assert ok, f"no matching membership event in {self.events}"


def test_registration_disappears_when_the_bookie_dies(bookies, etcd_server, store, cluster):
    registry = BookieRegistry(store, cluster)
    events = Events(registry)
    b = bookies(etcd=etcd_server.endpoint, cluster=cluster, extra_args=["--registration-ttl", "2"])
    regs = registry.list_bookies()
    assert [(r.bookie_id, r.address, r.read_only) for r in regs] == [(b.bookie_id, b.address, False)]
    b.kill()  # kill -9: no deregistration, the lease must expire
    events.wait_for(lambda e: e.change is MembershipChange.REMOVED and e.bookie_id == b.bookie_id)
    assert registry.list_bookies() == []
    # a restart with the same data dir comes back under the same id
    b.start()
    assert [r.bookie_id for r in registry.list_bookies()] == [b.bookie_id]
    events.cancel()


def test_clean_stop_deregisters_at_once(bookies, etcd_server, store, cluster):
    registry = BookieRegistry(store, cluster)
    b = bookies(etcd=etcd_server.endpoint, cluster=cluster, extra_args=["--registration-ttl", "60"])
    assert len(registry.list_bookies()) == 1
    assert b.stop() == 0
    assert registry.list_bookies() == []  # no need to wait 60 s for the lease


def test_read_only_bookie_moves_its_registration(bookies, etcd_server, store, cluster):
    registry = BookieRegistry(store, cluster)
    events = Events(registry)
    b = bookies(etcd=etcd_server.endpoint, cluster=cluster,
                extra_args=["--max-storage-bytes", "300000", "--disk-usage-threshold", "0.9",
                            "--disk-check-interval", "0.1"])

    async def fill(c):
        for i in range(200):
            ack = await c.add(E.encode(1, i, bytes(4000)))
            if ack.status == Status.READ_ONLY:
                return
        raise AssertionError("never read-only")

    async def go():
        c = BookieClient(b.address)
        try:
            await fill(c)
        finally:
            await c.close()
    run(go())
    events.wait_for(lambda e: e.change is MembershipChange.ADDED and e.read_only and e.bookie_id == b.bookie_id)
    assert registry.list_bookies(writable_only=True) == []
    assert [r.bookie_id for r in registry.list_bookies()] == [b.bookie_id]
    events.cancel()


def test_standalone_runs_etcd_and_bookies_and_keeps_data(tmp_path):
    data = tmp_path / "standalone"
    with Standalone(data, bookies=3, base_port=0) as sa:
        from metadata.store import MetadataStore

        st = MetadataStore(sa.etcd_endpoint)
        ids = sorted(r.bookie_id for r in BookieRegistry(st, "default").list_bookies())
        assert ids == sorted(b.bookie_id for b in sa.bookies) and len(ids) == 3
        st.close()
        addresses = [b.address for b in sa.bookies]

        async def write():
            for i, addr in enumerate(addresses):
                c = BookieClient(addr)
                assert (await c.add(E.encode(99, 0, f"on {i}".encode()))).status == Status.OK
                await c.close()
        run(write())
    # a second run finds the same bookies, ports and data
    with Standalone(data, bookies=3, base_port=0) as sa:
        assert [b.address for b in sa.bookies] == addresses

        async def read():
            for i, addr in enumerate(addresses):
                c = BookieClient(addr)
                r = await c.read_entry(99, 0)
                assert r.status == Status.OK and E.decode(r.entry).payload == f"on {i}".encode()
                await c.close()
        run(read())


def test_a_bookie_listens_below_the_ephemeral_range_and_keeps_its_ports_across_restarts(tmp_path, etcd_server,
                                                                                         cluster):
    """Ports the kernel hands to outgoing connections (ip_local_port_range)
    can be taken by one while a bookie is down; a bookie started without a
    port gets one below that range (bookstream.processes.stable_port), its
    read port too, and restarts on both."""
    from pathlib import Path

    from bookstream.processes import BookieProcess, stable_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    handed = [stable_port() for _ in range(500)]   # (bookies started together: no two on one port)
    assert len(set(handed)) == 500 and max(handed) < low
    b = BookieProcess(tmp_path / "b", etcd=etcd_server.endpoint, cluster=cluster).start()
    try:
        port, read = b.port, int(b.read_address.rsplit(":", 1)[1])
        assert port < low and read < low and port != read and not {port, read} & set(handed)
        b.kill()
        b.start()
        assert (b.port, int(b.read_address.rsplit(":", 1)[1])) == (port, read)
    finally:
        b.kill()
