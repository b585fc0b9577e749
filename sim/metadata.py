"""The simulated metadata store: one ledger's metadata under a version, changed
only by compare-and-swap (etcd's mod_revision compare), linearizable.

The life-cycle rules are not here: a client judges a ``stream.lifecycle``
intent on the store's metadata (:meth:`MetaStore.judge`, which shows it as
the ``LedgerMetadata`` the shipped code sees) and the store executes the
verdict's Apply (:meth:`MetaStore.apply`)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState

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


LID = 7


def as_ledger_metadata(m: LedgerMeta, unbounded: bool) -> LedgerMetadata:
    """The simulated metadata as the shipped code's ``LedgerMetadata``."""
    frags = tuple(Fragment(first, ens) for first, ens in m.frags)
    return LedgerMetadata(m.E, m.Qw, m.Qa, ledger_id=LID, state=LedgerState[m.state], last_entry=m.last,
                          term=m.term, mode=LedgerMode.UNBOUNDED if unbounded else LedgerMode.CLASSIC,
                          fragments=frags, fragment_count=len(frags), last_fragment_first_entry=frags[-1].first_entry)


class MetaStore:
    def __init__(self, meta: LedgerMeta, unbounded: bool = True):
        self.meta = meta
        self.unbounded = unbounded
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

    def judge(self, intent) -> tuple[object, int]:
        """A ``stream.lifecycle`` intent's verdict on the current metadata,
        and the version it was judged at (for :meth:`apply`)."""
        return intent.judge(as_ledger_metadata(self.meta, self.unbounded)), self.version

    def apply(self, apply, version: int) -> bool:
        """Executes a verdict's Apply by CAS: its header fields, and its
        fragments merged by first entry (as ``LedgerStore.add_fragments``)."""
        h = apply.header
        frags = dict(self.meta.frags)
        frags.update((f.first_entry, f.ensemble) for f in apply.fragments)
        new = self.meta.with_(state=h.state.name, term=h.term, last=h.last_entry,
                              frags=tuple(sorted(frags.items())))
        return self.cas(new, version)
