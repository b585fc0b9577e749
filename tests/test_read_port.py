"""A bookie's read port (bookie/read_port.py) on real bookie processes:
byte for byte ReadRange's frames, sent from the journal's files; only the
plain reads a reader makes; and a stream reader that reads through it,
falls back to gRPC when it cannot reach it, and fails over when its bookie
dies mid-read."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import sys
import threading
import uuid

import pytest

from bookie import entry as E
from bookie import wire
from bookie.core import Status
from bookstream_pb import bookie_pb2 as pb
from stream.bookie_client import BookieClient, BookieUnavailable
from stream.client import ClientConfig
from stream.read_port_client import ReadPortClient
from stream.stream import AsyncStreamClient, Position, StreamConfig
from tests.conftest import run

OK = Status.OK
LENGTH = struct.Struct("<I")


def rec(ledger: int, entry: int, size: int) -> bytes:
    return E.encode(ledger, entry, bytes([entry % 251]) * size)


def frame_fields(f) -> tuple:
    return (f.status, f.count, f.through, f.term, bytes(f.entries), f.message)


async def both(b, ledger: int, first: int, last: int, **kw) -> tuple[list, list]:
    """The frames of one sparse read the reader's way, over gRPC and over
    the read port, as comparable tuples."""
    kw = dict(sparse=True, raw=True, reader_verifies=True, **kw)
    grpc_only = BookieClient(b.address)
    ported = BookieClient(b.address, read_address=b.read_address)
    try:
        over_grpc = [frame_fields(f) async for f in grpc_only.read_range(ledger, first, last, **kw)]
        over_port = [frame_fields(f) async for f in ported.read_range(ledger, first, last, **kw)]
        assert ported.read_port.frames_read == len(over_port)   # (it did go over the port)
        return over_grpc, over_port
    finally:
        await grpc_only.close()
        await ported.close()


def test_the_read_port_sends_readranges_frames_byte_for_byte(bookies):
    """Dense runs, striped residues, records of two ledgers interleaved on
    disk (a striped span read with gaps: sent piece by piece), small frames,
    a ledger the bookie does not know: the same frames as ReadRange's."""
    b = bookies()
    assert b.read_address

    async def go():
        c = BookieClient(b.address)
        try:
            assert (await c.add(b"".join(rec(21, i, 700) for i in range(300)))).status == OK
            for i in range(0, 400, 4):   # ledgers 22 and 23 interleaved, 4 ids at a time
                assert (await c.add(b"".join(rec(22, k, 90 + k % 7) for k in range(i, i + 4)))).status == OK
                assert (await c.add(b"".join(rec(23, k, 40) for k in range(i, i + 4)))).status == OK
            for i in range(40):   # records of 40 KiB with a small one of another ledger between each two
                assert (await c.add(rec(25, i, 40 << 10))).status == OK
                assert (await c.add(rec(26, i, 100))).status == OK
            held = [i for i in range(200) if i % 5 != 2]
            assert (await c.add(b"".join(rec(24, i, 300) for i in held))).status == OK
        finally:
            await c.close()
        cases = [
            (21, 0, 299, {}),
            (21, 0, 299, {"max_frame_bytes": 5000}),
            (21, 250, 1000, {"max_frame_bytes": 3000}),
            (22, 0, 399, {"stripe": 4, "residues": 0b0110}),
            (22, 3, 390, {"stripe": 4, "residues": 0b1001, "max_frame_bytes": 700}),
            (22, 0, 399, {"stripe": 5, "residues": 0b10101}),
            (23, 0, 399, {"max_frame_bytes": 1000}),
            (25, 0, 39, {}),
            (25, 0, 39, {"stripe": 1, "residues": 1}),      # one span, its pieces sent by sendfile
            (25, 1, 38, {"stripe": 3, "residues": 0b101, "max_frame_bytes": 200_000}),
            (24, 0, 199, {}),
            (24, 0, 199, {"stripe": 5, "residues": 0b11011}),
            (99, 0, 10, {}),
        ]
        for ledger, first, last, kw in cases:
            over_grpc, over_port = await both(b, ledger, first, last, **kw)
            assert over_port == over_grpc, (ledger, first, last, kw)
            assert over_port[-1][2] == last or over_port[-1][0] != OK
        # (the cases' frames hold records: the comparison is not of empty frames)
        frames = (await both(b, 22, 0, 399, stripe=4, residues=0b0110))[1]
        ids = [h.entry_id for f in frames for h in E.iter_headers(f[4])]
        assert ids == [i for i in range(400) if i % 4 in (1, 2)]
    run(go())


