"""Manual recovery and the recovery commands, run as a user runs them
(``bookstream ...`` subprocesses), against real etcd and bookie processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

import pytest

from bookstream_pb import metadata_pb2 as mpb
from metadata.errors import BookieDecommissioned
from metadata.registration import BookieRegistry
from metadata.store import MetadataStore
from stream.client import BookKeeperClient
from stream.stream import AsyncStreamClient, StreamConfig
from tests.conftest import run
from tests.test_autorecovery import autorecovery, check_every_replica, names_bookie, until

CLI = [sys.executable, "-c", "import sys; from bookstream.cli import main; sys.exit(main())"]


def cli(env, *args, check=True):
    p = subprocess.run(CLI + list(args) + ["--etcd", env.endpoint, "--cluster", env.cluster],
                       capture_output=True, text=True, timeout=120)
    if check and p.returncode not in (0, 1):
        raise AssertionError(f"{args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def closed_ledger(env, payloads: list[bytes], batch: int = 100, ack_quorum: int = 2) -> tuple[int, tuple[str, ...]]:
    """A closed E3 Qw3 Qa2 ledger of ``payloads`` (added ``batch`` at a
    time): (ledger id, its ensemble).  (Closed at Qa: a bookie may still
    lack the last entries; ``ack_quorum=3`` where a test asks one bookie
    for every entry.)"""
    async def write():
        bk = BookKeeperClient(env.endpoint, env.cluster)
        lh = await bk.create_ledger(3, 3, ack_quorum)
        for k in range(0, len(payloads), batch):
            await lh.add_entries(payloads[k:k + batch])
        await lh.close()
        await bk.close()
        return lh.ledger_id, lh.metadata.fragments[0].ensemble

    return run(write())


def written_stream(env, name: str, config: StreamConfig, payloads: list[bytes]) -> int:
    """A stream of ``payloads`` whose writer closed (its last fragment open,
    no live writer): its ledger id."""
    async def write():
        async with AsyncStreamClient(env.endpoint, env.cluster) as sc:
            w = await sc.open_writer(name, config)
            await w.append_many(payloads)
            await w.close()
            return (await sc.stream_info(name))["ledger_id"]

    return run(write())


def closed_ledger_first_bookie_killed(own, procs, payloads: list[bytes], batch: int = 100):
    """``closed_ledger``, then its ensemble's first bookie killed: (ledger
    id, ensemble, the killed bookie's process)."""
    lid, ensemble = closed_ledger(own, payloads, batch)
    victim = next(p for p in procs if p.bookie_id == ensemble[0])
    victim.kill()
    return lid, ensemble, victim


def test_recover_to_a_target_that_holds_later_fragments(own):
    """The copy of a stream fragment holding the take-over's truncate no-op
    must not truncate the target's entries of later fragments: the no-op
    goes as a plain no-op (stream/autorecovery/copier.py).  With the flag kept,
    the target's later entries vanish (NO_SUCH_ENTRY in the replica check)."""
    procs = own.start(4)
    ids = [p.bookie_id for p in procs]
    name = f"s-{uuid.uuid4().hex[:8]}"
    lid = written_stream(own, name, StreamConfig(3, 3, 2, fragment_size_entries=10), [b"e%d" % i for i in range(59)])
    bk0 = BookKeeperClient(own.endpoint, own.cluster)
    meta, _ = bk0.ledgers.read(lid)
    first = meta.fragments[0]
    (target,) = set(ids) - set(first.ensemble)
    later = [f for f in meta.fragments[1:-1] if target in f.ensemble]
    assert later, "placement put the 4th bookie in no sealed fragment (1 in 4**5): rerun"
    lost = first.ensemble[1]
    sealed = [f for f in meta.fragments[:-1] if lost in f.ensemble]  # (those holding target: placement's pick)

    dry = cli(own, "recover", lost, "--to", target, "--dry-run", "--format", "json")
    plan = json.loads(dry.stdout)
    assert dry.returncode == 0 and plan["fragments_planned"] == len(sealed) and plan["dry_run"]
    assert bk0.ledgers.read(lid)[0].fragments == meta.fragments  # a dry run changes nothing

    p = cli(own, "recover", lost, "--to", target, "--format", "json")
    s = json.loads(p.stdout)
    assert s["fragments_replaced"] == len(sealed) and s["entries_copied"] > 0, s
    # the newest fragment is open (its writer owns it): left, and said so
    assert p.returncode == (1 if lost in meta.last_fragment.ensemble else 0)
    after, _ = bk0.ledgers.read(lid)
    assert after.fragments[0].ensemble == tuple(target if b == lost else b for b in first.ensemble)

    async def check():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        last_sealed = after.fragments[-1].first_entry - 1
        assert await check_every_replica(bk, lid, last_sealed, set(ids)) > 0
        await bk.close()
    run(check())

    # re-running has nothing left to copy (safe to interrupt and re-run)
    again = json.loads(cli(own, "recover", lost, "--to", target, "--format", "json").stdout)
    assert again["fragments_replaced"] == 0 and again["entries_copied"] == 0


