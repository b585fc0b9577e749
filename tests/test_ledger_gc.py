"""The bookie's collection of ledgers deleted from the metadata
(bookie/ledger_gc.py): the rule on its own, then real etcd and real bookie
processes, one of them down while a ledger is deleted."""
from __future__ import annotations

import asyncio
import itertools
import time

from bookie.core import Status
from bookie.ledger_gc import deleted
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
            lh = await bk.create_ledger(3, 3, 2)
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
