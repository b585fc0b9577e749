"""Bookie processes: start one, wait until it serves, stop or kill it.

Used by `bookstream standalone` and by the tests, which run real bookie
processes.  A bookie prints one `BOOKIE_READY {json}` line on stdout once it
serves; `start()` waits for that line (an event, not a sleep).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bookstream.cli import READY_PREFIX


class BookieStartError(RuntimeError):
    pass


class BookieProcess:
    def __init__(self, data_dir: str | os.PathLike, *, port: int = 0, etcd: str | None = None,
                 cluster: str = "default", extra_args: list[str] | None = None, log_level: str = "INFO"):
        self.data_dir = Path(data_dir)
        self.port = port
        self.etcd = etcd
        self.cluster = cluster
        self.extra_args = list(extra_args or [])
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None
        self.bookie_id: str | None = None
        self._drain: threading.Thread | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "bookie.log"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "bookstream.cli", "bookie", "--data-dir", str(self.data_dir),
               "--port", str(self.port), "--log-level", self.log_level]
        if self.etcd:
            cmd += ["--etcd", self.etcd, "--cluster", self.cluster]
        return cmd + self.extra_args

    def start(self, timeout: float = 30.0) -> "BookieProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=logf,
                                     stdin=subprocess.DEVNULL)
        logf.close()
        line = self._read_ready_line(timeout)
        info = json.loads(line[len(READY_PREFIX):])
        self.address, self.bookie_id = info["address"], info["bookie_id"]
        if self.port == 0:  # keep the port across restarts of this process object
            self.port = int(self.address.rsplit(":", 1)[1])
        # keep draining stdout so the child never blocks on a full pipe
        self._drain = threading.Thread(target=self.proc.stdout.read, daemon=True)
        self._drain.start()
        return self

    def _read_ready_line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = b""
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise BookieStartError(f"bookie in {self.data_dir} not ready after {timeout}s:\n{self.log_tail()}")
                if not sel.select(left):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    self.proc.wait()
                    raise BookieStartError(
                        f"bookie in {self.data_dir} exited with {self.proc.returncode}:\n{self.log_tail()}")
                buf += chunk
                for line in buf.decode(errors="replace").splitlines():
                    if line.startswith(READY_PREFIX):
                        return line
        finally:
            sel.close()

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
        """kill -9: no clean shutdown, no final checkpoint."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float = 20.0) -> int:
        """A clean stop (SIGTERM): the bookie checkpoints and deregisters."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else 0

    def restart(self, timeout: float = 30.0) -> "BookieProcess":
        self.stop()
        return self.start(timeout)
