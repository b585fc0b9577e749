"""Server processes: start one, wait until it serves, stop or kill it.

Used by `bookstream standalone`, the benchmarks and the tests, which run real
processes.  A bookie prints one `BOOKIE_READY {json}` line on stdout once it
serves; `start()` waits for that line (an event, not a sleep).  `ServedProcess`
is the shared part: any child whose output says when it is ready.
"""
from __future__ import annotations

import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from bookstream.cli import READY_PREFIX


class ProcessStartError(RuntimeError):
    pass


def stable_port(host: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range, for a server that
    binds it later, and again after each restart.  The kernel hands ports of
    that range (net.ipv4.ip_local_port_range) to outgoing connections, so a
    port picked there can be taken by one before the server binds it, or
    while it is down: seen once in ~100 fault-suite runs ("Failed to bind"
    at a bookie's first start).  Never the same port twice in one process
    (bookies started together probe before any of them binds).  The
    kernel's pick if the range leaves no room."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    pick = random.SystemRandom()   # (processes started together draw apart)
    with _HANDED_LOCK:
        for _ in range(64 if low > 10_000 else 0):
            port = pick.randrange(10_000, low)
            if port in _HANDED:   # (handed to a server not listening yet: the probe below would pass)
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _HANDED.add(port)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_HANDED: set[int] = set()   # every port stable_port gave in this process
_HANDED_LOCK = threading.Lock()


class BookieStartError(ProcessStartError):
    pass


class ServedProcess:
    """A child process whose stdout says when it is ready.

    stderr goes to `log_path`, or, with `merge_stderr`, into stdout; either
    way, once ready, a thread keeps draining stdout (into the log when merged)
    so the child never blocks on a full pipe."""

    start_error = ProcessStartError
    log_name = "process.log"
    merge_stderr = False
    env: dict | None = None  # more environment variables of the child (BOOKSTREAM_TLS_*: bookstream/security.py)

    def __init__(self, data_dir: str | os.PathLike):
        self.data_dir = Path(data_dir)
        self.proc: subprocess.Popen | None = None
        self._drain: threading.Thread | None = None
        self._out = b""

    @property
    def log_path(self) -> Path:
        return self.data_dir / self.log_name

    def command(self) -> list[str]:
        raise NotImplementedError

    def spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT if self.merge_stderr else logf,
                                     stdin=subprocess.DEVNULL,
                                     env=None if self.env is None else {**os.environ, **self.env},
                                     # its own process group: a Ctrl-C at the terminal reaches the
                                     # parent only, which stops its children in order (standalone)
                                     process_group=0)
        logf.close()
        self._out = b""

    def wait_for_line(self, match: Callable[[str], bool], timeout: float) -> str:
        """The first line of output (since the spawn) that `match`es; waits
        for it as the output arrives."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                for line in self._out.decode(errors="replace").splitlines():
                    if match(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise self.start_error(f"{self.describe()} not ready after {timeout}s:\n{self.log_tail()}")
                if not sel.select(left):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    self.proc.wait()
                    raise self.start_error(
                        f"{self.describe()} exited with {self.proc.returncode}:\n{self.log_tail()}")
                self._out += chunk
                if self.merge_stderr:
                    with open(self.log_path, "ab") as f:
                        f.write(chunk)
        finally:
            sel.close()

    def start_draining(self) -> None:
        def drain(out, path):
            if path is None:
                out.read()
                return
            with open(path, "ab") as f:
                for chunk in iter(lambda: out.read1(65536), b""):
                    f.write(chunk)

        self._drain = threading.Thread(target=drain, args=(self.proc.stdout, self.log_path if self.merge_stderr
                                                           else None), daemon=True)
        self._drain.start()

    def describe(self) -> str:
        return f"process in {self.data_dir}"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no clean shutdown."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float = 20.0) -> int:
        """A clean stop (SIGTERM), SIGKILL after `timeout`."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else 0


class BookieProcess(ServedProcess):
    """One bookie.  `stop()` is a clean stop (the bookie checkpoints and
    deregisters); `kill()` is kill -9 (no final checkpoint)."""

    start_error = BookieStartError
    log_name = "bookie.log"

    def __init__(self, data_dir: str | os.PathLike, *, port: int = 0, etcd: str | None = None,
                 cluster: str = "default", extra_args: list[str] | None = None, log_level: str = "INFO"):
        super().__init__(data_dir)
        self.port = port
        self.etcd = etcd
        self.cluster = cluster
        self.extra_args = list(extra_args or [])
        self.log_level = log_level
        self.address: str | None = None
        self.read_address = ""      # its read port's, as registered ("" none: bookie/read_port.py)
        self._read_port = 0         # kept across restarts, as the port is
        self.bookie_id: str | None = None
        self.admin_address: str | None = None
        self.admin_scheme = "http"

    def command(self) -> list[str]:
        if self.port == 0:   # (kept across restarts: see stable_port)
            self.port = stable_port()
        cmd = [sys.executable, "-m", "bookstream.cli", "bookie", "--data-dir", str(self.data_dir),
               "--port", str(self.port), "--log-level", self.log_level]
        if self.etcd:
            cmd += ["--etcd", self.etcd, "--cluster", self.cluster]
        if "--read-port" not in self.extra_args and "--no-read-port" not in self.extra_args:
            self._read_port = self._read_port or stable_port()
            cmd += ["--read-port", str(self._read_port)]
        return cmd + self.extra_args

    def describe(self) -> str:
        return f"bookie in {self.data_dir}"

    def start(self, timeout: float = 30.0) -> "BookieProcess":
        self.spawn()
        line = self.wait_for_line(lambda s: s.startswith(READY_PREFIX), timeout)
        info = json.loads(line[len(READY_PREFIX):])
        self.address, self.bookie_id = info["address"], info["bookie_id"]
        self.admin_address = info.get("admin_address")  # with --admin-port: /health /ready /metrics /info
        self.admin_scheme = info.get("admin_scheme", "http")  # https with --admin-tls
        self.read_address = info.get("read_address") or ""
        self._read_port = info.get("read_port") or 0
        self.start_draining()
        return self

    def restart(self, timeout: float = 30.0) -> "BookieProcess":
        self.stop()
        return self.start(timeout)


class AutorecoveryProcess(ServedProcess):
    """An auditor candidate and a replication worker
    (``bookstream autorecovery run``), ready once it prints
    ``AUTORECOVERY_READY``.  Its log goes to ``autorecovery.log`` in
    ``data_dir``."""

    log_name = "autorecovery.log"

    def __init__(self, data_dir: str | os.PathLike, *, etcd: str, cluster: str = "default",
                 extra_args: list[str] | None = None, log_level: str = "INFO"):
        super().__init__(data_dir)
        self.etcd, self.cluster, self.log_level = etcd, cluster, log_level
        self.extra_args = list(extra_args or [])

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bookstream.cli", "autorecovery", "run", "--etcd", self.etcd,
                "--cluster", self.cluster, "--log-level", self.log_level.lower(), *self.extra_args]

    def describe(self) -> str:
        return f"autorecovery in {self.data_dir}"

    def start(self, timeout: float = 30.0) -> "AutorecoveryProcess":
        self.spawn()
        self.wait_for_line(lambda s: s.startswith("AUTORECOVERY_READY"), timeout)
        self.start_draining()
        return self