def test_status_switch_list_and_whoisauditor(own):
    procs = own.start(4)
    assert json.loads(cli(own, "whoisauditor", "--format", "json").stdout) is None
    st = json.loads(cli(own, "autorecovery", "status", "--format", "json").stdout)
    assert st["enabled"] and st["underreplicated"] == 0 and st["auditor"] is None
    assert json.loads(cli(own, "autorecovery", "disable", "--format", "json").stdout) == {"enabled": False}
    assert not json.loads(cli(own, "autorecovery", "status", "--format", "json").stdout)["enabled"]

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        lh = await bk.create_ledger(3, 3, 2)
        for i in range(5):
            await lh.add_entry(b"%d" % i)
        await lh.close()
        victim = next(p for p in procs if p.bookie_id in lh.metadata.fragments[0].ensemble)
        victim.kill()
        async with autorecovery(own, delay=0.3, grace=0.3) as (auditor, ws, keys):
            await until(lambda: _aw(auditor.elected.is_set()), what="elected")
            who = json.loads(cli(own, "whoisauditor", "--format", "json").stdout)
            assert who["id"] == auditor.id
            # disabled: the lost bookie is noted, but no task is published or worked on
            await until(lambda: _aw(victim.bookie_id in auditor.core.lost), what="lost")
            assert not list(keys.tasks()) and not ws[0].outcomes
            # decommission of a writable bookie is refused
            d = cli(own, "decommission", next(p for p in procs if p is not victim).bookie_id, check=False)
            assert d.returncode == 2 and "refused" in d.stderr
            cli(own, "autorecovery", "enable")
            await until(lambda: _aw(not list(keys.tasks()) and ws[0].outcomes), what="recovered once enabled")
            lst = json.loads(cli(own, "underreplicated", "list", "--format", "json").stdout)
            assert lst == []
        assert not await names_bookie(bk, victim.bookie_id)
        # the dead bookie can now be decommissioned: nothing names it
        d = cli(own, "decommission", victim.bookie_id, "--format", "json")
        assert d.returncode == 0 and json.loads(d.stdout)["decommissioned"], d.stdout + d.stderr
        st = json.loads(cli(own, "autorecovery", "status", "--format", "json").stdout)
        assert st["decommissioned"] == [victim.bookie_id]
        # its id is refused if it comes back (it would register a retired identity)
        store = MetadataStore(own.endpoint)
        try:
            with pytest.raises(BookieDecommissioned):
                BookieRegistry(store, own.cluster).register(
                    mpb.BookieRegistration(bookie_id=victim.bookie_id, address="127.0.0.1:1"), ttl=5)
            assert victim.bookie_id not in {
                r.bookie_id for r in BookieRegistry(store, own.cluster).list_bookies()}
            from bookie.cookie import read_etcd
            assert read_etcd(store, own.cluster, victim.bookie_id).released   # (bookie/cookie.py: no dir holds it)
        finally:
            store.close()
        await bk.close()

    run(go())


async def _aw(v) -> bool:
    return bool(v)


