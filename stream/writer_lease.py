"""A stream writer's lease-bound registration (issue 15): "this stream has a
live writer" as a fact in etcd, not a guess.

Once its take-over succeeded at term T, a stream writer holds
``ledgers/<lid>/writer`` (:mod:`metadata.layout`), a JSON
:class:`WriterRecord` naming it (an id, host, pid, the term T, its start
time), attached to a lease that a :class:`metadata.keeper.KeptKey` thread
refreshes, and creates again under a new lease after a loss (an etcd outage
longer than the TTL, a paused process), as bookie registrations are kept.

- The key goes when the writer closes (its lease is revoked), and with the
  lease when the process dies or stays cut off from etcd for a TTL.
- A writer whose term has been overtaken does not advertise itself: when
  it learns it was fenced (an INVALID_TERM answer; ``on_fenced``) it revokes
  its lease, and the key goes with it unless a later writer's record has
  replaced it already (that one is attached to the later writer's lease).
  It never creates the key again once the ledger's header names a later term,
  or the key holds a later term's record (:func:`judge_register`).
- Until then a fenced writer's key can still be there (a fenced writer that
  is idle learns nothing), but it names its term: :func:`judge_writer` calls
  a record naming an older term than the ledger's STALE, no live writer.

The replication worker reads the key beside the ledger's metadata and hands
:func:`judge_writer`'s verdict to ``worker_core.judge_task``
(``autorecovery/worker_core.py``: the open fragment of a stream with a live
writer is left to it).  ``bookstream streams show`` prints it with its lease.

Pure: :class:`WriterRecord`, :func:`judge_writer`, :func:`judge_register`.
The adapter: :class:`WriterRegistration`, and :func:`read_writer`.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import logging
import threading

from metadata.errors import CorruptMetadata, MetadataError, TxnConflict
from metadata.keeper import KeptKey
from metadata.keeper_core import KeeperState
from metadata.layout import KeyLayout
from metadata.ledgers import LedgerMetadata
from metadata.store import Get, MetadataStore, Put, Versioned, absent, mod_revision_is

log = logging.getLogger(__name__)


# -- pure -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WriterRecord:
    """What a writer's key says about it."""

    writer_id: str
    host: str
    pid: int
    term: int
    started_ms: int

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "WriterRecord":
        try:
            d = json.loads(data)
            rec = cls(str(d["writer_id"]), str(d["host"]), int(d["pid"]), int(d["term"]), int(d["started_ms"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptMetadata(f"bad writer registration {data[:80]!r}: {e}") from None
        return rec


class Liveness(enum.Enum):
    LIVE = "live"        # a registration naming the ledger's term (or a later one: the metadata read was older)
    STALE = "stale"      # a registration naming an older term: a fenced writer's, until it or its lease goes
    NONE = "none"        # no registration
    UNKNOWN = "unknown"  # not known (classic ledgers; manual recovery, which does not ask)


def judge_writer(record: WriterRecord | None, term: int) -> Liveness:
    """Whether ledger ``term``'s writer is live, from its key as read (the
    key exists only while its lease does).  A record naming a later term
    than ``term`` means a writer took over after the metadata was read: it
    is live too (sealing now would fence a writer that just started)."""
    if record is None:
        return Liveness.NONE
    return Liveness.LIVE if record.term >= term else Liveness.STALE


class Register(enum.Enum):
    CREATE = "create"  # put the record under the new lease (compared: the header and the key as read)
    FENCED = "fenced"  # a later term took the stream over: never advertise again
    GONE = "gone"      # the ledger is deleted


def judge_register(term: int, header_term: int | None, current: WriterRecord | None) -> Register:
    """Whether a writer of ``term`` may (re)create its key, given the
    ledger's term (None: no ledger) and the record the key holds now.  A
    record of the same term is this writer's own (one writer per term: the
    take-over's CAS) from an earlier lease: it is replaced."""
    if header_term is None:
        return Register.GONE
    if header_term > term or (current is not None and current.term > term):
        return Register.FENCED
    return Register.CREATE


# -- the adapter ------------------------------------------------------------------------------

class RegistrationEnded(MetadataError):
    """The key is not created: the writer was fenced, or the ledger deleted."""


class WriterRegistration:
    """A writer's kept key; see the module docstring.  ``start()`` begins
    keeping it; ``close()`` (idempotent) stops and revokes the lease."""

    def __init__(self, store: MetadataStore, layout: KeyLayout, ledger_id: int, record: WriterRecord, ttl: int,
                 *, alarm_every: float = 5.0) -> None:
        self.store, self.ledger_id, self.record = store, ledger_id, record
        self.key = layout.writer_key(ledger_id)
        self._hkey = layout.ledger_header_key(ledger_id)
        self.ended: Register | None = None   # FENCED or GONE once the key may not be created any more
        self._closed = threading.Event()
        self.keeper = KeptKey(store, ttl, self._create, name=f"writer of ledger {ledger_id} (term {record.term})",
                              start=False, alarm_every=alarm_every)

    def start(self) -> "WriterRegistration":
        self.keeper.start()
        return self

    @property
    def registered(self) -> bool:
        return self.keeper.registered

    def wait_settled(self, timeout: float) -> bool:
        """Waits until the key is created (True), or will not be (False)."""
        self.keeper.wait_for(lambda k: k.registered or k.state is KeeperState.STOPPED, timeout)
        return self.keeper.registered

    def status(self) -> dict:
        return {**self.keeper.status(), "key": self.key, "term": self.record.term,
                "writer_id": self.record.writer_id, "ended": self.ended.value if self.ended else None}

    def _create(self, lease, ours: frozenset[int]) -> int:
        for _ in range(10):  # each retry follows a change of the header or the key (the writer's own CASes)
            (hpage, wpage), _rev = self.store.read([Get(self._hkey), Get(self.key)])
            header: Versioned | None = hpage.items[0][1] if hpage.items else None
            cur: Versioned | None = wpage.items[0][1] if wpage.items else None
            try:
                current = WriterRecord.decode(cur.value) if cur is not None else None
            except CorruptMetadata as e:
                log.warning("ledger %s: replacing a bad writer registration: %s", self.ledger_id, e)
                current = None
            header_term = LedgerMetadata.from_header_bytes(header.value).term if header is not None else None
            verdict = judge_register(self.record.term, header_term, current)
            if verdict is not Register.CREATE:
                self._end(verdict, f"ledger term {header_term}, key {current}")
                raise RegistrationEnded(f"ledger {self.ledger_id}: writer of term {self.record.term}: "
                                        f"{verdict.value}")
            assert header is not None
            compares = [mod_revision_is(self._hkey, header.mod_revision),
                        absent(self.key) if cur is None else mod_revision_is(self.key, cur.mod_revision)]
            try:
                return self.store.txn(compares, [Put(self.key, self.record.encode(), lease.id)]).revision
            except TxnConflict:
                continue
        raise MetadataError(f"ledger {self.ledger_id}: the writer registration kept conflicting")

    def _end(self, verdict: Register, why: str) -> None:
        if self.ended is None:
            self.ended = verdict
            log.info("ledger %s: writer of term %d no longer registers (%s: %s)", self.ledger_id,
                     self.record.term, verdict.value, why)
        self.keeper.stop(revoke=True)  # (on the keeper's thread: no join)

    def fenced(self) -> None:
        """The writer learnt a later term took over: stop advertising it (the
        lease is revoked: the key goes, unless a later writer's replaced it)."""
        if self.ended is None:
            self.ended = Register.FENCED
            log.info("ledger %s: writer of term %d fenced: its registration goes", self.ledger_id,
                     self.record.term)
        self.close()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self.keeper.stop(revoke=True)


def read_writer(store: MetadataStore, layout: KeyLayout, ledger_id: int) -> tuple[WriterRecord | None, int]:
    """The writer's record as etcd holds it now (None: no key) and the id
    of the lease it is attached to (0 when none).  A key that does not
    decode counts as none."""
    cur = store.get(layout.writer_key(ledger_id))
    if cur is None:
        return None, 0
    try:
        return WriterRecord.decode(cur.value), cur.lease
    except CorruptMetadata as e:
        log.warning("ledger %s: %s", ledger_id, e)
        return None, cur.lease


def lease_remaining(store: MetadataStore, lease_id: int) -> int:
    """Seconds the lease has left (-1: gone)."""
    return store._lease_ttl(lease_id) if lease_id else -1


__all__ = ["WriterRecord", "Liveness", "judge_writer", "Register", "judge_register", "WriterRegistration",
           "RegistrationEnded", "read_writer", "lease_remaining"]
