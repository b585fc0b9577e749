"""Mutant switches: deliberately broken protocol rules, for tests only.

The simulation harness (``sim/``) must find a violation whenever one of these
is active; that is how we know the harness can fail.  Each mutation is
consulted by exactly one line in a protocol core (a call into this module
that does nothing unless the mutation is active).  Nothing in production ever
activates one: ``ACTIVE`` is empty unless a test enters :func:`mutated`.

========================== ================================================ ==============================
mutation                   the broken rule                                  spec (tla/BookstreamLedger.tla)
========================== ================================================ ==============================
SKIP_TRUNCATE_NOOP         recovery writes no truncate no-op: the next      (the protocol before the
                           writer continues at the first absent entry       seed's "UPDATE 1")
NOOP_WITHOUT_TRUNCATE      the final no-op carries no truncate flag         no_truncate
TRUNCATE_WITHOUT_GWQ       the no-op counts as written once Qa bookies      truncate_no_gwq
                           acked it (not every bookie of the ensemble)
RECOVERY_READS_WITHOUT_TERM fencing and recovery reads carry no term        recovery_reads_no_term
WRITEBACK_KEEPS_TRUNCATE   a recovered no-op is written back with its       writeback_truncates
                           truncate flag
IGNORE_ORIGIN_TERM         recovery ignores origin terms (no log matching:  (tla engineer: issue 12)
                           the floor stays 0), the rule before issue 12:
                           an aborted recovery's no-op, written back, lets
                           an older term's later entries in above it
========================== ================================================ ==============================

Hooks (one line each):

- ``stream/recovery_core.py`` ``RecoveryCore.start``: ``strip_read_terms(self._o_fencing)``
- ``stream/recovery_core.py`` ``RecoveryCore._fill_window`` and ``_ask_the_rest``: ``strip_read_terms(self._o_reads)``
- ``stream/recovery_core.py`` ``RecoveryCore._recovered``: ``flags = writeback_flags(flags, e.data_flags)``
- ``stream/recovery_core.py`` ``RecoveryCore._absent``: ``noop = recovery_noop(noop)``
- ``stream/recovery_core.py`` ``RecoveryCore._absent``: ``after_end_found(self)``
- ``stream/recovery_core.py`` ``RecoveryCore._take_acks``: ``noop_acked(self, wb)``
- ``stream/recovery_core.py`` ``RecoveryCore._advance``: ``self.floor = origin_floor(e.origin)``
- ``stream/recovery_core.py`` ``RecoveryCore._demote_stale``: ``strip_read_terms(self._o_reads)``
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

SKIP_TRUNCATE_NOOP = "skip_truncate_noop"
NOOP_WITHOUT_TRUNCATE = "noop_without_truncate"
TRUNCATE_WITHOUT_GWQ = "truncate_without_gwq"
RECOVERY_READS_WITHOUT_TERM = "recovery_reads_without_term"
WRITEBACK_KEEPS_TRUNCATE = "writeback_keeps_truncate"
IGNORE_ORIGIN_TERM = "ignore_origin_term"

ALL = (SKIP_TRUNCATE_NOOP, NOOP_WITHOUT_TRUNCATE, TRUNCATE_WITHOUT_GWQ, RECOVERY_READS_WITHOUT_TERM,
       WRITEBACK_KEEPS_TRUNCATE, IGNORE_ORIGIN_TERM)

# The active mutations.  Empty in production; only mutated() changes it.
ACTIVE: set[str] = set()


def active(name: str) -> bool:
    return name in ACTIVE


@contextmanager
def mutated(*names: str) -> Iterator[None]:
    """Activates mutations for the duration of a block (tests only)."""
    for n in names:
        if n not in ALL:
            raise ValueError(f"unknown mutation {n!r} (known: {', '.join(ALL)})")
    before = set(ACTIVE)
    ACTIVE.update(names)
    try:
        yield
    finally:
        ACTIVE.clear()
        ACTIVE.update(before)


# -- hooks (each called from one line of a core; identity unless active) -------------

def strip_read_terms(requests: list) -> None:
    """RECOVERY_READS_WITHOUT_TERM: fencing/recovery reads leave with term 0
    (a plain read: the bookie neither fences nor raises its term)."""
    if RECOVERY_READS_WITHOUT_TERM in ACTIVE:
        requests[:] = [r._replace(term=0) for r in requests]


def writeback_flags(flags: int, original: int) -> int:
    """WRITEBACK_KEEPS_TRUNCATE: a written-back no-op keeps its truncate flag."""
    if WRITEBACK_KEEPS_TRUNCATE in ACTIVE:
        return original
    return flags


def origin_floor(floor: int) -> int:
    """IGNORE_ORIGIN_TERM: the recovery's floor never rises (no answer is
    ever stale)."""
    if IGNORE_ORIGIN_TERM in ACTIVE:
        return 0
    return floor


def recovery_noop(record: bytes) -> bytes:
    """NOOP_WITHOUT_TRUNCATE: the final no-op loses its truncate flag."""
    if NOOP_WITHOUT_TRUNCATE not in ACTIVE:
        return record
    from bookie import entry as E

    h = E.parse_header(record)
    e = E.decode(record)
    return E.encode(e.ledger_id, e.entry_id, e.payload, lac=e.lac, lafr=e.lafr,
                    data_flags=e.data_flags & ~E.FLAG_TRUNCATE, req_flags=h.req_flags, term=h.term,
                    origin=e.origin)


def after_end_found(core) -> None:
    """SKIP_TRUNCATE_NOOP: forget the no-op; recovery ends at the last
    recovered entry and the next writer continues at the first absent id."""
    if SKIP_TRUNCATE_NOOP not in ACTIVE or not core.unbounded or core.end_entry is None:
        return
    eid = core.end_entry
    core.writes.pop(eid, None)
    core._incomplete.discard(eid)
    core._o_writes[:] = [w for w in core._o_writes if w.entry_id != eid]
    core.end_entry = eid - 1  # RecoveryResult: last_entry = eid - 1, next_entry = eid


def noop_acked(core, wb) -> None:
    """TRUNCATE_WITHOUT_GWQ: the no-op counts as written at Qa acks."""
    if (TRUNCATE_WITHOUT_GWQ in ACTIVE and core.unbounded and wb.entry_id == core.end_entry
            and len(wb.acked) >= core.Qa):
        wb.acked.update(wb.targets)
