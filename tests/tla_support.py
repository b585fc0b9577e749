"""The TLA+ tools' Python side for the tests: tla/check.py (TLC's runner)
tla/tracecheck.py (trace validation) and
tla/differential.py (sim/spec.py beside TLC), tla/tlcvalues.py and
tla/behaviours.py (TLC's behaviours replayed through sim/spec.py), loaded once by file path (tla/ is
not a package), and the ``tools`` fixture that finds java and TLC."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_TLA = Path(__file__).resolve().parents[1] / "tla"


def _load(name: str, file: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _TLA / file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # (dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


check = _load("tla_check", "check.py")
sys.modules.setdefault("check", check)  # (tla/tracecheck.py imports it by that name)
trace = _load("tla_tracecheck", "tracecheck.py")
sys.modules.setdefault("tracecheck", trace)  # (tla/differential.py imports it by that name)
differential = _load("tla_differential", "differential.py")
tlcvalues = _load("tlcvalues", "tlcvalues.py")  # (tla/behaviours.py imports it by that name)
behaviours = _load("tla_behaviours", "behaviours.py")  # TLC's behaviours through sim/spec.py


@pytest.fixture(scope="module")
def tools():
    try:
        return check.find_tools()
    except check.ToolError as e:
        pytest.fail(f"cannot run TLC: {e}")
