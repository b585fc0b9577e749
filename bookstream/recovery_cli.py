"""The recovery commands (issue 15), added to the ``bookstream`` command tree
by ``bookstream/admin.py`` (``GROUP_MODULES``):

    bookstream recover BOOKIE [--to TARGET] [--dry-run] [--seal-open] [--spark [--master URL]]
    bookstream decommission BOOKIE
    bookstream autorecovery status|enable|disable|run
    bookstream underreplicated list
    bookstream whoisauditor

Each takes ``--etcd`` (or ``$BOOKSTREAM_ETCD``), ``--cluster`` and ``--format
text|json``.  ``recover`` shows a progress bar (fragments, entries, bytes,
rate, ETA) on a terminal and nothing in scripts; its summary goes to stdout.
It is safe to interrupt and re-run: a fragment's bookie is replaced only
after its copy is durable on the target, and a re-run plans from the
metadata again.  Exit status: 0 all done, 1 something left (unrecoverable
fragments, open fragments not sealed, failures), 2 refused, 130 interrupted.
"""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time

import click

from stream.autorecovery.auditor_core import AuditorConfig
from stream.autorecovery.keys import AutorecoveryKeys, StoreLeases
from stream.autorecovery.service import (Auditor, RecoveryLocks, ReplicationWorker, WorkerConfig, plan_bookie,
                                         recover_ledger_fragments)
from stream.autorecovery.worker_core import Pace, Step
from metadata.layout import KeyLayout

MB = 1 << 20
_RATE_HELP = ("copy at most this many MiB/s (BookKeeper's replicationRateByBytes): re-replication "
              "leaves the surviving bookies' disks and network to the writers and readers; 0: no limit")


def _common(f):
    f = click.option("--format", "fmt", type=click.Choice(["table", "text", "json"]), default="table",
                     help="table (text) or json")(f)
    f = click.option("--cluster", default="default", show_default=True)(f)
    f = click.option("--etcd", envvar="BOOKSTREAM_ETCD", default="127.0.0.1:2379", show_default=True,
                     help="etcd endpoint(s), comma-separated")(f)
    return f


def _store_options() -> dict:
    from bookstream.security import current

    return current().store_options()


def _client(etcd: str, cluster: str):
    from stream.client import BookKeeperClient
    from bookstream.security import current

    return BookKeeperClient(etcd.split(","), cluster, **current().client_config())


def _emit(fmt: str, data, text: str) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True) if fmt == "json" else text)


@click.group()
def commands() -> None:
    """Recovery commands."""


# -- recover ------------------------------------------------------------------------------

class _Progress:
    """A one-line progress bar on stderr when it is a terminal."""

    def __init__(self, fragments: int, entries: int, enabled: bool) -> None:
        self.total_f, self.total_e = fragments, entries
        self.f = self.e = self.b = 0
        self.t0 = time.monotonic()
        self.enabled = enabled
        self._last = 0.0

    def __call__(self, kind: str, entries: int, nbytes: int) -> None:
        if kind == "fragment":
            self.f += 1
        self.e += entries
        self.b += nbytes
        self.draw()

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.2):
            return
        self._last = now
        dt = max(now - self.t0, 1e-6)
        rate_e = self.e / dt
        eta = (self.total_e - self.e) / rate_e if rate_e > 0 and self.total_e > self.e else 0
        width = 24
        done = int(width * min(1.0, self.e / self.total_e)) if self.total_e else width
        sys.stderr.write(f"\r[{'#' * done}{'-' * (width - done)}] {self.f}/{self.total_f} fragments  "
                         f"{self.e:,}/{self.total_e:,} entries  {self.b / 1e6:,.1f} MB  "
                         f"{self.b / 1e6 / dt:,.1f} MB/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}   ")
        sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            self.draw(force=True)
            sys.stderr.write("\n")


