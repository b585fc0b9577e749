"""The blocking classic-ledger client: :class:`SyncBookKeeperClient` (the
methods of ``stream.client.BookKeeperClient``, blocking) and its
:class:`SyncLedgerHandle`, over a :class:`BackgroundLoop` (an event loop in
a daemon thread, which ``stream.StreamClient`` and the Spark adapters run
on too).  ``from stream.client import SyncBookKeeperClient`` works as well.

    with SyncBookKeeperClient("127.0.0.1:2379") as bk:
        lh = bk.create_ledger(3, 2, 2)
        lh.add_entry(b"hello")
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Callable, Iterator

from metadata.ledgers import LedgerMetadata
from stream import errors as err
from stream.client import BookKeeperClient, ClientConfig
from stream.ledger import LedgerHandle


class BackgroundLoop:
    """An asyncio event loop in a daemon thread: what the blocking facades
    (SyncBookKeeperClient, stream.StreamClient) run their async clients on.

    Once :meth:`close` started, calls raise ClientClosed (a typed error, not
    the loop's RuntimeError), and a call still waiting when the loop stops
    gets ClientClosed too instead of waiting for ever."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._closing = False
        self._calls: set[concurrent.futures.Future] = set()  # run()s waiting
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float | None = None):
        """Runs a coroutine on the loop and waits for its result."""
        if self._closing:
            coro.close()
            raise err.ClientClosed("client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        self._calls.add(fut)
        try:
            return fut.result(timeout)
        except concurrent.futures.CancelledError:
            if self._closing:  # the close cancelled it with the loop's other tasks
                raise err.ClientClosed("client closed during the call") from None
            raise
        finally:
            self._calls.discard(fut)

    def call_soon(self, fn: Callable, *args) -> None:
        """Hands ``fn(*args)`` to the loop without waiting."""
        if self._closing:
            raise err.ClientClosed("client is closed")
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # closed meanwhile
            raise err.ClientClosed("client is closed") from None

    @property
    def closing(self) -> bool:
        """True once :meth:`close` started."""
        return self._closing

    @property
    def closed(self) -> bool:
        return self.loop.is_closed()

    def close(self, last=None) -> None:
        """Runs `last` (a coroutine: the client's close), cancels the tasks
        still on the loop (their callers get ClientClosed), then stops it."""
        if self._closing:
            if last is not None:
                last.close()
            return
        self._closing = True
        try:
            if last is not None:
                asyncio.run_coroutine_threadsafe(last, self.loop).result(30)
        finally:
            try:
                asyncio.run_coroutine_threadsafe(_cancel_tasks(), self.loop).result(10)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(10)
                self.loop.close()
                # a call that reached the loop after its tasks were cancelled
                # would otherwise wait for ever
                for fut in list(self._calls):
                    if not fut.cancel() and not fut.done():
                        fut.set_exception(err.ClientClosed("client closed during the call"))


async def _cancel_tasks() -> None:
    """Cancels every other task of the running loop and lets them unwind
    (as ``asyncio.run`` does at its end), rather than destroying them
    pending with the loop."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)
    # and finalizes the async generators still suspended (a blocking
    # reader's tail) here, not from the garbage collector after the loop closed
    await asyncio.get_running_loop().shutdown_asyncgens()


class SyncLedgerHandle:
    """A LedgerHandle driven from other threads (see SyncBookKeeperClient)."""

    def __init__(self, sync: "SyncBookKeeperClient", handle: LedgerHandle):
        self._s = sync
        self.handle = handle

    @property
    def ledger_id(self) -> int:
        return self.handle.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self.handle.last_add_confirmed

    @property
    def metadata(self) -> LedgerMetadata:
        return self.handle.metadata

    @property
    def is_closed(self) -> bool:
        return self.handle.is_closed

    def add_entry(self, payload: bytes) -> int:
        return self._s._run(self.handle.add_entry(payload))

    def add_entry_async(self, payload: bytes) -> concurrent.futures.Future:
        """Queued in call order; the future resolves to the entry id."""
        out: concurrent.futures.Future = concurrent.futures.Future()

        def go() -> None:
            try:
                fut = self.handle.add_entry_async(payload)
            except Exception as e:
                out.set_exception(e)
                return

            def done(f: asyncio.Future) -> None:
                if f.cancelled():
                    out.cancel()
                elif f.exception() is not None:
                    out.set_exception(f.exception())
                else:
                    out.set_result(f.result())
            fut.add_done_callback(done)

        self._s._bg.call_soon(go)
        return out

    def close(self) -> None:
        """Closes the ledger (writer) or releases the handle.  After the
        client's close, a reader's handle was released with it (a no-op
        here); a writer's raises ClientClosed: the ledger was left OPEN."""
        if self._s._bg.closing and self.handle._writer is None:
            return
        self._s._run(self.handle.close())

    def read_entries(self, first: int, last: int):
        return self._s._run(self.handle.read_entries(first, last))

    def read_entry(self, entry_id: int):
        return self._s._run(self.handle.read_entry(entry_id))

    def read_last_add_confirmed(self) -> int:
        return self._s._run(self.handle.read_last_add_confirmed())

    def long_poll_last_add_confirmed(self, previous: int, timeout: float) -> int:
        return self._s._run(self.handle.long_poll_last_add_confirmed(previous, timeout))

    def tail(self, start: int = 0, *, poll_timeout: float = 1.0) -> Iterator:
        agen = self.handle.tail(start, poll_timeout=poll_timeout)
        while True:
            try:
                yield self._s._run(agen.__anext__())
            except StopAsyncIteration:
                return

    def __enter__(self) -> "SyncLedgerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SyncBookKeeperClient:
    """BookKeeperClient's methods, blocking: the async client runs on an
    event loop in a background thread."""

    def __init__(self, etcd_endpoints: str | list[str], cluster: str = "default",
                 config: ClientConfig | None = None, **overrides):
        self._bg = BackgroundLoop("bookkeeper-client")
        self._loop = self._bg.loop

        async def make() -> BookKeeperClient:
            return BookKeeperClient(etcd_endpoints, cluster, config, **overrides)

        try:
            self.client = self._run(make())
        except BaseException:  # a bad argument: no loop thread left behind
            self._bg.close()
            raise

    def _run(self, coro, timeout: float | None = None):
        return self._bg.run(coro, timeout)

    def create_ledger(self, ensemble_size: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                      **kw) -> SyncLedgerHandle:
        return SyncLedgerHandle(self, self._run(self.client.create_ledger(ensemble_size, write_quorum,
                                                                           ack_quorum, **kw)))

    def open_ledger(self, ledger_id: int, recovery: bool = True, **kw) -> SyncLedgerHandle:
        return SyncLedgerHandle(self, self._run(self.client.open_ledger(ledger_id, recovery, **kw)))

    def delete_ledger(self, ledger_id: int) -> None:
        self._run(self.client.delete_ledger(ledger_id))

    def list_ledgers(self) -> list[int]:
        return self._run(self.client.list_ledgers())

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._run(self.client.ledger_metadata(ledger_id))

    def close(self) -> None:
        """Closes the client (see BookKeeperClient.close); later calls, and
        calls still waiting, raise ClientClosed.  Idempotent."""
        if not self._bg.closing:
            self._bg.close(self.client.close())

    def __enter__(self) -> "SyncBookKeeperClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["BackgroundLoop", "SyncBookKeeperClient", "SyncLedgerHandle"]
