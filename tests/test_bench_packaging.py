"""The benchmarks are not part of the product: the wheel does not ship
`bench/`, and `bookstream bench` reaches it through one lazy hook that says
so, in one line and exit code 2, when it is absent."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# `bench` made unimportable, as in an installed wheel.
WITHOUT_BENCH = ("import sys; sys.modules['bench'] = None; "
                 "from bookstream.cli import main; sys.exit(main(sys.argv[1:]))")


def test_the_wheel_ships_no_benchmark_package():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert not [p for p in packages if p == "bench" or p.startswith("bench.")]
    shipped = [ROOT.joinpath(*p.split(".")) for p in packages]
    assert not [d / "bench.py" for d in shipped if (d / "bench.py").exists()]


def test_bookstream_bench_without_the_benchmarks_says_so_in_one_line():
    for argv in (["bench", "suite", "--quick"], ["autorecovery", "bench"]):
        p = subprocess.run([sys.executable, "-c", WITHOUT_BENCH, *argv], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        assert p.returncode == 2, (argv, p.stderr)
        assert p.stderr.strip().splitlines() == [p.stderr.strip()], p.stderr
        assert "the benchmarks are not installed" in p.stderr


def test_the_other_commands_do_not_import_the_benchmarks():
    code = ("import sys\nfrom bookstream.cli import argparse_main\ntry:\n    argparse_main(['standalone', '--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'bench' or m == 'bookstream.bench'))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


def test_bookstream_bench_runs_the_checkouts_benchmarks():
    p = subprocess.run([sys.executable, "-m", "bookstream.cli", "bench", "--help"], capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert p.returncode == 0, p.stderr
    assert "suite" in p.stdout and "bookie" in p.stdout
