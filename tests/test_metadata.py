"""MetadataStore, ManagedEtcd and the key layout, against a real etcd."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from metadata.errors import (
    AuthenticationFailed,
    BadVersion,
    Compacted,
    InvalidKey,
    InvalidName,
    KeyExists,
    LeaseExpired,
    MetadataError,
    MetadataUnavailable,
    TxnConflict,
)
from metadata.etcd_server import EtcdServerError, ManagedEtcd
from metadata.layout import KeyLayout, validate_name
from metadata.store import (
    Delete,
    EventType,
    Get,
    MetadataStore,
    Put,
    WatchEvent,
    absent,
    exists,
    mod_revision_is,
)
from tests.etcd_fixture import Collector

WAIT = 10.0  # deadline for events that should come within a second or two


# -- the etcd3 client fork -----------------------------------------------------


def test_etcd3_fork_works_with_protobuf_4(etcd_server):
    import etcd3
    import google.protobuf

    assert int(google.protobuf.__version__.split(".")[0]) >= 4
    host, port = etcd_server.endpoint.rsplit(":", 1)
    client = etcd3.client(host=host, port=int(port), timeout=5)
    try:
        client.put("/fork-check/a", b"1")
        value, meta = client.get("/fork-check/a")
        assert value == b"1"
        t = client.transactions
        ok, _ = client.transaction(compare=[t.mod("/fork-check/a") == meta.mod_revision],
                                   success=[t.put("/fork-check/a", b"2")], failure=[])
        assert ok
        ok, _ = client.transaction(compare=[t.mod("/fork-check/a") == meta.mod_revision],
                                   success=[t.put("/fork-check/a", b"3")], failure=[])
        assert not ok, "a stale mod_revision compare must fail"
        assert client.get("/fork-check/a")[0] == b"2"
        lease = client.lease(5)
        client.put("/fork-check/leased", b"x", lease=lease)
        assert client.get("/fork-check/leased")[1].lease_id == lease.id
        lease.revoke()
        assert client.get("/fork-check/leased") == (None, None)
    finally:
        client.delete_prefix("/fork-check/")
        client.close()


# -- single-key operations -----------------------------------------------------


def test_create_if_absent(store, prefix):
    key = prefix + "k"
    rev = store.create(key, b"first")
    got = store.get(key)
    assert got is not None and got.value == b"first"
    assert got.mod_revision == got.create_revision == rev and got.version == 1
    with pytest.raises(KeyExists) as info:
        store.create(key, b"second")
    assert info.value.current is not None and info.value.current.value == b"first"
    assert info.value.retriable is False
    assert store.get(key).value == b"first"


def test_cas_success_and_conflict(store, prefix):
    key = prefix + "k"
    r1 = store.create(key, b"v1")
    r2 = store.cas(key, b"v2", r1)
    assert r2 > r1
    with pytest.raises(BadVersion) as info:
        store.cas(key, b"v3", r1)
    assert info.value.current is not None and info.value.current.mod_revision == r2
    assert info.value.current.value == b"v2"
    assert store.get(key).value == b"v2"
    with pytest.raises(BadVersion) as gone:
        store.cas(prefix + "missing", b"x", r1)
    assert gone.value.current is None


def test_delete_at_version(store, prefix):
    key = prefix + "k"
    r1 = store.create(key, b"v1")
    r2 = store.cas(key, b"v2", r1)
    with pytest.raises(BadVersion):
        store.delete(key, mod_revision=r1)
    assert store.get(key) is not None
    assert store.delete(key, mod_revision=r2) is True
    assert store.get(key) is None
    assert store.delete(key) is False
    with pytest.raises(BadVersion) as info:
        store.delete(key, mod_revision=r2)
    assert info.value.current is None
    store.put(key, b"again")
    assert store.delete(key) is True


def test_txn_is_atomic_over_several_keys(store, prefix):
    a, b, c = prefix + "a", prefix + "b", prefix + "c"
    result = store.txn([absent(a), absent(b)], [Put(a, b"A"), Put(b, b"B")])
    assert store.get(a).mod_revision == store.get(b).mod_revision == result.revision
    # A failed compare writes nothing and reports the compared keys' state.
    with pytest.raises(TxnConflict) as info:
        store.txn([absent(c), absent(a)], [Put(c, b"C"), Put(a, b"A2")])
    assert store.get(c) is None and store.get(a).value == b"A"
    assert info.value.current[c] is None and info.value.current[a].value == b"A"
    # Reads inside a txn, then a guarded delete of a whole prefix.
    result = store.txn([exists(a), mod_revision_is(b, store.get(b).mod_revision)],
                       [Get.prefix(prefix), Delete.prefix(prefix)])
    page, deleted = result.results
    assert [k for k, _ in page.items] == [a, b] and deleted == 2
    assert store.count(prefix) == 0


# -- ranges ----------------------------------------------------------------------


def test_range_pages_and_is_one_snapshot(store, prefix):
    keys = [f"{prefix}item/{i:03d}" for i in range(10)]
    for k in keys:
        store.put(k, k.encode())
    store.put(prefix + "itemX", b"sibling, not under item/")
    calls = []
    real = store._unary

    def counting(stub, method, request, lease=0):
        calls.append(method)
        return real(stub, method, request, lease)

    store._unary = counting
    got = store.range(prefix + "item/", page_size=3)
    assert [k for k, _ in got] == keys
    assert all(v.value == k.encode() for k, v in got)
    assert calls.count("Range") == 4, "10 keys in pages of 3 take 4 requests"
    assert [k for k, _ in store.range(prefix + "item/", limit=4, page_size=3)] == keys[:4]
    assert [k for k, _ in store.range(prefix + "item/", start_after=keys[6], page_size=2)] == keys[7:]
    assert store.count(prefix + "item/") == 10
    # Lazily paged reads stay on the first page's revision.
    it = store.iter_range(prefix + "item/", page_size=3)
    first = [next(it) for _ in range(3)]
    store.put(prefix + "item/999", b"late")
    store.delete(keys[9])
    rest = list(it)
    assert [k for k, _ in first + rest] == keys


# -- watches ---------------------------------------------------------------------


def test_watch_delivers_events(store, prefix):
    events: Collector[WatchEvent] = Collector()
    cancel = store.watch_prefix(prefix, events)
    try:
        rev = store.put(prefix + "a", b"1")
        ev = events.wait_for(lambda e: e.key == prefix + "a", WAIT)
        assert ev.type is EventType.PUT and ev.value == b"1" and ev.mod_revision == rev
        store.put(prefix + "b", b"2")
        assert store.delete(prefix + "a")
        ev = events.wait_for(lambda e: e.type is EventType.DELETE, WAIT)
        assert ev.key == prefix + "a"
        assert [e.key for e in events.items] == [prefix + "a", prefix + "b", prefix + "a"]
    finally:
        cancel()


def test_watch_iterator_and_replay_from_revision(store, prefix):
    r1 = store.put(prefix + "x", b"1")
    store.put(prefix + "x", b"2")
    with store.watch_prefix_iter(prefix, start_revision=r1) as stream:
        assert stream.get(timeout=WAIT).value == b"1"
        assert stream.get(timeout=WAIT).value == b"2"
        store.put(prefix + "y", b"3")
        ev = next(stream)
        assert (ev.key, ev.value) == (prefix + "y", b"3")
    with pytest.raises(StopIteration):
        stream.get(timeout=0)


def test_a_watch_resumes_by_itself_after_etcd_restarts(tmp_path):
    """etcd restarts (same data dir and ports) under a prefix watch and a key
    watch: both resume by themselves, from the revision after the last event
    they delivered, so the changes made meanwhile arrive once each, in
    order, and neither watch reports an error."""
    server = ManagedEtcd(tmp_path / "etcd").start()
    s = MetadataStore(server.endpoint, timeout=1.0)
    events: Collector[WatchEvent] = Collector()
    key_events: Collector[WatchEvent] = Collector()
    errors: Collector[MetadataError] = Collector()
    cancels = []
    try:
        cancels.append(s.watch_prefix("/w/", events, on_error=errors))
        cancels.append(s.watch_key("/w/k", key_events, on_error=errors))
        r1 = s.put("/w/k", b"before")
        events.wait_for(lambda e: e.mod_revision == r1, WAIT)
        key_events.wait_for(lambda e: e.mod_revision == r1, WAIT)
        server.stop()
        server.start()
        with MetadataStore(server.endpoint, timeout=5.0) as other:  # s may still be reconnecting
            r2 = other.put("/w/a", b"after-1")
            r3 = other.put("/w/k", b"after-2")
        events.wait_for(lambda e: e.mod_revision == r3, 30)
        key_events.wait_for(lambda e: e.mod_revision == r3, 30)
        r4 = s.put("/w/b", b"later")  # and the resumed watch keeps going
        events.wait_for(lambda e: e.mod_revision == r4, WAIT)
        assert [(e.key, e.value, e.mod_revision) for e in events.items] == [
            ("/w/k", b"before", r1), ("/w/a", b"after-1", r2), ("/w/k", b"after-2", r3), ("/w/b", b"later", r4)]
        assert [(e.value, e.mod_revision) for e in key_events.items] == [(b"before", r1), (b"after-2", r3)]
        assert errors.items == []
    finally:
        for cancel in cancels:
            cancel()
        s.close()
        server.stop()


def test_a_watch_that_cannot_resume_past_a_compaction_reports_it(tmp_path, monkeypatch):
    """etcd's history is compacted past the revision a watch must resume
    from while it is down: the watch reports Compacted through on_error,
    once, and delivers nothing more (it never skips events silently).  The
    resume is held (a gate in the store's watch creation) until the
    compaction is done, so the order is certain."""
    resuming, gate = threading.Event(), threading.Event()
    real_add = MetadataStore._add_watch
    adds = []

    def held_add(self, *args, **kw):
        adds.append(args)
        if len(adds) > 1:  # a resume: wait for the compaction
            resuming.set()
            assert gate.wait(60)
        return real_add(self, *args, **kw)

    monkeypatch.setattr(MetadataStore, "_add_watch", held_add)
    server = ManagedEtcd(tmp_path / "etcd").start()
    s = MetadataStore(server.endpoint, timeout=1.0)
    events: Collector[WatchEvent] = Collector()
    errors: Collector[MetadataError] = Collector()
    cancel = s.watch_prefix("/w/", events, on_error=errors)
    try:
        r1 = s.put("/w/k", b"before")
        events.wait_for(lambda e: e.mod_revision == r1, WAIT)
        server.stop()
        assert resuming.wait(30), "the watch did not try to resume"
        server.start()
        with MetadataStore(server.endpoint, timeout=5.0) as other:
            other.put("/w/k", b"compacted away")
            r3 = other.put("/w/k", b"after")
            other.compact(r3)
        gate.set()
        err = errors.wait_for(lambda e: True, 30)
        assert isinstance(err, Compacted) and err.compact_revision == r3
        assert [e.mod_revision for e in events.items] == [r1]
    finally:
        gate.set()
        cancel()
        s.close()
        server.stop()
    assert len(errors.items) == 1


# -- leases ----------------------------------------------------------------------


def test_lease_expiry_removes_key(store, prefix):
    lease = store.lease(1)
    assert lease.ttl >= 1 and lease.remaining() > 0
    key = prefix + "ephemeral"
    rev = store.put(key, b"x", lease=lease)
    assert store.get(key).lease == lease.id
    events: Collector[WatchEvent] = Collector()
    cancel = store.watch_key(key, events, start_revision=rev + 1)
    try:
        ev = events.wait_for(lambda e: e.type is EventType.DELETE, lease.ttl + WAIT)
    finally:
        cancel()
    assert ev.key == key and store.get(key) is None
    assert lease.remaining() == -1
    with pytest.raises(LeaseExpired):
        lease.refresh()
    with pytest.raises(LeaseExpired):
        store.put(prefix + "late", b"x", lease=lease)


def test_keepalive_keeps_lease_and_reports_loss(store, prefix):
    lease = store.lease(2)
    key = prefix + "kept"
    store.put(key, b"x", lease=lease)
    lost: Collector[MetadataError] = Collector()
    ka = lease.keep_alive(on_lost=lost)
    try:
        started = time.monotonic()
        # 5 refreshes at ttl/3 take longer than the TTL (plus etcd's 0.5 s
        # expiry granularity): the key only survives if the refreshes work.
        assert ka.wait_refreshes(5, WAIT)
        assert time.monotonic() - started > lease.ttl + 0.5
        assert store.get(key) is not None
        # Someone revokes the lease: the keep-alive reports the loss.
        lease.revoke()
        err = lost.wait_for(lambda e: True, WAIT)
        assert isinstance(err, LeaseExpired) and ka.lost
        assert store.get(key) is None
    finally:
        ka.stop()
    assert not ka.running


def test_wait_deleted(store, prefix):
    key = prefix + "k"
    assert store.wait_deleted(key, 0) is True
    store.put(key, b"x")
    assert store.wait_deleted(key, 0.05) is False
    threading.Thread(target=store.delete, args=(key,)).start()
    assert store.wait_deleted(key, WAIT) is True


# -- errors ----------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_etcd_is_metadata_unavailable():
    with MetadataStore(f"127.0.0.1:{_closed_port()}", timeout=1.0) as s:
        for call in (lambda: s.get("/k"), lambda: s.create("/k", b"v"), lambda: s.range("/k/"),
                     lambda: s.lease(5), lambda: s.watch_prefix("/k/", lambda e: None)):
            with pytest.raises(MetadataUnavailable) as info:
                call()
            assert info.value.retriable is True


def test_bad_arguments_are_rejected(store):
    with pytest.raises(AssertionError):
        store.get("")
    with pytest.raises(AssertionError):
        store.put("/k", "not bytes")  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        store.cas("/k", b"v", 0)
    with pytest.raises(AssertionError):
        store.range("/k/", page_size=0)


# -- ManagedEtcd -----------------------------------------------------------------


def test_managed_etcd_restart_keeps_data_and_endpoint(tmp_path):
    server = ManagedEtcd(tmp_path / "etcd")
    with server:
        endpoint = server.endpoint
        s = MetadataStore(endpoint, timeout=1.0)
        rev = s.create("/durable/k", b"kept")
        watch_errors: Collector[MetadataError] = Collector()
        cancel = s.watch_prefix("/durable/", lambda ev: None, on_error=watch_errors)
        lease = s.lease(2)
        lost: Collector[MetadataError] = Collector()
        keepalive = lease.keep_alive(on_lost=lost)
        assert server.log_path.exists()
    assert not server.is_running()
    try:
        # With etcd down: calls fail with the retriable error, and the
        # keep-alive gives the lease up after a TTL; the watch does not end
        # (it waits to resume: see test_a_watch_resumes_by_itself_after_etcd_restarts).
        with pytest.raises(MetadataUnavailable):
            s.get("/durable/k")
        err = lost.wait_for(lambda e: True, lease.ttl + WAIT)
        assert isinstance(err, LeaseExpired) and keepalive.lost
        assert watch_errors.items == []
    finally:
        cancel()
        s.close()
    again = ManagedEtcd(tmp_path / "etcd")
    with again:
        assert again.endpoint == endpoint, "the ports are reused from ports.json"
        with MetadataStore(again.endpoint) as s2:
            got = s2.get("/durable/k")
            assert got is not None and got.value == b"kept" and got.mod_revision == rev


def test_managed_etcd_start_failure_reports_log(tmp_path, etcd_server):
    clash = ManagedEtcd(tmp_path / "clash", client_port=etcd_server.client_port, start_timeout=20)
    with pytest.raises(EtcdServerError) as info:
        clash.start()
    assert "address already in use" in str(info.value)
    assert not clash.is_running()
    assert etcd_server.is_running()


# -- layout ----------------------------------------------------------------------


def test_layout_keys_sort_and_parse():
    lay = KeyLayout("c1")
    assert lay.cluster_key() == "/bookstream/c1/cluster"
    assert lay.ledger_header_key(7) == "/bookstream/c1/ledgers/00000000000000000007/header"
    assert lay.fragment_key(7, 12) == "/bookstream/c1/ledgers/00000000000000000007/fragments/00000000000000000012"
    ids = [0, 9, 10, 99, 100, 2**63, 2**64 - 1]
    assert sorted(lay.ledger_header_key(i) for i in ids) == [lay.ledger_header_key(i) for i in ids]
    firsts = [0, 5, 10, 11, 1000, 2**63 - 1]
    assert sorted(lay.fragment_key(1, f) for f in firsts) == [lay.fragment_key(1, f) for f in firsts]
    assert lay.parse_ledger_key(lay.ledger_header_key(2**64 - 1)) == (2**64 - 1, "header", None)
    assert lay.parse_ledger_key(lay.fragment_key(3, 42)) == (3, "fragment", 42)
    assert lay.parse_bookie_key(lay.bookie_key("bk-1:3181", True)) == ("bk-1:3181", True)
    assert lay.parse_bookie_key(lay.bookie_key("bk-1:3181", False)) == ("bk-1:3181", False)
    assert lay.parse_stream_key(lay.stream_key("s")) == "s"
    assert lay.parse_log_key(lay.log_key("l")) == "l"
    assert lay.parse_underreplicated_key(lay.underreplicated_key(5)) == 5
    assert lay.recovery_lock_key(5).endswith("autorecovery/locks/00000000000000000005")
    assert lay.auditor_key() == "/bookstream/c1/autorecovery/auditor"
    for bad in ("/bookstream/c2/ledgers/00000000000000000001/header",
                "/bookstream/c1/ledgers/1/header",
                "/bookstream/c1/ledgers/00000000000000000001/other",
                "/bookstream/c1/ledgers/99999999999999999999/header"):
        with pytest.raises(InvalidKey):
            lay.parse_ledger_key(bad)
    with pytest.raises(InvalidKey):
        lay.parse_bookie_key("/bookstream/c1/bookies/gone/b1")
    with pytest.raises(AssertionError):
        lay.ledger_header_key(-1)
    with pytest.raises(AssertionError):
        lay.fragment_key(1, 2**63)


@pytest.mark.parametrize("name", ["", "a/b", "/", "tab\there", "nl\n", "nul\0", "del\x7f", ".", "..",
                                  "x" * 256, "é" * 128, 5])
def test_invalid_names_are_typed_errors(name):
    with pytest.raises(InvalidName) as info:
        validate_name(name)
    assert isinstance(info.value, MetadataError) and info.value.retriable is False


def test_valid_names():
    for name in ("bookie-1", "10.0.0.1:3181", "x" * 255, "é" * 127, "ünïcode stream", "a.b"):
        assert validate_name(name) == name
    with pytest.raises(InvalidName):
        KeyLayout("bad/cluster")
    with pytest.raises(InvalidName):
        KeyLayout("c").bookie_key("", False)
    with pytest.raises(InvalidName):
        KeyLayout("c").stream_key("a\nb")


def test_enable_auth_waits_out_an_etcd_that_does_not_answer_in_time(tmp_path):
    """`standalone --etcd-auth` on a loaded machine: etcd is up but does not
    answer the auth set-up within a request's timeout (paused here for
    longer than that timeout: SIGSTOP); enable_auth asks again until etcd
    answers, then auth is on (a client without credentials is refused)."""
    import os
    import signal

    from metadata.tls import EtcdAuth

    server = ManagedEtcd(tmp_path / "etcd").start()
    try:
        os.kill(server.pid, signal.SIGSTOP)
        resume = threading.Timer(7.0, os.kill, (server.pid, signal.SIGCONT))  # the fault's length, > 5 s
        resume.start()
        try:
            server.enable_auth("root", "pw-1")
        finally:
            resume.join()
        with MetadataStore(server.endpoint, timeout=5.0, auth=EtcdAuth("root", "pw-1")) as s:
            s.put("/auth-on", b"1")
        with pytest.raises(MetadataError, match="(?i)user name is empty|auth|permission"):
            with MetadataStore(server.endpoint, timeout=5.0) as s:
                s.get("/auth-on")
        with pytest.raises(AuthenticationFailed):
            with MetadataStore(server.endpoint, timeout=5.0, auth=EtcdAuth("root", "wrong")) as s:
                s.get("/auth-on")
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.stop()
