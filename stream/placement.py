"""Ensemble placement: which writable bookies a new ensemble (or a
replacement) uses.  Pure functions over the registrations, no I/O.

A policy picks ``n`` distinct bookies from the writable registrations,
never one in ``exclude`` (the current ensemble, bookies that just failed);
too few candidates raise :class:`~stream.errors.NotEnoughBookies`.

- ``random``: uniformly at random;
- ``least_loaded``: most free bytes first (from the registration), ties at
  random.

A custom policy is any object with ``choose(candidates, n, exclude)``.

Health (:class:`BookieHealth`) is a score, not a ban: a bookie that failed
is avoided while the others suffice, tried again before an ensemble is given
up on (:func:`choose_with_fallback`), and forgiven at once when it answers
again or registers anew.  Time is an input (``now``), as everywhere in the
protocol code.
"""
from __future__ import annotations

import dataclasses
import random as _random
from typing import Iterable, Mapping, Protocol, Sequence

from stream.errors import InvalidLedgerConfig, NotEnoughBookies


class PlacementPolicy(Protocol):
    name: str

    def choose(self, candidates: Sequence, n: int, exclude: Iterable[str] = ()) -> list[str]:
        """``n`` distinct bookie ids among ``candidates`` (registrations with
        ``bookie_id``, ``read_only`` and ``free_bytes``) not in ``exclude``."""


def eligible(candidates: Sequence, n: int, exclude: Iterable[str]) -> list:
    """The writable candidates not excluded, deduplicated by id; raises
    NotEnoughBookies when fewer than ``n``."""
    if not isinstance(n, int) or n < 0:
        raise InvalidLedgerConfig(f"bad number of bookies {n!r}")
    ex = set(exclude)
    seen: set[str] = set()
    out = []
    for c in candidates:
        if c.bookie_id in ex or c.bookie_id in seen or getattr(c, "read_only", False):
            continue
        seen.add(c.bookie_id)
        out.append(c)
    if len(out) < n:
        why = {b: "excluded" for b in ex}
        why.update({c.bookie_id: "read-only" for c in candidates if getattr(c, "read_only", False)})
        raise NotEnoughBookies(n, len(out), f"need {n} writable bookies (excluding {sorted(ex)}), "
                                            f"{len(out)} available", excluded=why)
    return out


def rejoined_after(candidates: Sequence, ledger_id: int) -> dict[str, str]:
    """The bookies that took their ids again after a lost disk
    (``rejoined_at``, bookie/cookie.py) at a revision above ``ledger_id``
    (a revision too): they refuse that ledger's normal adds and prepares
    (READ_ONLY, bookie/core.py), so its changes and rolls leave them out
    (bookie -> why)."""
    return {c.bookie_id: f"rejoined its id after a lost disk (revision {c.rejoined_at}), "
                         f"after ledger {ledger_id} was created"
            for c in candidates if ledger_id < int(getattr(c, "rejoined_at", 0) or 0)}


def choose_with_fallback(policy: "PlacementPolicy", candidates: Sequence, n: int,
                         exclude: Mapping[str, str], avoid: Sequence[tuple[str, str]]) -> list[str]:
    """``n`` bookies from ``policy``, never one of ``exclude`` (bookie ->
    why: in the ensemble already...), and none of ``avoid`` (bookie, why;
    the least suspect first: recently failed ones) unless the rest are too
    few: then the avoided ones are let back in, in order, as many as needed.
    NotEnoughBookies names every bookie left out and why."""
    avoided = [b for b, _ in avoid if b not in exclude]
    for k in range(len(avoided) + 1):  # k avoided bookies let back in
        try:
            return policy.choose(candidates, n, set(exclude) | set(avoided[k:]))
        except NotEnoughBookies:
            if k == len(avoided):
                break
    why = dict(exclude)
    why.update((b, w) for b, w in avoid if b not in exclude)
    for c in candidates:
        if getattr(c, "read_only", False):
            why.setdefault(c.bookie_id, "read-only")
    pool = {c.bookie_id for c in candidates} - set(why)
    detail = "; ".join(f"{b}: {w}" for b, w in sorted(why.items()))
    raise NotEnoughBookies(n, len(pool), f"need {n} writable bookies, {len(pool)} available"
                                         + (f" (left out: {detail})" if detail else ""), excluded=why)


@dataclasses.dataclass
class _Failures:
    score: float          # failures, fading with time
    at: float             # when the last one happened (the caller's clock)
    reason: str
    registered: int       # the registration's create revision known then (0: unknown)


