"""Cost of the bookie metrics per add frame and per ReadEntry, as a ratio to building and
encoding one 1 KiB ReadEntryResponse in the same run (a load-independent reference).

    .venv/bin/python scripts/metrics_overhead.py
"""
import timeit
from bookie.metrics import BookieMetrics
from bookstream_pb import bookie_pb2 as pb
m = BookieMetrics()
n = 100000
acks = [pb.AddAck(frame_id=1)]
resp = pb.ReadEntryResponse(entry=b"x" * 1024)
req = pb.ReadEntryRequest()
ref = timeit.timeit(lambda: pb.ReadEntryResponse(entry=b"x" * 1024).SerializeToString(), number=n) / n
add = timeit.timeit(lambda: (m.added(100, 10000, 0.001), m.acked(acks)), number=n) / n
rd = timeit.timeit(lambda: (m.response("ReadEntry", resp), m.answered("ReadEntry", req, 0.001)), number=n) / n
print(f"reference (build + encode one 1 KiB ReadEntryResponse): {ref*1e6:.2f} us")
print(f"metrics per add frame: {add*1e6:.2f} us = {add/ref:.1f}x the reference")
print(f"metrics per ReadEntry: {rd*1e6:.2f} us = {rd/ref:.1f}x the reference")
