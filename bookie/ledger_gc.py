"""The bookie's collection of ledgers deleted from the metadata, and of
the entries of ledgers that no longer name it (BookKeeper's
``GarbageCollectorThread``: ledgers gone from the ledger manager, and
over-replicated ledgers).

A ledger's deletion is sent to the bookies its fragments name.  A bookie
down at that moment, and a copy's target whose copy failed or was fenced
(stream/autorecovery/copier.py), keep the ledger's entries and state for
good.  Every ``ledger_gc_interval_s`` the bookie lists the ledger ids in
etcd and deletes its own ledgers that are absent.

The rule (``deleted``, pure) is safe because a ledger's metadata exists
before any bookie sees its id, and an id is never used again (ids are etcd
revisions: ``LedgerStore.allocate_id``).  So a ledger held here *before*
the listing began and absent from a complete listing was deleted.  The
local ids are taken first: a ledger created during the listing is no
candidate.  Each candidate is then read once more on its own
(``LedgerStore.exists``, BookKeeper's ``verifyMetadataOnGc``) before its
deletion: a listing that came back short costs nothing.  The two lists are
merged in id order, never held as a set: a cluster of a million ledgers
costs the bookie its own ids and a page of etcd's.

Over-replicated entries (BookKeeper's ``gcOverReplicatedLedger``, there per
ledger, here per entry range): entries of a ledger still in the metadata in
ranges whose fragments do not name this bookie (autorecovery replaced it
while it was down; a writer's ensemble changed away from it; fragments
trimmed away).  Nobody reads them.  Every ``over_replicated_gc_interval_s``
(a day, as BookKeeper's ``gcOverreplicatedLedgerWaitTime``: a metadata read
per ledger held) the bookie reads each ledger it holds entries of
(``unnamed_ranges``, pure); where it holds some in such ranges, it reads the
ledger again under the ledger's recovery lock and clears those ranges
(``Storage.clear_over_replicated``), only if:

- the lock is ours: no copy onto this bookie is under way (a copy writes
  its target before publishing it).  A copier paused past its lock is
  fenced by the lock's token, which the clearing leaves here;
- the ledger is not IN_RECOVERY (a take-over's recovery writes its new
  fragment's bookies before publishing it; a writer's ensemble change or
  roll publishes first);
- where a range reaches past the last fragment's start (the ledger's
  open end, where a writer may publish a fragment naming this bookie after
  the read, then prepare and write it here), no request for the ledger was
  admitted here since that read began (``BookieCore.admit_gc_clear``).
  Below the last fragment's start, fragments are sealed: their ensembles
  change only by autorecovery, under the lock.  (Not asked there, so that
  the garbage of a busy stream's older fragments is cleared between its
  appends.)

Only entries go: the ledger's term, fence and key stay, so that a writer
fenced here stays fenced (an old writer's ensemble may still name this
bookie).  The ledger's deletion from the metadata later drops the rest.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterable, Sequence

from bookie.cookie import CookieGuard, halt
from metadata.errors import InvalidCookie, MetadataError, NoSuchLedger
from metadata.ledgers import LedgerMetadata, LedgerState, LedgerStore

log = logging.getLogger(__name__)


def deleted(local: Sequence[int], listed: Iterable[int]) -> list[int]:
    """The ids of ``local`` (ascending: the bookie's ledgers before the
    listing began) absent from ``listed`` (ascending: the metadata's
    complete listing).  Consumes ``listed`` only as far as ``local`` goes."""
    out: list[int] = []
    it = iter(listed)
    nxt = next(it, None)
    for lid in local:
        while nxt is not None and nxt < lid:
            nxt = next(it, None)
        if nxt != lid:
            out.append(lid)
    return out


async def collect_deleted_ledgers(storage, ledgers, guard=None) -> dict:
    """One pass: ``storage`` (bookie/storage.py), ``ledgers`` the cluster's
    ``metadata.ledgers.LedgerStore``, ``guard`` the bookie's
    ``bookie.cookie.CookieGuard`` (each read the deletion rests on is made
    with etcd's cookie, and raises ``InvalidCookie`` where it is gone or
    another: a rebuilt etcd lists nothing).  Returns what it did.  Raises
    the metadata's errors (etcd unavailable: nothing deleted)."""
    local = sorted(storage.core.ledgers)  # before the listing
    done = {"ledgers_deleted": [], "entries_deleted": 0, "kept_on_second_read": 0, "kept_above_revision": 0}
    if not local:
        return done
    revision = None if guard is None else await asyncio.to_thread(guard.revision)
    gone = await asyncio.to_thread(lambda: deleted(local, ledgers.list_ledgers(revision=revision)))
    for lid in gone:
        if storage.core.halted:   # (its etcd check, meanwhile: nothing more on this listing's word)
            break
        if revision is not None and lid > revision:
            # An id etcd had not reached at the listing: no listing says such a
            # ledger was deleted (etcd gone back in time, or an id no one allocated).
            done["kept_above_revision"] += 1
            log.warning("ledger gc: ledger %d is above etcd's revision %d: kept", lid, revision)
            continue
        present = (await asyncio.to_thread(ledgers.exists, lid) if guard is None else
                   not await asyncio.to_thread(guard.absent, ledgers.layout.ledger_header_key(lid)))
        if present:
            done["kept_on_second_read"] += 1
            log.warning("ledger gc: ledger %d absent from the listing but its metadata is there: kept", lid)
            continue
        done["entries_deleted"] += await storage.drop_ledger(lid)
        done["ledgers_deleted"].append(lid)
    return done


