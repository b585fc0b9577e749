"""A bookie's Prometheus metrics: the data path's counters and histograms.

One ``BookieMetrics`` per bookie, on a registry of its own (several bookies
may share a process in tests). The gRPC handlers report into it through the
``observed`` decorator (requests, entries, bytes, latency, refusals by
status, fencing reads) and two calls of the Add stream (an entry made
durable; the acks sent); the journal reports each group commit
(``commit``); the upkeep loop each GC pass (``gc``). Gauges that are a
state (index entries, disk, ledgers, read-only, journal queue) are read at
scrape time by ``bookstream/admin_http.py`` from the Info snapshot and the
journal, so they cannot drift from the bookie's own figures.

Every name here starts ``bookstream_bookie_``; ``ops/grafana/bookstream.json``
uses exactly these names (``tests/test_metrics.py`` checks it).
"""
from __future__ import annotations

import functools
import inspect
import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from bookie.core import Status

# 50 us .. ~13 s: a durable add is at least one fdatasync; a read may be served from the page cache.
LATENCY_BUCKETS = tuple(50e-6 * 2 ** i for i in range(19))
# 256 B .. 64 MiB: bytes written by one group commit.
COMMIT_BYTES_BUCKETS = tuple(256 * 4 ** i for i in range(10))
# The reads whose READ_FENCE flag fences a ledger (recovery).
FENCING = ("ReadEntry", "ReadRange", "ReadLac")


