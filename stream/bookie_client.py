"""The client side of the bookie wire protocol (grpc.aio): a thin adapter.

One `BookieClient` per bookie holds one channel and one long-lived add stream.
`add_frame` sends a batch of entry records as one frame and returns a future
for its ack; acks arrive batched and are matched to frames by frame id.  The
add stream carries frames encoded by bookie/wire.py (protobuf's bytes, without
its copies): a writer encodes a frame once for all the bookies it goes to
(`add_encoded`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

import grpc

from bookie import wire
from bookie.core import Status
from bookie.server import MAX_MESSAGE_BYTES
from bookstream_pb import bookie_pb2 as pb
from bookstream_pb import bookie_pb2_grpc as pb_grpc
from stream.read_port_client import ReadPortClient, ReadPortUnavailable

log = logging.getLogger(__name__)

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # a ping every 10 s, idle or not, without limit (gRPC stops after two
    # pings with no data sent by default): a dead or partitioned bookie's
    # connection is found within keepalive_time + keepalive_timeout (20 s),
    # before the next call on it waits out its deadline.  The bookie accepts
    # this pace (bookie/server.py MIN_CLIENT_PING_INTERVAL_MS).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # a bookie that restarts is reached again within a second, not after
    # gRPC's default back-off (up to 2 minutes).  Not min_reconnect_backoff_ms:
    # gRPC takes it as the connect timeout too (100 ms failed connects on a
    # loaded machine: "timed out before receiving SETTINGS frame").
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # each channel its own subchannels: by default gRPC shares them between
    # channels to one address, so a fresh channel to a restarted bookie
    # (BookKeeperClient.refresh_bookies) would inherit the old one's back-off
    ("grpc.use_local_subchannel_pool", 1),
]


_ADD = pb.DESCRIPTOR.services_by_name["Bookie"].methods_by_name["Add"]
_ADD_PATH = f"/{_ADD.containing_service.full_name}/{_ADD.name}"
_RANGE_PATH = f"/{_ADD.containing_service.full_name}/ReadRange"


def status_of(code: int) -> Status | None:
    """A wire status code as a Status (None: a code this client does not know)."""
    try:
        return Status(code)
    except ValueError:
        return None


def decode_ack(ack: pb.AddAck, n: int) -> list[tuple[Status, int]] | None:
    """A write ack for a frame of ``n`` entries as per-entry (status, term),
    in the frame's order; None when every entry is OK (the common case).
    A status on the whole frame with no per-entry errors applies to every
    entry; an unknown code is INTERNAL_ERROR."""
    if ack.status == Status.OK and not ack.errors:
        return None
    errors = {e.index: e for e in ack.errors}
    whole = (status_of(ack.status) or Status.INTERNAL_ERROR) if ack.status != Status.OK and not errors else None
    out = []
    for k in range(n):
        e = errors.get(k)
        if e is not None:
            out.append((status_of(e.status) or Status.INTERNAL_ERROR, e.term))
        else:
            out.append((whole or Status.OK, 0))
    return out


class BookieUnavailable(ConnectionError):
    """The bookie could not be reached, or the add stream broke: every frame
    in flight on it has an unknown outcome."""

    retriable = True


# A read port that could not be reached is not tried again for this long
# (its reads go over gRPC meanwhile).
READ_PORT_RETRY_S = 10.0


def _read_port_client(read_address: str) -> ReadPortClient | None:
    try:
        return ReadPortClient(read_address)
    except ValueError as e:   # (a registration's bad address: gRPC alone)
        log.warning("%s", e)
        return None


class BookieClient:
    def __init__(self, address: str, tls=None, read_address: str = ""):
        self.address = address
        # bookie/read_port.py: a reader's plain range reads (never over TLS)
        self.read_port = _read_port_client(read_address) if read_address and tls is None else None
        self._read_port_down_until = 0.0
        self.channel = (grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) if tls is None else
                        grpc.aio.secure_channel(address, tls.channel_credentials(),
                                                options=CHANNEL_OPTIONS + tls.channel_options()))
        self.stub = pb_grpc.BookieStub(self.channel)
        self._add_method = self.channel.stream_stream(
            _ADD_PATH, request_serializer=None, response_deserializer=pb.AddAcks.FromString)
        self._read_range_raw = self.channel.unary_stream(
            _RANGE_PATH, request_serializer=pb.ReadRangeRequest.SerializeToString,
            response_deserializer=wire.decode_range_frame)
        self._pending: dict[int, asyncio.Future] = {}
        self._send_q: asyncio.Queue | None = None
        self._stream_task: asyncio.Task | None = None
        self._broken: BaseException | None = None

    # -- adds ----------------------------------------------------------------

    def _ensure_stream(self) -> None:
        if self._stream_task is not None and not self._stream_task.done():
            return
        self._send_q = asyncio.Queue()
        self._broken = None
        self._stream_task = asyncio.create_task(self._run_stream(self._send_q))

    async def _run_stream(self, q: asyncio.Queue) -> None:
        async def frames() -> AsyncIterator[bytes]:
            while True:
                frame = await q.get()
                if frame is None:
                    return
                yield frame

        call = self._add_method(frames())
        err = BookieUnavailable(f"{self.address}: add stream closed")
        try:
            async for msg in call:
                for ack in msg.acks:
                    fut = self._pending.pop(ack.frame_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(ack)
        except grpc.aio.AioRpcError as e:
            err = BookieUnavailable(f"{self.address}: {e.code().name}: {e.details()}")
        except asyncio.CancelledError:
            err = BookieUnavailable(f"{self.address}: client closed")
            raise
        finally:
            # End gRPC's task that feeds the call from frames(): once the call
            # has failed, call.cancel() no longer cancels it, and it would wait
            # on the queue for ever (destroyed pending with the loop).
            q.put_nowait(None)
            call.cancel()
            self._broken = err
            pending, self._pending = self._pending, {}
            for fut in pending.values():
                if not fut.done():
                    fut.set_exception(self._broken)

    def add_frame(self, entries: bytes) -> asyncio.Future:
        """Sends one frame of entry records (concatenated); the future
        resolves to its AddAck or fails with BookieUnavailable."""
        return self.add_records((entries,))

    def add_records(self, records: list[bytes] | tuple[bytes, ...], master_key: bytes = b"") -> asyncio.Future:
        """``add_frame`` of the records concatenated (one copy, into the
        message), with the ledger's ``master_key`` (stream/password.py)."""
        fid = next(wire.frame_ids)
        return self.add_encoded(fid, wire.encode_add_frame(fid, records, master_key))

    def add_encoded(self, frame_id: int, message: bytes) -> asyncio.Future:
        """``add_frame`` for a frame already encoded (``wire.encode_add_frame``
        with an id from ``wire.frame_ids``, which may have gone to other
        bookies too, never twice to this one while in flight)."""
        if frame_id in self._pending:
            raise ValueError(f"frame {frame_id} is already in flight to {self.address}")
        self._ensure_stream()
        fut = asyncio.get_running_loop().create_future()
        self._pending[frame_id] = fut
        self._send_q.put_nowait(message)
        return fut

    async def add(self, entries: bytes, timeout: float | None = 30.0, master_key: bytes = b"") -> pb.AddAck:
        return await asyncio.wait_for(self.add_records((entries,), master_key), timeout)

    # -- reads -----------------------------------------------------------------

    async def _unary(self, method, request, timeout):
        try:
            return await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise BookieUnavailable(f"{self.address}: {e.code().name}: {e.details()}") from e

    async def read_entry(self, ledger_id: int, entry_id: int, *, term: int = 0, fence: bool = False,
                         timeout: float | None = 10.0, master_key: bytes = b"") -> pb.ReadEntryResponse:
        req = pb.ReadEntryRequest(ledger_id=ledger_id, entry_id=entry_id, term=term,
                                  flags=pb.READ_FENCE if fence else 0, master_key=master_key)
        return await self._unary(self.stub.ReadEntry, req, timeout)

    async def read_lac(self, ledger_id: int, *, term: int = 0, fence: bool = False,
                       timeout: float | None = 10.0, master_key: bytes = b"") -> pb.ReadLacResponse:
        req = pb.ReadLacRequest(ledger_id=ledger_id, term=term, flags=pb.READ_FENCE if fence else 0,
                                master_key=master_key)
        return await self._unary(self.stub.ReadLac, req, timeout)

    async def long_poll_lac(self, ledger_id: int, previous_lac: int, timeout_s: float) -> pb.ReadLacResponse:
        req = pb.LongPollLacRequest(ledger_id=ledger_id, previous_lac=previous_lac, timeout_ms=int(timeout_s * 1000))
        return await self._unary(self.stub.LongPollLac, req, timeout_s + 10.0)

    async def write_lac(self, ledger_id: int, lac: int, lafr: int, term: int = 0,
                        timeout: float | None = 10.0, master_key: bytes = b"") -> pb.WriteLacResponse:
        req = pb.WriteLacRequest(ledger_id=ledger_id, lac=lac, lafr=lafr, term=term, master_key=master_key)
        return await self._unary(self.stub.WriteLac, req, timeout)

    async def prepare(self, ledger_id: int, first_entry: int, term: int,
                      timeout: float | None = 10.0, master_key: bytes = b"") -> pb.PrepareResponse:
        req = pb.PrepareRequest(ledger_id=ledger_id, first_entry=first_entry, term=term, master_key=master_key)
        return await self._unary(self.stub.Prepare, req, timeout)

    async def read_range(self, ledger_id: int, first: int, last: int, *, max_frame_bytes: int = 0,
                         term: int = 0, fence: bool = False, sparse: bool = False,
                         frame_timeout: float | None = None, stripe: int = 0, residues: int = 0,
                         raw: bool = False, master_key: bytes = b"",
                         reader_verifies: bool = False) -> AsyncIterator[pb.ReadRangeResponse]:
        """The frames of a range read (proto/bookie.proto ReadRangeRequest);
        ``frame_timeout``: the longest wait for each frame (then
        asyncio.TimeoutError, and the call is cancelled); ``stripe`` and
        ``residues``: a striped reader's share (sparse reads only); ``raw``:
        frames as ``wire.RangeFrame`` (entries a view into the message,
        no protobuf copies); ``reader_verifies``: the caller checks every
        record's checksum, the bookie need not (proto/bookie.proto)."""
        req = pb.ReadRangeRequest(ledger_id=ledger_id, first_entry=first, last_entry=last,
                                  max_frame_bytes=max_frame_bytes, term=term,
                                  flags=pb.READ_FENCE if fence else 0, sparse=sparse,
                                  stripe=stripe, residues=residues, master_key=master_key,
                                  reader_verifies=reader_verifies)
        if (self.read_port is not None and raw and sparse and reader_verifies and not term and not fence
                and time.monotonic() >= self._read_port_down_until):
            frames = self._read_port_range(req, frame_timeout)
            try:
                first_frame = await frames.__anext__()
            except StopAsyncIteration:   # (no frame: not what a bookie answers, but nothing to yield)
                return
            except ReadPortUnavailable as e:
                log.warning("%s: read port %s unreachable (%s): reads over gRPC for %.0f s", self.address,
                            self.read_port.address, e, READ_PORT_RETRY_S)
                self._read_port_down_until = time.monotonic() + READ_PORT_RETRY_S
            else:
                try:
                    yield first_frame
                    async for resp in frames:
                        yield resp
                finally:
                    await frames.aclose()
                return
        call = (self._read_range_raw if raw else self.stub.ReadRange)(req)
        try:
            while True:
                resp = await asyncio.wait_for(call.read(), frame_timeout)
                if resp is grpc.aio.EOF:
                    return
                yield resp
        except grpc.aio.AioRpcError as e:
            raise BookieUnavailable(f"{self.address}: {e.code().name}: {e.details()}") from e
        finally:
            if not call.done():
                call.cancel()

    async def _read_port_range(self, req: pb.ReadRangeRequest, frame_timeout: float | None):
        frames = self.read_port.read_range(req)
        try:
            while True:
                try:
                    resp = await asyncio.wait_for(frames.__anext__(), frame_timeout)
                except StopAsyncIteration:
                    return
                except ReadPortUnavailable as e:
                    if e.connecting:
                        raise   # (read_range reads over gRPC instead)
                    raise BookieUnavailable(f"{self.address}: read port: {e}") from e
                except (ConnectionError, wire.MalformedFrame) as e:
                    raise BookieUnavailable(f"{self.address}: read port: {e}") from e
                yield resp
        finally:
            await frames.aclose()

    async def delete(self, ledger_id: int, entry_range: tuple[int, int] | None = None,
                     timeout: float | None = 30.0, master_key: bytes = b"",
                     copy_token: int = 0) -> pb.DeleteResponse:
        """Deletes the ledger, or a range of its entries; ``copy_token`` (a
        range only) makes it a copy's clearing, fenced by that token
        (proto/bookie.proto DeleteRequest)."""
        if entry_range is None:
            req = pb.DeleteRequest(ledger_id=ledger_id, master_key=master_key)
        else:
            req = pb.DeleteRequest(ledger_id=ledger_id, has_range=True, master_key=master_key,
                                   first_entry=entry_range[0], last_entry=entry_range[1], copy_token=copy_token)
        return await self._unary(self.stub.Delete, req, timeout)

    async def info(self, timeout: float | None = 10.0) -> pb.InfoResponse:
        return await self._unary(self.stub.Info, pb.InfoRequest(), timeout)

    async def close(self) -> None:
        if self._send_q is not None:
            self._send_q.put_nowait(None)
        if self._stream_task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._stream_task), 2.0)
            except (asyncio.TimeoutError, Exception):
                self._stream_task.cancel()
        if self.read_port is not None:
            self.read_port.close()
        await self.channel.close()

