"""Mutant switches: deliberately broken protocol rules, for tests only.

The simulation harness (``sim/``), the TLA+ trace check and the real-process
tests must find a violation whenever one of these is enabled; that is how we
know they can fail.  A mutation is an explicit parameter: a frozen
:class:`Mutations` value given to a core's constructor (``RecoveryCore``) or
to a life-cycle intent (``stream/lifecycle.py``), threaded from the test,
the simulator (``World(..., mutations=...)``) or the client
(``ClientConfig.mutations``).  The default, :data:`NONE`, enables nothing;
there is no global switch.  Each mutation is consulted by exactly one line
of a core (a method below, the identity unless enabled).

============================ ============================================== ==============================
mutation                     the broken rule                                spec (tla/BookstreamLedger.tla)
============================ ============================================== ==============================
SKIP_TRUNCATE_NOOP           recovery writes no truncate no-op: the next    (the protocol before the
                             writer continues at the first absent entry     seed's "UPDATE 1")
NOOP_WITHOUT_TRUNCATE        the final no-op carries no truncate flag       no_truncate
TRUNCATE_WITHOUT_GWQ         the no-op counts as written once Qa bookies    truncate_no_gwq
                             acked it (not every bookie of the ensemble)
RECOVERY_READS_WITHOUT_TERM  fencing and recovery reads carry no term       recovery_reads_no_term
WRITEBACK_KEEPS_TRUNCATE     a recovered no-op is written back with its     writeback_truncates
                             truncate flag
IGNORE_ORIGIN_TERM           recovery ignores origin terms (no log          (issue 12)
                             matching: the floor stays 0)
TAKEOVER_KEEPS_TERM          the take-over does not raise the term          (life-cycle: lifecycle.py)
CHANGE_DESPITE_FENCE         an ensemble change or roll is applied on a     (life-cycle: lifecycle.py)
                             ledger that is no longer OPEN at the
                             writer's term (a recovery, a newer term)
CLOSE_DESPITE_RECOVERY       a close CASes CLOSED over a ledger being       (life-cycle: lifecycle.py)
                             recovered (a concurrent recoverer's fence)
FINISH_DESPITE_NEWER_TERM    a take-over's finish opens the ledger at its   (life-cycle: lifecycle.py)
                             term although a newer term took over
WRITER_LAFR_AT_QA            the writer's records carry its LAC as their    (the writer's LAFR: TLC trace
                             LAFR (an entry taken as on every bookie of     validation rejects the store
                             its write set once Qa acked it)                of a record carrying it)
ABSENT_BELOW_COVERAGE        recovery reads an entry as absent on Qw - Qa   (quorum coverage: the spec's
                             NO_SUCH answers (at least 1), one fewer than   RecoveryRead needs Coverage
                             the coverage rule's Qw - Qa + 1                of NoSuchEntry)
JOIN_UNPREPARED              an ensemble change or roll (the writer's or    ensemble_no_prepare
                             a recovery's) publishes a fragment without
                             preparing its joining bookies (their term is
                             not raised, older entries stay)
============================ ============================================== ==============================

Hooks (one line each):

- ``RecoveryCore.start``: ``self.mutations.strip_read_terms(self._o_fencing)``
- ``RecoveryCore._fill_window``, ``_ask_the_rest``, ``_demote_stale``: ``strip_read_terms(self._o_reads)``
- ``RecoveryCore._recovered``: ``flags = self.mutations.writeback_flags(flags, e.data_flags)``
- ``RecoveryCore._absent``: ``recovery_noop(noop)``, ``after_end_found(self)``
- ``RecoveryCore._take_acks``: ``noop_acked(self, wb)``
- ``RecoveryCore._fill_window``: ``EntryReadOutcome(..., absent=self.mutations.absent_quorum(Qw, Qa))``
- ``RecoveryCore._advance``: ``self.floor = self.mutations.origin_floor(e.origin)``
- ``WriterCore._pump``: ``lafr=self.mutations.carried_lafr(self.lac, self.lafr)``
- ``lifecycle.TakeOver.judge``, ``writer_verdict``, ``CloseAt.judge``, ``FinishTakeOver.judge``: ``M in self.mutations``
- ``lifecycle.to_prepare`` (the bookies a new fragment must prepare): ``JOIN_UNPREPARED in mutations``
"""
from __future__ import annotations

import dataclasses

SKIP_TRUNCATE_NOOP = "skip_truncate_noop"
NOOP_WITHOUT_TRUNCATE = "noop_without_truncate"
TRUNCATE_WITHOUT_GWQ = "truncate_without_gwq"
RECOVERY_READS_WITHOUT_TERM = "recovery_reads_without_term"
WRITEBACK_KEEPS_TRUNCATE = "writeback_keeps_truncate"
IGNORE_ORIGIN_TERM = "ignore_origin_term"
TAKEOVER_KEEPS_TERM = "takeover_keeps_term"
CHANGE_DESPITE_FENCE = "change_despite_fence"
CLOSE_DESPITE_RECOVERY = "close_despite_recovery"
FINISH_DESPITE_NEWER_TERM = "finish_despite_newer_term"
WRITER_LAFR_AT_QA = "writer_lafr_at_qa"
ABSENT_BELOW_COVERAGE = "absent_below_coverage"
JOIN_UNPREPARED = "join_unprepared"