async def recover_bookie(etcd: str, cluster: str, bookie: str, *, to: str | None, dry_run: bool,
                         seal_open: bool, show_progress: bool, rate: float = 0.0) -> dict:
    client = _client(etcd, cluster)
    pace = Pace.of(rate)
    try:
        t0 = time.monotonic()
        plans = await plan_bookie(client, bookie)
        frags = sum(len(p.jobs) for _, p in plans)
        entries = sum(j.entries for _, p in plans for j in p.jobs)
        summary = {"bookie": bookie, "dry_run": dry_run, "ledgers": len(plans), "fragments_planned": frags,
                   "entries_planned": entries,
                   "open_fragments": [[lid, p.open_fragment] for lid, p in plans if p.open_fragment is not None],
                   "unrecoverable": [dict(ledger_id=lid, first=u.first_entry, last=u.last_entry, why=u.why)
                                     for lid, p in plans for u in p.unrecoverable],
                   "fragments_replaced": 0, "entries_copied": 0, "bytes_copied": 0, "left": []}
        if dry_run:
            summary["plan"] = [{"ledger_id": lid, "fragments": [[j.first_entry, j.last_entry, j.lost, j.entries]
                                                                 for j in p.jobs]} for lid, p in plans]
            return summary
        bar = _Progress(frags, entries, show_progress)
        summary["unrecoverable"] = []
        # the workers' per-ledger locks: no worker or other recovery copies the same fragments meanwhile
        locks = RecoveryLocks(client, cluster)
        try:
            outcomes = []
            for lid, _ in plans:
                holder = await asyncio.to_thread(locks.take, lid)
                if holder is not None:
                    summary["left"].append({"ledger_id": lid, "step": Step.WAIT.value,
                                            "note": f"being recovered by {holder}", "open_fragment": None})
                    continue
                out = await recover_ledger_fragments(client, lid, {bookie}, target=to, seal=seal_open, grace=0.0,
                                                     progress=bar, pace=pace,
                                                     keep_going=lambda lid=lid: locks.still_mine(lid),
                                                     copy_token=locks.held[lid])
                outcomes.append((lid, out))
        finally:
            await asyncio.to_thread(locks.release)
        for lid, out in outcomes:
            summary["fragments_replaced"] += len(out.replaced)
            summary["entries_copied"] += out.entries
            summary["bytes_copied"] += out.bytes
            summary["unrecoverable"] += [dict(u, ledger_id=lid) for u in out.unrecoverable]
            if out.step is not Step.DONE:
                summary["left"].append({"ledger_id": lid, "step": out.step.value, "note": out.note,
                                        "open_fragment": out.open_fragment})
        bar.end()
        dt = time.monotonic() - t0
        summary["seconds"] = round(dt, 3)
        summary["mb_per_s"] = round(summary["bytes_copied"] / 1e6 / dt, 2) if dt > 0 else 0.0
        summary["entries_per_s"] = round(summary["entries_copied"] / dt, 1) if dt > 0 else 0.0
        summary["open_fragments"] = [[x["ledger_id"], x["open_fragment"]] for x in summary["left"]
                                     if x["open_fragment"] is not None]
        return summary
    finally:
        await client.close()


def _summary_text(s: dict) -> str:
    if s["dry_run"]:
        lines = [f"{s['bookie']}: {s['ledgers']} ledger(s), {s['fragments_planned']} fragment(s) to copy, "
                 f"{s['entries_planned']:,} entries"]
        for p in s["plan"]:
            if "fragments" in p:
                for first, last, _, n in p["fragments"]:
                    lines.append(f"  ledger {p['ledger_id']}: fragment {first}..{last} ({n} entries)")
            else:  # --spark: one task per fragment
                lines.append(f"  ledger {p['ledger_id']}: fragment {p['first']}..{p['last']} ({p['entries']} "
                             f"entries) -> {p['target'] or 'placement'}")
    else:
        lines = [f"{s['bookie']}: {s['fragments_replaced']} fragment(s) replaced in {s['ledgers']} ledger(s), "
                 f"{s['entries_copied']:,} entries, {s['bytes_copied'] / 1e6:,.1f} MB in {s['seconds']} s "
                 f"({s['mb_per_s']} MB/s, {s['entries_per_s']:,} entries/s)"]
        if "fragments" in s:  # --spark: per fragment
            lines.append(f"  {s['spark']['tasks']} task(s) on {s['spark']['master']}: {s['fragments_replaced']} "
                         f"done, {s['fragments_skipped']} skipped, {s['fragments_failed']} failed")
            lines += [f"  ledger {r['ledger_id']} fragment {r['first']}..{r['last']}: {r['status']}"
                      + (f" -> {r['target']}" if r["target"] else "") + (f" ({r['note']})" if r["note"] else "")
                      for r in s["fragments"]]
        for x in s["left"]:
            where = f" fragment {x['first']}" if x.get("first") is not None else ""
            lines.append(f"  left: ledger {x['ledger_id']}{where} ({x['step']}) {x['note']}")
    for lid, first in s["open_fragments"]:
        lines.append(f"  open: ledger {lid} fragment {first} (its writer owns it; --seal-open to seal)")
    for u in s["unrecoverable"]:
        lines.append(f"  UNRECOVERABLE: ledger {u['ledger_id']} fragment {u['first']}..{u['last']}: {u['why']}")
    return "\n".join(lines)


