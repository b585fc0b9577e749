"""`bookstream`: the command line.

    bookstream bookie --data-dir DIR [--etcd HOST:PORT] ...   one bookie
    bookstream standalone [--data-dir DIR] [--bookies N]      etcd + N bookies
    bookstream bench suite|bookie|stream|... [...]            benchmarks (a source checkout's bench/)
    bookstream bookies|streams|ledgers|logs|simpletest ...    the admin commands (bookstream/admin.py)
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path

from bookie.server import BookieConfig, BookieServer
from bookie.storage import StorageConfig
from bookstream.tuning import run as run_loop, tune_process

log = logging.getLogger("bookstream")

READY_PREFIX = "BOOKIE_READY "
LEASE_FILE = "registration.lease"  # in the data dir: the lease id of the current registration (hex)
DEFAULT_CLUSTER = "default"


def _setup_logging(level: str, fmt: str = "text", component: str = "bookie"):
    from bookstream import logs

    return logs.setup(level, fmt, component)


# -- bookie ------------------------------------------------------------------------


def bookie_id_for(data_dir: Path, given: str | None) -> str:
    """A bookie's id is chosen once and kept in its data dir: ensembles name
    bookies by id, so the id must not change when the address does."""
    path = data_dir / "bookie.id"
    if path.exists():
        stored = path.read_text().strip()
        if given and given != stored:
            raise SystemExit(f"data dir {data_dir} belongs to bookie {stored!r}, not {given!r}")
        return stored
    bid = given or f"bookie-{uuid.uuid4().hex[:12]}"
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(bid + "\n")
    os.replace(tmp, path)
    return bid


def number(cast, what: str, lo=None, hi=None, above=None):
    """An option's parser: ``cast(text)``, at least ``lo``, above ``above``,
    at most ``hi``; else argparse's one-line error ("must be WHAT")."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}") from None
        if (lo is not None and value < lo) or (above is not None and not value > above) or \
                (hi is not None and value > hi) or value != value:   # (value != value: NaN)
            raise argparse.ArgumentTypeError(f"must be {what}, not {text!r}")
        return value
    return parse


_positive_seconds = number(float, "a positive number of seconds", above=0)
_seconds_or_never = number(float, "a number of seconds, 0 for never", lo=0)
_fraction = number(float, "a fraction between 0 and 1", lo=0, hi=1)
_share = number(float, "a fraction above 0, at most 1", above=0, hi=1)
port_number = number(int, "a port number, 0 for any free one", lo=0, hi=65535)


def _positive_int(what: str, lo: int = 1):
    return number(int, f"{what} (at least {lo})", lo=lo)


