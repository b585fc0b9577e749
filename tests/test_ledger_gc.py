"""The bookie's collection of ledgers deleted from the metadata
(bookie/ledger_gc.py): the rule on its own, then real etcd and real bookie
processes, one of them down while a ledger is deleted."""
from __future__ import annotations

import asyncio
import itertools
import time

from bookie.core import Status
from bookie.ledger_gc import MAX_ENTRY, deleted, reaches_open_end, unnamed_ranges
from stream.client import BookKeeperClient
from tests.conftest import run


def test_deleted_is_the_local_ids_absent_from_the_listing():
    assert deleted([], [1, 2]) == []
    assert deleted([1, 2, 3], []) == [1, 2, 3]
    assert deleted([2, 5, 9], [1, 2, 3, 9, 12]) == [5]
    assert deleted([1, 2, 3], [1, 2, 3]) == []
    assert deleted([4, 7], [7]) == [4]
    # merged, never collected: an endless listing is read only as far as the local ids go
    assert deleted([3, 6, 7, 10], itertools.count(0, 2)) == [3, 7]


def test_a_bookie_down_while_its_ledger_was_deleted_deletes_it_when_back(own):
    """A ledger deleted while one of its bookies was down: the client's
    deletion never reached that bookie.  Back, the bookie's ledger GC finds
    the ledger gone from the metadata and deletes it; a ledger the metadata
    still has stays, readable."""
    procs = own.start(3, extra_args=["--ledger-gc-interval", "1"])
    down = procs[0]

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        lids = []
        for k in range(2):
            lh = await bk.create_ledger(3, 3, 3)   # (Qa = Qw: closed, every bookie holds every entry)
            for i in range(10):
                await lh.add_entry(b"gc-%d-%d" % (k, i))
            await lh.close()
            lids.append(lh.ledger_id)
        gone, kept = lids
        down.kill()
        await bk.delete_ledger(gone)
        down.restart()
        await bk.close()
        bk = BookKeeperClient(own.endpoint, own.cluster)  # (its connection to the bookie restarted)
        bc = await bk.bookie(down.bookie_id)
        deadline = time.monotonic() + 30
        while (await bc.read_entry(gone, 0)).status != Status.NO_SUCH_LEDGER:
            assert time.monotonic() < deadline, "the deleted ledger is still on the bookie"
            await asyncio.sleep(0.2)
        assert [(await bc.read_entry(kept, e)).status for e in range(10)] == [Status.OK] * 10
        await bk.close()
        # its own collection did it (the client's deletion never reached it)
        assert f"ledger gc: deleted ledgers [{gone}]" in down.log_path.read_text()

    run(go())


def test_unnamed_ranges_are_the_spans_of_the_fragments_not_naming_the_bookie():
    from metadata.ledgers import Fragment, LedgerMetadata, LedgerState

    def meta(state, *ensembles):
        frags = tuple(Fragment(first, tuple(e)) for first, e in ensembles)
        return LedgerMetadata(3, 3, 2, ledger_id=7, state=state, fragments=frags, fragment_count=len(frags))

    END = MAX_ENTRY
    closed, open_ = LedgerState.CLOSED, LedgerState.OPEN
    assert unnamed_ranges(meta(closed, (0, "bcd"), (10, "cde")), "a") == [(0, END)]
    assert unnamed_ranges(meta(closed, (0, "abc"), (10, "bcd")), "a") == [(10, END)]
    assert unnamed_ranges(meta(open_, (0, "bcd"), (10, "abc"), (20, "bcd"), (30, "cde"), (40, "acd")), "a") == \
        [(0, 9), (20, 39)]                                   # adjacent spans merged
    assert unnamed_ranges(meta(open_, (5, "abc")), "a") == [(0, 4)]          # trimmed below its first fragment
    assert unnamed_ranges(meta(open_, (5, "abc")), "b") == [(0, 4)]
    assert unnamed_ranges(meta(closed), "a") == [(0, END)]   # every fragment trimmed away
    assert unnamed_ranges(meta(open_, (0, "abc"), (10, "bca")), "a") == []
    # a recovery writes its fragment's bookies before publishing it
    assert unnamed_ranges(meta(LedgerState.IN_RECOVERY, (0, "bcd")), "a") == []
    # the open end of an OPEN ledger: asked whether the bookie was written since the read
    m = meta(open_, (0, "abc"), (10, "bcd"))
    assert reaches_open_end(m, unnamed_ranges(m, "a"))
    m = meta(open_, (0, "bcd"), (10, "abc"))
    assert not reaches_open_end(m, unnamed_ranges(m, "a"))  # sealed below its open fragment
    m = meta(closed, (0, "abc"), (10, "bcd"))
    assert not reaches_open_end(m, unnamed_ranges(m, "a"))  # closed: no fragment comes


