"""Time as an input to the protocol cores (etcd-io/raft's Tick): every timing
rule of the writer and of the recovery, as pure code.  An adapter feeds the
current time (``tick(now)``: the asyncio loop's time, or the simulator's)
and arms one timer at ``next_deadline()``; what falls due comes back as
effects for it to carry out.  No clock is read here.

:class:`WriterClock` (beside a :class:`stream.writer_core.WriterCore`):

- a frame not acknowledged ``frame_timeout`` after it was sent marks its
  bookie failed (``Tick.timed_out``);
- the explicit LAC: once adds went quiet (a drain with nothing to send)
  and the (LAC, LAFR) pair moved past the last one told, it is told to the
  ensemble ``lac_delay`` later, unless adds are then in flight (their acks
  arm it again) or the writer may not tell it (``may_tell_lac``);
- failed bookies that wait (a change held by rule 3, or deferred: no
  spare) are retried (``retry_failed``) after a back-off doubling from
  ``retry_min`` up to ``retry_max``; an answer from a retried bookie, or a
  published change, resets it.

:class:`RecoveryClock` (beside a :class:`stream.recovery_core.RecoveryCore`):
entries read from one bookie (spread reads) are asked of the rest of their
write sets once no read answer came for ``speculative_timeout``.

:class:`ReadPacer` (beside a stream reader with ``max_read_bytes_per_s``):
when a reader's next range read may start, so that what it reads stays
within a rate.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable

if TYPE_CHECKING:  # pragma: no cover
    from stream.recovery_core import RecoveryCore
    from stream.writer_core import Ready, WriterCore


@dataclass(slots=True)
class WriterTick:
    """What fell due: frames timed out ((frame key, ensemble index, bookie
    id): the bookie is to be marked failed, the frame given up), the (LAC, LAFR) to tell the ensemble, the failed bookies just
    retried (the core has queued their resends: drain it)."""

    timed_out: list[tuple[Hashable, int, str]] = field(default_factory=list)
    tell_lac: tuple[int, int] | None = None
    retried: list[str] = field(default_factory=list)


class WriterClock:
    def __init__(self, core: "WriterCore", *, frame_timeout: float, lac_delay: float, explicit_lac: bool = True,
                 retry_min: float = 0.1, retry_max: float = 5.0):
        assert frame_timeout > 0 and lac_delay >= 0 and 0 < retry_min <= retry_max
        self.core = core
        self.frame_timeout, self.lac_delay, self.explicit_lac = frame_timeout, lac_delay, explicit_lac
        self.retry_min, self.retry_max = retry_min, retry_max
        self.told = (core.lac, core.lafr)        # the (LAC, LAFR) last told the ensemble
        self._frames: collections.OrderedDict[Hashable, tuple[float, int, str]] = collections.OrderedDict()
        self._lac_at: float | None = None
        self._retry_at: float | None = None
        self.retry_delay = 0.0
        self._retried: set[str] = set()          # the failed bookies last retried

    # -- inputs -------------------------------------------------------------------

    def frame_sent(self, key: Hashable, index: int, bookie_id: str, now: float) -> None:
        self._frames[key] = (now + self.frame_timeout, index, bookie_id)

    def frame_done(self, key: Hashable) -> None:
        self._frames.pop(key, None)

    def answered(self, bookie_id: str) -> None:
        """The bookie answered a frame (a refusal too): a retried one is back."""
        if bookie_id in self._retried:
            self._retried.discard(bookie_id)
            self.retry_delay = 0.0

    def changed(self) -> None:
        """An ensemble change was published."""
        self.retry_delay = 0.0

    def told_now(self, pair: tuple[int, int]) -> None:
        """The adapter told the ensemble ``pair`` itself (a closing writer)."""
        self.told = max(self.told, pair)

    def after_ready(self, r: "Ready", now: float) -> None:
        """Called with each drained ``Ready``: arms what it makes due."""
        core = self.core
        if (self.explicit_lac and self._lac_at is None and not r.sends and (r.lac, r.lafr) > self.told
                and core.may_tell_lac):
            self._lac_at = now + self.lac_delay
        if self._retry_at is None and core.awaiting:
            self.retry_delay = min(self.retry_max, max(self.retry_min, self.retry_delay * 2))
            self._retry_at = now + self.retry_delay

    # -- time ---------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        times = [t for t in (self._lac_at, self._retry_at) if t is not None]
        if self._frames:
            times.append(next(iter(self._frames.values()))[0])  # sent in time order: the first is the earliest
        return min(times, default=None)

    def tick(self, now: float) -> WriterTick:
        out = WriterTick()
        frames = self._frames
        while frames:
            key, (at, index, bookie_id) = next(iter(frames.items()))
            if at > now:
                break
            del frames[key]
            out.timed_out.append((key, index, bookie_id))
        core = self.core
        if self._lac_at is not None and now >= self._lac_at:
            self._lac_at = None
            pair = (core.lac, core.lafr)
            if core.may_tell_lac and pair > self.told and core.next_to_send <= core.release_mark + 1:
                self.told = out.tell_lac = pair
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
            waiting = sorted(core.failed.values())
            self._retried = set(waiting)
            if core.retry_failed():
                out.retried = waiting
        return out


class RecoveryClock:
    def __init__(self, core: "RecoveryCore", speculative_timeout: float):
        assert speculative_timeout >= 0
        self.core, self.timeout = core, speculative_timeout
        self._answered_at = 0.0     # the time of the last read answer or read sent
        self._at: float | None = None
        self.speculations = 0

    def read_activity(self, now: float) -> None:
        """Reads were sent, or a read answer came (stalled reads count from here)."""
        self._answered_at = now

    def after_ready(self, now: float) -> None:
        if self._at is None and self.core.single_reads:
            self._at = now + self.timeout

    def next_deadline(self) -> float | None:
        return self._at

    def tick(self, now: float) -> int:
        """Entries asked of the rest of their write sets (0: none fell due)."""
        if self._at is None or now < self._at:
            return 0
        self._at = None
        if not self.core.single_reads:
            return 0
        if now - self._answered_at >= self.timeout:
            self.speculations += 1
            return self.core.speculate()
        self._at = self._answered_at + self.timeout
        return 0


class ReadPacer:
    """A rate bound on the bytes a reader reads (a token bucket in its
    virtual-time form, GCRA): ``take(nbytes, now)`` counts a read of
    ``nbytes`` started at ``now`` and says how long to wait before the next
    may start, so that at most ``burst_seconds`` of the rate ever goes ahead
    of it.  A reader that waits as told starts reads of at most ``rate * t
    + burst`` bytes plus the last read's in any ``t`` seconds; one that was
    idle gets the burst at once, not the idle time's worth."""

    def __init__(self, bytes_per_s: float, burst_seconds: float = 0.1):
        assert bytes_per_s > 0 and burst_seconds >= 0
        self.rate, self.burst_seconds = float(bytes_per_s), burst_seconds
        self._tat: float | None = None   # the time at which everything taken so far is paid for

    def take(self, nbytes: int, now: float) -> float:
        tat = now if self._tat is None else max(self._tat, now)
        self._tat = tat + nbytes / self.rate
        return max(0.0, self._tat - now - self.burst_seconds)


__all__ = ["ReadPacer", "RecoveryClock", "WriterClock", "WriterTick"]