def add_bookie_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=0, help="0: any free port")
    p.add_argument("--advertise-address", default="", help="HOST:PORT registered for clients (default: where it listens)")
    p.add_argument("--read-port", type=port_number, default=0,
                   help="the read port (plain range reads, records sent by sendfile; not with TLS): "
                        "0 any free port, registered for clients")
    p.add_argument("--no-read-port", action="store_true", help="no read port: clients read over gRPC")
    p.add_argument("--advertise-read-address", default="",
                   help="HOST:PORT of the read port registered for clients (default: where it listens; "
                        "with --advertise-address and without this: no read port)")
    p.add_argument("--bookie-id", help="default: generated once and kept in the data dir")
    p.add_argument("--etcd", help="etcd endpoint(s), comma-separated; without it the bookie does not register")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER)
    p.add_argument("--registration-ttl", type=_positive_int("whole seconds", 2), default=10,
                   help="seconds the bookie's registration outlives its last keep-alive (etcd lease)")
    p.add_argument("--metadata-wait", type=_seconds_or_never, default=30.0,
                   help="seconds to keep retrying registration while etcd is unavailable")
    p.add_argument("--segment-size", type=_positive_int("bytes", 1 << 16), default=StorageConfig.segment_size,
                   help="bytes of a journal segment")
    p.add_argument("--preallocate", action="store_true",
                   help="zero-fill the next journal segment ahead: cheaper fsyncs, twice the disk writes "
                        "(off by default: see bookie/journal.py)")
    p.add_argument("--checkpoint-bytes", type=_positive_int("bytes"), default=StorageConfig.checkpoint_bytes,
                   help="checkpoint after this much journal")
    p.add_argument("--max-entry-size", type=_positive_int("bytes"), default=StorageConfig.max_entry_size,
                   help="the largest payload the bookie takes (clients learn it from its registration)")
    p.add_argument("--disk-usage-threshold", type=_share, default=StorageConfig.disk_usage_threshold,
                   help="go read-only above this fraction of the disk used")
    p.add_argument("--disk-usage-margin", type=_fraction, default=StorageConfig.disk_usage_margin,
                   help="writable again below threshold minus this")
    p.add_argument("--max-storage-bytes", type=_positive_int("bytes, 0 for the disk's size", 0), default=0,
                   help="treat the journal as full at this size (0: the disk's size)")
    p.add_argument("--compaction-threshold", type=_fraction, default=StorageConfig.compaction_threshold,
                   help="compact journal segments whose live fraction is below this")
    p.add_argument("--stripe-view-window-ids", type=_positive_int("ids"), default=StorageConfig.stripe_view_window_ids,
                   help="a striped ledger's read view covers at most this many ids of its index: the longest "
                        "its build holds the bookie (about 3 ms at the default) and the most it holds (28 B an id)")
    p.add_argument("--disk-check-interval", type=_positive_seconds, default=1.0,
                   help="seconds between two looks at the disk's usage (read-only above the threshold)")
    p.add_argument("--gc-interval", type=_positive_seconds, default=30.0,
                   help="seconds between two journal GC passes (dead segments removed, sparse ones compacted)")
    p.add_argument("--ledger-gc-interval", type=_seconds_or_never, default=600.0,
                   help="every this many seconds, delete the ledgers the metadata no longer has "
                        "(deleted while this bookie was down, or left by a failed copy); 0: never")
    p.add_argument("--over-replicated-gc-interval", type=_seconds_or_never, default=86400.0,
                   help="every this many seconds, clear the entries of ledgers whose metadata no longer names "
                        "this bookie (replaced by autorecovery while it was down); a metadata read per ledger "
                        "held; 0: never")
    p.add_argument("--etcd-check-interval", type=_seconds_or_never, default=30.0,
                   help="every this many seconds, check that etcd is still the one the bookie's cookie names, "
                        "has not gone back in time (restored from a snapshot without --bump-revision) and has kept "
                        "the bookie's mark (marks/<id>, raised at each check: a lost mark shows a restore even with the "
                        "bump); if not, "
                        "the bookie turns read-only for good (reads go on) and writes the file `halted` in its "
                        "data dir, which refuses its starts until removed; 0: never while it runs (its start still "
                        "refuses such an etcd, and a ledger GC pass finding it halts the bookie likewise)")
    p.add_argument("--scrub-interval", type=_seconds_or_never, default=7 * 86400.0,
                   help="every this many seconds (counted from the last pass's end, kept in the data dir), read "
                        "back every entry held and check its CRC; a rotted one is reported to autorecovery, which "
                        "copies it back from the other replicas (a data dir never scrubbed: its first pass an hour "
                        "after the start, or this, if shorter; `bookstream bookies scrub ID`: a pass now); 0: never")
    p.add_argument("--scrub-rate-mb", type=number(float, "MB/s, 0 for no limit", lo=0), default=32.0,
                   help="the scrub reads at most this many MB/s (0: no limit)")
    p.add_argument("--on-lost-disk", choices=("refuse", "rejoin"), default="refuse",
                   help="a data dir that lost its data (etcd holds a cookie for the id, the dir none, or no "
                        "journal) or is damaged (a journal segment gone, a record rotted before later ones): refuse "
                        "to start (exit code 3), or wait, serving nothing, until no ledger names the id "
                        "(autorecovery or `bookstream recover` re-replicates it), then start as a new bookie under "
                        "it (a damaged dir's data first moved into damaged-<time>/ inside it, kept for a look)")
    p.add_argument("--lost-disk-poll", type=_positive_seconds, default=15.0,
                   help="with --on-lost-disk rejoin: seconds between two looks at what still names the id")
    p.add_argument("--admin-port", type=port_number, default=None,
                   help="serve /health /ready /metrics /info over HTTP on this port (0: any free port; "
                        "default: no admin HTTP)")
    p.add_argument("--admin-host", default=None, help="address of the admin HTTP port (default: --host)")
    p.add_argument("--admin-tls", action="store_true", default=bool(os.environ.get("BOOKSTREAM_ADMIN_TLS")),
                   help="serve the admin port over HTTPS only, with --tls-cert/--tls-key; with --tls-ca, "
                        "clients must present a certificate of that CA (env BOOKSTREAM_ADMIN_TLS=1)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--trace", default="", metavar="FILE",
                   help="write the bookie's protocol steps to FILE as NDJSON (TLC trace validation: tla/README.md)")
    from bookstream import security

    security.add_arguments(p)  # --tls-cert/--tls-key [--tls-ca]: gRPC over TLS; --etcd-*: TLS and auth to etcd
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="json: one JSON object a line (time, level, component, bookie_id, ledger, message)")


