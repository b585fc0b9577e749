"""``bookstream autorecovery bench``: the re-replication rate of a lost
bookie's data, beside the disk's sequential read + write ceiling measured in
the same run.

1. A local etcd and 3 bookies (fsync on); ``--mb`` MB written as closed
   classic ledgers E3 Qw3 Qa2 of ``--entry-size`` entries, so each bookie
   holds all of it.  A 4th bookie starts (the only possible target).
2. One bookie is killed (kill -9); the page cache of every bookie's files is
   dropped (``posix_fadvise(DONTNEED)``), so the copy reads the disk.
3. Manual recovery of the killed bookie (``bookstream recover``, a process
   of its own: the worker's code path, ``recover_ledger_fragments``), timed
   by itself: MB/s and entries/s; with ``--rate-mb R``, at most R MiB/s
   (``worker_core.Pace``), and the rate it kept ÷ R.
4. With ``--writer-rate N``: what the copy does to a writer on the same
   bookies (the two sources and the target).  An open loop of 1 KiB appends
   at N/s to an E3 Qw3 stream for ``--writer-seconds``, alone once the killed
   bookie's registration is gone, then beside the recovery, started with it;
   its p99 beside ÷ alone, and how much of the loop the copy lasted
   (``overlap``: a copy shorter than the loop dilutes the figure).
5. The ceiling, on the same disk: a file of the same size written and
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 1 << 20
MB = 1 << 20


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
              keep: bool = False, rate_mb: float = 0.0, writer_rate: float = 0.0,
              writer_seconds: float = 5.0) -> dict:
    from bookstream.processes import BookieProcess
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
        if writer_rate:
            asyncio.run(_unregistered(etcd.endpoint, cluster, victim.bookie_id))
        summary, writer = asyncio.run(_recover(base, etcd.endpoint, cluster, victim.bookie_id, rate_mb,
                                               writer_rate, writer_seconds))
        ceiling = disk_ceiling(base, nbytes)
        rate = summary["mb_per_s"]
        rr = {k: summary[k] for k in ("fragments_replaced", "entries_copied", "bytes_copied",
                                      "seconds", "mb_per_s", "entries_per_s")}
        if rate_mb:
            rr["rate_limit_mb"] = rate_mb
            rr["vs_limit"] = round(summary["bytes_copied"] / MB / summary["seconds"] / rate_mb, 3)
        return {
            "parameters": {"mb": mb, "entry_size": entry_size, "ledgers": "E3 Qw3 Qa2, closed",
                           "bookies": "3 + 1 target, fsync on", "dir": str(base), "rate_mb": rate_mb,
                           "writer_rate": writer_rate, "writer_seconds": writer_seconds},
            "written": {"entries": entries, "bytes": nbytes, "seconds": round(write_s, 2)},
            "rereplication": rr,
            "left": summary["left"], "unrecoverable": summary["unrecoverable"],
            "ceiling": ceiling,
            "ratio": round(rate / ceiling["mb_per_s"], 3) if ceiling["mb_per_s"] else None,
            "writer": writer,
        }
    finally:
        for p in procs:
            p.kill()
        etcd.stop()
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


async def _unregistered(endpoint: str, cluster: str, bookie: str) -> None:
    """Until ``bookie``'s registration is gone (its lease expired), so the
    writer's ensemble is made of the live bookies."""
    from stream.client import BookKeeperClient

    bk = BookKeeperClient(endpoint, cluster)
    try:
        while any(r.bookie_id == bookie for r in bk.registry.list_bookies(False)):
            await asyncio.sleep(0.2)
    finally:
        await bk.close()


async def _recover(base: Path, endpoint: str, cluster: str, bookie: str, rate_mb: float, writer_rate: float,
                   writer_seconds: float) -> tuple[dict, dict | None]:
    """Step 3 (and 4) of the module doc: (recover's summary, the writer's figures)."""
    from bench import single
    from stream.stream import AsyncStreamClient

    cmd = [sys.executable, "-m", "bookstream.cli", "recover", bookie, "--rate-mb", str(rate_mb),
           "--format", "json", "--etcd", endpoint, "--cluster", cluster]
    async with AsyncStreamClient(endpoint, cluster) as sc:
        alone = None
        if writer_rate:
            alone = await single.stream_open_loop(sc, "writer-alone", 1024, writer_seconds, writer_rate)
        drop_cache(base)
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
        beside = None
        if writer_rate:
            beside = await single.stream_open_loop(sc, "writer-beside", 1024, writer_seconds, writer_rate)
        out, _ = await proc.communicate()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"recover exited {proc.returncode}")
    summary = json.loads(out)
    if not writer_rate:
        return summary, None
    return summary, {"alone": alone, "beside": beside,
                     "p99_ratio": round(beside["p99_ms"] / alone["p99_ms"], 3) if alone["p99_ms"] else None,
                     "overlap": round(min(1.0, summary["seconds"] / writer_seconds), 3)}


def report(r: dict) -> str:
    rr, c = r["rereplication"], r["ceiling"]
    return (f"re-replication of {rr['bytes_copied'] / 1e6:,.0f} MB ({rr['entries_copied']:,} entries, "
            f"{rr['fragments_replaced']} fragments): {rr['seconds']} s = {rr['mb_per_s']} MB/s, "
            f"{rr['entries_per_s']:,} entries/s\n"
            f"disk ceiling (read + write, fdatasync per MiB, same disk, same run): {c['mb_per_s']} MB/s\n"
            f"ratio: {r['ratio']}"
            + (f"\nrate limit {rr['rate_limit_mb']:g} MiB/s: kept {rr['vs_limit']} of it" if "vs_limit" in rr else "")
            + (_writer_lines(r["writer"]) if r.get("writer") else ""))


def _writer_lines(w: dict) -> str:
    from bench import single

    return (f"\nwriter alone: {single.open_loop_line(w['alone'])}"
            f"\nwriter beside the copy: {single.open_loop_line(w['beside'])}"
            f"\np99 beside ÷ alone: {w['p99_ratio']} (the copy lasted {w['overlap']:.0%} of the loop)")


def write_json(r: dict, out: str) -> None:
    Path(out).write_text(json.dumps(r, indent=2) + "\n")


__all__ = ["run_bench", "disk_ceiling", "report", "write_json"]
