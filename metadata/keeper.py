"""Keeping a lease-bound key alive in etcd, and creating it again after a loss.

:class:`KeptKey` is the thin adapter around :class:`metadata.keeper_core.KeeperCore`:
one daemon thread performs the core's actions against etcd (grant a lease
and create the key, refresh the lease) at the times it names, and feeds the
outcomes back.  What the key is and how to create it belongs to the owner,
through ``create(lease, ours) -> mod_revision``: ``ours`` is the set of
lease ids that earlier holders of the key in this process (or a previous
process of the same owner, e.g. a bookie's previous run, from its data dir)
used, so the owner's transaction may replace a key still attached to one of
them at once rather than wait for it to expire.  After a successful create,
those leases are revoked.

Used by bookie registrations (:mod:`metadata.registration`); meant for every
lease holder to come (writers' registrations, the auditor, workers' locks).

While the key is not held, the thread logs an ERROR when it is lost and
again every ``alarm_every`` seconds until it is back; ``status()`` reports
the state for an owner's health and Info.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

from metadata.errors import LeaseExpired, MetadataError
from metadata.keeper_core import Action, Change, KeeperCore, KeeperState
from metadata.store import Lease, MetadataStore

_log = logging.getLogger(__name__)

CreateFn = Callable[[Lease, "frozenset[int]"], int]


class KeptKey:
    """A lease-bound key kept alive by a thread; see the module docstring.

    ``on_change(change)`` is called on the keeper thread at every state
    change (``change.new`` is a :class:`KeeperState`); ``on_created(lease)``
    after each successful create (e.g. to record the lease id on disk).
    ``lock`` is held while the key is created: owners that rewrite the key
    under the current lease take it too.  ``held=(lease, mod_revision)``
    starts from a key the owner has just created itself.
    """

    def __init__(self, store: MetadataStore, ttl: int, create: CreateFn, *, name: str,
                 on_change: Callable[[Change], None] | None = None,
                 on_created: Callable[[Lease], None] | None = None,
                 replace_leases: Iterable[int] = (), clock: Callable[[], float] = time.monotonic,
                 interval: float | None = None, alarm_every: float = 5.0,
                 held: "tuple[Lease, int] | None" = None, start: bool = True) -> None:
        assert isinstance(store, MetadataStore) and callable(create)
        self.store = store
        self.name = name
        self._create = create
        self._on_change = on_change
        self._on_created = on_created
        self._clock = clock
        self.core = KeeperCore(ttl, clock(), interval=interval, alarm_every=alarm_every)
        self.lock = threading.RLock()
        self.lease: Lease | None = None
        self.mod_revision = 0
        self._ours: set[int] = {i for i in replace_leases if i > 0}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kept-{name}", daemon=True)
        if held is not None:  # the owner created the key already (under ``held[0]``, at ``held[1]``)
            self.lease, self.mod_revision = held
            self.core.created(clock(), self.lease.ttl)
        if start:
            self._thread.start()

    def start(self) -> "KeptKey":
        self._thread.start()
        return self

    # -- for the owner ------------------------------------------------------------

    @property
    def registered(self) -> bool:
        return self.core.registered

    @property
    def state(self) -> KeeperState:
        return self.core.state

    def status(self) -> dict:
        """What a health report shows: state, seconds without the key, create
        attempts since, the last error, how many times the key was created."""
        with self._cond:
            c = self.core
            return {"state": c.state.value, "registered": c.registered,
                    "unregistered_seconds": round(c.unregistered_for(self._clock()), 3),
                    "attempts": c.attempts, "last_error": c.last_error, "creations": c.creations,
                    "lease": self.lease.id if self.lease else 0}

    def wait_for(self, predicate: Callable[["KeptKey"], bool], timeout: float) -> bool:
        """Waits (on state changes, not by polling) until ``predicate(self)``."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout)

    def wait_registered(self, timeout: float) -> bool:
        return self.wait_for(lambda k: k.registered, timeout)

    def report_lost(self, reason: str) -> None:
        """The owner found the key gone or not ours (e.g. a CAS on it failed):
        create it again."""
        with self._cond:
            change = self.core.lease_gone(self._clock(), reason)
        self._changed(change)
        self._wake.set()

    def stop(self, revoke: bool = True, timeout: float = 10.0) -> None:
        """Stops the thread and, with ``revoke``, revokes the lease (the key
        disappears at once; if etcd is away, when the TTL passes).  Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        with self._cond:
            change = self.core.stop(self._clock())
        self._changed(change)
        if revoke and self.lease is not None:
            try:
                self.lease.revoke()
            except MetadataError as err:
                _log.warning("%s: could not revoke lease %#x (it expires after its TTL): %s",
                             self.name, self.lease.id, err)

    # -- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # pragma: no cover - a bug: keep trying rather than die silently
                _log.exception("%s: keeper step failed", self.name)
                self._stop.wait(1.0)

    def _step(self) -> None:
        now = self._clock()
        with self._cond:
            step, change = self.core.next(now)
            alarm = self.core.alarm(now)
        self._changed(change)
        if alarm is not None:
            _log.error("%s: NOT REGISTERED for %.1f s (%s; %d attempts; last error: %s)", self.name,
                       alarm.unregistered_for, alarm.state.value, alarm.attempts, alarm.last_error or "-")
        if step.action is Action.NONE:
            return
        wait = step.at - now
        if wait > 0:
            # wake up for the step, or earlier to repeat the alarm while unregistered
            self._wake.wait(min(wait, 1.0) if not self.core.registered else wait)
            self._wake.clear()
            return
        if step.action is Action.REFRESH:
            self._refresh()
        else:
            self._create_key()

    def _refresh(self) -> None:
        lease = self.lease
        assert lease is not None
        started = self._clock()
        try:
            ttl = lease.refresh()
        except LeaseExpired as err:
            with self._cond:
                change = self.core.lease_gone(self._clock(), f"lease {lease.id:#x} is gone: {err}")
        except MetadataError as err:
            with self._cond:
                change = self.core.refresh_failed(self._clock(), str(err))
        else:
            with self._cond:
                change = self.core.refreshed(self._clock(), started, ttl)
        self._changed(change)

    def _create_key(self) -> None:
        if self.lease is not None:
            self._ours.add(self.lease.id)
        lease = None
        try:
            lease = self.store.lease(self.core.ttl)
            with self.lock:
                revision = self._create(lease, frozenset(self._ours))
                self.lease, self.mod_revision = lease, revision
        except MetadataError as err:
            if lease is not None:
                try:
                    lease.revoke()
                except MetadataError:
                    pass
            with self._cond:
                change = self.core.create_failed(self._clock(), f"{type(err).__name__}: {err}")
            self._changed(change)
            return
        with self._cond:
            change = self.core.created(self._clock(), lease.ttl)
        for old in sorted(self._ours - {lease.id}):
            try:
                self.store._lease_revoke(old)
            except MetadataError:
                pass  # it expires by itself; nothing is attached to it any more
        self._ours = set()
        if self._on_created is not None:
            try:
                self._on_created(lease)
            except Exception:
                _log.exception("%s: on_created failed", self.name)
        self._changed(change)

    def _changed(self, change: Change | None) -> None:
        with self._cond:
            self._cond.notify_all()
        if change is None:
            return
        if change.new is KeeperState.LOST:
            _log.error("%s: LOST its registration: %s; creating it again as soon as etcd answers",
                       self.name, change.reason)
        elif change.new is KeeperState.SUSPECT:
            _log.warning("%s: %s (presumed lost after %d s without a refresh)", self.name, change.reason,
                         self.core.granted_ttl)
        elif change.new is KeeperState.HELD and change.old is KeeperState.LOST:
            _log.warning("%s: registered again (%s)", self.name, change.reason)
        else:
            _log.info("%s: %s -> %s (%s)", self.name, change.old.value, change.new.value, change.reason)
        if self._on_change is not None:
            try:
                self._on_change(change)
            except Exception:
                _log.exception("%s: on_change failed", self.name)