class BookieHealth:
    """What this client saw of each bookie, as a score that fades.

    Each failure adds 1 to the bookie's score, which halves every
    ``half_life`` seconds; a bookie is *suspect* while its score is at
    least ``SUSPECT``.  A suspect is avoided, not banned: placement lets it
    back in (least suspect first) when the others are too few.  A bookie is
    forgiven at once when it answers a request (``on_success``) or when it
    registers again after the failure (a registration whose etcd create
    revision is newer than the one known at the failure: it restarted).
    Pure: no clock, no I/O."""

    SUSPECT = 0.5

    def __init__(self, half_life: float = 10.0):
        assert half_life > 0, half_life
        self.half_life = half_life
        self._failures: dict[str, _Failures] = {}
        self._registered: dict[str, int] = {}  # bookie -> create revision of its registration, as last read

    def on_failure(self, bookie_id: str, now: float, reason: str = "failed") -> None:
        f = self._failures.get(bookie_id)
        score = 1.0 if f is None else 1.0 + self._faded(f, now)
        self._failures[bookie_id] = _Failures(score, now, reason, self._registered.get(bookie_id, 0))

    def on_success(self, bookie_id: str) -> None:
        """The bookie answered (an ack, a read): healthy again."""
        if bookie_id in self._failures:
            del self._failures[bookie_id]

    def on_registrations(self, revisions: Mapping[str, int]) -> None:
        """The registrations as read from etcd (bookie -> create revision):
        a bookie registered anew since its failure is forgiven."""
        for b, rev in revisions.items():
            self._registered[b] = rev
            f = self._failures.get(b)
            if f is not None and rev > f.registered:
                if f.registered == 0:
                    f.registered = rev  # first seen after the failure: the baseline
                else:
                    del self._failures[b]

    def score(self, bookie_id: str, now: float) -> float:
        f = self._failures.get(bookie_id)
        return 0.0 if f is None else self._faded(f, now)

    def suspects(self, now: float) -> list[tuple[str, str]]:
        """(bookie, why) of the suspect bookies, the least suspect first;
        forgets those whose score faded away."""
        out = []
        for b, f in list(self._failures.items()):
            s = self._faded(f, now)
            if s < self.SUSPECT:
                del self._failures[b]
                continue
            out.append((s, f.at, b, f"failed {now - f.at:.1f} s ago ({f.reason})"))
        out.sort()
        return [(b, why) for _, _, b, why in out]

    def _faded(self, f: _Failures, now: float) -> float:
        return f.score * 0.5 ** (max(0.0, now - f.at) / self.half_life)


class RandomPlacement:
    name = "random"

    def __init__(self, rng: _random.Random | None = None):
        self.rng = rng or _random.Random()

    def choose(self, candidates: Sequence, n: int, exclude: Iterable[str] = ()) -> list[str]:
        pool = eligible(candidates, n, exclude)
        return [c.bookie_id for c in self.rng.sample(pool, n)]


class LeastLoadedPlacement:
    name = "least_loaded"

    def __init__(self, rng: _random.Random | None = None):
        self.rng = rng or _random.Random()

    def choose(self, candidates: Sequence, n: int, exclude: Iterable[str] = ()) -> list[str]:
        pool = eligible(candidates, n, exclude)
        keyed = [(-int(c.free_bytes), self.rng.random(), c.bookie_id) for c in pool]
        keyed.sort()
        return [bid for _, _, bid in keyed[:n]]


POLICIES = {"random": RandomPlacement, "least_loaded": LeastLoadedPlacement}


def get_policy(policy: "str | PlacementPolicy | None") -> PlacementPolicy:
    """A policy by name (``random``, ``least_loaded``), or the object itself."""
    if policy is None:
        return RandomPlacement()
    if isinstance(policy, str):
        try:
            return POLICIES[policy]()
        except KeyError:
            raise InvalidLedgerConfig(f"unknown placement policy {policy!r}; known: {sorted(POLICIES)}") from None
    if not callable(getattr(policy, "choose", None)):
        raise InvalidLedgerConfig(f"placement policy {policy!r} has no choose()")
    return policy


__all__ = ["PlacementPolicy", "RandomPlacement", "LeastLoadedPlacement", "POLICIES", "get_policy", "eligible",
           "choose_with_fallback", "rejoined_after", "BookieHealth"]
