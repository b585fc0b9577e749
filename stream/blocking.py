"""The blocking Stream API: :class:`StreamClient` runs an
``AsyncStreamClient`` on an event loop in a background thread; appends cross
over to it in batches (``linger``, ``max_batch_bytes``).  Re-exported by
``stream.stream``."""
from __future__ import annotations

import asyncio
import collections
import collections.abc
import concurrent.futures
import functools
import itertools
import logging
import threading
import weakref
from typing import Iterator

from stream import errors as err
from stream.client import ClientConfig
from stream.sync_client import BackgroundLoop
from stream.position import Position, Record
from stream.record_batch import RecordBatch
from stream.stream import READ_AHEAD_BYTES, AsyncStreamClient, AsyncStreamReader, AsyncStreamWriter, StreamConfig

log = logging.getLogger("stream.stream")


class StreamClient:
    """The blocking Stream API: an AsyncStreamClient on an event loop in a
    background thread."""

    def __init__(self, etcd_endpoints: str | list[str], cluster: str = "default",
                 config: ClientConfig | None = None, **overrides):
        self._bg = BackgroundLoop("bookstream-client")
        self._loop = self._bg.loop
        self._writers: weakref.WeakSet[StreamWriter] = weakref.WeakSet()  # ended with the client

        async def make() -> AsyncStreamClient:
            return AsyncStreamClient(etcd_endpoints, cluster, config, **overrides)

        try:
            self.aio = self._run(make())
        except BaseException:  # a bad argument: no loop thread left behind
            self._bg.close()
            raise

    def _run(self, coro, timeout: float | None = None):
        return self._bg.run(coro, timeout)

    def open_writer(self, name: str, config: StreamConfig | None = None, *, create: bool = True) -> "StreamWriter":
        config = config or StreamConfig()
        w = StreamWriter(self, self._run(self.aio.open_writer(name, config, create=create)), config)
        self._writers.add(w)
        return w

    def open_reader(self, name: str, start: Position = Position.EARLIEST, *, inclusive: bool = True,
                    read_ahead_bytes: int = READ_AHEAD_BYTES, max_read_bytes_per_s: float = 0,
                    password: bytes | str | None = None) -> "StreamReader":
        return StreamReader(self, self._run(self.aio.open_reader(name, start, inclusive=inclusive,
                                                                 read_ahead_bytes=read_ahead_bytes,
                                                                 max_read_bytes_per_s=max_read_bytes_per_s,
                                                                 password=password)))

    def trim(self, name: str, before: Position) -> int:
        return self._run(self.aio.trim(name, before))

    def stream_info(self, name: str) -> dict:
        return self._run(self.aio.stream_info(name))

    def list_streams(self) -> list[str]:
        return self._run(self.aio.list_streams())

    def delete_stream(self, name: str) -> None:
        self._run(self.aio.delete_stream(name))

    @property
    def closing(self) -> bool:
        """True once :meth:`close` started."""
        return self._bg.closing

    def close(self) -> None:
        """Closes the client and, first, the writers and readers still open
        (see AsyncStreamClient.close): appends still lingering in a writer's
        batch are handed over and acknowledged (or fail with ClientClosed);
        afterwards every call raises ClientClosed, and closing a writer or a
        reader is a no-op.  Idempotent."""
        if self._bg.closing:
            return
        writers = list(self._writers)
        for w in writers:
            w._refuse_appends()
        self._bg.close(self._close(writers))

    async def _close(self, writers: "list[StreamWriter]") -> None:
        for w in writers:
            w._hand_over()  # the last batch, before the writer's end flushes it
        timeout = self.aio.bk.config.add_timeout
        await asyncio.gather(*(w._handed_over(timeout) for w in writers))
        await self.aio.close()

    def __enter__(self) -> "StreamClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StreamWriter:
    """The blocking writer.  Appends from the caller's thread are gathered
    into batches (``linger`` seconds, or ``max_batch_bytes``) and handed to
    the event loop in one call, so a batch costs one thread hop."""

    def __init__(self, sc: StreamClient, aw: AsyncStreamWriter, config: StreamConfig):
        self._sc, self.aio = sc, aw
        self.linger, self.max_batch_bytes = config.linger, config.max_batch_bytes
        self._lock = threading.Lock()
        self._batch: list[tuple[bytes, concurrent.futures.Future]] = []
        self._batch_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        # parts refused for want of room, in order, and the task queueing them (on the loop)
        self._waiting: collections.deque[list[tuple[bytes, concurrent.futures.Future]]] = collections.deque()
        self._drainer: asyncio.Task | None = None

    @property
    def term(self) -> int:
        return self.aio.term

    def append_async(self, payload: bytes) -> concurrent.futures.Future:
        """Queues an append; the future resolves to its Position."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:  # the client's close refuses appends under it (_refuse_appends)
            if self._closed:
                raise self._closed_error()
            first = not self._batch
            self._batch.append((bytes(payload), fut))
            self._batch_bytes += len(payload)
            full = self._batch_bytes >= self.max_batch_bytes
        try:
            if full:
                self._sc._bg.call_soon(self._hand_over)
            elif first:
                self._sc._bg.call_soon(self._arm)
        except err.ClientClosed:
            pass  # queued before the close refused appends: the close hands it over
        return fut

    def _closed_error(self) -> err.BookKeeperError:
        if self._sc.closing:
            return err.ClientClosed(f"stream {self.aio.name!r}: the client is closed")
        return err.LedgerClosed(f"stream {self.aio.name!r}: writer closed")

    def _refuse_appends(self) -> None:
        """The client is closing: appends are refused from now on.  Under the
        lock, so an append racing with the close is either refused or in the
        batch that the close hands over."""
        with self._lock:
            self._closed = True

    def _arm(self) -> None:
        """On the loop: hand the batch over after the linger time."""
        if self._timer is None:
            self._timer = self._sc._loop.call_later(self.linger, self._hand_over)

    def _hand_over(self) -> None:
        """On the loop: every queued append goes to the async writer, in
        order.  A part refused for want of room waits in ``_waiting`` with
        every part handed over after it (one drainer task queues them as
        room appears), so no later, smaller batch overtakes it: the appends
        of one thread land in the order they were made."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lock:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
        # One add call per part (one asyncio future, not one per append);
        # a batch larger than half the window goes in parts.
        step = max(1, self.aio.handle.client.config.max_pending_adds // 2)
        parts = [batch[k:k + step] for k in range(0, len(batch), step)]
        if self._waiting:  # earlier appends wait for room: these go after them
            self._waiting.extend(parts)
            return
        for k, part in enumerate(parts):
            try:
                af = self.aio.append_many_async([p for p, _ in part])
            except err.TooManyPendingAdds:
                # window full: this part and the rest wait for room, in order
                self._waiting.extend(parts[k:])
                self._drainer = self._sc._loop.create_task(self._drain_waiting())
                return
            except Exception as e:
                e = err.translate(e)
                for _, fut in part:
                    _settle(fut, exc=e)
                continue
            af.add_done_callback(functools.partial(_copy_results, [f for _, f in part]))

    async def _drain_waiting(self) -> None:
        """Queues the waiting parts in order, each as soon as it fits."""
        waiting = self._waiting
        try:
            while waiting:
                part = waiting[0]
                try:
                    af = self.aio.append_many_async([p for p, _ in part])
                except err.TooManyPendingAdds:
                    await self.aio.handle._writer.progress()  # an ack, a failure: look again
                    continue
                except Exception as e:
                    e = err.translate(e)
                    for _, fut in waiting.popleft():
                        _settle(fut, exc=e)
                    continue
                waiting.popleft()
                af.add_done_callback(functools.partial(_copy_results, [f for _, f in part]))
        except asyncio.CancelledError:  # the client's close: no caller waits for ever
            e = err.ClientClosed(f"stream {self.aio.name!r}: the client closed")
            while waiting:
                for _, fut in waiting.popleft():
                    _settle(fut, exc=e)
            raise
        finally:
            self._drainer = None

    async def _handed_over(self, timeout: float | None = None) -> None:
        """Waits until no append waits for room any more (all queued)."""
        d = self._drainer
        if d is not None:
            await asyncio.wait([d], timeout=timeout)

    def append(self, payload: bytes) -> Position:
        """Appends and waits for the acknowledgement."""
        fut = self.append_async(payload)
        self.flush_batch()
        return fut.result()

    def flush_batch(self) -> None:
        """Hands the queued appends to the writer now (no linger)."""
        try:
            self._sc._bg.call_soon(self._hand_over)
        except err.ClientClosed:
            pass  # the client's close handed them over

    def flush(self) -> None:
        """Waits until every append issued so far is acknowledged (or
        failed).  Once the client closed, none is left to wait for."""
        try:
            self._sc._run(self._flush())
        except err.ClientClosed:
            pass  # the client's close flushed this writer, and ended it

    async def _flush(self) -> None:
        self._hand_over()
        await self._handed_over()
        await self.aio.flush()

    def close(self) -> None:
        """Flushes and stops writing (see AsyncStreamWriter.close); a no-op
        once the client closed (its close ended the writer)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        try:
            self._sc._run(self.aio.close())
        except err.ClientClosed:
            pass  # closed meanwhile: the client's close ended the writer

    def __enter__(self) -> "StreamWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _copy_results(targets: list[concurrent.futures.Future], source: asyncio.Future) -> None:
    """A batch's outcome, to the futures of its appends."""
    if source.cancelled():
        for t in targets:
            t.cancel()
        return
    e = source.exception()
    for t, pos in zip(targets, source.result() if e is None else itertools.repeat(None)):
        _settle(t, pos, e)


def _settle(fut: concurrent.futures.Future, result=None, exc: BaseException | None = None) -> None:
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass  # the application cancelled it


class StreamReader:
    """The blocking reader; iterating it tails the stream for ever."""

    def __init__(self, sc: StreamClient, ar: AsyncStreamReader):
        self._sc, self.aio = sc, ar

    @property
    def position(self) -> Position:
        return self.aio.position

    def seek(self, position: Position, *, inclusive: bool = True) -> None:
        self._sc._run(_call(self.aio.seek, position, inclusive=inclusive))

    def read(self, max_records: int = 1000, timeout: float = 0.0) -> list[Record]:
        return self._sc._run(self.aio.read(max_records, timeout))

    def read_batch(self, max_records: int = 1000, timeout: float = 0.0) -> RecordBatch:
        """The next records as a ``RecordBatch`` (``AsyncStreamReader.read_batch``)."""
        return self._sc._run(self.aio.read_batch(max_records, timeout))

    def next(self, timeout: float | None = None) -> Record | None:
        return self._sc._run(self.aio.next(timeout))

    def __iter__(self) -> Iterator[Record]:
        while True:
            yield self.next()

    def close(self) -> None:
        """A no-op once the client closed (its close closed the reader)."""
        try:
            self._sc._run(self.aio.close())
        except err.ClientClosed:
            pass

    def __enter__(self) -> "StreamReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _call(fn, *args, **kw):
    return fn(*args, **kw)



__all__ = ["StreamClient", "StreamWriter", "StreamReader"]
