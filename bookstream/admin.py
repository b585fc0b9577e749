"""The `bookstream` command tree (click) and the conventions every admin command shares.

    bookstream bookies list|info|sanity        bookstream/admin_bookies.py
    bookstream streams list|show|read|tail|trim|delete   bookstream/admin_streams.py
    bookstream ledgers list|show|read|delete   bookstream/admin_ledgers.py
    bookstream logs list|show                  bookstream/admin_ledgers.py
    bookstream simpletest                      bookstream/admin_ledgers.py
    bookstream bookie|standalone|bench ...     the argparse commands of bookstream/cli.py, passed through

Adding a group from another module takes one line in ``GROUP_MODULES``: the
module defines ``COMMANDS``, a list of click commands or groups, built with
:func:`admin_command` so that they take the shared options and follow the
conventions:

- ``--etcd`` (env ``BOOKSTREAM_ETCD``, default 127.0.0.1:2379), ``--cluster``
  (env ``BOOKSTREAM_CLUSTER``), ``--timeout`` (seconds per etcd or bookie
  call: a wrong etcd address fails within it), ``--format table|json``;
- a command returns an :class:`Output` (rows or one record), printed as a
  rich table or as JSON on stdout;
- every error is one line on stderr (``error: ...``; under ``--format json``
  one JSON object ``{"error": {"type", "message", "retriable", "exit_code"}}``),
  never a traceback, with an exit code scripts can test (``EXIT_*`` below).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import json
import os
import sys
from typing import Any, Callable

import click

from bookstream import security

EXIT_OK = 0
EXIT_ERROR = 1          # the operation failed (a bookie refused, a write failed, ...)
EXIT_USAGE = 2          # bad arguments (click's own code)
EXIT_NOT_FOUND = 3      # no such stream, ledger, log or bookie
EXIT_UNAVAILABLE = 4    # etcd (or a bookie that was needed) did not answer
EXIT_CHECK_FAILED = 5   # a check (sanity, simpletest) ran and found the cluster wrong

DEFAULT_ETCD = "127.0.0.1:2379"

# Modules that add commands to the tree: one line each.
GROUP_MODULES = [
    "bookstream.admin_bookies",
    "bookstream.admin_streams",
    "bookstream.admin_ledgers",
    "bookstream.admin_check",
    "bookstream.recovery_cli",
]


class AdminError(Exception):
    """An error the command reports as is (one line), with its exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR, retriable: bool = False,
                 type_name: str | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.retriable = retriable
        self.type_name = type_name or type(self).__name__


class NotFound(AdminError):
    def __init__(self, message: str):
        super().__init__(message, EXIT_NOT_FOUND)


class CheckFailed(AdminError):
    def __init__(self, message: str):
        super().__init__(message, EXIT_CHECK_FAILED)


def classify(e: BaseException) -> AdminError:
    """Any error as an AdminError: its type, one-line message and exit code."""
    if isinstance(e, AdminError):
        return e
    from metadata import errors as merr
    from stream import errors as serr
    from stream.bookie_client import BookieUnavailable

    message = " ".join(str(e).split()) or type(e).__name__
    retriable = bool(getattr(e, "retriable", False))
    if isinstance(e, (serr.NoSuchStream, serr.NoSuchLedger, merr.NoSuchLedger)):
        code = EXIT_NOT_FOUND
    elif isinstance(e, (serr.MetadataUnavailable, merr.MetadataUnavailable)):
        code, retriable = EXIT_UNAVAILABLE, True
        message = f"etcd unavailable: {message}"
    elif isinstance(e, (BookieUnavailable, asyncio.TimeoutError, TimeoutError)):
        code, retriable = EXIT_UNAVAILABLE, True
    elif isinstance(e, serr.UnauthorizedAccess):  # the library says "pass password="; here it is an option
        code = EXIT_ERROR
        message = message.replace("pass password=", "pass --password PW (or its BOOKSTREAM_*_PASSWORD variable)")
        if message.endswith("wrong password"):
            message += " (--password)"
    elif isinstance(e, (ValueError, merr.InvalidName)):
        code = EXIT_USAGE
    else:
        code = EXIT_ERROR
    return AdminError(message, code, retriable, type(e).__name__)