def test_a_worker_killed_mid_copy_another_takes_over(own, tmp_path):
    """A worker process (its copies limited to 8 MiB/s) is kill -9'd while
    it copies; its lock's lease expires, the in-process worker takes the task
    over; each fragment is
    replaced once (its ensemble has the lost bookie's position replaced,
    nothing else changed), and every replica reads back."""
    procs = own.start(4)
    by_id = {p.bookie_id: p for p in procs}
    lid, ensemble, killed = closed_ledger_first_bookie_killed(own, procs, [os.urandom(64 << 10)] * 1200)
    victim = killed.bookie_id
    # 8 MiB/s: the 75 MB copy takes ~9 s, a window the poll below cannot miss
    # (unlimited, the copy can end between two polls, and the lock with it)
    worker = subprocess.Popen(CLI + ["autorecovery", "run", "--delay", "0.5", "--grace", "0.5", "--rate-mb", "8",
                                     "--etcd", own.endpoint, "--cluster", own.cluster],
                              stdout=subprocess.PIPE, stderr=open(tmp_path / "worker.log", "w"), text=True)
    try:
        assert worker.stdout.readline().strip() == "AUTORECOVERY_READY"

        async def go():
            bk = BookKeeperClient(own.endpoint, own.cluster)
            from stream.autorecovery.keys import AutorecoveryKeys
            keys = AutorecoveryKeys(bk.store, own.cluster)
            live = [b for b in by_id if b != victim]
            base = {b: (await (await bk.bookie(b)).info()).journal_bytes for b in live}

            async def copying():
                if keys.lock_holder(lid) is None:
                    return False
                now = {b: (await (await bk.bookie(b)).info()).journal_bytes for b in live}
                return any(now[b] - base[b] > (4 << 20) for b in live)
            await until(copying, what="the worker process copying")
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            t0 = time.monotonic()
            async with autorecovery(own, delay=0.5, grace=0.5) as (auditor, ws, _keys):
                async def clean():
                    return keys.get_task(lid) is None and not await names_bookie(bk, victim)
                await until(clean, what="the task taken over and finished")
                assert ws[0].outcomes and ws[0].outcomes[-1].replaced
            assert time.monotonic() - t0 > 0  # (the lease of the dead worker had to expire first)
            meta, _ = await bk.meta_call(bk.ledgers.read, lid)
            (frag,) = meta.fragments
            assert [b for b, o in zip(frag.ensemble, ensemble) if b != o] == [frag.ensemble[0]]
            assert frag.ensemble[1:] == ensemble[1:] and len(set(frag.ensemble)) == 3
            assert await check_every_replica(bk, lid, 1199, set(live)) == 1200 * 3
            await bk.close()

        run(go())
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_the_auditor_killed_mid_scan_another_takes_over(own, tmp_path):
    """An auditor process is kill -9'd as soon as its scan published a
    task; a second candidate is elected once the first one's lease expires,
    scans again, and no task is lost: every ledger ends clean."""
    procs = own.start(4)

    async def make():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        ids = []
        for k in range(40):
            lh = await bk.create_ledger(3, 3, 2)
            await lh.add_entry(b"a%d" % k)
            await lh.close()
            ids.append((lh.ledger_id, lh.metadata.fragments[0].ensemble))
        await bk.close()
        return ids

    ledgers = run(make())
    victim = procs[0]
    named = [lid for lid, ens in ledgers if victim.bookie_id in ens]
    assert named
    a = subprocess.Popen(CLI + ["autorecovery", "run", "--no-worker", "--delay", "0.2",
                                "--etcd", own.endpoint, "--cluster", own.cluster],
                         stdout=subprocess.PIPE, stderr=open(tmp_path / "auditor.log", "w"), text=True)
    try:
        assert a.stdout.readline().strip() == "AUTORECOVERY_READY"

        async def go():
            bk = BookKeeperClient(own.endpoint, own.cluster)
            from stream.autorecovery.keys import AutorecoveryKeys
            keys = AutorecoveryKeys(bk.store, own.cluster)
            await until(lambda: _aw(keys.auditor() is not None), what="the first auditor elected")
            victim.kill()
            await until(lambda: _aw(list(keys.tasks())), timeout=60, what="the first task")
            a.send_signal(signal.SIGKILL)
            a.wait()
            published = len(list(keys.tasks()))
            async with autorecovery(own, delay=0.2, grace=0.2) as (auditor, ws, _k):
                await until(lambda: _aw(auditor.elected.is_set()), what="the second auditor elected")
                await until(lambda: _aw(auditor.core is not None and auditor.core.scanning is None
                                        and not auditor.core.to_scan), what="its scans done")

                async def clean():
                    return not list(keys.tasks()) and not await names_bookie(bk, victim.bookie_id)
                await until(clean, what="every ledger recovered after the failover")
            done = {o.ledger_id for o in ws[0].outcomes if o.replaced}
            assert done == set(named), (published, len(named))
            await bk.close()
        run(go())
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()


