"""`bookstream standalone` as a user runs it (issue 12 items 4 and 5): up with
its endpoints printed; a Ctrl-C at the terminal (SIGINT to the whole process
group) stops the bookies first, so their leases are revoked before etcd
stops; a bookie that dies leaves the others running, is reported, and starts
again (SIGHUP, or by itself with --restart-bookies), replacing its stale
registration at once."""
from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time

import pytest

from bookstream.standalone import DEFAULT_BOOKIES, DEFAULT_ETCD_PORT
from metadata.etcd_server import ManagedEtcd
from metadata.registration import BookieRegistry
from metadata.store import MetadataStore


class Output:
    """The command's output as it arrives; `until(marker)` waits for it."""

    def __init__(self, proc):
        self.proc, self.text = proc, ""

    def until(self, pattern: str, timeout: float = 60.0) -> re.Match:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                m = re.search(pattern, self.text)
                if m:
                    return m
                left = deadline - time.monotonic()
                assert left > 0, f"no {pattern!r} in time; output so far:\n{self.text}"
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    assert chunk, f"standalone exited ({self.proc.wait()}):\n{self.text}"
                    self.text += chunk.decode()
        finally:
            sel.close()


def _start(tmp_path, *extra):
    proc = subprocess.Popen(
        [sys.executable, "-m", "bookstream.cli", "standalone", "--data-dir", str(tmp_path / "sa"),
         "--bookies", "2", "--base-port", "0", "--etcd-port", "0", "--log-level", "WARNING", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)  # its own group, as a terminal gives it: Ctrl-C goes to the group
    return proc, Output(proc)


def _bookies(out: Output) -> list[tuple[str, str, int]]:
    return [(m[0], m[1], int(m[2])) for m in re.findall(r"bookie:  (\S+)  id=(\S+)  pid=(\d+)", out.text)]


def _ctrl_c(proc, out: Output, tmp_path) -> str:
    """Ctrl-C, then the output up to "stopped." (read as it comes, so a full
    pipe never blocks the command); on a timeout, the bookies' logs too."""
    os.killpg(proc.pid, signal.SIGINT)
    start = len(out.text)
    try:
        out.until(r"(?m)^stopped\.$", timeout=60)
    except AssertionError:
        logs = "\n".join(f"--- {p}:\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                         for p in sorted((tmp_path / "sa").glob("*/*.log")))
        raise AssertionError(f"no clean stop within 60 s; output:\n{out.text}\n{logs}") from None
    assert proc.wait(30) == 0
    return out.text[start:]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc: each child of the standalone
    runs in a process group of its own, so killing its group leaves them)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _stop(proc):
    """After a test (a failed one too): the standalone and everything it
    started are gone."""
    below = _descendants(proc.pid)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_ctrl_c_stops_bookies_first_so_their_registrations_are_gone(tmp_path):
    proc, out = _start(tmp_path, "--registration-ttl", "30")
    try:
        out.until("Ctrl-C to stop.")
        assert len(_bookies(out)) == 2 and re.search(r"etcd:    127\.0\.0\.1:\d+", out.text)
        # the auditor candidate and replication worker run beside the bookies (issue 15)
        ar_pid = int(re.search(r"autorecovery: auditor candidate \+ worker, pid=(\d+)", out.text)[1])
        os.kill(ar_pid, 0)
        assert sorted(p.name for p in (tmp_path / "sa").iterdir() if p.name.startswith("bookie-")) == \
            ["bookie-0", "bookie-1"]
        rest = _ctrl_c(proc, out, tmp_path)  # what a terminal's Ctrl-C does
        assert re.search(r"2 bookies stopped in [\d.]+ s", rest) and "etcd stopped" in rest
        with pytest.raises(ProcessLookupError):  # stopped with the cluster
            os.kill(ar_pid, 0)
    finally:
        _stop(proc)
    # every bookie checkpointed on the way down (a clean stop) ...
    assert all((tmp_path / "sa" / d / "checkpoint").exists() for d in ("bookie-0", "bookie-1"))
    # ... and revoked its lease while etcd was up: with etcd back (it restores
    # unexpired leases), no registration is left to wait for.
    with ManagedEtcd(tmp_path / "sa" / "etcd") as etcd, MetadataStore(etcd.endpoint) as store:
        assert BookieRegistry(store, "default").list_bookies() == []


def test_a_dead_bookie_is_reported_and_restarted_on_sighup(tmp_path):
    proc, out = _start(tmp_path, "--registration-ttl", "30")
    try:
        out.until("Ctrl-C to stop.")
        endpoint = re.search(r"etcd:    (\S+)", out.text)[1]
        (addr0, id0, pid0), (addr1, id1, pid1) = _bookies(out)
        os.kill(pid1, signal.SIGKILL)
        out.until(rf"bookie {id1} \({re.escape(addr1)}\) DIED \(signal 9\); the others keep running")
        m = out.until(r"restart it with: (bookstream bookie [^\n]+)")
        assert f"--etcd {endpoint}" in m[1] and "--port " + addr1.rsplit(":", 1)[1] in m[1]
        with MetadataStore(endpoint) as store:
            registry = BookieRegistry(store, "default")
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGHUP)
            out.until(rf"bookie {id1} restarted on {re.escape(addr1)}")
            # its killed run's lease (30 s) was replaced at once, not waited for
            assert time.monotonic() - t0 < 25
            assert [b.bookie_id for b in registry.list_bookies()] == sorted([id0, id1])
        assert proc.poll() is None  # the cluster ran on throughout
        _ctrl_c(proc, out, tmp_path)
    finally:
        _stop(proc)


def test_restart_bookies_restarts_a_dead_bookie_by_itself(tmp_path):
    proc, out = _start(tmp_path, "--restart-bookies")
    try:
        out.until("Ctrl-C to stop.")
        (_, id0, pid0), _ = _bookies(out)
        os.kill(pid0, signal.SIGKILL)
        out.until(rf"bookie {id0} \(\S+\) DIED")
        out.until("restarting it in 1 s")
        pid = int(out.until(rf"bookie {id0} restarted on \S+ \(pid (\d+)\)")[1])
        out.text = ""
        os.kill(pid, signal.SIGKILL)
        out.until("restarting it in 2 s")  # the back-off grows
        out.until(rf"bookie {id0} restarted on")
        _ctrl_c(proc, out, tmp_path)
    finally:
        _stop(proc)


def test_defaults_and_a_busy_etcd_port(tmp_path):
    import argparse
    from bookstream import standalone

    p = argparse.ArgumentParser()
    standalone.add_arguments(p)
    args = p.parse_args([])
    assert (args.bookies, args.etcd_port) == (DEFAULT_BOOKIES, DEFAULT_ETCD_PORT) == (4, 2379)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "bookstream.cli", "standalone", "--data-dir", str(tmp_path / "sa"),
                            "--etcd-port", str(busy)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"port {busy} is in use" in r.stderr and "--etcd-port" in r.stderr
