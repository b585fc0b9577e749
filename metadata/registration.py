"""Bookie registration: which bookies are alive, and which are read-only.

A live bookie has exactly one key, ``bookies/writable/<id>`` or
``bookies/readonly/<id>`` (see :mod:`metadata.layout`), holding its
``BookieRegistration`` and attached to a lease that a
:class:`~metadata.keeper.KeptKey` thread refreshes, and re-creates under a
new lease if the lease is lost while the bookie lives (an etcd outage longer
than the TTL, a paused process).  When the bookie process dies, the
refreshes stop and etcd deletes the key once the TTL passes; watchers see a
DELETE.

A bookie id is registered at most once: :meth:`BookieRegistry.register`
creates the key only if neither key of that id exists, or exists under one
of the bookie's own earlier leases (one transaction), so two processes
claiming the same id cannot both succeed (``BookieIdInUse``).  A restarted
bookie replaces its previous run's registration at once when it recorded
that lease (``replace_leases``), and otherwise can wait for it to expire
(``wait_for_stale``).
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import time
from typing import Callable, Iterable


from bookstream_pb import metadata_pb2 as pb
from metadata.errors import (
    decode_message,
    BookieDecommissioned,
    BookieIdInUse,
    CorruptMetadata,
    LeaseExpired,
    MetadataError,
    RegistrationLost,
    TxnConflict,
)
from metadata.keeper import KeptKey
from metadata.keeper_core import Change, KeeperState
from metadata.layout import KeyLayout, validate_name
from metadata.store import (
    Delete,
    EventType,
    Lease,
    MetadataStore,
    Put,
    WatchEvent,
    absent,
    mod_revision_is,
)

DEFAULT_TTL = 10

_log = logging.getLogger(__name__)


def _decode(data: bytes) -> pb.BookieRegistration:
    return decode_message(pb.BookieRegistration, data)


class MembershipChange(enum.Enum):
    ADDED = "added"      # a registration appeared or moved (writable <-> read-only)
    REMOVED = "removed"  # a registration disappeared from one of the two lists


@dataclasses.dataclass(frozen=True)
class MembershipEvent:
    """A change of the bookie lists.  A move to read-only is a REMOVED from
    the writable list and an ADDED to the read-only list, at one revision."""

    change: MembershipChange
    bookie_id: str
    read_only: bool
    registration: pb.BookieRegistration | None  # None for REMOVED
    revision: int


class Registration:
    """A live registration, returned by :meth:`BookieRegistry.register`.

    The key is kept by a :class:`~metadata.keeper.KeptKey`: when its lease is
    lost (etcd said so, or no refresh succeeded for a TTL: an etcd outage, a
    paused process), it is created again under a new lease, with the same id
    and the current record, as soon as etcd answers.  ``lost`` is true (and
    ``on_lost`` was called) while it is not registered; ``status()`` says
    more for a health report.
    """

    def __init__(self, registry: "BookieRegistry", reg: pb.BookieRegistration, lease: Lease,
                 mod_revision: int, on_lost: Callable[[MetadataError], None] | None,
                 on_created: Callable[[Lease], None] | None = None, alarm_every: float = 5.0) -> None:
        self._registry = registry
        self._store = registry.store
        self._reg = reg
        self._closed = False
        self._on_lost = on_lost

        def on_change(change: Change) -> None:
            if change.new is KeeperState.LOST and self._on_lost is not None:
                self._on_lost(LeaseExpired(self.lease.id if self.lease else 0, change.reason))

        self.keeper = KeptKey(self._store, lease.ttl, self._create, name=f"bookie {reg.bookie_id!r}",
                              on_change=on_change, on_created=on_created, held=(lease, mod_revision),
                              alarm_every=alarm_every)

    def _create(self, lease: Lease, ours: frozenset[int]) -> int:
        return self._registry._create(self._reg, lease, ours)

    @property
    def lease(self) -> Lease:
        return self.keeper.lease

    @property
    def store(self) -> MetadataStore:
        """The metadata store the registration is kept in."""
        return self._store

    @property
    def cluster(self) -> str:
        return self._registry.layout.cluster

    @property
    def bookie_id(self) -> str:
        return self._reg.bookie_id

    @property
    def read_only(self) -> bool:
        return self._reg.read_only

    @property
    def halted(self) -> str:
        """Why the registered bookie is read-only for good ("" while not)."""
        return self._reg.halted

    @property
    def registration(self) -> pb.BookieRegistration:
        """A copy of the registered record."""
        out = pb.BookieRegistration()
        out.CopyFrom(self._reg)
        return out

    @property
    def key(self) -> str:
        return self._registry.layout.bookie_key(self.bookie_id, self.read_only)

    @property
    def mod_revision(self) -> int:
        return self.keeper.mod_revision

    @property
    def lost(self) -> bool:
        return not self.keeper.registered

    @property
    def registered(self) -> bool:
        return self.keeper.registered

    def status(self) -> dict:
        return self.keeper.status()

    def set_read_only(self, read_only: bool) -> int:
        """Move the registration to the read-only (or writable) list, in one
        transaction under the same lease.  Returns the revision (unchanged
        if already there).  While unregistered, only the record changes
        (the next creation writes it) and 0 is returned.  Raises
        ``RegistrationLost`` if the key was found gone (it is then created
        again)."""
        assert isinstance(read_only, bool)
        with self.keeper.lock:
            assert not self._closed, "registration is closed"
            if read_only == self._reg.read_only:
                return self.keeper.mod_revision
            new = pb.BookieRegistration()
            new.CopyFrom(self._reg)
            new.read_only = read_only
            return self._move(new)

    def update(self, **fields) -> int:
        """Rewrite the record with ``fields`` changed (e.g. ``free_bytes``);
        ``bookie_id`` cannot change, ``read_only`` goes through
        :meth:`set_read_only`.  Returns the new revision (0 while unregistered)."""
        assert "bookie_id" not in fields and "read_only" not in fields
        with self.keeper.lock:
            assert not self._closed, "registration is closed"
            new = pb.BookieRegistration()
            new.CopyFrom(self._reg)
            for name, value in fields.items():
                setattr(new, name, value)
            return self._move(new)

    def _move(self, new: pb.BookieRegistration) -> int:
        if not self.keeper.registered:
            self._reg = new  # written by the next creation
            return 0
        old_key = self.key
        new_key = self._registry.layout.bookie_key(new.bookie_id, new.read_only)
        compares = [mod_revision_is(old_key, self.keeper.mod_revision)]
        ops = [Put(new_key, new.SerializeToString(deterministic=True), self.lease.id)]
        if new_key != old_key:
            compares.append(absent(new_key))
            ops.insert(0, Delete(old_key))
        try:
            revision = self._store.txn(compares, ops).revision
        except (TxnConflict, LeaseExpired) as err:
            self._reg = new
            self.keeper.report_lost(f"registration of {self.bookie_id!r} found gone ({type(err).__name__})")
            raise RegistrationLost(self.bookie_id) from None
        self._reg, self.keeper.mod_revision = new, revision
        return revision

    def close(self) -> None:
        """Stop keeping the key and revoke the lease (the key disappears; if
        etcd is unreachable, it does once the TTL passes).  Idempotent."""
        with self.keeper.lock:
            if self._closed:
                return
            self._closed = True
        self.keeper.stop(revoke=True)

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BookieRegistry:
    """Bookie membership of one cluster."""

    def __init__(self, store: MetadataStore, cluster: str) -> None:
        assert isinstance(store, MetadataStore)
        self.store = store
        self.layout = KeyLayout(cluster)

    def register(self, reg: pb.BookieRegistration, ttl: int = DEFAULT_TTL, *,
                 on_lost: Callable[[MetadataError], None] | None = None,
                 wait_for_stale: float = 0.0, replace_leases: Iterable[int] = (),
                 on_created: Callable[[Lease], None] | None = None, alarm_every: float = 5.0) -> Registration:
        """Register a live bookie: its key (writable or read-only, per
        ``reg.read_only``) under a new lease of ``ttl`` seconds, kept alive
        (and created again after a loss) by a thread.

        A key of this id attached to one of ``replace_leases`` (the leases of
        this bookie's previous runs, which it recorded) is stale and replaced
        at once.  Raises ``BookieIdInUse`` if the id is registered under any
        other lease.  With ``wait_for_stale`` > 0, first waits up to that many
        seconds for such a registration to disappear.  ``on_created(lease)``
        is called after every later re-creation (to record the new lease).
        """
        assert isinstance(reg, pb.BookieRegistration)
        assert isinstance(ttl, int) and ttl >= 1
        assert wait_for_stale >= 0
        validate_name(reg.bookie_id, "bookie id")
        rec = pb.BookieRegistration()
        rec.CopyFrom(reg)
        if not rec.started_ms:
            rec.started_ms = int(time.time() * 1000)
        ours = frozenset(i for i in replace_leases if i > 0)
        deadline = time.monotonic() + wait_for_stale
        lease = self.store.lease(ttl)
        try:
            # Bounded: each retry follows the deletion of a stale key, within the deadline.
            for _ in range(100):
                try:
                    revision = self._create(rec, lease, ours)
                except BookieIdInUse as used:
                    holder_key = used.key
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self.store.wait_deleted(holder_key, remaining):
                        raise
                    # Waiting may have outlasted our own (not yet kept alive)
                    # lease: start from a fresh one.
                    try:
                        lease.revoke()
                    except MetadataError:
                        pass
                    lease = self.store.lease(ttl)
                    continue
                except TxnConflict:
                    continue  # the keys moved between the read and the write: read again
                for old in sorted(ours - {lease.id}):
                    try:
                        self.store._lease_revoke(old)
                    except MetadataError:
                        pass
                return Registration(self, rec, lease, revision, on_lost, on_created, alarm_every)
            raise BookieIdInUse(rec.bookie_id, None)
        except BaseException:
            try:
                lease.revoke()
            except MetadataError:
                pass
            raise

    def _create(self, rec: pb.BookieRegistration, lease: Lease, ours: frozenset[int]) -> int:
        """Writes ``rec`` under ``lease`` in one transaction, replacing a key of
        this id only if it is attached to one of ``ours``.  Returns the
        revision; raises ``BookieIdInUse`` (with ``key`` set) if another lease
        holds the id, ``TxnConflict`` if the keys moved meanwhile."""
        writable_key = self.layout.bookie_key(rec.bookie_id, False)
        readonly_key = self.layout.bookie_key(rec.bookie_id, True)
        key = readonly_key if rec.read_only else writable_key
        retired = self.layout.decommissioned_key(rec.bookie_id)
        if self.store.get(retired) is not None:
            raise BookieDecommissioned(rec.bookie_id)
        compares, ops = [absent(retired)], []  # (decommission retires the id and deletes the keys in one txn)
        for k in (writable_key, readonly_key):
            cur = self.store.get(k)
            if cur is None:
                compares.append(absent(k))
            elif cur.lease in ours or cur.lease == lease.id:
                compares.append(mod_revision_is(k, cur.mod_revision))
                if k != key:
                    ops.append(Delete(k))
            else:
                err = BookieIdInUse(rec.bookie_id, cur)
                err.key = k
                raise err
        ops.append(Put(key, rec.SerializeToString(deterministic=True), lease.id))
        return self.store.txn(compares, ops).revision

    def list_bookies(self, writable_only: bool = False) -> list[pb.BookieRegistration]:
        """The registered bookies sorted by id (read-only ones too unless
        ``writable_only``), from one consistent read."""
        return self.snapshot(writable_only)[0]

    def snapshot(self, writable_only: bool = False) -> tuple[list[pb.BookieRegistration], int]:
        """:meth:`list_bookies` plus the revision it was read at; watch
        from ``revision + 1`` to follow changes without a gap."""
        prefix = self.layout.bookies_state_prefix(False) if writable_only else self.layout.bookies_prefix()
        items, revision = self.store.range_with_revision(prefix)
        out = []
        for key, value in items:
            bookie_id, read_only = self.layout.parse_bookie_key(key)
            msg = _decode(value.value)
            if msg.bookie_id != bookie_id:
                raise CorruptMetadata(f"{key!r} holds the registration of {msg.bookie_id!r}")
            msg.read_only = read_only
            out.append(msg)
        out.sort(key=lambda m: m.bookie_id)
        return out, revision

    def watch(self, callback: Callable[[MembershipEvent], None], *, start_revision: int | None = None,
              on_error: Callable[[MetadataError], None] | None = None) -> Callable[[], None]:
        """Call ``callback(MembershipEvent)`` on every membership change;
        returns ``cancel()``.  See :meth:`MetadataStore.watch_prefix`."""
        assert callable(callback)

        def on_event(ev: WatchEvent) -> None:
            bookie_id, read_only = self.layout.parse_bookie_key(ev.key)
            if ev.type is EventType.DELETE:
                callback(MembershipEvent(MembershipChange.REMOVED, bookie_id, read_only, None, ev.mod_revision))
                return
            msg = _decode(ev.value)
            msg.read_only = read_only
            callback(MembershipEvent(MembershipChange.ADDED, bookie_id, read_only, msg, ev.mod_revision))

        return self.store.watch_prefix(self.layout.bookies_prefix(), on_event, start_revision=start_revision,
                                       on_error=on_error)
