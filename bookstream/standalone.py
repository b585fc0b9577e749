"""`bookstream standalone`: a local etcd and N bookies (4 by default), until Ctrl-C.

Data lives under --data-dir (etcd/ and bookie-<i>/), and ports are kept in
standalone.json there, so a restart of the command brings back the same
cluster with its data.  etcd listens on 127.0.0.1:2379 (--etcd-port), so the
README's examples run as written; with --etcd, that etcd is used instead.

Every child runs in a process group of its own, so a Ctrl-C at the terminal
reaches only this command, which then stops the bookies first (each revokes
its registration's lease and checkpoints) and etcd last.

A bookie that dies does not stop the others: its death is reported with the
command that starts it again by hand, and `--restart-bookies` restarts it
by itself (with a back-off).  SIGHUP restarts every dead bookie now.  A
restarted bookie replaces its stale registration at once (it kept its lease
id in its data dir: metadata/registration.py).

An auditor candidate and a replication worker (`bookstream autorecovery
run`, stream/autorecovery/) run beside the bookies unless --no-autorecovery:
a bookie gone for --recovery-delay (30 s) has its fragments copied to the
others.  They stop first, so stopping the cluster loses no bookie.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import secrets
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("bookstream.standalone")

DEFAULT_BOOKIE_PORT = 3181
DEFAULT_ETCD_PORT = 2379
ETCD_USER = "root"  # --etcd-auth's user
DEFAULT_BOOKIES = 4   # E3 Qw3 Qa2 streams keep a spare bookie for an ensemble change


def add_parser(sub) -> None:
    p = sub.add_parser("standalone", help="run a local etcd and bookies until Ctrl-C")
    add_arguments(p)
    p.set_defaults(func=cmd_standalone)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bookstream.cli import number, port_number

    p.add_argument("--data-dir", type=Path, default=Path("data/standalone"))
    p.add_argument("--bookies", type=number(int, "a number of bookies (at least 1)", lo=1), default=DEFAULT_BOOKIES)
    p.add_argument("--etcd", help="use this etcd endpoint instead of starting one")
    p.add_argument("--etcd-port", type=port_number, default=DEFAULT_ETCD_PORT,
                   help=f"client port of the local etcd (default {DEFAULT_ETCD_PORT}; 0: any free port)")
    p.add_argument("--cluster", default="default")
    p.add_argument("--base-port", type=port_number, default=DEFAULT_BOOKIE_PORT,
                   help="first bookie port; the next ones follow (0: any free ports)")
    p.add_argument("--restart-bookies", action="store_true",
                   help="start a bookie that died again by itself (with a back-off)")
    p.add_argument("--registration-ttl", type=number(int, "whole seconds (at least 2)", lo=2), default=None,
                   help="the bookies' lease TTL (seconds)")
    p.add_argument("--no-autorecovery", action="store_true",
                   help="do not run an auditor and a replication worker beside the bookies")
    p.add_argument("--recovery-delay", type=number(float, "a number of seconds", lo=0), default=30.0,
                   help="lost_bookie_recovery_delay of the autorecovery (seconds)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="json: one JSON object a line, here and in the bookies and autorecovery it runs")
    p.add_argument("--tls", action="store_true",
                   help="TLS everywhere: a throw-away CA in DATA_DIR/pki signs one certificate that etcd and the "
                        "bookies serve with (mutual TLS: clients present it too); prints the variables to export")
    p.add_argument("--etcd-auth", action="store_true",
                   help="turn the local etcd's authentication on: user root with a generated password kept in "
                        "DATA_DIR/etcd-root-password (0600, reused on restart); the bookies and autorecovery get "
                        "it, and the printed exports give it to clients")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _ports(state: dict, n: int, base: int) -> list[int]:
    ports = list(state.get("bookie_ports", []))[:n]
    nxt = base or 0
    while len(ports) < n:
        if base == 0:
            ports.append(0)
            continue
        while nxt in ports or not _free(nxt):
            nxt += 1
        ports.append(nxt)
        nxt += 1
    return ports


class StandaloneError(RuntimeError):
    """The cluster cannot start as asked (a port in use, a bad option)."""


class Standalone:
    """etcd (unless ``etcd`` names one) and ``bookies`` bookie processes.

    ``etcd_port`` 0 picks a free port (what programs and tests use); the
    command's default is 2379.  ``stop()`` stops the bookies first, etcd last.
    """

    def __init__(self, data_dir: Path, bookies: int = DEFAULT_BOOKIES, etcd: str | None = None,
                 cluster: str = "default", base_port: int = DEFAULT_BOOKIE_PORT, log_level: str = "INFO",
                 bookie_args: list[str] | None = None, etcd_port: int = 0,
                 autorecovery_args: list[str] | None = None, tls: bool = False, etcd_auth: bool = False):
        if bookies < 1:
            raise StandaloneError("need at least one bookie")
        if etcd_auth and etcd:
            raise StandaloneError("--etcd-auth turns auth on in the standalone's own etcd, not in --etcd's: "
                                  "give the bookies that etcd's credentials (--etcd-user, $BOOKSTREAM_ETCD_PASSWORD)")
        if not 0 <= etcd_port < 65536:
            raise StandaloneError(f"bad etcd port {etcd_port}")
        self.data_dir = Path(data_dir).resolve()
        self.n = bookies
        self.external_etcd = etcd
        self.etcd_port = etcd_port
        self.cluster = cluster
        self.base_port = base_port
        self.log_level = log_level
        self.bookie_args = list(bookie_args or [])  # more `bookstream bookie` options, for every bookie
        # ``bookstream autorecovery run`` beside the bookies (None: not run)
        self.autorecovery_args = None if autorecovery_args is None else list(autorecovery_args)
        self.etcd = None
        self.bookies = []
        self.autorecovery = None
        self.tls = tls
        self.etcd_auth = etcd_auth
        # what the children get and clients export (BOOKSTREAM_TLS_CA ..., BOOKSTREAM_ETCD_USER/_PASSWORD)
        self.tls_env: dict[str, str] = {}

    @property
    def etcd_endpoint(self) -> str:
        return self.external_etcd or self.etcd.endpoint

    def start(self) -> "Standalone":
        from bookstream.processes import BookieProcess

        self.data_dir.mkdir(parents=True, exist_ok=True)
        state_path = self.data_dir / "standalone.json"
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        etcd_tls = client_tls = None
        if self.tls:
            from bookstream.certs import DemoCa
            from metadata.tls import TlsFiles

            node = DemoCa(self.data_dir / "pki").issue("node", client=True)  # server and client use
            self.tls_env = {"BOOKSTREAM_TLS_CA": node.ca, "BOOKSTREAM_TLS_CERT": node.cert,
                            "BOOKSTREAM_TLS_KEY": node.key}
            if not self.external_etcd:
                self.tls_env["BOOKSTREAM_ETCD_CA"] = node.ca
                etcd_tls, client_tls = TlsFiles(None, node.cert, node.key), TlsFiles(node.ca)
        if not self.external_etcd:
            from metadata.etcd_server import ManagedEtcd

            if self.etcd_port and not _free(self.etcd_port):
                raise StandaloneError(f"port {self.etcd_port} is in use (another etcd or standalone?): "
                                      f"pass --etcd-port PORT, or --etcd HOST:PORT to use that etcd")
            self.etcd = ManagedEtcd(self.data_dir / "etcd", client_port=self.etcd_port, tls=etcd_tls,
                                    client_tls=client_tls)
            self.etcd.start()
            if self.etcd_auth:
                from metadata.errors import AuthenticationFailed

                try:
                    self.etcd.enable_auth(ETCD_USER, self.etcd_password())
                except AuthenticationFailed as e:
                    self.etcd.stop()
                    raise StandaloneError(f"etcd's auth is on and refuses user {ETCD_USER} with the password in "
                                          f"{self.password_path} ({e})") from e
                except BaseException:
                    self.etcd.stop()
                    raise
                self.tls_env.update({"BOOKSTREAM_ETCD_USER": ETCD_USER,
                                     "BOOKSTREAM_ETCD_PASSWORD": self.etcd_password()})
        ports = _ports(state, self.n, self.base_port)
        try:
            for i, port in enumerate(ports):
                b = BookieProcess(self.data_dir / f"bookie-{i}", port=port, etcd=self.etcd_endpoint,
                                  cluster=self.cluster, log_level=self.log_level, extra_args=self.bookie_args)
                b.env = self.tls_env or None
                b.start()
                self.bookies.append(b)
            if self.autorecovery_args is not None:
                from bookstream.processes import AutorecoveryProcess

                self.autorecovery = AutorecoveryProcess(self.data_dir / "autorecovery", etcd=self.etcd_endpoint,
                                                        cluster=self.cluster, log_level=self.log_level,
                                                        extra_args=self.autorecovery_args)
                self.autorecovery.env = self.tls_env or None
                self.autorecovery.start()
        except BaseException:
            self.stop()
            raise
        state["bookie_ports"] = [b.port for b in self.bookies]
        state_path.write_text(json.dumps(state, indent=2) + "\n")
        return self

    @property
    def password_path(self) -> Path:
        return self.data_dir / "etcd-root-password"

    def etcd_password(self) -> str:
        """The etcd root password of --etcd-auth: made once (0600), then read."""
        try:
            fd = os.open(self.password_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pw = self.password_path.read_text().strip()
            if not pw:
                raise StandaloneError(f"{self.password_path} is empty: delete it (and etcd's data) or restore it")
            return pw
        pw = secrets.token_urlsafe(24)
        with os.fdopen(fd, "w") as f:
            f.write(pw + "\n")
        return pw

    def shell_env(self) -> list[str]:
        """``NAME=value`` words for a shell: the password read from its file,
        so it never shows on the console or in logs."""
        return [f'{k}="$(cat {shlex.quote(str(self.password_path))})"' if k == "BOOKSTREAM_ETCD_PASSWORD"
                else f"{k}={shlex.quote(v)}" for k, v in self.tls_env.items()]

    def describe(self) -> str:
        lines = [f"etcd:    {self.etcd_endpoint}" + ("" if self.external_etcd else f"  (data in {self.etcd.data_dir})"),
                 f"cluster: {self.cluster}"]
        for b in self.bookies:
            admin = f"  admin={b.admin_scheme}://{b.admin_address}" if b.admin_address else ""
            lines.append(f"bookie:  {b.address}  id={b.bookie_id}  pid={b.pid}  data={b.data_dir}{admin}")
        if self.autorecovery is not None:
            lines.append(f"autorecovery: auditor candidate + worker, pid={self.autorecovery.pid}  "
                         f"log={self.autorecovery.log_path}")
        if self.tls_env:
            on = " and ".join(w for w, x in (("TLS (mutual)", self.tls), ("etcd auth (user root)", self.etcd_auth)) if x)
            lines.append(f"{on} on; for the CLI and clients (Security.from_env()):")
            lines += [f"  export {w}" for w in self.shell_env()]
        return "\n".join(lines)

    def restart_command(self, b) -> str:
        """The command that starts bookie ``b`` again by hand, as this cluster ran it."""
        cmd = ["bookstream", "bookie", "--data-dir", str(b.data_dir), "--port", str(b.port),
               "--etcd", self.etcd_endpoint, "--cluster", self.cluster, *self.bookie_args]
        return " ".join(["env", *self.shell_env(), shlex.join(cmd)] if self.tls_env else [shlex.join(cmd)])

    def stop(self, out=None, bookie_timeout: float = 20.0) -> None:
        """Autorecovery first (stopping bookies must not look like lost ones),
        then the bookies (each deregisters: its lease is revoked while etcd
        is still up, and checkpoints), etcd last.  The bookies stop in
        parallel under one deadline, then are killed.  With ``out``, each
        step is reported with its duration."""
        def step(what: str, t0: float) -> None:
            if out is not None:
                print(f"  {what} in {time.monotonic() - t0:.1f} s", file=out, flush=True)

        if self.autorecovery is not None:
            t0 = time.monotonic()
            # it holds no data (its leases expire by themselves): not worth a long wait
            self.autorecovery.stop(timeout=5.0)
            self.autorecovery = None
            step("autorecovery stopped", t0)
        t0 = time.monotonic()
        for b in self.bookies:
            if b.alive():
                b.proc.send_signal(signal.SIGTERM)
        deadline = t0 + bookie_timeout
        for b in self.bookies:
            b.stop(timeout=max(0.1, deadline - time.monotonic()))
        if self.bookies:
            step(f"{len(self.bookies)} bookies stopped", t0)
        self.bookies = []
        if self.etcd is not None:
            t0 = time.monotonic()
            self.etcd.stop()
            self.etcd = None
            step("etcd stopped", t0)

    def __enter__(self) -> "Standalone":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Supervisor:
    """Watches the bookies of a running Standalone: reports each death, and
    restarts (automatically with ``restart``, or on :meth:`restart_dead`).

    Deaths arrive as events: one thread per bookie process waits for it to
    exit and puts it on :attr:`events`, which the command's main loop reads.
    """

    def __init__(self, cluster: Standalone, restart: bool, out=sys.stderr,
                 backoff: float = 1.0, max_backoff: float = 30.0):
        self.cluster = cluster
        self.restart = restart
        self.out = out
        # SimpleQueue: its put() is safe from a signal handler (Queue's is not:
        # a handler that runs while the main thread holds Queue's lock deadlocks)
        self.events: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self.backoff0, self.max_backoff = backoff, max_backoff
        self._backoff = {}        # bookie index -> current back-off
        self._due: dict[int, float] = {}   # bookie index -> when to restart it
        self.deaths = 0
        self.restarts = 0

    def watch_all(self) -> None:
        for i, b in enumerate(self.cluster.bookies):
            self._watch(i, b)

    def _watch(self, i: int, b) -> None:
        proc = b.proc

        def wait():
            rc = proc.wait()
            self.events.put(("died", i, proc, rc))

        threading.Thread(target=wait, name=f"watch-bookie-{i}", daemon=True).start()

    def on_death(self, i: int, proc, rc: int, now: float) -> None:
        b = self.cluster.bookies[i]
        if b.proc is not proc:
            return  # an earlier process of this bookie
        self.deaths += 1
        how = f"signal {-rc}" if rc < 0 else f"status {rc}"
        print(f"bookie {b.bookie_id} ({b.address}) DIED ({how}); the others keep running. "
              f"Its log: {b.log_path}", file=self.out, flush=True)
        if self.restart:
            delay = self._backoff.get(i, self.backoff0)
            self._backoff[i] = min(self.max_backoff, delay * 2)
            self._due[i] = now + delay
            print(f"restarting it in {delay:.0f} s (--restart-bookies)", file=self.out, flush=True)
        else:
            print(f"restart it with: {self.cluster.restart_command(b)}\n"
                  f"  (or send SIGHUP to this command, pid {os.getpid()}; "
                  f"or run standalone with --restart-bookies)", file=self.out, flush=True)

    def restart_dead(self, now: float, only_due: bool = False) -> None:
        for i, b in enumerate(self.cluster.bookies):
            if b.alive():
                continue
            if only_due and (i not in self._due or self._due[i] > now):
                continue
            self._due.pop(i, None)
            try:
                b.start()
            except Exception as e:
                print(f"bookie {b.bookie_id} failed to start again: {e}", file=self.out, flush=True)
                if self.restart:
                    delay = self._backoff.get(i, self.backoff0)
                    self._backoff[i] = min(self.max_backoff, delay * 2)
                    self._due[i] = now + delay
                continue
            self.restarts += 1
            print(f"bookie {b.bookie_id} restarted on {b.address} (pid {b.pid})", file=self.out, flush=True)
            self._watch(i, b)

    def next_due(self) -> float | None:
        return min(self._due.values()) if self._due else None


def cmd_standalone(args: argparse.Namespace) -> int:
    from bookstream import logs

    logs.setup(args.log_level, args.log_format, "standalone")
    bookie_args = ["--admin-port", "0", "--log-format", args.log_format]  # admin: /health /ready /metrics /info
    if args.registration_ttl is not None:
        bookie_args += ["--registration-ttl", str(args.registration_ttl)]
    if args.tls:
        bookie_args += ["--admin-tls"]  # HTTPS with the bookie's certificate; mutual: a client certificate too
    autorecovery_args = None if args.no_autorecovery else ["--delay", str(args.recovery_delay), "--log-format",
                                                           args.log_format]
    try:
        cluster = Standalone(args.data_dir, args.bookies, args.etcd, args.cluster, args.base_port, args.log_level,
                             bookie_args=bookie_args, etcd_port=args.etcd_port, autorecovery_args=autorecovery_args,
                             tls=args.tls, etcd_auth=args.etcd_auth)
    except StandaloneError as e:
        print(f"bookstream standalone: {e}", file=sys.stderr, flush=True)
        return 2
    sup = Supervisor(cluster, args.restart_bookies)
    stop_signals = []

    def on_stop(signum, _frame):
        stop_signals.append(signum)
        sup.events.put(("stop",))

    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGHUP, lambda *_: sup.events.put(("restart",)))
    try:
        cluster.start()
    except Exception as e:
        print(f"bookstream standalone: {e}", file=sys.stderr, flush=True)
        return 1
    sup.watch_all()
    print("bookstream standalone is up", flush=True)
    print(cluster.describe(), flush=True)
    print("Ctrl-C to stop.", flush=True)
    try:
        while not stop_signals:
            due = sup.next_due()
            timeout = 1.0 if due is None else min(1.0, max(0.0, due - time.monotonic()))
            try:
                ev = sup.events.get(timeout=timeout)
            except queue.Empty:
                sup.restart_dead(time.monotonic(), only_due=True)
                continue
            if ev[0] == "stop":
                break
            if ev[0] == "restart":
                sup.restart_dead(time.monotonic())
            elif ev[0] == "died":
                sup.on_death(ev[1], ev[2], ev[3], time.monotonic())
    finally:
        print("stopping: autorecovery and bookies first, then etcd...", flush=True)
        cluster.stop(out=sys.stdout)
        print("stopped.", flush=True)
    return 0
