"""Every ```python block of README.md runs as written against a standalone
cluster (issue 12.6).

The test starts `bookstream standalone` as a user would, on free ports
(`--etcd-port 0`, `--base-port 0`: chosen by the processes that bind them,
not picked here and bound later, which another process may take between
the two), and rewrites only the README's etcd
address (127.0.0.1:2379) to the one it got.  The blocks run in README order
in one interpreter and one namespace (a later block may use what an earlier
one made, as a reader following the README would), each compiled under its
README line so a traceback points at the README.  A block whose first line
is `# not run: <why>` is skipped; every other block, whoever adds it, runs.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.test_standalone_cli import Output

REPO = Path(__file__).resolve().parent.parent
README_ADDRESS = "127.0.0.1:2379"
SKIP = "# not run:"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block not marked to skip."""
    out = []
    for m in re.finditer(r"^```python[^\n]*\n(.*?)^```", text, re.S | re.M):
        code = m.group(1)
        if code.lstrip().startswith(SKIP):
            continue
        out.append((text.count("\n", 0, m.start(1)) + 1, code))
    return out


def test_extractor_finds_blocks_and_honours_the_skip_marker():
    text = "x\n```python\nprint(1)\n```\n```python\n# not run: needs Spark\nboom\n```\n```sh\nls\n```\n"
    assert python_blocks(text) == [(3, "print(1)\n")]


_DRIVER = textwrap.dedent("""
    import json, sys
    blocks = json.load(sys.stdin)
    ns = {"__name__": "__main__"}
    for line, code in blocks:
        print(f"=== README.md:{line}", flush=True)
        exec(compile("\\n" * (line - 1) + code, "README.md", "exec"), ns)
    print("=== all blocks ran", flush=True)
""")


def test_readme_python_examples_run_against_standalone(tmp_path):
    blocks = python_blocks((REPO / "README.md").read_text())
    assert len(blocks) >= 7  # produce, consume, tail, take-over, batches, classic ledger, log
    assert all(README_ADDRESS in code for _, code in blocks if "Client(" in code)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bookstream.cli", "standalone", "--data-dir", str(tmp_path / "sa"),
         "--etcd-port", "0", "--base-port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
        start_new_session=True)
    out = Output(proc)
    try:
        out.until("Ctrl-C to stop.", 90)
        assert out.text.count("bookie:  ") == 4  # the default
        endpoint = re.search(r"etcd:    (\S+)", out.text)[1]
        rewritten = [(line, code.replace(README_ADDRESS, endpoint)) for line, code in blocks]
        run = subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(rewritten), cwd=tmp_path,
                             capture_output=True, text=True, timeout=600,  # the Spark examples start sessions: slow under load
                             # (the Spark examples' checkpoints, made with mkdtemp, stay in the test's directory)
                             env=dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path)))
        assert run.returncode == 0 and "=== all blocks ran" in run.stdout, \
            f"a README example failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
        # what the examples print is there (the tail saw its record, the log read both)
        assert "tail:" in run.stdout and "b'second'" in run.stdout
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 2)  # SIGINT: a clean stop
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
