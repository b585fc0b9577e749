"""The journal: segmented append-only files with group commit.

The journal is the bookie's only write path and also its entry log: index
locations point into journal segments, so an entry is written once.

Its records' format: ``bookie/journal_record.py``.  A torn tail
(a record cut short, or failing its CRCs, after a crash) is detected on open
and cut off: everything after it in that segment is discarded, and it is never
served.  Only the newest segment holding records can have one: a segment is
begun only once the one before it is durable (``_open_write_segment``), so
a bad record followed by a segment holding records is a loss of the disk's,
and the scan refuses it (``JournalDamaged``) rather than cut acknowledged
records off.

Inside the newest segment, a torn tail is told from a record that rotted
after it was made durable by the segment's marks (R_MARK): every group
commit that appends to a segment already holding records begins with one,
whose body is its own segment and offset.  The flusher writes a batch only
once the one before it is durable, so a mark says every byte before it was
durable when it was written.  A bad record with a valid mark after it is
the disk's loss (``JournalDamaged``); one with no mark after it is what a
crash leaves, and cut.  A journal idle for ``MARK_IDLE_S`` after a commit,
one being closed, and one opened after its replay (what it kept, fsynced
first) write a mark of their own, so only the commits of the last moments
before a power loss are left unmarked.  Marks are the journal's own: the
scan never yields them.

Group commit: ``append`` only buffers; ``sync()`` returns once everything
appended before the call is written and fdatasync'ed.  One flusher thread does
the writes and the fdatasync for every record that arrived in the meantime,
from every client, so one fsync covers many frames.

Preallocation (``preallocate``, off by default): once a quarter of a segment
is written, a thread prepares the next one: a file of ``segment_size`` zeros
under a name the scan ignores (``segment-N.log.prep``), written 1 MiB and one
fdatasync at a time with pauses between (one burst held up the journal's
own fsyncs), renamed into place when the journal rolls (a roll never waits
for it: without one ready it appends a new file).  Overwriting blocks that
already exist makes an fdatasync write only the data (appending also writes
the file's new size and extents through the filesystem's own journal), so
syncs are cheaper.  It stays off because it did not lower the open loop's
latency (the time goes to CPU, not fsync), and zero-filling doubles the
bytes written, which large appends, near the disk's ceiling, cannot spare
(figures: bench/notes.md).  A
record header is never all zeros (its type is not 0), so a scan ends cleanly
where a segment's zeros begin; a remainder that is not all zeros is a torn
tail, as before.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

from bookie.journal_record import (
    MARK_BODY, MARK_SIZE, R_MARK, RECORD_HEADER, RECORD_HEADER_SIZE, JournalPosition, ScannedRecord, frame_record,
    mark_after, record_at,
)

log = logging.getLogger(__name__)

MARK_IDLE_S = 1.0   # a journal idle this long after a commit marks its end

SEGMENT_NAME = re.compile(r"^segment-(\d{10})\.log$")
PREPARED_SUFFIX = ".prep"
IOV_MAX = 512
_ZEROS = bytes(1 << 20)

# How long each group commit took (its writes and its fdatasync, in the
# flusher): bucket i counts those under SYNC_BUCKET_BOUNDS_US[i] and at least
# the bound before; the last bucket counts the rest (1 s and more).
SYNC_BUCKET_BOUNDS_US = tuple(64 << i for i in range(15))  # 64 us ... 1.05 s


def sync_bucket(seconds: float) -> int:
    """The bucket of SYNC_BUCKET_BOUNDS_US a group commit of `seconds` counts in."""
    us = int(seconds * 1e6)
    return min(max(0, (us >> 6).bit_length()), len(SYNC_BUCKET_BOUNDS_US))


def sync_quantile(histogram: list[int], q: float) -> float | None:
    """The upper bound (ms) of the bucket holding quantile `q` of a
    histogram of SYNC_BUCKET_BOUNDS_US; None if it is empty, inf past the
    last bound."""
    total = sum(histogram)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(histogram):
        seen += n
        if seen >= rank and n:
            return SYNC_BUCKET_BOUNDS_US[i] / 1e3 if i < len(SYNC_BUCKET_BOUNDS_US) else float("inf")
    return float("inf")


def segment_name(seg: int) -> str:
    return f"segment-{seg:010d}.log"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """``path`` replaced by ``data`` atomically and durably: a temporary
    file beside it fsynced, renamed over it, the directory fsynced (the
    bookie's checkpoint, FORMAT and cookie files)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class JournalWriteError(OSError):
    pass



class ShortRead(OSError):
    """A segment ended before the bytes asked of it."""


def pread_exactly(fd: int, length: int, offset: int, seg: int | str = "?") -> bytes:
    """``length`` bytes of a segment's file from ``offset`` (ShortRead if
    it ends first: a record the index points at is never cut short)."""
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise ShortRead(f"short read in segment {seg} at {offset}: {len(data)} of {length} bytes")
    return data


class JournalDamaged(RuntimeError):
    """The journal lost records a crash cannot explain (Journal.scan)."""


class Journal:
    """Segments under `directory`; one writer (this object), many readers."""

    def __init__(self, directory: str | os.PathLike, *, segment_size: int = 64 << 20, preallocate: bool = False,
                 mark_idle_s: float = MARK_IDLE_S):
        assert segment_size >= 1 << 16
        self.mark_idle_s = mark_idle_s
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_size = segment_size
        self.preallocate = preallocate
        for stale in self.dir.glob("segment-*.log" + PREPARED_SUFFIX):
            stale.unlink()  # prepared for a roll that never came
        # the next segment, being zero-filled: (segment, future of its path)
        self._prep_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-prep")
        self._prepared: tuple[int, Future] | None = None
        self._write_preallocated = False  # the segment being written was prepared
        self.preallocated_segments = 0
        self._read_fds: dict[int, int] = {}
        self._lock = threading.Lock()  # guards _read_fds against the flusher closing/opening
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-flush")
        # buffered, not yet handed to the flusher: (segment, [chunks])
        self._pending: list[tuple[int, list[bytes | memoryview]]] = []
        self._pending_bytes = 0
        self._waiters: list[asyncio.Future] = []
        self._flushing = False
        segs = self.segments()
        self._seg = segs[-1] if segs else 1
        self._write_fd = -1
        self._write_seg = -1
        self._tail = 0  # logical end of the current segment (including pending)
        self._durable = JournalPosition(self._seg, 0)
        self._disk_bytes = 0       # durable bytes in segment files
        self._inflight_bytes = 0   # handed to the flusher, not yet durable
        self.bytes_appended = 0
        self.fsyncs = 0
        self.on_commit = None  # (bytes, seconds) of each group commit: bookie/metrics.py
        self.sync_histogram = [0] * (len(SYNC_BUCKET_BOUNDS_US) + 1)  # group commits by duration
        self.sync_max_seconds = 0.0
        # why nothing more can be written until a restart (a failed write whose
        # bytes could not be taken back: later ones would land after them)
        self.broken: str | None = None
        self.on_broken = None   # called once with that reason (bookie/storage.py: the halt)
        self._marked = JournalPosition(0, 0)   # where the last mark buffered begins
        self._idle_mark = None                  # the timer of an idle journal's mark
        self.marks = 0

    # -- segments ------------------------------------------------------------

    def segments(self) -> list[int]:
        out = []
        for p in self.dir.iterdir():
            m = SEGMENT_NAME.match(p.name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def path(self, seg: int) -> Path:
        return self.dir / segment_name(seg)

    @property
    def current_segment(self) -> int:
        return self._seg

    @property
    def end(self) -> JournalPosition:
        return JournalPosition(self._seg, self._tail)

    def open_for_append(self, end: JournalPosition) -> None:
        """Called once recovery decided where the valid journal ends."""
        self._seg, self._tail = end.segment, end.offset
        fd = os.open(self.path(self._seg), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, self._tail)  # cut a torn tail off for good
            os.fsync(fd)
            if self._wants_mark(self.end):
                # what the replay kept is durable now (the fsync): marked, so
                # that its rot is not taken for a torn tail after a crash
                body = MARK_BODY.pack(self._seg, self._tail)
                os.pwrite(fd, frame_record(R_MARK, body) + body, self._tail)
                os.fsync(fd)
                self._marked = JournalPosition(self._seg, self._tail)
                self._tail += MARK_SIZE
                self.marks += 1
        finally:
            os.close(fd)
        _fsync_dir(self.dir)
        self._durable = end = JournalPosition(self._seg, self._tail)
        self._disk_bytes = self._stat_bytes()
        self._open_write_segment(self._seg)

    def disk_bytes(self) -> int:
        """Bytes of all segments, including what is buffered for them."""
        return self._disk_bytes + self._pending_bytes + self._inflight_bytes

    def _stat_bytes(self) -> int:
        total = 0
        for seg in self.segments():
            try:
                total += self.path(seg).stat().st_size
            except FileNotFoundError:
                pass
        return total

    def remove_segment(self, seg: int) -> None:
        assert seg != self._seg, "cannot remove the segment being written"
        with self._lock:
            fd = self._read_fds.pop(seg, None)
            if fd is not None:
                os.close(fd)
        try:
            size = self.path(seg).stat().st_size
            os.unlink(self.path(seg))
            self._disk_bytes -= size
        except FileNotFoundError:
            pass
        _fsync_dir(self.dir)

    # -- scanning (recovery, compaction) -------------------------------------

    def scan(self, start: JournalPosition) -> Iterator[ScannedRecord]:
        """Yields the valid records from `start` to the end of the journal.

        Stops at the first torn or corrupt record; `self.scan_end` then says
        where the valid journal ends.  Raises JournalDamaged when a later
        segment holds a valid record: that segment was begun only once this
        one was durable (``_open_write_segment``), so the bad record is the
        disk's loss, not a crash's torn tail, and cutting the journal there
        would drop acknowledged entries."""
        self.scan_end = start
        for seg in self.segments():
            if seg < start.segment:
                continue
            data = self.path(seg).read_bytes()
            mv = memoryview(data)
            off = start.offset if seg == start.segment else 0
            while (rec := record_at(mv, seg, off)) is not None:
                if rec.rtype == R_MARK:
                    self._marked = JournalPosition(seg, off)
                off = rec.end.offset
                self.scan_end = rec.end
                if rec.rtype != R_MARK:
                    yield rec
            if off != len(data) and data.count(0, off) == len(data) - off:
                pass  # the zeros of a preallocated segment: its records end here
            elif off != len(data) and (mark := mark_after(data, seg, off)) is not None:
                raise JournalDamaged(
                    f"journal segment {seg} has a bad record at {off} of {len(data)} bytes, and a mark at "
                    f"{mark} says every byte before it was durable: the disk lost data there (not a crash's "
                    "torn tail); not cut off")
            elif off != len(data):
                later = [s for s in self.segments() if s > seg]
                written = [s for s in later if self._holds_a_record(s)]
                if written:
                    raise JournalDamaged(
                        f"journal segment {seg} has a bad record at {off} of {len(data)} bytes, and segment "
                        f"{written[0]}, begun only once it was durable, holds records: the disk lost data there "
                        "(not a crash's torn tail); not cut off")
                log.warning("journal segment %d: torn tail at %d of %d bytes, cut off", seg, off, len(data))
                self.scan_end = JournalPosition(seg, off)
                for s in later:   # (empty, or the zeros of a prepared segment)
                    log.warning("journal segment %d follows a torn tail: removed", s)
                    os.unlink(self.path(s))
                return
            self.scan_end = JournalPosition(seg, off)

    def _holds_a_record(self, seg: int) -> bool:
        """Whether segment ``seg`` begins with a valid record (read: that one)."""
        with open(self.path(seg), "rb") as f:
            head = f.read(RECORD_HEADER_SIZE)
            if len(head) < RECORD_HEADER_SIZE:
                return False
            first = head + f.read(RECORD_HEADER.unpack_from(head)[0])
        return record_at(memoryview(first), seg, 0) is not None

    def read_segment(self, seg: int) -> bytes:
        return self.path(seg).read_bytes()

    # -- appending -------------------------------------------------------------

    def append(self, rtype: int, body: bytes | memoryview) -> int:
        """Buffers a record; returns its body's offset in `current_segment`
        (valid after the call: a roll happens before, never in the middle).
        The first record of a group commit is preceded by a mark when the
        segment already holds records."""
        size = RECORD_HEADER_SIZE + len(body)
        mark = not self._pending and self._tail > 0
        if self._tail > 0 and self._tail + size + (MARK_SIZE if mark else 0) > self.segment_size:
            self._roll()
        elif mark:
            self._buffer_mark()
        return self._buffer(rtype, body)

    def _buffer_mark(self) -> None:
        """A mark where the journal ends: everything before it is durable
        by the time the flusher writes it (it writes a batch only once the
        one before is)."""
        self._marked = JournalPosition(self._seg, self._tail)
        self._buffer(R_MARK, MARK_BODY.pack(self._seg, self._tail))
        self.marks += 1

    def _buffer(self, rtype: int, body: bytes | memoryview) -> int:
        size = RECORD_HEADER_SIZE + len(body)
        head = frame_record(rtype, body)
        if self._pending and self._pending[-1][0] == self._seg:
            chunks = self._pending[-1][1]
        else:
            chunks = []
            self._pending.append((self._seg, chunks))
        chunks.append(head)
        chunks.append(body)
        body_off = self._tail + RECORD_HEADER_SIZE
        self._tail += size
        self._pending_bytes += size
        self.bytes_appended += size
        return body_off

    def _roll(self) -> None:
        self._seg += 1
        self._tail = 0
        # the flusher opens the new segment when it reaches its first chunk

    def sync(self) -> asyncio.Future:
        """A future done once every record appended so far is durable."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self.broken is not None and not self._flushing:
            self._pending, self._pending_bytes = [], 0
            self._seg, self._tail = self._durable.segment, self._durable.offset
            fut.set_exception(JournalWriteError(None, self.broken))
            return fut
        if not self._pending and not self._flushing:
            fut.set_result(None)
            return fut
        self._waiters.append(fut)
        if not self._flushing:
            self._start_flush(loop)
        return fut

    def _start_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, waiters = self._pending, self._waiters
        self._inflight_bytes = self._pending_bytes
        self._pending, self._waiters, self._pending_bytes = [], [], 0
        self._flushing = True
        fut = loop.run_in_executor(self._executor, self._write_batch, batch)
        fut.add_done_callback(lambda f: self._flush_done(loop, f, waiters))

    def _flush_done(self, loop, f: asyncio.Future, waiters: list[asyncio.Future]) -> None:
        self._flushing = False
        size, self._inflight_bytes = self._inflight_bytes, 0
        exc = f.exception()
        if exc is not None:
            # The flusher cut the failed segment back to its durable end.
            # Records buffered since were placed after the lost bytes, so they
            # are dropped too: every waiter learns its records are not durable.
            log.error("journal write failed: %s", exc)
            for w in waiters + self._waiters:
                if not w.done():
                    w.set_exception(JournalWriteError(exc.errno if isinstance(exc, OSError) else None, str(exc)))
            self._waiters, self._pending, self._pending_bytes = [], [], 0
            self._seg, self._tail = self._durable.segment, self._durable.offset
            if self.broken is not None and self.on_broken is not None:
                self.on_broken(self.broken)
            return
        grew, took = f.result()
        self.fsyncs += 1
        self.sync_histogram[sync_bucket(took)] += 1
        self.sync_max_seconds = max(self.sync_max_seconds, took)
        if self.on_commit is not None:
            self.on_commit(size, took)
        self._disk_bytes += grew  # what the files grew by (not writes into preallocated ones)
        for w in waiters:
            if not w.done():
                w.set_result(None)
        if self._waiters:
            self._start_flush(loop)
        elif self._idle_mark is None:
            self._idle_mark = loop.call_later(self.mark_idle_s, self._mark_if_idle, loop)

    def _wants_mark(self, end: JournalPosition) -> bool:
        """Whether a mark at ``end`` would say anything: records before it
        in its segment, no mark ending them already, and room for it (with
        none, the next record begins a segment, which says as much)."""
        return (end.offset > 0 and self._marked != JournalPosition(end.segment, end.offset - MARK_SIZE)
                and end.offset + MARK_SIZE <= self.segment_size)

    def _mark_if_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        """Marks the journal's end once it is idle, unless a mark ends it
        already: the last commit before a pause is marked too."""
        self._idle_mark = None
        if self._pending or self._flushing or self.broken is not None:
            return   # a commit is under way: the next one begins with a mark
        if self._wants_mark(self.end):
            self._buffer_mark()
            self._start_flush(loop)

    def _write_batch(self, batch: list[tuple[int, list[bytes | memoryview]]]) -> tuple[int, float]:
        """Flusher thread: write each segment's chunks, fdatasync, roll.
        Returns how many bytes the segment files grew by, and the seconds
        it took."""
        t0 = time.perf_counter()
        grew = 0
        for seg, chunks in batch:
            if self._write_fd < 0 or seg != self._write_seg:
                grew += self._open_write_segment(seg)
            start = self._durable.offset if self._durable.segment == seg else 0
            written = start
            try:
                for i in range(0, len(chunks), IOV_MAX):
                    part = chunks[i : i + IOV_MAX]
                    want = sum(len(c) for c in part)
                    done = os.writev(self._write_fd, part)
                    if done != want:  # a short write: finish it chunk by chunk
                        self._finish_short_write(part, done)
                    written += want
                os.fdatasync(self._write_fd)
            except OSError as e:
                self._undo_write(seg, start, sum(len(c) for c in chunks), e)
                raise
            # a prepared segment grows only past its zeros (a record larger than it)
            grew += max(0, written - max(start, self.segment_size if self._write_preallocated else start))
            self._durable = JournalPosition(seg, written)
            if self.preallocate and self._prepared is None and written >= self.segment_size // 4:
                # a quarter through: prepare the next segment (an idle
                # bookie never writes a segment of zeros it does not need)
                self._prepared = (seg + 1, self._prep_executor.submit(self._prepare, seg + 1))
        return grew, time.perf_counter() - t0

    def _undo_write(self, seg: int, start: int, length: int, error: OSError) -> None:
        """A failed write: nothing from ``start`` on may be read back as a
        record later (a record fully written but never made durable would
        otherwise reappear after the next restart).  If that fails too, the
        journal is ``broken``: a later write would land after the failed
        one's bytes, where no offset handed out points."""
        try:
            if self._write_preallocated:
                end = min(start + length, self.segment_size)
                for off in range(start, end, len(_ZEROS)):
                    os.pwrite(self._write_fd, memoryview(_ZEROS)[:min(len(_ZEROS), end - off)], off)
                os.lseek(self._write_fd, start, os.SEEK_SET)
                os.fdatasync(self._write_fd)
            else:
                os.ftruncate(self._write_fd, start)
        except OSError as e:
            self.broken = (f"a failed write to journal segment {seg} at {start} ({error}) could not be taken "
                           f"back ({e}): nothing more is written until a restart")
            log.error("journal: %s", self.broken)

    def _open_write_segment(self, seg: int) -> int:
        """Switches writing to segment ``seg`` (the prepared file if it is
        ready); returns how many bytes the journal's files grew by."""
        if self._write_fd >= 0:
            os.fdatasync(self._write_fd)
            os.close(self._write_fd)
            self._write_fd = -1
        path, grew = self.path(seg), 0
        prepared = self._take_prepared(seg) if not path.exists() else None
        if prepared is not None:
            os.rename(prepared, path)
            _fsync_dir(self.dir)
            self._write_fd = os.open(path, os.O_WRONLY)
            self._write_preallocated = True
            self.preallocated_segments += 1
            grew = self.segment_size
        else:
            new = not path.exists()
            self._write_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._write_preallocated = False
            if new:
                _fsync_dir(self.dir)
        self._write_seg = seg
        return grew

    def wait_prepared(self, timeout: float | None = None) -> bool:
        """Waits until the next segment's file is prepared (a roll then uses
        it); False if none is being prepared or it failed."""
        p = self._prepared
        if p is None:
            return False
        try:
            p[1].result(timeout)
        except Exception:
            return False
        return True

    def _take_prepared(self, seg: int) -> Path | None:
        """The prepared file for ``seg`` if it is ready (a roll never waits
        for one: it writes a plain segment instead)."""
        p, self._prepared = self._prepared, None
        if p is None or p[0] != seg or not p[1].done() or p[1].exception() is not None:
            if p is not None and p[1].done() and p[1].exception() is not None:
                log.warning("journal: preparing segment %d failed: %s", p[0], p[1].exception())
            return None
        return p[1].result()

    def _prepare(self, seg: int) -> Path:
        """Preparer thread: the zero-filled file segment ``seg`` will be."""
        for stale in self.dir.glob("segment-*.log" + PREPARED_SUFFIX):
            stale.unlink()  # one that came too late for its roll
        tmp = self.dir / (segment_name(seg) + PREPARED_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            zeros = memoryview(_ZEROS)
            for off in range(0, self.segment_size, len(zeros)):
                os.pwrite(fd, zeros[:min(len(zeros), self.segment_size - off)], off)
                os.fdatasync(fd)
                time.sleep(0.005)
        finally:
            os.close(fd)
        return tmp

    def _mark_on_close(self) -> None:
        """Closing: a mark after the last durable record (the flusher has
        stopped; records buffered and never synced are dropped, as a crash
        drops them)."""
        d = self._durable
        if self._write_fd < 0 or d.segment != self._write_seg or self.broken is not None or not self._wants_mark(d):
            return   # (the durable end, not _tail: records buffered and never synced are not written)
        body = MARK_BODY.pack(d.segment, d.offset)
        fd = self._write_fd
        try:
            if self._write_preallocated:
                os.lseek(fd, d.offset, os.SEEK_SET)
            elif os.fstat(fd).st_size != d.offset:
                return   # (bytes of a failed write left behind: no mark over them)
            os.write(fd, frame_record(R_MARK, body) + body)
            os.fdatasync(fd)
        except OSError as e:
            log.warning("journal: the closing mark was not written: %s", e)
            return
        self._marked = d
        self.marks += 1

    def _finish_short_write(self, part: list, done: int) -> None:
        for c in part:
            n = len(c)
            if done >= n:
                done -= n
                continue
            view = memoryview(c)[done:]
            while view:
                w = os.write(self._write_fd, view)
                view = view[w:]
            done = 0

    # -- reading ---------------------------------------------------------------

    def read_fd(self, seg: int) -> int:
        """The segment's file, open for reading (kept until the segment is
        removed or the journal closed: a caller that holds it across an
        await dups it)."""
        fd = self._read_fds.get(seg)
        if fd is None:
            with self._lock:
                fd = self._read_fds.get(seg)
                if fd is None:
                    fd = os.open(self.path(seg), os.O_RDONLY)
                    self._read_fds[seg] = fd
        return fd

    def pread(self, seg: int, offset: int, length: int) -> bytes:
        return pread_exactly(self.read_fd(seg), length, offset, seg)

    def close(self) -> None:
        if self._idle_mark is not None:
            self._idle_mark.cancel()
            self._idle_mark = None
        self._executor.shutdown(wait=True)
        self._prep_executor.shutdown(wait=True, cancel_futures=True)
        self._mark_on_close()
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1
        with self._lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