async def raw_exchange(address: str, payload: bytes, frames: int = 1) -> list[pb.ReadRangeResponse]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(payload)
        out = []
        for _ in range(frames):
            n, = LENGTH.unpack(await reader.readexactly(4))
            out.append(pb.ReadRangeResponse.FromString(await reader.readexactly(n)))
        return out
    finally:
        writer.close()


def framed(req: pb.ReadRangeRequest | bytes) -> bytes:
    body = req if isinstance(req, bytes) else req.SerializeToString()
    return LENGTH.pack(len(body)) + body


def test_the_read_port_serves_plain_reads_only_and_refuses_junk(bookies):
    """A term, a fence, a dense read, a read the bookie must check, a bad
    range, junk: one BAD_REQUEST frame each, and the connection goes on to
    the next request; a length over the bound closes it."""
    b = bookies()

    async def go():
        c = BookieClient(b.address)
        try:
            assert (await c.add(b"".join(rec(31, i, 100) for i in range(10)))).status == OK
        finally:
            await c.close()
        plain = dict(ledger_id=31, first_entry=0, last_entry=9, sparse=True, reader_verifies=True)
        refused = [
            pb.ReadRangeRequest(**{**plain, "term": 3}),
            pb.ReadRangeRequest(**plain, flags=pb.READ_FENCE),
            pb.ReadRangeRequest(**{**plain, "sparse": False}),
            pb.ReadRangeRequest(**{**plain, "reader_verifies": False}),
            pb.ReadRangeRequest(**{**plain, "first_entry": 5, "last_entry": 4}),
            pb.ReadRangeRequest(**plain, stripe=65, residues=1),
            b"\xff\xff\xff\xff junk",
        ]
        good = framed(pb.ReadRangeRequest(**plain))
        for req in refused:
            no, yes = await raw_exchange(b.read_address, framed(req) + good, frames=2)
            assert no.status == Status.BAD_REQUEST and no.message, req
            assert yes.status == OK and yes.count == 10 and yes.through == 9   # the next request is served
        host, port = b.read_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(LENGTH.pack(1 << 30))
        assert await reader.read() == b""   # closed, nothing sent
        writer.close()
    run(go())


def test_an_abandoned_read_closes_its_connection_and_a_finished_one_is_kept(bookies):
    b = bookies()

    async def go():
        c = BookieClient(b.address)
        try:
            assert (await c.add(b"".join(rec(41, i, 1000) for i in range(100)))).status == OK
        finally:
            await c.close()
        port = ReadPortClient(b.read_address)
        req = pb.ReadRangeRequest(ledger_id=41, first_entry=0, last_entry=99, sparse=True, reader_verifies=True,
                                  max_frame_bytes=2000)
        try:
            frames = port.read_range(req)
            first = await frames.__anext__()
            assert first.status == OK and first.through < 99
            await frames.aclose()       # frames of this answer are still coming: not reusable
            assert port._idle == []
            got = [f async for f in port.read_range(req)]
            assert got[-1].through == 99 and sum(f.count for f in got) == 100
            assert len(port._idle) == 1
            again = [f async for f in port.read_range(req)]   # on the kept connection
            assert [frame_fields(f) for f in again] == [frame_fields(f) for f in got]
            assert len(port._idle) == 1
        finally:
            port.close()
    run(go())


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_read_port_nobody_answers_sends_the_read_over_grpc(bookies):
    b = bookies()

    async def go():
        c = BookieClient(b.address, read_address=f"127.0.0.1:{free_port()}")
        bad = BookieClient(b.address, read_address="no port here")   # (a registration's junk: gRPC alone)
        try:
            assert bad.read_port is None
            assert (await c.add(b"".join(rec(51, i, 100) for i in range(20)))).status == OK
            frames = [f async for f in c.read_range(51, 0, 19, sparse=True, raw=True, reader_verifies=True)]
            assert sum(f.count for f in frames) == 20 and c.read_port.frames_read == 0
            frames = [f async for f in bad.read_range(51, 0, 19, sparse=True, raw=True, reader_verifies=True)]
            assert sum(f.count for f in frames) == 20
        finally:
            await c.close()
            await bad.close()
    run(go())


