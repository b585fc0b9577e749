"""The real cluster the nemesis hurts: etcd, bookie processes behind proxies,
and writer and reader processes (tests/fault/worker.py).

Every fault here is done to a real OS process or its real files:

- kill -9 and restart (bookies, etcd, writers, readers); SIGSTOP / SIGCONT;
- partitions of client<->bookie links, by the bookie's proxy
  (tests/fault/proxy.py): blackhole or cut, for every client or for chosen
  client processes;
- a full disk: one bookie's data dir is a small tmpfs (mounted here, as
  root), filled up with a file and freed again;
- a torn journal tail: the bookie is killed -9 and its newest journal
  segment gets a record cut short appended (what a crash in the middle of a
  write leaves: bytes never fsynced, so never acknowledged), found and cut
  off by the bookie on restart;
- a slow disk: every fsync of the bookie first sleeps what a file says
  (``slow_disk.c``, loaded with LD_PRELOAD; built with the machine's cc);
- a lost disk: the bookie is killed -9 and its data dir emptied; it starts
  again as a new bookie (a new id), and what the old one held is
  autorecovery's to bring back (``bookstream autorecovery run`` processes,
  killed and paused too);
- a rotted entry: one bit of an entry's payload flipped in a journal
  segment of a running bookie, where the bytes were durable (an older
  segment, or before a mark of the newest): its scrub or a read must find
  it and autorecovery copy it back; a start after a kill that came before
  the finding (which checkpoints past the rot) is refused (the data dir is
  damaged) and, with ``lost_disk_rejoin``, walks back as a lost disk.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bookie import entry as E
from bookie.journal import segment_name
from bookie.journal_record import R_ENTRIES, R_MARK, frame_record, record_at
from bookstream.processes import AutorecoveryProcess, BookieProcess, BookieStartError, ServedProcess
from metadata.etcd_server import ManagedEtcd
from tests.fault.proxy import BookieProxy, ProxyLoop, _free_port
from tests.fault.worker import WORKER_READY

log = logging.getLogger(__name__)

TMPFS_BYTES = 48 << 20
REJOIN_TIMEOUT = 100.0       # a lost disk's rejoin under its old id (below heal_all's 120 s wait for a restart)
TMPFS_SEGMENT = 4 << 20      # journal segments of the tmpfs bookie (so several fit)


class Bookie:
    """One bookie slot: its process, its proxies, its state in the nemesis's eyes."""

    def __init__(self, index: int, proc: BookieProcess, proxy: BookieProxy, tmpfs: bool,
                 etcd_proxy: BookieProxy, read_proxy: BookieProxy):
        self.index, self.proc, self.proxy, self.tmpfs = index, proc, proxy, tmpfs
        self.read_proxy = read_proxy  # in front of its read port (bookie/read_port.py): partitioned with proxy
        self.etcd_proxy = etcd_proxy  # this bookie's only way to etcd: partitions it from etcd alone
        self.slow_path: Path | None = None   # its fsyncs' delay (µs) while this file exists (slow_disk.c)
        self.state = "up"   # up / killed / stopped / damaged (a start refused after a rot)
        self.filler: Path | None = None
        self.wiped_id: str | None = None      # the id of the data it lost (wipe_bookie), until restarted
        self.old_id: list[str] = []           # how its starts under that id ended (start_wiped_bookie)
        self.rotted: list[dict] = []          # the entries rot_entry flipped a bit of (ledger, entry, where)

    @property
    def data_dir(self) -> Path:
        return self.proc.data_dir


class Signalled:
    """A child process the nemesis signals by name: its pid while it runs
    (None once dead), and kill -9 that first wakes a stopped process."""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive() else None

    def signal(self, sig: int) -> None:
        if self.pid is not None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        super().kill()


