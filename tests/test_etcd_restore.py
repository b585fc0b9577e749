"""etcd restored from a snapshot, for real (``etcdctl snapshot save``,
``etcdutl snapshot restore``): its revisions go back to the snapshot's,
while a bookie holds ledgers created since, whose ids are the revisions
that created them.  The bookie refuses to start on it (new ledgers would
reuse ids it holds state for), and its ledger GC refuses to delete what
the restored etcd no longer lists (bookie/cookie.py ``check_revision``)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from bookie.cookie import CookieGuard, read_local
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


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(etcd_binary()), name)


def test_a_bookie_refuses_an_etcd_restored_from_a_snapshot_without_a_bump(tmp_path, cluster):
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
        etcd.stop()
        ports = json.loads(etcd.ports_path.read_text())
        purl = f"http://{etcd.host}:{ports['peer_port']}"
        shutil.rmtree(etcd.etcd_data_dir)
        subprocess.run([_tool("etcdutl"), "snapshot", "restore", str(snap), "--data-dir", str(etcd.etcd_data_dir),
                        "--name", etcd.name, "--initial-cluster", f"{etcd.name}={purl}",
                        "--initial-advertise-peer-urls", purl, "--initial-cluster-token", f"bookstream-{etcd.name}"],
                       check=True, capture_output=True)
        etcd.start()
        with MetadataStore([etcd.endpoint]) as store:
            revision = store.read([Get(KeyLayout(cluster).cluster_key())])[1]
            assert revision < lid                     # (the restore went back in time)
            cookie = read_local(b.data_dir, b.bookie_id)
            assert CookieGuard(store, cluster, cookie).revision() == revision   # (the same cluster, its cookie)
            # The ledger GC's pass over the bookie's own storage: refused, nothing deleted
            # (before: the ledger absent from the restored listing, and deleted).
            storage = Storage(b.data_dir)
            storage.open()
            try:
                with pytest.raises(InvalidCookie, match="went back in time"):
                    run(collect_deleted_ledgers(storage, LedgerStore(store, cluster),
                                                CookieGuard(store, cluster, cookie)))
                assert storage.core.ledgers[lid].index.get(9) is not None
            finally:
                storage.close()
        with pytest.raises(BookieStartError, match="exited with 3"):
            b.start()
        assert f"etcd's revision {revision} is below {lid}" in b.log_path.read_text()
    finally:
        if b is not None:
            b.kill()
        etcd.stop()
