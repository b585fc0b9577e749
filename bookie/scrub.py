"""The scrubber: now and then a bookie reads back every entry it holds and
checks it (BookKeeper's local scrub, ``localScrubPeriod``).

A record that rots on disk after it was acknowledged is never served (its
CRC is checked on every read), but most entries of a log are read once,
soon after they are written: without a scrub, a rotted copy is found only
when a reader needs it, perhaps once the other replicas are gone too.  A
pass walks every ledger's index, reads its records (near ones in one pread
of at most ``SPAN_BYTES``, in a thread, at ``rate`` bytes/s: ``Pace``, the
token bucket re-replication uses), and checks that each is the entry its index
names (ledger, id, length) and that its CRC matches.  A rotted entry, once
confirmed (the index still names those bytes and they are still bad: a GC
pass may have moved or dropped it meanwhile), is reported: the log line,
the metric, and an autorecovery task naming this bookie *damaged* for the
ledger at those ids (as the periodic full check names the ids it finds
missing): a worker copies each back onto this bookie from the other
replicas (stream/autorecovery/worker_core.py ``plan_ledger``), in sealed
fragments, and in an open one up to its LAC; above the LAC once a live
writer's adds pass it, or, with no live writer, once the worker has taken
the stream over.  A read that meets a rotted record reports it the same
way (``Scrubber.found``).

The next pass is due ``interval`` after the last one ended, noted in the
data dir (``SCRUB_FILE``, wall-clock seconds), so a bookie restarted more
often than the interval still scrubs; a data dir never scrubbed has its
first pass ``FIRST_PASS_S`` after its start (or the interval, if shorter).
A pass asked for (``bookstream bookies scrub``: the bookie's key under
``scrub-requests/`` in etcd, watched; read at the start too) begins at
once, or once the running one ends (a pass begun before the ask does not
serve it); the key is deleted at the revision the pass served, so a newer
ask made meanwhile starts another.  ``Info`` shows the running pass's
progress (``scrub_pass_checked`` of ``scrub_pass_entries``).

Pure: ``rotted`` (what a span's bytes say) and ``due`` (when a pass
starts).  The rest is the adapter: the index, the preads, the clock, etcd.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Callable, Sequence

from bookie.entry import rotted
from bookie.journal import ShortRead, pread_exactly, write_durably
from bookie.storage import Storage, unpack_location

log = logging.getLogger(__name__)

SCRUB_FILE = "scrubbed"     # when the last pass ended (wall-clock seconds)
SPAN_BYTES = 1 << 20        # the most one pread reads (in a thread: a few hops per MB)
GAP_BYTES = 4096            # records this close in a segment are read in one pread (journal headers between)
WINDOW_IDS = 4096           # ids taken from a ledger's index at a time
FIRST_PASS_S = 3600.0       # a data dir never scrubbed: its first pass, this long after the start

def due(last_end: float | None, interval: float, started: float) -> float:
    """When the next pass starts: ``interval`` after the last one ended,
    and not before ``min(interval, FIRST_PASS_S)`` after the start (which
    is when a data dir never scrubbed has its first)."""
    first = started + min(interval, FIRST_PASS_S)
    return first if last_end is None else max(last_end + interval, first)


def last_pass_end(data_dir: Path) -> float | None:
    try:
        return float((Path(data_dir) / SCRUB_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


@dataclasses.dataclass
class PassResult:
    entries: int = 0
    bytes: int = 0
    rotted: list[tuple[int, int]] = dataclasses.field(default_factory=list)   # (ledger, entry)
    seconds: float = 0.0


class Scrubber:
    """One bookie's scrub: its passes (``scrub_pass``), what they and the
    reads found, and the reports of it to autorecovery (``publish``: a
    callable taking a ledger id and its rotted entry ids, the adapter to
    etcd; None without one)."""

    def __init__(self, storage: Storage, rate: float, *,
                 publish: Callable[[int, Sequence[int]], None] | None = None,
                 metrics=None) -> None:
        from stream.autorecovery.worker_core import Pace

        self.storage, self.metrics, self.publish = storage, metrics, publish
        self.pace = Pace.of(rate)
        self.unreported: dict[int, set[int]] = {}   # ledger -> its rotted entries not yet reported
        self.wake = asyncio.Event()          # set by a finding: report it now, not at the next pass
        self.reported: set[tuple[int, int]] = set()
        self.last_end = last_pass_end(storage.dir)   # (wall clock; None: never)
        self.next_due: float | None = None
        self.rotted_found = 0   # since the start
        self.requested: int | None = None   # the etcd revision of a pass asked for, not yet served
        self.pass_checked = self.pass_entries = 0   # the running pass's progress (0, 0: none)

    def request(self, revision: int) -> None:
        """A pass asked for at ``revision`` (the request key's): the next
        begins now (in the loop thread)."""
        if revision > (self.requested or 0):
            self.requested = revision
            self.wake.set()

    def found(self, ledger_id: int, entry_id: int, where: str) -> None:
        """A rotted entry, confirmed: said and its ledger reported once a
        pass (a task found done meanwhile, as an open fragment's is until it
        is sealed, comes back at the next pass)."""
        if (ledger_id, entry_id) in self.reported:
            return
        self.reported.add((ledger_id, entry_id))
        self.unreported.setdefault(ledger_id, set()).add(entry_id)
        self.storage.checkpoint_past(ledger_id, entry_id)   # (its next start must not replay it: refused)
        self.rotted_found += 1
        self.wake.set()
        log.error("entry %d of ledger %d rotted on disk (found by %s): reported to autorecovery as damaged here",
                  entry_id, ledger_id, where)
        if self.metrics is not None:
            self.metrics.scrub_rotted_entries.inc()

    async def report(self) -> None:
        """Publishes the unreported ledgers' tasks (kept for the next try
        while etcd is unavailable, or while the bookie is halted: its etcd
        is not one to act on)."""
        if self.publish is None or self.storage.core.halted:
            return
        loop = asyncio.get_running_loop()
        for lid in sorted(self.unreported):
            try:
                await loop.run_in_executor(None, self.publish, lid, sorted(self.unreported[lid]))
            except Exception as e:   # (MetadataError: etcd away; tried again after the next wait)
                log.warning("could not report ledger %d's rotted entries to autorecovery: %s", lid, e)
                return
            del self.unreported[lid]

    def _confirm(self, lid: int, eid: int, loc: int, ln: int) -> bool:
        """Whether the index still names those bytes for the entry and they
        are still not it (in the loop thread, no await: no GC pass between)."""
        st = self.storage.core.ledgers.get(lid)
        if st is None or st.index.get(eid) != (loc, ln):
            return False   # moved (compaction) or deleted since the window was taken
        seg, off = unpack_location(loc)
        try:
            rec = self.storage.journal.pread(seg, off, ln)
        except (FileNotFoundError, ShortRead):
            return True    # its segment gone or shorter than the index says: the disk's loss
        except OSError as e:   # (EIO, EMFILE...: nothing known of the record; the next pass reads it again)
            log.warning("scrub: entry %d of ledger %d could not be read: %s", eid, lid, e)
            return False
        return bool(rotted(rec, lid, [(eid, 0, ln)]))

    async def scrub_pass(self, clock: Callable[[], float] = time.monotonic, sleep=asyncio.sleep) -> PassResult:
        """Reads and checks every entry held, at the pace's rate (``clock``
        and ``sleep``: the pace's time)."""
        t0, out = clock(), PassResult()
        self.reported = set()
        ledgers = self.storage.core.ledgers
        self.pass_checked, self.pass_entries = 0, sum(len(st.index) for st in ledgers.values())
        log.info("scrub: a pass over %d entries of %d ledgers begins", self.pass_entries, len(ledgers))
        try:
            for lid in sorted(ledgers):
                st = ledgers.get(lid)
                if st is None:
                    continue
                first, top = 0, st.index.last_entry   # (a ledger written faster than scrubbed is not chased)
                while (window := self._window(lid, first, top)) is not None:
                    for span in _spans(window):
                        await self._check_span(lid, span, out, clock, sleep)
                    first = window[-1][0] + 1
        finally:
            self.pass_checked = self.pass_entries = 0
        out.seconds = clock() - t0
        if self.metrics is not None:
            self.metrics.scrub_passes.inc()
        return out

    def _window(self, lid: int, first: int, last: int) -> list[tuple[int, int, int]] | None:
        """Up to ``WINDOW_IDS`` (id, location, length) of the ledger's index
        in [first, last], copied (``Storage.held_records``)."""
        return self.storage.held_records(lid, first, last, WINDOW_IDS) or None

    async def _check_span(self, lid: int, span: list[tuple[int, int, int]], out: PassResult, clock, sleep) -> None:
        loc0 = span[0][1]
        seg, off = unpack_location(loc0)
        size = span[-1][1] + span[-1][2] - loc0
        if self.pace is not None:
            wait = self.pace.take(clock(), size)
            if wait:
                await sleep(wait)
        try:   # (read and checked in a thread, on a dup of the segment's fd: a GC pass may close it meanwhile)
            fd = os.dup(self.storage.journal.read_fd(seg))
            try:
                bad = await asyncio.get_running_loop().run_in_executor(
                    None, _read_rotted, fd, seg, off, size, lid, [(eid, loc - loc0, ln) for eid, loc, ln in span])
            finally:
                os.close(fd)
        except OSError:
            bad = [eid for eid, _, _ in span]   # each judged on its own below
        out.entries += len(span)
        out.bytes += size
        self.pass_checked = out.entries
        if self.metrics is not None:
            self.metrics.scrub_entries.inc(len(span))
            self.metrics.scrub_bytes.inc(size)
        if bad:
            where = {eid: (loc, ln) for eid, loc, ln in span}
            for eid in bad:
                if self._confirm(lid, eid, *where[eid]):
                    out.rotted.append((lid, eid))
                    self.found(lid, eid, "the scrub")


