"""The README quotes the committed suite run (bench/results/suite.json) as
`bookstream bench table` renders it, and the plot beside it is that run's."""
from __future__ import annotations

import json
from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parents[2]
RUN = "bench/results/suite.json"


def test_the_readme_quotes_the_committed_run_exactly():
    doc = json.loads((ROOT / RUN).read_text())
    readme = (ROOT / "README.md").read_text()
    begin = report.BEGIN.format(path=RUN)
    assert begin in readme, "the README has no table of " + RUN
    start = readme.index(begin)
    quoted = readme[start:readme.index(report.END, start) + len(report.END)]
    assert quoted == report.readme_block(doc, RUN), "regenerate it: bookstream bench table " + RUN


def test_the_committed_run_has_its_plot_and_every_figure():
    doc = json.loads((ROOT / RUN).read_text())
    assert (ROOT / RUN).with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert doc["benchmark"] == "suite" and doc["figures"]
    assert all(isinstance(f["value"], (int, float)) for f in doc["figures"])


def test_a_changed_figure_shows_in_the_table():
    doc = json.loads((ROOT / RUN).read_text())
    before = report.markdown(doc)
    doc["figures"][0]["value"] *= 2
    assert report.markdown(doc) != before
