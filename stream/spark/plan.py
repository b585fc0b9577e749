"""Planning for the Spark source, as pure functions (no I/O, no clock).

A source is a *chain* of ledgers read in order: a stream is one unbounded
ledger, a log the classic ledgers of its list, ``ledger`` one classic
ledger.  The driver reads a :class:`LedgerView` of each (its readable
entries: from ``first`` to ``end``, the LAC or a closed ledger's last
entry), then everything below is decided here:

- an *offset* is where the next read starts, ``{"ledger": L, "entry": E}``
  (JSON in Spark's checkpoints); :func:`normalise` moves an offset past the
  end of a closed ledger onto the next one, so equal places are equal
  offsets;
- :func:`resolve` turns ``startingPositions`` / ``endingPositions``
  (``earliest``, ``latest``, an offset) into an offset, and tells whether
  the place was trimmed (data loss);
- :func:`advance` finds the end offset of a micro-batch under a record
  limit; :func:`ranges` the entry ranges between two offsets;
- :func:`split` cuts those ranges at fragment boundaries and into pieces of
  at most ``max_entries`` (and at least ``min_partitions`` pieces in all):
  the input partitions.

Limits count entry ids; a stream's no-op entries (one per take-over) take
an id, so a micro-batch may return a record or so fewer than its limit.
"""
from __future__ import annotations

import dataclasses
import struct
from typing import Sequence

KINDS = ("stream", "log", "ledger")
_POS_STREAM = struct.Struct(">q")      # stream.stream.Position's bytes: the entry id
_POS_LEDGER = struct.Struct(">qq")     # (ledger id, entry id) for logs and ledgers


class PlanError(ValueError):
    """A bad option value (not retriable)."""

    retriable = False


@dataclasses.dataclass(frozen=True)
class LedgerView:
    """One ledger of the chain as read now."""

    ledger_id: int
    first: int          # the lowest readable entry (a stream's trim point; 0 otherwise)
    end: int            # the highest readable entry (-1: none yet)
    closed: bool        # no entry will ever come after ``end``


@dataclasses.dataclass(frozen=True)
class Range:
    """Entries ``first..last`` (inclusive) of one ledger, within one fragment."""

    ledger_id: int
    first: int
    last: int
    fragment: int = 0   # the fragment's index among the ledger's fragments at planning

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def offset(ledger_id: int, entry_id: int) -> dict:
    return {"ledger": int(ledger_id), "entry": int(entry_id)}


def _key(views: Sequence[LedgerView], off: dict) -> tuple[int, int]:
    """Where an offset sits in the chain, for ordering: (index in the chain,
    entry).  Ledger 0 is the start of a chain that had no ledger yet; a
    ledger no longer in the chain sorts first (it was trimmed: a log's list
    loses only its head).  Ledger ids are not compared: a sink appends
    ledgers in partition order, not in id order."""
    lid = off["ledger"]
    if lid == 0:
        return 0, views[0].first if views else 0
    for i, v in enumerate(views):
        if v.ledger_id == lid:
            return i, off["entry"]
    return -1, off["entry"]


def normalise(views: Sequence[LedgerView], off: dict) -> dict:
    """The same place, moved past the end of closed ledgers onto the next."""
    i, e = _key(views, off)
    while 0 <= i < len(views) - 1 and views[i].closed and e > views[i].end:
        i += 1
        e = views[i].first
    if 0 <= i < len(views):
        return offset(views[i].ledger_id, e)
    return dict(off)


def earliest(views: Sequence[LedgerView]) -> dict:
    if not views:
        return offset(0, 0)
    return normalise(views, offset(views[0].ledger_id, views[0].first))


def latest(views: Sequence[LedgerView]) -> dict:
    if not views:
        return offset(0, 0)
    v = views[-1]
    return normalise(views, offset(v.ledger_id, max(v.first, v.end + 1)))


def trimmed(views: Sequence[LedgerView], off: dict) -> bool:
    """True when entries at ``off`` were removed (a stream trimmed past it, a
    log's list truncated past its ledger)."""
    i, e = _key(views, off)
    if i < 0:
        return True
    return i < len(views) and e < views[i].first


def resolve(views: Sequence[LedgerView], spec: str | dict, *, fail_on_data_loss: bool) -> dict:
    """``earliest`` / ``latest`` / an offset as an offset of this chain.
    A trimmed offset raises PlanError when ``fail_on_data_loss``, else moves
    to the earliest readable place."""
    if spec == "earliest":
        return earliest(views)
    if spec == "latest":
        return latest(views)
    if trimmed(views, spec):
        if fail_on_data_loss:
            raise PlanError(f"position {spec} was trimmed (set failOnDataLoss=false to skip to the earliest)")
        return earliest(views)
    return normalise(views, spec)


def at_or_after(views: Sequence[LedgerView], a: dict, b: dict) -> bool:
    return _key(views, a) >= _key(views, b)


