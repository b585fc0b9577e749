"""The bookie's collection of ledgers deleted from the metadata (BookKeeper's
``GarbageCollectorThread`` for ledgers gone from the ledger manager).

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

Not collected: a ledger still in the metadata whose fragments no longer name
this bookie (back after autorecovery replaced it).  That needs the ledger's
recovery lock first: a copy's target holds entries of a ledger that names
it only once the copy is published.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterable, Sequence

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


async def collect_deleted_ledgers(storage, ledgers) -> dict:
    """One pass: ``storage`` (bookie/storage.py), ``ledgers`` the cluster's
    ``metadata.ledgers.LedgerStore``.  Returns what it did.  Raises the
    metadata's errors (etcd unavailable: nothing deleted)."""
    local = sorted(storage.core.ledgers)  # before the listing
    done = {"ledgers_deleted": [], "entries_deleted": 0, "kept_on_second_read": 0}
    if not local:
        return done
    gone = await asyncio.to_thread(lambda: deleted(local, ledgers.list_ledgers()))
    for lid in gone:
        if await asyncio.to_thread(ledgers.exists, lid):
            done["kept_on_second_read"] += 1
            log.warning("ledger gc: ledger %d absent from the listing but its metadata is there: kept", lid)
            continue
        done["entries_deleted"] += await storage.drop_ledger(lid)
        done["ledgers_deleted"].append(lid)
    return done


__all__ = ["deleted", "collect_deleted_ledgers"]