class BookieMetrics:
    """The bookie's event metrics (counters, histograms) on ``self.registry``."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        p = "bookstream_bookie_"
        self.requests = Counter(p + "requests", "RPCs served, by method", ["method"], registry=r)
        self.refusals = Counter(p + "refusals", "entries or requests answered with a non-OK status "
                                "(INVALID_TERM: a stale writer; FENCED: a fenced ledger)", ["method", "status"],
                                registry=r)
        self.fence_requests = Counter(p + "fence_requests", "reads that asked to fence a ledger (recovery)",
                                      registry=r)
        self.add_entries = Counter(p + "add_entries", "entries made durable and acknowledged", registry=r)
        self.add_bytes = Counter(p + "add_bytes", "bytes of the add frames made durable", registry=r)
        self.add_latency = Histogram(p + "add_latency_seconds", "an add frame from its arrival to durable "
                                     "(journal written and fdatasync'd)", buckets=LATENCY_BUCKETS, registry=r)
        self.read_entries = Counter(p + "read_entries", "entries sent by reads", registry=r)
        self.read_bytes = Counter(p + "read_bytes", "bytes of entries sent by reads", registry=r)
        self.read_latency = Histogram(p + "read_latency_seconds", "a read RPC from its arrival to its last answer",
                                      ["method"], buckets=LATENCY_BUCKETS, registry=r)
        self.commit_bytes = Histogram(p + "journal_group_commit_bytes", "bytes written by one journal group commit",
                                      buckets=COMMIT_BYTES_BUCKETS, registry=r)
        self.commit_latency = Histogram(p + "journal_fdatasync_seconds", "one journal group commit: writes and "
                                        "fdatasync", buckets=LATENCY_BUCKETS, registry=r)
        self.gc_runs = Counter(p + "gc_runs", "garbage-collection passes", registry=r)
        self.scrub_passes = Counter(p + "scrub_passes", "scrub passes done (every entry held read back and "
                                    "checked: bookie/scrub.py)", registry=r)
        self.scrub_entries = Counter(p + "scrub_entries", "entries the scrub checked", registry=r)
        self.scrub_bytes = Counter(p + "scrub_bytes", "bytes the scrub read", registry=r)
        self.scrub_rotted_entries = Counter(p + "scrub_rotted_entries", "entries found rotted on disk (by the "
                                            "scrub or a read), each reported to autorecovery (one still rotted "
                                            "counts again at each pass, until it is filled)", registry=r)
        self.gc_removed_segments = Counter(p + "gc_removed_segments", "journal segments deleted by GC", registry=r)
        self.gc_compacted_segments = Counter(p + "gc_compacted_segments", "journal segments compacted", registry=r)
        self.gc_relocated_entries = Counter(p + "gc_relocated_entries", "entries copied by compaction", registry=r)
        self.gc_deleted_ledgers = Counter(p + "gc_deleted_ledgers", "ledgers deleted here because the metadata "
                                          "no longer has them (bookie/ledger_gc.py)", registry=r)
        self.gc_over_replicated_ledgers = Counter(p + "gc_over_replicated_ledgers", "ledgers whose entries were "
                                                  "cleared here because their metadata no longer names this "
                                                  "bookie (bookie/ledger_gc.py)", registry=r)
        # labelled children looked up once (a labels() call costs more than the observation);
        # these are exported at 0 from the start (the dashboard's series)
        self._latency = {m: self.read_latency.labels(m) for m in ("ReadEntry", "ReadRange", "ReadPort")}
        self._requests: dict = {}
        self._refusals: dict = {}
        for st in ("INVALID_TERM", "FENCED"):
            self._refusal("Add", st)

    def _refusal(self, method: str, status: str):
        child = self._refusals.get((method, status))
        if child is None:
            child = self._refusals[(method, status)] = self.refusals.labels(method, status)
        return child

    # -- reports from the bookie ----------------------------------------------

    def added(self, entries: int, size: int, seconds: float) -> None:
        self.add_entries.inc(entries)
        self.add_bytes.inc(size)
        self.add_latency.observe(seconds)

    def acked(self, acks) -> None:
        """Counts the refusals in a batch of AddAcks (per entry where the ack lists them)."""
        for a in acks:
            if a.errors:
                for e in a.errors:
                    self._refusal("Add", _name(e.status)).inc()
            elif a.status:
                self._refusal("Add", _name(a.status)).inc()

    def commit(self, size: int, seconds: float) -> None:
        self.commit_bytes.observe(size)
        self.commit_latency.observe(seconds)

    def ledger_gc(self, done: dict) -> None:
        self.gc_deleted_ledgers.inc(len(done["ledgers_deleted"]))

    def over_replicated_gc(self, done: dict) -> None:
        self.gc_over_replicated_ledgers.inc(len(done["ledgers_cleared"]))

    def gc(self, done: dict) -> None:
        self.gc_runs.inc()
        self.gc_removed_segments.inc(len(done.get("removed_segments", ())))
        self.gc_compacted_segments.inc(len(done.get("compacted_segments", ())))
        self.gc_relocated_entries.inc(done.get("relocated_entries", 0))

    def response(self, method: str, resp) -> None:
        """One answer of a read, LAC or metadata RPC."""
        st = getattr(resp, "status", 0)
        if st:
            self._refusal(method, _name(st)).inc()
        if method == "ReadEntry":
            self.read_entries.inc(not st)
            self.read_bytes.inc(len(resp.entry))
        # (a ReadRange frame is counted where it is built, ``range_frame``: a
        # bytes field read back from a message is a copy of it, 5-10 % of a
        # bookie's CPU serving a catch-up)

    def range_frame(self, count: int, nbytes: int) -> None:
        """One frame of a range read: its entries and their bytes."""
        self.read_entries.inc(count)
        self.read_bytes.inc(nbytes)

    def answered(self, method: str, request, seconds: float) -> None:
        """An RPC done (after its answers went through ``response``)."""
        child = self._requests.get(method)
        if child is None:
            child = self._requests[method] = self.requests.labels(method)
        child.inc()
        if method in FENCING and getattr(request, "flags", 0) & 1:  # READ_FENCE
            self.fence_requests.inc()
        latency = self._latency.get(method)
        if latency is not None:
            latency.observe(seconds)


_NAMES = {int(s): s.name for s in Status}


def _name(status: int) -> str:
    return _NAMES.get(status) or str(status)


def observed(method):
    """Decorates a BookieService handler (coroutine or async generator) so
    its answers are reported to ``self.metrics``."""
    name = method.__name__
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def gen(self, request, context):
            t0 = time.perf_counter()
            try:
                async for resp in method(self, request, context):
                    self.metrics.response(name, resp)
                    yield resp
            finally:
                self.metrics.answered(name, request, time.perf_counter() - t0)
        return gen

    @functools.wraps(method)
    async def unary(self, request, context):
        t0 = time.perf_counter()
        resp = await method(self, request, context)
        self.metrics.response(name, resp)
        self.metrics.answered(name, request, time.perf_counter() - t0)
        return resp
    return unary
