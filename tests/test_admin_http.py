"""A bookie's admin HTTP port (issue 17): /health, /ready, /metrics, /info on
a real bookie process registered in a real etcd; /ready follows the
registration through an etcd outage longer than the TTL."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from bookstream.processes import BookieProcess
from metadata.etcd_server import ManagedEtcd


def get(admin: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{admin}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_status(admin: str, path: str, status: int, timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        code, body = get(admin, path)
        if code == status:
            return body
        assert time.monotonic() < deadline, f"{path}: {code} {body!r}, wanted {status}"
        time.sleep(0.1)  # between two calls of a condition poll


@pytest.fixture
def private_etcd(tmp_path):
    etcd = ManagedEtcd(tmp_path / "etcd").start()
    yield etcd
    etcd.stop()


def test_health_ready_metrics_info(private_etcd, tmp_path, cluster):
    b = BookieProcess(tmp_path / "b0", etcd=private_etcd.endpoint, cluster=cluster,
                      extra_args=["--registration-ttl", "2", "--admin-port", "0"]).start()
    try:
        assert b.admin_address
        assert get(b.admin_address, "/health") == (200, b"ok\n")
        code, body = get(b.admin_address, "/ready")
        assert code == 200 and json.loads(body) == {"ready": True, "reason": "ready"}
        info = json.loads(get(b.admin_address, "/info")[1])
        assert info["bookie_id"] == b.bookie_id and info["address"] == b.address
        assert info["registration_state"] == "held" and info["state"] == "writable"
        code, metrics = get(b.admin_address, "/metrics")
        text = metrics.decode()
        label = f'{{bookie_id="{b.bookie_id}"}}'
        assert code == 200 and f"bookstream_bookie_registered{label} 1.0" in text
        assert f"bookstream_bookie_read_only{label} 0.0" in text and f"bookstream_bookie_halted{label} 0.0" in text
        assert info["halted"] is None and info["set_aside_bytes"] == 0
        assert info["scrub_last_end"] is None and info["scrub_rotted_entries"] == 0   # (never scrubbed: a pass due
        assert info["scrub_next_due"].endswith("+00:00")                             # within the hour)
        assert f"bookstream_bookie_disk_total_bytes{label}" in text
        assert "bookstream_bookie_journal_fsyncs_total" in text
        assert f'bookstream_bookie_journal_sync_seconds_bucket{{bookie_id="{b.bookie_id}",le="+Inf"}}' in text
        assert get(b.admin_address, "/nope")[0] == 404

        private_etcd.stop()   # longer than the TTL: not ready, still alive
        body = wait_status(b.admin_address, "/ready", 503)
        assert json.loads(body)["ready"] is False and "not registered" in json.loads(body)["reason"]
        assert get(b.admin_address, "/health")[0] == 200
        assert f"bookstream_bookie_registered{label} 0.0" in get(b.admin_address, "/metrics")[1].decode()
        private_etcd.start()
        wait_status(b.admin_address, "/ready", 200)
    finally:
        b.kill()


def test_no_admin_port_unless_asked(tmp_path):
    b = BookieProcess(tmp_path / "b0").start()
    try:
        assert b.admin_address is None
    finally:
        b.kill()
