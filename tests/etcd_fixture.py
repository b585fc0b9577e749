"""Fixtures for tests that need a real etcd.  Import them into a test module:

    from tests.etcd_fixture import cluster, etcd_server, store  # noqa: F401

``etcd_server`` is one ManagedEtcd for the whole session (shared by every
module that imports it); ``cluster`` is a fresh cluster name per test, so
tests never see each other's keys.
"""
from __future__ import annotations

import re
import threading
import uuid
from typing import Callable, Generic, TypeVar

import pytest

from metadata.etcd_server import ManagedEtcd
from metadata.store import MetadataStore

T = TypeVar("T")

_lock = threading.Lock()
_server: ManagedEtcd | None = None
_users = 0


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory) -> ManagedEtcd:
    """A running etcd, started once per session.

    pytest makes one fixture definition per importing module, so the server
    is reference-counted here to be shared by all of them.
    """
    global _server, _users
    with _lock:
        if _server is None:
            _server = ManagedEtcd(tmp_path_factory.mktemp("etcd-session")).start()
        _users += 1
        server = _server
    yield server
    with _lock:
        _users -= 1
        if _users == 0:
            server.stop()
            _server = None


@pytest.fixture
def store(etcd_server) -> MetadataStore:
    s = MetadataStore(etcd_server.endpoint, timeout=5.0)
    yield s
    s.close()


@pytest.fixture
def cluster(request) -> str:
    """A cluster name unique to this test."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def prefix(cluster) -> str:
    """A raw key prefix unique to this test."""
    return f"/test/{cluster}/"


class Collector(Generic[T]):
    """Collects items from callbacks (watches, on_lost) and lets a test wait
    for one that matches, with a deadline: no sleeping."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self._cond = threading.Condition()

    def __call__(self, item: T) -> None:
        with self._cond:
            self.items.append(item)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[T], bool], timeout: float) -> T:
        """The first collected item matching ``predicate``; fails the test if
        none arrives within ``timeout`` seconds."""
        found: list[T] = []

        def match() -> bool:
            found[:] = [i for i in self.items if predicate(i)][:1]
            return bool(found)

        with self._cond:
            if not self._cond.wait_for(match, timeout):
                pytest.fail(f"no matching item within {timeout}s; got {self.items!r}")
        return found[0]

    def wait_count(self, count: int, timeout: float) -> list[T]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.items) >= count, timeout):
                pytest.fail(f"expected {count} items within {timeout}s; got {self.items!r}")
            return list(self.items)
