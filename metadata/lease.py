"""Leases of :class:`metadata.store.MetadataStore`: a :class:`Lease` and
the :class:`KeepAlive` thread that refreshes it and reports its loss.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from metadata.errors import LeaseExpired, MetadataError

if TYPE_CHECKING:
    from metadata.store import MetadataStore

_log = logging.getLogger("metadata.store")  # (the store's logger, as before the split)


class Lease:
    """An etcd lease.  Keys put with it vanish when it expires or is revoked.

    ``id`` is etcd's lease id, ``ttl`` the TTL etcd granted (etcd may raise a
    requested TTL to its minimum, about 2 s with default settings).
    """

    def __init__(self, store: "MetadataStore", lease_id: int, ttl: int) -> None:
        assert lease_id > 0 and ttl > 0
        self._store = store
        self.id = lease_id
        self.ttl = ttl

    def refresh(self) -> int:
        """Renew the lease; returns the new TTL.  Raises ``LeaseExpired``."""
        return self._store._lease_refresh(self.id)

    def revoke(self) -> bool:
        """Revoke the lease (deleting its keys).  Returns False if it was
        already gone."""
        return self._store._lease_revoke(self.id)

    def remaining(self) -> int:
        """Seconds left before expiry; -1 if the lease is gone."""
        return self._store._lease_ttl(self.id)

    def keep_alive(self, on_lost: "Callable[[MetadataError], None] | None" = None,
                   interval: float | None = None) -> "KeepAlive":
        """Start a :class:`KeepAlive` thread for this lease."""
        return KeepAlive(self, on_lost=on_lost, interval=interval)

    def __repr__(self) -> str:
        return f"Lease(id={self.id:#x}, ttl={self.ttl})"


class KeepAlive:
    """A daemon thread that refreshes a lease every ``interval`` (default
    ttl/3) seconds.

    It reports loss once, through ``on_lost(error)`` (called on the
    keep-alive thread) and :attr:`lost`, when etcd says the lease is gone, or
    when no refresh succeeded for a whole TTL (etcd unreachable: the lease
    must be presumed expired).  After a loss the thread exits.
    """

    def __init__(self, lease: Lease, on_lost: "Callable[[MetadataError], None] | None" = None,
                 interval: float | None = None) -> None:
        assert isinstance(lease, Lease)
        assert interval is None or 0 < interval < lease.ttl, "interval must be below the TTL"
        self.lease = lease
        self._on_lost = on_lost
        self._interval = interval if interval is not None else lease.ttl / 3.0
        self._stop = threading.Event()
        self._lost = threading.Event()
        self.error: MetadataError | None = None
        self._cond = threading.Condition()
        self.refreshes = 0
        # The lease was granted (or last refreshed) no earlier than now.
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"keepalive-{lease.id:x}", daemon=True)
        lease._store._register_keepalive(self)
        self._thread.start()

    @property
    def lost(self) -> bool:
        """True once the lease was reported lost."""
        return self._lost.is_set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        delay = self._interval
        while not self._stop.wait(delay):
            started = time.monotonic()
            try:
                self.lease.refresh()
            except LeaseExpired as err:
                self._report_lost(err)
                return
            except MetadataError as err:
                if time.monotonic() - self._last_ok >= self.lease.ttl:
                    self._report_lost(LeaseExpired(self.lease.id, f"lease {self.lease.id:#x} presumed expired: "
                                                                   f"no refresh for {self.lease.ttl}s ({err})"))
                    return
                _log.warning("lease %#x refresh failed, retrying: %s", self.lease.id, err)
                # Retry sooner than the normal interval, but never spin.
                delay = max(min(self._interval, 0.25), 0.05)
                continue
            except Exception as err:  # pragma: no cover - a bug; do not die silently
                _log.exception("lease %#x keep-alive crashed", self.lease.id)
                self._report_lost(MetadataError(f"keep-alive crashed: {err!r}"))
                return
            self._last_ok = started
            delay = self._interval
            with self._cond:
                self.refreshes += 1
                self._cond.notify_all()

    def _report_lost(self, err: MetadataError) -> None:
        self.error = err
        self._lost.set()
        with self._cond:
            self._cond.notify_all()
        if self._on_lost is not None:
            try:
                self._on_lost(err)
            except Exception:  # pragma: no cover
                _log.exception("on_lost callback failed")

    def wait_refreshes(self, count: int, timeout: float) -> bool:
        """Wait until at least ``count`` refreshes succeeded (or loss)."""
        assert count >= 0 and timeout >= 0
        with self._cond:
            return self._cond.wait_for(lambda: self.refreshes >= count or self.lost, timeout) and not self.lost

    def wait_lost(self, timeout: float) -> bool:
        """Wait until the lease is reported lost; True if it was."""
        return self._lost.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop refreshing (does not revoke the lease).  Idempotent."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self.lease._store._unregister_keepalive(self)