# -- output ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str] | None = None   # for the table; JSON gets the raw value
    justify: str = "left"


@dataclasses.dataclass
class Output:
    """What a command prints: ``rows`` under ``columns`` (a listing), or one
    ``record`` (key/value, and optional ``sections``: named sub-listings such
    as a ledger's fragments)."""

    rows: list[dict] | None = None
    columns: list[Column] | None = None
    record: dict | None = None
    sections: list[tuple[str, list[Column], list[dict]]] = dataclasses.field(default_factory=list)
    title: str | None = None

    def to_json(self) -> Any:
        if self.rows is not None:
            return self.rows
        out = dict(self.record or {})
        for name, _, rows in self.sections:
            out[name] = rows
        return out


def console(stderr: bool = False):
    from rich.console import Console

    f = sys.stderr if stderr else sys.stdout
    # Not a terminal: no colour, no wrapping of table cells at 80 columns.
    return Console(file=f, width=None if f.isatty() else 240, highlight=False, soft_wrap=not f.isatty())


def _cell(col: Column, row: dict):
    from rich.text import Text

    v = row.get(col.key)
    s = col.fmt(v) if col.fmt and v is not None else ("-" if v is None or v == "" else str(v))
    return Text(s)  # never markup: payloads and names print as they are


def _table(columns: list[Column], rows: list[dict], title: str | None = None):
    from rich.table import Table

    t = Table(title=title, show_lines=False, title_justify="left")
    for c in columns:
        t.add_column(c.header, justify=c.justify, overflow="fold")
    for r in rows:
        t.add_row(*(_cell(c, r) for c in columns))
    return t


def print_output(out: Output, fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(out.to_json(), indent=2, default=str) + "\n")
        return
    con = console()
    if out.rows is not None:
        con.print(_table(out.columns, out.rows, out.title))
        return
    from rich.table import Table
    from rich.text import Text

    t = Table(title=out.title, show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in (out.record or {}).items():
        t.add_row(Text(k), Text(_plain(v)))
    con.print(t)
    for name, cols, rows in out.sections:
        con.print(_table(cols, rows, name))


def _plain(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v) or "-"
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()) or "-"
    return str(v)


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def escape_payload(data: bytes, limit: int = 0) -> str:
    """Bytes as printable ASCII (Python's escapes: \\n, \\x00, \\\\), cut at
    ``limit`` bytes with a marker: safe on any terminal."""
    shown = data if not limit or len(data) <= limit else data[:limit]
    s = repr(bytes(shown))[2:-1]
    if shown is not data:
        s += f"...(+{len(data) - limit} bytes)"
    return s


# -- the context of one command ---------------------------------------------------------------


class Admin:
    """The shared options of one command and the clients it needs."""

    def __init__(self, etcd: str, cluster: str, fmt: str, timeout: float):
        self.etcd = etcd
        self.cluster = cluster
        self.fmt = fmt
        self.timeout = timeout

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    def store(self):
        """A metadata store, checked to answer (a wrong address fails here,
        within ``timeout``)."""
        from metadata.store import MetadataStore
        from metadata.layout import KeyLayout

        from metadata.errors import AuthenticationFailed

        try:
            st = MetadataStore(self.etcd.split(","), timeout=self.timeout, **security.current().store_options())
        except AuthenticationFailed:
            raise
        except ValueError as e:
            raise AdminError(f"bad --etcd {self.etcd!r}: {e}", EXIT_USAGE) from None
        try:
            st.get(KeyLayout(self.cluster).cluster_key())
        except Exception as e:
            st.close()
            if isinstance(e, AuthenticationFailed):
                raise
            raise AdminError(f"etcd at {self.etcd} unreachable (--timeout {self.timeout:g} s): "
                             f"{' '.join(str(e).split())}", EXIT_UNAVAILABLE, True, type(e).__name__) from None
        return st

    def check(self) -> None:
        """Fails fast (within ``timeout``) when etcd does not answer."""
        self.store().close()

    def _overrides(self) -> dict:
        return {"metadata_timeout": self.timeout, "read_timeout": self.timeout,
                "add_timeout": max(self.timeout, 10.0), **security.current().client_config()}

    def bk(self):
        """A BookKeeperClient (asyncio), once etcd answered; call in a coroutine."""
        from stream.client import BookKeeperClient

        self.check()
        return BookKeeperClient(self.etcd.split(","), self.cluster, **self._overrides())

    def streams(self):
        """An AsyncStreamClient, once etcd answered; call in a coroutine."""
        from stream.stream import AsyncStreamClient

        self.check()
        return AsyncStreamClient(self.etcd.split(","), self.cluster, **self._overrides())

    def run(self, coro):
        return asyncio.run(coro)


