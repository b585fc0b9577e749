"""The decisions of keeping one lease-bound key alive, with no I/O and no clock.

A *kept key* is a key in etcd attached to a lease that its holder refreshes
(a bookie's registration, later a writer's registration, the auditor's
election key, a worker's lock).  When the lease is lost (etcd said so, or no
refresh succeeded for a whole TTL, as after an etcd outage or a process
paused by SIGSTOP), the holder must not give up: it creates the key again
under a new lease as soon as etcd answers, and says loudly, while it is
without one, that it is.

:class:`KeeperCore` is that policy as a state machine in the style of
etcd-io/raft: time enters as ``now`` (monotonic seconds) on every call, the
adapter (:mod:`metadata.keeper`) performs the :class:`Action` that
:meth:`KeeperCore.next` returns at the time it names, and reports each
outcome back (``created`` / ``create_failed`` / ``refreshed`` /
``refresh_failed`` / ``lease_gone``).  Each transition is returned as a
:class:`Change` for the adapter to log and to tell its owner.

States::

    CREATING --created--> HELD --refresh failed--> SUSPECT --refreshed--> HELD
       ^                   |                          |
       |                   +---lease gone / no refresh for a TTL----+
       +------------------------------ LOST <-------------------------+
                         (LOST creates again, with backoff)

``registered`` is true in HELD and SUSPECT: the key is there as far as the
holder can know (in SUSPECT it has failed refreshes for less than a TTL).
"""
from __future__ import annotations

import dataclasses
import enum


class KeeperState(enum.Enum):
    CREATING = "creating"  # never held yet: creating the key under a new lease
    HELD = "held"          # created, and the last refresh succeeded
    SUSPECT = "suspect"    # refreshes fail, but less than a TTL since the last good one
    LOST = "lost"          # the lease is gone or presumed gone: creating the key again
    STOPPED = "stopped"


class Action(enum.Enum):
    CREATE = "create"    # grant a new lease and create the key under it (replacing our old lease's key)
    REFRESH = "refresh"  # refresh the current lease
    NONE = "none"        # stopped


@dataclasses.dataclass(frozen=True)
class Step:
    action: Action
    at: float            # when to perform it (monotonic seconds)


@dataclasses.dataclass(frozen=True)
class Change:
    """A transition, for the adapter to log and report."""

    old: KeeperState
    new: KeeperState
    reason: str
    now: float


@dataclasses.dataclass(frozen=True)
class Alarm:
    """A reminder, while the key is not held, of how long it has not been."""

    state: KeeperState
    unregistered_for: float
    attempts: int
    last_error: str


