"""A bookie's dense range read, span by span (issue 18): the records of
index run slices (``LedgerIndex.run_slices``) read in order, records
adjacent on disk in one pread; and the check of what a range read read
before it is served (``good_prefix``).  A striped reader's share (a filter by
residue) is ``bookie/striped_read.py``'s; ``Storage.read_range`` and
``read_sparse`` call the one or the other.  Pure but for ``read_at``,
the pread (or, on the read port, the span's location kept to be sent
from the file)."""
from __future__ import annotations

from bisect import bisect_right
from typing import Callable, Iterable

from bookie import entry as E


def read_runs(slices: Iterable, max_bytes: int,
              read_at: Callable[[int, int], object]) -> tuple[list, int | None, bool, int]:
    """Reads the records of index run slices (``LedgerIndex.run_slices``)
    in order, at most `max_bytes` but at least one record, records
    adjacent on disk in one ``read_at(location, length)``.  Returns
    (records, the id after the last one read or None, whether `max_bytes`
    stopped it, how many records).  Costs per disk span
    (``Run.breaks_after``), not per record: within a span record k ends
    where record k+1 begins, so its bytes are a difference of locations
    and the cut a bisection."""
    out, size, count, nxt = [], 0, 0, None
    span_loc, span_len = -1, 0  # the bytes being gathered for one pread
    for run, lo, hi in slices:
        locs, lens, start = run.locs, run.lens, run.start
        breaks, i = run.breaks_after(lo)
        n_breaks = len(breaks)
        a = lo
        while a < hi:  # the span [a, b)
            if i < n_breaks and breaks[i] < hi:
                b = breaks[i]
                i += 1
            else:
                b = hi
            loc = locs[a]
            ln = locs[b - 1] + lens[b - 1] - loc
            if size + ln > max_bytes:  # the records of [a, b) that fit: a..m-1
                budget = max_bytes - size
                m = bisect_right(locs, loc + budget, a + 1, b) - 1 if budget >= 0 else a
                if m == a and not count:
                    m = a + 1  # at least one record
                if m < b:  # (else the one record is the span, read below)
                    if m > a:
                        if loc != span_loc + span_len:
                            if span_len:
                                out.append(read_at(span_loc, span_len))
                            span_loc, span_len = loc, 0
                        span_len += locs[m] - loc
                        count += m - a
                    if span_len:
                        out.append(read_at(span_loc, span_len))
                    return out, start + m, True, count
            if loc == span_loc + span_len:
                span_len += ln
            else:
                if span_len:
                    out.append(read_at(span_loc, span_len))
                span_loc, span_len = loc, ln
            size += ln
            count += b - a
            a = b
        nxt = start + hi
    if span_len:
        out.append(read_at(span_loc, span_len))
    return out, nxt, False, count



def good_prefix(buf: bytes, n: int, ledger_id: int,
                held: Callable[[], Iterable[tuple[int, int, int]]]) -> tuple[int, int, E.ChecksumMismatch | None]:
    """(how many records passed, where they end in ``buf``, the first bad
    one or None) of the ``n`` records a range read read, joined in ``buf``:
    checked in one pass by their own lengths and CRCs, and where that fails
    (a CRC, or a length field rotted: the walk then goes astray) record by
    record as the index names them (``held()``: their (entry id, location,
    length), ``Storage.held_records``), so that the bad one is told by its
    id in the index, not by its own header."""
    try:
        count, good_end, bad = E.verified_prefix(buf)
        if bad is None and count == n:
            return count, good_end, None
    except E.MalformedEntry:
        pass
    off = 0
    for k, (eid, _, ln) in enumerate(held()):
        if E.rotted(buf, ledger_id, ((eid, off, ln),)):
            return k, off, E.ChecksumMismatch(ledger_id, eid)
        off += ln
    raise E.MalformedEntry(f"ledger {ledger_id}: a range read's records are not the ones its index names")


__all__ = ["read_runs", "good_prefix"]
