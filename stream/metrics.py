"""Client metrics: what a writer and a take-over report to Prometheus.

An application serves them like any ``prometheus_client`` metric::

    import prometheus_client
    prometheus_client.start_http_server(9100)   # /metrics of the default registry
    bk = BookKeeperClient("127.0.0.1:2379")     # reports into ClientMetrics.default()

``ClientConfig(metrics=ClientMetrics(registry))`` puts one client's metrics on
a registry of the application's own. The client calls in at a few places:
``track_add`` where an add's future is made (ledger.py), ``ensemble_changes``
where a new fragment is published (ledger_write.py), ``timed_takeover`` around
``stream.take_over``. Names start ``bookstream_client_`` and are the ones
``ops/grafana/bookstream.json`` uses.
"""
from __future__ import annotations

import functools
import threading
import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from bookie.metrics import LATENCY_BUCKETS

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
TAKEOVER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ClientMetrics:
    """One set of client metrics on ``registry``."""

    _default: "ClientMetrics | None" = None
    _lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry if registry is not None else CollectorRegistry()
        p = "bookstream_client_"
        self.append_latency = Histogram(p + "append_latency_seconds", "an add (or a batch) from queued to "
                                        "acknowledged by an ack quorum (or failed)", buckets=LATENCY_BUCKETS,
                                        registry=r)
        self.batch_entries = Histogram(p + "batch_entries", "entries per add call (1 for add_entry)",
                                       buckets=BATCH_BUCKETS, registry=r)
        self.appended_entries = Counter(p + "appended_entries", "entries acknowledged", registry=r)
        self.failed_adds = Counter(p + "failed_adds", "add calls that failed", registry=r)
        self.pending_adds = Gauge(p + "pending_adds", "add calls queued and not yet resolved", registry=r)
        self.ensemble_changes = Counter(p + "ensemble_changes", "new fragments published after a bookie "
                                        "failed", registry=r)
        self.takeovers = Counter(p + "takeovers", "take-overs of a stream ledger (a new term), by outcome",
                                 ["outcome"], registry=r)
        self.takeover_seconds = Histogram(p + "takeover_seconds", "a take-over: term raised, recovery, new "
                                          "term open", buckets=TAKEOVER_BUCKETS, registry=r)
        for outcome in ("ok", "failed"):  # exported at 0 from the start
            self.takeovers.labels(outcome)

    @classmethod
    def default(cls) -> "ClientMetrics":
        """The process-wide metrics, on prometheus_client's default registry."""
        with cls._lock:
            if cls._default is None:
                cls._default = cls(REGISTRY)
            return cls._default

    def track_add(self, fut, entries: int = 1):
        """Observes an add's future (returned as given)."""
        t0 = time.perf_counter()
        self.pending_adds.inc()
        self.batch_entries.observe(entries)

        def done(f) -> None:
            self.pending_adds.dec()
            self.append_latency.observe(time.perf_counter() - t0)
            if f.cancelled() or f.exception() is not None:
                self.failed_adds.inc()
            else:
                self.appended_entries.inc(entries)
        fut.add_done_callback(done)
        return fut


class AutorecoveryMetrics:
    """A replication worker's figures (``bookstream autorecovery run --metrics-port``)."""

    _default: "AutorecoveryMetrics | None" = None

    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry if registry is not None else CollectorRegistry()
        p = "bookstream_autorecovery_"
        self.tasks = Counter(p + "tasks", "under-replicated ledger tasks worked, by outcome (done, wait, "
                             "report, ...)", ["outcome"], registry=r)
        self.fragments = Counter(p + "fragments", "fragments re-replicated (a bookie replaced)", registry=r)
        self.copied_entries = Counter(p + "copied_entries", "entries re-replicated", registry=r)
        self.copied_bytes = Counter(p + "copied_bytes", "bytes re-replicated", registry=r)
        self.rate_limit = Gauge(p + "rate_limit_bytes", "the worker's copy rate limit, bytes/s (0: none; "
                                "--rate-mb)", registry=r)
        self.paced = Counter(p + "paced_seconds", "seconds during which a copy's frame waited for its turn "
                             "under the rate limit (growing by about one a second: the limit, not the disks, "
                             "bounds the copies)", registry=r)
        self.tasks.labels("done")

    @classmethod
    def default(cls) -> "AutorecoveryMetrics":
        with ClientMetrics._lock:
            if cls._default is None:
                cls._default = cls(REGISTRY)
            return cls._default

    def task(self, out) -> None:
        """One ``recover_ledger_fragments`` outcome."""
        self.tasks.labels(getattr(out.step, "value", str(out.step))).inc()
        self.fragments.inc(len(out.replaced))
        self.copied_entries.inc(out.entries)
        self.copied_bytes.inc(out.bytes)
        self.paced.inc(out.paced_seconds)


def timed_takeover(fn):
    """Decorates ``take_over(bk, ledger_id)``: counts it and times it in ``bk.metrics``."""
    @functools.wraps(fn)
    async def wrapper(bk, *args, **kw):
        m = getattr(bk, "metrics", None)
        if m is None:
            return await fn(bk, *args, **kw)
        t0 = time.perf_counter()
        try:
            out = await fn(bk, *args, **kw)
        except BaseException:
            m.takeovers.labels("failed").inc()
            raise
        m.takeovers.labels("ok").inc()
        m.takeover_seconds.observe(time.perf_counter() - t0)
        return out
    return wrapper
