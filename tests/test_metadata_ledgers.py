"""LedgerStore and ledger id allocation, against a real etcd."""
from __future__ import annotations

import random
import threading

import pytest

from bookstream_pb import metadata_pb2 as pb
from metadata.errors import (
    BadVersion,
    CorruptMetadata,
    InvalidLedgerConfig,
    InvalidName,
    NoFragment,
    NoSuchLedger,
)
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState, LedgerStore
from metadata.store import MetadataStore

E3 = ("b1", "b2", "b3")


def _new(ls: LedgerStore, **kw) -> tuple[LedgerMetadata, int]:
    return ls.create(LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2, **kw), E3)


def _count_kvs(store: MetadataStore) -> list[int]:
    """Instrument ``store`` to record how many key-values each request
    returned (so tests can check that reads fetch only what they need)."""
    fetched: list[int] = []
    real = store._unary

    def counting(stub, method, request, lease=0):
        resp = real(stub, method, request, lease)
        if method == "Range":
            fetched.append(len(resp.kvs))
        elif method == "Txn":
            fetched.append(sum(len(r.response_range.kvs) for r in resp.responses))
        return resp

    store._unary = counting
    return fetched


# -- ids ---------------------------------------------------------------------------


def test_ledger_ids_are_unique_under_concurrency(etcd_server, cluster):
    per_thread, threads_per_client = 40, 4
    stores = [MetadataStore(etcd_server.endpoint) for _ in range(2)]
    ids: list[int] = []
    created: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(2 * threads_per_client)

    def worker(s: MetadataStore, n: int) -> None:
        ls = LedgerStore(s, cluster)
        try:
            start.wait()
            mine = [ls.allocate_id() for _ in range(n)]
            made = [_new(ls)[0].ledger_id for _ in range(5)]
            with lock:
                ids.extend(mine)
                created.extend(made)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s, per_thread)) for s in stores
               for _ in range(threads_per_client)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for s in stores:
            s.close()
    assert not errors, errors
    assert len(ids) == 2 * threads_per_client * per_thread
    assert len(set(ids + created)) == len(ids) + len(created), "every id is allocated once"
    assert all(0 < i < 2**63 for i in ids)
    with MetadataStore(etcd_server.endpoint) as s:
        listed = list(LedgerStore(s, cluster).list_ledgers(page_size=3))
    assert listed == sorted(created)


# -- create / read -------------------------------------------------------------------


def test_create_and_read(store, cluster):
    ls = LedgerStore(store, cluster)
    meta, rev = ls.create(LedgerMetadata(ensemble_size=3, write_quorum=3, ack_quorum=2, mode=LedgerMode.UNBOUNDED,
                                         custom={"owner": "test"}, fragment_size_entries=1000), E3)
    assert meta.ledger_id is not None and rev > 0
    assert meta.state is LedgerState.OPEN and meta.last_entry == -1 and meta.ctime_ms > 0
    assert meta.fragments == (Fragment(0, E3),) and meta.fragment_count == 1
    read, rrev = ls.read(meta.ledger_id)
    assert (read, rrev) == (meta, rev)
    assert read.ensemble_at(0) == E3 and read.ensemble_at(10**12) == E3
    assert read.last_fragment == Fragment(0, E3)
    # The stored protobufs are what other components will read.
    raw = pb.LedgerHeader.FromString(store.get(ls.layout.ledger_header_key(meta.ledger_id)).value)
    assert (raw.ensemble_size, raw.write_quorum, raw.ack_quorum, raw.mode) == (3, 3, 2, pb.UNBOUNDED)
    assert raw.custom["owner"] == "test" and raw.fragment_count == 1
    assert ls.exists(meta.ledger_id)
    with pytest.raises(NoSuchLedger):
        ls.read(meta.ledger_id + 10**9)


@pytest.mark.parametrize("e,qw,qa", [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0), (3, 2, -1)])
def test_invalid_configs_are_rejected(store, cluster, e, qw, qa):
    ls = LedgerStore(store, cluster)
    with pytest.raises(InvalidLedgerConfig) as info:
        ls.create(LedgerMetadata(ensemble_size=e, write_quorum=qw, ack_quorum=qa), ["b1", "b2", "b3"][:max(e, 0)])
    assert info.value.retriable is False
    assert store.count(ls.layout.root) == 0, "nothing was written"