def storage_config(args: argparse.Namespace) -> StorageConfig:
    """The storage options (raises ValueError: ``StorageConfig``'s checks)."""
    return StorageConfig(
        segment_size=args.segment_size,
        preallocate=args.preallocate,
        checkpoint_bytes=args.checkpoint_bytes,
        max_entry_size=args.max_entry_size,
        disk_usage_threshold=args.disk_usage_threshold,
        disk_usage_margin=args.disk_usage_margin,
        max_storage_bytes=args.max_storage_bytes,
        compaction_threshold=args.compaction_threshold,
        stripe_view_window_ids=args.stripe_view_window_ids,
    )


def bookie_config(args: argparse.Namespace) -> BookieConfig:
    storage = storage_config(args)
    return BookieConfig(
        data_dir=str(args.data_dir),
        host=args.host,
        port=args.port,
        advertise_address=args.advertise_address,
        read_port=None if args.no_read_port else args.read_port,
        advertise_read_address=args.advertise_read_address,
        bookie_id=bookie_id_for(args.data_dir, args.bookie_id),
        storage=storage,
        disk_check_interval_s=args.disk_check_interval,
        gc_interval_s=args.gc_interval,
        ledger_gc_interval_s=args.ledger_gc_interval,
        over_replicated_gc_interval_s=args.over_replicated_gc_interval,
        etcd_check_interval_s=args.etcd_check_interval,
        scrub_interval_s=args.scrub_interval,
        scrub_rate=args.scrub_rate_mb * 1e6,
        set_aside_damaged=args.on_lost_disk == "rejoin",
        tls=_security(args).tls,
        trace=getattr(args, "trace", "") or "",
    )


def _security(args: argparse.Namespace):
    from bookstream.security import Security

    return Security.of(vars(args))


def _with_metadata_wait(args: argparse.Namespace, what: str, fn):
    """``fn()``, tried again while etcd is unavailable, for up to
    ``--metadata-wait`` (etcd may still be starting, or slow to answer on a
    loaded machine)."""
    from metadata.errors import MetadataUnavailable

    deadline = time.monotonic() + args.metadata_wait
    delay = 0.1
    while True:
        try:
            return fn()
        except MetadataUnavailable as e:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s: %s; retrying in %.1f s", what, e, delay)
            time.sleep(delay)  # back-off before a retry
            delay = min(2.0, delay * 2)