def sname() -> str:
    return f"rp-{uuid.uuid4().hex[:8]}"


async def write(sc: AsyncStreamClient, name: str, config: StreamConfig, payloads: list[bytes]) -> None:
    w = await sc.open_writer(name, config)
    for k in range(0, len(payloads), 200):
        await w.append_many(payloads[k:k + 200])
    await w.close()


async def read_all(sc: AsyncStreamClient, name: str) -> list[bytes]:
    r = await sc.open_reader(name, Position.EARLIEST)
    out = []
    try:
        while True:
            got = await r.read(500)
            if not got:
                return out
            out.extend(x.payload for x in got)
    finally:
        await r.close()


def port_frames(sc: AsyncStreamClient) -> int:
    return sum(bc.read_port.frames_read for bc in sc.bk._bookies.values() if bc.read_port is not None)


@pytest.mark.parametrize("ensemble", [(3, 3), (4, 2)], ids=["E3-Qw3", "E4-Qw2"])
def test_stream_readers_read_through_the_read_ports(own, ensemble):
    """Registered read ports carry a stream's catch-up reads (Qw = E and
    striped), every record back in order; a client told not to use them,
    or bookies that open none, read the same over gRPC."""
    procs = own.start(4)
    assert all(p.read_address for p in procs)
    e, qw = ensemble
    payloads = [os.urandom(50 + i % 900) for i in range(3000)]

    async def go():
        name = sname()
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            await write(sc, name, StreamConfig(ensemble_size=e, write_quorum=qw, ack_quorum=2), payloads)
            assert await read_all(sc, name) == payloads
            assert port_frames(sc) > 0
        async with AsyncStreamClient(own.endpoint, own.cluster, config=ClientConfig(read_port=False)) as sc:
            assert await read_all(sc, name) == payloads
            assert port_frames(sc) == 0 and all(bc.read_port is None for bc in sc.bk._bookies.values())
    run(go())


def test_a_bookie_behind_a_proxy_opens_a_read_port_only_where_told_how_clients_reach_it(own):
    """With --advertise-address (clients reach the bookie through something
    in front of it) and no --advertise-read-address, no read port is opened
    (none left listening that no registration names); with both, the port
    opens and the advertised address is registered."""
    def listening(pid: int) -> set[int]:   # the TCP ports the process listens on (/proc: its sockets' inodes)
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for row in list(f)[1:]:
                    col = row.split()
                    if col[3] == "0A" and col[9] in inodes:   # (0A: LISTEN)
                        ports.add(int(col[1].rsplit(":", 1)[1], 16))
        return ports

    front, grpc_port = f"127.0.0.1:{free_port()}", free_port()
    hidden = own.start(1, extra_args=["--port", str(grpc_port), "--advertise-address", front])[-1]
    assert hidden.address == front and hidden.read_address == "" and not hidden._read_port
    assert listening(hidden.pid) == {grpc_port}
    read_front, grpc_port = f"127.0.0.1:{free_port()}", free_port()
    told = own.start(1, extra_args=["--port", str(grpc_port), "--advertise-address", front,
                                    "--advertise-read-address", read_front])[-1]
    assert told.read_address == read_front and told._read_port
    assert listening(told.pid) == {grpc_port, told._read_port}


