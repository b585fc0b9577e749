"""Watches of :class:`metadata.store.MetadataStore`: the events
(:class:`WatchEvent`), the iterator form (:class:`WatchStream`) and the
watch that resumes by itself after etcd comes back (``Watch``).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import queue
import threading
from typing import TYPE_CHECKING, Callable

import etcd3.events as etcd_events

from metadata.errors import MetadataError, MetadataUnavailable

if TYPE_CHECKING:
    from metadata.store import MetadataStore

_log = logging.getLogger("metadata.store")  # (the store's logger, as before the split)

# A watch broken by etcd going away is re-created after this many seconds,
# doubling up to the maximum (about gRPC's own reconnect backoff, see metadata.store).
WATCH_RESUME_BACKOFF = 0.05
WATCH_RESUME_BACKOFF_MAX = 1.0


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One change seen by a watch.  For a DELETE, ``value`` is empty and
    ``mod_revision`` is the revision of the deletion."""

    type: EventType
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease: int


def _to_watch_event(ev) -> WatchEvent:
    kind = EventType.DELETE if isinstance(ev, etcd_events.DeleteEvent) else EventType.PUT
    return WatchEvent(
        type=kind,
        key=bytes(ev.key).decode("utf-8"),
        value=bytes(ev.value),
        mod_revision=ev.mod_revision,
        create_revision=ev.create_revision,
        version=ev.version,
        lease=ev.lease,
    )


class WatchStream:
    """Iterator form of a watch (see :meth:`MetadataStore.watch_prefix_iter`).

    Events are queued as they arrive (unbounded: consume them).  ``next()``
    blocks; :meth:`get` takes a timeout.  After :meth:`cancel`, iteration
    stops; if the watch failed, iteration raises the translated error.
    """

    _END = object()

    def __init__(self) -> None:
        self._queue: "queue.Queue[object]" = queue.Queue()
        self._cancel: Callable[[], None] | None = None
        self._done = False

    def _on_event(self, ev: WatchEvent) -> None:
        self._queue.put(ev)

    def _on_error(self, err: MetadataError) -> None:
        self._queue.put(err)

    def get(self, timeout: float | None = None) -> WatchEvent:
        """The next event; raises ``TimeoutError`` if none came in time,
        ``StopIteration`` after cancel, or the watch's error."""
        if self._done:
            raise StopIteration
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no watch event within the timeout") from None
        if item is self._END:
            self._done = True
            raise StopIteration
        if isinstance(item, MetadataError):
            self._done = True
            raise item
        assert isinstance(item, WatchEvent)
        return item

    def __iter__(self) -> "WatchStream":
        return self

    def __next__(self) -> WatchEvent:
        return self.get()

    def cancel(self) -> None:
        """Stop the watch; pending events are still delivered first."""
        if self._cancel is not None:
            self._cancel()
            self._cancel = None
            self._queue.put(self._END)

    def __enter__(self) -> "WatchStream":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class Watch:
    """One watch of :meth:`MetadataStore.watch_prefix` / ``watch_key``, which
    outlives etcd going away (a restart, a dropped connection).

    The etcd3 client ends a watch when its stream breaks.  This one is then
    created again, with backoff, from :attr:`next_revision`: the revision
    after the last event delivered (etcd never splits one revision's events
    across responses), so no event is lost or delivered twice.  The resume
    runs on a thread of its own, like the keep-alives: etcd3 delivers every
    watch's events on one shared thread, from which no watch can be created.

    What cannot be resumed ends the watch, reported once through
    ``on_error``: the history from ``next_revision`` was compacted
    (Compacted: the caller must re-read, then watch again), the store was
    closed, or etcd refused the watch for good.
    """

    def __init__(self, store: "MetadataStore", key: bytes, range_end: bytes | None,
                 callback: Callable[[WatchEvent], None], on_error: Callable[[MetadataError], None] | None,
                 next_revision: int) -> None:
        assert callable(callback) and next_revision > 0
        self._store = store
        self._key, self._range_end = key, range_end
        self._callback, self._on_error = callback, on_error
        self.next_revision = next_revision  # the first revision not delivered yet
        self._lock = threading.Lock()
        self._generation = 0                # the etcd watch whose responses count
        self._watch_id: int | None = None
        self._done = False                  # cancelled or ended: no more events
        self._wake = threading.Event()      # cuts a resume's backoff short (cancel, store closed)

    def start(self) -> None:
        """Creates the etcd watch; its errors go to the caller."""
        self._watch_id = self._store._add_watch(self._key, functools.partial(self._on_response, 0),
                                                self._range_end, self.next_revision)

    def cancel(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            watch_id, self._watch_id = self._watch_id, None
        self._wake.set()
        self._store._forget_watch(self)
        self._store._cancel_watch(watch_id)

    # -- on etcd3's watch thread --------------------------------------------

    def _on_response(self, generation: int, response) -> None:
        if self._done or generation != self._generation:
            return  # cancelled, or an etcd watch since replaced
        if response is None or isinstance(response, BaseException):
            # The stream ended: an error, or None when it closed.
            err = (MetadataUnavailable("etcd watch stream closed") if response is None
                   else self._store._translate(response))
            if isinstance(err, MetadataUnavailable) and not self._store._closed:
                self._generation += 1  # whatever the broken watch still says is stale
                threading.Thread(target=self._resume, args=(err,), daemon=True,
                                 name=f"etcd-watch-resume-{self._key[-24:]!r}").start()
            else:
                self._end(err)
            return
        for ev in response.events:
            if self._done:
                return
            try:
                self._callback(_to_watch_event(ev))
            except Exception:
                _log.exception("watch callback failed")
            self.next_revision = max(self.next_revision, ev.mod_revision + 1)

    # -- on the resume thread -----------------------------------------------

    def _resume(self, cause: MetadataError) -> None:
        """Creates the etcd watch again from ``next_revision``, until it
        works, the watch is cancelled, or it cannot be resumed."""
        _log.info("watch on %r interrupted (%s): resuming from revision %d", self._key, cause,
                  self.next_revision)
        delay = WATCH_RESUME_BACKOFF
        while not self._done:
            if self._store._closed:
                self._end(MetadataUnavailable(f"the store was closed ({cause})"))
                return
            generation = self._generation
            try:
                watch_id = self._store._add_watch(self._key, functools.partial(self._on_response, generation),
                                                  self._range_end, self.next_revision)
            except MetadataUnavailable as err:
                cause = err
            except Exception as err:  # Compacted, or refused for good
                self._end(self._store._translate(err))
                return
            else:
                with self._lock:
                    cancelled = self._done
                    if not cancelled:
                        self._watch_id = watch_id
                if cancelled:  # while it was being created
                    self._store._cancel_watch(watch_id)
                    return
                _log.info("watch on %r resumed from revision %d", self._key, self.next_revision)
                return
            self._wake.wait(delay)
            delay = min(2 * delay, WATCH_RESUME_BACKOFF_MAX)

    def _end(self, err: MetadataError) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._store._forget_watch(self)
        if self._on_error is None:
            _log.warning("watch on %r ended: %s", self._key, err)
            return
        try:
            self._on_error(err)
        except Exception:
            _log.exception("watch on_error callback failed")
