"""Helpers for tests on a real bookie Storage (the ``storage`` fixture is
in tests/conftest.py)."""
from __future__ import annotations

import asyncio

from bookie.core import Status
from bookie.storage import Storage


async def admit_durably(s: Storage, frames: list[bytes]) -> None:
    """Admits each frame of records as the server does, and waits until
    all of them are durable (journalled and applied)."""
    futs = []
    for recs in frames:
        status, msg, runs = s.validate_frame(recs)
        assert status is Status.OK, msg
        refused, durable = s.admit_frame(recs, runs)
        assert not refused
        futs.append(durable)
    await asyncio.gather(*futs)