def _exit_code(s: dict) -> int:
    if s["dry_run"]:
        return 0
    return 1 if s["left"] or s["unrecoverable"] else 0


@commands.command()
@click.argument("bookie")
@click.option("--to", "to", help="copy fragments to this bookie (one that already holds a fragment: chosen by placement, as without --to)")
@click.option("--dry-run", is_flag=True, help="only say what would be copied")
@click.option("--seal-open", is_flag=True, help="also seal open fragments naming BOOKIE (fences their writer)")
@click.option("--spark", is_flag=True, help="run as a Spark job: one task per fragment (stream/spark/recover.py)")
@click.option("--master", help="with --spark: the Spark master URL (local[2], spark://host:7077, yarn...)")
@click.option("--rate-mb", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help=_RATE_HELP + "; with --spark, each task's (N tasks at once copy at N times it)")
@_common
def recover(bookie, to, dry_run, seal_open, spark, master, rate_mb, etcd, cluster, fmt):
    """Copy every fragment that names BOOKIE to other bookies."""
    show = fmt != "json" and sys.stderr.isatty()
    if master and not spark:
        raise click.UsageError("--master goes with --spark")
    try:
        if spark:
            from bookstream.security import current
            from stream.spark.recover import recover_on_spark, spark_session
            s = recover_on_spark(spark_session(master), etcd, cluster, bookie, to=to, dry_run=dry_run,
                                 seal_open=seal_open, security=current().client_config(), rate=rate_mb * MB)
        else:
            s = asyncio.run(recover_bookie(etcd, cluster, bookie, to=to, dry_run=dry_run, seal_open=seal_open,
                                           show_progress=show, rate=rate_mb * MB))
    except KeyboardInterrupt:
        click.echo("\ninterrupted: every fragment replaced so far is complete; run again to continue", err=True)
        sys.exit(130)
    _emit(fmt, s, _summary_text(s))
    sys.exit(_exit_code(s))


@commands.command()
@click.argument("bookie")
@click.option("--rate-mb", type=click.FloatRange(min=0), default=0.0, show_default=True, help=_RATE_HELP)
@_common
def decommission(bookie, rate_mb, etcd, cluster, fmt):
    """Re-replicate everything BOOKIE holds, then remove its registration
    and record its id as decommissioned.  BOOKIE must be stopped or
    read-only."""
    from metadata.registration import BookieRegistry
    from metadata.store import MetadataStore
    store = MetadataStore(etcd.split(","), **_store_options())
    try:
        writable = {r.bookie_id for r in BookieRegistry(store, cluster).list_bookies(True)}
        if bookie in writable:
            click.echo(f"refused: {bookie} is writable; stop it or make it read-only first", err=True)
            sys.exit(2)
        s = asyncio.run(recover_bookie(etcd, cluster, bookie, to=None, dry_run=False, seal_open=True,
                                       show_progress=fmt != "json" and sys.stderr.isatty(), rate=rate_mb * MB))
        left = asyncio.run(_still_named(etcd, cluster, bookie))
        s["still_named_by"] = left
        if not left and not s["unrecoverable"]:
            kl = KeyLayout(cluster)
            AutorecoveryKeys(store, cluster).mark_decommissioned(
                bookie, [kl.bookie_key(bookie, False), kl.bookie_key(bookie, True)])
            from bookie.cookie import release
            release(store, cluster, bookie)   # (as BookKeeper's decommission: its id retired; taken again, a rejoin)
            s["decommissioned"] = True
        else:
            s["decommissioned"] = False
        text = _summary_text(s) + ("\ndecommissioned" if s["decommissioned"] else
                                   f"\nNOT decommissioned: still named by {left[:5]}")
        _emit(fmt, s, text)
        sys.exit(0 if s["decommissioned"] else 1)
    finally:
        store.close()


async def _still_named(etcd: str, cluster: str, bookie: str) -> list:
    client = _client(etcd, cluster)
    try:
        return [[lid, p.open_fragment] for lid, p in await plan_bookie(client, bookie) if not p.clean]
    finally:
        await client.close()


# -- autorecovery, underreplicated, whoisauditor -----------------------------------------------

@commands.group()
def autorecovery() -> None:
    """The auditor and replication workers."""


def _keys(etcd: str, cluster: str):
    from metadata.store import MetadataStore
    store = MetadataStore(etcd.split(","), **_store_options())
    return store, AutorecoveryKeys(store, cluster)