def test_bookies_without_a_read_port_register_none(own):
    procs = own.start(3, extra_args=["--no-read-port"])
    assert not any(p.read_address for p in procs)

    async def go():
        name = sname()
        payloads = [os.urandom(200) for _ in range(500)]
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            await write(sc, name, StreamConfig(ensemble_size=3, write_quorum=3, ack_quorum=2), payloads)
            assert await read_all(sc, name) == payloads
            assert all(bc.read_port is None for bc in sc.bk._bookies.values())
    run(go())


def test_a_bookie_killed_mid_read_over_its_read_port_is_read_around(own):
    """kill -9 of the bookie a reader is reading from, between two of its
    read port's frames: the read goes on from the other replicas, nothing
    lost, nothing twice."""
    procs = own.start(3)
    payloads = [os.urandom(4000) for _ in range(4000)]

    async def go():
        name = sname()
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            await write(sc, name, StreamConfig(ensemble_size=3, write_quorum=3, ack_quorum=2), payloads)
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            r = await sc.open_reader(name, Position.EARLIEST, read_ahead_bytes=1 << 20)
            out = [x.payload for x in await r.read(100)]
            serving = [p for p in procs if sc.bk._bookies.get(p.bookie_id) is not None
                       and sc.bk._bookies[p.bookie_id].read_port.frames_read]
            assert serving, "no bookie served the first read over its read port"
            os.kill(serving[0].pid, signal.SIGKILL)
            try:
                while len(out) < len(payloads):
                    got = await r.read(500)
                    if not got:
                        break
                    out.extend(x.payload for x in got)
            finally:
                await r.close()
            assert out == payloads
    run(go())


def test_a_frame_is_the_same_bytes_wire_decodes():
    """The frame the read port builds from its parts is encode_range_frame's."""
    recs = [b"a" * 10, b"bc" * 7]
    for args in [(0, 2, 9, 3), (Status.NO_SUCH_LEDGER, 0, 0, 0), (0, 1, 2 ** 62, 2 ** 40)]:
        status, count, through, term = args
        head, tail = wire.range_frame_parts(status, sum(map(len, recs)), count, through, term)
        frame = head + b"".join(recs) + tail
        assert frame == wire.encode_range_frame(status, recs, count, through, term)
        f = wire.decode_range_frame(frame)
        assert (f.status, f.count, f.through, f.term, bytes(f.entries)) == (status, count, through, term,
                                                                            b"".join(recs))


def test_unavailable_is_what_a_broken_read_port_raises(bookies):
    """A read port connection cut mid-answer: BookieUnavailable, as a
    broken gRPC call."""
    b = bookies()

    async def go():
        c = BookieClient(b.address, read_address=b.read_address)
        try:
            assert (await c.add(b"".join(rec(61, i, 60_000) for i in range(200)))).status == OK
            frames = c.read_range(61, 0, 199, sparse=True, raw=True, reader_verifies=True, max_frame_bytes=100_000)
            assert (await frames.__anext__()).status == OK
            os.kill(b.pid, signal.SIGKILL)
            with pytest.raises(BookieUnavailable):
                async for _ in frames:
                    pass
        finally:
            await c.close()
    run(go())


def test_a_connection_that_asks_nothing_or_stops_midway_is_not_kept(monkeypatch):
    """The read port's request loop (``bookie.read_port._requests``) on a
    socket pair: requests come out whole; no request for IDLE_TIMEOUT, or
    a request cut midway for SEND_TIMEOUT, ends it (the port then closes
    the connection); a length over the bound ends it at once."""
    from bookie import read_port

    monkeypatch.setattr(read_port, "IDLE_TIMEOUT", 0.2)
    monkeypatch.setattr(read_port, "SEND_TIMEOUT", 0.2)

    async def go():
        a, b = socket.socketpair()
        a.setblocking(False)
        try:
            b.sendall(framed(b"one") + framed(b"") + framed(b"three"))
            reqs = read_port._requests(a)
            assert [await reqs.__anext__() for _ in range(3)] == [b"one", b"", b"three"]
            with pytest.raises(asyncio.TimeoutError):   # nothing more asked
                await reqs.__anext__()
            reqs = read_port._requests(a)
            b.sendall(LENGTH.pack(10) + b"abc")            # a request cut midway
            with pytest.raises(asyncio.TimeoutError):
                await reqs.__anext__()
            reqs = read_port._requests(a)
            b.sendall(LENGTH.pack(read_port.MAX_REQUEST_BYTES + 1))
            with pytest.raises(StopAsyncIteration):
                await reqs.__anext__()
        finally:
            a.close()
            b.close()
    run(go())