class Worker(Signalled, ServedProcess):
    """A writer or reader process (tests/fault/worker.py); each start is a
    new incarnation, with its own history file.  ``start`` returns once the
    process says it is ready (its signal handlers are installed: a SIGUSR1
    before that would kill it)."""

    merge_stderr = True

    def __init__(self, cluster: "FaultCluster", name: str, role: str, extra: list[str]):
        super().__init__(cluster.dir)
        self.cluster, self.name, self.role, self.extra = cluster, name, role, extra
        self.incarnation = 0
        self.state = "down"

    @property
    def log_path(self) -> Path:
        return self.cluster.dir / f"{self.name}.log"

    def describe(self) -> str:
        return f"{self.role} {self.name}.{self.incarnation}"

    def history_path(self, inc: int) -> Path:
        return self.cluster.dir / "history" / f"{self.name}.{inc}.jsonl"

    def command(self) -> list[str]:
        c = self.cluster
        return [sys.executable, str(Path(__file__).with_name("worker.py")), self.role, "--etcd", c.etcd.endpoint,
                "--cluster", c.name, "--name", self.name, "--incarnation", str(self.incarnation),
                "--history", str(self.history_path(self.incarnation)),
                "--seed", str(c.seed * 1000 + self.incarnation), *self.extra]

    def start(self, timeout: float = 60.0) -> "Worker":
        self.incarnation += 1
        self.history_path(self.incarnation).parent.mkdir(parents=True, exist_ok=True)
        self.spawn()
        self.wait_for_line(lambda line: line.startswith(WORKER_READY), timeout)
        self.start_draining()
        self.state = "up"
        return self

    def kill(self) -> None:
        super().kill()
        self.state = "down"


class Recoverer(Signalled, AutorecoveryProcess):
    """An auditor candidate + replication worker process, by name."""

    def __init__(self, cluster: "FaultCluster", name: str, extra: list[str]):
        super().__init__(cluster.dir / name, etcd=cluster.etcd.endpoint, cluster=cluster.name, extra_args=extra)
        self.name = name