@autorecovery.command()
@_common
def status(etcd, cluster, fmt):
    """Enabled or not, the auditor, the tasks."""
    store, keys = _keys(etcd, cluster)
    try:
        tasks = list(keys.tasks())
        s = {"enabled": keys.enabled(), "auditor": keys.auditor(), "underreplicated": len(tasks),
             "unrecoverable": sum(len(t.unrecoverable) for t in tasks),
             "locked": sum(1 for t in tasks if keys.lock_holder(t.ledger_id)),
             "decommissioned": keys.decommissioned()}
    finally:
        store.close()
    aud = s["auditor"]["id"] if s["auditor"] else "none"
    _emit(fmt, s, f"autorecovery {'enabled' if s['enabled'] else 'DISABLED'}; auditor: {aud}; "
                  f"{s['underreplicated']} under-replicated ledger(s) ({s['locked']} being worked on), "
                  f"{s['unrecoverable']} unrecoverable fragment(s)")


def _switch(on: bool, etcd, cluster, fmt):
    store, keys = _keys(etcd, cluster)
    try:
        keys.set_enabled(on)
    finally:
        store.close()
    _emit(fmt, {"enabled": on}, f"autorecovery {'enabled' if on else 'disabled'}")


@autorecovery.command()
@_common
def enable(etcd, cluster, fmt):
    """Switch autorecovery on, cluster-wide."""
    _switch(True, etcd, cluster, fmt)


@autorecovery.command()
@_common
def disable(etcd, cluster, fmt):
    """Switch autorecovery off, cluster-wide (e.g. during maintenance)."""
    _switch(False, etcd, cluster, fmt)


@autorecovery.command()
@click.option("--delay", type=click.FloatRange(min=0), default=30.0, show_default=True, help="lost_bookie_recovery_delay (s)")
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="an open fragment's writer has this long to change its ensemble (s)")
@click.option("--writer-bound", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="... and a stream writer whose lease-bound registration says it is live this long (s)")
@click.option("--no-auditor", is_flag=True, help="run only a replication worker")
@click.option("--no-worker", is_flag=True, help="run only an auditor candidate")
@click.option("--check-interval", type=click.FloatRange(min=0, min_open=True), default=None, help="the periodic check's period (s; default off)")
@click.option("--full-check", is_flag=True,
              help="the periodic check reads every entry from every replica (BookKeeper's LedgerChecker): finds an "
                   "entry missing mid-fragment or failing its checksum, at the cost of reading every ledger Qw times "
                   "a period (default: one ReadLac per ledger and bookie)")
@click.option("--full-check-percentage", type=click.FloatRange(0, 100), default=100.0, show_default=True,
              help="the full check reads this share of each fragment's ids, the next windows of them each period "
                   "(every id within ceil(100 / P) periods), and its first and last id always (BookKeeper's "
                   "auditorLedgerVerificationPercentage; 0: those two only)")
@click.option("--rate-mb", type=click.FloatRange(min=0), default=0.0, show_default=True, help=_RATE_HELP)
@click.option("--log-level", default="info")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              help="json: one JSON object a line (bookstream/logs.py)")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="serve Prometheus /metrics (tasks, re-replicated bytes, the client's figures) on this port "
                   "of 127.0.0.1 (0: any free port, logged)")
@click.option("--metrics-tls", is_flag=True, envvar="BOOKSTREAM_ADMIN_TLS",
              help="serve --metrics-port over HTTPS only with --tls-cert/--tls-key (bookstream's root options or "
                   "$BOOKSTREAM_TLS_*); with --tls-ca, clients must present a certificate of that CA")
@_common
def run(delay, grace, writer_bound, no_auditor, no_worker, check_interval, full_check, full_check_percentage, rate_mb,
        log_level, log_format, metrics_port, metrics_tls, etcd, cluster, fmt):
    """Run an auditor candidate and a replication worker until SIGTERM/Ctrl-C."""
    from bookstream import logs

    if full_check and check_interval is None:
        raise click.UsageError("--full-check is a kind of periodic check: give --check-interval too")
    if full_check_percentage < 100 and not full_check:
        raise click.UsageError("--full-check-percentage is the full check's: give --full-check too")

    logs.setup(log_level, log_format, "autorecovery")
    if metrics_port is not None:
        import prometheus_client

        from stream.metrics import AutorecoveryMetrics

        AutorecoveryMetrics.default()  # its families exported (at 0) from the start
        tls = {}
        if metrics_tls:
            from bookstream.security import current

            files = current().tls
            if not (files and files.cert):
                raise click.UsageError("--metrics-tls needs --tls-cert and --tls-key ($BOOKSTREAM_TLS_CERT/_KEY)")
            tls = dict(certfile=files.cert, keyfile=files.key, client_cafile=files.ca,
                       client_auth_required=bool(files.ca))
        httpd, _ = prometheus_client.start_http_server(metrics_port, addr="127.0.0.1", **tls)
        logging.getLogger("bookstream.autorecovery").info("metrics on %s://127.0.0.1:%d/metrics",
                                                          "https" if tls else "http", httpd.server_port)
    asyncio.run(run_daemon(etcd, cluster, delay=delay, grace=grace, auditor=not no_auditor, worker=not no_worker,
                           check_interval=check_interval, full_check=full_check, writer_bound=writer_bound,
                           rate=rate_mb * MB, full_check_percent=full_check_percentage))


