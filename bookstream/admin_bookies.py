"""`bookstream bookies list|info|sanity|scrub|cookie`: the bookies of a cluster.

A BOOKIE argument is a bookie id (as registered) or its address (host:port).
"""
from __future__ import annotations

import time

import click

from bookstream.admin import Admin, AdminError, CheckFailed, Column, NotFound, Output, admin_command, human_bytes


@click.group("bookies")
def bookies() -> None:
    """The bookies of the cluster (registrations in etcd, Info from each bookie)."""


def _registration_row(r) -> dict:
    return {"bookie_id": r.bookie_id, "address": r.address, "read_address": r.read_address,
            "state": "halted" if r.halted else "readonly" if r.read_only else "writable",
            "halted": r.halted or None,
            "free_bytes": r.free_bytes, "total_bytes": r.total_bytes,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.started_ms / 1000)) if r.started_ms else None}


LIST_COLUMNS = [
    Column("bookie_id", "bookie"), Column("address", "address"), Column("read_address", "read port"),
    Column("state", "state"),
    Column("free_bytes", "free", human_bytes, "right"), Column("total_bytes", "total", human_bytes, "right"),
    Column("started", "started"),
]


@admin_command(bookies, "list")
@click.option("--readonly", "which", flag_value="readonly", help="only the read-only bookies (halted ones too)")
@click.option("--writable", "which", flag_value="writable", help="only the writable bookies")
def list_bookies(adm: Admin, which: str | None) -> Output:
    """The registered bookies (writable, read-only, and halted: read-only
    for good, its etcd untrusted; `--format json` says why)."""
    from metadata.registration import BookieRegistry

    with adm.store() as store:
        regs = BookieRegistry(store, adm.cluster).list_bookies()
    rows = [_registration_row(r) for r in regs]
    if which:
        rows = [r for r in rows if (r["state"] != "writable") == (which == "readonly")]   # (halted: read-only)
    return Output(rows=rows, columns=LIST_COLUMNS)


def find_bookie(adm: Admin, store, bookie: str) -> tuple[str | None, str, object | None]:
    """(id, address, registration) of BOOKIE, an id or an address; an
    unregistered address is taken as is (its Info names it)."""
    from metadata.registration import BookieRegistry

    regs = BookieRegistry(store, adm.cluster).list_bookies()
    for r in regs:
        if bookie in (r.bookie_id, r.address):
            return r.bookie_id, r.address, r
    host, sep, port = bookie.rpartition(":")
    if sep and host and port.isdigit():
        return None, bookie, None
    known = ", ".join(r.bookie_id for r in regs) or "none"
    raise NotFound(f"no bookie {bookie!r} registered in cluster {adm.cluster!r} (registered: {known})")


async def _info(address: str, timeout: float):
    from bookstream.security import current
    from stream.bookie_client import BookieClient

    c = BookieClient(address, current().tls)
    try:
        return await c.info(timeout=timeout)
    finally:
        await c.close()


@admin_command(bookies, "info")
@click.argument("bookie")
def info(adm: Admin, bookie: str) -> Output:
    """Address, state, disk usage, journal and index figures, ledgers held,
    and the bookie's own view of its registration."""
    from bookstream.admin_http import info_record

    with adm.store() as store:
        bid, address, reg = find_bookie(adm, store, bookie)
    i = adm.run(_info(address, adm.timeout))
    rec = {"bookie_id": i.bookie_id, "address": address, "registered": reg is not None}
    rec.update(info_record(i))
    if bid is not None and i.bookie_id != bid:
        raise CheckFailed(f"{address} answers as bookie {i.bookie_id!r}, but is registered as {bid!r}")
    return Output(record=rec, title=f"bookie {i.bookie_id}")


@admin_command(bookies, "scrub")
@click.argument("bookie")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="wait for the pass to end, its progress on stderr")
@click.option("--max-wait", type=click.FloatRange(min=0), default=None,
              help="give up waiting after this many seconds (the pass goes on)")
