"""A bookie's read port: a reader's range reads over plain TCP, the records
sent from the journal's files by ``sendfile`` (issue 18).

Over gRPC a range read's records are copied from the page cache into a
frame, by gRPC into its buffers and HTTP/2 frames, and on the reader out of
them again; in a catch-up read of 64 KiB entries the reader spent half its
time in gRPC's receive and the bookie most of its time sending.  Here the
kernel moves the records from the page cache to the socket, and the reader
receives each frame straight into its buffer.

The port answers the reads a reader makes (``stream.ledger_read``) and
nothing else: sparse, checked by the reader (``reader_verifies``), with no
term and no flags.  A recovery's reads, which carry a term and may fence,
stay on gRPC, where the term is admitted; so does everything over TLS (a
bookie with TLS opens no read port), and a bookie behind a proxy registers
none unless told where it is reached (``--advertise-read-address``).

Wire, on one connection, one read at a time:

- request: a 4-byte little-endian length (at most ``MAX_REQUEST_BYTES``),
  then a ``ReadRangeRequest`` (proto/bookie.proto);
- answer: frames, each a 4-byte little-endian length, then a
  ``ReadRangeResponse``: byte for byte ReadRange's frames
  (``BookieService.sparse_frames``, ``wire.encode_range_frame``), read by
  the same ``wire.decode_range_frame``.  The answer ends with the frame
  whose status is not OK or whose ``through`` reaches ``last_entry``; the
  connection then takes the next request.  A request the port does not
  serve (undecodable, a bad range, a term, flags, not sparse, not checked
  by the reader) is answered by one BAD_REQUEST frame.  A length over the
  bound, a reader that takes nothing for ``SEND_TIMEOUT`` seconds, a
  request cut midway for as long, or no request for ``IDLE_TIMEOUT``,
  closes the connection.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
from array import array
from typing import TYPE_CHECKING

from bookie import wire
from bookie.core import Status
from bookie.index import spans_c, unpack_location
from bookie.journal import pread_exactly
from bookie.server import range_request_problem
from bookstream_pb import bookie_pb2 as pb

if TYPE_CHECKING:  # pragma: no cover
    from bookie.server import BookieService

log = logging.getLogger(__name__)

LENGTH = struct.Struct("<I")   # before each request and each frame (stream/read_port_client.py reads them)
MAX_REQUEST_BYTES = 64 << 10
MAX_CONNECTIONS = 1024
SEND_TIMEOUT = 60.0     # a reader that takes nothing this long: its connection is closed
IDLE_TIMEOUT = 300.0    # a connection with no request this long is closed (the client's kept ones reconnect)
SENDFILE_MIN_BYTES = 32 << 10   # a span shorter than this is read and sent with its neighbours
SENDMSG_MAX_PARTS = 16   # a frame's parts sent by one sendmsg up to this many; more are joined first
METHOD = "ReadPort"   # its answers in the bookie's metrics (bookie/metrics.py), beside ReadRange's


class FileSpan:
    """Records adjacent in one journal segment, by location (what
    ``Storage.read_sparse`` gives the read port instead of their bytes)."""

    __slots__ = ("loc", "length")

    def __init__(self, loc: int, length: int):
        self.loc, self.length = loc, length

    def __len__(self) -> int:
        return self.length

    def cut(self, starts, stops, length: int | None = None) -> "Pieces":
        """The pieces ``[start, stop)`` of this span (a striped read's
        records with gaps between them: bookie/striped_read.py ``_cut``;
        ``length``: their bytes in all, if known)."""
        return Pieces(self, starts, stops, length)


class Pieces:
    """The pieces of a span (``whole``), sent one after the other: bytes
    ``[starts[k], stops[k])`` of it, offsets from its first byte (lists of
    ints, or array('q') from bookie/_spans.c: no object per piece, a
    striped read's short arc sending a piece per few records)."""

    __slots__ = ("whole", "starts", "stops", "length")

    def __init__(self, whole: FileSpan, starts, stops, length: int | None = None):
        self.whole, self.starts, self.stops = whole, starts, stops
        self.length = sum(stops) - sum(starts) if length is None else length

    def __len__(self) -> int:
        return self.length


def plain_read_problem(request: pb.ReadRangeRequest) -> str:
    """Why the read port does not serve ``request`` ("" if it does)."""
    problem = range_request_problem(request)
    if problem:
        return problem
    if request.term or request.flags or not request.sparse or not request.reader_verifies:
        return "the read port serves sparse reads the reader verifies, with no term and no flags"
    return ""


class ReadPort:
    """The read port of a bookie's service: ``start`` listens, ``stop``
    closes it and every connection."""

    def __init__(self, service: "BookieService", host: str, port: int = 0):
        self.service, self.host, self.port = service, host, port
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self) -> int:
        """Listens; returns the port."""
        infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._listener = sock
        self.port = sock.getsockname()[1]
        self._accepting = asyncio.create_task(self._accept(), name="read-port")
        return self.port

    async def stop(self) -> None:
        tasks = [t for t in (self._accepting, *self._connections) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._listener)
            except OSError as e:  # (out of fds, ...: the port stays up)
                log.warning("read port: accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            if len(self._connections) >= MAX_CONNECTIONS:
                conn.close()
                continue
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = asyncio.create_task(self._serve(conn))
            self._connections.add(t)
            t.add_done_callback(self._connections.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            async for body in _requests(conn):
                await self._answer(conn, body)
        except (ConnectionError, asyncio.TimeoutError) as e:
            log.debug("read port: connection ended: %s", e)
        except OSError as e:
            log.info("read port: connection ended: %s", e)
        finally:
            conn.close()

    async def _answer(self, conn: socket.socket, body: bytes) -> None:
        """One request's answer; its metrics as ReadRange's, under the
        method name ReadPort."""
        service, request = self.service, None
        service.read_range_requests += 1
        t0 = time.perf_counter()
        try:
            try:
                request = pb.ReadRangeRequest.FromString(body)
                problem = plain_read_problem(request)
            except Exception as e:  # DecodeError, or anything else protobuf raises on junk
                problem = f"undecodable ReadRangeRequest: {e}"
            if problem:
                await self._send_refusal(conn, pb.ReadRangeResponse(status=Status.BAD_REQUEST, message=problem))
                return
            await self._read(conn, request)
        finally:
            service.metrics.answered(METHOD, request, time.perf_counter() - t0)

    async def _send_refusal(self, conn: socket.socket, resp: pb.ReadRangeResponse) -> None:
        self.service.metrics.response(METHOD, resp)
        await _send_bytes(conn, framed(resp.SerializeToString()))

    async def _read(self, conn: socket.socket, request: pb.ReadRangeRequest) -> None:
        service = self.service
        frames = service.sparse_frames(request.ledger_id, request.first_entry, request.last_entry,
                                       service.frame_bytes(request), request.stripe, request.residues,
                                       reader_verifies=True, read_at=FileSpan)
        journal = service.storage.journal
        try:
            await self._send_frames(conn, frames, journal)
        finally:
            frames.close()

    async def _send_frames(self, conn: socket.socket, frames, journal) -> None:
        for out in frames:
            if type(out) is not tuple:
                await self._send_refusal(conn, out)
                return
            status, recs, count, through, term = out
            size = sum(map(len, recs))
            head, tail = wire.range_frame_parts(status, size, count, through, term)
            # The segments' files, held for the frame from when it was read
            # from the index: a segment removed meanwhile (gc) stays
            # readable through its descriptor (a segment's bytes never change).
            fds = {}
            try:
                for rec in recs:
                    if type(rec) is not bytes:
                        seg = unpack_location((rec.whole if type(rec) is Pieces else rec).loc)[0]
                        if seg not in fds:
                            fds[seg] = os.dup(journal.read_fd(seg))
                await _send_frame(conn, LENGTH.pack(len(head) + size + len(tail)) + head, recs, tail, fds)
            finally:
                for fd in fds.values():
                    os.close(fd)


async def _send_frame(conn: socket.socket, head: bytes, recs: list, tail: bytes, fds: dict[int, int]) -> None:
    """A frame: ``head``, the records (bytes, a FileSpan or Pieces each),
    ``tail``.  Spans of at least SENDFILE_MIN_BYTES go by sendfile; shorter
    ones (and pieces shorter than that on average, a striped read's records
    around the ones it skips) are read and sent with what is around them:
    a sendfile per few KiB costs more than the copy it saves (and sendmsg
    of the pieces, no join, cost as much CPU as the join and a send)."""
    parts = [head]
    for rec in recs:
        if type(rec) is bytes:
            parts.append(rec)
            continue
        pieces = type(rec) is Pieces
        whole = rec.whole if pieces else rec
        seg, off = unpack_location(whole.loc)
        fd = fds[seg]
        if pieces and rec.length < SENDFILE_MIN_BYTES * len(rec.starts):
            if spans_c is not None and type(rec.starts) is array:   # (one pread, packed in C)
                parts.append(spans_c.gather(fd, off, whole.length, rec.starts, rec.stops, seg))
                continue
            mv = memoryview(pread_exactly(fd, whole.length, off, seg))
            parts.extend(map(mv.__getitem__, map(slice, rec.starts, rec.stops)))
            continue
        for a, b in (zip(rec.starts, rec.stops) if pieces else ((0, whole.length),)):
            if b - a < SENDFILE_MIN_BYTES:
                parts.append(pread_exactly(fd, b - a, off + a, seg))
                continue
            await _send_parts(conn, parts)
            parts = []
            await _send_file(conn, fd, off + a, b - a)
    parts.append(tail)
    await _send_parts(conn, parts)


async def _requests(conn: socket.socket):
    """The requests' bytes, one after the other, until the connection ends
    (or sends a length over MAX_REQUEST_BYTES).  asyncio.TimeoutError when
    no request comes for IDLE_TIMEOUT, or one stops coming in midway for
    SEND_TIMEOUT: a connection held open for nothing is not kept."""
    while True:
        head = await asyncio.wait_for(_recv_exactly(conn, LENGTH.size), IDLE_TIMEOUT)
        if head is None:
            return
        n, = LENGTH.unpack(head)
        if n > MAX_REQUEST_BYTES:
            log.info("read port: a request of %d bytes: closing the connection", n)
            return
        body = await asyncio.wait_for(_recv_exactly(conn, n), SEND_TIMEOUT) if n else b""
        if body is None:
            return
        yield body


def framed(message: bytes) -> bytes:
    """A request or a frame as the port's wire carries it: its length, then it."""
    return LENGTH.pack(len(message)) + message


async def _recv_exactly(conn: socket.socket, n: int) -> bytes | None:
    """``n`` bytes, or None at the end of the stream before the first."""
    loop = asyncio.get_running_loop()
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = await loop.sock_recv_into(conn, view[got:])
        if not k:
            if got:
                raise ConnectionError("connection closed within a request")
            return None
        got += k
    return bytes(buf)


async def _send_bytes(conn: socket.socket, data: bytes) -> None:
    # Sent at once if the socket takes it (a frame's head and tail, mostly:
    # no task, no timer); the rest when it can.
    try:
        n = conn.send(data)
    except BlockingIOError:
        n = 0
    if n < len(data):
        await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(conn, memoryview(data)[n:]), SEND_TIMEOUT)


async def _send_parts(conn: socket.socket, parts: list) -> None:
    """``parts`` (bytes-like) one after the other: up to SENDMSG_MAX_PARTS
    by sendmsg, with no copy to join them (a short arc's records, packed,
    between a frame's head and tail); more are joined and sent (the
    kernel's walk of hundreds of small pieces cost what a join does)."""
    if len(parts) == 1 or len(parts) > SENDMSG_MAX_PARTS:
        await _send_bytes(conn, parts[0] if len(parts) == 1 else b"".join(parts))
        return
    views = list(map(memoryview, parts))
    while True:
        try:
            n = conn.sendmsg(views)
        except BlockingIOError:
            n = 0
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            del views[0]
        if not views:
            return
        if n:
            views[0] = views[0][n:]
        await _writable(conn)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _time_out(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError(f"the reader took nothing for {SEND_TIMEOUT:g} s"))


async def _writable(conn: socket.socket) -> None:
    """Until ``conn`` takes more (asyncio.TimeoutError after SEND_TIMEOUT)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    fd = conn.fileno()
    loop.add_writer(fd, _wake, fut)
    timer = loop.call_later(SEND_TIMEOUT, _time_out, fut)
    try:
        await fut
    finally:
        timer.cancel()
        loop.remove_writer(fd)


async def _send_file(conn: socket.socket, fd: int, offset: int, count: int) -> None:
    """``count`` bytes of the file ``fd`` from ``offset`` to ``conn``, by
    the kernel (``os.sendfile``: no copy into this process).  A send cut
    short means the socket is full: wait for room rather than ask again."""
    out = conn.fileno()
    while count:
        try:
            n = os.sendfile(out, fd, offset, count)
        except BlockingIOError:
            await _writable(conn)
            continue
        if not n:
            raise OSError(f"journal segment ended at {offset} with {count} bytes of records to send")
        offset += n
        count -= n
        if count:
            await _writable(conn)
