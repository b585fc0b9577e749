"""The simulated metadata store: one ledger's metadata under a version, changed
only by compare-and-swap (etcd's mod_revision compare), linearizable."""
from __future__ import annotations

from dataclasses import dataclass, replace

OPEN, IN_RECOVERY, CLOSED = "OPEN", "IN_RECOVERY", "CLOSED"

Frag = tuple[int, tuple[str, ...]]  # (first entry, ensemble)


@dataclass(frozen=True, slots=True)
class LedgerMeta:
    state: str
    term: int
    frags: tuple[Frag, ...]
    last: int = -1           # CLOSED only
    E: int = 3
    Qw: int = 3
    Qa: int = 2

    @property
    def last_frag(self) -> Frag:
        return self.frags[-1]

    def with_(self, **kw) -> "LedgerMeta":
        return replace(self, **kw)


def frag_of(frags: tuple[Frag, ...], entry_id: int) -> Frag:
    """The fragment covering entry_id (the spec's FragIndex)."""
    f = frags[0]
    for g in frags:
        if g[0] <= entry_id:
            f = g
        else:
            break
    return f


def with_fragment(frags: tuple[Frag, ...], first: int, ens: tuple[str, ...]) -> tuple[Frag, ...]:
    """A new last fragment; it replaces the last one if it starts at the same entry."""
    assert first >= frags[-1][0], (first, frags)
    if first == frags[-1][0]:
        return frags[:-1] + ((first, tuple(ens)),)
    return frags + ((first, tuple(ens)),)


class MetaStore:
    def __init__(self, meta: LedgerMeta):
        self.meta = meta
        self.version = 1
        self.history: list[LedgerMeta] = [meta]

    def read(self) -> tuple[LedgerMeta, int]:
        return self.meta, self.version

    def cas(self, new: LedgerMeta, version: int) -> bool:
        if version != self.version:
            return False
        self.meta = new
        self.version += 1
        self.history.append(new)
        return True
