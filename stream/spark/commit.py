"""The sink's etcd side: the keys of a write job and the one transaction
that makes its ledgers part of a log.

Keys (under the cluster's root, beside ``logs/<name>``):

==========================================  ==========================================================
``spark/pending/<job>/<lid>``               a ledger a task of job ``<job>`` created (put right after
                                            the create, before any write): every ledger of the job,
                                            committed or not, so a failed attempt's can be found
``spark/sinks/<kind>/<name>/<sink>``        a streaming sink's last committed batch id (JSON), where
                                            ``<kind>`` is log or stream and ``<sink>`` a hash of what
                                            names the query (``sinkId``, or its checkpoint location)
==========================================  ==========================================================

A stream sink's record may also hold ``pending``: the batch being copied
into the stream (``batch``), the term of the writer copying it, the entry
its first copied record went to, and how many of the batch's records
earlier attempts had copied (``before``).  See ``sink.copy_batch_into_stream``.

:func:`commit_to_log` first deletes the ledgers of failed attempts (pending
but not committed), then, in one transaction that compares the log key's
and the sink key's revisions: the log's list gains the committed ledgers in
partition order, the sink key gets the batch id, and the job's pending keys
go.  A replayed streaming batch (its id at or below the recorded one) is not
appended: its ledgers are deleted instead.  On a lost compare it reads again
and retries; on a lost answer too, and the list then says whether it went
through (its ledgers listed: only this commit lists them).  A transaction
whose answer was lost may still apply later (a paused etcd applies what it
received once it resumes), so before ledgers of a failed attempt are deleted
(here, and by :func:`abort`), the list is fenced (:func:`fence_list`: written
back unchanged, its revision moved past any such transaction's compare).

The log's list is read and written through ``stream.log`` (``read_ledger_list``,
``encode_ledger_list``, ``log_key``); a log written
by a ``LogWriter`` leader at the same time would lose its leadership at its
next roll (its list CAS fails), so do not point a sink at a log that has a
live leader.
"""
from __future__ import annotations

import hashlib
import json
import logging

from metadata.layout import KeyLayout, validate_name
from metadata.store import Delete, Put, TxnConflict, absent, mod_revision_is
from stream import errors as err
from stream.client import BookKeeperClient
from stream.log import encode_ledger_list, log_key, read_ledger_list

log = logging.getLogger(__name__)


def pending_prefix(layout: KeyLayout, job: str) -> str:
    return f"{layout.root}spark/pending/{validate_name(job, 'job id')}/"


def pending_key(layout: KeyLayout, job: str, ledger_id: int) -> str:
    return f"{pending_prefix(layout, job)}{ledger_id:020d}"


def sink_key(layout: KeyLayout, kind: str, name: str, sink: str) -> str:
    assert kind in ("log", "stream")
    digest = hashlib.sha256(sink.encode()).hexdigest()[:32]
    return f"{layout.root}spark/sinks/{kind}/{validate_name(name, kind + ' name')}/{digest}"


async def note_pending(bk: BookKeeperClient, job: str, ledger_id: int, **about) -> None:
    """Notes a task's ledger (``about``: where the task ran, as JSON)."""
    await bk.meta_call(bk.store.put, pending_key(KeyLayout(bk.cluster), job, ledger_id),
                       json.dumps(about).encode())


async def pending_ledgers(bk: BookKeeperClient, job: str) -> list[int]:
    rows = await bk.meta_call(bk.store.range, pending_prefix(KeyLayout(bk.cluster), job))
    return [int(k.rsplit("/", 1)[1]) for k, _ in rows]


async def drop_ledgers(bk: BookKeeperClient, job: str, ids) -> None:
    """Deletes the ledgers, then their pending keys."""
    layout = KeyLayout(bk.cluster)
    for lid in ids:
        try:
            await bk.delete_ledger(lid)
        except err.NoSuchLedger:
            pass
        await bk.meta_call(bk.store.delete, pending_key(layout, job, lid))


async def abort(bk: BookKeeperClient, job: str, log_name: str | None = None) -> list[int]:
    """Deletes every ledger of the job (the task messages may not name the
    failed ones: the pending keys do), except any the log's list holds (a
    commit whose answer was lost may have gone through).  The list is
    fenced first (``fence_list``), so that such a commit can no longer go
    through once its ledgers are deleted."""
    listed = set(await fence_list(bk, log_name)) if log_name is not None else set()
    ids = [lid for lid in await pending_ledgers(bk, job) if lid not in listed]
    await drop_ledgers(bk, job, ids)
    return ids


