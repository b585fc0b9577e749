"""JSON logs (issue 17): a real bookie started with --log-format json writes
only JSON lines (with its id, and the ledger where a line names one); the
formatter's fields; the admin CLI's errors in JSON."""
from __future__ import annotations

import json
import logging
import os
import signal

from bookstream import logs
from bookstream.processes import BookieProcess
from stream.client import BookKeeperClient
from tests.conftest import run


def test_formatter_fields_and_ledger():
    f = logs.JsonFormatter("bookie", "b-1")
    rec = logging.LogRecord("stream.ledger", logging.INFO, __file__, 1, "ledger %s: new fragment %s", (42, 7), None)
    out = json.loads(f.format(rec))
    assert out["level"] == "INFO" and out["component"] == "bookie" and out["bookie_id"] == "b-1"
    assert out["ledger"] == 42 and out["message"] == "ledger 42: new fragment 7" and out["time"].endswith("Z")
    rec = logging.LogRecord("x", logging.WARNING, __file__, 1, "plain %s", ("a",), None)
    assert "ledger" not in json.loads(f.format(rec))
    rec.ledger = 5  # extra={"ledger": 5}
    assert json.loads(f.format(rec))["ledger"] == 5
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = f.format(rec)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]


def test_bookie_json_logs_only_json_lines(etcd_server, tmp_path, cluster):
    b = BookieProcess(tmp_path / "b0", etcd=etcd_server.endpoint, cluster=cluster,
                      extra_args=["--registration-ttl", "3", "--admin-port", "0", "--log-format", "json",
                                  "--gc-interval", "0.2"], log_level="DEBUG").start()
    try:
        async def go():
            async with BookKeeperClient(etcd_server.endpoint, cluster) as bk:
                lh = await bk.create_ledger(1, 1, 1)
                for i in range(5):
                    await lh.add_entry(b"x%d" % i)
                await lh.close()
                await bk.delete_ledger(lh.ledger_id)
        run(go())
    finally:
        os.kill(b.pid, signal.SIGTERM)  # a clean stop logs too
        b.proc.wait(30)
        b.kill()
    lines = b.log_path.read_text().splitlines()
    assert len(lines) >= 3, lines
    parsed = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "component", "message"} <= set(p) for p in parsed)
    assert all(p["component"] == "bookie" and p["bookie_id"] == b.bookie_id for p in parsed)
    assert any("serving on" in p["message"] for p in parsed) and any("stopping" in p["message"] for p in parsed)
