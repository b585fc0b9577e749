"""A bookie's data dir as a whole: the lock one process holds on it, what
a damaged one is, and how a damaged one is set aside.

A data dir holds the bookie's data (the journal, the checkpoint, the FORMAT,
cookie and scrub files) beside what is not data: its id (``bookie.id``),
its log, its lock, its lease, and the etcd revision and mark it noted
(``bookie/cookie.py``; kept, they still refuse an etcd gone back in time).

A damaged data dir (``DamagedDataDir``, raised by ``Storage.open``) lost
part of what the bookie acknowledged; served, it would answer "no such
entry" for entries it acknowledged.  Its way back is a lost disk's
(bookie/cookie.py): with ``--on-lost-disk rejoin`` the bookie takes it
itself, ``set_aside`` moving the data into ``damaged-<UTC time>/`` inside
the data dir (kept for a look, never read again: the operator removes it),
so that the cookie finds the data lost and the bookie waits, serving
nothing, until autorecovery has copied what the id held elsewhere, then
starts empty under it.  The journal moves first: a start cut off midway
finds a checkpoint without its segments, damaged again, and sets the rest
aside then; nothing in between opens as a data dir holding less than it
acknowledged.
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from bookie.journal import _fsync_dir

LOCK_FILE = "lock"   # flock'ed for the life of the process that opened the storage; holds its pid
# What set_aside moves, in this order (the journal first: see the module doc).
DATA = ("journal", "checkpoint", "checkpoint.tmp", "FORMAT", "cookie", "scrubbed")
SET_ASIDE_PREFIX = "damaged-"
REASON_FILE = "REASON"


class DamagedDataDir(RuntimeError):
    """The data dir lost part of what the bookie acknowledged (``Storage.open``):
    a journal segment or the checkpoint gone, a segment cut short, a record
    lost before later ones.  Served, it would answer "no such entry" for
    entries it acknowledged; the bookie refuses to start (its way back is a
    lost disk's, bookie/cookie.py; ``set_aside``)."""


class DataDirInUse(RuntimeError):
    """Another process holds the data dir's lock (``LOCK_FILE``): a bookie
    still running there, or paused (a supervisor that took it for dead).
    Two processes appending to one journal would each take the other's
    records in flight for a torn tail and cut them, acknowledged or not."""


def lock_data_dir(path: Path) -> int:
    """The data dir's lock, taken (released when its fd closes, or its
    process dies, kill -9 included)."""
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DataDirInUse(f"{path} is in use by another process (pid {holder}): a bookie runs there, or is "
                           "paused; stop it first (two processes on one journal would cut each other's "
                           "records)") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def set_aside(data_dir: Path, reason: str, now: float | None = None) -> Path:
    """Moves a damaged data dir's data (``DATA``) into a new
    ``damaged-<UTC time>`` directory inside it, with a ``REASON`` file
    saying why; returns that directory.  Takes the data dir's lock for it
    (DataDirInUse if another process holds it)."""
    data_dir = Path(data_dir)
    fd = lock_data_dir(data_dir)
    try:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
        to, n = data_dir / f"{SET_ASIDE_PREFIX}{stamp}", 1
        while to.exists():
            n += 1
            to = data_dir / f"{SET_ASIDE_PREFIX}{stamp}-{n}"
        to.mkdir()
        (to / REASON_FILE).write_text(reason.rstrip() + "\n")
        for name in DATA:
            if (data_dir / name).exists():
                os.rename(data_dir / name, to / name)
                _fsync_dir(data_dir)   # (each move durable before the next: the order is what a crash keeps)
        _fsync_dir(to)
        return to
    finally:
        os.close(fd)


def set_aside_dirs(data_dir: Path) -> list[Path]:
    """The damaged data a data dir keeps set aside, oldest first."""
    return sorted(p for p in Path(data_dir).glob(SET_ASIDE_PREFIX + "*") if p.is_dir())


def set_aside_bytes(data_dir: Path) -> int:
    """The bytes of the files under the data dir's set-aside directories
    (what `bookies info` shows: space an operator may take back)."""
    total = 0
    for top in set_aside_dirs(data_dir):
        for root, _dirs, files in os.walk(top):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except FileNotFoundError:   # (being removed meanwhile)
                    pass
    return total
