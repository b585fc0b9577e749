"""The client side of a bookie's read port (bookie/read_port.py): range
reads over plain TCP, each frame received straight into its own buffer.

``ReadPortClient.read_range`` gives the frames of one range read as
``wire.RangeFrame``s, as ``BookieClient.read_range(raw=True)`` gives
ReadRange's: the same bytes, decoded by the same function.  Connections are
kept (``MAX_IDLE`` per bookie) for the next read once an answer was read to
its end; a read abandoned before its end closes its connection (the rest of
the answer is on its way).  A connection that fails raises
``BookieUnavailable``, as a broken gRPC call does.
"""
from __future__ import annotations

import asyncio
import collections
from typing import AsyncIterator

from bookie import native, wire
from bookie.read_port import LENGTH, framed
from bookstream_pb import bookie_pb2 as pb

MAX_IDLE = 4
MAX_FRAME_BYTES = 64 << 20     # a frame longer than this is no bookie's: the connection is dropped
QUEUED_FRAMES = 2              # frames received ahead of the reader before the socket is left unread


def _frame_buffer_py(n: int) -> tuple[bytearray, memoryview]:
    buf = bytearray(n)
    return buf, memoryview(buf)


_records = native("_records")
# (bytes, a writable view of them) to receive a frame into: in C, a bytes
# object filled in place (no zero-fill, no copy: a fifth of a 64 KiB
# catch-up's reader CPU), and one of a few kept for frames once nothing
# holds them (no fresh pages to fault in: 2-16 % of the reader's CPU);
# else a bytearray, copied to bytes once full.
frame_buffer = _records.frame_buffer if _records is not None else _frame_buffer_py
_open_clients = 0   # ReadPortClients not closed: once none is left, the kept frame buffers go


def _client_closed() -> None:
    global _open_clients
    _open_clients -= 1
    if _open_clients == 0 and hasattr(_records, "frame_pool"):
        _records.frame_pool(True)


class ReadPortUnavailable(ConnectionError):
    """The read port could not be reached (``connecting``), or its
    connection broke."""

    def __init__(self, message: str, connecting: bool = False):
        super().__init__(message)
        self.connecting = connecting


class _Connection(asyncio.BufferedProtocol):
    """One connection: frames as they arrive, each into a buffer of its own
    length (a 4-byte length, then that many bytes)."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.frames: collections.deque = collections.deque()
        self.error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._head = bytearray(LENGTH.size)
        self._buf = self._head          # being filled: the length, or a frame (frame_buffer's)
        self._view = memoryview(self._head)
        self._got = 0
        self._paused = False

    @property
    def usable(self) -> bool:
        """Open, and between answers (nothing received beyond the last one)."""
        return (self.error is None and self.transport is not None and not self.transport.is_closing()
                and not self.frames and self._buf is self._head and not self._got)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int):
        return self._view[self._got:]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if self._got < len(self._view):
            return
        if self._buf is self._head:
            n, = LENGTH.unpack(self._head)
            if n > MAX_FRAME_BYTES:
                self._fail(ReadPortUnavailable(f"a frame of {n} bytes"))
                self.transport.close()
                return
            (self._buf, self._view), self._got = frame_buffer(n), 0
            if n:
                return
        self._view.release()   # (filled: no more writes into the frame's bytes)
        frame = self._buf
        self.frames.append(frame if type(frame) is bytes else bytes(frame))
        self._buf, self._view, self._got = self._head, memoryview(self._head), 0
        if len(self.frames) >= QUEUED_FRAMES and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc) -> None:
        self._fail(ReadPortUnavailable(f"read port connection closed{': ' + str(exc) if exc else ''}"))

    def eof_received(self):
        return False   # (closes the transport: connection_lost follows)

    def _fail(self, e: BaseException) -> None:
        if self.error is None:
            self.error = e
        self._wake()

    def _wake(self) -> None:
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    async def next_frame(self) -> bytes:
        while not self.frames:
            if self.error is not None:
                raise self.error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = self.frames.popleft()
        if self._paused and len(self.frames) < QUEUED_FRAMES and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ReadPortClient:
    """Range reads from one bookie's read port (``address``, host:port)."""

    def __init__(self, address: str):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad read port address {address!r}")
        self.address, self._host, self._port = address, host.strip("[]"), int(port)
        self._idle: list[_Connection] = []
        self.frames_read = 0     # frames taken over this port (tests, stats)
        self.requests = 0        # range reads asked over it (stats)
        self._closed = False
        global _open_clients
        _open_clients += 1

    async def _connection(self, pooled: bool = True) -> tuple[_Connection, bool]:
        """A connection, and whether it was kept from an earlier read."""
        while pooled and self._idle:
            c = self._idle.pop()
            if c.usable:
                return c, True
        if self._closed:
            raise ReadPortUnavailable(f"{self.address}: client closed")
        loop = asyncio.get_running_loop()
        try:
            _, c = await loop.create_connection(_Connection, self._host, self._port)
        except OSError as e:
            raise ReadPortUnavailable(f"{self.address}: {e}", connecting=True) from e
        return c, False

    async def read_range(self, request: pb.ReadRangeRequest) -> AsyncIterator[wire.RangeFrame]:
        """The frames of ``request`` (a plain read: bookie/read_port.py), to
        the one with status not OK or ``through`` at ``last_entry``.  A kept
        connection that fails before its first frame (the bookie restarted
        since) is replaced once."""
        message = framed(request.SerializeToString())
        self.requests += 1
        c, pooled = await self._connection()
        done = False
        try:
            c.transport.write(message)
            try:
                data = await c.next_frame()
            except ReadPortUnavailable:
                if not pooled:
                    raise
                c.close()
                c, _ = await self._connection(pooled=False)
                c.transport.write(message)
                data = await c.next_frame()
            while True:
                resp = wire.decode_range_frame(data)
                done = wire.ends_sparse_read(resp.status, resp.through, request.last_entry)
                self.frames_read += 1
                yield resp
                if done:
                    return
                data = await c.next_frame()
        finally:
            if done and c.usable and not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append(c)
            else:
                c.close()

    def close(self) -> None:
        """Closes the kept connections (one under a read ends with it); the
        last client of the process to close lets the kept frame buffers go."""
        if self._closed:
            return
        self._closed = True
        for c in self._idle:
            c.close()
        self._idle.clear()
        _client_closed()
