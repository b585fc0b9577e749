"""Autorecovery's state in etcd (keys in :mod:`metadata.layout`): the
cluster-wide switch, one under-replicated task per ledger, lease-bound task
locks, the auditor's election key, decommissioned bookie ids.  Blocking
calls (the store is synchronous): async code runs them in a thread.

Every read-modify-write is a CAS on the key's mod_revision, retried: two
auditors (an old one not yet aware it lost its key) publishing to the same
task merge, a worker deleting a task to which a lost bookie was added
meanwhile does not delete it.

Leases: :class:`LeaseSource` is the small interface the auditor and the
workers hold their keys through (a lease id, whether it is lost, close).
:class:`StoreLeases` implements it with the store's ``Lease`` and
``KeepAlive``; the ``ops`` engineer's keeper (``metadata/keeper*.py``: keep a
lease-bound key alive and re-create it after loss) can replace it.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Iterator, Protocol

from metadata.errors import BadVersion, KeyExists, TxnConflict
from metadata.layout import KeyLayout
from metadata.store import Delete, MetadataStore, Put, absent, mod_revision_is

_CAS_ROUNDS = 20


# -- leases -------------------------------------------------------------------------------

class HeldLease(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def lost(self) -> bool: ...

    def close(self) -> None: ...


class LeaseSource(Protocol):
    def acquire(self) -> HeldLease: ...


class _StoreLease:
    def __init__(self, store: MetadataStore, ttl: int) -> None:
        self.lease = store.lease(ttl)
        self.keepalive = self.lease.keep_alive()

    @property
    def id(self) -> int:
        return self.lease.id

    @property
    def lost(self) -> bool:
        return self.keepalive.lost

    def close(self) -> None:
        self.keepalive.stop()
        try:
            self.lease.revoke()
        except Exception:  # etcd away: the lease expires by itself
            pass


@dataclasses.dataclass
class StoreLeases:
    """A fresh lease per :meth:`acquire`, refreshed by a KeepAlive thread;
    once lost, the holder acquires a new one (and re-creates its keys)."""

    store: MetadataStore
    ttl: int = 5

    def acquire(self) -> HeldLease:
        return _StoreLease(self.store, self.ttl)


# -- tasks --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Task:
    """An under-replicated ledger.  ``unrecoverable``: fragments found with
    no surviving replica (``{"first", "last", "lost", "why"}``), kept
    visible until an operator deletes the ledger or the task."""

    ledger_id: int
    lost: frozenset[str]
    created_ms: int
    unrecoverable: tuple[dict, ...] = ()
    revision: int = 0
    # registered bookies the periodic check found lacking entries (a subset
    # of ``lost``): not made moot by their registration
    damaged: frozenset[str] = frozenset()
    # which ids of the ledger a damaged bookie is known to lack or hold
    # rotted (inclusive ranges, in order): those filled in place
    # (worker_core.plan_ledger); a damaged bookie without ranges here has
    # its whole share of every sealed fragment copied
    damaged_ids: dict = dataclasses.field(default_factory=dict)

    def reported(self, lost, damaged: bool = False, ids: dict | None = None) -> "Task":
        """This task once ``lost`` is reported (what ``publish`` writes;
        itself when that changes nothing).  ``damaged``: registered bookies
        the check found lacking entries or their scrub found rotted ones,
        with ``ids`` (bookie -> ranges) where known.  Not ``damaged``: the
        auditor declares them lost (unregistered past its delay): what they
        held is gone, so one reported damaged before is damaged no more (a
        fill in place onto a bookie gone for good would wait for ever, its
        share never moved)."""
        lost = frozenset(lost)
        dmg = lost if damaged else frozenset()
        gone = frozenset() if damaged else lost
        ids_now = {b: r for b, r in _damaged_ids(self, dmg, ids).items() if b not in gone}
        out = dataclasses.replace(self, lost=self.lost | lost, damaged=(self.damaged - gone) | dmg,
                                  damaged_ids=ids_now)
        return self if out == self else out

    def without(self, bookie_id: str) -> "Task | None":
        """This task once ``bookie_id``, declared lost, is registered again
        (``moot``): not lost, and any unrecoverable report naming it no
        longer stands (it may hold the only copy); None when nothing is
        left (the task goes); itself for a bookie it does not name as lost,
        or names as damaged (registered all along: its damage stands)."""
        if bookie_id not in self.lost or bookie_id in self.damaged:
            return self
        rest = self.lost - {bookie_id}
        standing = tuple(u for u in self.unrecoverable if bookie_id not in u.get("lost", ()))
        return None if not rest and not standing else dataclasses.replace(self, lost=rest, unrecoverable=standing)

    def mended(self, filled) -> "Task":
        """This task once the ranges ``filled`` ((first, last, bookie):
        ids filled in place on a damaged bookie in one call, each within
        one fragment) are taken off its ``damaged_ids``: a call that must
        wait for the rest (ids of the open fragment above its LAC, another
        bookie) does not copy them again on every later call.  A bookie left
        with no ids is mended: neither damaged nor lost any more (without
        ranges it would stand for its whole share).  A bookie damaged as a
        whole keeps its damage (its share is moved or copied whole)."""
        ids = dict(self.damaged_ids)
        for first, last, b in filled:
            if b in ids:
                ids[b] = subtract_range(ids[b], first, last)
        mended = frozenset(b for b in self.damaged_ids if not ids[b] and b in self.damaged)
        ids = {b: rs for b, rs in ids.items() if rs}
        out = dataclasses.replace(self, lost=self.lost - mended, damaged=self.damaged - mended, damaged_ids=ids)
        return self if out == self else out

    def to_bytes(self) -> bytes:
        d = self.as_json()
        del d["ledger_id"]   # (the key's)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, ledger_id: int, data: bytes, revision: int) -> "Task":
        d = json.loads(data)
        ids = {b: tuple(tuple(r) for r in rs) for b, rs in d.get("damaged_ids", {}).items()}
        return cls(ledger_id, frozenset(d.get("lost", ())), int(d.get("created_ms", 0)),
                   tuple(d.get("unrecoverable", ())), revision, frozenset(d.get("damaged", ())), ids)

    def as_json(self) -> dict:
        return {"ledger_id": self.ledger_id, "lost": sorted(self.lost), "created_ms": self.created_ms,
                "unrecoverable": list(self.unrecoverable), "damaged": sorted(self.damaged),
                "damaged_ids": {b: [list(r) for r in rs] for b, rs in sorted(self.damaged_ids.items())}}


MAX_DAMAGED_RANGES = 256   # per bookie and task; more are kept as the one range that spans them


def merge_ranges(*parts) -> tuple[tuple[int, int], ...]:
    """Inclusive id ranges merged, in order; beyond ``MAX_DAMAGED_RANGES``
    the one range spanning them (filling more ids in place than were
    found is harmless: each is added again as its replicas hold it)."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for rs in parts for a, b in rs):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    if len(out) > MAX_DAMAGED_RANGES:
        out = [[out[0][0], out[-1][1]]]
    return tuple((a, b) for a, b in out)


