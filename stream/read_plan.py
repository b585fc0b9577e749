"""Read planning: which replica serves which entry ids of a reader's range
read.  Pure: no I/O, no clock; the adapter (``stream.ledger``) sends what it
plans and merges what comes back.

A plan covers the ids ``first..last`` of one fragment with range reads, each
to one bookie of the fragment's ensemble, and assigns every id to exactly one
bookie *of its write set* (``stream.quorum.write_set``): each byte is asked
once, and the bookies serve in parallel.

- Qw = E: every bookie holds every id; the range is cut into blocks of
  ``block_entries`` ids (0: one block), dealt round the healthy bookies from
  ``rotation`` on.  A request carries no stripe filter.
- E > Qw (striped): ids are split by residue ``id mod E``; the ids of
  residue r share one write set (r, r+1, ... mod E), so bookie b holds the
  ids of the Qw residues b - Qw + 1 .. b, adjacent in its journal.  With
  every bookie healthy, a block's residues are cut into arcs of Qw
  consecutive residues (one shorter when Qw does not divide E), each asked
  of the bookie that holds the whole arc: it sends all it holds of the
  block, one piece of its disk (but for the short arc's bookie, which
  skips its residues outside the arc).  A bookie asked for one residue of
  its Qw skipped the others record by record, at 6-8x the CPU per record
  of its storage read (issue 18).  ``rotation`` picks where the arcs start, as it
  picks the bookie of a Qw = E range: a reader that spreads its chunks
  turns it chunk by chunk, and with ``block_entries`` each block's arcs
  start one residue further, so the E bookies share the reads evenly.
  With bookies to avoid, residue r goes to its member ``(r + rotation mod
  Qw) mod E`` if healthy, else to the next healthy member.  A request
  carries the stripe filter (``stripe`` = E, ``residues`` = a bit per
  residue it serves: proto/bookie.proto ReadRangeRequest), so a bookie
  sends only its share.

What a plan does not decide: whether an entry is missing.  Whatever a
planned read does not deliver (a bookie down, slow, missing the entry, or a
frame that fails its checksum) is read entry by entry over its whole write
set (``stream.read_core.EntryRead``), which alone may conclude that an entry
is missing (Qw - Qa + 1 replicas said so).  A planned read only ever *adds* entries, and only those of ids
it was planned for (``RangeRead.wants``): an entry from a bookie outside the
id's write set is dropped.
"""
from __future__ import annotations

import functools
from typing import Iterator, NamedTuple

from stream.quorum import MAX_ENSEMBLE, write_set


class RangeRead(NamedTuple):
    """One range read: ids ``first..last`` from the bookie at
    ``bookie_index`` of the fragment's ensemble; with ``stripe`` > 0 only
    the ids whose ``id mod stripe`` has its bit set in ``residues``."""

    bookie_index: int
    first: int
    last: int
    stripe: int = 0
    residues: int = 0

    def steps(self) -> int | tuple[int, ...]:
        """From each id of this read to the next: 1, or with a stripe, the
        distance from an id of residue r to the next residue asked for, per
        r (``bookie.entry.sparse_runs``'s ``step``)."""
        if not self.stripe:
            return 1
        return residue_steps(self.stripe, self.residues)

    def wants(self, entry_id: int) -> bool:
        """Whether ``entry_id`` is one of this read's ids."""
        if not self.first <= entry_id <= self.last:
            return False
        return not self.stripe or bool(self.residues >> (entry_id % self.stripe) & 1)

    def ids(self) -> Iterator[int]:
        """The ids of this read, ascending."""
        if not self.stripe:
            yield from range(self.first, self.last + 1)
            return
        for eid in range(self.first, self.last + 1):
            if self.residues >> (eid % self.stripe) & 1:
                yield eid

    def count(self) -> int:
        """How many ids this read asks for (without walking them)."""
        if not self.stripe:
            return self.last - self.first + 1
        return count_ids(self.first, self.last, self.stripe, self.residues)


def count_ids(first: int, last: int, stripe: int, residues: int) -> int:
    """How many ids of ``first..last`` have their bit (id mod stripe) set in ``residues``."""
    if last < first:
        return 0
    n = last - first + 1
    full, rest = divmod(n, stripe)
    c = full * bin(residues & ((1 << stripe) - 1)).count("1")
    for e in range(first + full * stripe, last + 1):   # (fewer than `stripe`)
        c += residues >> (e % stripe) & 1
    return c


@functools.lru_cache(maxsize=256)
def residue_steps(stripe: int, residues: int) -> tuple[int, ...]:
    """Per residue r of ``id mod stripe``: how far the next id whose residue
    is in ``residues`` lies (1..stripe)."""
    assert 0 < residues < 1 << stripe, (stripe, residues)
    return tuple(next(d for d in range(1, stripe + 1) if residues >> ((r + d) % stripe) & 1)
                 for r in range(stripe))