MAX_ENTRY = (1 << 63) - 1


def unnamed_ranges(meta: LedgerMetadata, bookie_id: str) -> list[tuple[int, int]]:
    """The entry ranges [first, last] of ``meta`` (every fragment loaded)
    whose fragments do not name ``bookie_id``, adjacent ones merged: below
    the first fragment (trimmed), each fragment's span without it (the last
    one's up to ``MAX_ENTRY``).  Empty while a recovery writes a fragment not
    yet published (IN_RECOVERY)."""
    assert meta.fragments_complete, "judge with every fragment loaded"
    if meta.state is LedgerState.IN_RECOVERY:
        return []
    out: list[tuple[int, int]] = []

    def add(first: int, last: int) -> None:
        if first > last:
            return
        if out and out[-1][1] + 1 == first:
            out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))

    frags = meta.fragments
    add(0, frags[0].first_entry - 1 if frags else MAX_ENTRY)
    for k, f in enumerate(frags):
        if bookie_id not in f.ensemble:
            add(f.first_entry, frags[k + 1].first_entry - 1 if k + 1 < len(frags) else MAX_ENTRY)
    return out


def reaches_open_end(meta: LedgerMetadata, ranges: list[tuple[int, int]]) -> bool:
    """Whether ``ranges`` (``unnamed_ranges``) reach an OPEN ledger's end,
    where a fragment naming the bookie may be published after the read:
    then the clearing asks that no request was admitted since."""
    return bool(ranges) and ranges[-1][1] == MAX_ENTRY and meta.state is not LedgerState.CLOSED


def _read(ledgers, lid: int) -> LedgerMetadata | None:
    try:
        return ledgers.read(lid)[0]
    except NoSuchLedger:
        return None