def ranges(views: Sequence[LedgerView], start: dict, end: dict) -> list[Range]:
    """The entry ranges from ``start`` (included) to ``end`` (excluded)."""
    out: list[Range] = []
    (si, se), (ei, ee) = _key(views, start), _key(views, end)
    for i in range(max(si, 0), min(ei, len(views) - 1) + 1):
        v = views[i]
        a = se if i == si else v.first
        b = (ee - 1) if i == ei else v.end
        a = max(a, v.first)
        if b >= a:
            out.append(Range(v.ledger_id, a, b))
    return out


def advance(views: Sequence[LedgerView], start: dict, max_entries: int | None) -> dict:
    """The end offset of a micro-batch from ``start``: the end of what is
    readable, or earlier so that at most ``max_entries`` entries lie between
    (None: no limit).  Never before ``start``."""
    end = latest(views)
    if not at_or_after(views, end, start):
        return dict(start)
    if max_entries is None:
        return end
    budget = max_entries
    for r in ranges(views, start, end):
        if r.count >= budget:
            return normalise(views, offset(r.ledger_id, r.first + budget))
        budget -= r.count
    return end


def split(rs: Sequence[Range], boundaries: dict[int, Sequence[tuple[int, int]]], *,
          max_entries: int, min_partitions: int = 1) -> list[Range]:
    """Cuts the ranges at fragment boundaries (``boundaries[ledger]``: the
    (index, first entry) of each fragment, ascending), then into pieces of at
    most ``max_entries``, then halves the largest pieces until there are at
    least ``min_partitions`` (when there are entries enough)."""
    if max_entries < 1:
        raise PlanError(f"max entries per partition must be >= 1, not {max_entries}")
    pieces: list[Range] = []
    for r in rs:
        frags = list(boundaries.get(r.ledger_id, ())) or [(0, 0)]
        for k, (idx, first) in enumerate(frags):
            nxt = frags[k + 1][1] if k + 1 < len(frags) else None
            a = max(r.first, first)
            b = r.last if nxt is None else min(r.last, nxt - 1)
            while a <= b:
                c = min(b, a + max_entries - 1)
                pieces.append(Range(r.ledger_id, a, c, idx))
                a = c + 1
    while 0 < len(pieces) < min_partitions:
        i = max(range(len(pieces)), key=lambda j: pieces[j].count)
        p = pieces[i]
        if p.count < 2:
            break
        mid = p.first + p.count // 2
        pieces[i:i + 1] = [Range(p.ledger_id, p.first, mid - 1, p.fragment),
                           Range(p.ledger_id, mid, p.last, p.fragment)]
    return pieces


# -- positions -----------------------------------------------------------------------------

def encode_position(kind: str, ledger_id: int, entry_id: int) -> bytes:
    """The ``position`` column: a stream's is ``bytes(Position)`` (so
    ``Position.from_bytes`` reads it); a log's or a ledger's is
    (ledger id, entry id), 16 bytes big-endian."""
    if kind == "stream":
        return _POS_STREAM.pack(entry_id)
    return _POS_LEDGER.pack(ledger_id, entry_id)


def decode_position(kind: str, data: bytes, stream_ledger: int | None = None) -> dict:
    """The offset of the entry a ``position`` value names."""
    if kind == "stream":
        if len(data) != _POS_STREAM.size:
            raise PlanError(f"not a stream position: {data.hex()}")
        (e,) = _POS_STREAM.unpack(data)
        if e < 0:
            raise PlanError(f"not an entry position: {data.hex()}")
        return offset(stream_ledger or 0, e)
    if len(data) != _POS_LEDGER.size:
        raise PlanError(f"not a log/ledger position: {data.hex()}")
    lid, e = _POS_LEDGER.unpack(data)
    if lid <= 0 or e < 0:
        raise PlanError(f"not an entry position: {data.hex()}")
    return offset(lid, e)


def parse_position_option(kind: str, text: str, *, option: str) -> str | dict:
    """``earliest``, ``latest``, the hex of a ``position`` value (that entry,
    included), or an offset as JSON (``{"ledger": L, "entry": E}``; a
    stream's ledger may be left out).  Offsets for a stream get their ledger
    filled in by the caller (``ledger`` 0 here)."""
    import json

    t = (text or "").strip()
    if t.lower() in ("earliest", "latest"):
        return t.lower()
    if t.startswith("{"):
        try:
            d = json.loads(t)
            e = int(d["entry"])
            lid = int(d.get("ledger", 0))
        except (ValueError, KeyError, TypeError) as x:
            raise PlanError(f"{option}: bad offset {t!r}: {x}") from None
        if e < 0 or lid < 0 or (kind != "stream" and lid == 0):
            raise PlanError(f"{option}: bad offset {t!r}")
        return offset(lid, e)
    try:
        data = bytes.fromhex(t)
    except ValueError:
        raise PlanError(f"{option}: expected earliest, latest, a position (hex) or an offset (JSON), "
                        f"not {t!r}") from None
    return decode_position(kind, data)