def test_invalid_ensembles_and_headers_are_rejected(store, cluster):
    ls = LedgerStore(store, cluster)
    cfg = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2)
    with pytest.raises(InvalidLedgerConfig):
        ls.create(cfg, ["b1", "b2"])
    with pytest.raises(InvalidLedgerConfig):
        ls.create(cfg, ["b1", "b1", "b2"])
    with pytest.raises(InvalidName):
        ls.create(cfg, ["b1", "b/2", "b3"])
    with pytest.raises(InvalidLedgerConfig):
        ls.create(cfg.with_(ledger_id=5), E3)
    with pytest.raises(InvalidLedgerConfig):
        ls.create(cfg.with_(state=LedgerState.CLOSED), E3)
    meta, rev = ls.create(cfg, E3)
    with pytest.raises(InvalidLedgerConfig):
        ls.add_fragment(meta.ledger_id, Fragment(5, ("b1", "b4")), meta, rev)
    with pytest.raises(InvalidLedgerConfig):
        ls.update_header(meta.with_(write_quorum=4), rev)
    assert ls.read(meta.ledger_id) == (meta, rev)


# -- updates -----------------------------------------------------------------------


def test_update_header_is_a_cas(store, cluster):
    ls = LedgerStore(store, cluster)
    meta, rev = _new(ls)
    closed = meta.with_(state=LedgerState.CLOSED, last_entry=41)
    rev2 = ls.update_header(closed, rev)
    assert rev2 > rev
    assert ls.read(meta.ledger_id) == (closed, rev2)
    with pytest.raises(BadVersion) as info:
        ls.update_header(meta.with_(state=LedgerState.IN_RECOVERY), rev)
    assert info.value.current is not None and info.value.current.mod_revision == rev2
    assert ls.delete(meta.ledger_id)
    with pytest.raises(NoSuchLedger):
        ls.update_header(closed, rev2)


def test_add_fragment_appends_and_replaces(store, cluster):
    ls = LedgerStore(store, cluster)
    meta, rev = _new(ls)
    lid = meta.ledger_id
    f10 = Fragment(10, ("b4", "b2", "b3"))
    meta, rev = ls.add_fragment(lid, f10, meta, rev)
    assert (meta.fragment_count, meta.last_fragment_first_entry) == (2, 10)
    assert ls.read(lid) == (meta, rev)
    assert meta.ensemble_at(9) == E3 and meta.ensemble_at(10) == f10.ensemble
    # Same first entry as the current last fragment: it is replaced.
    f10b = Fragment(10, ("b5", "b2", "b3"))
    meta, rev = ls.add_fragment(lid, f10b, meta, rev)
    read, _ = ls.read(lid)
    assert read.fragments == (Fragment(0, E3), f10b) and read.fragment_count == 2
    # A stale header revision loses.
    with pytest.raises(BadVersion):
        ls.add_fragment(lid, Fragment(20, E3), meta, rev - 1)
    assert ls.read(lid)[0].fragment_count == 2
    # Re-replication replaces an older fragment; it must exist.
    f0 = Fragment(0, ("b6", "b2", "b3"))
    meta, rev = ls.add_fragment(lid, f0, meta, rev)
    assert ls.read(lid)[0].fragments == (f0, f10b)
    with pytest.raises(NoFragment):
        ls.add_fragment(lid, Fragment(5, E3), meta, rev)
    # Recovery publishes an ensemble change with its final CAS.
    closed = meta.with_(state=LedgerState.CLOSED, last_entry=30)
    meta, rev = ls.add_fragments(lid, [Fragment(25, E3), Fragment(28, ("b7", "b2", "b3"))], closed, rev)
    read, rrev = ls.read(lid)
    assert (read, rrev) == (meta, rev)
    assert read.state is LedgerState.CLOSED and read.last_entry == 30
    assert [f.first_entry for f in read.fragments] == [0, 10, 25, 28] and read.fragment_count == 4


