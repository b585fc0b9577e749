"""The bookie: a gRPC storage server of the BookKeeper protocol (see the
modules).  ``native`` gives its optional C extensions, one rule for all."""
from __future__ import annotations

import bookstream_pb  # noqa: F401  (first: it sets gRPC's fork default before gRPC loads)

import importlib
import os
from types import ModuleType


def native(name: str) -> ModuleType | None:
    """``bookie.<name>``, a C extension (``_records``, ``_spans``), or None
    where it was not built (no compiler where it was installed) or
    BOOKSTREAM_PURE_PYTHON=1 asks for the Python code beside it."""
    if os.environ.get("BOOKSTREAM_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(f"bookie.{name}")
    except ImportError:
        return None