async def fence_list(bk: BookKeeperClient, log_name: str, attempts: int = 20) -> list[int]:
    """The log's list, after writing it back unchanged at its revision (CAS;
    an absent list written empty): a commit's transaction sent before, whose
    answer was lost (etcd paused, a link down, the call given up), compares
    an older revision and can no longer apply (a paused etcd applies what it
    received once it resumes), so the list returned is final for it."""
    key = log_key(bk, log_name)
    for _ in range(attempts):
        ids, rev = await read_ledger_list(bk, log_name)
        try:
            await bk.meta_call(bk.store.txn, [absent(key) if rev is None else mod_revision_is(key, rev)],
                               [Put(key, encode_ledger_list(log_name, ids))])
            return ids
        except (TxnConflict, err.MetadataConflict):
            continue
    raise err.MetadataConflict(f"log {log_name}: the list kept changing ({attempts} attempts)")


async def last_batch(bk: BookKeeperClient, key: str) -> tuple[int, int | None]:
    """The recorded batch id (-1: none) and the key's revision."""
    v = await bk.meta_call(bk.store.get, key)
    if v is None:
        return -1, None
    return int(json.loads(v.value)["batch"]), v.mod_revision


async def read_sink(bk: BookKeeperClient, key: str) -> tuple[dict, int | None]:
    """A streaming sink's record (``{"batch": -1}`` when none) and the key's
    revision (None: absent)."""
    v = await bk.meta_call(bk.store.get, key)
    if v is None:
        return {"batch": -1}, None
    return json.loads(v.value), v.mod_revision


async def cas_sink(bk: BookKeeperClient, key: str, record: dict, revision: int | None) -> int:
    """Writes the sink's record if the key is still at ``revision``; returns
    the new revision.  Raises MetadataConflict otherwise (another driver of
    the same query committed meanwhile)."""
    try:
        r = await bk.meta_call(bk.store.txn, [absent(key) if revision is None else mod_revision_is(key, revision)],
                               [Put(key, json.dumps(record).encode())])
    except (TxnConflict, err.MetadataConflict) as e:
        raise err.MetadataConflict(f"sink record {key} changed under this commit") from e
    return r.revision


async def commit_to_log(bk: BookKeeperClient, log_name: str, job: str, ledger_ids: list[int], *,
                        sink: str | None = None, batch_id: int | None = None, attempts: int = 20) -> bool:
    """Appends ``ledger_ids`` (in that order) to the log's list in one CAS,
    with the batch id when ``sink`` is given.  Returns False (and deletes the
    ledgers) when the batch was committed before."""
    layout = KeyLayout(bk.cluster)
    lkey = log_key(bk, log_name)
    skey = sink_key(layout, "log", log_name, sink) if sink is not None else None
    garbage = sorted(set(await pending_ledgers(bk, job)) - set(ledger_ids))
    if garbage:   # (a failed attempt's: its commit, if its answer was lost, fenced off before they go)
        await fence_list(bk, log_name)
        garbage = sorted(set(await pending_ledgers(bk, job)) - set(ledger_ids))
    if garbage:
        log.info("log %s: deleting %d ledgers of failed attempts: %s", log_name, len(garbage), garbage)
        await drop_ledgers(bk, job, garbage)
    for _ in range(attempts):
        ids, rev = await read_ledger_list(bk, log_name)
        if ledger_ids and set(ledger_ids) <= set(ids):   # (only this commit lists them)
            log.info("log %s: ledgers %s listed by an attempt of this commit whose answer was lost",
                     log_name, ledger_ids)
            return True
        compares = [absent(lkey) if rev is None else mod_revision_is(lkey, rev)]
        ops = [Put(lkey, encode_ledger_list(log_name, ids + list(ledger_ids)))]
        if skey is not None:
            done, srev = await last_batch(bk, skey)
            if batch_id <= done:
                log.info("log %s: batch %s was committed before (last %s): not appended again",
                         log_name, batch_id, done)
                await drop_ledgers(bk, job, ledger_ids)
                return False
            compares.append(absent(skey) if srev is None else mod_revision_is(skey, srev))
            ops.append(Put(skey, json.dumps({"batch": batch_id, "log": log_name, "sink": sink}).encode()))
        ops.append(Delete.prefix(pending_prefix(layout, job)))
        try:
            await bk.meta_call(bk.store.txn, compares, ops)
            log.info("log %s: appended ledgers %s (batch %s)", log_name, ledger_ids, batch_id)
            return True
        except (TxnConflict, err.MetadataConflict):
            continue
        except err.MetadataUnavailable:
            continue   # the outcome is unknown: the list, read again, says (each attempt compares its revision)
    raise err.MetadataConflict(f"log {log_name}: the list kept changing ({attempts} attempts)")
