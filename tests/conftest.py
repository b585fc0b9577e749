"""Shared fixtures: real bookie processes on loopback."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

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


def start_bookies(base, etcd, cluster_name, n, first=0, extra_args=()):
    """n bookie processes registered in `cluster_name`, started in parallel."""
    def one(i):
        return BookieProcess(base / f"b{i}", etcd=etcd, cluster=cluster_name,
                             extra_args=["--registration-ttl", "3", *extra_args]).start()
    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(first, first + n)))