def arcs(ensemble_size: int, write_quorum: int, offset: int) -> list[tuple[int, int]]:
    """The residues of ``id mod E`` cut into arcs of Qw consecutive residues
    from ``offset`` on (the last one shorter when Qw does not divide E), as
    (ensemble index, residue bits): each arc asked of the bookie that holds
    all of it, the last member of the write set of its first residue."""
    E, Qw = ensemble_size, write_quorum
    out = []
    for a in range(0, E, Qw):
        start = (offset + a) % E
        mask = 0
        for r in range(a, min(E, a + Qw)):
            mask |= 1 << ((offset + r) % E)
        out.append(((start + Qw - 1) % E, mask))
    return out


def residue_owners(ensemble_size: int, write_quorum: int, avoid: frozenset[int] | set[int] = frozenset(),
                   rotation: int = 0) -> list[int]:
    """For each residue r of ``id mod E``, the ensemble index that serves its
    ids: a member of r's write set, its ``rotation mod Qw``-th first, the
    next healthy one (not in ``avoid``) after it; if the whole write set is
    to be avoided, its first choice anyway (the entry-by-entry reads decide)."""
    assert 1 <= write_quorum <= ensemble_size <= MAX_ENSEMBLE, (ensemble_size, write_quorum)
    owners = []
    for r in range(ensemble_size):
        ws = write_set(r, ensemble_size, write_quorum)
        start = rotation % write_quorum
        order = ws[start:] + ws[:start]
        owners.append(next((b for b in order if b not in avoid), order[0]))
    return owners


def plan_reads(first: int, last: int, ensemble_size: int, write_quorum: int, *,
               avoid: frozenset[int] | set[int] = frozenset(), rotation: int = 0,
               block_entries: int = 0) -> list[RangeRead]:
    """The range reads covering ``first..last`` of one fragment (ensemble
    indexes, see the module doc), every id in exactly one of them, in the
    order of their first ids.  ``avoid``: ensemble indexes to leave out
    while another member can serve (quarantined bookies)."""
    if first < 0 or last < first:
        raise ValueError(f"bad entry range {first}..{last}")
    if block_entries < 0:
        raise ValueError(f"block_entries must be >= 0, got {block_entries}")
    E, Qw = ensemble_size, write_quorum
    assert 1 <= Qw <= E <= MAX_ENSEMBLE, (E, Qw)
    if Qw == E:
        healthy = [b for b in range(E) if b not in avoid] or list(range(E))
        size = block_entries or (last - first + 1)
        plans = []
        for k, a in enumerate(range(first, last + 1, size)):
            plans.append(RangeRead(healthy[(rotation + k) % len(healthy)], a, min(last, a + size - 1)))
        return plans
    count = last - first + 1
    if avoid:
        owners = residue_owners(E, Qw, avoid, rotation)
        masks: dict[int, int] = {}
        for r, b in enumerate(owners):
            masks[b] = masks.get(b, 0) | (1 << r)
        shares = [sorted(masks.items())]
    else:   # the arcs from `rotation` on, one residue further each block (Qw tilings when Qw divides E)
        shares = [arcs(E, Qw, rotation + k) for k in range(Qw if E % Qw == 0 else E)]
    size = block_entries or count
    plans = []
    for k, a in enumerate(range(first, last + 1, size)):
        z = min(last, a + size - 1)
        for b, mask in shares[k % len(shares)]:
            read = RangeRead(b, a, z, E, mask)
            if z - a + 1 >= E or read.count():  # (a short block may miss a residue)
                plans.append(read)
    plans.sort(key=lambda p: (p.first, _first_id(p)))
    return plans


def plan_missing(missing: list[int], ensemble_size: int, write_quorum: int, *,
                 avoid: frozenset[int] | set[int] = frozenset(), rotation: int = 0) -> list[RangeRead]:
    """A next round for the ids (ascending, of one fragment) that the last
    round's reads did not deliver, asking other bookies (``avoid``: those
    that left some undelivered): ``plan_reads`` over their span, each read
    cut down to the missing ids it covers (its first and last, or with a
    stripe, the residues of missing ids), reads left with none dropped.
    Every missing id is in exactly one read, of a bookie of its write set."""
    if not missing:
        return []
    lo, hi = missing[0], missing[-1]
    out = []
    for r in plan_reads(lo, hi, ensemble_size, write_quorum, avoid=avoid, rotation=rotation):
        if not r.stripe:
            out.append(r)   # (one block: the span of the missing ids)
            continue
        mask = 0
        for eid in missing:
            mask |= 1 << (eid % r.stripe)
        if r.residues & mask:
            out.append(r._replace(residues=r.residues & mask))
    return out


def _first_id(read: RangeRead) -> int:
    return next(read.ids(), read.last + 1)


__all__ = ["RangeRead", "arcs", "count_ids", "plan_missing", "plan_reads", "residue_owners", "residue_steps"]
