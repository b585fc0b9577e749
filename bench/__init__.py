"""bookstream's benchmarks: commands that measure, never assertions.

A top-level package of the source checkout, beside `bookstream/`, `stream/`,
`bookie/`: the wheel does not ship it (`pyproject.toml`'s package list).
`bookstream bench ...` reaches it through one lazy hook
(`bookstream.cli.load_bench`); `python -m bench ...` runs the same commands.

    cli.py             the `bench` command tree
    single.py          bench bookie | replay | stream | ledger, and the closed and open loops
    suite.py           bench suite: every figure beside its ceilings and JetStream (JSON + plot)
    ceilings.py        the gRPC ceiling, the gRPC + journal floor, the disk, the hiccup meter, settle
    floor.py           FloorWriter: a writer that only batches frames as the stream writer does
    peer_jetstream.py  the peer: 3 clustered nats-server processes
    reads.py           bench reads: catch-up per ensemble shape, the open loop beside a reader
    plot.py            the suite's PNG
    profile.py         bench profile: py-spy on the client and a bookie
    autorecovery.py    bookstream autorecovery bench: re-replication beside the disk
    spark.py           bench spark: the Spark source and sink beside the plain reader
    walk.py            bench walk: the reader's record walk in-process, C beside Python
    scan.py            bench scan: the auditor's scan of every ledger beside per-ledger reads
    scrub.py           bench scrub: a bookie's scrub pass beside its journal read whole
    results/           the suite run the README quotes (JSON + plot)
    tests/             the benchmarks' own tests (a pytest run apart from tests/)
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The benchmarks start Python children that import this package again
# (`python -m bench.ceilings serve`, the hiccup meter, the catch-up reader):
# they find it wherever they are started from.
_path = os.environ.get("PYTHONPATH", "")
if str(ROOT) not in _path.split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), _path) if p)


def save_result(out: Path | None, name: str, doc: dict) -> None:
    """A benchmark's figures as JSON in ``out`` (if given), with its name
    and the command that produced them."""
    import json
    import sys

    if out is not None:
        out.write_text(json.dumps({"benchmark": name, "command": " ".join(sys.argv), **doc}, indent=2) + "\n")


def in_work_dir(given: Path | None, prefix: str, fn):
    """``fn(dir)``: in ``given`` (made if missing, kept), or in a
    temporary dir removed after (a benchmark's ``--dir``)."""
    import tempfile

    if given is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as d:
            return fn(Path(d))
    given.mkdir(parents=True, exist_ok=True)
    return fn(given)
