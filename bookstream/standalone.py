"""`bookstream standalone`: a local etcd and N bookies, until Ctrl-C.

Data lives under --data-dir (etcd/ and bookie-<i>/), and ports are kept in
standalone.json there, so a restart of the command brings back the same
cluster with its data.  With --etcd, that etcd is used instead of a local one.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import threading
from pathlib import Path

log = logging.getLogger("bookstream.standalone")

DEFAULT_BOOKIE_PORT = 3181


def add_parser(sub) -> None:
    p = sub.add_parser("standalone", help="run a local etcd and bookies until Ctrl-C")
    p.add_argument("--data-dir", type=Path, default=Path("data/standalone"))
    p.add_argument("--bookies", type=int, default=3)
    p.add_argument("--etcd", help="use this etcd endpoint instead of starting one")
    p.add_argument("--cluster", default="default")
    p.add_argument("--base-port", type=int, default=DEFAULT_BOOKIE_PORT,
                   help="first bookie port; the next ones follow (0: any free ports)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=cmd_standalone)


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


class Standalone:
    def __init__(self, data_dir: Path, bookies: int = 3, etcd: str | None = None,
                 cluster: str = "default", base_port: int = DEFAULT_BOOKIE_PORT, log_level: str = "INFO",
                 bookie_args: list[str] | None = None):
        if bookies < 1:
            raise ValueError("need at least one bookie")
        self.data_dir = Path(data_dir).resolve()
        self.n = bookies
        self.external_etcd = etcd
        self.cluster = cluster
        self.base_port = base_port
        self.log_level = log_level
        self.bookie_args = list(bookie_args or [])  # more `bookstream bookie` options, for every bookie
        self.etcd = None
        self.bookies = []

    @property
    def etcd_endpoint(self) -> str:
        return self.external_etcd or self.etcd.endpoint

    def start(self) -> "Standalone":
        from bookstream.processes import BookieProcess

        self.data_dir.mkdir(parents=True, exist_ok=True)
        state_path = self.data_dir / "standalone.json"
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        if not self.external_etcd:
            from metadata.etcd_server import ManagedEtcd

            self.etcd = ManagedEtcd(self.data_dir / "etcd")
            self.etcd.start()
        ports = _ports(state, self.n, self.base_port)
        try:
            for i, port in enumerate(ports):
                b = BookieProcess(self.data_dir / f"bookie-{i}", port=port, etcd=self.etcd_endpoint,
                                  cluster=self.cluster, log_level=self.log_level, extra_args=self.bookie_args)
                b.start()
                self.bookies.append(b)
        except BaseException:
            self.stop()
            raise
        state["bookie_ports"] = [b.port for b in self.bookies]
        state_path.write_text(json.dumps(state, indent=2) + "\n")
        return self

    def describe(self) -> str:
        lines = [f"etcd:    {self.etcd_endpoint}" + ("" if self.external_etcd else f"  (data in {self.etcd.data_dir})"),
                 f"cluster: {self.cluster}"]
        for b in self.bookies:
            lines.append(f"bookie:  {b.address}  id={b.bookie_id}  data={b.data_dir}")
        return "\n".join(lines)

    def stop(self) -> None:
        for b in self.bookies:
            if b.alive():
                b.proc.send_signal(signal.SIGTERM)
        for b in self.bookies:
            b.stop()
        self.bookies = []
        if self.etcd is not None:
            self.etcd.stop()
            self.etcd = None

    def __enter__(self) -> "Standalone":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def cmd_standalone(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    cluster = Standalone(args.data_dir, args.bookies, args.etcd, args.cluster, args.base_port, args.log_level)
    cluster.start()
    print("bookstream standalone is up", flush=True)
    print(cluster.describe(), flush=True)
    print("Ctrl-C to stop.", flush=True)
    try:
        while not done.wait(1.0):
            dead = [b for b in cluster.bookies if not b.alive()]
            if dead:
                for b in dead:
                    print(f"bookie {b.bookie_id} exited ({b.proc.returncode}); see {b.log_path}", file=sys.stderr)
                break
    finally:
        print("stopping...", flush=True)
        cluster.stop()
        print("stopped.", flush=True)
    return 0
