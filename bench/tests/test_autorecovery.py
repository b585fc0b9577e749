"""`bookstream autorecovery bench` (bench/autorecovery.py) end to end: a
figure must exist and be positive, not be fast."""
from __future__ import annotations

import json
import subprocess
import sys

CLI = [sys.executable, "-c", "import sys; from bookstream.cli import main; sys.exit(main())"]


def test_rereplication_bench_smoke(tmp_path):
    """The benchmark command runs and reports the rate beside the ceiling
    (no timing asserted: figures are for the command's reader)."""
    out = tmp_path / "r.json"
    p = subprocess.run(CLI + ["autorecovery", "bench", "--mb", "8", "--entry-size", "65536", "--dir",
                              str(tmp_path), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["rereplication"]["bytes_copied"] >= 8_000_000 // 65536 * 65536
    assert r["rereplication"]["fragments_replaced"] >= 1 and not r["left"] and not r["unrecoverable"]
    assert r["ceiling"]["mb_per_s"] > 0 and r["ratio"] > 0
    assert "ratio" in p.stdout


def test_rereplication_bench_with_a_rate_limit_and_a_writer_beside(tmp_path):
    """--rate-mb and --writer-rate: the report says what share of the limit
    the copy kept and the writer's p99 beside the copy ÷ alone (no timing
    asserted: the figures exist and come from a copy that completed)."""
    out = tmp_path / "r.json"
    p = subprocess.run(CLI + ["autorecovery", "bench", "--mb", "8", "--entry-size", "65536", "--dir", str(tmp_path),
                              "--rate-mb", "16", "--writer-rate", "200", "--writer-seconds", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(out.read_text())
    rr, w = r["rereplication"], r["writer"]
    assert rr["fragments_replaced"] >= 1 and not r["left"] and rr["rate_limit_mb"] == 16 and rr["vs_limit"] > 0
    assert w["alone"]["completed"] > 0 and w["beside"]["completed"] > 0 and w["p99_ratio"] > 0
    assert 0 < w["overlap"] <= 1
    assert "kept" in p.stdout and "p99 beside" in p.stdout
