"""One process per data dir (``bookie.storage.LOCK_FILE``, an flock held
for the life of the process): a second bookie on a held data dir is
refused before it reads or writes anything (exit code 3), a paused holder
included (a supervisor that took it for dead); once the holder is dead,
kill -9 included, the next one starts.  Without the lock, the second
process's replay would take the first one's records in flight for a torn
tail and cut them.  Real bookie processes."""
from __future__ import annotations

import os
import signal

import pytest

from bookie import entry as E
from bookie.core import Status
from bookie.storage import DataDirInUse, Storage
from bookstream.processes import BookieProcess, BookieStartError
from stream.bookie_client import BookieClient
from tests.conftest import run

LID = 5


def _journal(path) -> dict:
    return {p.name: p.read_bytes() for p in sorted((path / "journal").iterdir())}


async def _add(address: str, first: int, n: int) -> None:
    c = BookieClient(address)
    try:
        ack = await c.add(b"".join(E.encode(LID, e, b"held %d" % e, lac=e - 1) for e in range(first, first + n)))
        assert ack.status == Status.OK and not ack.errors, ack
    finally:
        await c.close()


async def _held(address: str, n: int) -> list[Status]:
    c = BookieClient(address)
    try:
        return [Status((await c.read_entry(LID, e)).status) for e in range(n)]
    finally:
        await c.close()


def test_a_second_bookie_on_a_held_data_dir_is_refused_until_the_holder_is_dead(bookies, tmp_path):
    a = bookies("b0")
    run(_add(a.address, 0, 10))
    second = BookieProcess(tmp_path / "b0")
    for paused in (False, True):
        if paused:
            os.kill(a.pid, signal.SIGSTOP)
        before = _journal(a.data_dir)
        with pytest.raises(BookieStartError, match="exited with 3"):
            second.start()
        assert f"is in use by another process (pid {a.pid})" in second.log_path.read_text()
        after = _journal(a.data_dir)                    # nothing cut or written over (a running holder
        assert after.keys() == before.keys() and all(   # may append: an idle journal's mark, bookie/journal.py)
            after[k].startswith(v) and (after[k] == v or not paused) for k, v in before.items())
    os.kill(a.pid, signal.SIGCONT)
    run(_add(a.address, 10, 5))                         # the holder serves on
    assert run(_held(a.address, 15)) == [Status.OK] * 15
    a.kill()
    second.start()
    try:
        assert run(_held(second.address, 15)) == [Status.OK] * 15
    finally:
        second.kill()


def test_the_lock_is_let_go_when_the_storage_closes_or_its_open_fails(tmp_path):
    s = Storage(tmp_path / "d")
    s.open()
    with pytest.raises(DataDirInUse, match=f"pid {os.getpid()}"):
        Storage(tmp_path / "d").open()
    s.close()
    (tmp_path / "d" / "checkpoint").write_bytes(b"not a checkpoint")   # (its open now fails)
    with pytest.raises(Exception, match="checkpoint"):
        Storage(tmp_path / "d").open()
    (tmp_path / "d" / "checkpoint").unlink()
    again = Storage(tmp_path / "d")
    again.open()                                        # (the failed open let the lock go)
    again.close()
