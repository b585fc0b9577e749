"""A saved suite run as the README's markdown table.

    bookstream bench table bench/results/suite.json

The README quotes the committed run (`bench/results/`) through this table,
between a BEGIN and an END marker; `bench/tests/test_results.py` checks that
the README's table is still exactly what the committed JSON gives.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.suite import _fmt, tightest

BEGIN = "<!-- bench table: {path} (bookstream bench table {path}) -->"
END = "<!-- end of bench table -->"


def _ratio(x) -> str:
    return f"{x:.2f}" if x is not None else ""


def markdown(doc: dict) -> str:
    """One row per figure: the value, its tightest ceiling or floor and the
    ratio to it, the ratio to JetStream, the target and whether it was met."""
    lines = ["| figure | value | tightest ceiling or floor | ÷ it | ÷ JetStream R3 | target | met |",
             "|---|---|---|---|---|---|---|"]
    for f in doc["figures"]:
        unit = f["unit"]
        name, c = tightest(f)
        j, t = f["jetstream"], f["target"]
        target = f"{t['op']} {_fmt(t['value'])}{' MB/s' if t['metric'] == 'mb_per_s' else ''}" if t else ""
        met = {True: "yes", False: "no", None: ""}[t["met"]] if t else ""
        ceiling = f"{_fmt(c['value'], unit)} ({name})" if c else ""
        lines.append(f"| {f['label']} | {_fmt(f['value'], unit)} {unit} | {ceiling} "
                     f"| {_ratio(c['ratio']) if c else ''} | {_ratio(j['ratio']) if j else ''} | {target} | {met} |")
    return "\n".join(lines)


def readme_block(doc: dict, path: str) -> str:
    """The README's block for the run saved at `path` (markers included)."""
    p = doc["parameters"]
    m = doc["machine"]
    load = f", load average {m['load_average'][0]:.1f} at the start" if m.get("load_average") else ""
    head = (f"`{path}`: `bookstream bench suite{' --quick' if p.get('quick') else ''}`, "
            f"started {doc['started']}, {m.get('cpus', '?')} cores{load}.")
    return "\n".join([BEGIN.format(path=path), head, "", markdown(doc), END])


def add_parser(bsub) -> None:
    t = bsub.add_parser("table", help="a saved suite run as the README's markdown table")
    t.add_argument("results", type=Path)
    t.set_defaults(func=cmd_table)


def cmd_table(args: argparse.Namespace) -> int:
    print(readme_block(json.loads(args.results.read_text()), str(args.results)))
    return 0
