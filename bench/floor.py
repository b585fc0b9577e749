"""The design's floor under the writer: `FloorWriter`, a writer that only
moves frames, batched as the stream writer batches them, and the open loop
through it (`open_loop_floor`).  Driven to the gRPC ceiling's empty servers
(gRPC alone) or to servers that journal each frame (gRPC + journal) by
`bench/ceilings.py`'s phases.
"""
from __future__ import annotations

import asyncio

from bookie import entry as E


class _Add:
    """One call's entries (one, or a batch) and its future; done once
    `ack_quorum` servers acked all of them."""

    __slots__ = ("fut", "n", "acked", "servers_done")

    def __init__(self, fut: asyncio.Future, n: int, servers: int):
        self.fut, self.n, self.acked, self.servers_done = fut, n, [0] * servers, 0


class FloorWriter:
    """A writer that does no more than move frames, batched as the stream
    writer batches them (stream/ledger_write.py): the appends of one turn of the
    event loop are handed over together; a server with no frame in flight
    is sent them at once, else they wait, and go when its frame's ack is
    back or once MAX_INFLIGHT_FRAMES allows and PIPELINE_BYTES wait; frames
    of at most FRAME_BYTES.  `append_async` (one entry) and
    `append_many_async` (a batch, one future) resolve once `ack_quorum`
    servers acked every entry.  No entry ids, no LAC, no ensemble, no
    retries: the floor under the writer.

    TODO(issue 13 item 3): this re-implements the writer's frame pipeline
    by hand (frame size, in-flight limit, backlog, one encoding per run).
    Drive it with the pure frame pipeline module once it exists, so the
    floor measures the writer's own rules, not a copy of them."""

    def __init__(self, clients, ack_quorum: int = 2):
        from stream.frames import FRAME_BYTES, MAX_INFLIGHT_FRAMES, PIPELINE_BYTES

        self.frame_bytes, self.max_inflight, self.pipeline_bytes = FRAME_BYTES, MAX_INFLIGHT_FRAMES, PIPELINE_BYTES
        self.clients, self.ack_quorum = clients, ack_quorum
        self.loop = asyncio.get_running_loop()
        self._queued: list[tuple[list[bytes], _Add]] = []
        self._held: list[list[tuple[list[bytes], _Add]]] = [[] for _ in clients]
        self._held_bytes = [0] * len(clients)
        self._inflight = [0] * len(clients)
        self._last_frame: tuple | None = None

    def append_async(self, payload: bytes) -> asyncio.Future:
        return self.append_many_async([payload])

    def append_many_async(self, payloads) -> asyncio.Future:
        fut = self.loop.create_future()
        if not self._queued:
            self.loop.call_soon(self._hand_queued)
        self._queued.append(([E.encode(1, k, p) for k, p in enumerate(payloads)], _Add(fut, len(payloads),
                                                                                     len(self.clients))))
        return fut

    def _hand_queued(self) -> None:
        queued, self._queued = self._queued, []
        size = sum(len(r) for records, _ in queued for r in records)
        for i in range(len(self.clients)):
            self._held[i].extend(queued)
            self._held_bytes[i] += size
            if not self._inflight[i] or (self._held_bytes[i] >= self.pipeline_bytes
                                         and self._inflight[i] < self.max_inflight):
                self._send(i)

    def _send(self, i: int) -> None:
        held, self._held[i], self._held_bytes[i] = self._held[i], [], 0
        frame: list[bytes] = []
        parts: list[tuple[_Add, int]] = []
        size = 0
        for records, add in held:
            n = 0
            for r in records:
                if frame and size + len(r) > self.frame_bytes:
                    if n:
                        parts.append((add, n))
                    self._transmit(i, frame, parts)
                    frame, parts, size, n = [], [], 0, 0
                frame.append(r)
                size += len(r)
                n += 1
            parts.append((add, n))
        if frame:
            self._transmit(i, frame, parts)

    def _transmit(self, i: int, frame: list[bytes], parts: list[tuple[_Add, int]]) -> None:
        # one frame's bytes for every server it goes to, as the writer encodes a run once
        c = self._last_frame
        if c is not None and c[0] is frame[0] and c[1] is frame[-1] and c[2] == len(frame):
            message = c[3]
        else:
            message = b"".join(frame)
            self._last_frame = (frame[0], frame[-1], len(frame), message)
        self._inflight[i] += 1
        self.clients[i].add_frame(message).add_done_callback(lambda f: self._acked(i, parts, f))

    def _acked(self, i: int, parts: list[tuple[_Add, int]], f: asyncio.Future) -> None:
        self._inflight[i] -= 1
        failed = f.exception()
        for add, n in parts:
            if add.fut.done():
                continue
            if failed is not None:
                add.fut.set_exception(failed)
                continue
            add.acked[i] += n
            if add.acked[i] == add.n:
                add.servers_done += 1
                if add.servers_done == self.ack_quorum:
                    add.fut.set_result(None)
        if self._held[i]:
            self._send(i)


async def open_loop_floor(addresses: list[str], size: int, seconds: float, rate: float, ack_quorum: int = 2) -> dict:
    """The open loop of `bench stream` (`bench.single._open_loop`, the
    same measuring code) through a `FloorWriter` to servers that do no more
    than gRPC (and their journal, if started with one): the floor of that
    figure at that load, without any bookie or client logic."""
    from bench.single import _open_loop
    from stream.bookie_client import BookieClient

    clients = [BookieClient(a) for a in addresses]
    try:
        for c in clients:
            await c.add(E.encode(1, 0, b"open"))  # open the streams
        r = await _open_loop(FloorWriter(clients, ack_quorum).append_async, size, seconds, rate)
    finally:
        for c in clients:
            await c.close()
    return {"entry_bytes": size, "ack_quorum": ack_quorum, **r}
