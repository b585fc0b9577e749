"""etcd restored from a snapshot, for real (``etcdctl snapshot save``,
``etcdutl snapshot restore``): its revisions go back to the snapshot's.
A bookie that read a later revision before (noted in its data dir) refuses
to start on it; running, it halts (read-only for good, recorded in its
data dir), whether its etcd check or a GC pass finds it; a ledger whose id
is above the listing's revision is never deleted by the ledger GC
A restore the revisions do not show is seen by the bookie's mark
(bookie/cookie.py ``check_revision``, ``check_mark``, ``halt``,
bookie/ledger_gc.py)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess

import pytest

from bookie.cookie import HALT_FILE, CookieGuard, halted, note_revision, noted_mark, read_local, seen_revision
from bookie.ledger_gc import collect_deleted_ledgers
from bookie.storage import Storage
from bookstream.processes import BookieProcess, BookieStartError
from metadata.errors import InvalidCookie
from metadata.etcd_server import ManagedEtcd, etcd_binary
from metadata.layout import KeyLayout
from metadata.ledgers import LedgerStore
from metadata.store import MetadataStore
from metadata.txn import Get
from stream.client import BookKeeperClient
from tests.conftest import run
from tests.test_admin_http import get
from tests.test_cookie import _refused
from tests.test_recovery_cli import CLI


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(etcd_binary()), name)


def _restore(etcd: ManagedEtcd, snap) -> None:
    """etcd stopped, its data replaced by the snapshot's, started again on its ports."""
    etcd.stop()
    ports = json.loads(etcd.ports_path.read_text())
    purl = f"http://{etcd.host}:{ports['peer_port']}"
    shutil.rmtree(etcd.etcd_data_dir)
    subprocess.run([_tool("etcdutl"), "snapshot", "restore", str(snap), "--data-dir", str(etcd.etcd_data_dir),
                    "--name", etcd.name, "--initial-cluster", f"{etcd.name}={purl}",
                    "--initial-advertise-peer-urls", purl, "--initial-cluster-token", f"bookstream-{etcd.name}"],
                   check=True, capture_output=True)
    etcd.start()


def _gc_pass(b: BookieProcess, store, cluster: str):
    """The bookie's ledger GC pass over its own storage (the bookie stopped)."""
    storage = Storage(b.data_dir)
    storage.open()
    try:
        guard = CookieGuard(store, cluster, read_local(b.data_dir, b.bookie_id), b.data_dir)
        return run(collect_deleted_ledgers(storage, LedgerStore(store, cluster), guard)), storage.core.ledgers
    finally:
        storage.close()


@contextlib.contextmanager
def _snapshot_then_a_ledger(tmp_path, cluster):
    """etcd and one bookie; a snapshot of etcd; then a ledger of 10 entries
    on the bookie, which is killed: (etcd, the bookie, the snapshot, the
    ledger's id).  Both stopped at the end."""
    etcd = ManagedEtcd(tmp_path / "e").start()
    b = None
    try:
        b = BookieProcess(tmp_path / "b0", etcd=etcd.endpoint, cluster=cluster,
                          extra_args=["--registration-ttl", "2"]).start()
        snap = tmp_path / "snap.db"
        subprocess.run([_tool("etcdctl"), "--endpoints", etcd.endpoint, "snapshot", "save", str(snap)],
                       check=True, capture_output=True)

        async def write():
            async with BookKeeperClient(etcd.endpoint, cluster) as bk:
                lh = await bk.create_ledger(1, 1, 1)
                await lh.add_entries([b"after the snapshot %d" % i for i in range(10)])
                await lh.close()
                return lh.ledger_id
        lid = run(write())
        b.kill()
        yield etcd, b, snap, lid
    finally:
        if b is not None:
            b.kill()
        etcd.stop()


def test_a_bookie_refuses_an_etcd_restored_from_a_snapshot_without_a_bump(tmp_path, cluster):
    with _snapshot_then_a_ledger(tmp_path, cluster) as (etcd, b, snap, lid):
        b.start()            # (a start notes the revision it read: above the ledger's id)
        b.kill()
        seen = seen_revision(b.data_dir)
        assert seen > lid
        _restore(etcd, snap)
        with MetadataStore([etcd.endpoint]) as store:
            revision = store.read([Get(KeyLayout(cluster).cluster_key())])[1]
            assert revision < lid                     # (the restore went back in time)
            with pytest.raises(InvalidCookie, match="went back in time"):
                _gc_pass(b, store, cluster)           # refused: nothing deleted
        with pytest.raises(BookieStartError, match="exited with 3"):
            b.start()
        assert f"etcd's revision {revision} is below {seen}" in b.log_path.read_text()
        assert f"etcd's revision {revision} is below {seen}" in halted(b.data_dir)   # (recorded: see below)


