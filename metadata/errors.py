"""Typed errors of the metadata package.

Every error derives from :class:`MetadataError` and carries a ``retriable``
attribute: ``True`` when the same call may succeed if simply tried again
later (the metadata service was unreachable, a revision was compacted while
paging), ``False`` when retrying the same call cannot help (a CAS lost, a
name is invalid, a ledger does not exist).

A write that fails with :class:`MetadataUnavailable` has an *unknown*
outcome: etcd may or may not have applied it.  Callers must re-read before
deciding what to do (a ``create`` retried blindly can hit ``KeyExists`` for
its own first attempt).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from metadata.store import Versioned


class MetadataError(Exception):
    """Base class of every metadata error."""

    retriable: bool = False


class MetadataUnavailable(MetadataError):
    """etcd could not be reached, timed out, or has no leader.

    The outcome of a write that raised this is unknown.
    """

    retriable = True


class AuthenticationFailed(MetadataError):
    """etcd refused the credentials: none given where auth is on, a wrong
    user or password, or a user without permission. Retrying cannot help."""


class Compacted(MetadataError):
    """A read or watch asked for a revision that etcd has compacted away."""

    retriable = True

    def __init__(self, message: str, compact_revision: int = 0) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class ConditionFailed(MetadataError):
    """Base class of the errors raised when a compare of a write failed."""


class KeyExists(ConditionFailed):
    """``create`` found the key already present."""

    def __init__(self, key: str, current: "Versioned | None") -> None:
        super().__init__(f"key already exists: {key!r}")
        self.key = key
        self.current = current


class BadVersion(ConditionFailed):
    """A CAS (or a delete at a version) found another mod_revision.

    ``current`` is the key's state at the time of the failed compare, or
    ``None`` when the key no longer exists.
    """

    def __init__(self, key: str, expected: int, current: "Versioned | None") -> None:
        have = "absent" if current is None else f"mod_revision {current.mod_revision}"
        super().__init__(f"bad version for {key!r}: expected mod_revision {expected}, key is {have}")
        self.key = key
        self.expected = expected
        self.current = current


class TxnConflict(ConditionFailed):
    """A multi-key transaction's compares failed.

    ``current`` maps every compared key to its state (or ``None``) read
    atomically in the failure branch of the same transaction.
    """

    def __init__(self, current: "Mapping[str, Versioned | None]") -> None:
        super().__init__(f"transaction compares failed on keys {sorted(current)}")
        self.current = dict(current)


class GuardFailed(ConditionFailed):
    """A write's guard, a condition besides the ledger's own version (a
    recovery's lock still held: ``metadata.txn.created_at``), no longer
    holds.  Not a lost CAS: judging again cannot help."""

    def __init__(self, key: str, current: "Versioned | None") -> None:
        have = "absent" if current is None else f"created at revision {current.create_revision}"
        super().__init__(f"guard {key!r} no longer holds: the key is {have}")
        self.key = key
        self.current = current


class LeaseExpired(MetadataError):
    """The lease is unknown to etcd: it expired or was revoked."""

    def __init__(self, lease_id: int, message: str = "") -> None:
        super().__init__(message or f"lease {lease_id:#x} expired or was revoked")
        self.lease_id = lease_id


class InvalidName(MetadataError, ValueError):
    """A cluster, bookie, stream or log name is unusable in a key."""

    def __init__(self, name: object, reason: str) -> None:
        super().__init__(f"invalid name {name!r}: {reason}")
        self.name = name
        self.reason = reason


class InvalidKey(MetadataError, ValueError):
    """A key does not parse as the kind of key that was asked for."""


class CorruptMetadata(MetadataError):
    """Stored metadata breaks an invariant (undecodable value, fragment
    count that disagrees with the header, ...)."""


def decode_message(message_type, data: bytes):
    """Parses a stored protobuf value; CorruptMetadata if it does not parse."""
    from google.protobuf.message import DecodeError

    msg = message_type()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise CorruptMetadata(f"undecodable {message_type.DESCRIPTOR.name}: {exc}") from exc
    return msg


class NoSuchLedger(MetadataError):
    """The ledger's header key does not exist."""

    def __init__(self, ledger_id: int) -> None:
        super().__init__(f"no such ledger: {ledger_id}")
        self.ledger_id = ledger_id


class InvalidLedgerConfig(MetadataError, ValueError):
    """A ledger header or ensemble breaks E >= Qw >= Qa >= 1 (or similar)."""


class NoFragment(MetadataError, LookupError):
    """No fragment (or no loaded fragment) covers the entry asked for."""

    def __init__(self, ledger_id: int | None, entry_id: int, message: str = "") -> None:
        super().__init__(message or f"no fragment of ledger {ledger_id} covers entry {entry_id}")
        self.ledger_id = ledger_id
        self.entry_id = entry_id


class BookieIdInUse(MetadataError):
    """Another live registration (another lease) holds this bookie id."""

    def __init__(self, bookie_id: str, current: "Versioned | None") -> None:
        owner = f"lease {current.lease:#x}" if current is not None else "unknown lease"
        super().__init__(f"bookie id {bookie_id!r} is registered by {owner}")
        self.bookie_id = bookie_id
        self.current = current


class BookieDecommissioned(MetadataError):
    """This bookie id was decommissioned (``bookstream decommission``): its
    data was re-replicated and its identity retired, so it may not register
    again.  Start the bookie with a fresh data dir (a new id) instead."""

    def __init__(self, bookie_id: str) -> None:
        super().__init__(f"bookie id {bookie_id!r} was decommissioned: it may not register again "
                         "(start the bookie with a new, empty data dir)")
        self.bookie_id = bookie_id


class InvalidCookie(MetadataError):
    """A bookie's data dir and etcd disagree about who it is (its cookie,
    bookie/cookie.py): its disk lost its data, or the etcd is another
    cluster's or was rebuilt.  The bookie refuses to start (and its ledger
    GC to delete anything); the message says what differs and what to do."""

    def __init__(self, bookie_id: str, message: str) -> None:
        super().__init__(message)
        self.bookie_id = bookie_id


def few(ids, limit: int = 10) -> str:
    """``ids`` for a message: the first ``limit``, then "..."."""
    ids = list(ids)
    return ", ".join(map(str, ids[:limit])) + (", ..." if len(ids) > limit else "")


class LostDiskNotDrained(InvalidCookie):
    """A bookie started with ``--on-lost-disk rejoin`` on a data dir that
    lost its data: its old id is not free yet (bookie/cookie.py).  It waits
    and asks again; ``named`` the ledgers whose fragments still name it."""

    def __init__(self, bookie_id: str, registered: bool, named: list[int]) -> None:
        held = [f"{len(named)} ledger(s) still name it ({few(named)})"] if named else []
        if registered:
            held.append("a bookie is registered under its id")
        super().__init__(bookie_id, f"bookie {bookie_id!r} lost its data and waits to rejoin: " + "; ".join(held))
        self.registered, self.named = registered, list(named)


class RegistrationLost(MetadataError):
    """A bookie registration's key vanished (its lease expired or someone
    removed it); the registration must be redone."""

    def __init__(self, bookie_id: str, message: str = "") -> None:
        super().__init__(message or f"registration of bookie {bookie_id!r} was lost")
        self.bookie_id = bookie_id
