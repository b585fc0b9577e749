"""The client's protocol trace (``ClientConfig.trace_path``): the steps of
sim/spec.py that the writer and recovery adapters (stream/ledger_write.py,
stream/ledger_recovery.py, stream/stream.py) take (the recovery's read
answers too, ``ClientReadAnswer``, and a classic recovery's metadata
steps, ``recover_ledger``: rtrace9), in the encoding the
simulator writes (bookie/tracelog.py).  What a core input implies (the
recovery's decisions, the counting of an ack) is derived by the functions
below, which the simulator's adapter (sim/clients.py) calls too.

Off by default: every hook is ``if tracer is not None`` once per frame,
drain or core input, never per entry.
"""
from __future__ import annotations

from bookie import entry as E
from bookie.core import Status
from bookie.tracelog import TraceLog, record_value
from stream.quorum import ABSENT_STATUSES
from stream.recovery_core import RecoveryState

LIVE_RECOVERY = (RecoveryState.FENCING, RecoveryState.READING, RecoveryState.FINISHING)


def recovery_steps(rec, before: RecoveryState, decided: int) -> list[tuple]:
    """The steps a recovery core input took (``before``: the state before it,
    ``decided``: how many entries were recovered before it), in order."""
    out: list[tuple] = []
    if rec.state is RecoveryState.READING and before is RecoveryState.FENCING:
        out.append(("StartReading", rec.start_entry))
    if before is RecoveryState.READING:
        for n in rec.recovered[decided:]:
            out.append(("RecoveryDecide", n, "recovered"))
        if rec.state in (RecoveryState.FINISHING, RecoveryState.DONE):
            out.append(("RecoveryDecide", rec.frontier, "absent"))
        elif rec.state is RecoveryState.ABORTED and "data loss" in (rec.reason or ""):
            out.append(("RecoveryDecide", rec.frontier, "data_loss"))
    if rec.state is RecoveryState.ABORTED and before in LIVE_RECOVERY:
        out.append(("Withdraw",))
    return out


def writer_ack_counted(wr, index: int, bookie_id: str, entry_id: int, terminal) -> bool:
    """Whether an OK from bookie_id for entry_id counts for the writer
    (before the core takes it)."""
    return (wr.state not in terminal and wr.ensemble[index] == bookie_id and entry_id in wr.pending
            and index not in wr.failed)


def recovery_ack_counted(rec, index: int, bookie_id: str, entry_id: int, terminal) -> bool:
    live = rec.state not in terminal and rec.state is not RecoveryState.INIT
    return live and rec.ensemble[index] == bookie_id and entry_id in rec.writes and index not in rec.replacing


class ClientTracer:
    """One client's trace file; ``name`` is its actor name (c1, c2, ...)."""

    def __init__(self, path: str, name: str):
        self.name = name
        self.log = TraceLog(path, name)

    def step(self, action: str, *args, lid: int | None = None, **kw) -> None:
        self.log.emit(action, (self.name, *args), kw, lid=lid)

    def steps(self, steps: list[tuple], lid: int | None = None) -> None:
        for s in steps:
            self.step(*s, lid=lid)

    def sends(self, lid: int, bookie_id: str, entry_ids, records) -> None:
        for eid, rec in zip(entry_ids, records):
            self.step("ClientSendAdd", bookie_id, eid, rec, lid=lid, value=record_value(rec))

    def add_answers(self, lid: int, bookie_id: str, entry_ids, statuses, counted) -> None:
        """statuses: per entry (None: all OK); counted: per entry."""
        for k, eid in enumerate(entry_ids):
            st = Status.OK if statuses is None else statuses[k]
            if st is Status.OK:
                self.step("ClientAddAnswer", bookie_id, eid, counted[k], lid=lid)

    def read_answers(self, lid: int, bookie_id: str, answers) -> None:
        """A recovery's read answers from one bookie, as they reach the
        client while it reads (before the core takes them): each OK or
        absent answer is a ``ClientReadAnswer`` (the simulator's, sim/clients.py
        ``_on_read``), whether or not the core still wants it.  answers:
        (entry id, status, record or None)."""
        for eid, st, rec in answers:
            if st is Status.OK:
                self.step("ClientReadAnswer", bookie_id, eid,
                          ("noop",) if E.parse_header(bytes(rec)).is_noop else ("data",), lid=lid)
            elif st in ABSENT_STATUSES:
                self.step("ClientReadAnswer", bookie_id, eid, None, lid=lid)

    def close(self) -> None:
        self.log.close()
