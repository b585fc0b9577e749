"""Writer and reader processes of the fault suite, on the public Stream API.

    python -m tests.fault.worker writer --etcd E --cluster C --name w1 --incarnation 1 --history H
    python -m tests.fault.worker reader ...

Each writes its history to ``--history``, one JSON object a line, with one
``os.write`` per line (a kill -9 loses nothing written; the last operation
is left without its outcome: unknown).

A writer takes the stream over (``open_writer``: a *session*, with the term
it got), then appends batches of unique payloads ``name.incarnation.session.seq``
one ``append_many`` at a time (the asyncio API: one task, so the appends
land in the order they are made).  Lines: ``open``, ``opened`` (term),
``open_fail``; ``invoke`` (seq, payload) before each batch is handed over,
then ``ok`` (first seq, count, first position: consecutive) or ``fail``
(the outcome is unknown: a failed append may still be recovered by the next
writer).  After any failure, or on SIGUSR1 (the nemesis's take-over), it
leaves the session and takes the stream over again; when fenced (duelling)
it waits a moment first.

A reader tails the stream from the start (each incarnation from EARLIEST;
after an error, from after the last record it saw) and logs every record
it reads (``read``: [position, payload] pairs).

``--api log`` does the same on classic ledgers-to-logs (stream/log.py): a
session is a leadership (``LogWriter.open``: fence the last two ledgers,
create one, CAS the list), a reader polls ``LogReader.read_all``.
``--mutant NAME`` runs the writer with a broken protocol rule
(stream/mutations.py), to show the checker catches what it breaks.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import time

from stream import errors as err
from stream.mutations import Mutations
from stream.stream import AsyncStreamClient, Position, StreamConfig

STREAM = "faults"
WORKER_READY = "WORKER_READY"


class History:
    def __init__(self, path: str, **common):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.common = common

    def emit(self, type: str, **fields) -> None:
        rec = {"t": round(time.time(), 4), "type": type, **self.common, **fields}
        os.write(self.fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())


def _err(e: BaseException) -> dict:
    return {"err": type(e).__name__, "msg": str(e)[:300]}


def stream_config(args) -> StreamConfig:
    return StreamConfig(ensemble_size=args.ensemble, write_quorum=args.write_quorum, ack_quorum=args.ack_quorum,
                        fragment_size_entries=args.fragment_entries)


async def run_writer(args, h: History, rng: random.Random, stop: asyncio.Event, takeover: asyncio.Event) -> None:
    mean_gap = args.batch_max / 2 / args.rate
    async with AsyncStreamClient(args.etcd, args.cluster, mutations=Mutations.of(args.mutant)) as sc:
        session = 0
        while not stop.is_set():
            session += 1
            h.emit("open", session=session)
            try:
                w = await asyncio.wait_for(sc.open_writer(args.stream, stream_config(args)), args.op_timeout)
            except Exception as e:
                h.emit("open_fail", session=session, **_err(e))
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                continue
            h.emit("opened", session=session, term=w.term)
            takeover.clear()
            seq, fenced = 0, False
            while not stop.is_set() and not takeover.is_set():
                n = rng.randint(1, args.batch_max)
                payloads = [f"{args.name}.{args.incarnation}.{session}.{seq + k}" for k in range(n)]
                for k, p in enumerate(payloads):
                    h.emit("invoke", session=session, seq=seq + k, payload=p)
                try:
                    ps = await asyncio.wait_for(w.append_many([p.encode() for p in payloads]), args.op_timeout)
                    h.emit("ok", session=session, seq=seq, n=n, pos=ps[0].entry_id, last=ps[-1].entry_id)
                except Exception as e:
                    h.emit("fail", session=session, seq=seq, n=n, **_err(e))
                    fenced = isinstance(e, err.WriterFenced)
                    break
                finally:
                    seq += n
                await asyncio.sleep(rng.expovariate(1.0 / mean_gap))
            h.emit("leave", session=session, takeover=takeover.is_set(), fenced=fenced)
            try:
                await asyncio.wait_for(w.close(), 5)
            except BaseException as e:  # a writer that failed may not close cleanly
                if isinstance(e, asyncio.CancelledError) and stop.is_set():
                    raise
            if fenced:
                await asyncio.sleep(rng.uniform(args.duel_min, args.duel_max))


# -- classic ledgers-to-logs (stream/log.py) -------------------------------------------------
# A log position (ledger, entry) is written as ledger << 32 | entry, which
# orders as the log does; a session is one leadership, on one ledger (its
# id plays the term's part: ids grow along the log's list).

LOG_SHIFT = 32


async def run_log_writer(args, h: History, rng: random.Random, stop: asyncio.Event, takeover: asyncio.Event) -> None:
    from stream.client import BookKeeperClient
    from stream.log import LogWriter
    mean_gap = args.batch_max / 2 / args.rate
    bk = BookKeeperClient(args.etcd, args.cluster, mutations=Mutations.of(args.mutant))
    try:
        session = 0
        while not stop.is_set():
            session += 1
            h.emit("open", session=session)
            lw = LogWriter(bk, args.stream, args.ensemble, args.write_quorum, args.ack_quorum)
            try:
                await asyncio.wait_for(lw.open(), args.op_timeout)
            except Exception as e:
                h.emit("open_fail", session=session, **_err(e))
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                continue
            h.emit("opened", session=session, term=lw.current_ledger.ledger_id)
            takeover.clear()
            seq, lost = 0, False
            while not stop.is_set() and not takeover.is_set():
                n = rng.randint(1, args.batch_max)
                payloads = [f"{args.name}.{args.incarnation}.{session}.{seq + k}" for k in range(n)]
                for k, p in enumerate(payloads):
                    h.emit("invoke", session=session, seq=seq + k, payload=p)
                try:
                    futs = [lw.append_async(p.encode()) for p in payloads]
                    ps = await asyncio.wait_for(asyncio.gather(*futs), args.op_timeout)
                    first = ps[0].ledger_id << LOG_SHIFT | ps[0].entry_id
                    h.emit("ok", session=session, seq=seq, n=n, pos=first,
                           last=ps[-1].ledger_id << LOG_SHIFT | ps[-1].entry_id)
                except Exception as e:
                    h.emit("fail", session=session, seq=seq, n=n, **_err(e))
                    lost = isinstance(e, (err.NotLeader, err.LedgerFenced))
                    break
                finally:
                    seq += n
                await asyncio.sleep(rng.expovariate(1.0 / mean_gap))
            h.emit("leave", session=session, takeover=takeover.is_set(), fenced=lost)
            try:
                await asyncio.wait_for(lw.close(), 5)
            except BaseException:
                pass
            if lost:
                await asyncio.sleep(rng.uniform(args.duel_min, args.duel_max))
    finally:
        await bk.close()


async def read_log(bk, name: str, after: int | None) -> list[tuple[int, str]]:
    """The log's records after position ``after`` (None: all), as (position, payload)."""
    from stream.log import LogPosition, LogReader
    start = None if after is None else LogPosition(after >> LOG_SHIFT, (after & ((1 << LOG_SHIFT) - 1)) + 1)
    recs = await LogReader(bk, name).read_all(start)
    return [(p.ledger_id << LOG_SHIFT | p.entry_id, e.payload.decode(errors="replace")) for p, e in recs]