async def run_daemon(etcd: str, cluster: str, *, delay: float, grace: float, auditor: bool = True,
                     worker: bool = True, check_interval: float | None = None, full_check: bool = False,
                     writer_bound: float = 600.0, rate: float = 0.0, full_check_percent: float = 100.0) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    wc, ac = _client(etcd, cluster), _client(etcd, cluster)
    runs = []
    if worker:
        runs.append(ReplicationWorker(wc, AutorecoveryKeys(wc.store, cluster), StoreLeases(wc.store),
                                      WorkerConfig(grace=grace, writer_bound=writer_bound, rate=rate)).run(stop))
    if auditor:
        runs.append(Auditor(ac, AutorecoveryKeys(ac.store, cluster), StoreLeases(ac.store),
                            AuditorConfig(delay, check_interval, full_check, full_check_percent)).run(stop))
    print("AUTORECOVERY_READY", flush=True)
    try:
        await asyncio.gather(*runs)
    finally:
        await wc.close()
        await ac.close()


@autorecovery.command()
@click.option("--mb", type=click.IntRange(min=1), default=1024, show_default=True, help="MB of the lost bookie's data")
@click.option("--entry-size", type=click.IntRange(min=1), default=64 << 10, show_default=True)
@click.option("--dir", "directory", help="where the cluster's data goes (the disk measured)")
@click.option("--out", help="write the result as JSON here")
@click.option("--keep-data", is_flag=True)
@click.option("--rate-mb", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="the recovery's rate limit (MiB/s; 0: none)")
@click.option("--writer-rate", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="an open loop of 1 KiB appends at this rate, alone then beside the copy (0: none)")
@click.option("--writer-seconds", type=click.FloatRange(min=0.5), default=5.0, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def bench(mb, entry_size, directory, out, keep_data, rate_mb, writer_rate, writer_seconds, fmt):
    """Re-replication rate of a lost bookie's data beside the disk's
    sequential read + write ceiling, measured in the same run (starts its
    own etcd and bookies); with --writer-rate, a writer's p99 beside the
    copy ÷ alone."""
    from bookstream.cli import load_bench

    b = load_bench("autorecovery")  # bench/autorecovery.py, in a source checkout
    r = b.run_bench(mb, entry_size, directory, keep_data, rate_mb, writer_rate, writer_seconds)
    if out:
        b.write_json(r, out)
    _emit(fmt, r, b.report(r))


@commands.group()
def underreplicated() -> None:
    """Under-replicated ledgers."""


@underreplicated.command("list")
@_common
def list_(etcd, cluster, fmt):
    """Every task: the ledger, the lost bookies, unrecoverable fragments."""
    store, keys = _keys(etcd, cluster)
    try:
        tasks = [dict(t.as_json(), locked_by=keys.lock_holder(t.ledger_id)) for t in keys.tasks()]
    finally:
        store.close()
    lines = [f"ledger {t['ledger_id']}: lost {','.join(t['lost'])}"
             + "".join(f"; {b} damaged at {_ranges_text(rs)}" for b, rs in t["damaged_ids"].items())
             + (f" (worked on by {t['locked_by']})" if t["locked_by"] else "")
             + (f"; {len(t['unrecoverable'])} UNRECOVERABLE fragment(s)" if t["unrecoverable"] else "")
             for t in tasks]
    _emit(fmt, tasks, "\n".join(lines) or "no under-replicated ledgers")


def _ranges_text(ranges) -> str:
    """Id ranges as "3, 7-9"."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


@commands.command()
@_common
def whoisauditor(etcd, cluster, fmt):
    """The elected auditor, if any."""
    store, keys = _keys(etcd, cluster)
    try:
        a = keys.auditor()
    finally:
        store.close()
    _emit(fmt, a, a["id"] + (f" ({a['address']})" if a.get("address") else "") if a else "no auditor")


# The commands the admin tree (bookstream/admin.py, GROUP_MODULES) adds to ``bookstream``.
COMMANDS = list(commands.commands.values())


__all__ = ["commands", "COMMANDS", "recover_bookie", "plan_bookie", "run_daemon"]
