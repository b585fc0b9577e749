"""A bookie's LAC long polls (``LongPollLac``: BookKeeper's
``readLastAddConfirmedLongPoll``): a reader tailing a ledger asks a bookie
for its LAC once it is above ``previous``, and the answer waits until it
is, or until the poll's timeout.

Every durable add of a ledger, and every explicit LAC, wakes the ledger's
polls (``wake``); each checks the LAC again and, not yet above its
``previous``, waits again, registered afresh (a wake takes the ledger's
waiters away; one left in the list it took would never be woken again).
The timeout is the poll's whole wait, however often it is woken."""
from __future__ import annotations

import asyncio
from typing import Callable


class LacWaiters:
    """The long polls waiting on each ledger's LAC.  ``lac_of(ledger id)``:
    the bookie's LAC of the ledger now (None: it does not know it)."""

    def __init__(self, lac_of: Callable[[int], int | None]) -> None:
        self._lac_of = lac_of
        self._waiting: dict[int, set[asyncio.Future]] = {}

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._waiting

    def _passed(self, ledger_id: int, previous: int) -> bool:
        lac = self._lac_of(ledger_id)
        return lac is not None and lac > previous

    async def wait(self, ledger_id: int, previous: int, timeout: float) -> None:
        """Returns once the ledger's LAC is above ``previous``, or after
        ``timeout`` seconds in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._passed(ledger_id, previous):
            left = deadline - loop.time()
            if left <= 0:
                return
            fut = loop.create_future()
            self._waiting.setdefault(ledger_id, set()).add(fut)
            try:
                await asyncio.wait_for(asyncio.shield(fut), left)
            except asyncio.TimeoutError:
                return
            finally:
                waiters = self._waiting.get(ledger_id)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiting[ledger_id]

    def wake(self, ledger_id: int) -> None:
        """The ledger's LAC may have moved: every poll waiting on it checks."""
        for fut in self._waiting.pop(ledger_id, ()):
            if not fut.done():
                fut.set_result(None)


__all__ = ["LacWaiters"]
