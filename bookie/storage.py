"""Ledger storage: the journal, the index, checkpoints and garbage collection.

This is the adapter between the protocol core (bookie/core.py) and the disk.
It runs on the server's event loop; the only blocking calls it makes there are
preads from the page cache and small appends to in-memory buffers.  Writes and
fdatasync happen on the journal's flusher thread.

Restart: load the latest checkpoint (ledger states and the index, as of a
journal position), then replay the journal from that position only.

Space: every record location is accounted to its segment.  A segment whose
records are all dead is removed; one that is mostly dead is compacted (its live
records are copied to the journal head as an R_RELOCATED record, then it is
removed).  Above a disk-usage threshold the bookie goes read-only, and comes
back once usage falls below the threshold minus a margin.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import struct
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bookie import checkpoint
from bookie import entry as E
from bookie import striped_read
from bookie.lac_wait import LacWaiters
from bookie.range_read import read_runs
# (what Storage.open raises, importable from here as before)
from bookie.data_dir import LOCK_FILE, DamagedDataDir, DataDirInUse, lock_data_dir  # noqa: F401
from bookie.core import Barrier, BookieCore, LacInfo, Status, Verdict, verifier_of
from bookie.index import Removed, pack_location, unpack_location
from bookie.journal import Journal, JournalDamaged, write_durably
from bookie.journal_record import (
    DELETE_BODY, LAC_BODY, R_CLEAR, R_DELETE, R_ENTRIES, R_KEY, R_LAC, R_RELOCATED, R_STATE, JournalPosition,
)

log = logging.getLogger(__name__)


class StorageFormatError(RuntimeError):
    """The data dir holds records of another layout than this bookie's."""


@dataclass
class StorageConfig:
    segment_size: int = 64 << 20
    preallocate: bool = False              # zero-fill the next journal segment ahead (bookie/journal.py)
    checkpoint_bytes: int = 256 << 20      # checkpoint after this much journal
    max_entry_size: int = 4 << 20
    # Read-only when the disk is used above this fraction, or when the
    # journal holds more than max_storage_bytes (0: no limit).
    disk_usage_threshold: float = 0.95
    disk_usage_margin: float = 0.05
    max_storage_bytes: int = 0
    compaction_threshold: float = 0.5      # compact segments less live than this
    # A stripe view's window in the index's ids (bookie/striped_read.py): the
    # longest its build holds the loop, and the most a view holds.
    stripe_view_window_ids: int = striped_read.VIEW_WINDOW_IDS

    def __post_init__(self) -> None:
        if self.stripe_view_window_ids < 1:   # (a window of none: a read would never pass it)
            raise ValueError(f"stripe_view_window_ids must be >= 1, got {self.stripe_view_window_ids}")
        if not 0 <= self.disk_usage_margin < self.disk_usage_threshold <= 1:   # (else never writable again)
            raise ValueError(f"the disk usage margin ({self.disk_usage_margin}) must be below the threshold "
                             f"({self.disk_usage_threshold}), both fractions of the disk: read-only above the "
                             "threshold, the bookie would never be writable again")
        if self.segment_size < 1 << 16 or self.max_entry_size < 1 or self.checkpoint_bytes < 1:
            raise ValueError(f"segment_size >= 64 KiB, max_entry_size and checkpoint_bytes >= 1: got "
                             f"{self.segment_size}, {self.max_entry_size}, {self.checkpoint_bytes}")


