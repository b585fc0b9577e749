"""The generated protobuf code is checked in and must match proto/."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from bookie.core import Status
from bookstream_pb import bookie_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def _load_genproto():
    spec = importlib.util.spec_from_file_location("genproto", ROOT / "scripts" / "genproto.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_code_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools")
    gen = _load_genproto()
    out = tmp_path / "bookstream_pb"
    gen.generate(out)
    checked_in = ROOT / "bookstream_pb"
    fresh = sorted(p.name for p in out.iterdir() if p.suffix in (".py", ".pyi"))
    present = sorted(p.name for p in checked_in.iterdir() if p.suffix in (".py", ".pyi"))
    assert fresh == present, "generated file set differs: run scripts/genproto.py"
    for name in fresh:
        assert (out / name).read_text() == (checked_in / name).read_text(), (
            f"bookstream_pb/{name} is stale: run scripts/genproto.py")


def test_generated_package_does_not_collide_with_proto_plus():
    import bookstream_pb

    assert bookstream_pb.__name__ == "bookstream_pb"
    assert "proto" not in sys.modules or not getattr(sys.modules["proto"], "__file__", "").startswith(str(ROOT))


def test_core_status_codes_equal_the_wire_codes():
    wire = {name: pb.StatusCode.Value(name) for name in pb.StatusCode.keys()}
    assert wire == {s.name: s.value for s in Status}