def _read_rotted(fd: int, seg: int, off: int, size: int, lid: int, records) -> list[int]:
    return rotted(pread_exactly(fd, size, off, seg), lid, records)


def damaged_publisher(registration, bookie_id: str) -> Callable[[int, Sequence[int]], None]:
    """Reports a ledger's rotted entries as the periodic full check does:
    its autorecovery task, naming this bookie damaged at those ids, which
    a worker copies back onto it from the other replicas (blocking: etcd)."""
    from stream.autorecovery.keys import AutorecoveryKeys, merge_ranges   # (the client package's: the task's layout)

    keys = AutorecoveryKeys(registration.store, registration.cluster)
    return lambda ledger_id, ids: keys.publish(ledger_id, {bookie_id}, damaged=True,
                                               ids={bookie_id: merge_ranges([(e, e) for e in ids])})


def watch_requests(registration, bookie_id: str, scrubber: Scrubber,
                   loop: asyncio.AbstractEventLoop) -> tuple[Callable[[int], None], Callable[[], None]]:
    """Watches the bookie's scrub-request key (``bookstream bookies
    scrub``), from now, then reads it (an ask made before the start is
    served too): each put asks ``scrubber`` for a pass.  Returns
    ``served`` for ``scrub_loop`` (the key deleted at the revision a pass
    served: a newer ask stays) and the watch's cancel.  Blocking: etcd."""
    from metadata.errors import BadVersion, MetadataError
    from metadata.layout import KeyLayout
    from metadata.watch import EventType

    store = registration.store
    key = KeyLayout(registration.cluster).scrub_request_key(bookie_id)

    def on_event(ev) -> None:
        if ev.type is EventType.PUT:
            loop.call_soon_threadsafe(scrubber.request, ev.mod_revision)

    cancel = store.watch_key(key, on_event)   # (it resumes by itself after an etcd outage)
    try:
        cur = store.get(key)
    except MetadataError as e:   # (etcd away at the start: an earlier ask waits for the next start)
        log.warning("scrub: could not read the bookie's scrub request: %s", e)
        cur = None
    if cur is not None:
        loop.call_soon_threadsafe(scrubber.request, cur.mod_revision)

    def served(revision: int) -> None:
        try:
            store.delete(key, revision)
        except BadVersion:
            pass   # asked again since (or cleared by hand): that ask stands
    return served, cancel