# the recovery core's mutations (the TLA+ trace check knows these)
RECOVERY = (SKIP_TRUNCATE_NOOP, NOOP_WITHOUT_TRUNCATE, TRUNCATE_WITHOUT_GWQ, RECOVERY_READS_WITHOUT_TERM,
            WRITEBACK_KEEPS_TRUNCATE, IGNORE_ORIGIN_TERM, ABSENT_BELOW_COVERAGE)
# the life-cycle core's (stream/lifecycle.py)
LIFECYCLE = (TAKEOVER_KEEPS_TERM, CHANGE_DESPITE_FENCE, CLOSE_DESPITE_RECOVERY, FINISH_DESPITE_NEWER_TERM,
             JOIN_UNPREPARED)
# the writer core's (stream/writer_core.py)
WRITER = (WRITER_LAFR_AT_QA,)
ALL = RECOVERY + LIFECYCLE + WRITER


@dataclasses.dataclass(frozen=True)
class Mutations:
    """The enabled mutations (tests only); :data:`NONE` in production."""

    names: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", frozenset(self.names))
        for n in self.names:
            if n not in ALL:
                raise ValueError(f"unknown mutation {n!r} (known: {', '.join(ALL)})")

    @classmethod
    def of(cls, *names: str | None) -> "Mutations":
        """The mutations named (None entries are skipped: ``of(maybe)``)."""
        return cls(frozenset(n for n in names if n))

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __bool__(self) -> bool:
        return bool(self.names)

    def __repr__(self) -> str:
        return f"Mutations({', '.join(sorted(self.names))})" if self.names else "Mutations()"

    # -- the recovery core's hooks (identity unless enabled) ------------------------------

    def strip_read_terms(self, requests: list) -> None:
        """RECOVERY_READS_WITHOUT_TERM: fencing/recovery reads leave with term 0
        (a plain read: the bookie neither fences nor raises its term)."""
        if RECOVERY_READS_WITHOUT_TERM in self.names:
            requests[:] = [r._replace(term=0) for r in requests]

    def writeback_flags(self, flags: int, original: int) -> int:
        """WRITEBACK_KEEPS_TRUNCATE: a written-back no-op keeps its truncate flag."""
        return original if WRITEBACK_KEEPS_TRUNCATE in self.names else flags

    def origin_floor(self, floor: int) -> int:
        """IGNORE_ORIGIN_TERM: the recovery's floor never rises (no answer is
        ever stale)."""
        return 0 if IGNORE_ORIGIN_TERM in self.names else floor

    def absent_quorum(self, write_quorum: int, ack_quorum: int) -> int:
        """How many NO_SUCH answers read an entry as absent (stream.quorum.absent_quorum);
        ABSENT_BELOW_COVERAGE: one fewer (at least 1), so that Qa bookies of the
        write set may hold an entry read as absent."""
        from stream.quorum import absent_quorum

        n = absent_quorum(write_quorum, ack_quorum)
        return max(1, n - 1) if ABSENT_BELOW_COVERAGE in self.names else n

    def recovery_noop(self, record: bytes) -> bytes:
        """NOOP_WITHOUT_TRUNCATE: the final no-op loses its truncate flag."""
        if NOOP_WITHOUT_TRUNCATE not in self.names:
            return record
        from bookie import entry as E

        h = E.parse_header(record)
        e = E.decode(record)
        return E.encode(e.ledger_id, e.entry_id, e.payload, lac=e.lac, lafr=e.lafr,
                        data_flags=e.data_flags & ~E.FLAG_TRUNCATE, req_flags=h.req_flags, term=h.term,
                        origin=e.origin)

    def after_end_found(self, core) -> None:
        """SKIP_TRUNCATE_NOOP: forget the no-op; recovery ends at the last
        recovered entry and the next writer continues at the first absent id."""
        if SKIP_TRUNCATE_NOOP not in self.names or not core.unbounded or core.end_entry is None:
            return
        eid = core.end_entry
        core.writes.pop(eid, None)
        core._incomplete.discard(eid)
        core._o_writes[:] = [w for w in core._o_writes if w.entry_id != eid]
        core.end_entry = eid - 1  # RecoveryResult: last_entry = eid - 1, next_entry = eid

    # -- the writer core's hook -------------------------------------------------------------

    def carried_lafr(self, lac: int, lafr: int) -> int:
        """WRITER_LAFR_AT_QA: the LAFR a new record carries is the writer's LAC."""
        return lac if WRITER_LAFR_AT_QA in self.names else lafr

    def noop_acked(self, core, wb) -> None:
        """TRUNCATE_WITHOUT_GWQ: the no-op counts as written at Qa acks."""
        if (TRUNCATE_WITHOUT_GWQ in self.names and core.unbounded and wb.entry_id == core.end_entry
                and len(wb.acked) >= core.Qa):
            wb.acked.update(wb.targets)


NONE = Mutations()
