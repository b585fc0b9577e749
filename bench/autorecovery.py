"""``bookstream autorecovery bench``: the re-replication rate of a lost
bookie's data, beside the disk's sequential read + write ceiling measured in
the same run.

1. A local etcd and 3 bookies (fsync on); ``--mb`` MB written as closed
   classic ledgers E3 Qw3 Qa2 of ``--entry-size`` entries, so each bookie
   holds all of it.  A 4th bookie starts (the only possible target).
2. One bookie is killed (kill -9); the page cache of every bookie's files is
   dropped (``posix_fadvise(DONTNEED)``), so the copy reads the disk.
3. Manual recovery of the killed bookie (the worker's code path:
   ``recover_ledger_fragments``), timed: MB/s and entries/s.
4. The ceiling, on the same disk: a file of the same size written and
   synced, dropped from the cache, then copied 1 MiB at a time with an
   fdatasync per MiB (what a copy frame costs the target at least).

The report gives the rate, the ceiling and their ratio; ``--out`` writes it
as JSON.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

CHUNK = 1 << 20


def drop_cache(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def disk_ceiling(directory: Path, nbytes: int) -> dict:
    """Sequential read + write of ``nbytes`` on ``directory``'s disk: copy a
    file 1 MiB at a time, fdatasync per MiB, the source not in the cache."""
    src, dst = directory / "ceiling.src", directory / "ceiling.dst"
    block = os.urandom(CHUNK)
    with open(src, "wb", buffering=0) as f:
        for _ in range(nbytes // CHUNK):
            f.write(block)
        os.fdatasync(f.fileno())
    drop_cache(directory)
    t0 = time.perf_counter()
    with open(src, "rb", buffering=0) as r, open(dst, "wb", buffering=0) as w:
        while True:
            b = r.read(CHUNK)
            if not b:
                break
            w.write(b)
            os.fdatasync(w.fileno())
    dt = time.perf_counter() - t0
    src.unlink()
    dst.unlink()
    return {"bytes": nbytes, "seconds": round(dt, 3), "mb_per_s": round(nbytes / 1e6 / dt, 1)}


async def _write(endpoint: str, cluster: str, mb: int, entry_size: int) -> tuple[int, int]:
    from stream.client import BookKeeperClient
    bk = BookKeeperClient(endpoint, cluster)
    payload = os.urandom(entry_size)
    total = mb * 1_000_000 // entry_size
    per_ledger = max(1, (256 << 20) // entry_size)
    written = 0
    try:
        while written < total:
            lh = await bk.create_ledger(3, 3, 2)
            n = min(per_ledger, total - written)
            batch = max(1, (4 << 20) // entry_size)
            for k in range(0, n, batch):
                await lh.add_entries([payload] * min(batch, n - k))
            await lh.close()
            written += n
    finally:
        await bk.close()
    return written, written * entry_size


def run_bench(mb: int = 1024, entry_size: int = 64 << 10, directory: str | None = None,
              keep: bool = False) -> dict:
    from bookstream.processes import BookieProcess
    from bookstream.recovery_cli import recover_bookie
    from metadata.etcd_server import ManagedEtcd

    base = Path(tempfile.mkdtemp(prefix="rerepl-", dir=directory))
    etcd = ManagedEtcd(base / "etcd").start()
    cluster = "bench"
    procs = []
    try:
        for i in range(3):
            procs.append(BookieProcess(base / f"b{i}", etcd=etcd.endpoint, cluster=cluster,
                                       extra_args=["--registration-ttl", "3"]).start())
        t0 = time.perf_counter()
        entries, nbytes = asyncio.run(_write(etcd.endpoint, cluster, mb, entry_size))
        write_s = time.perf_counter() - t0
        procs.append(BookieProcess(base / "b3", etcd=etcd.endpoint, cluster=cluster,
                                   extra_args=["--registration-ttl", "3"]).start())
        victim = procs[0]
        victim.kill()
        drop_cache(base)
        summary = asyncio.run(recover_bookie(etcd.endpoint, cluster, victim.bookie_id, to=None, dry_run=False,
                                             seal_open=False, show_progress=False))
        ceiling = disk_ceiling(base, nbytes)
        rate = summary["mb_per_s"]
        return {
            "parameters": {"mb": mb, "entry_size": entry_size, "ledgers": "E3 Qw3 Qa2, closed",
                           "bookies": "3 + 1 target, fsync on", "dir": str(base)},
            "written": {"entries": entries, "bytes": nbytes, "seconds": round(write_s, 2)},
            "rereplication": {k: summary[k] for k in ("fragments_replaced", "entries_copied", "bytes_copied",
                                                       "seconds", "mb_per_s", "entries_per_s")},
            "left": summary["left"], "unrecoverable": summary["unrecoverable"],
            "ceiling": ceiling,
            "ratio": round(rate / ceiling["mb_per_s"], 3) if ceiling["mb_per_s"] else None,
        }
    finally:
        for p in procs:
            p.kill()
        etcd.stop()
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


def report(r: dict) -> str:
    rr, c = r["rereplication"], r["ceiling"]
    return (f"re-replication of {rr['bytes_copied'] / 1e6:,.0f} MB ({rr['entries_copied']:,} entries, "
            f"{rr['fragments_replaced']} fragments): {rr['seconds']} s = {rr['mb_per_s']} MB/s, "
            f"{rr['entries_per_s']:,} entries/s\n"
            f"disk ceiling (read + write, fdatasync per MiB, same disk, same run): {c['mb_per_s']} MB/s\n"
            f"ratio: {r['ratio']}")


def write_json(r: dict, out: str) -> None:
    Path(out).write_text(json.dumps(r, indent=2) + "\n")


__all__ = ["run_bench", "disk_ceiling", "report", "write_json"]