def test_the_ledger_gc_keeps_a_ledger_above_the_listings_revision(tmp_path, cluster):
    """The bookie has seen nothing after the snapshot (no start, no GC pass
    since): its check cannot tell.  The ledger created since, absent from
    the restored listing, has an id above the listing's revision: no
    listing says it was deleted, and the GC keeps it (before: deleted)."""
    with _snapshot_then_a_ledger(tmp_path, cluster) as (etcd, b, snap, lid):
        _restore(etcd, snap)
        with MetadataStore([etcd.endpoint]) as store:
            done, held = _gc_pass(b, store, cluster)
        assert done["kept_above_revision"] == 1 and done["ledgers_deleted"] == [] and lid in held
        b.start()          # (what it read is not below what it noted: it serves)


def test_a_running_bookie_turns_read_only_when_its_etcd_goes_back_in_time(tmp_path, cluster):
    """Restored under a running bookie (its check every 0.3 s): it turns
    read-only for good (normal adds and prepares refused, a new ledger's
    id reused or not; reads go on), saying why; a recovery add (a copy)
    is still taken."""
    from bookie import entry as E
    from bookie.core import Status
    from stream.bookie_client import BookieClient
    from tests.test_autorecovery import until

    with _snapshot_then_a_ledger(tmp_path, cluster) as (etcd, b, snap, lid):
        b.extra_args += ["--etcd-check-interval", "0.3", "--admin-port", "0"]
        b.start()
        _restore(etcd, snap)

        async def says_so():   # (the record, which the log line follows)
            return halted(b.data_dir) is not None and "read-only for good" in b.log_path.read_text()
        run(until(says_so, what="the bookie halting"))
        assert "went back in time" in b.log_path.read_text()
        code, body = get(b.admin_address, "/ready")     # (why, where an operator looks)
        reason = json.loads(body)["reason"]
        assert code == 503 and reason.startswith("halted, read-only for good: ") and "went back in time" in reason
        metrics = get(b.admin_address, "/metrics")[1].decode()
        assert f'bookstream_bookie_halted{{bookie_id="{b.bookie_id}"}} 1.0' in metrics
        assert "went back in time" in json.loads(get(b.admin_address, "/info")[1])["halted"]

        def listed():   # (its registration says so: `bookies list`, cluster-wide)
            p = subprocess.run(CLI + ["bookies", "list", "--readonly", "--etcd", etcd.endpoint, "--cluster", cluster,
                                      "--format", "json"], capture_output=True, text=True, timeout=60)
            rows = json.loads(p.stdout) if p.returncode == 0 else []
            return [(r["state"], "went back in time" in (r["halted"] or "")) for r in rows]

        async def registered_halted():
            return listed() == [("halted", True)]
        run(until(registered_halted, what="the registration saying halted"))

        async def probe():
            c = BookieClient(b.address)
            try:
                add = await c.add(E.encode(lid + 1, 0, b"new", term=0))
                copy = await c.add(E.encode(lid + 2, 0, b"copy", term=0, req_flags=E.REQ_RECOVERY))
                prep = await c.prepare(lid + 3, 0, 1)
                read = await c.read_entry(lid, 9)
                def status(ack):
                    return Status(ack.errors[0].status if ack.errors else ack.status)
                return status(add), status(copy), Status(prep.status), Status(read.status)
            finally:
                await c.close()
        assert run(probe()) == (Status.READ_ONLY, Status.OK, Status.READ_ONLY, Status.OK)

        # Recorded: once etcd's revision has grown past what the bookie noted
        # (as a restored etcd's soon does), its start would pass the revision
        # check; the recorded halt refuses it, until an operator removes it.
        assert "went back in time" in halted(b.data_dir)
        b.kill()
        seen = seen_revision(b.data_dir)
        with MetadataStore([etcd.endpoint]) as store:
            while store.put(f"/grow-{cluster}", b"x") <= seen:
                pass
        _refused(b, "it stopped trusting its etcd")
        (b.data_dir / HALT_FILE).unlink()
        b.start()


