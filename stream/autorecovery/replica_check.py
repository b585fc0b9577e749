"""The full replica check of a ledger (BookKeeper's ``LedgerChecker``): every
entry id of its sealed fragments (and of an open one up to its LAC) asked
of every bookie of its write set.

The auditor's periodic check (``service.run_check``) asks each bookie one
``ReadLac`` per ledger: cheap, and blind to an entry missing in the middle
of a range (a write that timed out on one bookie after Qa others acked it,
the fragment then changed from the LAC on, as BookKeeper's ensemble change
does) and to replicas that disagree.  This check reads them all: one sparse
range read per bookie and fragment (a striped one asks only the residues
the bookie's position holds), every record's checksum verified.  Or a
share of each fragment (``sampled_ranges``, BookKeeper's
``auditorLedgerVerificationPercentage``): its first and last id, and
windows of ids (drawn at random for a check made once; the periodic check's
passes take the windows in turn, so that every id is read within
``ceil(100 / percent)`` passes), so that a periodic check of a big cluster
need not read every ledger Qw times a period; a pass finds what it reads.

:func:`tally` is the judgement, pure: given what each bookie of a fragment
answered, the ids held by fewer than Qw replicas (under-replicated), by
fewer than Qa (below the ack quorum: one more loss may lose them), by none
(lost), and held differently (divergent: two replicas whose records at one
id are not the same entry).  A bookie that did not answer is *unknown*,
never missing: an id is judged below Qa or lost only if it would be so
even were every unknown replica to hold it.  Two records are the same entry
when their checksums match (the checksum covers the ids, LAC, LAFR, data
flags, origin term and payload: what the entry is), or when both are no-ops
of the same origin term (autorecovery re-signs a truncate no-op as a plain
one: stream/autorecovery/copier.py).

:func:`check_ledger` is the adapter (range reads through the client's
bookie connections).  ``bookstream ledgers check`` / ``streams check`` print
it; the fault suite runs it at the end of a run (tests/fault/run.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from typing import Iterable

from bookie import entry as entry_codec
from bookie.core import Status
from metadata.ledgers import LedgerMetadata
from stream.bookie_client import BookieUnavailable
from stream.lifecycle import fragment_end
from stream.quorum import write_set

READ_FRAME_BYTES = 1 << 20
CHUNK_IDS = 1 << 16   # ids of a fragment judged at a time (check_ledger)
SAMPLE_WINDOW = 64    # ids a sampled check reads together (sampled_ranges)

# What a bookie holds at one id: ("data", checksum) or ("noop", origin term).
Held = tuple[str, int]


@dataclasses.dataclass
class FragmentReplicas:
    """The check of one fragment: ids ``first_entry..last_entry`` (from the
    trim point on).  ``missing`` and the lists below it hold ``[first,
    last]`` id ranges; ``divergent`` holds single ids."""

    first_entry: int
    last_entry: int
    ensemble: tuple[str, ...]
    unanswered: list[str] = dataclasses.field(default_factory=list)
    missing: dict[str, list[list[int]]] = dataclasses.field(default_factory=dict)  # bookie -> ids it lacks
    under_replicated: list[list[int]] = dataclasses.field(default_factory=list)    # fewer than Qw (known)
    below_ack_quorum: list[list[int]] = dataclasses.field(default_factory=list)    # fewer than Qa, unknowns counted in
    lost: list[list[int]] = dataclasses.field(default_factory=list)                # none, every replica answered
    divergent: list[int] = dataclasses.field(default_factory=list)                 # ids held as different entries
    bad_records: dict[str, int] = dataclasses.field(default_factory=dict)          # bookie -> records failing their CRC
    checked: int = 0    # ids judged (a sampled check: fewer than first..last)

    @property
    def clean(self) -> bool:
        return not (self.unanswered or self.under_replicated or self.divergent or self.bad_records)

    def as_json(self) -> dict:
        return dataclasses.asdict(self) | {"ensemble": list(self.ensemble)}


def _ranges(ids: Iterable[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for e in ids:
        if out and out[-1][1] == e - 1:
            out[-1][1] = e
        else:
            out.append([e, e])
    return out


def checked_fragments(meta: LedgerMetadata, lac: int | None = None) -> list[tuple[int, int, tuple[str, ...]]]:
    """(first, last, ensemble) of each sealed fragment with ids to check
    (from the trim point on), and the open fragment of an open ledger up to
    ``lac`` when given (entries up to the LAC were acknowledged; above it
    they are its writer's, still in flight)."""
    assert meta.fragments_complete
    out = []
    for f in meta.fragments:
        end = fragment_end(meta, f.first_entry)
        if end is None and lac is not None:
            end = lac
        first = max(f.first_entry, meta.trimmed_before)
        if end is not None and end >= first:
            out.append((first, end, f.ensemble))
    return out


def tally(first: int, last: int, ensemble: tuple[str, ...], write_quorum: int, ack_quorum: int,
          answers: dict[int, dict[int, Held] | None], bad: dict[int, int] | None = None) -> FragmentReplicas:
    """Judges one fragment's replicas.  ``answers``: ensemble index -> {id:
    what it holds} (the ids of its write sets in ``first..last`` it sent),
    or None when it did not answer; ``bad``: index -> records that failed
    their checksum (held by nobody, as far as this check goes)."""
    E = len(ensemble)
    out = FragmentReplicas(first, last, ensemble, checked=last - first + 1,
                           unanswered=[ensemble[i] for i in range(E) if answers.get(i) is None],
                           bad_records={ensemble[i]: n for i, n in (bad or {}).items() if n})
    missing: dict[int, list[int]] = {}
    under, below, lost, divergent = [], [], [], []
    for e in range(first, last + 1):
        held, unknown = [], 0
        for i in write_set(e, E, write_quorum):
            got = answers.get(i)
            if got is None:
                unknown += 1
            elif e in got:
                held.append(got[e])
            else:
                missing.setdefault(i, []).append(e)
        if len(held) + unknown < write_quorum:   # (an answering replica lacks it)
            under.append(e)
        if len(held) + unknown < ack_quorum:
            below.append(e)
        if not held and not unknown:
            lost.append(e)
        if len(set(held)) > 1:
            divergent.append(e)
    out.missing = {ensemble[i]: _ranges(ids) for i, ids in sorted(missing.items())}
    out.under_replicated, out.below_ack_quorum, out.lost = _ranges(under), _ranges(below), _ranges(lost)
    out.divergent = divergent
    return out


def sampled_ranges(first: int, last: int, percent: float, rng: random.Random | None = None,
                   window: int = SAMPLE_WINDOW, *, pass_no: int | None = None) -> list[tuple[int, int]]:
    """The ids of ``first..last`` a check reading ``percent`` of a fragment
    reads (BookKeeper's ``auditorLedgerVerificationPercentage``): the first
    and the last id always (0: only those, BookKeeper's default), and that
    share of the fragment's windows of ``window`` ids; ascending, disjoint,
    adjacent ones merged.  100: the whole range.  The windows are drawn by
    ``rng`` (a check made once), or, for the ``pass_no``-th pass of a
    periodic check, the next run of them after the previous pass's, round
    the fragment: any ``ceil(100 / percent)`` consecutive passes read every
    id (drawn at random, some window would go unread for many passes)."""
    assert 0 <= percent <= 100 and first <= last
    if percent >= 100:
        return [(first, last)]
    starts = range(first, last + 1, window)
    n = len(starts)
    if pass_no is None:
        picked_starts = (rng or random.Random()).sample(starts, round(n * percent / 100))
    else:   # k windows a pass, ceil(n / k) <= ceil(100 / percent) passes round the fragment
        k = min(n, math.ceil(n * percent / 100))
        picked_starts = [starts[(pass_no * k + j) % n] for j in range(k)]
    picked = [(a, min(a + window - 1, last)) for a in sorted(picked_starts)]
    out: list[tuple[int, int]] = []
    for a, b in sorted([(first, first), (last, last), *picked]):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def damaged(frags: list[FragmentReplicas], registered: Iterable[str]) -> frozenset[str]:
    """The registered bookies a check found lacking ids of their write sets,
    or holding records that fail their checksum: what the auditor's full
    periodic check names to the workers as damaged (a bookie that did not
    answer is not: unknown is not missing)."""
    registered = set(registered)
    return frozenset(b for f in frags for b in [*f.missing, *f.bad_records] if b in registered)


def missing_ids(frags: list[FragmentReplicas], bookies: Iterable[str]) -> dict[str, list[list[int]]]:
    """Per bookie of ``bookies`` (those ``damaged`` named), the id ranges
    of every fragment that it lacks (a record failing its checksum
    included): the task's ``damaged_ids``, filled in place."""
    return {b: [r for f in frags for r in f.missing.get(b, [])] for b in bookies}


def _residues(index: int, E: int, Qw: int) -> int:
    """The residues (id mod E) whose write set holds ensemble position ``index``."""
    return sum(1 << r for r in range(E) if index in write_set(r, E, Qw))


async def _read_held(client, bookie: str, lid: int, first: int, last: int, E: int, Qw: int, index: int,
                     timeout: float) -> tuple[dict[int, Held] | None, int]:
    """What ``bookie`` holds of ``first..last`` (its write sets' ids), and
    how many records failed their checksum; (None, 0) when it did not answer."""
    bc = await client.bookie(bookie)
    if bc is None:
        return None, 0
    stripe = (E, _residues(index, E, Qw)) if Qw < E else (0, 0)
    held: dict[int, Held] = {}
    bad, through = 0, first - 1   # every id up to `through` is vouched for (proto/bookie.proto: sparse)
    try:
        # reader_verifies: the bookie sends a record that fails its CRC as it is, and the check counts
        # it (without it the bookie stops there, CHECKSUM_MISMATCH, and its whole answer is lost)
        async for resp in bc.read_range(lid, first, last, max_frame_bytes=READ_FRAME_BYTES, sparse=True,
                                        frame_timeout=timeout, stripe=stripe[0], residues=stripe[1],
                                        reader_verifies=True):
            if resp.status == Status.NO_SUCH_LEDGER:
                return {}, 0   # (it holds nothing of the ledger)
            if resp.status != Status.OK:
                return None, 0
            through = max(through, resp.through)
            buf = memoryview(resp.entries)
            for eid, start, end in entry_codec.record_spans(buf):
                try:
                    h = entry_codec.scan(buf[start:end])[0]
                except (entry_codec.ChecksumMismatch, entry_codec.MalformedEntry):
                    bad += 1
                    continue
                if first <= eid <= last:
                    held[eid] = ("noop", h.origin) if h.is_noop else ("data", h.checksum)
    except (BookieUnavailable, asyncio.TimeoutError, entry_codec.MalformedEntry):
        return None, 0
    return (held, bad) if through >= last else (None, 0)   # (a stream cut short vouches for nothing above)


async def check_ledger(client, meta: LedgerMetadata, *, lac: int | None = None, timeout: float = 10.0,
                       progress=None, chunk: int = CHUNK_IDS, percent: float = 100.0,
                       rng: random.Random | None = None, pass_no: int | None = None) -> list[FragmentReplicas]:
    """Reads every sealed fragment of ``meta`` (all its fragments loaded),
    and an open one up to ``lac`` if given, from each bookie of its
    ensemble, the bookies of a fragment at once, ``chunk`` ids at a time
    (what is held in memory: a fragment of 256 MiB of 100-byte entries has
    2.6 M ids); ``progress(fragments_done, fragments)`` after each.
    ``percent`` below 100: only ``sampled_ranges`` of each fragment (its
    first and last id, and that share of its windows, drawn by ``rng``, or
    those of a periodic check's ``pass_no``-th pass)."""
    lid, E, Qw, Qa = meta.ledger_id, meta.ensemble_size, meta.write_quorum, meta.ack_quorum
    frags = checked_fragments(meta, lac)
    rng = rng or random.Random()
    out = []
    for k, (first, last, ensemble) in enumerate(frags):
        acc = None
        for lo, hi in sampled_ranges(first, last, percent, rng, pass_no=pass_no):
            for a in range(lo, hi + 1, chunk):
                b = min(hi, a + chunk - 1)
                got = await asyncio.gather(*(_read_held(client, bk, lid, a, b, E, Qw, i, timeout)
                                             for i, bk in enumerate(ensemble)))
                part = tally(a, b, ensemble, Qw, Qa, {i: held for i, (held, _) in enumerate(got)},
                             {i: n for i, (_, n) in enumerate(got)})
                acc = part if acc is None else _joined(acc, part)
        out.append(acc)
        if progress is not None:
            progress(k + 1, len(frags))
    return out


def _joined(acc: FragmentReplicas, part: FragmentReplicas) -> FragmentReplicas:
    """``acc`` (ids below ``part.first_entry``; a sampled check's skip
    ids between them) and ``part`` as one."""
    def join(x: list[list[int]], y: list[list[int]]) -> list[list[int]]:
        if x and y and x[-1][1] + 1 == y[0][0]:
            return x[:-1] + [[x[-1][0], y[0][1]]] + y[1:]
        return x + y

    assert acc.last_entry < part.first_entry
    missing = dict(acc.missing)
    for b, r in part.missing.items():
        missing[b] = join(missing.get(b, []), r)
    bad = dict(acc.bad_records)
    for b, n in part.bad_records.items():
        bad[b] = bad.get(b, 0) + n
    return FragmentReplicas(acc.first_entry, part.last_entry, acc.ensemble,
                            unanswered=acc.unanswered + [b for b in part.unanswered if b not in acc.unanswered],
                            missing=missing, under_replicated=join(acc.under_replicated, part.under_replicated),
                            below_ack_quorum=join(acc.below_ack_quorum, part.below_ack_quorum),
                            lost=join(acc.lost, part.lost), divergent=acc.divergent + part.divergent,
                            bad_records=bad, checked=acc.checked + part.checked)


__all__ = ["FragmentReplicas", "Held", "check_ledger", "checked_fragments", "damaged", "missing_ids", "sampled_ranges", "tally"]