class KeeperCore:
    """The policy of one kept key; see the module docstring.

    ``interval`` is the refresh period of a held lease (default TTL / 3),
    ``retry`` the delay before a refresh is retried after a failure, and
    ``backoff`` / ``max_backoff`` bound the delay between create attempts.
    ``alarm_every`` is how often :meth:`alarm` repeats while unregistered.
    """

    def __init__(self, ttl: int, now: float, *, interval: float | None = None, retry: float = 0.25,
                 backoff: float = 0.1, max_backoff: float = 2.0, alarm_every: float = 5.0) -> None:
        assert isinstance(ttl, int) and ttl >= 1, f"ttl must be an int >= 1, got {ttl!r}"
        assert interval is None or 0 < interval < ttl
        assert 0 < retry and 0 < backoff <= max_backoff and alarm_every > 0
        self.ttl = ttl                      # the TTL asked for; a grant may give more
        self.granted_ttl = ttl              # the TTL of the current lease
        self._interval = interval
        self._retry = retry
        self._backoff0, self._max_backoff = backoff, max_backoff
        self._backoff = backoff
        self._alarm_every = alarm_every
        self.state = KeeperState.CREATING
        self._next = Step(Action.CREATE, now)
        self.last_ok: float | None = None        # when the lease last was granted or refreshed
        self.unregistered_since: float | None = now
        self.attempts = 0                        # create attempts since the key was last held
        self.last_error = ""
        self.creations = 0                       # how many times the key was (re-)created
        self._last_alarm = now

    # -- queries --------------------------------------------------------------

    @property
    def registered(self) -> bool:
        return self.state in (KeeperState.HELD, KeeperState.SUSPECT)

    def interval(self) -> float:
        return self._interval if self._interval is not None else self.granted_ttl / 3.0

    def unregistered_for(self, now: float) -> float:
        return 0.0 if self.unregistered_since is None else max(0.0, now - self.unregistered_since)

    def next(self, now: float) -> tuple[Step, Change | None]:
        """The next action and when; may first declare the lease presumed
        lost (a refresh overdue by a whole TTL, e.g. after a pause)."""
        change = None
        if self.registered and self.last_ok is not None and now - self.last_ok >= self.granted_ttl:
            change = self._lose(now, f"no refresh for {now - self.last_ok:.1f}s "
                                     f"(TTL {self.granted_ttl}s): lease presumed expired")
        return self._next, change

    def alarm(self, now: float) -> Alarm | None:
        """A reminder to log while unregistered, at most every ``alarm_every``."""
        if self.registered or self.state is KeeperState.STOPPED or now - self._last_alarm < self._alarm_every:
            return None
        self._last_alarm = now
        return Alarm(self.state, self.unregistered_for(now), self.attempts, self.last_error)

    # -- outcomes ---------------------------------------------------------------

    def created(self, now: float, granted_ttl: int) -> Change | None:
        """The key was created under a new lease granted with ``granted_ttl``."""
        assert granted_ttl >= 1
        if self.state is KeeperState.STOPPED:
            return None
        self.granted_ttl = granted_ttl
        self.last_ok = now
        self.creations += 1
        self.attempts = 0
        self.last_error = ""
        self._backoff = self._backoff0
        self.unregistered_since = None
        self._next = Step(Action.REFRESH, now + self.interval())
        return self._to(KeeperState.HELD, now, "key created" if self.creations == 1 else "key created again")

    def create_failed(self, now: float, error: str) -> Change | None:
        """A create attempt failed (etcd away, or the key held by another lease):
        try again after a backoff."""
        if self.state is KeeperState.STOPPED:
            return None
        assert not self.registered, "create outcome while the key is held"
        self.attempts += 1
        self.last_error = error
        self._next = Step(Action.CREATE, now + self._backoff)
        self._backoff = min(self._max_backoff, self._backoff * 2)
        return None

    def refreshed(self, now: float, started: float, granted_ttl: int) -> Change | None:
        """A refresh sent at ``started`` succeeded: the lease runs to at least
        ``started`` + its TTL."""
        assert started <= now
        if not self.registered:
            return None  # an answer to a refresh made before a loss: stale
        self.granted_ttl = granted_ttl
        self.last_ok = max(self.last_ok or started, started)
        self._next = Step(Action.REFRESH, now + self.interval())
        if self.state is KeeperState.SUSPECT:
            return self._to(KeeperState.HELD, now, "refresh succeeded again")
        return None

    def refresh_failed(self, now: float, error: str) -> Change | None:
        """A refresh failed without etcd saying the lease is gone (unreachable,
        timed out): retry soon, and presume the lease lost after a TTL."""
        if not self.registered:
            return None
        self.last_error = error
        if self.last_ok is not None and now - self.last_ok >= self.granted_ttl:
            return self._lose(now, f"no refresh for {now - self.last_ok:.1f}s (TTL {self.granted_ttl}s): "
                                   f"lease presumed expired ({error})")
        self._next = Step(Action.REFRESH, now + min(self._retry, self.interval()))
        if self.state is KeeperState.HELD:
            return self._to(KeeperState.SUSPECT, now, f"refresh failed: {error}")
        return None

    def lease_gone(self, now: float, error: str) -> Change | None:
        """etcd said the lease does not exist (expired, revoked), or the key
        is no longer ours."""
        if not self.registered:
            return None
        self.last_error = error
        return self._lose(now, error)

    def stop(self, now: float) -> Change | None:
        self._next = Step(Action.NONE, now)
        return self._to(KeeperState.STOPPED, now, "stopped")

    # -- internals --------------------------------------------------------------

    def _lose(self, now: float, reason: str) -> Change | None:
        self.unregistered_since = now
        self._last_alarm = now
        self.attempts = 0
        self._backoff = self._backoff0
        self._next = Step(Action.CREATE, now)
        return self._to(KeeperState.LOST, now, reason)

    def _to(self, new: KeeperState, now: float, reason: str) -> Change | None:
        old = self.state
        if old is new:
            return None
        self.state = new
        return Change(old, new, reason, now)