async def run_log_reader(args, h: History, rng: random.Random, stop: asyncio.Event, takeover: asyncio.Event) -> None:
    from stream.client import BookKeeperClient
    last = None
    bk = BookKeeperClient(args.etcd, args.cluster)
    h.emit("reader_open", after=None)
    try:
        while not stop.is_set():
            try:
                recs = await asyncio.wait_for(read_log(bk, args.stream, last), args.op_timeout)
                if recs:
                    h.emit("read", recs=recs)
                    last = recs[-1][0]
            except Exception as e:
                h.emit("read_fail", **_err(e))
            await asyncio.sleep(0.3)  # a poll: LogReader has no tail
    finally:
        await bk.close()


async def run_reader(args, h: History, rng: random.Random, stop: asyncio.Event, takeover: asyncio.Event) -> None:
    last: Position | None = None
    async with AsyncStreamClient(args.etcd, args.cluster) as sc:
        while not stop.is_set():
            try:
                start = last if last is not None else Position.EARLIEST
                r = await asyncio.wait_for(sc.open_reader(args.stream, start, inclusive=last is None),
                                           args.op_timeout)
            except Exception as e:
                h.emit("open_fail", **_err(e))
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                continue
            h.emit("reader_open", after=None if last is None else last.entry_id)
            try:
                while not stop.is_set():
                    recs = await asyncio.wait_for(r.read(max_records=500, timeout=1.0), args.op_timeout)
                    if recs:
                        h.emit("read", recs=[[x.position.entry_id, x.payload.decode(errors="replace")]
                                             for x in recs])
                        last = recs[-1].position
            except Exception as e:
                h.emit("read_fail", **_err(e))
            try:
                await asyncio.wait_for(r.close(), 5)
            except BaseException:
                pass
            await asyncio.sleep(rng.uniform(0.1, 0.5))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fault.worker")
    p.add_argument("role", choices=["writer", "reader"])
    p.add_argument("--etcd", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--stream", default=STREAM)
    p.add_argument("--name", required=True)
    p.add_argument("--incarnation", type=int, default=1)
    p.add_argument("--history", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=150.0, help="appends/s (batches of 1..batch-max)")
    p.add_argument("--batch-max", type=int, default=4)
    p.add_argument("--op-timeout", type=float, default=30.0)
    p.add_argument("--duel-min", type=float, default=0.3)
    p.add_argument("--duel-max", type=float, default=2.0)
    p.add_argument("--ensemble", type=int, default=3)
    p.add_argument("--write-quorum", type=int, default=3)
    p.add_argument("--ack-quorum", type=int, default=2)
    p.add_argument("--fragment-entries", type=int, default=0)
    p.add_argument("--api", choices=["stream", "log"], default="stream",
                   help="the Stream API, or classic ledgers-to-logs (stream/log.py)")
    p.add_argument("--mutant", help="a broken protocol rule (stream/mutations.py), to show the checker catches it")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    h = History(args.history, proc=args.name, inc=args.incarnation)
    rng = random.Random(args.seed)

    async def go():
        stop, takeover = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, takeover.set)
        h.emit("start", pid=os.getpid(), role=args.role, api=args.api, mutant=args.mutant)
        print(WORKER_READY, flush=True)  # the nemesis may signal it from now on
        run = {("writer", "stream"): run_writer, ("reader", "stream"): run_reader,
               ("writer", "log"): run_log_writer, ("reader", "log"): run_log_reader}[args.role, args.api]
        task = asyncio.ensure_future(run(args, h, rng, stop, takeover))
        await stop.wait()
        task.cancel()
        try:
            await task
        except BaseException:
            pass
        h.emit("stop")

    asyncio.run(go())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