def _cookie_check(args: argparse.Namespace):
    """The bookie's cookie, judged before it serves (bookie/cookie.py)."""
    if not args.etcd:
        return None
    from bookie.cookie import verify
    from metadata.store import MetadataStore

    def check_once(server: BookieServer):
        store = MetadataStore(args.etcd.split(","), **_security(args).store_options())
        try:
            return verify(store, args.cluster, Path(server.config.data_dir), server.config.bookie_id,
                          rejoin=args.on_lost_disk == "rejoin", data_present=server.storage.had_history)
        finally:
            store.close()

    def check(server: BookieServer):
        from metadata.errors import LostDiskNotDrained, MetadataUnavailable

        said = None
        while True:
            try:
                return _with_metadata_wait(args, "cookie", lambda: check_once(server))
            except LostDiskNotDrained as e:   # (--on-lost-disk rejoin: serving nothing, unregistered)
                server.starting = f"waiting to rejoin under its id: {e}"   # (the admin port's /ready)
                if str(e) != said:   # progress: what holds the id, as it changes
                    log.warning("%s; waiting (autorecovery, or `bookstream recover %s`), looking again every "
                                "%g s", e, e.bookie_id, args.lost_disk_poll)
                    said = str(e)
            except MetadataUnavailable as e:   # (an outage while it waits is waited out too)
                if said is None:
                    raise
                log.warning("waiting to rejoin: %s", e)
            time.sleep(args.lost_disk_poll)   # (a poll of etcd: the bookie has nothing to serve meanwhile)

    return check


def _registration_factory(args: argparse.Namespace):
    if not args.etcd:
        return None
    from metadata.registration import BookieRegistry
    from metadata.store import MetadataStore
    from bookstream_pb import metadata_pb2 as mpb

    def register(server: BookieServer):
        return _with_metadata_wait(args, "registration", lambda: register_once(server))

    def register_once(server: BookieServer):
        store = MetadataStore(args.etcd.split(","), **_security(args).store_options())
        registry = BookieRegistry(store, args.cluster)
        used, free, total = server.storage.disk_usage()
        reg = mpb.BookieRegistration(
            bookie_id=server.config.bookie_id,
            address=server.address,
            read_address=server.read_address,
            read_only=server.storage.read_only,
            free_bytes=free,
            total_bytes=total,
            max_entry_size=server.config.storage.max_entry_size,  # the clients' limit (EntryTooLarge)
            rejoined_at=server.storage.core.rejoined_at,   # older ledgers' changes leave it out
        )
        lease_file = Path(server.config.data_dir) / LEASE_FILE
        # The lease of this bookie's previous run (recorded below): a
        # registration still under it is our own stale one, replaced at once
        # (no wait for its expiry).  Another lease holding the id is waited for.
        try:
            previous = [int(lease_file.read_text().strip(), 16)]
        except (OSError, ValueError):
            previous = []

        def record(lease) -> None:
            tmp = lease_file.with_suffix(".tmp")
            tmp.write_text(f"{lease.id:x}\n")
            os.replace(tmp, lease_file)

        try:
            registration = registry.register(reg, ttl=args.registration_ttl, replace_leases=previous,
                                              wait_for_stale=2.0 * args.registration_ttl, on_created=record)
        except BaseException:
            store.close()
            raise
        record(registration.lease)
        return registration

    return register


async def run_bookie(args: argparse.Namespace, formatter=None) -> None:
    config = bookie_config(args)
    if hasattr(formatter, "bookie_id"):  # JSON logs name the bookie from here on
        formatter.bookie_id = config.bookie_id
    server = BookieServer(config, _registration_factory(args), _cookie_check(args))
    loop = asyncio.get_running_loop()
    http = None
    if args.admin_port is not None:   # open while it starts: /health answers through a long replay
        from bookstream.admin_http import AdminHttp   # or a lost disk's wait, /ready says which

        http = AdminHttp(server, loop, args.admin_host or args.host, args.admin_port,
                         tls=_security(args).tls if args.admin_tls else None).start()
    try:
        await server.start()
    except BaseException:
        if http is not None:
            http.stop()
        raise
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    info = {"bookie_id": config.bookie_id, "address": server.address, "pid": os.getpid(),
            "read_port": server.read_port.port if server.read_port else None,
            "read_address": server.read_address}
    if http is not None:
        info["admin_address"] = http.address
        info["admin_scheme"] = http.scheme
    tune_process()  # after start-up (replay, index): bookstream/tuning.py
    print(READY_PREFIX + json.dumps(info), flush=True)
    log.info("bookie %s serving on %s", config.bookie_id, server.address)
    await stop.wait()
    log.info("bookie %s stopping", config.bookie_id)
    if http is not None:
        http.stop()
    await server.stop()