def test_sends_wait_for_room_and_give_up_on_a_reader_that_takes_nothing(monkeypatch, tmp_path):
    """The port's sends (``_send_bytes``, ``_send_file``, ``_send_parts``)
    on a socket pair: to a reader that takes everything, bytes, a file's
    span, then parts by sendmsg (a piece cut mid-way whenever the socket
    fills) and parts joined arrive whole and in order; to one that takes
    nothing, each gives up after SEND_TIMEOUT."""
    from bookie import read_port

    monkeypatch.setattr(read_port, "SEND_TIMEOUT", 0.3)
    data = os.urandom(8 << 20)
    seg = tmp_path / "segment"
    seg.write_bytes(data)

    async def go():
        a, b = socket.socketpair()
        a.setblocking(False)
        fd = os.open(seg, os.O_RDONLY)
        got = bytearray()

        def take_all():
            b.settimeout(10)   # (bytes lost: the assert below says so, not a hang)
            while len(got) < len(data):
                try:
                    chunk = b.recv(1 << 20)
                except socket.timeout:
                    return
                if not chunk:
                    return
                got.extend(chunk)

        try:
            reader = threading.Thread(target=take_all)
            reader.start()
            await read_port._send_bytes(a, data[:3 << 20])
            await read_port._send_file(a, fd, 3 << 20, 4 << 20)
            cuts = [7 << 20, (7 << 20) + 5, (7 << 20) + 5, (7 << 20) + 300_001, (15 << 19) - 7]
            parts = [data[x:y] for x, y in zip(cuts, cuts[1:] + [15 << 19])]   # (one empty)
            assert 1 < len(parts) <= read_port.SENDMSG_MAX_PARTS
            await read_port._send_parts(a, parts)
            many = [data[x:x + 1000] for x in range(15 << 19, 8 << 20, 1000)]   # (sent joined)
            assert len(many) > read_port.SENDMSG_MAX_PARTS
            await read_port._send_parts(a, many)
            await asyncio.get_running_loop().run_in_executor(None, reader.join)
            assert got == data
            with pytest.raises(asyncio.TimeoutError):
                await read_port._send_file(a, fd, 0, len(data))
            with pytest.raises(asyncio.TimeoutError):
                await read_port._send_bytes(a, data)
            with pytest.raises(asyncio.TimeoutError):
                await read_port._send_parts(a, [data[:10], data])
        finally:
            os.close(fd)
            a.close()
            b.close()
    run(go())


def test_the_last_read_port_client_to_close_lets_the_frame_buffers_go(monkeypatch):
    """The frame buffers a process keeps (``bookie._records.frame_buffer``)
    stay while a read port client is open, and go when the last one closes
    (closing twice counts once)."""
    from stream import read_port_client

    records = read_port_client._records   # (the module whose pool the client lets go)
    if records is None or not hasattr(records, "frame_pool"):
        pytest.skip("the C module is not built")
    monkeypatch.setattr(read_port_client, "_open_clients", 0)
    records.frame_pool(True)
    one, two = ReadPortClient("127.0.0.1:1"), ReadPortClient("127.0.0.1:2")
    b, view = read_port_client.frame_buffer(1 << 20)
    view.release()
    del b
    if sys.version_info < (3, 13):
        assert records.frame_pool()[2] == 1
    one.close()
    one.close()
    if sys.version_info < (3, 13):
        assert records.frame_pool()[2] == 1
    two.close()
    assert records.frame_pool()[2:] == (0, 0) and read_port_client._open_clients == 0
