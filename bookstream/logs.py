"""Log set-up of every bookstream process: human-readable or one JSON object a line.

    bookstream bookie ... --log-format json
    bookstream autorecovery run ... --log-format json
    bookstream standalone --log-format json      (and its bookies and autorecovery)
    bookstream --log-format json streams list    (the admin CLI's own warnings)

A JSON line holds ``time`` (UTC, ISO 8601 with milliseconds), ``level``,
``component`` (bookie, autorecovery, standalone, cli), ``bookie_id`` where
the process is a bookie, ``ledger`` where the record names one, ``logger``,
``message`` and, for an exception, ``exception`` (the traceback as one
string). The ledger comes from an ``extra={"ledger": id}`` or, as the code
base writes nearly every ledger message, from a message starting
``"ledger %s..."`` whose first argument is the id.
"""
from __future__ import annotations

import datetime
import json
import logging
import sys

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object a line; ``bookie_id`` may be set once it is known."""

    def __init__(self, component: str, bookie_id: str | None = None):
        super().__init__()
        self.component = component
        self.bookie_id = bookie_id

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "component": self.component,
        }
        if self.bookie_id:
            out["bookie_id"] = self.bookie_id
        ledger = ledger_of(record)
        if ledger is not None:
            out["ledger"] = ledger
        out["logger"] = record.name
        out["message"] = record.getMessage()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, default=str)


def ledger_of(record: logging.LogRecord):
    """The ledger id a record names, or None."""
    explicit = getattr(record, "ledger", None)
    if explicit is not None:
        return explicit
    msg = record.msg
    if isinstance(msg, str) and msg.startswith(("ledger %s", "ledger %d")) and record.args:
        first = record.args[0] if isinstance(record.args, tuple) else None
        if isinstance(first, int) and not isinstance(first, bool):
            return first
    return None


def setup(level: str = "INFO", fmt: str = "text", component: str = "bookstream",
          bookie_id: str | None = None, stream=None) -> logging.Formatter:
    """Configures the root logger (replacing earlier handlers); returns the
    formatter (a bookie sets ``bookie_id`` on it once its id is known)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    formatter = JsonFormatter(component, bookie_id) if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()) if isinstance(level, str) else level)
    if fmt == "json":
        logging.captureWarnings(True)  # warnings.warn goes through the JSON handler too
        sys.excepthook = lambda *exc: logging.getLogger(component).critical("uncaught exception", exc_info=exc)
    return formatter
