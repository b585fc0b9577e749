"""Ensemble placement: which writable bookies a new ensemble (or a
replacement) uses.  Pure functions over the registrations, no I/O.

A policy picks ``n`` distinct bookies from the writable registrations,
never one in ``exclude`` (the current ensemble, bookies that just failed);
too few candidates raise :class:`~stream.errors.NotEnoughBookies`.

- ``random``: uniformly at random;
- ``least_loaded``: most free bytes first (from the registration), ties at
  random.

A custom policy is any object with ``choose(candidates, n, exclude)``.
"""
from __future__ import annotations

import random as _random
from typing import Iterable, Protocol, Sequence

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
        raise NotEnoughBookies(n, len(out), f"need {n} writable bookies (excluding {sorted(ex)}), "
                                            f"{len(out)} available")
    return out


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


__all__ = ["PlacementPolicy", "RandomPlacement", "LeastLoadedPlacement", "POLICIES", "get_policy", "eligible"]
