"""What :meth:`metadata.store.MetadataStore.txn` and ``read`` take and give
back: a key's value and versions (:class:`Versioned`), the conditions
(:class:`Compare`; :func:`absent`, :func:`exists`, :func:`mod_revision_is`),
the operations (:class:`Put`, :class:`Delete`, :class:`Get`) and their
results (:class:`Page`, :class:`TxnResult`).  Plain values, checked when
built; each knows its etcd request (``_pb``).
"""
from __future__ import annotations

import dataclasses
from typing import Union

import etcd3.etcdrpc as rpc


# --------------------------------------------------------------------------
# Values


@dataclasses.dataclass(frozen=True)
class Versioned:
    """A value and its etcd versions.

    ``mod_revision`` is the revision of the last write of the key (the value
    to pass to :meth:`MetadataStore.cas`), ``create_revision`` the revision
    that created it, ``version`` the number of writes since creation, and
    ``lease`` the id of the lease it is attached to (0 for none).
    """

    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease: int = 0

    @classmethod
    def _from_kv(cls, kv) -> "Versioned":
        return cls(
            value=bytes(kv.value),
            mod_revision=kv.mod_revision,
            create_revision=kv.create_revision,
            version=kv.version,
            lease=kv.lease,
        )


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``
    (etcd's ``range_end`` for a prefix; ``b"\\0"`` means "to the end")."""
    assert isinstance(prefix, bytes) and prefix, "prefix must be non-empty bytes"
    s = bytearray(prefix)
    while s and s[-1] == 0xFF:
        s.pop()
    if not s:
        return b"\0"
    s[-1] += 1
    return bytes(s)


def key_bytes(key: str) -> bytes:
    assert isinstance(key, str) and key, f"key must be a non-empty str, got {key!r}"
    return key.encode("utf-8")


# --------------------------------------------------------------------------
# Transaction building blocks


_TARGETS = {
    "create": rpc.Compare.CREATE,
    "mod": rpc.Compare.MOD,
    "version": rpc.Compare.VERSION,
    "value": rpc.Compare.VALUE,
    "lease": rpc.Compare.LEASE,
}
_RESULTS = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}


@dataclasses.dataclass(frozen=True)
class Compare:
    """One condition of a :meth:`MetadataStore.txn`.

    ``target`` is one of ``create``, ``mod``, ``version``, ``value``,
    ``lease``; ``op`` one of ``==``, ``!=``, ``<``, ``>``.  Use the helpers
    :func:`absent`, :func:`exists`, :func:`mod_revision_is`.
    """

    key: str
    target: str
    op: str
    operand: Union[int, bytes]

    def __post_init__(self) -> None:
        key_bytes(self.key)
        assert self.target in _TARGETS, f"bad compare target {self.target!r}"
        assert self.op in _RESULTS, f"bad compare op {self.op!r}"
        if self.target == "value":
            assert isinstance(self.operand, bytes), "value compares take bytes"
        else:
            assert isinstance(self.operand, int) and self.operand >= 0, "revision compares take ints >= 0"

    def _pb(self):
        c = rpc.Compare(key=key_bytes(self.key), target=_TARGETS[self.target], result=_RESULTS[self.op])
        field = {"create": "create_revision", "mod": "mod_revision", "version": "version",
                 "value": "value", "lease": "lease"}[self.target]
        setattr(c, field, self.operand)
        return c


def absent(key: str) -> Compare:
    """Condition: ``key`` does not exist."""
    return Compare(key, "create", "==", 0)


def exists(key: str) -> Compare:
    """Condition: ``key`` exists."""
    return Compare(key, "create", ">", 0)


def created_at(key: str, create_revision: int) -> Compare:
    """Condition: ``key`` exists and was created at ``create_revision``: a
    lease-bound lock still held by the same hold (deleted and taken again,
    it has a new create revision)."""
    assert isinstance(create_revision, int) and create_revision > 0, f"bad create_revision {create_revision!r}"
    return Compare(key, "create", "==", create_revision)


def mod_revision_is(key: str, mod_revision: int) -> Compare:
    """Condition: ``key`` exists and was last written at ``mod_revision``."""
    assert isinstance(mod_revision, int) and mod_revision > 0, f"mod_revision must be > 0, got {mod_revision!r}"
    return Compare(key, "mod", "==", mod_revision)


@dataclasses.dataclass(frozen=True)
class Put:
    """Write ``value`` at ``key`` (optionally attached to a lease)."""

    key: str
    value: bytes
    lease: int = 0

    def __post_init__(self) -> None:
        key_bytes(self.key)
        assert isinstance(self.value, (bytes, bytearray)), "values are bytes"
        assert isinstance(self.lease, int) and self.lease >= 0

    def _pb(self):
        return rpc.RequestOp(request_put=rpc.PutRequest(
            key=key_bytes(self.key), value=bytes(self.value), lease=self.lease))


@dataclasses.dataclass(frozen=True)
class Delete:
    """Delete ``key``, or every key in ``[key, range_end)`` when ``range_end``
    is given (see :meth:`Delete.prefix`)."""

    key: str
    range_end: bytes | None = None

    def __post_init__(self) -> None:
        key_bytes(self.key)
        assert self.range_end is None or isinstance(self.range_end, bytes)

    @classmethod
    def prefix(cls, prefix: str) -> "Delete":
        """Delete every key that starts with ``prefix``."""
        return cls(prefix, prefix_end(key_bytes(prefix)))

    def _pb(self):
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(
            key=key_bytes(self.key), range_end=self.range_end or b""))


@dataclasses.dataclass(frozen=True)
class Get:
    """Read ``key``, or the keys in ``[key, range_end)`` (at most ``limit``,
    0 = no limit), inside a transaction.  ``descending`` sorts by key from the
    highest (costly on wide ranges, see the module docstring)."""

    key: str
    range_end: bytes | None = None
    limit: int = 0
    descending: bool = False
    keys_only: bool = False

    def __post_init__(self) -> None:
        key_bytes(self.key)
        assert self.range_end is None or isinstance(self.range_end, bytes)
        assert isinstance(self.limit, int) and self.limit >= 0

    @classmethod
    def prefix(cls, prefix: str, limit: int = 0, descending: bool = False, keys_only: bool = False) -> "Get":
        """Read the keys that start with ``prefix``."""
        return cls(prefix, prefix_end(key_bytes(prefix)), limit, descending, keys_only)

    def _pb(self, revision: int = 0):
        return rpc.RangeRequest(
            key=key_bytes(self.key),
            range_end=self.range_end or b"",
            limit=self.limit,
            revision=revision,
            sort_order=rpc.RangeRequest.DESCEND if self.descending else rpc.RangeRequest.NONE,
            sort_target=rpc.RangeRequest.KEY,
            keys_only=self.keys_only,
        )


Op = Union[Put, Delete, Get]


@dataclasses.dataclass(frozen=True)
class Page:
    """The result of a :class:`Get`: ``items`` sorted as asked, and ``more``
    when the limit cut the range short."""

    items: list[tuple[str, Versioned]]
    more: bool


@dataclasses.dataclass(frozen=True)
class TxnResult:
    """A successful transaction: ``revision`` is the store revision after it
    (for a write, the mod_revision of every key it put), and ``results``
    has one entry per op: ``None`` for a Put, the number of deleted keys for
    a Delete, a :class:`Page` for a Get."""

    revision: int
    results: tuple
