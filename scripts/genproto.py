"""Regenerate bookstream_pb/ from proto/*.proto.

    python scripts/genproto.py [OUT_DIR]

The generated modules are checked in; tests/test_proto.py regenerates them
into a temporary directory and fails on any difference.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from grpc_tools import protoc
import grpc_tools

ROOT = Path(__file__).resolve().parent.parent

# The package's __init__: every bookstream package imports it before gRPC
# loads (gRPC reads the variable when it is imported, never after).
INIT = '''"""Generated from proto/ by scripts/genproto.py. Do not edit.

Importing this package sets gRPC's fork support off unless the environment
says otherwise.  With it on, a process with live channels that forks to
exec (pyspark launching its JVM, ``subprocess`` with ``preexec_fn``) runs
gRPC's fork handlers, which abort the child now and then (SIGABRT, "Mutex::Fer
with pending CondVar") before it reaches exec; gRPC's fork_support.md asks
for this setting whenever a fork is followed by exec.  No bookstream
process forks a child that uses gRPC after using gRPC itself (Spark's
Python workers are forked by a daemon that never does).  Every bookstream
package imports this one first (metadata, stream, bookie, bookstream).
"""
import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
'''
PROTO_DIR = ROOT / "proto"
PACKAGE = "bookstream_pb"


def generate(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # protoc writes `import bookie_pb2`; make the imports package-relative so
    # the generated package never depends on sys.path tricks.
    for f in out_dir.glob("*_pb2*.py"):
        text = f.read_text()
        text = re.sub(r"^import (\w+_pb2) as", rf"from {PACKAGE} import \1 as", text, flags=re.M)
        f.write_text(text)
    init = out_dir / "__init__.py"
    init.write_text(INIT)
    return sorted(p for p in out_dir.iterdir() if p.suffix in (".py", ".pyi"))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / PACKAGE
    for path in generate(target):
        print(path.relative_to(target.parent) if target.parent in path.parents else path)