def cmd_bookie(args: argparse.Namespace) -> int:
    formatter = _setup_logging(args.log_level, args.log_format)
    from metadata.tls import TlsConfigError

    try:
        sec = _security(args)
        if args.admin_tls and args.admin_port is not None and not (sec.tls and sec.tls.cert):
            raise TlsConfigError("--admin-tls serves the admin port with the bookie's certificate: "
                                 "give --tls-cert and --tls-key")
    except TlsConfigError as e:  # a cert without its key, a user without a password: one line
        log.error("%s", e)
        return 2
    from bookie.storage import DamagedDataDir, DataDirInUse, StorageFormatError
    from metadata.errors import InvalidCookie

    try:
        storage_config(args)   # (what argparse cannot check alone: a margin below the threshold)
    except ValueError as e:
        log.error("%s", e)
        return 2
    try:
        run_loop(run_bookie(args, formatter))
    except InvalidCookie as e:  # (bookie/cookie.py: nothing was served)
        log.error("%s", e)
        return 3
    except (StorageFormatError, DataDirInUse) as e:
        log.error("refusing to start: %s", e)
        return 3
    except DamagedDataDir as e:   # (nothing was served, nothing changed on disk)
        log.error("refusing to start: the data dir is damaged: %s. Served, it would answer \"no such entry\" for "
                  "entries it acknowledged. Its way back is a lost disk's: start with --on-lost-disk rejoin (its "
                  "data moved into damaged-<time>/ inside the data dir, kept for a look), or move the data dir "
                  "aside, then `bookstream recover ID` and `bookstream bookies cookie delete ID`", e)
        return 3
    return 0


# -- bench: the one way into the benchmarks ------------------------------------------

BENCH_MISSING = ("bookstream: the benchmarks are not installed: they live in a source checkout's bench/ "
                 "(the wheel does not ship them); run bookstream from a checkout installed with "
                 "pip install -e '.[bench]'")


def load_bench(module: str = "cli"):
    """`bench.<module>`, imported only when a benchmark command runs: `bench/`
    sits beside `bookstream/` in a source checkout, and the wheel does not
    ship it.  Without it: one line on stderr and exit code 2."""
    root = Path(__file__).resolve().parents[1]
    if (root / "bench" / "__init__.py").is_file() and str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        return importlib.import_module(f"bench.{module}")
    except ModuleNotFoundError as e:
        if e.name not in ("bench", f"bench.{module}"):
            raise
        print(BENCH_MISSING, file=sys.stderr)
        raise SystemExit(2) from None


# -- main ----------------------------------------------------------------------------


def argparse_main(argv: list[str] | None = None) -> int:
    """The argparse commands (bookie, standalone, bench), which the click
    tree of bookstream/admin.py passes their arguments through to."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmarks parse their own arguments
        return load_bench().main(argv[1:])
    parser = argparse.ArgumentParser(prog="bookstream", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("bookie", help="run one bookie")
    add_bookie_args(p)
    p.set_defaults(func=cmd_bookie)

    from bookstream import standalone

    standalone.add_parser(sub)
    sub.add_parser("bench", help="benchmarks (bookstream bench --help)")

    args = parser.parse_args(argv)
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    """`bookstream`: the whole command tree (bookstream/admin.py)."""
    from bookstream.admin import main as admin_main

    return admin_main(argv)


if __name__ == "__main__":
    sys.exit(main())