def _spans(window: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """The window's records in runs of one segment, in order, each less
    than ``GAP_BYTES`` after the one before (the journal's record headers
    and marks between two add frames) and at most ``SPAN_BYTES`` in all (a
    record larger than that alone)."""
    spans: list[list[tuple[int, int, int]]] = []
    cur: list[tuple[int, int, int]] = []
    for rec in window:
        if cur and not (0 <= rec[1] - (cur[-1][1] + cur[-1][2]) < GAP_BYTES and rec[1] + rec[2] - cur[0][1] <= SPAN_BYTES
                        and unpack_location(rec[1])[0] == unpack_location(cur[0][1])[0]):
            spans.append(cur)
            cur = []
        cur.append(rec)
    if cur:
        spans.append(cur)
    return spans


async def scrub_loop(scrubber: Scrubber, interval: float, retry: float = 30.0,
                     served: Callable[[int], None] | None = None) -> None:
    """Passes every ``interval`` (``due``), or at once when one is asked
    for (``Scrubber.request``), the findings reported between them (again
    every ``retry`` while some wait).  ``served(revision)``: the request a
    pass served is done (the adapter deletes its key at that revision;
    blocking: etcd)."""
    data_dir = scrubber.storage.dir
    started = time.time()
    while True:
        start_at = scrubber.next_due = due(scrubber.last_end, interval, started)
        while scrubber.requested is None and (left := start_at - time.time()) > 0:
            try:
                await asyncio.wait_for(scrubber.wake.wait(), min(left, retry) if scrubber.unreported else left)
            except asyncio.TimeoutError:
                pass
            scrubber.wake.clear()
            await scrubber.report()
        serving = scrubber.requested   # (a request made once the pass has begun waits for the next)
        if serving is not None:
            log.info("scrub: a pass asked for (request revision %d)", serving)
        result = await scrubber.scrub_pass()
        scrubber.last_end = time.time()
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, write_durably, data_dir / SCRUB_FILE, f"{scrubber.last_end:.3f}\n".encode())
        except OSError as e:   # (the next start scrubs sooner than due: no harm)
            log.warning("could not note the scrub's end in %s: %s", data_dir / SCRUB_FILE, e)
        log.info("scrub: %d entries (%d bytes) checked in %.1f s, %d rotted",
                 result.entries, result.bytes, result.seconds, len(result.rotted))
        await scrubber.report()
        if serving is not None:
            if served is not None:
                try:
                    await asyncio.get_running_loop().run_in_executor(None, served, serving)
                except Exception as e:   # (MetadataError: the key stays; the next start serves it again)
                    log.warning("scrub: could not clear the served request (revision %d): %s", serving, e)
            if scrubber.requested == serving:
                scrubber.requested = None