def test_trim_removes_fragments_wholly_below(store, cluster):
    ls = LedgerStore(store, cluster)
    meta, rev = _new(ls)
    lid = meta.ledger_id
    for first in (10, 20, 30):
        meta, rev = ls.add_fragment(lid, Fragment(first, (f"x{first}", "b2", "b3")), meta, rev)
    with pytest.raises(BadVersion):
        ls.remove_fragments_before(lid, 25, meta, rev - 1)
    meta, rev = ls.remove_fragments_before(lid, 25, meta, rev)
    read, rrev = ls.read(lid)
    assert (read, rrev) == (meta, rev)
    assert [f.first_entry for f in read.fragments] == [20, 30]
    assert read.fragment_count == 2 and read.trimmed_before == 25
    assert read.ensemble_at(22) == ("x20", "b2", "b3")
    assert store.count(ls.layout.fragments_prefix(lid)) == 2
    with pytest.raises(NoFragment):
        read.ensemble_at(15)
    with pytest.raises(NoFragment):
        ls.fragment_for(lid, 15)
    # Trimming at a lower position neither deletes nor lowers trimmed_before.
    meta, rev = ls.remove_fragments_before(lid, 5, meta, rev)
    assert ls.read(lid)[0].trimmed_before == 25 and meta.fragment_count == 2
    # Trimming past the newest fragment keeps it.
    meta, rev = ls.remove_fragments_before(lid, 10**6, meta, rev)
    read, _ = ls.read(lid)
    assert [f.first_entry for f in read.fragments] == [30] and read.trimmed_before == 10**6


def test_delete(store, cluster):
    ls = LedgerStore(store, cluster)
    meta, rev = _new(ls)
    other, _ = _new(ls)
    meta, rev = ls.add_fragment(meta.ledger_id, Fragment(10, E3), meta, rev)
    with pytest.raises(BadVersion):
        ls.delete(meta.ledger_id, expected_header_revision=rev - 1)
    assert ls.delete(meta.ledger_id, expected_header_revision=rev) is True
    assert store.count(ls.layout.ledger_prefix(meta.ledger_id)) == 0
    with pytest.raises(NoSuchLedger):
        ls.read(meta.ledger_id)
    assert ls.delete(meta.ledger_id) is False
    with pytest.raises(NoSuchLedger):
        ls.delete(meta.ledger_id, expected_header_revision=rev)
    assert list(ls.list_ledgers()) == [other.ledger_id]


def test_named_bookies_is_one_scan(store, cluster):
    """Every ledger with the bookies its fragments name, in id order, from
    pages of keys that cut ledgers apart (page size 2: a header and its
    first fragment); at a revision, a change after it is not seen; without
    one, each page is read at the current revision; a ledger deleted before
    is gone; ``naming`` asks it for one bookie."""
    ls = LedgerStore(store, cluster)
    a, arev = _new(ls)
    b, _ = _new(ls)
    gone, _ = _new(ls)
    ls.add_fragments(a.ledger_id, [Fragment(10, ("b4", "b2", "b3")), Fragment(20, ("b4", "b5", "b3"))], a, arev)
    ls.delete(gone.ledger_id)
    rev = store.current_revision()
    fetched = _count_kvs(store)
    want = [(a.ledger_id, frozenset({"b1", "b2", "b3", "b4", "b5"})), (b.ledger_id, frozenset(E3))]
    assert list(ls.named_bookies(page_size=2)) == want
    assert fetched == [2, 2, 2]                          # a's 4 keys, b's 2: three pages, never a ledger a request
    meta, brev = ls.read(b.ledger_id)
    ls.add_fragment(b.ledger_id, Fragment(5, ("b6", "b2", "b3")), meta, brev)
    assert list(ls.named_bookies(revision=rev, page_size=2)) == want
    assert ls.naming("b6") == [b.ledger_id] and ls.naming("b6", revision=rev) == []
    scan = ls.named_bookies(page_size=2)                # without a revision, each page at the current one:
    assert next(scan)[0] == a.ledger_id                 # (a's keys read: b's not yet)
    meta, brev = ls.read(b.ledger_id)
    ls.add_fragment(b.ledger_id, Fragment(8, ("b7", "b2", "b3")), meta, brev)
    assert next(scan) == (b.ledger_id, frozenset({"b1", "b2", "b3", "b6", "b7"}))   # a long scan never reads a
    assert next(scan, None) is None                                                   # compacted revision
    assert ls.naming("b4") == [a.ledger_id] and ls.naming("b1") == [a.ledger_id, b.ledger_id]