def test_a_restore_the_revisions_do_not_show_is_seen_by_the_bookies_mark(tmp_path, cluster):
    """A restore whose revisions are at or above everything a bookie read
    (restored with --bump-revision, or without it once etcd's revision has
    grown past the bookie's note while it was down; grown here by writes,
    which is what the bump does to the checks): the revision check passes.
    The bookie's mark, raised by its etcd check after the snapshot, is
    below its note in the restored etcd: its start is refused, recorded."""
    from tests.test_autorecovery import until

    etcd = ManagedEtcd(tmp_path / "e").start()
    b = BookieProcess(tmp_path / "b0", etcd=etcd.endpoint, cluster=cluster,
                      extra_args=["--registration-ttl", "2", "--etcd-check-interval", "0.2"])
    try:
        b.start()

        async def marked(n):
            return noted_mark(b.data_dir) >= n
        run(until(lambda: marked(1), what="a first mark"))
        snap = tmp_path / "snap.db"
        subprocess.run([_tool("etcdctl"), "--endpoints", etcd.endpoint, "snapshot", "save", str(snap)],
                       check=True, capture_output=True)
        after = noted_mark(b.data_dir) + 2   # (the snapshot holds at most the note then, plus one in flight)
        run(until(lambda: marked(after), what="a mark after the snapshot"))
        b.kill()
        seen = seen_revision(b.data_dir)
        _restore(etcd, snap)
        with MetadataStore([etcd.endpoint]) as store:
            while store.put(f"/grow-{cluster}", b"x") <= seen:
                pass
            pages, _ = store.read([Get(KeyLayout(cluster).mark_key(b.bookie_id))])
            assert int(pages[0].items[0][1].value) < noted_mark(b.data_dir)
        _refused(b, "etcd lost acknowledged writes")
        assert "below" in halted(b.data_dir) and "lost acknowledged writes" in halted(b.data_dir)
    finally:
        b.kill()
        etcd.stop()


@pytest.mark.parametrize("gc", ["ledger", "over-replicated"])
def test_a_gc_pass_finding_its_etcd_gone_back_halts_the_bookie(tmp_path, cluster, gc):
    """The bookie's etcd check off: the GC pass that finds etcd gone back
    in time halts the bookie as the check would (one reaction to one
    finding): normal adds refused, the halt recorded, nothing deleted.
    The over-replicated GC checks at its pass's start (a restored etcd's
    older fragments may not name this bookie where a copy since made it a
    holder)."""
    from bookie import entry as E
    from bookie.core import Status
    from stream.bookie_client import BookieClient
    from tests.test_autorecovery import until

    with _snapshot_then_a_ledger(tmp_path, cluster) as (etcd, b, snap, lid):
        passes = {"ledger": ["--ledger-gc-interval", "0.3", "--over-replicated-gc-interval", "0"],
                  "over-replicated": ["--ledger-gc-interval", "0", "--over-replicated-gc-interval", "0.3"]}
        b.extra_args += ["--etcd-check-interval", "0", *passes[gc]]
        b.start()             # (notes a revision above the snapshot's)
        _restore(etcd, snap)

        async def says_so():   # (its last line: the halt is recorded, then said, then the pass's refusal)
            return f"{gc} gc refused" in b.log_path.read_text()
        run(until(says_so, what=f"the {gc} gc pass halting the bookie"))
        assert "read-only for good" in b.log_path.read_text() and "went back in time" in halted(b.data_dir)

        async def probe():
            c = BookieClient(b.address)
            try:
                add = await c.add(E.encode(lid + 1, 0, b"new", term=0))
                return (Status(add.errors[0].status if add.errors else add.status),
                        [Status((await c.read_entry(lid, e)).status) for e in range(10)])
            finally:
                await c.close()
        assert run(probe()) == (Status.READ_ONLY, [Status.OK] * 10)


def test_the_noted_revision_only_rises(tmp_path):
    assert seen_revision(tmp_path) == 0
    note_revision(tmp_path, 50)
    note_revision(tmp_path, 20)           # (an older read, after a newer one: kept at 50)
    assert seen_revision(tmp_path) == 50
    (tmp_path / "etcd.revision").write_bytes(b"\xff")
    assert seen_revision(tmp_path) == 0   # (unreadable: a warning, no check; the next note rewrites it)
    note_revision(tmp_path, 60)
    assert seen_revision(tmp_path) == 60