class Storage:
    def __init__(self, data_dir: str | os.PathLike, config: StorageConfig | None = None):
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = config or StorageConfig()
        self.stripe_views = striped_read.ViewBudget()  # the stripe views' bytes, bounded bookie-wide
        self.core = BookieCore()
        self.journal = Journal(self.dir / "journal", segment_size=self.config.segment_size,
                               preallocate=self.config.preallocate)
        self.journal.on_broken = lambda why: self.core.halt(f"journal: {why}")   # (until a restart)
        self.live_bytes: dict[int, int] = defaultdict(int)   # segment -> live record bytes
        self.checkpoint_pos = JournalPosition(1, 0)
        self._since_checkpoint = 0
        self._checkpoint_wanted = False   # (checkpoint_past: a rotted record the next replay would meet)
        self.lac_waiters = LacWaiters(self._lac_of)   # (LongPollLac)
        self.replayed_bytes = 0
        self.replayed_records = 0
        self.replay_seconds = 0.0
        self.applied_end = JournalPosition(1, 0)
        self.tracer = None  # bookie/tracelog.py BookieTracer (bookstream bookie --trace FILE)
        self._lock_fd: int | None = None

    # -- start-up ------------------------------------------------------------

    def open(self) -> None:
        """Take the data dir's lock, load the checkpoint and replay the
        journal after it.  Blocking; run before serving.  Raises
        DataDirInUse, DamagedDataDir (nothing changed on disk) and
        StorageFormatError; the lock is let go on any of them."""
        self._lock_fd = lock_data_dir(self.dir)
        try:
            self._open()
        except BaseException:
            self._unlock()
            raise

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _open(self) -> None:
        self.had_history = self.has_history()   # (a data dir emptied under its cookie: bookie/cookie.py)
        self._check_format()
        ckp = self._load_checkpoint()
        if ckp is not None:
            self.checkpoint_pos = ckp
        segs = self.journal.segments()
        self._check_segments(ckp, segs)
        start = self.checkpoint_pos
        if segs and start.segment < segs[0]:
            start = JournalPosition(segs[0], 0)
        t0 = time.perf_counter()
        try:
            for rec in self.journal.scan(start):
                self._replay(rec)
                self.replayed_records += 1
                self.replayed_bytes += len(rec.body)
        except JournalDamaged as e:
            raise DamagedDataDir(f"{self.dir}: {e}") from None
        self.replay_seconds = time.perf_counter() - t0
        end = self.journal.scan_end
        if not segs:
            end = JournalPosition(max(start.segment, 1), 0)
        self._recount_live()
        have = set(segs)
        gone = sorted(seg for seg, n in self.live_bytes.items() if n > 0 and seg not in have)
        if gone:
            raise DamagedDataDir(f"{self.dir}: journal segment(s) {gone} are gone, and the index has "
                                 f"entries there")
        self.journal.open_for_append(end)
        self.applied_end = end
        log.info(
            "storage open: %d ledgers, %d entries; replayed %d records (%d bytes) from %s",
            len(self.core.ledgers), self.core.entry_count, self.replayed_records, self.replayed_bytes, start,
        )

    def _check_segments(self, ckp: JournalPosition | None, segs: list[int]) -> None:
        """What a crash cannot leave behind.  The journal's first segment is
        1; only segments wholly before the checkpoint's are ever removed
        (``collect_garbage``); the checkpoint's own segment held its
        position when it was written."""
        where = f"{self.dir}: "
        if ckp is None:
            if segs and segs[0] != 1:
                raise DamagedDataDir(where + f"no checkpoint, and the journal begins at segment {segs[0]}: the "
                                              "checkpoint that covered the segments before it is gone")
            return
        if ckp.segment not in segs:
            raise DamagedDataDir(where + f"journal segment {ckp.segment}, the checkpoint's, is gone")
        size = self.journal.path(ckp.segment).stat().st_size
        if size < ckp.offset:
            raise DamagedDataDir(where + f"journal segment {ckp.segment} has {size} bytes, fewer than the "
                                          f"{ckp.offset} the checkpoint found there")
        hole = sorted(set(range(ckp.segment, segs[-1] + 1)) - set(segs))
        if hole:
            raise DamagedDataDir(where + f"journal segment(s) {hole} after the checkpoint's are gone")

    def _replay(self, rec) -> None:
        # (live bytes are recounted once replay is done)
        self.core.replay(rec.rtype, rec.body, pack_location(rec.segment, rec.body_offset), rec.runs)

    def _recount_live(self) -> None:
        self.live_bytes.clear()
        for st in self.core.ledgers.values():
            for _, loc, ln in st.index.iter_all():
                self.live_bytes[loc >> 40] += ln

    # -- applying durable records ----------------------------------------------

    def _dead(self, removed: Removed) -> None:
        for loc, ln in removed:
            self.live_bytes[loc >> 40] -= ln

    def _apply_entries(self, body, seg: int, body_off: int, runs: list[E.EntryRun] | None = None) -> set[int]:
        """Applies an R_ENTRIES body in order (its runs, if already scanned);
        returns the ledgers touched."""
        runs = runs if runs is not None else E.scan_runs(body)
        dead = self.core.apply_entries(runs, pack_location(seg, body_off))
        if dead:
            self._dead(dead)
        if runs:
            self.live_bytes[seg] += runs[-1].end - runs[0].start
        return {run.ledger_id for run in runs}

    def _apply_relocated(self, body, seg: int, body_off: int) -> None:
        for old, new, size in self.core.apply_relocated(body, pack_location(seg, body_off)):
            self.live_bytes[old >> 40] -= size
            self.live_bytes[new >> 40] += size

    # -- adds --------------------------------------------------------------------

    def validate_frame(self, entries: bytes) -> tuple[Status, str, list[E.EntryRun]]:
        """Parses and verifies a whole frame before any of it is admitted: a
        malformed frame changes nothing.  The frame comes back as runs of
        consecutive entries (``entry.EntryRun``)."""
        try:
            runs = E.scan_runs(entries, self.config.max_entry_size)
        except E.EntryTooLarge as e:
            return Status.TOO_LARGE, str(e), []
        except E.MalformedEntry as e:
            return Status.BAD_REQUEST, str(e), []
        except E.ChecksumMismatch as e:
            return Status.CHECKSUM_MISMATCH, str(e), []
        if not runs:
            return Status.BAD_REQUEST, "empty frame", []
        if bad := self.core.check_positions(runs, entries):
            return Status.BAD_REQUEST, bad, []
        return Status.OK, "", runs

    def admit_frame(
        self, entries: bytes, runs: list[E.EntryRun], master_key=b""
    ) -> tuple[list[tuple[int, Verdict]], asyncio.Future | None]:
        """Admits the entries of a validated frame and journals the accepted
        ones.  Returns the refused entries as (index in the frame, verdict),
        and a future done once the accepted ones are durable (None if none
        was).  ``master_key``: the frame's (AddFrame.master_key), hashed
        once for the frame; a ledger whose state the frame creates learns
        it, journalled (R_KEY) ahead of the entries."""
        if self.config.max_storage_bytes and not self.core.read_only:
            self.update_read_only()  # the limit is checked on every frame: cheap, counted bytes
        admit = self.core.admit_add
        verifier = verifier_of(master_key)
        refused = []
        accepted = []
        # The entries of a run share ledger, term and kind, so they get the
        # same verdict (an admitted add only raises the term to its own): the
        # rules run once per run, not once per entry.
        for run in runs:
            v = admit(run, verifier)
            if v.status is Status.OK:
                accepted.append(run)
                if v.key_learned:
                    self._append(R_KEY, self.core.key_body(run.ledger_id), None)
            else:
                refused.extend((run.index + k, v) for k in range(run.count))
        if not accepted:
            return refused, None
        if refused:
            mv = memoryview(entries)
            body = b"".join(mv[run.start:run.end] for run in accepted)
            runs = E.scan_runs(body)
        else:
            body = entries
        pending = self.core.adds_pending(runs)
        return refused, self._append(
            R_ENTRIES, body, lambda b, seg, off: self._on_entries_durable(b, seg, off, runs),
            lambda: self.core.adds_settled(pending))

    def _append(self, rtype: int, body, apply, settle=None) -> asyncio.Future:
        """Journals a record; `apply(body, segment, body_offset)` runs once it
        is durable.  Durable records are applied strictly in journal order
        (sync futures resolve in append order and their callbacks run
        first), which is also the order replay applies them in, so the live
        state and the replayed state never differ.  The returned future may
        be cancelled by a caller without skipping the apply.  `settle()` runs
        once the record is applied or has failed."""
        off = self.journal.append(rtype, body)
        seg = self.journal.current_segment
        end = JournalPosition(seg, off + len(body))
        self._since_checkpoint += len(body)
        fut = self.journal.sync()

        def done(f: asyncio.Future) -> None:
            if settle is not None:
                settle()
            if f.cancelled() or f.exception() is not None:
                return
            if apply is not None:
                apply(body, seg, off)
            self.applied_end = end

        fut.add_done_callback(done)
        return asyncio.shield(fut)

    def _on_entries_durable(self, body, seg: int, off: int, runs) -> None:
        for lid in self._apply_entries(body, seg, off, runs):
            if lid in self.lac_waiters:
                self.lac_waiters.wake(lid)
        if self.tracer is not None:  # (one check per journal record)
            self.tracer.stores(body)

    # -- state changes -------------------------------------------------------------

    async def fence(self, ledger_id: int, term: int, fence: bool, master_key=b"") -> Verdict:
        """A term-carrying or fencing request: the term and fence change at
        once (later requests of an older writer are refused at once); the
        answer waits for the core's barrier (``BookieCore.fence_read``)."""
        v, barrier = self.core.fence_read(ledger_id, term, fence, verifier_of(master_key))
        if v.key_learned:
            self._append(R_KEY, self.core.key_body(ledger_id), None)
        if barrier is Barrier.JOURNAL_STATE:
            await self._journal_state(ledger_id)
        elif barrier is Barrier.SYNC:
            await self.journal.sync()
        return v

    def _journal_state(self, ledger_id: int) -> asyncio.Future:
        """Journals the ledger's term and fence as they are now; once durable
        the core knows them durable (``BookieCore.fence_read`` waits for that)."""
        return self._append(R_STATE, self.core.state_body(ledger_id),
                            lambda body, _seg, _off: self.core.replay(R_STATE, body, 0))

    async def write_lac(self, ledger_id: int, lac: int, lafr: int, term: int, master_key=b"") -> Verdict:
        """An explicit LAC: journalled (a bookie's LAC never goes down, not
        even across a restart), then applied and long-pollers woken."""
        v = self.core.admit_lac(ledger_id, term, verifier_of(master_key))
        if v.status is Status.OK:
            def apply(_b, _s, _o):
                self.core.apply_lac(ledger_id, lac, lafr)
                self.lac_waiters.wake(ledger_id)
                if self.tracer is not None:
                    self.tracer.store_lac(ledger_id, lac, lafr)
            await self._append(R_LAC, LAC_BODY.pack(ledger_id, lac, lafr), apply)
        return v

    async def prepare(self, ledger_id: int, first_entry: int, term: int, master_key=b"") -> tuple[Verdict, int]:
        """Prepares this bookie to join a fragment starting at `first_entry`
        (bookie/core.py `prepare`): the term is raised and journalled, then
        the entries >= first_entry are deleted, in journal order after every
        add admitted before (so an older writer's pending add is deleted too).
        Returns the verdict and how many entries went."""
        v = self.core.prepare(ledger_id, first_entry, term, verifier_of(master_key))
        if v.status is not Status.OK:
            return v, 0
        if v.key_learned:
            self._append(R_KEY, self.core.key_body(ledger_id), None)
        if v.state_changed:
            self._journal_state(ledger_id)
        return v, await self._journal_delete(R_DELETE, (DELETE_BODY.pack(ledger_id, True, first_entry, (1 << 63) - 1),
                                                        lambda: self.core.apply_prepare(ledger_id, first_entry)))

    async def delete(self, ledger_id: int, entry_range: tuple[int, int] | None, master_key=b"") -> tuple[Status, int]:
        """Deletes a ledger or a range of its entries, once the deletion is
        durable and in journal order with the adds around it.  Returns the
        status (NO_SUCH_LEDGER, UNAUTHORIZED_ACCESS: nothing journalled) and
        how many entries went."""
        status = self.core.admit_delete(ledger_id, verifier_of(master_key))
        if status is not Status.OK:
            return status, 0
        first, last = entry_range if entry_range else (0, 0)
        return status, await self._journal_delete(R_DELETE,
                                                  (DELETE_BODY.pack(ledger_id, entry_range is not None, first, last),
                                                   lambda: self.core.delete(ledger_id, entry_range)))

    async def clear(self, ledger_id: int, first: int, last: int, token: int, master_key=b"") -> tuple[Status, int]:
        """A copy's clearing of its target's range under its fencing token
        (``BookieCore.admit_clear``): FENCED below the ledger's token, else
        the token and the deletion journalled (R_CLEAR) and applied once
        durable.  Returns the status and how many entries went."""
        v = self.core.admit_clear(ledger_id, token, verifier_of(master_key))
        if v.status is not Status.OK:
            return v.status, 0
        if v.key_learned:
            self._append(R_KEY, self.core.key_body(ledger_id), None)
        return v.status, await self._journal_delete(R_CLEAR, (self.core.clear_body(ledger_id, first, last),
                                                              lambda: self.core.apply_clear(ledger_id, first, last,
                                                                                            token)))

    async def clear_over_replicated(self, ledger_id: int, token: int, touched: int | None,
                                    ranges: list[tuple[int, int]]) -> int | None:
        """The bookie's own clearing of a ledger's entries in ``ranges``,
        which its metadata no longer names this bookie for
        (bookie/ledger_gc.py), under the ledger's recovery lock (``token``),
        if no request was admitted for it since its count was ``touched``
        (None: not asked; ``BookieCore.admit_gc_clear``).  Journalled as
        copies' clearings (R_CLEAR, one a range, all appended at once): the
        state and the token stay.  Returns how many entries went, or None
        (touched since, or a later copy's token here: nothing changed)."""
        if self.core.admit_gc_clear(ledger_id, token, touched) is not Status.OK:
            return None
        return await self._journal_delete(R_CLEAR, *[
            (self.core.clear_body(ledger_id, first, last),
             lambda first=first, last=last: self.core.apply_clear(ledger_id, first, last, token))
            for first, last in ranges])

    async def drop_ledger(self, ledger_id: int) -> int:
        """Deletes a ledger, state included, with no key asked: the bookie's
        own collection of a ledger deleted from the metadata
        (bookie/ledger_gc.py).  Returns how many entries went."""
        if ledger_id not in self.core.ledgers:
            return 0
        return await self._journal_delete(R_DELETE, (DELETE_BODY.pack(ledger_id, False, 0, 0),
                                                     lambda: self.core.delete(ledger_id, None)))

    async def _journal_delete(self, rtype: int, *records: tuple[bytes, Callable[[], Removed]]) -> int:
        """Journals deletions (R_DELETE or R_CLEAR records), each a (body,
        remove) pair, appended together (no request admitted between them);
        each `remove()` runs once its record is durable, in journal order.
        Returns how many entries went."""
        count = [0]

        def applier(remove):
            def apply(_body, _seg, _off):
                removed = remove()
                self._dead(removed)
                count[0] += len(removed)
            return apply

        await asyncio.gather(*[self._append(rtype, body, applier(remove)) for body, remove in records])
        return count[0]

    # -- reads ----------------------------------------------------------------------

    def term_of(self, ledger_id: int) -> int:
        return self.core.term_of(ledger_id)

    def lac_info(self, ledger_id: int) -> LacInfo | None:
        return self.core.lac_info(ledger_id)

    @property
    def read_only(self) -> bool:
        return self.core.read_only

    @property
    def ledger_count(self) -> int:
        return len(self.core.ledgers)

    @property
    def entry_count(self) -> int:
        return self.core.entry_count

    def read_record(self, ledger_id: int, entry_id: int) -> tuple[Status, bytes]:
        status, loc = self.core.lookup(ledger_id, entry_id)
        if status is not Status.OK:
            return status, b""
        return Status.OK, self._read_at(*loc)

    def _read_at(self, loc: int, length: int) -> bytes:
        seg, off = unpack_location(loc)
        return self.journal.pread(seg, off, length)

    def read_range(self, ledger_id: int, first: int, last: int, max_bytes: int) -> tuple[Status, list[bytes], int]:
        """Reads consecutive entries from `first`: at most `max_bytes`, but
        always at least one entry.  Returns (status, records, next id).  The
        status is OK while entries remain to read (or the range is done), and
        NO_SUCH_ENTRY once the range reaches an entry the bookie lacks."""
        st = self.core.ledgers.get(ledger_id)
        if st is None:
            return Status.NO_SUCH_LEDGER, [], first
        out, nxt, full, _ = read_runs(st.index.run_slices(first, last), max_bytes, self._read_at)
        if nxt is None:
            nxt = first
        if nxt <= last and not full:
            return Status.NO_SUCH_ENTRY, out, nxt
        return Status.OK, out, nxt

    def read_sparse(self, ledger_id: int, first: int, last: int, max_bytes: int,
                    stripe: int = 0, residues: int = 0, read_at=None) -> tuple[Status, list, int, int]:
        """Reads every entry the bookie holds in [first, last], skipping the
        ids it does not hold: at most `max_bytes`, but always at least one
        entry.  Returns (status, records, through, how many records): every
        id in [first, through] that is not among the records is not held
        (the index is the truth: an entry being deleted or relocated stays
        in it, at a readable location, until that change is durable and
        applied).  With `stripe` > 0 only the ids e with bit (e mod stripe)
        set in `residues` are read and vouched for (a striped reader's
        share).  NO_SUCH_LEDGER when the bookie does not know the ledger.
        ``read_at(location, length)`` makes each span of adjacent records
        (default: its bytes, a pread; the read port takes the locations,
        ``span_at``, and sends them from the files)."""
        read_at = read_at or self._read_at
        st = self.core.ledgers.get(ledger_id)
        if st is None:
            return Status.NO_SUCH_LEDGER, [], last, 0
        if stripe:  # bookie/striped_read.py
            view = st.index.stripe_view(stripe, residues, first, self.config.stripe_view_window_ids)
            if view is not None:
                self.stripe_views.used(st.index, view)
                out, nxt, full, count = striped_read.read_view(view, first, last, max_bytes, read_at)
            else:
                out, nxt, full, count = striped_read.read_runs(st.index.runs_from(first, last, skip_gaps=True),
                                                               max_bytes, stripe, residues, read_at,
                                                               striped_read.GAP_BYTES)
        else:
            out, nxt, full, count = read_runs(st.index.run_slices(first, last, skip_gaps=True), max_bytes, read_at)
        return Status.OK, out, nxt - 1 if full else last, count

    def held_records(self, ledger_id: int, first: int, last: int, n: int,
                     stripe: int = 0, residues: int = 0) -> list[tuple[int, int, int]]:
        """The first ``n`` (entry id, location, record length) the index
        holds in [first, last] (with ``stripe``: of the ids ``read_sparse``
        selects), copied (the index may change while they are read): what a
        ``read_sparse`` from ``first`` returned, record by record (a range
        read's rotted record told by its id here, not by its own header),
        and a scrub's window."""
        st = self.core.ledgers.get(ledger_id)
        out: list[tuple[int, int, int]] = []
        if st is None or n <= 0:
            return out
        for run, lo, hi in st.index.run_slices(first, last, skip_gaps=True):
            recs = zip(range(run.start + lo, run.start + hi), run.locs[lo:hi], run.lens[lo:hi])
            if stripe:
                recs = (r for r in recs if residues >> (r[0] % stripe) & 1)
            out.extend(itertools.islice(recs, n - len(out)))
            if len(out) >= n:
                break
        return out

    # -- LAC long poll (bookie/lac_wait.py) ------------------------------------------------

    async def wait_lac(self, ledger_id: int, previous: int, timeout: float) -> None:
        await self.lac_waiters.wait(ledger_id, previous, timeout)

    def _lac_of(self, ledger_id: int) -> int | None:
        st = self.core.ledgers.get(ledger_id)
        return None if st is None else st.lac

    # -- space ----------------------------------------------------------------------------

    def disk_usage(self) -> tuple[int, int, int]:
        """(used journal bytes, free bytes, total bytes) of the data dir."""
        du = shutil.disk_usage(self.dir)
        used = self.journal.disk_bytes()
        free, total = du.free, du.total
        if self.config.max_storage_bytes:
            total = min(total, self.config.max_storage_bytes)
            free = max(0, min(free, self.config.max_storage_bytes - used))
        return used, free, total

    def update_read_only(self) -> bool:
        """Re-evaluates read-only mode; returns whether it changed."""
        used, free, total = self.disk_usage()
        frac = 1.0 - free / total if total else 1.0
        if self.config.max_storage_bytes:
            frac = max(frac, used / self.config.max_storage_bytes)
        changed = self.core.judge_disk(frac, self.config.disk_usage_threshold, self.config.disk_usage_margin)
        if changed and self.core.read_only:
            log.warning("disk usage %.1f%% >= %.1f%%: read-only", frac * 100, self.config.disk_usage_threshold * 100)
        elif changed:
            log.warning("disk usage %.1f%%: writable again", frac * 100)
        return changed

    # -- checkpoints -------------------------------------------------------------------------

    @property
    def checkpoint_due(self) -> bool:
        return self._checkpoint_wanted or self._since_checkpoint >= self.config.checkpoint_bytes

    def checkpoint_past(self, ledger_id: int, entry_id: int) -> bool:
        """A rotted record of this entry was found: where the next start
        would replay it (at or after the checkpoint's position), a
        checkpoint is due now, so that the start begins after it rather
        than refuse the data dir as damaged (a bad record with marks after
        it: bookie/journal.py), even once autorecovery has written the
        entry again elsewhere in the journal.  Whether one is wanted."""
        st = self.core.ledgers.get(ledger_id)
        at = st.index.get(entry_id) if st is not None else None
        if at is not None and not JournalPosition(*unpack_location(at[0])) < self.checkpoint_pos:
            self._checkpoint_wanted = True
        return self._checkpoint_wanted

    async def checkpoint(self) -> JournalPosition:
        """Writes a checkpoint: the state and index as of `applied_end`, the
        end of the last record applied.  Records after it are replayed on the
        next start; the term and fence changes among them are already in the
        snapshot, and replaying them again is harmless (they only raise)."""
        await self.journal.sync()
        pos = self.applied_end
        snapshot = checkpoint.encode(self.core, pos)  # in the loop thread: consistent
        await asyncio.get_running_loop().run_in_executor(None, self._write_checkpoint, snapshot)
        self.checkpoint_pos = pos
        self._since_checkpoint = 0
        self._checkpoint_wanted = False
        return pos

    def _write_checkpoint(self, data: bytes) -> None:
        write_durably(self.dir / "checkpoint", data)

    def has_history(self) -> bool:
        """Whether this data dir was served before (a journal or checkpoint
        is there): opening it is a restart."""
        return bool(self.journal.segments()) or (self.dir / "checkpoint").exists()

    def _check_format(self) -> None:
        """Refuses a data dir written with another entry record layout
        (``E.RECORD_FORMAT``): replayed, its first entry record would fail
        its checks and the journal be cut there as a torn tail."""
        path, want = self.dir / "FORMAT", E.RECORD_FORMAT
        if path.exists():
            got = path.read_text().strip()
            if got != want:
                raise StorageFormatError(f"{self.dir} holds {got!r}; this bookie reads {want!r}")
            return
        if self.journal.segments() or (self.dir / "checkpoint").exists():
            raise StorageFormatError(f"{self.dir} was written by an earlier bookie (52-byte entry records, no "
                                     f"FORMAT file); this bookie reads {want!r}: use a new data dir")
        write_durably(path, (want + "\n").encode())

    def _load_checkpoint(self) -> JournalPosition | None:
        path = self.dir / "checkpoint"
        if not path.exists():
            return None
        try:
            return checkpoint.decode(path.read_bytes(), self.core, str(path))
        except checkpoint.BadCheckpoint as e:   # (refused: what it held would be answered as never written)
            raise DamagedDataDir(str(e)) from None

    # -- garbage collection ---------------------------------------------------------------------

    async def collect_garbage(self) -> dict:
        """Removes dead segments and compacts mostly-dead ones.  Returns what
        it did."""
        journal = self.journal
        cur = journal.current_segment
        sealed = [s for s in journal.segments() if s != cur]
        sizes = {}
        for s in sealed:
            try:
                sizes[s] = journal.path(s).stat().st_size
            except FileNotFoundError:
                pass
        to_compact = [
            s for s, size in sizes.items()
            if 0 < self.live_bytes.get(s, 0) < size * self.config.compaction_threshold
        ]
        relocated = 0
        for s in to_compact:
            relocated += await self._compact(s)
        dead = [s for s in sizes if self.live_bytes.get(s, 0) <= 0]
        removed = []
        if dead:
            # Replay starts at the checkpoint: a segment at or after it may
            # still hold state records, so checkpoint past it first.
            if any(not s < self.checkpoint_pos.segment for s in dead):
                await self.checkpoint()
            for s in dead:
                if s < self.checkpoint_pos.segment and s != journal.current_segment:
                    journal.remove_segment(s)
                    self.live_bytes.pop(s, None)
                    removed.append(s)
        return {"removed_segments": removed, "compacted_segments": to_compact, "relocated_entries": relocated}

    async def _compact(self, seg: int) -> int:
        """Copies the live records of a segment to the journal head."""
        data = await asyncio.get_running_loop().run_in_executor(None, self.journal.read_segment, seg)
        olds, recs = [], []
        for rec in _iter_entry_records(data):
            body_rtype, body, body_off = rec
            base = 4 + 8 * struct.unpack_from("<I", body, 0)[0] if body_rtype == R_RELOCATED else 0
            for h in E.iter_headers(body[base:]):
                old = pack_location(seg, body_off + base + h.offset)
                cur = self.core.ledgers.get(h.ledger_id)
                if cur is not None and (got := cur.index.get(h.entry_id)) is not None and got[0] == old:
                    olds.append(old)
                    recs.append(bytes(body[base + h.offset : base + h.offset + h.size]))
        if not olds:
            return 0
        body = struct.pack(f"<I{len(olds)}Q", len(olds), *olds) + b"".join(recs)
        await self._append(R_RELOCATED, body, lambda b, seg, off: self._apply_relocated(memoryview(b), seg, off))
        return len(olds)

    def close(self) -> None:
        self.journal.close()
        self._unlock()


def _iter_entry_records(data: bytes):
    """(type, body, body offset) of each entry-bearing record of a segment."""
    from bookie.journal_record import RECORD_HEADER, RECORD_HEADER_SIZE

    mv = memoryview(data)
    off = 0
    while off + RECORD_HEADER_SIZE <= len(data):
        blen, rtype, _ = RECORD_HEADER.unpack_from(data, off)
        if rtype == 0:
            break  # the zeros after the last record of a preallocated segment
        body_off = off + RECORD_HEADER_SIZE
        if body_off + blen > len(data):
            break
        if rtype in (R_ENTRIES, R_RELOCATED):
            yield rtype, mv[body_off : body_off + blen], body_off
        off = body_off + blen
