"""Range reads yield to adds on one bookie (issue 18: a catch-up reader must
not slow the writer's acks on the same bookies).

Scheduling only, no protocol: what a range read returns and in which frames
does not change, only when its next frame is read.  A bookie's range reads
share ``frames`` slots; a slot is held from the moment a frame is read from
storage until gRPC has taken it (the handler's ``yield`` returned), so at
most ``frames`` range-read frames are in flight on the bookie at once.
Before it reads a frame, a range read also gives the event loop one turn,
so add frames that arrived meanwhile (and the acks of the adds the journal
made durable) are handled first.

A slot is never waited for longer than ``max_wait_s``: a reader that stops
reading keeps its slot while gRPC cannot hand its frame on, and the other
range reads must not wait on it for ever (priority, never exclusion).

``frames=0`` turns it off (the code before: no bound, no turn given).
"""
from __future__ import annotations

import asyncio


class ReadGate:
    def __init__(self, frames: int = 0, max_wait_s: float = 0.05):
        self.frames = frames
        self.max_wait_s = max_wait_s
        self.in_flight = 0      # slots held now (over the limit only after a wait timed out)
        self.peak = 0           # the most held at once (tests; /metrics could show it)
        self.waits = 0          # frames that waited for a slot
        self.overruns = 0       # frames read after max_wait_s without a slot
        self._freed = asyncio.Event()

    async def acquire(self) -> bool:
        """Waits for a slot (at most max_wait_s); True when one was taken
        (then release it), False when the gate is off."""
        if not self.frames:
            return False
        await asyncio.sleep(0)  # one turn of the loop: adds and acks first
        if self.in_flight >= self.frames:
            self.waits += 1
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.max_wait_s
            while self.in_flight >= self.frames:
                left = deadline - loop.time()
                if left <= 0:
                    self.overruns += 1
                    break
                self._freed.clear()
                try:
                    await asyncio.wait_for(self._freed.wait(), left)
                except asyncio.TimeoutError:
                    pass
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return True

    def release(self) -> None:
        self.in_flight -= 1
        self._freed.set()
