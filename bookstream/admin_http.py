"""A bookie's admin HTTP port: `/health`, `/ready`, `/metrics`, `/info`.

    bookstream bookie --data-dir DIR --etcd HOST:PORT --admin-port 8000

- `/health` (liveness): 200 when the bookie's event loop answers within
  ``LOOP_TIMEOUT`` seconds, 503 otherwise (a stuck bookie fails it);
- `/ready` (for a Kubernetes readiness probe): 200 when the bookie is
  registered in etcd (`held`, or `suspect`: refreshes failing for less than
  a TTL) and writable; 503 with the reason otherwise;
- `/metrics`: Prometheus text format (``prometheus_client``): the data path's
  counters and histograms (``bookie/metrics.py``) and the Info figures;
- `/info`: the Info figures as JSON (the same record `bookstream bookies info` prints).

The port opens before the bookie starts (``BookieServer.starting``: its
journal's replay, its cookie's check, a lost disk waiting to rejoin under
its id, its registration), so a liveness probe does not restart a bookie
that is busy starting: meanwhile `/health` is 200 while the loop answers,
`/ready` 503 with what it is doing, `/info` 503 with the same, and
`/metrics` has `bookstream_bookie_starting` 1 and the data path's figures
only.

Every figure comes from one source, the bookie's own Info RPC handler, run on
the bookie's event loop (so what HTTP reports is a consistent snapshot, read
where the values change); the HTTP server is a small threaded WSGI server of
its own, so a scrape never waits behind the data path's event loop for more
than that one call.

With ``tls`` (``bookstream bookie --admin-tls``: the bookie's own
``--tls-cert``/``--tls-key``) the port speaks HTTPS only; with a CA
(``--tls-ca``, mutual TLS) clients must present a certificate it signed. The
files are looked at again before each connection's handshake, as the gRPC
port does: rotated certificates are taken up without a restart.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socketserver
import ssl
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)

LOOP_TIMEOUT = 2.0
# journal_sync_histogram: element i counts group commits under 64 << i microseconds (i < 15).
SYNC_BUCKETS_S = [(64 << i) / 1e6 for i in range(15)]


def when_utc(t: float) -> str | None:
    """Wall-clock seconds as UTC ISO 8601 (None for 0: never)."""
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds") if t else None


def info_record(i) -> dict:
    """An InfoResponse as a flat record (JSON-ready)."""
    from bookstream_pb import bookie_pb2 as pb

    return {
        "bookie_id": i.bookie_id,
        "state": "readonly" if i.state == pb.READ_ONLY_STATE else "writable",
        "halted": i.halted or None,
        "scrub_last_end": when_utc(i.scrub_last_end), "scrub_next_due": when_utc(i.scrub_next_due),
        "scrub_rotted_entries": i.scrub_rotted_entries, "scrub_interval_s": i.scrub_interval,
        "scrub_running": ({"checked": i.scrub_pass_checked, "entries": i.scrub_pass_entries}
                          if i.scrub_pass_entries else None),
        "scrub_requested": i.scrub_requested or None,   # (a pass asked for, not yet served: its etcd revision)
        "set_aside_bytes": i.set_aside_bytes,   # (damaged data kept in the data dir: bookie/data_dir.py)
        "registration_state": i.registration_state or "not registering",
        "unregistered_seconds": round(i.unregistered_seconds, 1),
        "used_bytes": i.used_bytes, "free_bytes": i.free_bytes, "total_bytes": i.total_bytes,
        "disk_used_percent": round(100.0 * (i.total_bytes - i.free_bytes) / i.total_bytes, 1) if i.total_bytes else None,
        "ledgers": i.ledgers, "entries": i.entries, "journal_segments": i.segments,
        "journal_fsyncs": i.journal_fsyncs, "journal_bytes": i.journal_bytes,
        "journal_sync_max_ms": round(i.journal_sync_max_seconds * 1000, 2),
        "replayed_records": i.replayed_records, "replayed_bytes": i.replayed_bytes,
        "replay_seconds": round(i.replay_seconds, 3),
        "read_entry_requests": i.read_entry_requests, "read_range_requests": i.read_range_requests,
        "read_range_entries": i.read_range_entries,
        "journal_sync_histogram": list(i.journal_sync_histogram),
    }


def readiness(rec: dict) -> tuple[bool, str]:
    """Ready: registered (or not registering at all) and writable."""
    if rec.get("halted"):
        return False, f"halted, read-only for good: {rec['halted']}"
    if rec["state"] != "writable":
        return False, "read-only (disk usage above the threshold)"
    if rec["registration_state"] not in ("held", "suspect", "not registering"):
        return False, f"not registered in etcd ({rec['registration_state']} for {rec['unregistered_seconds']} s)"
    return True, "ready"


class Starting:
    """What a snapshot is while the bookie starts: its id and what it is doing."""

    def __init__(self, bookie_id: str, phase: str):
        self.bookie_id, self.phase = bookie_id, phase


class _Collector:
    """Prometheus families from one Info snapshot per scrape."""

    def __init__(self, snapshot, journal=None):
        self._snapshot = snapshot
        self._journal = journal

    def describe(self):
        return []  # unchecked collector: families are known only at scrape time

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        i = self._snapshot()
        if isinstance(i, Starting):
            g = GaugeMetricFamily("bookstream_bookie_starting", "1 while the bookie starts (not serving yet)",
                                  labels=["bookie_id"])
            g.add_metric([i.bookie_id], 1.0)
            yield g
            return
        rec = info_record(i)
        bid = [i.bookie_id]

        def gauge(name, doc, value):
            g = GaugeMetricFamily(f"bookstream_bookie_{name}", doc, labels=["bookie_id"])
            g.add_metric(bid, float(value))
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(f"bookstream_bookie_{name}", doc, labels=["bookie_id"])
            c.add_metric(bid, float(value))
            return c

        yield gauge("starting", "1 while the bookie starts (not serving yet)", 0)
        yield gauge("registered", "1 while the bookie's etcd registration is held",
                    rec["registration_state"] in ("held", "suspect"))
        yield gauge("unregistered_seconds", "seconds since the registration was lost (0 when held)",
                    i.unregistered_seconds)
        yield gauge("read_only", "1 while the bookie refuses normal adds (for lack of disk, or halted)",
                    rec["state"] == "readonly")
        yield gauge("halted", "1 once the bookie is read-only for good (its etcd untrusted, or its journal broken: /ready says why)",
                    bool(rec["halted"]))
        yield gauge("disk_used_bytes", "bytes of journal segments on disk", i.used_bytes)
        yield gauge("disk_free_bytes", "free bytes of the data dir's disk (or of --max-storage-bytes)", i.free_bytes)
        yield gauge("disk_total_bytes", "size of the data dir's disk (or --max-storage-bytes)", i.total_bytes)
        yield gauge("ledgers", "ledgers held", i.ledgers)
        yield gauge("index_entries", "entries in the index", i.entries)
        yield gauge("journal_segments", "journal segments on disk", i.segments)
        yield counter("journal_fsyncs", "journal group commits (write + fdatasync) since start", i.journal_fsyncs)
        yield counter("journal_bytes", "bytes appended to the journal since start", i.journal_bytes)
        yield counter("read_entry_requests", "ReadEntry RPCs since start", i.read_entry_requests)
        yield counter("read_range_requests", "ReadRange RPCs since start", i.read_range_requests)
        yield counter("read_range_entries", "entries sent by ReadRange since start", i.read_range_entries)
        yield gauge("replay_seconds", "time the last start spent replaying the journal", i.replay_seconds)
        if self._journal is not None:  # plain int reads: a scrape never waits for the event loop for these
            j = self._journal
            yield gauge("journal_queue_bytes", "bytes appended to the journal and not yet durable",
                        getattr(j, "_pending_bytes", 0) + getattr(j, "_inflight_bytes", 0))
            yield gauge("journal_queue_waiters", "adds and syncs waiting for the journal's next group commit",
                        len(getattr(j, "_waiters", ())))
        hist = list(i.journal_sync_histogram)
        if hist:
            h = HistogramMetricFamily("bookstream_bookie_journal_sync_seconds",
                                      "duration of journal group commits (writes + fdatasync)", labels=["bookie_id"])
            cum, buckets = 0, []
            for bound, n in zip(SYNC_BUCKETS_S + [float("inf")], hist):
                cum += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cum)))
            # the sum is not tracked by the bookie: estimate it from the bucket bounds (lower bound)
            lower = [0.0] + SYNC_BUCKETS_S
            estimate = sum(n * lower[k] for k, n in enumerate(hist[:len(lower)]))
            h.add_metric(bid, buckets, estimate)
            yield h


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    tls_context = None  # a _TlsContext: HTTPS only

    def get_request(self):
        sock, addr = super().get_request()
        if self.tls_context is not None:  # the handshake runs in the request's thread (its first read)
            sock = self.tls_context.get().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request, client_address) -> None:
        # a plain-HTTP client or one without a certificate fails the handshake: not the bookie's error
        log.debug("admin HTTP: connection from %s failed", client_address, exc_info=True)


class _TlsContext:
    """A server SSLContext of a TlsFiles, built again when its files change
    (a pair caught half rotated keeps the previous context)."""

    def __init__(self, tls):
        self.tls = tls
        self._stamp = tls.stamp()
        self._ctx = self._build()

    def _build(self) -> ssl.SSLContext:
        from metadata.tls import TlsConfigError

        if not (self.tls.cert and self.tls.key):
            raise TlsConfigError("an HTTPS admin port needs the bookie's certificate and key (--tls-cert, --tls-key)")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.tls.cert, self.tls.key)
            if self.tls.ca:  # mutual TLS: a client certificate of this CA is required
                ctx.load_verify_locations(self.tls.ca)
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as e:
            raise TlsConfigError(f"admin HTTPS: cannot use {self.tls.cert} / {self.tls.key}: {e}") from None
        return ctx

    def get(self) -> ssl.SSLContext:
        stamp = self.tls.stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._ctx = self._build()
                log.info("admin HTTPS: new certificate files loaded (%s)", self.tls.cert)
            except Exception as e:  # noqa: BLE001 - keep serving with the previous pair
                log.warning("admin HTTPS: TLS files changed but cannot be used yet (%s): keeping the previous ones", e)
        return self._ctx


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # access logs would flood the bookie's log at every scrape
        pass


class AdminHttp:
    """Serves the admin endpoints of a running BookieServer on ``host:port``
    (0: any free port) from a thread of its own; over HTTPS with ``tls``
    (a metadata.tls.TlsFiles: cert and key, and ca for client certificates)."""

    def __init__(self, server, loop: asyncio.AbstractEventLoop, host: str = "127.0.0.1", port: int = 0,
                 tls=None):
        from prometheus_client import generate_latest

        self._bookie = server
        self._loop = loop
        # the data path's counters and histograms (bookie/metrics.py), and the Info figures read per scrape
        self._registry = server.metrics.registry
        self._registry.register(_Collector(self.snapshot, server.storage.journal))
        self._generate = generate_latest
        context = _TlsContext(tls) if tls is not None else None  # checked before the port is opened
        self._httpd = make_server(host, port, self._app, server_class=_Server, handler_class=_Quiet)
        self._httpd.tls_context = context
        self.scheme = "https" if context is not None else "http"
        self.port = self._httpd.server_port
        self.address = f"{host}:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="admin-http", daemon=True)

    def start(self) -> "AdminHttp":
        self._thread.start()
        log.info("admin HTTP on %s://%s (/health /ready /metrics /info)", self.scheme, self.address)
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def snapshot(self):
        """The bookie's InfoResponse, computed on its event loop; while it
        starts, a ``Starting`` once the loop has answered."""
        b = self._bookie
        service, phase = b.service, b.starting
        if service is None or phase is not None:
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop).result(LOOP_TIMEOUT)
            return Starting(b.config.bookie_id, phase or "starting")
        fut = asyncio.run_coroutine_threadsafe(service.Info(None, None), self._loop)
        return fut.result(LOOP_TIMEOUT)

    def _app(self, environ, start_response):
        path = environ.get("PATH_INFO", "/")
        try:
            if path == "/metrics":
                body, ctype, status = self._generate(self._registry), "text/plain; version=0.0.4; charset=utf-8", 200
            elif path in ("/health", "/healthz", "/livez"):
                i = self.snapshot()
                body = f"ok (starting: {i.phase})\n".encode() if isinstance(i, Starting) else b"ok\n"
                ctype, status = "text/plain", 200
            elif path in ("/ready", "/readyz"):
                i = self.snapshot()
                ok, why = (False, f"starting: {i.phase}") if isinstance(i, Starting) else readiness(info_record(i))
                body, ctype, status = (json.dumps({"ready": ok, "reason": why}) + "\n").encode(), "application/json", \
                    200 if ok else 503
            elif path == "/info":
                i = self.snapshot()
                if isinstance(i, Starting):
                    rec, status = {"bookie_id": i.bookie_id, "starting": i.phase}, 503
                else:
                    rec, status = info_record(i), 200
                    rec["address"] = self._bookie.address
                body, ctype = (json.dumps(rec) + "\n").encode(), "application/json"
            else:
                body, ctype, status = b"not found: try /health /ready /metrics /info\n", "text/plain", 404
        except Exception as e:  # the loop did not answer in time (a stuck bookie), or a bug
            body, ctype, status = f"unavailable: {type(e).__name__}: {e}\n".encode(), "text/plain", 503
        reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
        start_response(f"{status} {reason}", [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]
