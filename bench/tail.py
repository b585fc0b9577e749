"""`bookstream bench tail`: how soon a tailing reader gets what a writer
appends (a log's end-to-end latency: what a Pulsar consumer sees).

A writer appends at a fixed rate (open loop: each append at its scheduled
time, whatever the acks do), each payload carrying that time; a reader of
another client tails the stream (``read(timeout=)``: its LAC long polls).
Per record: the append's ack latency, and its delivery, from the scheduled
time to the reader's ``read`` returning it.  The floor is the ack: a
record can be read once a LAC covers it, which the bookies learn after
the writer's ack (from the next add's piggybacked LAC, or the writer's
explicit LAC once it goes quiet: ``explicit_lac_delay``).  A delivery near
the reader's poll timeout means a long poll that was not woken.

    bookstream bench tail [--rates 10,100,1000] [--seconds 5] [--size 100] [--out tail.json]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import struct
import time
from pathlib import Path

from bench.ceilings import pct as _pct
from bench.single import _cluster, _write_results, add_data_args, int_list
from bookstream.tuning import tune_process

STAMP = struct.Struct("<d")


async def tail_latency(endpoint: str, cluster: str, name: str, rate: float, seconds: float, size: int) -> dict:
    """One stream, one writer at ``rate`` appends/s for ``seconds``, one
    tailing reader (its own client); the latencies in ms."""
    from stream.stream import AsyncStreamClient, StreamConfig

    pad = os.urandom(max(0, size - STAMP.size))
    n = max(1, round(rate * seconds))
    acks: list[float] = []
    delivered: list[float] = []
    async with AsyncStreamClient(endpoint, cluster) as wc, AsyncStreamClient(endpoint, cluster) as rc:
        w = await wc.open_writer(name, StreamConfig(3, 3, 2))
        await w.append(STAMP.pack(time.perf_counter()) + pad)   # (the stream exists for the reader)
        r = await rc.open_reader(name)
        poll_timeout = r.poll_timeout
        await r.read(10, timeout=5.0)

        async def read_all() -> None:
            while len(delivered) < n:
                for rec in await r.read(1000, timeout=1.0):
                    delivered.append(time.perf_counter() - STAMP.unpack_from(rec.payload)[0])

        reader = asyncio.ensure_future(read_all())
        pending = []
        t0 = time.perf_counter()
        for k in range(n):
            t_sched = t0 + k / rate
            await asyncio.sleep(max(0.0, t_sched - time.perf_counter()))
            f = w.append_async(STAMP.pack(t_sched) + pad)
            f.add_done_callback(lambda _f, t=t_sched: acks.append(time.perf_counter() - t))
            pending.append(f)
        await asyncio.gather(*pending)
        await asyncio.wait_for(reader, 30.0)
        await w.close()
    ms = lambda xs, q: _pct(xs, q) * 1e3   # noqa: E731
    return {"rate": rate, "entry_bytes": size, "records": n, "poll_timeout_s": poll_timeout,
            "ack_p50_ms": ms(acks, 0.5), "ack_p99_ms": ms(acks, 0.99),
            "delivery_p50_ms": ms(delivered, 0.5), "delivery_p99_ms": ms(delivered, 0.99),
            "delivery_max_ms": max(delivered) * 1e3,
            "delivery_p50_to_ack_p50": _pct(delivered, 0.5) / _pct(acks, 0.5),
            "at_poll_timeout": sum(1 for d in delivered if d >= poll_timeout * 0.8)}


def cmd_bench_tail(args: argparse.Namespace) -> int:
    tune_process()
    results = []

    async def go():
        for rate in int_list(args.rates):
            x = await tail_latency(cluster.etcd_endpoint, cluster.cluster, f"tail-{rate}-{os.getpid()}", rate,
                                   args.seconds, args.size)
            results.append(x)
            print(f"tail, {x['entry_bytes']} B at {rate:,}/s: delivered p50 {x['delivery_p50_ms']:.2f} ms, "
                  f"p99 {x['delivery_p99_ms']:.2f} ms, max {x['delivery_max_ms']:.2f} ms; the append's ack p50 "
                  f"{x['ack_p50_ms']:.2f} ms, p99 {x['ack_p99_ms']:.2f} ms (delivery p50 "
                  f"{x['delivery_p50_to_ack_p50']:.2f}x the ack's; {x['at_poll_timeout']} of {x['records']} "
                  f"near the reader's poll timeout)", flush=True)

    with _cluster(args, args.bookies) as cluster:
        asyncio.run(go())
    _write_results(args, "tail", results)
    return 0


def add_parser(bsub) -> None:
    p = bsub.add_parser("tail", help="a tailing reader's delivery latency beside the append's ack")
    p.add_argument("--rates", default="10,100,1000", help="appends/s offered (one stream each)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--size", type=int, default=100, help="entry bytes (at least 8: the send time)")
    p.add_argument("--bookies", type=int, default=3)
    add_data_args(p)
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=cmd_bench_tail)


__all__ = ["tail_latency", "add_parser"]
