"""The read port's ceiling: an empty server's read port (bookie/read_port.py's
wire and its sendfile), measured as ``ceilings.range_read_rate`` measures
gRPC's range read.

`EmptyReadPort` runs beside `EmptyBookie` in `python -m bench.ceilings
serve`: the bookie's `ReadPort` (its listener, connections and requests)
holding no ledgers; it reads a request's ``ledger_id`` as the entry size to
serve and sends frames of prebuilt entry records from a file (in the page
cache) by ``sendfile``, with the bookie's own frame parts and send helpers.
`read_port_rate` reads them with the client's own
`stream.read_port_client.ReadPortClient`.  So the figure is the transport
alone: TCP on loopback, the kernel's copy, the reader's receive of each
frame into its buffer, and no index, storage or walk.
"""
from __future__ import annotations

import os
import socket
import tempfile
import time

from bookie import entry as E
from bookie import wire
from bookie.read_port import LENGTH, ReadPort, _send_bytes, _send_file

RANGE_FRAME_BYTES = 1 << 20   # (stream.ledger_read's, as the reader asks)


class EmptyReadPort(ReadPort):
    def __init__(self, host: str = "127.0.0.1"):
        super().__init__(None, host, 0)
        self._files: dict[tuple[int, int], tuple[int, int]] = {}   # (size, frame bytes): (fd, records per frame)

    def _records(self, size: int, frame_bytes: int) -> tuple[int, int]:
        key = (size, frame_bytes)
        if key not in self._files:
            per = max(1, frame_bytes // (size + E.HEADER_SIZE))
            with tempfile.TemporaryFile() as f:
                f.write(E.encode(1, 0, os.urandom(size)) * per)
                f.flush()
                self._files[key] = (os.dup(f.fileno()), per)
        return self._files[key]

    async def _answer(self, conn: socket.socket, body: bytes) -> None:
        from bookstream_pb import bookie_pb2 as pb

        req = pb.ReadRangeRequest.FromString(body)
        size = req.ledger_id
        fd, per = self._records(size, req.max_frame_bytes or RANGE_FRAME_BYTES)
        first, last = req.first_entry, req.last_entry
        while first <= last:
            n = min(per, last - first + 1)
            nbytes = n * (size + E.HEADER_SIZE)
            through = first + n - 1
            h, t = wire.range_frame_parts(0, nbytes, n, through)
            await _send_bytes(conn, LENGTH.pack(len(h) + nbytes + len(t)) + h)   # (framed, its records sent after)
            await _send_file(conn, fd, 0, nbytes)
            await _send_bytes(conn, t)
            first = through + 1


async def read_port_rate(address: str, size: int, seconds: float, say=lambda msg: None) -> dict:
    """The read port ceiling: reads of ``size``-byte entries from one
    empty server's read port in the reader's 1 MiB frames, for
    ``seconds``: entries/s and MB/s."""
    from bookstream_pb import bookie_pb2 as pb
    from stream.read_port_client import ReadPortClient

    client = ReadPortClient(address)
    want = max(1, int(256 << 20) // (size + E.HEADER_SIZE))  # per call; repeated for `seconds`
    n = calls = 0
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds and calls < 100:
            req = pb.ReadRangeRequest(ledger_id=size, first_entry=0, last_entry=want - 1,
                                      max_frame_bytes=RANGE_FRAME_BYTES, sparse=True, reader_verifies=True)
            async for resp in client.read_range(req):
                n += resp.count
            calls += 1
        el = time.perf_counter() - t0
    finally:
        client.close()
    row = {"entry_bytes": size, "frame_bytes": RANGE_FRAME_BYTES, "entries_per_s": n / el,
           "mb_per_s": n * size / el / 1e6}
    say(f"ceiling read port, {size} B entries: {row['entries_per_s']:,.0f} entries/s, {row['mb_per_s']:.1f} MB/s")
    return row
