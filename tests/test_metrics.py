"""Metrics (issue 17): a real bookie's /metrics after real adds and reads,
parsed with prometheus_client's parser; the client's registry; and the
Grafana dashboard's expressions against names a real scrape exports."""
from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bookstream.processes import BookieProcess
from stream import errors as se
from stream.client import BookKeeperClient, ClientConfig
from stream.metrics import AutorecoveryMetrics, ClientMetrics
from tests.conftest import run

DASHBOARD = Path(__file__).resolve().parents[1] / "ops" / "grafana" / "bookstream.json"


def scrape(admin: str) -> dict:
    """{sample name: {labels tuple: value}} of a bookie's /metrics."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        return samples(r.read().decode())


def samples(text: str) -> dict:
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(found: dict, name: str, **labels) -> float:
    return sum(v for k, v in found.get(name, {}).items() if set(labels.items()) <= set(k))


def start(base, etcd, cluster, n):
    return [BookieProcess(base / f"b{i}", etcd=etcd, cluster=cluster,
                          extra_args=["--registration-ttl", "3", "--admin-port", "0"]).start() for i in range(n)]


def test_bookie_and_client_metrics_after_real_adds(etcd_server, tmp_path, cluster):
    procs = start(tmp_path, etcd_server.endpoint, cluster, 3)
    registry = CollectorRegistry()
    try:
        async def go():
            cfg = ClientConfig(metrics=ClientMetrics(registry))
            async with BookKeeperClient(etcd_server.endpoint, cluster, cfg) as bk:
                lh = await bk.create_ledger(3, 3, 3)
                for i in range(20):
                    await lh.add_entry(b"x" * 100)
                await lh.add_entries([b"y" * 100] * 10)
                got = await lh.read_entries(0, 29)
                assert len(got) == 30
                # a second client recovers the ledger (fencing reads); the first one's adds are then refused
                async with BookKeeperClient(etcd_server.endpoint, cluster) as bk2:
                    await bk2.open_ledger(lh.ledger_id, recovery=True)
                try:
                    await lh.add_entry(b"late")
                except se.BookKeeperError:
                    pass
        run(go())
        found = [scrape(p.admin_address) for p in procs]
        for f in found:
            assert total(f, "bookstream_bookie_add_entries_total") == 30
            assert total(f, "bookstream_bookie_add_bytes_total") > 30 * 100
            assert total(f, "bookstream_bookie_add_latency_seconds_count") >= 2
            assert total(f, "bookstream_bookie_journal_group_commit_bytes_count") >= 1
            assert total(f, "bookstream_bookie_journal_fdatasync_seconds_count") >= 1
            assert "bookstream_bookie_journal_queue_bytes" in f
        # recovery goes on once its fencing reads cover the ack quorum (E - Qa + 1 = 1
        # bookie here) and the client's close may cancel the rest: only one fence is certain
        assert sum(total(f, "bookstream_bookie_fence_requests_total") for f in found) >= 1
        assert sum(total(f, "bookstream_bookie_read_entries_total") for f in found) >= 30
        assert sum(total(f, "bookstream_bookie_read_bytes_total") for f in found) >= 30 * (60 + 100)  # records
        assert sum(total(f, "bookstream_bookie_read_latency_seconds_count") for f in found) >= 1
        assert sum(total(f, "bookstream_bookie_refusals_total", status="FENCED") for f in found) >= 1

        c = samples(generate_latest(registry).decode())
        assert total(c, "bookstream_client_appended_entries_total") == 30
        assert total(c, "bookstream_client_batch_entries_sum") == 31  # with the refused late add
        assert total(c, "bookstream_client_append_latency_seconds_count") == 22
        assert total(c, "bookstream_client_failed_adds_total") == 1
        assert total(c, "bookstream_client_pending_adds") == 0
    finally:
        for p in procs:
            p.kill()


def _expr_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (identifiers that are not functions or keywords)."""
    expr = re.sub(r"\{[^}]*\}", "", expr)          # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)          # ranges
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {n for n in names if n.startswith("bookstream_")}


def test_dashboard_expressions_name_exported_metrics(etcd_server, tmp_path, cluster):
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    b = start(tmp_path, etcd_server.endpoint, cluster, 1)[0]
    registry = CollectorRegistry()
    try:
        async def go():  # one add and one take-over, so that every labelled family has samples
            cfg = ClientConfig(metrics=ClientMetrics(registry))
            async with BookKeeperClient(etcd_server.endpoint, cluster, cfg) as bk:
                lh = await bk.create_ledger(1, 1, 1)
                await lh.add_entry(b"x")
                await lh.read_entries(0, 0)
        run(go())
        AutorecoveryMetrics(registry)  # what `autorecovery run --metrics-port` serves
        exported = set(scrape(b.admin_address)) | set(samples(generate_latest(registry).decode()))
    finally:
        b.kill()
    missing = {n for e in exprs for n in _expr_names(e)} - exported
    assert not missing, f"dashboard names not exported: {sorted(missing)}"


def test_autorecovery_serves_metrics(etcd_server, tmp_path, cluster):
    import re

    from bookstream.processes import AutorecoveryProcess

    ar = AutorecoveryProcess(tmp_path / "ar", etcd=etcd_server.endpoint, cluster=cluster,
                             extra_args=["--metrics-port", "0", "--log-format", "json"]).start()
    try:
        # logged (and flushed) before the process said it is ready
        m = re.search(r"metrics on http://([\d.:]+)/metrics", ar.log_path.read_text())
        assert m, ar.log_path.read_text()
        found = scrape(m[1])
        for name in ("bookstream_autorecovery_tasks_total", "bookstream_autorecovery_copied_bytes_total",
                     "bookstream_autorecovery_fragments_total"):
            assert name in found, sorted(found)
    finally:
        ar.kill()