def test_recover_leaves_a_ledger_another_recovery_holds(own):
    """`recover` takes the workers' per-ledger lock first: a ledger another
    recovery (a worker, a Spark job, another `recover`) holds is left, and
    said so; once the lock is free, the same command replaces the bookie.
    Without the lock, two copies to one target could clear entries the
    first one's CAS had published."""
    from stream.autorecovery.service import RecoveryLocks

    procs = own.start(4)
    lid, _, victim = closed_ledger_first_bookie_killed(own, procs, [b"%d" % i for i in range(20)])
    bk = BookKeeperClient(own.endpoint, own.cluster)
    other = RecoveryLocks(bk, own.cluster, "another-recovery")
    try:
        assert other.take(lid) is None
        s = json.loads(cli(own, "recover", victim.bookie_id, "--format", "json").stdout)
        assert s["fragments_replaced"] == 0 and s["entries_copied"] == 0, s
        assert [(x["ledger_id"], x["step"]) for x in s["left"]] == [(lid, "wait")]
        assert other.holder in s["left"][0]["note"]
        assert victim.bookie_id in bk.ledgers.read(lid)[0].fragments[0].ensemble
    finally:
        other.release()
    s = json.loads(cli(own, "recover", victim.bookie_id, "--format", "json").stdout)
    assert s["fragments_replaced"] == 1 and s["left"] == [], s
    assert victim.bookie_id not in bk.ledgers.read(lid)[0].fragments[0].ensemble
    run(bk.close())


def test_recover_copies_at_the_rate_it_is_given(own):
    """`recover --rate-mb 2` copies 8 MiB in no less than the time the rate
    allows, less the pace's burst and one frame (worker_core.Pace): as fast
    as the bookies go, the same copy takes a fraction of a second."""
    procs = own.start(4)
    lid, _, victim = closed_ledger_first_bookie_killed(own, procs, [os.urandom(64 << 10)] * 128)
    s = json.loads(cli(own, "recover", victim.bookie_id, "--rate-mb", "2", "--format", "json").stdout)
    assert s["fragments_replaced"] == 1 and s["entries_copied"] == 128 and s["left"] == [], s
    assert s["bytes_copied"] > 8 << 20
    assert s["seconds"] >= (s["bytes_copied"] - (2 << 20)) / (2 << 20), s
    bk = BookKeeperClient(own.endpoint, own.cluster)
    assert run(check_every_replica(bk, lid, 127, {p.bookie_id for p in procs} - {victim.bookie_id})) == 128 * 3
    run(bk.close())


def test_a_rate_limit_below_zero_is_refused(own):
    for cmd in (["recover", "bookie-x"], ["decommission", "bookie-x"], ["autorecovery", "run"]):
        p = cli(own, *cmd, "--rate-mb", "-1", check=False)
        assert p.returncode == 2 and "--rate-mb" in p.stderr, (cmd, p.stderr)


def test_the_periodic_checks_options_are_refused_without_what_they_qualify(etcd_server, cluster):
    env = SimpleNamespace(endpoint=etcd_server.endpoint, cluster=cluster)
    p = cli(env, "autorecovery", "run", "--full-check", check=False)
    assert p.returncode == 2 and "give --check-interval too" in p.stderr, p.stderr
    p = cli(env, "autorecovery", "run", "--check-interval", "5", "--full-check-percentage", "50", check=False)
    assert p.returncode == 2 and "give --full-check too" in p.stderr, p.stderr
    p = cli(env, "autorecovery", "run", "--check-interval", "5", "--full-check", "--full-check-percentage", "101",
            check=False)
    assert p.returncode == 2 and "101" in p.stderr, p.stderr
