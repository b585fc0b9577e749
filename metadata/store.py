"""A small, typed interface over etcd (through the ``etcd3`` client).

Everything the rest of bookstream needs from etcd goes through
:class:`MetadataStore`:

* single-key reads and writes with optimistic concurrency: :meth:`get`,
  :meth:`create` (create-if-absent), :meth:`cas` (write at a mod_revision),
  :meth:`delete` (optionally at a mod_revision);
* multi-key atomic writes: :meth:`txn` with :class:`Compare` conditions
  (see :func:`absent`, :func:`exists`, :func:`mod_revision_is`) and
  :class:`Put` / :class:`Delete` / :class:`Get` operations;
* paged, revision-consistent range reads (:meth:`range`, :meth:`iter_range`)
  and :meth:`count`;
* watches (:meth:`watch_prefix`, :meth:`watch_key`, the iterator form
  :meth:`watch_prefix_iter`), which resume by themselves after etcd comes
  back, and :meth:`wait_deleted`;
* leases (:meth:`lease` -> :class:`Lease`) and a :class:`KeepAlive` thread.

The values these take and give are in :mod:`metadata.txn`, the watches in
:mod:`metadata.watch`, the leases in :mod:`metadata.lease` (each name is
importable from here too).

Keys are ``str`` (UTF-8 in etcd); values are ``bytes``.  Every etcd failure
is translated into a :mod:`metadata.errors` type; connection problems all
become :class:`~metadata.errors.MetadataUnavailable` (``retriable=True``).

Cost notes (etcd 3.5; figures in bench/notes.md): an unsorted ``limit=1``
range walks etcd's in-memory index over the whole range to compute
``count``; a *sorted* (``descending``) ``limit=1`` range costs far more,
because etcd 3.5 fetches every key of the range from its backend, sorts,
then truncates.  Prefer point gets and narrow ranges on hot paths; keep
descending ranges narrow.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Iterator, Sequence

import etcd3
import etcd3.etcdrpc as rpc
import etcd3.exceptions as etcd_exc
from etcd3.client import EtcdTokenCallCredentials  # (the package's `etcd3.client` is a function)
import grpc

from metadata.errors import (
    AuthenticationFailed,
    BadVersion,
    Compacted,
    KeyExists,
    LeaseExpired,
    MetadataError,
    MetadataUnavailable,
    TxnConflict,
)
from metadata.lease import KeepAlive, Lease
from metadata.tls import EtcdAuth, TlsFiles
from metadata.txn import (  # (re-exported: the store's methods take and give them)
    Compare,
    Delete,
    Get,
    Op,
    Page,
    Put,
    TxnResult,
    Versioned,
    absent,
    created_at,
    exists,
    key_bytes,
    mod_revision_is,
    prefix_end,
)
from metadata.watch import EventType, Watch, WatchEvent, WatchStream

_log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 10_000
# Large enough for a full page of large values (etcd values are <= 1.5 MiB).
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
# Keep the reconnect backoff short so that a restarted etcd is found quickly.
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# etcd's answers to a request without valid credentials (auth on): a typed AuthenticationFailed
_AUTH_REFUSALS = ("user name is empty", "authentication failed", "invalid auth token", "permission denied",
                  "user name not found")
_UNAVAILABLE_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}


def _lease_id(lease: "Lease | int | None") -> int:
    if lease is None:
        return 0
    if isinstance(lease, Lease):
        return lease.id
    assert isinstance(lease, int) and lease >= 0, f"bad lease {lease!r}"
    return lease


# --------------------------------------------------------------------------
# The store


def _parse_endpoint(text: str) -> tuple[str, int]:
    assert isinstance(text, str) and text, "endpoint must be a non-empty str"
    t = text.strip()
    for scheme in ("http://", "https://"):
        if t.startswith(scheme):
            assert scheme == "http://", "TLS endpoints are not supported"
            t = t[len(scheme):]
    t = t.rstrip("/")
    host, sep, port = t.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint must be host:port, got {text!r}")
    host = host.strip("[]")
    assert 0 < int(port) < 65536, f"bad port in {text!r}"
    return host, int(port)


class MetadataStore:
    """A connection to etcd with a small, typed API (see the module doc).

    ``endpoints`` is ``"host:port"``, a comma-separated list of them, or a
    list.  ``timeout`` bounds every call, in seconds.  ``page_size`` is the
    default number of keys per request of the paged reads.

    Thread-safe.  Watch callbacks run on one shared watch thread: keep them
    short and never start or cancel a watch from inside one.
    """

    def __init__(self, endpoints: str | Sequence[str], timeout: float = 5.0,
                 page_size: int = DEFAULT_PAGE_SIZE, *, tls: TlsFiles | None = None,
                 auth: EtcdAuth | None = None) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        endpoints = list(endpoints)
        assert endpoints, "at least one endpoint is needed"
        assert timeout > 0, "timeout must be positive"
        assert 0 < page_size <= MAX_PAGE_SIZE, f"page_size must be in 1..{MAX_PAGE_SIZE}"
        self._timeout = float(timeout)
        self._page_size = page_size
        self._multi = len(endpoints) > 1
        # TLS (metadata/tls.py): verify etcd's certificate, present ours where etcd asks for one
        creds = tls.channel_credentials() if tls is not None else None
        eps = [etcd3.Endpoint(h, p, secure=tls is not None, creds=creds, opts=_GRPC_OPTIONS,
                              time_retry=(2 * self._timeout if self._multi else 0.0))
               for h, p in map(_parse_endpoint, endpoints)]
        self.endpoints = [ep.netloc for ep in eps]
        self._auth = auth
        try:  # with a user, the client authenticates here (and again when etcd forgets the token)
            self._client = etcd3.MultiEndpointEtcd3Client(
                endpoints=eps, timeout=self._timeout, failover=True,
                user=auth.user if auth else None, password=auth.password if auth else None)
        except grpc.RpcError as exc:
            for ep in eps:
                ep.close()
            raise self._translate(exc) from exc
        self._keepalives: set[KeepAlive] = set()
        self._ka_lock = threading.Lock()
        self._watches: set[Watch] = set()
        self._watch_lock = threading.Lock()
        self._closed = False

    # -- plumbing ---------------------------------------------------------

    def _translate(self, exc: BaseException, lease: int = 0) -> MetadataError:
        if isinstance(exc, MetadataError):
            return exc
        if isinstance(exc, grpc.RpcError):
            code, details = exc.code(), exc.details() or ""
            if any(m in details for m in _AUTH_REFUSALS):
                hint = "" if self._auth_of() else " (no etcd user given: --etcd-user / ClientConfig.etcd_auth)"
                return AuthenticationFailed(f"etcd refused the request: {details}{hint}")
            if code in _UNAVAILABLE_CODES:
                if self._multi and code != grpc.StatusCode.CANCELLED:
                    try:  # let the client fail over to another endpoint
                        self._client.endpoint_in_use.fail()
                        self._client._clear_old_stubs()
                    except Exception:  # pragma: no cover
                        pass
                return MetadataUnavailable(f"etcd {code.name}: {details}")
            if "lease not found" in details:
                return LeaseExpired(lease, f"lease {lease:#x}: {details}")
            if "compacted" in details:
                return Compacted(f"etcd: {details}")
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "too many requests" in details:
                return MetadataUnavailable(f"etcd {code.name}: {details}")
            if "no leader" in details or "leader changed" in details or "timed out" in details:
                return MetadataUnavailable(f"etcd {code.name}: {details}")
            return MetadataError(f"etcd {code.name}: {details}")
        if isinstance(exc, etcd_exc.RevisionCompactedError):
            return Compacted(f"revision compacted at {exc.compacted_revision}", exc.compacted_revision)
        if isinstance(exc, (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError,
                            etcd_exc.NoServerAvailableError, etcd_exc.WatchTimedOut)):
            return MetadataUnavailable(f"etcd unavailable: {exc.__class__.__name__}")
        if isinstance(exc, etcd_exc.Etcd3Exception):
            return MetadataError(f"etcd client error: {exc!r}")
        return MetadataError(f"unexpected etcd client error: {exc!r}")

    def _stub(self, name: str):
        assert not self._closed, "MetadataStore is closed"
        try:
            return getattr(self._client, name)
        except (etcd_exc.NoServerAvailableError, ValueError) as exc:
            raise MetadataUnavailable(f"no etcd endpoint available: {exc}") from exc

    def _auth_of(self) -> "EtcdAuth | None":
        return getattr(self, "_auth", None)

    def _unary(self, stub: str, method: str, request, lease: int = 0):
        fn = getattr(self._stub(stub), method)
        try:
            try:
                return fn(request, self._timeout, metadata=self._client.metadata)
            except grpc.RpcError as exc:
                if not self._reauthenticated(exc):
                    raise
                return fn(request, self._timeout, metadata=self._client.metadata)
        except grpc.RpcError as exc:
            raise self._translate(exc, lease) from exc

    def _reauthenticated(self, exc: grpc.RpcError) -> bool:
        """A fresh token when etcd forgot ours (tokens expire when idle, and
        an etcd restart forgets them all); True when the call may be retried."""
        if self._auth is None or "invalid auth token" not in (exc.details() or ""):
            return False
        resp = self._client.authstub.Authenticate(
            rpc.AuthenticateRequest(name=self._auth.user, password=self._auth.password), self._timeout)
        self._client.metadata = (("token", resp.token),)
        self._client.call_credentials = grpc.metadata_call_credentials(EtcdTokenCallCredentials(resp.token))
        watcher = self._client._stubs.get("watcher")
        if watcher is not None:  # the watch stream reconnects with the new token
            watcher._metadata, watcher._credentials = self._client.metadata, self._client.call_credentials
        return True

    # -- reads ------------------------------------------------------------

    def get(self, key: str, revision: int | None = None) -> Versioned | None:
        """The key's value and versions, or None.  ``revision`` reads the
        key as it was at that store revision."""
        return self.get_with_revision(key, revision)[0]

    def get_with_revision(self, key: str, revision: int | None = None) -> tuple[Versioned | None, int]:
        """Like :meth:`get`, plus the store revision the read saw."""
        assert revision is None or revision > 0
        resp = self._unary("kvstub", "Range", rpc.RangeRequest(key=key_bytes(key), revision=revision or 0))
        value = Versioned._from_kv(resp.kvs[0]) if resp.kvs else None
        return value, resp.header.revision

    def current_revision(self) -> int:
        """The store's current revision (a cheap read)."""
        return self.get_with_revision("\0")[1]

    def range(self, prefix: str, limit: int | None = None, start_after: str | None = None, *,
              keys_only: bool = False, page_size: int | None = None,
              revision: int | None = None) -> list[tuple[str, Versioned]]:
        """The keys starting with ``prefix`` (after ``start_after`` if given),
        sorted by key, at most ``limit`` of them.

        Reads page by page (``page_size`` keys per request), every page at
        the revision of the first, so the result is one consistent snapshot.
        """
        return list(self.iter_range(prefix, limit=limit, start_after=start_after, keys_only=keys_only,
                                    page_size=page_size, revision=revision))

    def range_with_revision(self, prefix: str, limit: int | None = None, start_after: str | None = None, *,
                            keys_only: bool = False, page_size: int | None = None,
                            revision: int | None = None) -> tuple[list[tuple[str, Versioned]], int]:
        """Like :meth:`range`, plus the store revision of the snapshot (watch
        from ``revision + 1`` to follow the prefix without a gap)."""
        holder: list[int] = []
        pb = key_bytes(prefix)
        items = list(self._scan(pb, prefix_end(pb), limit=limit,
                                start_after=None if start_after is None else key_bytes(start_after),
                                keys_only=keys_only, page_size=page_size, revision=revision, rev_out=holder))
        return items, (holder[0] if holder else (revision or self.current_revision()))

    def iter_range(self, prefix: str, *, limit: int | None = None, start_after: str | None = None,
                   keys_only: bool = False, page_size: int | None = None,
                   revision: int | None = None, pin: bool = True) -> Iterator[tuple[str, Versioned]]:
        """Generator form of :meth:`range` (fetches pages lazily).  Without
        ``revision``, every page is read at the first page's revision; with
        ``pin=False`` each at the then current one instead (a scan that may
        outlast etcd's compaction retention: a page at a compacted revision
        fails)."""
        pb = key_bytes(prefix)
        return self._scan(pb, prefix_end(pb), limit=limit,
                          start_after=None if start_after is None else key_bytes(start_after),
                          keys_only=keys_only, page_size=page_size, revision=revision, pin=pin)

    def iter_key_range(self, start: str, end: str | bytes, *, limit: int | None = None,
                       keys_only: bool = False, page_size: int | None = None,
                       revision: int | None = None) -> Iterator[tuple[str, Versioned]]:
        """The keys in ``[start, end)``, ascending, paged like :meth:`range`."""
        end_b = end if isinstance(end, bytes) else key_bytes(end)
        return self._scan(key_bytes(start), end_b, limit=limit, start_after=None, keys_only=keys_only,
                          page_size=page_size, revision=revision)

    def _scan(self, start: bytes, end: bytes, *, limit: int | None, start_after: bytes | None,
              keys_only: bool, page_size: int | None, revision: int | None,
              rev_out: list[int] | None = None, pin: bool = True) -> Iterator[tuple[str, Versioned]]:
        page = self._page_size if page_size is None else page_size
        assert 0 < page <= MAX_PAGE_SIZE, f"page_size must be in 1..{MAX_PAGE_SIZE}"
        assert limit is None or limit >= 0
        assert revision is None or revision > 0
        if start_after is not None and start_after + b"\0" > start:
            start = start_after + b"\0"
        remaining = limit
        rev = revision or 0
        # A bounded loop: every page advances `start` past at least one key.
        while remaining is None or remaining > 0:
            if end != b"\0" and start >= end:
                return
            n = page if remaining is None else min(page, remaining)
            resp = self._unary("kvstub", "Range", rpc.RangeRequest(
                key=start, range_end=end, limit=n, revision=rev, keys_only=keys_only))
            if not rev and pin:
                rev = resp.header.revision
            if rev_out is not None and not rev_out:
                rev_out.append(rev)
            for kv in resp.kvs:
                yield bytes(kv.key).decode("utf-8"), Versioned._from_kv(kv)
            if remaining is not None:
                remaining -= len(resp.kvs)
            if not resp.more or not resp.kvs:
                return
            assert bytes(resp.kvs[-1].key) >= start
            start = bytes(resp.kvs[-1].key) + b"\0"

    def count(self, prefix: str) -> int:
        """The number of keys starting with ``prefix`` (count_only)."""
        pb = key_bytes(prefix)
        resp = self._unary("kvstub", "Range", rpc.RangeRequest(key=pb, range_end=prefix_end(pb), count_only=True))
        return resp.count

    def count_range(self, start: str, end: str | bytes, revision: int | None = None) -> int:
        """The number of keys in ``[start, end)`` (count_only)."""
        end_b = end if isinstance(end, bytes) else key_bytes(end)
        resp = self._unary("kvstub", "Range", rpc.RangeRequest(key=key_bytes(start), range_end=end_b,
                                                                 count_only=True, revision=revision or 0))
        return resp.count

    # -- writes -----------------------------------------------------------

    def put(self, key: str, value: bytes, lease: "Lease | int | None" = None) -> int:
        """Unconditional write; returns the new mod_revision."""
        lid = _lease_id(lease)
        assert isinstance(value, bytes), "values are bytes"
        resp = self._unary("kvstub", "Put", rpc.PutRequest(key=key_bytes(key), value=value, lease=lid), lid)
        return resp.header.revision

    def create(self, key: str, value: bytes, lease: "Lease | int | None" = None) -> int:
        """Create ``key`` if it does not exist; returns its mod_revision.
        Raises ``KeyExists`` (with the current value) otherwise."""
        try:
            return self.txn([absent(key)], [Put(key, value, _lease_id(lease))]).revision
        except TxnConflict as c:
            raise KeyExists(key, c.current.get(key)) from None

    def cas(self, key: str, value: bytes, mod_revision: int, lease: "Lease | int | None" = None) -> int:
        """Write ``key`` only if its mod_revision is ``mod_revision``; returns
        the new mod_revision.  Raises ``BadVersion`` (with the current value,
        or None if the key is gone) otherwise."""
        try:
            return self.txn([mod_revision_is(key, mod_revision)], [Put(key, value, _lease_id(lease))]).revision
        except TxnConflict as c:
            raise BadVersion(key, mod_revision, c.current.get(key)) from None

    def delete(self, key: str, mod_revision: int | None = None) -> bool:
        """Delete ``key``; returns whether it existed.  With
        ``mod_revision``, only at that version (else ``BadVersion``)."""
        if mod_revision is None:
            resp = self._unary("kvstub", "DeleteRange", rpc.DeleteRangeRequest(key=key_bytes(key)))
            return resp.deleted > 0
        try:
            result = self.txn([mod_revision_is(key, mod_revision)], [Delete(key)])
        except TxnConflict as c:
            raise BadVersion(key, mod_revision, c.current.get(key)) from None
        assert result.results[0] == 1
        return True

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        """Apply ``ops`` atomically if every compare holds.

        Returns a :class:`TxnResult`.  If a compare fails, nothing is written
        and ``TxnConflict`` is raised, whose ``current`` maps each compared
        key to its value at that moment (read in the same transaction).

        etcd rules: a txn may not touch the same key twice (a Put and a
        Delete range that covers it included), and has at most 128 ops
        (``--max-txn-ops``).  With no compares, a txn of Gets is an atomic
        multi-key snapshot read.
        """
        compares = list(compares)
        ops = list(ops)
        assert all(isinstance(c, Compare) for c in compares), "compares must be Compare"
        assert all(isinstance(o, (Put, Delete, Get)) for o in ops), "ops must be Put, Delete or Get"
        assert len(ops) <= 128, "etcd allows at most 128 ops per txn"
        cmp_keys = list(dict.fromkeys(c.key for c in compares))
        success = [o._pb() if not isinstance(o, Get) else rpc.RequestOp(request_range=o._pb()) for o in ops]
        failure = [rpc.RequestOp(request_range=rpc.RangeRequest(key=key_bytes(k))) for k in cmp_keys]
        lease = next((o.lease for o in ops if isinstance(o, Put) and o.lease), 0)
        resp = self._unary("kvstub", "Txn", rpc.TxnRequest(
            compare=[c._pb() for c in compares], success=success, failure=failure), lease)
        if not resp.succeeded:
            current: dict[str, Versioned | None] = {}
            for k, r in zip(cmp_keys, resp.responses):
                kvs = r.response_range.kvs
                current[k] = Versioned._from_kv(kvs[0]) if kvs else None
            raise TxnConflict(current)
        results: list = []
        for op, r in zip(ops, resp.responses):
            if isinstance(op, Put):
                results.append(None)
            elif isinstance(op, Delete):
                results.append(r.response_delete_range.deleted)
            else:
                rr = r.response_range
                results.append(Page([(bytes(kv.key).decode("utf-8"), Versioned._from_kv(kv)) for kv in rr.kvs],
                                    rr.more))
        return TxnResult(resp.header.revision, tuple(results))

    def read(self, gets: Sequence[Get], revision: int | None = None) -> tuple[list[Page], int]:
        """Several reads at one revision: ``(pages, revision)``.

        Without ``revision`` this is one read-only txn; with it, each Get is
        read at that revision.
        """
        gets = list(gets)
        assert gets and all(isinstance(g, Get) for g in gets)
        if revision is None:
            result = self.txn([], gets)
            return list(result.results), result.revision
        pages = []
        for g in gets:
            resp = self._unary("kvstub", "Range", g._pb(revision))
            pages.append(Page([(bytes(kv.key).decode("utf-8"), Versioned._from_kv(kv)) for kv in resp.kvs],
                              resp.more))
        return pages, revision

    def compact(self, revision: int) -> None:
        """Discard etcd's history before ``revision`` (etcd also does it by
        itself: ``--auto-compaction-*``).  Reads at, and watches from, an
        older revision then fail with ``Compacted``."""
        assert isinstance(revision, int) and revision > 0
        self._unary("kvstub", "Compact", rpc.CompactionRequest(revision=revision))

    # -- watches ----------------------------------------------------------

    def watch_prefix(self, prefix: str, callback: Callable[[WatchEvent], None], *,
                     start_revision: int | None = None,
                     on_error: Callable[[MetadataError], None] | None = None) -> Callable[[], None]:
        """Call ``callback(event)`` for every change under ``prefix``, in
        revision order, from now (or from ``start_revision``).

        Returns a ``cancel()`` function.  If etcd goes away (a restart, a
        dropped connection), the watch resumes by itself once etcd is back,
        from the revision after the last event delivered: no event is lost
        or delivered twice.  If it cannot resume, ``on_error(error)`` is
        called once and no more events come: ``Compacted`` when etcd's
        history no longer reaches back to that revision (re-read, then watch
        from the revision of the read + 1), ``MetadataUnavailable`` when the
        store was closed.
        """
        pb = key_bytes(prefix)
        return self._watch(pb, prefix_end(pb), callback, start_revision, on_error)

    def watch_key(self, key: str, callback: Callable[[WatchEvent], None], *,
                  start_revision: int | None = None,
                  on_error: Callable[[MetadataError], None] | None = None) -> Callable[[], None]:
        """Like :meth:`watch_prefix`, for one key."""
        return self._watch(key_bytes(key), None, callback, start_revision, on_error)

    def watch_prefix_iter(self, prefix: str, *, start_revision: int | None = None) -> WatchStream:
        """Iterator form of :meth:`watch_prefix`: a :class:`WatchStream`."""
        stream = WatchStream()
        stream._cancel = self.watch_prefix(prefix, stream._on_event, start_revision=start_revision,
                                           on_error=stream._on_error)
        return stream

    def _watch(self, key: bytes, range_end: bytes | None, callback: Callable[[WatchEvent], None],
               start_revision: int | None, on_error: Callable[[MetadataError], None] | None) -> Callable[[], None]:
        assert callable(callback)
        assert start_revision is None or start_revision > 0
        assert not self._closed, "MetadataStore is closed"
        # "From now" is pinned to a revision, so that a resume knows where
        # the watch started when no event came before etcd went away.
        first = start_revision if start_revision is not None else self.current_revision() + 1
        watch = Watch(self, key, range_end, callback, on_error, first)
        with self._watch_lock:
            self._watches.add(watch)
        try:
            watch.start()
        except BaseException:
            self._forget_watch(watch)
            raise
        return watch.cancel

    def _add_watch(self, key: bytes, callback: Callable, range_end: bytes | None, start_revision: int) -> int:
        """Creates one etcd3 watch (which ends when its stream breaks);
        returns its id.  Errors translated."""
        kwargs = {"start_revision": start_revision}
        if range_end is not None:
            kwargs["range_end"] = range_end
        if self._closed:
            raise MetadataUnavailable("the store is closed")
        try:
            return self._client.add_watch_callback(key, callback, **kwargs)
        except Exception as exc:
            raise self._translate(exc) from exc

    def _cancel_watch(self, watch_id: int | None) -> None:
        if watch_id is None or self._closed:
            return
        try:
            self._client.cancel_watch(watch_id)
        except Exception as exc:  # the watch is gone with its stream anyway
            _log.debug("cancel_watch failed: %r", exc)

    def _forget_watch(self, watch: Watch) -> None:
        with self._watch_lock:
            self._watches.discard(watch)

    def wait_deleted(self, key: str, timeout: float) -> bool:
        """Wait until ``key`` does not exist; True if so within ``timeout``.
        Uses a watch from the revision that saw the key, so no delete can be
        missed."""
        assert timeout >= 0
        current, rev = self.get_with_revision(key)
        if current is None:
            return True
        done = threading.Event()
        errors: list[MetadataError] = []

        def on_event(ev: WatchEvent) -> None:
            if ev.type is EventType.DELETE:
                done.set()

        def on_error(err: MetadataError) -> None:
            errors.append(err)
            done.set()

        cancel = self.watch_key(key, on_event, start_revision=rev + 1, on_error=on_error)
        try:
            ok = done.wait(timeout)
        finally:
            cancel()
        if errors:
            raise errors[0]
        if not ok:
            # The watch waits out an etcd outage; a read tells the timeout
            # of a key still there from etcd being away (MetadataUnavailable).
            return self.get(key) is None
        return True

    # -- leases -----------------------------------------------------------

    def lease(self, ttl: int) -> Lease:
        """Grant a lease of ``ttl`` seconds (etcd may raise it to its minimum)."""
        assert isinstance(ttl, int) and ttl >= 1, "ttl must be an int >= 1 (seconds)"
        resp = self._unary("leasestub", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl))
        if resp.error:
            raise MetadataError(f"lease grant failed: {resp.error}")
        return Lease(self, resp.ID, resp.TTL)

    def _lease_refresh(self, lease_id: int) -> int:
        stub = self._stub("leasestub")
        responses = None
        try:
            responses = stub.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), self._timeout,
                                            metadata=self._client.metadata)
            resp = next(iter(responses), None)
        except grpc.RpcError as exc:
            try:
                if self._reauthenticated(exc):  # the keeper refreshes again soon, with the new token
                    raise MetadataUnavailable("etcd auth token renewed; refresh again") from exc
            except grpc.RpcError as again:
                raise self._translate(again, lease_id) from exc
            raise self._translate(exc, lease_id) from exc
        finally:
            if responses is not None:
                responses.cancel()  # one request, one response: end the stream
        if resp is None:
            raise MetadataUnavailable("lease keep-alive stream closed without a response")
        if resp.TTL <= 0:
            raise LeaseExpired(lease_id)
        return resp.TTL

    def _lease_revoke(self, lease_id: int) -> bool:
        try:
            self._unary("leasestub", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id), lease_id)
        except LeaseExpired:
            return False
        return True

    def _lease_ttl(self, lease_id: int) -> int:
        resp = self._unary("leasestub", "LeaseTimeToLive", rpc.LeaseTimeToLiveRequest(ID=lease_id), lease_id)
        return resp.TTL

    def _register_keepalive(self, ka: KeepAlive) -> None:
        with self._ka_lock:
            self._keepalives.add(ka)

    def _unregister_keepalive(self, ka: KeepAlive) -> None:
        with self._ka_lock:
            self._keepalives.discard(ka)

    # -- lifecycle --------------------------------------------------------

    def close(self) -> None:
        """Stop the keep-alives started on this store and close the
        connection (watches end, through their ``on_error``).  Idempotent."""
        if self._closed:
            return
        with self._ka_lock:
            kas = list(self._keepalives)
        for ka in kas:
            ka.stop()
        self._closed = True
        with self._watch_lock:
            watches = list(self._watches)
        for w in watches:
            w._wake.set()  # a resume waiting out a backoff ends now (on_error)
        self._client.close()

    def __enter__(self) -> "MetadataStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MetadataStore({','.join(self.endpoints)})"


__all__ = [
    "DEFAULT_PAGE_SIZE", "Versioned", "Compare", "absent", "exists", "mod_revision_is", "Put", "Delete", "Get",
    "Op", "Page", "TxnResult", "EventType", "WatchEvent", "WatchStream", "Lease", "KeepAlive", "MetadataStore",
    "prefix_end", "KeyExists", "BadVersion", "TxnConflict",
]
