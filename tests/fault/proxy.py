"""A user-space TCP proxy in front of a bookie, to partition client<->bookie links.

Each bookie of the fault cluster listens on a private port and advertises the
proxy's port in its etcd registration (``--advertise-address``), so every
client reaches it through the proxy.  The proxy forwards bytes both ways
until told otherwise:

- ``blackhole(pids)``: bytes from and to those client processes are held
  (no longer read, so TCP's windows fill): the connections stay up and hang,
  as behind a dead router, and flow again once healed, as TCP's
  retransmissions would; gRPC's keepalive or the caller's deadline notices
  meanwhile.
- ``cut(pids)``: their connections are reset at once, and new ones are
  accepted and closed at once (a refused link).
- ``heal()``: forwarding again (connections cut stay cut; clients reconnect).

``pids=None`` means every client.  A connection is attributed to a client
process by its source port (``/proc/net/tcp`` gives the socket's inode, and
the process whose ``/proc/PID/fd`` holds that socket is the client), so a
partition can isolate one writer from one bookie while others still reach
it.  (Network namespaces with veth pairs would work too, as root, but would
have to carry etcd's and every client's traffic: the proxy partitions exactly
the client<->bookie links, which is what the protocol's quorums are about.)

All proxies of a cluster share one event loop thread (``ProxyLoop``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading

log = logging.getLogger(__name__)


def _free_port() -> int:
    from bookstream.processes import stable_port
    return stable_port()


def socket_owner(local_port: int, candidates: list[int]) -> int | None:
    """The pid among ``candidates`` owning the TCP socket whose local port
    is ``local_port`` (on 127.0.0.1), or None."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if int(parts[1].rsplit(":", 1)[1], 16) == local_port:
                        inode = parts[9]
                        break
        except OSError:
            continue
        if inode:
            break
    if not inode:
        return None
    needle = f"socket:[{inode}]"
    for pid in candidates:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == needle:
                        return pid
                except OSError:
                    continue
        except OSError:
            continue
    return None


class ProxyLoop:
    """One asyncio loop in a daemon thread for all the proxies."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fault-proxies", daemon=True)
        self.thread.start()

    def call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class _Link:
    """One proxied connection: the client side, the bookie side, and the
    client process it belongs to (None: unknown)."""

    def __init__(self, c_reader, c_writer, b_reader, b_writer, pid):
        self.c_reader, self.c_writer, self.b_reader, self.b_writer, self.pid = c_reader, c_writer, b_reader, b_writer, pid
        self.tasks: list[asyncio.Task] = []

    def close(self) -> None:
        for w in (self.c_writer, self.b_writer):
            try:
                sock = w.get_extra_info("socket")
                if sock is not None:  # a reset, not a polite FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                w.close()
            except Exception:
                pass
        for t in self.tasks:
            t.cancel()


class BookieProxy:
    """The proxy of one bookie: listens on ``port`` and forwards to
    ``target_port``.  ``client_pids()`` names the client processes a
    connection may belong to (asked when it is accepted)."""

    def __init__(self, ploop: ProxyLoop, target_port: int, client_pids, port: int = 0):
        self.ploop = ploop
        self.target_port = target_port
        self.port = port or _free_port()
        self.client_pids = client_pids
        self.links: set[_Link] = set()
        self.forwarded = 0   # connections forwarded to the target so far
        self.blocked: dict[str, object] = {}   # "blackhole"/"cut" -> None (all) or a set of pids
        self.server = None
        self.ploop.call(self._start())

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self._healed = asyncio.Event()
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)

    def _mode(self, pid) -> str | None:
        for mode, pids in self.blocked.items():
            if pids is None or pid in pids:
                return mode
        return None

    async def _accept(self, c_reader, c_writer) -> None:
        peer_port = c_writer.get_extra_info("peername")[1]
        pid = socket_owner(peer_port, list(self.client_pids()))
        if self._mode(pid) == "cut":
            c_writer.close()
            return
        try:
            b_reader, b_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            c_writer.close()  # the bookie is down: so is the link
            return
        link = _Link(c_reader, c_writer, b_reader, b_writer, pid)
        self.forwarded += 1
        self.links.add(link)
        link.tasks = [asyncio.create_task(self._pump(link, c_reader, b_writer)),
                      asyncio.create_task(self._pump(link, b_reader, c_writer))]

    async def _gate(self, link: _Link) -> None:
        while self._mode(link.pid) == "blackhole":
            self._healed.clear()
            await self._healed.wait()

    async def _pump(self, link: _Link, reader, writer) -> None:
        try:
            while True:
                await self._gate(link)
                data = await reader.read(1 << 16)
                if not data:
                    break
                await self._gate(link)  # bytes read as the blackhole began are held too
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.links.discard(link)
            link.close()

    # -- the nemesis's controls (from any thread) -------------------------------------

    def blackhole(self, pids=None) -> None:
        self.ploop.loop.call_soon_threadsafe(self.blocked.__setitem__, "blackhole", None if pids is None else set(pids))

    def cut(self, pids=None) -> None:
        async def go():
            self.blocked["cut"] = None if pids is None else set(pids)
            for link in list(self.links):
                if pids is None or link.pid in pids:
                    self.links.discard(link)
                    link.close()
        self.ploop.call(go())

    def heal(self) -> None:
        def go():
            self.blocked.clear()
            self._healed.set()
        self.ploop.loop.call_soon_threadsafe(go)

    def drop_all(self) -> None:
        """Closes every link (the bookie behind was killed: as its sockets would be)."""
        async def go():
            for link in list(self.links):
                self.links.discard(link)
                link.close()
        self.ploop.call(go())

    def close(self) -> None:
        async def go():
            if self.server is not None:
                self.server.close()
            for link in list(self.links):
                link.close()
        try:
            self.ploop.call(go())
        except Exception:
            pass