def scrub(adm: Admin, bookie: str, wait: bool, max_wait: float | None) -> Output:
    """Asks the bookie for a scrub pass now (BookKeeper's local consistency
    check): every entry it holds read back and its checksum checked, a
    rotted one reported to autorecovery, which copies it back from the
    other replicas.  The pass begins at once, or once a running one ends,
    at the bookie's --scrub-rate-mb; the ask is a key in etcd, kept while
    the bookie is down and served when it is back."""
    import json

    from bookstream.admin_http import when_utc
    from metadata.layout import KeyLayout

    with adm.store() as store:
        bid, address, reg = find_bookie(adm, store, bookie)
        if bid is None:
            raise NotFound(f"{bookie!r} is not a registered bookie")
        i = adm.run(_info(address, adm.timeout))
        if not i.scrub_interval:
            raise AdminError(f"bookie {bid} does not scrub (started with --scrub-interval 0)")
        key = KeyLayout(adm.cluster).scrub_request_key(bid)
        rev = store.put(key, json.dumps({"asked": time.time()}).encode())
        rec = {"bookie_id": bid, "request_revision": rev, "rotted_entries_before": i.scrub_rotted_entries}
        if not wait:
            return Output(record=rec | {"served": False}, title=f"scrub of bookie {bid} asked for")
        deadline = None if max_wait is None else time.monotonic() + max_wait
        while not store.wait_deleted(key, 2.0 if deadline is None else max(0.0, min(2.0, deadline - time.monotonic()))):
            if deadline is not None and time.monotonic() >= deadline:
                raise CheckFailed(f"bookie {bid}'s scrub not done after {max_wait:g} s (it goes on: "
                                  f"`bookstream bookies info {bid}` shows its progress)")
            try:   # (progress only: a bookie paused or restarting answers later, its ask kept)
                i = adm.run(_info(address, adm.timeout))
            except Exception as e:
                click.echo(f"scrub of {bid}: no answer from the bookie ({type(e).__name__}); waiting", err=True)
                continue
            if i.scrub_pass_entries:
                click.echo(f"scrub of {bid}: {i.scrub_pass_checked:,} of {i.scrub_pass_entries:,} entries "
                           f"({100 * i.scrub_pass_checked // i.scrub_pass_entries} %)", err=True)
        i = adm.run(_info(address, adm.timeout))
        rec |= {"served": True, "rotted_entries_found": i.scrub_rotted_entries - rec["rotted_entries_before"],
                "scrub_last_end": when_utc(i.scrub_last_end)}
        return Output(record=rec, title=f"scrub of bookie {bid}")


@admin_command(bookies, "sanity")
@click.argument("bookie")
@click.option("--entries", type=click.IntRange(1, 100_000), default=10, show_default=True)
def sanity(adm: Admin, bookie: str, entries: int) -> Output:
    """Write, read back and delete a test ledger on that bookie alone (E1 Qw1 Qa1)."""
    with adm.store() as store:
        bid, address, reg = find_bookie(adm, store, bookie)
    if bid is None:
        raise NotFound(f"{bookie!r} is not a registered bookie: sanity needs one the cluster can use")
    return Output(record=adm.run(_sanity(adm, bid, entries)), title=f"sanity of bookie {bid}")


