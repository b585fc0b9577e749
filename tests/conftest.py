"""Shared fixtures: real bookie processes on loopback."""
from __future__ import annotations

import asyncio

import pytest

from bookstream.processes import BookieProcess


@pytest.fixture
def bookies(tmp_path):
    """A factory of real bookie processes; all are killed at the end."""
    started: list[BookieProcess] = []

    def start(name: str = "b0", **kw) -> BookieProcess:
        b = BookieProcess(tmp_path / name, **kw).start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.kill()


def run(coro):
    """Runs a coroutine to completion in a fresh event loop."""
    return asyncio.run(coro)
