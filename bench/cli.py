"""The `bench` command tree: `bookstream bench ...` (through
`bookstream.cli.load_bench`) and `python -m bench ...`.

    bookstream bench bookie | replay | stream | ledger [...]   (single.py)
    bookstream bench reads [...]                              (reads.py)
    bookstream bench suite [--quick] [--out suite.json]       (suite.py)
    bookstream bench plot suite.json                          (suite.py, plot.py)
    bookstream bench table suite.json                         (report.py: the README's table)
    bookstream bench profile [...]                            (profile.py)
    bookstream bench walk [...]                               (walk.py: the reader's record walk, C and Python)
    bookstream bench scan [...]                               (scan.py: the auditor's scan of every ledger)
    bookstream bench scrub [...]                              (scrub.py: a bookie's scrub pass beside its floor)
    bookstream bench tail [...]                               (tail.py: a tailing reader's delivery latency)
    bookstream bench spark [...]                              (spark.py)
"""
from __future__ import annotations

import argparse

from bench import profile, reads, report, scan, scrub, single, suite, tail, walk


def parser(prog: str = "bookstream bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="bookstream's benchmarks: figures, never assertions")
    bsub = p.add_subparsers(dest="bench", required=True)
    single.add_parsers(bsub)
    reads.add_parsers(bsub)
    suite.add_parsers(bsub)
    profile.add_parser(bsub)
    report.add_parser(bsub)
    walk.add_parser(bsub)
    scan.add_parser(bsub)
    scrub.add_parser(bsub)
    tail.add_parser(bsub)
    s = bsub.add_parser("spark", add_help=False, help="the Spark source and sink beside the plain reader "
                                                      "(bookstream bench spark --help)")
    s.add_argument("spark_args", nargs=argparse.REMAINDER)
    s.set_defaults(func=_cmd_spark)
    return p


def _cmd_spark(args: argparse.Namespace) -> int:
    from bench import spark

    return spark.main(args.spark_args)


def main(argv: list[str] | None = None, prog: str = "bookstream bench") -> int:
    args = parser(prog).parse_args(argv)
    return args.func(args)