# -- big ledgers -------------------------------------------------------------------


def test_many_fragments_read_last_and_fragment_for(etcd_server, cluster):
    with MetadataStore(etcd_server.endpoint, page_size=64) as store:
        ls = LedgerStore(store, cluster)
        meta, rev = _new(ls)
        lid = meta.ledger_id
        rng = random.Random(1234)
        first = 0
        for i in range(300):
            first += rng.choice([1, 2, 7, 50, 1000])
            meta, rev = ls.add_fragment(lid, Fragment(first, (f"n{i}", "b2", "b3")), meta, rev)
        small, _ = _new(ls)
        full, frev = ls.read(lid)
        assert (full, frev) == (meta, rev) and len(full.fragments) == 301 and full.fragments_complete

        fetched = _count_kvs(store)
        last, lrev = ls.read(lid, fragments="last")
        assert lrev == rev and last.fragments == (full.fragments[-1],) and not last.fragments_complete
        assert last.ensemble_at(first + 5) == full.ensemble_at(first + 5)
        with pytest.raises(NoFragment):
            last.ensemble_at(0)
        assert sum(fetched) == 2, f"header + one fragment, fetched {fetched}"

        probes = [0, 1, first, first + 10**9]
        probes += [f.first_entry for f in rng.sample(full.fragments, 20)]
        probes += [f.first_entry - 1 for f in rng.sample(full.fragments[1:], 20)]
        probes += [rng.randrange(first) for _ in range(20)]
        for entry in probes:
            fetched.clear()
            assert ls.fragment_for(lid, entry) == full.fragment_at(entry), entry
            assert sum(fetched) <= 3 and len(fetched) <= 8, (entry, fetched)

        assert list(ls.list_ledgers(page_size=5)) == [lid, small.ledger_id]

        meta2, _ = ls.remove_fragments_before(lid, full.fragments[150].first_entry + 1, full, rev)
        read2, _ = ls.read(lid)
        assert read2 == meta2 and read2.fragments == full.fragments[150:]


def test_corrupt_header_is_reported(store, cluster):
    ls = LedgerStore(store, cluster)
    meta, rev = _new(ls)
    bad = meta.to_header()
    bad.write_quorum = 5
    store.cas(ls.layout.ledger_header_key(meta.ledger_id), bad.SerializeToString(), rev)
    with pytest.raises(CorruptMetadata):
        ls.read(meta.ledger_id)
    store.put(ls.layout.ledger_header_key(meta.ledger_id), b"\xff\xff not a protobuf")
    with pytest.raises(CorruptMetadata):
        ls.read(meta.ledger_id, fragments="last")


def test_fragment_span_gives_the_covering_fragment_and_where_it_ends(store, cluster):
    from metadata.ledgers import Fragment, LedgerMetadata, LedgerStore

    ls = LedgerStore(store, cluster)
    meta, rev = ls.create(LedgerMetadata(3, 3, 2), ("a", "b", "c"))
    lid = meta.ledger_id
    for first in (10, 25, 40):
        meta, rev = ls.add_fragment(lid, Fragment(first, ("a", "b", "d")), meta, rev)
    assert ls.fragment_span(lid, 0) == (Fragment(0, ("a", "b", "c")), 10)
    assert ls.fragment_span(lid, 24) == (Fragment(10, ("a", "b", "d")), 25)
    assert ls.fragment_span(lid, 39)[1] == 40
    assert ls.fragment_span(lid, 1000) == (Fragment(40, ("a", "b", "d")), None)