class FaultCluster:
    def __init__(self, base: Path, *, seed: int, bookies: int = 5, ttl: int = 3, tmpfs_bookie: int | None = 0,
                 name: str | None = None, slow_disks: bool = False, lost_disk_rejoin: bool = False):
        self.dir = Path(base)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.name = name or f"faults-{seed}-{os.getpid()}"
        self.ttl = ttl
        self.ploop = ProxyLoop()
        self.etcd = ManagedEtcd(self.dir / "etcd")
        self.etcd_state = "down"
        self.bookies: list[Bookie] = []
        self.workers: list[Worker] = []
        self.recoverers: list[Recoverer] = []
        self.n_bookies = bookies
        self.tmpfs_bookie = tmpfs_bookie
        self.mounts: list[Path] = []
        self.slow_disks = slow_disks
        self.lost_disk_rejoin = lost_disk_rejoin

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> "FaultCluster":
        self.etcd.start()
        self.etcd_state = "up"
        shim = self._build_slow_disk() if self.slow_disks else None
        slots = []
        for i in range(self.n_bookies):
            data = self.dir / f"b{i}"
            data.mkdir(parents=True, exist_ok=True)
            tmpfs = i == self.tmpfs_bookie and self._mount_tmpfs(data)
            port = _free_port()
            proxy = BookieProxy(self.ploop, port, self.client_pids)
            read_port = _free_port()
            read_proxy = BookieProxy(self.ploop, read_port, self.client_pids)
            etcd_proxy = BookieProxy(self.ploop, self.etcd.client_port, lambda: [])
            extra = ["--registration-ttl", str(self.ttl), "--advertise-address", proxy.address,
                     "--read-port", str(read_port), "--advertise-read-address", read_proxy.address,
                     "--disk-check-interval", "0.5",
                     # the ledger GCs (bookie/ledger_gc.py) every 2 s: under partitions, pauses and
                     # etcd outages they must never delete a ledger the metadata has, nor entries of
                     # a fragment that names the bookie (the final read and the replica audit would
                     # find it)
                     "--ledger-gc-interval", "2", "--over-replicated-gc-interval", "2",
                     # its etcd checked every second (bookie/server.py): outages and partitions of
                     # etcd must never halt it (no revision goes back here)
                     "--etcd-check-interval", "1",
                     # a scrub pass every 3 s (bookie/scrub.py): no fault here rots a record, so a
                     # rotted entry it reports is a false one (the report's anomaly `false_rot`)
                     "--scrub-interval", "3", "--scrub-rate-mb", "0"]
            if tmpfs:
                extra += ["--segment-size", str(TMPFS_SEGMENT), "--checkpoint-bytes", str(8 << 20),
                          "--gc-interval", "2"]
            proc = BookieProcess(data, port=port, etcd=etcd_proxy.address, cluster=self.name, extra_args=extra)
            slot = Bookie(i, proc, proxy, tmpfs, etcd_proxy, read_proxy)
            if shim is not None:
                slot.slow_path = self.dir / f"b{i}.slow-disk"
                proc.env = {"LD_PRELOAD": str(shim), "BOOKSTREAM_SLOW_DISK": str(slot.slow_path)}
            slots.append(slot)
        self.bookies = slots   # (before they start: a start that fails leaves close() the others to stop)
        with ThreadPoolExecutor(len(slots)) as ex:
            list(ex.map(lambda b: b.proc.start(), slots))
        return self

    def _build_slow_disk(self) -> Path | None:
        out = self.dir / "slow_disk.so"
        r = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(out), str(Path(__file__).with_name("slow_disk.c")),
                            "-ldl"], capture_output=True, text=True)
        if r.returncode != 0:
            log.warning("no slow-disk shim (%s): that fault is skipped", r.stderr.strip()[-300:])
            return None
        return out

    def _mount_tmpfs(self, path: Path) -> bool:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(path)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            log.warning("no tmpfs for the full-disk fault (%s): that fault is skipped", r.stderr.strip())
            return False
        self.mounts.append(path)
        return True

    def add_worker(self, name: str, role: str, extra: list[str]) -> Worker:
        w = Worker(self, name, role, extra)
        self.workers.append(w)
        return w

    def add_recoverer(self, name: str, extra: list[str]) -> Recoverer:
        r = Recoverer(self, name, extra)
        self.recoverers.append(r)
        return r

    def recoverer(self, name: str) -> Recoverer:
        return next(r for r in self.recoverers if r.name == name)

    def client_pids(self) -> list[int]:
        return [os.getpid()] + [w.pid for w in self.workers if w.pid is not None]

    def close(self) -> None:
        for w in [*self.workers, *self.recoverers]:
            w.kill()
        for b in self.bookies:
            try:
                if b.proc.alive():
                    os.kill(b.proc.pid, signal.SIGCONT)
            except (ProcessLookupError, AssertionError):
                pass
            b.proc.kill()
            b.proxy.close()
            b.read_proxy.close()
            b.etcd_proxy.close()
        try:
            if self.etcd_state == "stopped":
                os.kill(self.etcd.pid, signal.SIGCONT)
            self.etcd.kill()
        except Exception:
            pass
        self.ploop.close()
        for b in self.bookies:  # the tmpfs goes with its contents: keep the bookie's log
            if b.tmpfs and b.proc.log_path.exists():
                shutil.copy(b.proc.log_path, self.dir / f"b{b.index}.tmpfs-bookie.log")
        for m in self.mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
        self.mounts = []

    # -- bookie faults ----------------------------------------------------------------------

    def kill_bookie(self, i: int) -> None:
        b = self.bookies[i]
        if b.proc.alive():
            os.kill(b.proc.pid, signal.SIGCONT)
        b.proc.kill()
        b.state = "killed"

    def start_bookie(self, i: int, attempts: int = 3) -> bool:
        """Restarts a killed bookie (same id, port and data); a start that
        fails (a full disk, etcd away longer than --metadata-wait) is retried,
        then reported."""
        b = self.bookies[i]
        for _ in range(attempts):
            try:
                b.proc.start(timeout=60)
                b.state = "up"
                return True
            except BookieStartError as e:
                log.warning("bookie %d did not start: %s", i, str(e)[-300:])
                if b.rotted and "exited with 3" in str(e):   # its replay met the rot: refused, as it must be
                    b.state = "damaged"
                    for r in b.rotted:   # (down for good, or its data dir set aside by a rejoin)
                        r["gone"] = True
                    b.old_id.append("refused: damaged")
                    return self._rejoin(b) if self.lost_disk_rejoin else False
        return False

    def stop_bookie(self, i: int) -> None:
        b = self.bookies[i]
        os.kill(b.proc.pid, signal.SIGSTOP)
        b.state = "stopped"

    def cont_bookie(self, i: int) -> None:
        b = self.bookies[i]
        os.kill(b.proc.pid, signal.SIGCONT)
        b.state = "up"

    def tear_journal_tail(self, i: int, rng) -> dict:
        """After a kill -9: a record cut short at the end of the newest
        journal segment, as a crash in the middle of a write leaves it."""
        b = self.bookies[i]
        assert not b.proc.alive()
        jdir = b.data_dir / "journal"
        segs = sorted(jdir.glob("segment-*.log"))
        if not segs:
            return {"torn": 0}
        seg = segs[-1]
        assert seg.name == segment_name(int(seg.name.split("-")[1].split(".")[0]))
        body = rng.randbytes(rng.randint(64, 4096))
        record = frame_record(R_ENTRIES, body) + body
        torn = record[:rng.randint(1, len(record) - 1)]
        try:
            with open(seg, "ab") as f:
                f.write(torn)
        except OSError as e:  # a full tmpfs: the crash tore nothing
            return {"torn": 0, "error": str(e)}
        return {"torn": len(torn), "segment": seg.name}

    def wipe_bookie(self, i: int) -> dict:
        """After a kill -9: the bookie's data dir emptied (its log kept), as
        a disk lost for good; its next start is a new bookie with a new id."""
        b = self.bookies[i]
        assert not b.proc.alive()
        old = b.proc.bookie_id
        b.filler = None
        gone = _empty(b)
        for r in b.rotted:
            r["gone"] = True
        with open(b.proc.log_path, "a") as f:
            f.write(f"--- the fault suite wiped this data dir (bookie {old}): a new bookie starts here ---\n")
        b.wiped_id = old
        return {"wiped": old, "entries_removed": gone}

    def start_wiped_bookie(self, i: int) -> bool:
        """A wiped bookie's restart: first under its old id (its ``bookie.id``
        put back, as a bookie given its id on the command line), which its
        cookie must refuse (bookie/cookie.py: exit code 3, nothing served;
        ``b.old_id`` says how it ended), then as a new bookie, or with
        ``lost_disk_rejoin`` under its old id again with ``--on-lost-disk
        rejoin``: ready once autorecovery has drained the id (the final
        replica audit finds any entry it was named for and lacks)."""
        b = self.bookies[i]
        old, b.wiped_id = b.wiped_id, None
        if old is not None:
            (b.data_dir / "bookie.id").write_text(old + "\n")
            try:
                b.proc.start(timeout=60)
            except BookieStartError as e:
                b.old_id.append("refused" if "exited with 3" in str(e) else f"failed: {str(e)[:200]}")
            else:
                b.old_id.append("served")   # (an anomaly: run.py)
                b.proc.kill()
            if self.lost_disk_rejoin:
                return self._rejoin(b)
            _empty(b)
        return self.start_bookie(i)

    def _rejoin(self, b: "Bookie") -> bool:
        if "--on-lost-disk" not in b.proc.extra_args:   # (inert on its later starts: its dir has a cookie)
            b.proc.extra_args += ["--on-lost-disk", "rejoin", "--lost-disk-poll", "0.5"]
        t0 = time.monotonic()
        try:
            b.proc.start(timeout=REJOIN_TIMEOUT)
        except BookieStartError as e:   # (heal_all starts it again, rejoining as before)
            b.old_id.append(f"rejoin failed after {time.monotonic() - t0:.1f} s: {str(e)[-200:]}")
            return False
        b.state = "up"
        b.old_id.append(f"rejoined after {time.monotonic() - t0:.1f} s")
        return True

    def cut_journal_tail(self, i: int, rng) -> dict:
        """After a kill -9: the newest journal segment loses its last bytes
        (up to 256).  Those may have been fsynced and acknowledged: a disk
        that loses synced data, outside the protocol's fault model (one
        such bookie can make recovery decide an acknowledged entry absent),
        so this kind is only run when asked for (``--kinds cut_tail``)."""
        b = self.bookies[i]
        assert not b.proc.alive()
        segs = sorted((b.data_dir / "journal").glob("segment-*.log"))
        if not segs or segs[-1].stat().st_size == 0:
            return {"cut": 0}
        size = segs[-1].stat().st_size
        n = rng.randint(1, min(size, 256))
        os.truncate(segs[-1], size - n)
        return {"cut": n, "segment": segs[-1].name}

    def rot_entry(self, i: int, rng) -> dict:
        """One bit of one entry's payload flipped in bookie ``i``'s journal,
        while it runs, where the bytes were durable: a segment before the
        newest, or a record of the newest with a mark after it (bookie/journal.py:
        the bytes of the last commit before a crash may be cut as a torn
        tail, which is not a rot)."""
        b = self.bookies[i]
        found = self.rot_candidates(i)
        if not found:
            return {"rotted": 0}
        path, at, plen, lid, eid = rng.choice(found)
        at += rng.randrange(plen)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:   # (removed by a GC pass meanwhile)
            return {"rotted": 0}
        try:
            byte = os.pread(fd, 1, at)[0]
            os.pwrite(fd, bytes([byte ^ (1 << rng.randrange(8))]), at)
        finally:
            os.close(fd)
        rot = {"ledger": lid, "entry": eid, "segment": path.name, "offset": at,
               "scrub_passes": said(b.proc.log_path, SCRUB_PASS)}
        b.rotted.append(rot)
        return {"rotted": 1, "bookie": i, **rot}

    def rot_candidates(self, i: int) -> list[tuple]:
        """The entries of bookie ``i``'s journal ``rot_entry`` may rot:
        (segment path, payload offset, payload length, ledger, entry)."""
        segs = sorted((self.bookies[i].data_dir / "journal").glob("segment-*.log"))
        found = []
        for n, path in enumerate(segs):
            data = path.read_bytes()
            mv, seg, off, held, marked = memoryview(data), int(path.name[8:-4]), 0, [], 0
            while (rec := record_at(mv, seg, off)) is not None:
                if rec.rtype == R_MARK:
                    marked = len(held)
                elif rec.rtype == R_ENTRIES:
                    for eid, start, _ in E.record_spans(rec.body):
                        h = E.parse_header(rec.body, start)
                        if h.payload_len:
                            held.append((path, rec.body_offset + start + E.HEADER_SIZE, h.payload_len,
                                         h.ledger_id, eid))
                off = rec.end.offset
            found += held if n < len(segs) - 1 else held[:marked]
        return found

    def scrubbed_since_rot(self, b: "Bookie") -> bool:
        """Whether bookie ``b`` finished a whole scrub pass begun after
        its last rot (the pass the rot was in may have read past it)."""
        return not b.rotted or said(b.proc.log_path, SCRUB_PASS) >= b.rotted[-1]["scrub_passes"] + 2

    def fill_disk(self, i: int) -> dict:
        b = self.bookies[i]
        if not b.tmpfs or b.filler is not None:
            return {"filled": 0}
        b.filler = b.data_dir / "filler"
        st = os.statvfs(b.data_dir)
        n = st.f_bavail * st.f_frsize
        written = 0
        try:
            with open(b.filler, "wb") as f:
                while written < n:
                    written += f.write(b"\0" * min(1 << 20, n - written))
        except OSError:
            pass
        return {"filled": written}

    def free_disk(self, i: int) -> None:
        b = self.bookies[i]
        if b.filler is not None:
            b.filler.unlink(missing_ok=True)
            b.filler = None

    def slow_disk(self, i: int, delay_ms: float) -> dict:
        """Every fsync of bookie ``i`` takes ``delay_ms`` longer from now on."""
        b = self.bookies[i]
        if b.slow_path is None:
            return {"slowed": 0}
        b.slow_path.write_text(str(int(delay_ms * 1000)))
        return {"slowed": delay_ms}

    def fast_disk(self, i: int) -> None:
        b = self.bookies[i]
        if b.slow_path is not None:
            b.slow_path.unlink(missing_ok=True)

    def partition(self, i: int, mode: str, pids=None) -> None:
        for p in (self.bookies[i].proxy, self.bookies[i].read_proxy):
            (p.blackhole if mode == "blackhole" else p.cut)(pids)

    def heal(self, i: int) -> None:
        self.bookies[i].proxy.heal()
        self.bookies[i].read_proxy.heal()

    def partition_from_etcd(self, i: int, mode: str) -> None:
        """Bookie ``i`` alone loses etcd (its registration's lease runs out
        while it serves clients), by its etcd proxy: blackhole or cut."""
        p = self.bookies[i].etcd_proxy
        (p.blackhole if mode == "blackhole" else p.cut)(None)

    def heal_etcd_link(self, i: int) -> None:
        self.bookies[i].etcd_proxy.heal()

    # -- etcd ---------------------------------------------------------------------------------

    def kill_etcd(self) -> None:
        self.etcd.kill()
        self.etcd_state = "down"

    def start_etcd(self) -> None:
        self.etcd.start()
        self.etcd_state = "up"

    def stop_etcd(self) -> None:
        """SIGSTOP: an outage whose connections hang instead of failing."""
        os.kill(self.etcd.pid, signal.SIGSTOP)
        self.etcd_state = "stopped"

    def cont_etcd(self) -> None:
        os.kill(self.etcd.pid, signal.SIGCONT)
        self.etcd_state = "up"

    def registrations(self) -> dict:
        """The bookies registered in etcd now (writable and read-only)."""
        from metadata.registration import BookieRegistry
        from metadata.store import MetadataStore
        store = MetadataStore(self.etcd.endpoint, timeout=5.0)
        try:
            regs = BookieRegistry(store, self.name).list_bookies()
            return {r.bookie_id: {"address": r.address, "read_only": r.read_only} for r in regs}
        finally:
            store.close()

    def describe(self) -> dict:
        return {"etcd": self.etcd.endpoint, "cluster": self.name,
                "bookies": [{"index": b.index, "id": b.proc.bookie_id, "proxy": b.proxy.address,
                             "read_proxy": b.read_proxy.address,
                             "listen": b.proc.port, "tmpfs": b.tmpfs} for b in self.bookies]}


def dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str))


def _empty(b: Bookie) -> int:
    """Removes everything in ``b``'s data dir but its log; how many entries."""
    gone = 0
    for p in b.data_dir.iterdir():
        if p != b.proc.log_path:
            gone += 1
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return gone


SCRUB_PASS = "bytes) checked in "   # in a bookie's log line at the end of each scrub pass (bookie/scrub.py)


def said(log_path: Path, what: str) -> int:
    """How many times a process's log says ``what``."""
    try:
        return log_path.read_text(errors="replace").count(what)
    except FileNotFoundError:
        return 0


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