def common_options(f):
    f = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                     show_default=True, help="output: a table for people, JSON for scripts")(f)
    f = click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
                     help="seconds for each etcd or bookie call")(f)
    f = click.option("--cluster", envvar="BOOKSTREAM_CLUSTER", default="default", show_default=True)(f)
    f = click.option("--etcd", envvar="BOOKSTREAM_ETCD", default=DEFAULT_ETCD, show_default=True,
                     help="etcd endpoint(s), comma-separated (env BOOKSTREAM_ETCD)")(f)
    return f


def fail(err: AdminError, fmt: str) -> None:
    if fmt == "json":
        sys.stderr.write(json.dumps({"error": {"type": err.type_name, "message": str(err),
                                               "retriable": err.retriable, "exit_code": err.exit_code}}) + "\n")
    else:
        sys.stderr.write(f"error: {err}\n")
    sys.stderr.flush()
    raise SystemExit(err.exit_code)


def admin_command(group: click.Group | None, name: str, **kw):
    """Declares ``fn(adm, **options)`` as command ``name`` of ``group`` (None:
    a command of its own, for the root) with
    the shared options; what it returns (an :class:`Output`, or None) is
    printed in the chosen format, and what it raises is reported as one line."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(etcd, cluster, fmt, timeout, **kwargs):
            adm = Admin(etcd, cluster, fmt, timeout)
            _quiet_logs()
            try:
                out = fn(adm, **kwargs)
            except (SystemExit, click.exceptions.Exit, click.Abort):
                raise
            except KeyboardInterrupt:
                raise SystemExit(130)
            except BaseException as e:  # one line, never a traceback
                if os.environ.get("BOOKSTREAM_DEBUG"):
                    raise
                fail(classify(e), fmt)
            if out is not None:
                print_output(out, fmt)
        make = click.command if group is None else group.command
        return make(name, **kw)(common_options(wrapper))
    return deco


_LOG_FORMAT = {"format": "text"}  # the root's --log-format


def _quiet_logs() -> None:
    """Library log lines (below ERROR) would mix with the output."""
    from bookstream import logs

    logs.setup("ERROR", _LOG_FORMAT["format"], "cli")


# -- the root --------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", envvar="BOOKSTREAM_LOG_FORMAT",
              help="the CLI's own log lines (errors) as text or one JSON object a line")
@security.click_options
def cli(log_format: str, **tls) -> None:
    """bookstream: run and inspect a replicated log store (BookKeeper protocol)."""
    _LOG_FORMAT["format"] = log_format
    try:
        security.CURRENT["security"] = security.Security.of(tls)
    except ValueError as e:  # TlsConfigError: a cert without its key, a user without a password
        raise click.UsageError(str(e)) from None


def _passthrough(name: str, help_text: str) -> click.Command:
    @cli.command(name, help=help_text, add_help_option=False,
                 context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.pass_context
    def cmd(ctx) -> None:
        from bookstream.cli import argparse_main

        raise SystemExit(argparse_main([name, *ctx.args]))
    return cmd


_passthrough("bookie", "run one bookie (bookstream bookie --help)")
_passthrough("standalone", "run a local etcd and bookies until Ctrl-C (bookstream standalone --help)")
_passthrough("bench", "benchmarks (bookstream bench --help)")


def _load_groups() -> None:
    for modname in GROUP_MODULES:
        mod = importlib.import_module(modname)
        for c in mod.COMMANDS:
            cli.add_command(c)


_load_groups()


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="bookstream", standalone_mode=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
