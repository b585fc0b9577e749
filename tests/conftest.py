"""Shared fixtures: real bookie processes on loopback."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from bookstream.processes import BookieProcess
from tests.etcd_fixture import cluster, etcd_server, prefix, store  # noqa: F401  (fixtures for every module)


@pytest.fixture(autouse=True)
def _root_log_level_as_it_was():
    """A CLI's main run in-process (``bookstream.logs.setup``: the admin
    commands set ERROR) sets the root logger's level for the process; put
    it back, or every later test in this process loses its warnings."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.fixture
def storage(tmp_path):
    """A real bookie Storage (journal segments and index) in the test's directory."""
    from bookie.storage import Storage
    st = Storage(tmp_path / "b")
    st.open()
    yield st
    st.close()


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


@pytest.fixture(scope="module")
def shared(etcd_server, tmp_path_factory, request):
    """Four bookies in a cluster of the test module's own, for the tests that
    do not hurt bookies."""
    name = f"{request.module.__name__.rsplit('.', 1)[-1]}-{uuid.uuid4().hex[:8]}".replace("_", "-")
    procs = start_bookies(tmp_path_factory.mktemp("shared"), etcd_server.endpoint, name, 4)
    yield SimpleNamespace(endpoint=etcd_server.endpoint, cluster=name, bookies=procs)
    for p in procs:
        p.kill()


@pytest.fixture
def own(etcd_server, tmp_path, cluster):
    """start(n): n fresh bookies in a cluster of this test's own (killed,
    and resumed first if stopped, at the end)."""
    procs: list[BookieProcess] = []

    def start(n, extra_args=()):
        procs.extend(start_bookies(tmp_path, etcd_server.endpoint, cluster, n, first=len(procs),
                                   extra_args=extra_args))
        return procs

    yield SimpleNamespace(endpoint=etcd_server.endpoint, cluster=cluster, start=start, bookies=procs)
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except (ProcessLookupError, AssertionError):
            pass
        p.kill()