async def _sanity(adm: Admin, bookie_id: str, n: int) -> dict:
    from metadata.ledgers import LedgerMetadata, LedgerMode
    from stream.ledger import LedgerHandle

    bk = adm.bk()
    step = "create"
    t0 = time.monotonic()
    ledger_id = None
    try:
        header = LedgerMetadata(1, 1, 1, mode=LedgerMode.CLASSIC, custom={"sanity": bookie_id})
        meta, rev = await bk.meta_call(bk.ledgers.create, header, (bookie_id,))
        ledger_id = meta.ledger_id
        lh = LedgerHandle(bk, meta, rev, writable=True, placement=bk.placement)
        step = "write"
        sent = [b"sanity-%d-%d" % (ledger_id, i) for i in range(n)]
        for p in sent:
            await lh.add_entry(p)
        await lh.close()
        written = time.monotonic()
        step = "read"
        rh = await bk.open_ledger(ledger_id, recovery=False)
        got = [e.payload for e in await rh.read_entries(0, n - 1)]
        if got != sent:
            raise CheckFailed(f"bookie {bookie_id}: read back {len(got)} entries that differ from those written")
        read = time.monotonic()
        step = "delete"
        await bk.delete_ledger(ledger_id)
        ledger_id = None
        done = time.monotonic()
        return {"bookie_id": bookie_id, "ok": True, "ledger_entries": n,
                "write_ms": round((written - t0) * 1000, 1), "read_ms": round((read - written) * 1000, 1),
                "delete_ms": round((done - read) * 1000, 1)}
    except CheckFailed:
        raise
    except Exception as e:
        raise CheckFailed(f"sanity of bookie {bookie_id} failed at {step}: {type(e).__name__}: "
                          f"{' '.join(str(e).split())}") from None
    finally:
        if ledger_id is not None:
            try:
                await bk.delete_ledger(ledger_id)
            except Exception:
                pass
        await bk.close()


@bookies.group("cookie")
def cookie() -> None:
    """A bookie's cookie in etcd: which data dir and cluster its id belongs
    to, compared with the data dir's at every start (bookie/cookie.py)."""


def _cookie_record(c) -> dict:
    return {"bookie_id": c.bookie_id, "cluster_id": c.cluster_id, "dir_id": c.dir_id,
            "stamped": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.created_ms / 1000)) if c.created_ms else None,
            # a lost disk's rejoin: ledgers below this revision take no normal add there (bookie/core.py)
            "rejoined_at_revision": c.rejoined_at or None, "released": c.released}


@admin_command(cookie, "show")
@click.argument("bookie_id")
def cookie_show(adm: Admin, bookie_id: str) -> Output:
    """etcd's cookie for BOOKIE_ID, whether a bookie is registered under the
    id, and how many ledgers name it (what a lost disk's rejoin, and
    `cookie delete`, wait for)."""
    from bookie.cookie import holds_id, read_etcd

    with adm.store() as store:
        c = read_etcd(store, adm.cluster, bookie_id)
        if c is None:
            raise NotFound(f"no cookie for bookie {bookie_id!r} in cluster {adm.cluster!r}")
        registered, named = holds_id(store, adm.cluster, bookie_id)
    return Output(record={**_cookie_record(c), "registered": registered, "ledgers_naming_it": len(named)},
                  title=f"cookie of bookie {bookie_id}")


@admin_command(cookie, "delete")
@click.argument("bookie_id")
@click.option("--force", is_flag=True,
              help="release it though ledgers still name the bookie: their entries on it are then replicas "
                   "in name only, until autorecovery's full check finds it damaged")
def cookie_delete(adm: Admin, bookie_id: str, force: bool) -> Output:
    """Releases BOOKIE_ID's id: etcd's cookie is replaced by a mark that no
    data dir holds it, so that a bookie whose data was lost can start again
    under its id, as a new bookie with an empty disk (a rejoin: the ledgers
    older than it take no normal add there, bookie/core.py).  Refused while
    it is registered (running), and while any ledger names it (run
    `bookstream recover BOOKIE_ID` first) unless --force."""
    from bookie.cookie import holds_id, read_etcd, release
    from metadata.errors import few

    with adm.store() as store:
        if read_etcd(store, adm.cluster, bookie_id) is None:
            raise NotFound(f"no cookie for bookie {bookie_id!r} in cluster {adm.cluster!r}")
        registered, named = holds_id(store, adm.cluster, bookie_id)
        if registered:
            raise AdminError(f"refused: bookie {bookie_id!r} is registered (running); stop it first")
        if named and not force:
            raise AdminError(f"refused: {len(named)} ledger(s) still name bookie {bookie_id!r} ({few(named)}); "
                             f"run `bookstream recover {bookie_id}` first, or give --force")
        release(store, adm.cluster, bookie_id)
    return Output(record={"bookie_id": bookie_id, "released": True, "ledgers_naming_it": len(named)},
                  title=f"cookie of bookie {bookie_id}")


COMMANDS = [bookies]
