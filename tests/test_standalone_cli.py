"""`bookstream standalone` as a user runs it: up, endpoints printed, Ctrl-C
stops everything cleanly."""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time


def _read_until(proc, marker: str, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while marker.encode() not in out:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} in time; output so far:\n{out.decode()}"
            if sel.select(left):
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"standalone exited ({proc.wait()}):\n{out.decode()}"
                out += chunk
    finally:
        sel.close()
    return out.decode()


def test_standalone_command_starts_prints_endpoints_and_stops_on_ctrl_c(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "bookstream.cli", "standalone", "--data-dir", str(tmp_path / "sa"),
         "--bookies", "2", "--base-port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        out = _read_until(proc, "Ctrl-C to stop.", 60)
        assert out.count("bookie:  127.0.0.1:") == 2 and "etcd:    127.0.0.1:" in out
        bookie_dirs = sorted(p.name for p in (tmp_path / "sa").iterdir() if p.name.startswith("bookie-"))
        assert bookie_dirs == ["bookie-0", "bookie-1"]
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0].decode()
        assert proc.returncode == 0 and "stopped." in rest
        # every bookie checkpointed on the way down (a clean stop)
        assert all((tmp_path / "sa" / d / "checkpoint").exists() for d in bookie_dirs)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