def test_a_bookie_back_after_its_replacement_clears_the_entries_no_fragment_names(own):
    """A closed ledger's bookie is killed and manual recovery replaces it.
    Back, it holds entries no fragment names: its over-replicated GC clears
    them, but not while the ledger's recovery lock is held elsewhere (a copy
    onto it may be under way), and not a ledger that still names it.  The
    ledger's state stays on it; the ledger reads back whole."""
    from stream.autorecovery.keys import AutorecoveryKeys
    from stream.autorecovery.service import recover_ledger_fragments
    from stream.autorecovery.worker_core import Step
    from tests.test_autorecovery import until
    from tests.test_recovery_cli import closed_ledger

    procs = own.start(4, extra_args=["--over-replicated-gc-interval", "1"])
    by_id = {p.bookie_id: p for p in procs}
    payloads = [b"over-%d" % i for i in range(20)]
    lid, ens = closed_ledger(own, payloads, ack_quorum=3)   # (every bookie holds every entry)
    lost = by_id[ens[0]]

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        kept = await bk.create_ledger(4, 4, 4)          # names every bookie (and each holds every entry)
        await kept.add_entries(payloads)
        await kept.close()
        lost.kill()
        out = await recover_ledger_fragments(bk, lid, {lost.bookie_id})
        assert out.step is Step.DONE and len(out.replaced) == 1
        keys = AutorecoveryKeys(bk.store, own.cluster)
        lease = bk.store.lease(30)
        try:
            assert keys.try_lock(lid, "a copy", lease.id)
            lost.restart()
            await until(lambda: asyncio.sleep(0, "under a recovery's lock" in lost.log_path.read_text()),
                        what="a pass that found the lock held")
            bk2 = BookKeeperClient(own.endpoint, own.cluster)   # (its connection to the bookie restarted)
            bc = await bk2.bookie(lost.bookie_id)
            assert [(await bc.read_entry(lid, e)).status for e in range(20)] == [Status.OK] * 20
            keys.unlock(lid, "a copy")

            async def cleared():
                return (await bc.read_entry(lid, 0)).status == Status.NO_SUCH_ENTRY
            await until(cleared, what="the replaced bookie's entries cleared")
            assert [(await bc.read_entry(lid, e)).status for e in range(20)] == [Status.NO_SUCH_ENTRY] * 20
            assert (await bc.read_lac(lid)).status == Status.OK            # its state stays
            assert [(await bc.read_entry(kept.ledger_id, e)).status for e in range(20)] == [Status.OK] * 20
            lh = await bk2.open_ledger(lid)
            assert [e.payload for e in await lh.read_entries(0, 19)] == payloads
            await bk2.close()
        finally:
            lease.revoke()
            await bk.close()
        assert f"over-replicated gc: cleared ledgers [{lid}]" in lost.log_path.read_text()

    run(go())


def test_a_stream_bookie_clears_the_fragments_it_was_replaced_in_while_its_writer_appends(own):
    """A stream's bookie named in its first and its open fragment is killed;
    recovery replaces it in the sealed fragments only.  Back, it holds
    entries in ranges no fragment names it for, and its over-replicated GC
    clears them, per range, while a new writer appends: the bookie keeps
    every entry of the fragments that name it, and the stream reads back
    whole."""
    from stream.autorecovery.service import recover_ledger_fragments
    from stream.stream import AsyncStreamClient, StreamConfig
    from tests.test_recovery_cli import written_stream

    procs = own.start(4, extra_args=["--over-replicated-gc-interval", "1"])
    by_id = {p.bookie_id: p for p in procs}
    name, config = "gc-stream", StreamConfig(3, 3, 2, fragment_size_entries=10)
    payloads = [b"s%d" % i for i in range(30)]
    lid = written_stream(own, name, config, payloads)

    async def go():
        bk = BookKeeperClient(own.endpoint, own.cluster)
        meta, _ = bk.ledgers.read(lid)
        both = [b for b in meta.fragments[0].ensemble if b in meta.last_fragment.ensemble]
        back = by_id[both[0]]          # (3 of 4 bookies in each: at least 2 in both)
        back.kill()
        await recover_ledger_fragments(bk, lid, {back.bookie_id}, seal=False)
        meta, _ = bk.ledgers.read(lid)
        assert back.bookie_id not in meta.fragments[0].ensemble
        assert back.bookie_id in meta.last_fragment.ensemble          # the open one: its writer's
        await bk.close()
        back.restart()
        async with AsyncStreamClient(own.endpoint, own.cluster) as sc:
            w = await sc.open_writer(name, config)
            k = 0
            deadline = time.monotonic() + 60
            while f"over-replicated gc: cleared ledgers [{lid}]" not in back.log_path.read_text() or k < 20:
                assert time.monotonic() < deadline, "the replaced bookie's GC cleared nothing"
                payloads.append(b"more%d" % k)
                await w.append(payloads[-1])
                k += 1
            await w.close()
            r = await sc.open_reader(name)
            got = []
            while len(got) < len(payloads):
                got += [rec.payload for rec in await r.read(1000, timeout=5.0)]
            assert got == payloads
            await r.close()
        bk = BookKeeperClient(own.endpoint, own.cluster)
        meta, _ = bk.ledgers.read(lid)
        bc = await bk.bookie(back.bookie_id)
        held = {e for e in range(meta.fragments[-1].first_entry)
                if (await bc.read_entry(lid, e)).status == Status.OK}
        named = {e for k2, f in enumerate(meta.fragments) if back.bookie_id in f.ensemble
                 for e in range(f.first_entry, meta.fragments[k2 + 1].first_entry if k2 + 1 < len(meta.fragments)
                                else meta.fragments[-1].first_entry)}
        assert held == named, (sorted(held), sorted(named), meta.fragments)
        await bk.close()

    run(go())
