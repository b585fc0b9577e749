"""The classic-ledger client: ``BookKeeperClient`` (asyncio) and
``SyncBookKeeperClient`` (the same methods, blocking, over a background
event-loop thread: :mod:`stream.sync_client`, importable from here).

    async with BookKeeperClient("127.0.0.1:2379", "default") as bk:
        async with await bk.create_ledger(3, 2, 2) as lh:
            eid = await lh.add_entry(b"hello")
        rh = await bk.open_ledger(lh.ledger_id, recovery=False)
        entries = await rh.read_entries(0, rh.last_add_confirmed)

Metadata calls (etcd, blocking) run in worker threads; bookie calls go over
one ``BookieClient`` per bookie, shared by every handle of the client.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
import weakref
from typing import Any, Callable, Iterable

from bookie.entry import HEADER_SIZE
from bookie.server import MAX_MESSAGE_BYTES
from bookie.storage import StorageConfig
from bookstream_pb import metadata_pb2 as mpb
from metadata.ledgers import LedgerMetadata, LedgerMode, LedgerState, LedgerStore, validate_config
from metadata.registration import BookieRegistry, MembershipChange
from metadata import errors as me
from metadata.store import MetadataStore
from stream import errors as err
from stream.bookie_client import BookieClient, BookieUnavailable
from stream.mutations import NONE as NO_MUTATIONS
from stream.mutations import Mutations
from stream.ledger import LedgerHandle, read_lac_covering, recover_ledger
from stream import password as ledger_password
from stream.metrics import ClientMetrics
from stream.placement import BookieHealth, PlacementPolicy, choose_with_fallback, get_policy, rejoined_after

log = logging.getLogger(__name__)

# A bookie that published no limit (an older one) has the bookies' default.
DEFAULT_MAX_ENTRY_SIZE = StorageConfig.max_entry_size
# Whatever the bookies say, one entry must fit one gRPC message with its header.
WIRE_MAX_ENTRY_SIZE = MAX_MESSAGE_BYTES - HEADER_SIZE - 1024


def _entry_limit(regs) -> int:
    """The largest payload every registered bookie accepts."""
    limits = [r.max_entry_size or DEFAULT_MAX_ENTRY_SIZE for r in regs]
    return min([WIRE_MAX_ENTRY_SIZE, *limits]) if limits else min(WIRE_MAX_ENTRY_SIZE, DEFAULT_MAX_ENTRY_SIZE)


@dataclasses.dataclass
class ClientConfig:
    add_timeout: float = 10.0              # a bookie that does not ack a frame by then has failed
    read_timeout: float = 5.0              # per read RPC
    speculative_read_timeout: float = 0.1  # ask another replica after this
    max_pending_adds: int = 10_000         # the writer's window
    explicit_lac_delay: float = 0.005      # adds quiet this long: tell the ensemble the LAC (a journalled RPC)
    read_concurrency: int = 64             # per handle, entry-by-entry reads in flight
    recovery_attempts: int = 3             # recovery runs that may abort (then LedgerRecoveryFailed)
    metadata_attempts: int = 10            # CAS retries
    metadata_timeout: float = 5.0
    failure_half_life: float = 10.0        # a failed bookie's score halves this often (placement avoids it)
    change_retry_max: float = 5.0          # a held or deferred ensemble change is retried at most this far apart
    placement: str = "random"
    mutations: Mutations = NO_MUTATIONS    # broken protocol rules, tests only (stream/mutations.py)
    watch_registrations: bool = True       # a writer changes its ensemble when a bookie's registration goes
    writer_lease_ttl: int = 10             # a stream writer's lease-bound registration (stream/writer_lease.py)
    metrics: Any = None                    # a stream.metrics.ClientMetrics; default: ClientMetrics.default()
    tls: Any = None                        # metadata.tls.TlsFiles: TLS to the bookies (ca verifies them; cert+key: mTLS)
    read_port: bool = True                 # range reads over the bookies' read ports where registered (not with tls)
    etcd_tls: Any = None                   # metadata.tls.TlsFiles: TLS to etcd
    etcd_auth: Any = None                  # metadata.tls.EtcdAuth: etcd user and password
    trace_path: str = ""                   # write the protocol steps here (NDJSON, stream/tracing.py): tests only
    trace_name: str = ""                   # this client's actor name in the trace (default c<pid>)

    def __post_init__(self) -> None:
        for name in ("add_timeout", "read_timeout", "speculative_read_timeout", "explicit_lac_delay",
                     "metadata_timeout", "failure_half_life", "change_retry_max"):
            v = getattr(self, name)
            zero_ok = name in ("speculative_read_timeout", "explicit_lac_delay")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 if zero_ok else v > 0):
                raise err.InvalidLedgerConfig(f"ClientConfig.{name} must be a {'non-negative' if zero_ok else 'positive'}"
                                              f" number of seconds, got {v!r}")
        for name in ("max_pending_adds", "read_concurrency", "recovery_attempts", "metadata_attempts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise err.InvalidLedgerConfig(f"ClientConfig.{name} must be an int >= 1, got {v!r}")
        v = self.writer_lease_ttl
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise err.InvalidLedgerConfig(f"ClientConfig.writer_lease_ttl must be an int >= 1 (seconds), got {v!r}")
        get_policy(self.placement)  # InvalidLedgerConfig for an unknown one


def _endpoints(etcd_endpoints) -> list[str]:
    """The etcd endpoints as a list; InvalidLedgerConfig for none or a bad one."""
    eps = etcd_endpoints.split(",") if isinstance(etcd_endpoints, str) else etcd_endpoints
    try:
        eps = [e.strip() for e in eps]
    except TypeError:
        raise err.InvalidLedgerConfig(f"etcd endpoints must be 'host:port[,host:port...]', "
                                      f"got {etcd_endpoints!r}") from None
    if not eps or not all(isinstance(e, str) and e for e in eps):
        raise err.InvalidLedgerConfig(f"etcd endpoints must be 'host:port[,host:port...]', got {etcd_endpoints!r}")
    return eps


class BookKeeperClient:
    def __init__(self, etcd_endpoints: str | list[str], cluster: str = "default",
                 config: ClientConfig | None = None, *, store: MetadataStore | None = None, **overrides):
        try:
            self.config = dataclasses.replace(config or ClientConfig(), **overrides)
        except TypeError as e:  # an unknown override
            raise err.InvalidLedgerConfig(str(e)) from None
        if not isinstance(cluster, str) or not cluster:
            raise err.InvalidLedgerConfig(f"cluster must be a non-empty name, got {cluster!r}")
        self.cluster = cluster
        self._own_store = store is None
        try:
            self.store = store or MetadataStore(_endpoints(etcd_endpoints), timeout=self.config.metadata_timeout,
                                                tls=self.config.etcd_tls, auth=self.config.etcd_auth)
        except me.MetadataError as e:  # AuthenticationFailed, MetadataUnavailable: the stream.errors type
            raise err.translate(e) from None
        self.ledgers = LedgerStore(self.store, cluster)
        self.registry = BookieRegistry(self.store, cluster)
        self.placement = get_policy(self.config.placement)
        self._addresses: dict[str, tuple[str, str]] = {}   # bookie id: (address, read port's address)
        self._registered_at: dict[str, int] = {}  # bookie -> generation of the registration seen
        self._registration_seen: dict[str, tuple[int, int]] = {}  # bookie -> (create revision, started_ms)
        self._tasks: set[asyncio.Future] = set()
        self._bookies: dict[str, BookieClient] = {}
        self.health = BookieHealth(self.config.failure_half_life)
        self.metrics = self.config.metrics or ClientMetrics.default()  # stream/metrics.py
        self.tracer = None  # stream/tracing.py ClientTracer, with ClientConfig.trace_path
        if self.config.trace_path:
            from stream.tracing import ClientTracer
            self.tracer = ClientTracer(self.config.trace_path, self.config.trace_name or f"c{os.getpid()}")
        # the smallest max entry size the registrations published (see entry_size_limit)
        self._entry_limit: int | None = None
        self._closed = False
        self._closing = False
        self._close_task: asyncio.Future | None = None
        self._handles: weakref.WeakSet[LedgerHandle] = weakref.WeakSet()  # the open ones, for close
        self._lock: asyncio.Lock | None = None
        self._writers: weakref.WeakSet = weakref.WeakSet()  # live writers, told when a bookie's registration goes
        self._watch_cancel: Callable[[], None] | None = None

    @property
    def placement_lock(self) -> asyncio.Lock:
        """Serialises replacements, so two never pick the same bookie."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    # -- plumbing -----------------------------------------------------------------

    async def meta_call(self, fn: Callable, *args, **kw) -> Any:
        """A blocking metadata call in a worker thread; errors translated."""
        if self._closed:
            raise err.ClientClosed("client is closed")
        try:
            return await asyncio.to_thread(fn, *args, **kw)
        except Exception as e:
            raise err.translate(e) from e

    @property
    def closing(self) -> bool:
        """True once :meth:`close` started: handles refuse new adds (ClientClosed)."""
        return self._closing

    def track(self, handle: LedgerHandle) -> None:
        """Every handle of this client registers here (weakly: a reader
        handle the application drops needs no close), so the client's close
        can end it before the channels it writes through."""
        if self._closing:
            raise err.ClientClosed("client is closed")
        self._handles.add(handle)

    def confirmed_here(self, ledger_id: int) -> int:
        """The highest LAC a handle of this client knows for the ledger (a
        writer's own, a reader's last read; -1 if none).  The ensemble learns
        a writer's LAC with its next add or an explicit LAC a moment later; a
        reader of the same client starting at the latest position takes this
        one, so it never reads back what its own writer had acknowledged."""
        return max((h.last_add_confirmed for h in list(self._handles) if h.ledger_id == ledger_id), default=-1)

    # -- a bookie's registration gone (issue 15) ---------------------------------

    def watch_for_writer(self, writer) -> None:
        """``writer`` (a LedgerWriter) is told ``on_bookie_gone(id)`` when a
        bookie's registration disappears, so it changes its ensemble at once
        instead of at its next failed write (autorecovery then finds nothing
        to do in its open fragment); and again, when a bookie registers,
        about the bookies of its ensemble still unregistered (a change
        deferred for want of a spare is made once there is one).  The
        registration watch starts with the first writer and ends with the
        client."""
        self._writers.add(writer)
        if self._watch_cancel is None and self.config.watch_registrations and not self._closing:
            self._watch_cancel = lambda: None  # (starting)
            self._spawn(self._start_watch(asyncio.get_running_loop()))

    async def _start_watch(self, loop: asyncio.AbstractEventLoop) -> None:
        def on_event(ev) -> None:  # a watch thread
            try:
                if ev.change is MembershipChange.REMOVED:
                    loop.call_soon_threadsafe(self._on_registration_removed, ev.bookie_id)
                else:
                    loop.call_soon_threadsafe(self._on_registration_added)
            except RuntimeError:  # the loop is closed
                pass

        def on_error(e) -> None:
            log.info("bookie registration watch ended: %s", e)

        try:
            cancel = await asyncio.to_thread(self.registry.watch, on_event, on_error=on_error)
        except Exception as e:
            log.warning("cannot watch bookie registrations (writers change ensembles on failed writes "
                        "only): %s", e)
            return
        if self._closing:
            await asyncio.to_thread(cancel)
        else:
            self._watch_cancel = cancel

    def _on_registration_removed(self, bookie_id: str) -> None:
        if not self._closing and self._writers:
            self._spawn(self._check_gone(bookie_id))

    async def _check_gone(self, bookie_id: str) -> None:
        """A REMOVED event: gone only if no registration is left (a move to
        read-only removes one key and adds another)."""
        try:
            regs = await self._registrations(False)
        except err.MetadataUnavailable:
            return  # unknown: the writer finds out at its next write
        if any(r.bookie_id == bookie_id for r in regs):
            return
        log.info("bookie %s: its registration is gone", bookie_id)
        for w in list(self._writers):
            w.on_bookie_gone(bookie_id)

    def _on_registration_added(self) -> None:
        if not self._closing and self._writers:
            self._spawn(self._check_ensembles())

    async def _check_ensembles(self) -> None:
        """A bookie registered: a writer whose ensemble still names an
        unregistered bookie (its change was deferred for want of a spare,
        and an idle writer has nothing to resend that would fail again) is
        told that bookie is gone again, so it changes its ensemble now."""
        try:
            regs = await self._registrations(False)
        except err.MetadataUnavailable:
            return
        registered = {r.bookie_id for r in regs}
        for w in list(self._writers):
            for b in sorted(set(w.core.ensemble) - registered):
                w.on_bookie_gone(b)

    def mark_failed(self, bookie_id: str, reason: str = "did not answer") -> None:
        """The bookie failed a request (unreachable, timed out, an error of
        its own): placement avoids it while others suffice (BookieHealth).
        Never for a refusal of one request (TOO_LARGE, BAD_REQUEST...)."""
        self.health.on_failure(bookie_id, time.monotonic(), reason)

    def mark_healthy(self, bookie_id: str) -> None:
        """The bookie answered: usable again at once."""
        self.health.on_success(bookie_id)

    def quarantined(self) -> set[str]:
        """The bookies suspect now (failed recently): asked last, chosen last."""
        return {b for b, _ in self.health.suspects(time.monotonic())}

    async def _registrations(self, writable_only: bool) -> list:
        """The registrations (read-only ones too unless ``writable_only``),
        sorted by id, each with its etcd create revision: a bookie that
        registered anew since it failed is forgiven (BookieHealth)."""
        layout = self.registry.layout
        prefix = layout.bookies_state_prefix(False) if writable_only else layout.bookies_prefix()
        rows, _ = await self.meta_call(self.store.range_with_revision, prefix)
        regs, revisions = [], {}
        for key, v in rows:
            try:
                bookie_id, read_only = layout.parse_bookie_key(key)
                r = mpb.BookieRegistration.FromString(v.value)
            except Exception as e:  # one bad key does not hide the others
                log.warning("skipping bad bookie registration %r: %s", key, e)
                continue
            if r.bookie_id != bookie_id:
                log.warning("skipping %r: it holds the registration of %r", key, r.bookie_id)
                continue
            r.read_only = read_only
            regs.append(r)
            gen = self._generation(bookie_id, v, r.started_ms)
            revisions[bookie_id] = gen
            self._set_address(r.bookie_id, r.address, gen, r.read_address)
        regs.sort(key=lambda m: m.bookie_id)
        self.health.on_registrations(revisions)
        if not writable_only or regs:
            self._entry_limit = _entry_limit(regs)
        return regs

    def _generation(self, bookie_id: str, v, started_ms: int) -> int:
        """A number that grows each time the bookie registers anew: a key
        created again (a lost lease: a new create revision) or a new run that
        replaced its own stale key in place (the same key, a new
        ``started_ms``).  It is the etcd revision at which that was seen."""
        seen = (v.create_revision, started_ms)
        before = self._registration_seen.get(bookie_id)
        self._registration_seen[bookie_id] = seen
        known = self._registered_at.get(bookie_id, 0)
        if before is None or before == seen:
            return max(known, v.create_revision)
        return max(known, v.mod_revision)

    async def refresh_bookies(self, reconnect: "Iterable[str]" = ()) -> None:
        """Reads the registrations now (a bookie that registered anew gets a
        fresh channel and is forgiven), and opens fresh channels to the
        bookies named in ``reconnect``: a channel that failed to connect
        backs off before it tries again, while a restarted bookie (whose
        registration may be unchanged: it kept its lease) answers at once."""
        for bookie_id in reconnect:
            old = self._bookies.pop(bookie_id, None)
            if old is not None:
                self._spawn(old.close())
        await self._registrations(False)

    @property
    def max_entry_size(self) -> int:
        """The largest payload an add may carry: the smallest limit the
        bookies published (as last read; the bookies' default until then)."""
        return DEFAULT_MAX_ENTRY_SIZE if self._entry_limit is None else self._entry_limit

    async def entry_size_limit(self) -> int:
        """:attr:`max_entry_size`, reading the registrations if never read."""
        if self._entry_limit is None:
            try:
                await self._registrations(False)
            except err.MetadataUnavailable:
                pass  # the default until the next read
        return self.max_entry_size

    def _set_address(self, bookie_id: str, address: str, registered: int = 0, read_address: str = "") -> None:
        """A bookie's address (and its read port's) from its registration.
        A new address, or a new registration (a restart: a higher create
        revision), gets a fresh channel: the old one may be backing off from
        the dead process."""
        known = self._registered_at.get(bookie_id, 0)
        addresses = (address, read_address if self.config.read_port else "")
        if self._addresses.get(bookie_id) != addresses or (known and registered > known):
            self._addresses[bookie_id] = addresses
            old = self._bookies.pop(bookie_id, None)
            if old is not None:
                self._spawn(old.close())
        if registered:
            self._registered_at[bookie_id] = registered

    def _spawn(self, coro) -> None:
        """A background task the client's close waits for (none left behind)."""
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)

    def _task_done(self, t: asyncio.Future) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.info("background task failed: %r", t.exception())

    def bookie_now(self, bookie_id: str) -> BookieClient | None:
        """The bookie's client if its address is known (no I/O); None once
        the client is closed (no channel outlives it)."""
        bc = self._bookies.get(bookie_id)
        if bc is None:
            if self._closed:
                return None
            addrs = self._addresses.get(bookie_id)
            if addrs is None:
                return None
            bc = self._bookies[bookie_id] = BookieClient(addrs[0], self.config.tls, addrs[1])
        return bc

    async def bookie(self, bookie_id: str) -> BookieClient | None:
        """The bookie's client; re-reads the registrations on a miss (None
        if the bookie is not registered: dead for longer than its TTL)."""
        bc = self.bookie_now(bookie_id)
        if bc is None:
            try:
                await self._registrations(False)
            except err.MetadataUnavailable:
                return None
            bc = self.bookie_now(bookie_id)
        return bc

    async def choose_bookies(self, n: int, exclude: "Iterable[str] | dict[str, str]" = (),
                             policy: PlacementPolicy | str | None = None, *,
                             ledger_id: int | None = None) -> list[str]:
        """``n`` writable bookies, none of ``exclude`` (ids, or id -> why);
        recently failed ones only when the others are too few (the least
        suspect first).  For an existing ledger's change or roll
        (``ledger_id``), none that rejoined its id after the ledger was
        created (``rejoined_after``: it would refuse the adds).
        NotEnoughBookies names who was left out and why."""
        regs = await self._registrations(True)
        pol = self.placement if policy is None else get_policy(policy)
        why = dict(exclude) if isinstance(exclude, dict) else {b: "excluded" for b in exclude}
        if ledger_id is not None:
            why.update((b, w) for b, w in rejoined_after(regs, ledger_id).items() if b not in why)
        return choose_with_fallback(pol, regs, n, why, self.health.suspects(time.monotonic()))

    # -- ledgers --------------------------------------------------------------------

    async def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
                            placement: PlacementPolicy | str | None = None,
                            custom: dict[str, str] | None = None, password: bytes | str | None = None
                            ) -> LedgerHandle:
        """A new OPEN ledger on E distinct writable bookies; its writer handle.
        Raises InvalidLedgerConfig unless E >= Qw >= Qa >= 1, NotEnoughBookies.
        With ``password``, opening it needs the password (stream/password.py)."""
        custom = ledger_password.custom_with_password(custom, password)
        try:
            validate_config(ensemble_size, write_quorum, ack_quorum)
        except Exception as e:
            raise err.translate(e) from e
        pol = self.placement if placement is None else get_policy(placement)
        ensemble = await self.choose_bookies(ensemble_size, (), pol)
        await self.entry_size_limit()
        header = LedgerMetadata(ensemble_size, write_quorum, ack_quorum, mode=LedgerMode.CLASSIC,
                                custom=dict(custom or {}))
        meta, rev = await self.meta_call(self.ledgers.create, header, ensemble)
        log.info("created ledger %s on %s (E%d Qw%d Qa%d)", meta.ledger_id, ensemble, ensemble_size,
                 write_quorum, ack_quorum)
        return LedgerHandle(self, meta, rev, writable=True, placement=pol)

    async def open_ledger(self, ledger_id: int, recovery: bool = True, *,
                          password: bytes | str | None = None) -> LedgerHandle:
        """A read handle.  ``recovery=True`` fences the ledger and closes it
        at its last entry (the old writer's adds then fail with
        LedgerFenced); ``recovery=False`` never fences: it reads the LAC from
        a covering quorum and can tail the ledger while it is written.
        UnauthorizedAccess when it was created with a password and this is not it."""
        meta, rev = await self.meta_call(self.ledgers.read, ledger_id)
        ledger_password.check(ledger_id, meta.custom, password)  # before any fencing
        if meta.mode is not LedgerMode.CLASSIC:
            raise err.InvalidLedgerConfig(f"ledger {ledger_id} is not a classic ledger")
        if recovery:
            if meta.state is not LedgerState.CLOSED:
                meta, rev = await recover_ledger(self, ledger_id)
            return LedgerHandle(self, meta, rev, writable=False)
        lac = -1
        if meta.state is not LedgerState.CLOSED:
            lac = await read_lac_covering(self, meta)
        return LedgerHandle(self, meta, rev, writable=False, lac=lac)

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return (await self.meta_call(self.ledgers.read, ledger_id))[0]

    async def delete_ledger(self, ledger_id: int) -> None:
        """Deletes the metadata (NoSuchLedger if absent), then, best effort,
        the entries on every bookie of every fragment."""
        meta, rev = await self.meta_call(self.ledgers.read, ledger_id)
        await self.meta_call(self.ledgers.delete, ledger_id)
        bookies = {b for f in meta.fragments for b in f.ensemble}
        key = ledger_password.master_key(meta.custom)

        async def one(bid: str) -> None:
            bc = await self.bookie(bid)
            if bc is not None:
                try:
                    await bc.delete(ledger_id, timeout=self.config.read_timeout, master_key=key)
                except (BookieUnavailable, asyncio.TimeoutError) as e:
                    log.info("ledger %s: delete on %s failed: %s (its GC has the last word)", ledger_id, bid, e)

        await asyncio.gather(*(one(b) for b in bookies))

    async def list_ledgers(self) -> list[int]:
        return await self.meta_call(lambda: list(self.ledgers.list_ledgers()))

    # -- lifecycle -----------------------------------------------------------------------

    async def close(self) -> None:
        """Ends every handle still open, then closes the bookie channels and
        the etcd connection.  A writer ends as a stream writer's close ends
        it (``LedgerHandle.end_writes``): its pending adds get ``add_timeout``
        seconds to be acknowledged, an add still pending then fails with
        ClientClosed, and the ledger is left OPEN (not closed: the next
        opener recovers it).  New adds raise ClientClosed from the start.
        Concurrent calls share one close."""
        if self._closed:
            return
        if self._close_task is None:
            self._closing = True
            self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        handles = list(self._handles)
        results = await asyncio.gather(*(h._release() for h in handles), return_exceptions=True)
        for h, r in zip(handles, results):
            if isinstance(r, Exception):
                log.info("ledger %s: ending the handle at close: %r", h.ledger_id, r)
        cancel, self._watch_cancel = self._watch_cancel, None
        if cancel is not None:
            await asyncio.to_thread(cancel)
        bookies, self._bookies = list(self._bookies.values()), {}
        await asyncio.gather(*(b.close() for b in bookies), *list(self._tasks), return_exceptions=True)
        self._closed = True
        if self._own_store:
            await asyncio.to_thread(self.store.close)

    async def __aenter__(self) -> "BookKeeperClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


__all__ = ["ClientConfig", "BookKeeperClient", "LedgerHandle"]  # (and the two blocking names below)


def __getattr__(name: str):
    """``SyncBookKeeperClient`` and ``SyncLedgerHandle`` (the blocking facade,
    :mod:`stream.sync_client`) import from here too, as they always did."""
    if name in ("SyncBookKeeperClient", "SyncLedgerHandle", "BackgroundLoop"):
        from stream import sync_client
        return getattr(sync_client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