def _held(storage, lid: int, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges the bookie holds entries of."""
    st = storage.core.ledgers.get(lid)
    if st is None:
        return []
    return [r for r in ranges if next(st.index.run_slices(r[0], r[1], skip_gaps=True), None) is not None]


async def collect_over_replicated(storage, ledgers, keys, bookie_id: str, lease_id: int, guard=None) -> dict:
    """One pass (see the module's doc): ``keys`` the cluster's
    ``AutorecoveryKeys`` (the recovery locks), ``lease_id`` the lease the
    locks are taken on (the bookie's registration's), ``guard`` the
    bookie's ``CookieGuard``: etcd checked at the pass's start (an etcd
    restored from a snapshot holds older fragments, which may not name this
    bookie where a copy since made it the only holder of their entries).
    The pass stops where the bookie halts.  Returns what it did.  Raises
    the metadata's errors, and ``InvalidCookie`` (what was cleared before
    stays cleared)."""
    owner = f"bookie-gc:{bookie_id}"
    done = {"ledgers_cleared": [], "entries_deleted": 0, "locked_elsewhere": 0, "touched_since": 0}
    held = sorted(lid for lid, st in storage.core.ledgers.items() if len(st.index))
    if held and guard is not None:
        await asyncio.to_thread(guard.revision)
    for lid in held:
        if storage.core.halted:
            break
        meta = await asyncio.to_thread(_read, ledgers, lid)
        if meta is None or not _held(storage, lid, unnamed_ranges(meta, bookie_id)):
            continue   # deleted (the other collection's), or nothing held where it is not named
        token = await asyncio.to_thread(keys.try_lock, lid, owner, lease_id)
        if token is None:
            done["locked_elsewhere"] += 1
            continue
        try:
            touched = storage.core.touched_of(lid)
            meta = await asyncio.to_thread(_read, ledgers, lid)
            ranges = [] if meta is None else _held(storage, lid, unnamed_ranges(meta, bookie_id))
            if touched is None or not ranges or storage.core.halted:
                continue
            n = await storage.clear_over_replicated(lid, token, touched if reaches_open_end(meta, ranges) else None,
                                                    ranges)
            if n is None:
                done["touched_since"] += 1
                continue
            done["ledgers_cleared"].append(lid)
            done["entries_deleted"] += n
        finally:
            await asyncio.to_thread(keys.unlock, lid, owner)
    return done


# -- the bookie's loops -------------------------------------------------------------------

async def _periodic(storage, interval: float, name: str, one_pass, report) -> None:
    """``report(await one_pass())`` every ``interval`` seconds, in a loop of
    its own (a long pass never holds the bookie's checkpoints back); etcd
    away: logged, nothing done, tried again next interval.  etcd found
    untrustworthy (``InvalidCookie``: another or a rebuilt etcd, or one
    gone back in time): the bookie halts (``bookie.cookie.halt``, as its
    etcd check does), and a halted bookie's passes are skipped: nothing is
    deleted on the word of an etcd the bookie no longer trusts."""
    while True:
        await asyncio.sleep(interval)
        if storage.core.halted:
            continue
        try:
            done = await one_pass()
        except InvalidCookie as e:
            halt(storage.core, storage.dir, e)   # (recorded before the line below says so)
            log.error("%s refused: %s", name, e)
            continue
        except MetadataError as e:
            log.warning("%s: %s", name, e)
            continue
        except Exception:
            log.exception("%s failed", name)
            continue
        report(done)


async def deleted_ledgers_loop(storage, registration, metrics, interval: float, cookie=None) -> None:
    """``collect_deleted_ledgers`` every ``interval`` (``--ledger-gc-interval``),
    guarded by the bookie's ``cookie`` when it has one (bookie/cookie.py)."""
    ledgers = LedgerStore(registration.store, registration.cluster)
    guard = None if cookie is None else CookieGuard(registration.store, registration.cluster, cookie, storage.dir)

    def report(done: dict) -> None:
        metrics.ledger_gc(done)
        if done["ledgers_deleted"]:
            log.info("ledger gc: deleted ledgers %s (%d entries), gone from the metadata",
                     done["ledgers_deleted"][:20], done["entries_deleted"])

    await _periodic(storage, interval, "ledger gc", lambda: collect_deleted_ledgers(storage, ledgers, guard), report)


async def over_replicated_loop(storage, registration, metrics, interval: float, bookie_id: str,
                               cookie=None) -> None:
    """``collect_over_replicated`` every ``interval``
    (``--over-replicated-gc-interval``), the locks taken on the
    registration's lease (its current one: a registration re-created after
    an etcd outage has a new lease), guarded by the bookie's ``cookie``
    when it has one."""
    from stream.autorecovery.keys import AutorecoveryKeys  # (the client package's: the recovery locks)

    ledgers = LedgerStore(registration.store, registration.cluster)
    keys = AutorecoveryKeys(registration.store, registration.cluster)
    guard = None if cookie is None else CookieGuard(registration.store, registration.cluster, cookie, storage.dir)

    def report(done: dict) -> None:
        metrics.over_replicated_gc(done)
        if done["locked_elsewhere"]:
            log.info("over-replicated gc: %d ledgers under a recovery's lock, left for the next pass",
                     done["locked_elsewhere"])
        if done["ledgers_cleared"]:
            log.info("over-replicated gc: cleared ledgers %s (%d entries), whose metadata no longer "
                     "names this bookie", done["ledgers_cleared"][:20], done["entries_deleted"])

    await _periodic(storage, interval, "over-replicated gc",
                    lambda: collect_over_replicated(storage, ledgers, keys, bookie_id, registration.lease.id, guard),
                    report)


__all__ = ["deleted", "collect_deleted_ledgers", "unnamed_ranges", "reaches_open_end", "collect_over_replicated",
           "deleted_ledgers_loop", "over_replicated_loop"]