def subtract_range(ranges, first: int, last: int) -> tuple[tuple[int, int], ...]:
    """Inclusive ``ranges`` without the ids ``first..last``."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b < first or a > last:
            out.append((a, b))
            continue
        if a < first:
            out.append((a, first - 1))
        if b > last:
            out.append((last + 1, b))
    return tuple(out)


def _damaged_ids(cur: Task | None, lost, ids: dict | None) -> dict:
    """A task's ``damaged_ids`` once ``lost`` is reported damaged, with
    ``ids`` (bookie -> ranges) where the report knows them.  A bookie
    damaged as a whole (reported without ranges, now or before) stays so."""
    out = dict(cur.damaged_ids) if cur is not None else {}
    for b in lost:
        known = (ids or {}).get(b)
        was_whole = cur is not None and b in cur.damaged and b not in cur.damaged_ids
        if not known or was_whole:
            out.pop(b, None)
        else:
            out[b] = merge_ranges(out.get(b, ()), known)
    return out


class AutorecoveryKeys:
    def __init__(self, store: MetadataStore, cluster: str) -> None:
        self.store = store
        self.layout = KeyLayout(cluster)

    # -- the switch ---------------------------------------------------------------------

    def enabled(self) -> bool:
        v = self.store.get(self.layout.autorecovery_enabled_key())
        return v is None or v.value != b"false"

    def set_enabled(self, on: bool) -> None:
        self.store.put(self.layout.autorecovery_enabled_key(), b"true" if on else b"false")

    # -- the sampled full check's passes ----------------------------------------------------

    def check_pass(self) -> int:
        """The number of the sampled full check's pass to run: one more than
        the last one completed (0 the first), whichever auditor ran it, so
        that its windows follow that pass's (``replica_check.sampled_ranges``).
        A pass that fails midway is not recorded: the next one runs its
        windows again, and none waits a turn round the fragment for it."""
        cur = self.store.get(self.layout.check_pass_key())
        return 0 if cur is None else int(cur.value) + 1

    def check_pass_done(self, pass_no: int) -> None:
        """Records pass ``pass_no`` completed (CAS); a later one recorded
        already is kept (two auditors for a moment: the number never goes
        back)."""
        key = self.layout.check_pass_key()
        for _ in range(_CAS_ROUNDS):
            cur = self.store.get(key)
            if cur is not None and int(cur.value) >= pass_no:
                return
            try:
                if cur is None:
                    self.store.create(key, b"%d" % pass_no)
                else:
                    self.store.cas(key, b"%d" % pass_no, cur.mod_revision)
                return
            except (KeyExists, BadVersion):
                continue
        raise TxnConflict({key: None})

    # -- tasks --------------------------------------------------------------------------

    def publish(self, ledger_id: int, lost: frozenset[str] | set[str], damaged: bool = False,
                ids: dict | None = None) -> Task:
        """Create the ledger's task, or add ``lost`` to it (CAS).  ``damaged``:
        the bookies were found lacking entries by the check, or rotted ones
        by their scrub (registered); ``ids``: bookie -> the id ranges found
        (``Task.damaged_ids``; a bookie without: its whole share)."""
        key = self.layout.underreplicated_key(ledger_id)
        for _ in range(_CAS_ROUNDS):
            cur = self.get_task(ledger_id)
            if cur is None:
                task = Task(ledger_id, frozenset(), int(time.time() * 1000)).reported(lost, damaged, ids)
                try:
                    rev = self.store.create(key, task.to_bytes())
                    return dataclasses.replace(task, revision=rev)
                except KeyExists:
                    continue
            task = cur.reported(lost, damaged, ids)
            if task is cur:
                return cur
            try:
                return dataclasses.replace(task, revision=self.store.cas(key, task.to_bytes(), cur.revision))
            except BadVersion:
                continue
        raise TxnConflict({key: None})

    def get_task(self, ledger_id: int) -> Task | None:
        v = self.store.get(self.layout.underreplicated_key(ledger_id))
        return None if v is None else Task.from_bytes(ledger_id, v.value, v.mod_revision)

    def tasks(self, page: int | None = None) -> Iterator[Task]:
        """Every task, ascending by ledger, read page by page."""
        prefix = self.layout.underreplicated_prefix()
        for key, v in self.store.iter_range(prefix, page_size=page):
            yield Task.from_bytes(self.layout.parse_underreplicated_key(key), v.value, v.mod_revision)

    def update_task(self, task: Task) -> Task | None:
        """CAS ``task`` (its fields) at its revision; None if it changed."""
        try:
            rev = self.store.cas(self.layout.underreplicated_key(task.ledger_id), task.to_bytes(), task.revision)
        except BadVersion:
            return None
        return dataclasses.replace(task, revision=rev)

    def delete_task(self, task: Task) -> bool:
        """Delete the task at its revision (False if it changed meanwhile)."""
        try:
            return self.store.delete(self.layout.underreplicated_key(task.ledger_id), task.revision)
        except BadVersion:
            return False

    def moot(self, bookie_id: str) -> int:
        """A lost bookie came back: drop it from every task, and every
        unrecoverable report naming it; a task left naming nothing goes.
        Returns how many tasks changed."""
        changed = 0
        for task in list(self.tasks()):
            for _ in range(_CAS_ROUNDS):
                after = task.without(bookie_id)
                if after is task:
                    break
                if (self.delete_task(task) if after is None else self.update_task(after) is not None):
                    changed += 1
                    break
                task = self.get_task(task.ledger_id)
                if task is None:
                    break
        return changed

    # -- locks --------------------------------------------------------------------------

    def try_lock(self, ledger_id: int, owner: str, lease_id: int) -> int | None:
        """Take the ledger's lock, or find it already ours (see
        ``_create_or_mine``).  Returns the hold's fencing token, the lock
        key's create revision (etcd revisions only grow: a later holder's
        token is higher), or None when another holds the lock.  A copy's
        clearing of its target carries it (bookie/core.py ``admit_clear``)."""
        return self._create_or_mine(self.layout.recovery_lock_key(ledger_id), owner.encode(), lease_id)

    def _create_or_mine(self, key: str, value: bytes, lease_id: int) -> int | None:
        """Creates the lease-bound key; found with our value on our lease,
        it is ours too.  Returns its create revision, or None (not ours).
        Without the second case a holder whose create answer was lost, or
        whose release failed in an etcd outage its lease outlived, would
        find its own key in the way (KeyExists) and wait, as would everyone
        else, for as long as its process runs: a worker never taking its
        task again, an elected auditor that no longer leads."""
        try:
            return self.store.create(key, value, lease=lease_id)
        except KeyExists:
            v = self.store.get(key)
            return v.create_revision if v is not None and v.value == value and v.lease == lease_id else None

    def unlock(self, ledger_id: int, owner: str) -> None:
        key = self.layout.recovery_lock_key(ledger_id)
        v = self.store.get(key)
        if v is not None and v.value == owner.encode():
            try:
                self.store.delete(key, v.mod_revision)
            except BadVersion:
                pass

    def lock_holder(self, ledger_id: int) -> str | None:
        v = self.store.get(self.layout.recovery_lock_key(ledger_id))
        return None if v is None else v.value.decode()

    def still_mine(self, ledger_id: int, owner: str) -> bool:
        return self.lock_holder(ledger_id) == owner

    # -- the auditor's election --------------------------------------------------------------

    def campaign(self, me: dict, lease_id: int) -> bool:
        """Become the auditor: create the lease-bound key if nobody holds it
        (or find it ours, on this lease: see ``_create_or_mine``)."""
        return self._create_or_mine(self.layout.auditor_key(), json.dumps(me, sort_keys=True).encode(),
                                    lease_id) is not None

    def auditor(self) -> dict | None:
        v = self.store.get(self.layout.auditor_key())
        return None if v is None else json.loads(v.value)

    def resign(self, me: dict) -> None:
        key = self.layout.auditor_key()
        v = self.store.get(key)
        if v is not None and json.loads(v.value) == me:
            try:
                self.store.delete(key, v.mod_revision)
            except BadVersion:
                pass

    # -- decommission ---------------------------------------------------------------------

    def mark_decommissioned(self, bookie_id: str, registration_keys: list[str]) -> None:
        """Record the id as decommissioned and remove its registrations, in
        one transaction.  A bookie that registers with this id again is to be
        refused (``metadata/registration.py`` is to check this key: a stated
        gap until the ``ops`` branch merges)."""
        key = self.layout.decommissioned_key(bookie_id)
        ops = [Put(key, json.dumps({"at_ms": int(time.time() * 1000)}).encode())]
        ops += [Delete(k) for k in registration_keys]
        self.store.txn([], ops)

    def decommissioned(self) -> list[str]:
        prefix = self.layout.decommissioned_prefix()
        return [k[len(prefix):] for k, _ in self.store.iter_range(prefix)]


__all__ = ["LeaseSource", "HeldLease", "StoreLeases", "Task", "AutorecoveryKeys", "absent", "mod_revision_is"]
