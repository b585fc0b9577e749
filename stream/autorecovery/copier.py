"""The copy of one sealed fragment's entries to a target bookie (an adapter:
what to copy is :class:`autorecovery.worker_core.FragmentJob`).

Batched: sparse range reads from a surviving replica (every record's CRC
checked as it arrives: a bad record is never forwarded, it is read from
another replica; an id is taken only from a bookie of its write set, never
from a leftover record elsewhere: ``FragmentJob.replica_of``), framed adds
of up to ``FRAME_BYTES`` to the target with a few frames in flight.  Ids a replica does not hold are asked of the next
one; ids no surviving replica holds are counted as ``absent`` (the worker
then reports the fragment, never replaces it).

What each record *is* (the bytes the checksum covers: ids, LAC, LAFR, data
flags, payload) is copied byte for byte; the request fields (outside the
checksum) are set as a re-sender sends them: the recovery-add flag (a
fenced classic ledger or a read-only target still takes it) and the
ledger's term.  One exception: a truncate no-op is re-signed as a plain
no-op.  Applied on the target, the truncate flag would delete every higher
entry of the ledger there, including entries of later fragments the target
legitimately holds; its purpose (dropping an older term's leftovers above
it) is served instead by deleting the fragment's range on the target
before the copy.

The clearing is the one step that destroys, so it is fenced: it carries the
fencing token of the ledger's etcd lock the copy runs under (the lock key's
create revision), and a target that has seen a higher one for the ledger
refuses it (bookie/core.py ``admit_clear``).  A worker paused past its lock
cannot clear what a later holder's copy published there.

A ledger with a password: the target checks the master key of the
clearing and of every frame (bookie/core.py).  The copier does not know the
password; it sends the key the ledger's metadata holds
(``FragmentJob.master_key``, stream/password.py ``master_key``): the
metadata in etcd is the copy credential, as BookKeeper's autorecovery uses
the password its metadata keeps.  A target that learned another key
refuses the copy (UNAUTHORIZED_ACCESS): CopyFailed.  Reads from the
sources are normal reads, which bookies do not check.

Term-based ledgers: a bookie joining a *sealed* fragment is not sent the
bookie's Prepare, which deletes every entry from the fragment's first
entry on (later fragments' included); the range delete plus copies carrying
the ledger's term do the same for the fragment alone (the target's term is
raised by the first copy).  An open fragment is never copied here: the
take-over's recovery seals it first, preparing its replacements.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Callable

from bookie import entry as entry_codec
from bookie.core import Status
from stream.bookie_client import BookieUnavailable, status_of

from stream.autorecovery.worker_core import FragmentJob, Pace

FRAME_BYTES = 1 << 20
READ_FRAME_BYTES = 1 << 20
MAX_INFLIGHT = 4


class CopyFailed(Exception):
    """The copy could not complete (target refused or unreachable, a source
    failing); nothing was published.  Retriable: the task is retried."""

    retriable = True


@dataclasses.dataclass
class CopyStats:
    entries: int = 0
    bytes: int = 0
    absent: int = 0          # ids of the lost position no surviving replica holds
    bad_records: int = 0     # records failing their checksum on a source (read elsewhere)
    source_errors: int = 0
    paced_seconds: float = 0.0   # time some frame waited for its turn under the rate limit (Pace.held)


async def copy_fragment(client, job: FragmentJob, target: str, *, timeout: float = 30.0,
                        progress: Callable[[int, int], None] | None = None,
                        pace: Pace | None = None, keep_going: Callable[[], bool] | None = None,
                        copy_token: int = 0, clear: bool = True) -> CopyStats:
    """Copies the entries the lost position of ``job`` held onto ``target``
    and waits until the target acknowledged them (durable: the bookie acks
    after fdatasync).  ``progress(entries, bytes)`` after each acked frame.
    ``pace``: the rate limit each frame is sent under (None: as fast as the
    bookies go).  ``keep_going()`` is asked once more just before the
    target's range is cleared, the one step that destroys: a worker paused
    past its lock's lease (another worker may have copied to the same
    target and published it meanwhile) must find out there, by a read of
    its lock in etcd, not after.  ``copy_token``: the fencing token of the
    ledger's lock held (``AutorecoveryKeys.try_lock``), carried by the
    clearing: the target refuses it (FENCED) below a token it has seen, so
    a worker paused between that read and the clearing still cannot clear
    what a later holder published there (0: no fence).  ``clear=False``:
    a damaged bookie filled in place (``target`` is the position's own
    bookie, which the fragment names and which holds its other entries): no
    clearing; every entry of the position is added again (the same bytes: a
    missing one comes back, a bad record is replaced).  Raises
    :class:`CopyFailed`."""
    stats = CopyStats()
    if job.last_entry < job.first_entry:
        return stats
    tc = await client.bookie(target)
    if tc is None:
        raise CopyFailed(f"target {target} is not registered")
    if clear:
        await _clear(tc, job, target, timeout, keep_going, copy_token)

    sender = _Sender(tc, target, timeout, stats, progress, job.master_key, pace)
    # (lo, hi) ranges still to read; a run of ids the current source lacked
    todo: list[tuple[int, int]] = [(job.first_entry, job.last_entry)]
    for src in job.sources:
        if not todo:
            break
        sc = await client.bookie(src)
        if sc is None:
            stats.source_errors += 1
            continue
        missing: list[tuple[int, int]] = []
        for lo, hi in todo:
            missing += await _read_range(sc, src, job, lo, hi, sender, stats)
            sender.check()
        todo = missing
    await sender.drain()
    left = sum(1 for lo, hi in todo for e in range(lo, hi + 1) if job.holds(e))
    if left and stats.source_errors:
        # a replica that failed to answer may hold them: unknown is not absent
        raise CopyFailed(f"{left} entries not read: {stats.source_errors} source error(s)")
    stats.absent = left  # every surviving replica answered, and none holds them
    return stats


async def _clear(tc, job: FragmentJob, target: str, timeout: float, keep_going, copy_token: int) -> None:
    if keep_going is not None and not keep_going():
        raise CopyFailed(f"the ledger's lock was lost before clearing {target}")
    try:
        r = await tc.delete(job.ledger_id, (job.first_entry, job.last_entry), timeout=timeout,
                            master_key=job.master_key, copy_token=copy_token)
    except BookieUnavailable as e:
        raise CopyFailed(f"target {target}: {e}") from e
    if r.status == Status.FENCED:
        raise CopyFailed(f"target {target} has seen a later copy of ledger {job.ledger_id} than this one's "
                         f"(token {copy_token}): the ledger's lock was lost")
    if r.status not in (Status.OK, Status.NO_SUCH_LEDGER):
        st = status_of(r.status)
        raise CopyFailed(f"target {target}: clearing the fragment's range: {st.name if st else r.status}")


async def _read_range(sc, src: str, job: FragmentJob, lo: int, hi: int, sender: "_Sender",
                      stats: CopyStats) -> list[tuple[int, int]]:
    """Reads [lo, hi] (sparse) from one source ``src``, forwarding what the
    lost position held and ``src`` holds as a replica
    (``FragmentJob.replica_of``); returns the sub-ranges it did not deliver.
    A record rotted on ``src`` (CHECKSUM_MISMATCH, the frame before it
    vouching up to the id before it) leaves that one id to another replica,
    and the read goes on here after it."""
    missing: list[tuple[int, int]] = []
    want = lo  # every id below ``want`` is settled (forwarded, or noted missing)

    def gap(upto: int) -> None:
        nonlocal want
        if upto >= want:
            missing.append((want, upto))
        want = max(want, upto + 1)

    def take(resp) -> None:
        """A frame's records: those the lost position held, forwarded."""
        nonlocal want
        buf = resp.entries
        batch: list[bytes] = []
        for eid, start, end in entry_codec.record_spans(buf):
            if eid < want or eid > hi:
                continue
            rec = memoryview(buf)[start:end]
            try:
                h = entry_codec.scan(rec)[0]
            except (entry_codec.ChecksumMismatch, entry_codec.MalformedEntry):
                stats.bad_records += 1
                gap(eid)        # this id from another replica
                continue
            held = job.holds(eid)
            if held and not job.replica_of(src, eid):
                gap(eid)        # no replica's record: this id from a replica
                continue
            gap(eid - 1)
            want = eid + 1
            if held:
                batch.append(_resend(rec, h, job.term))
        sender.send(batch)
        gap(min(resp.through, hi))  # vouched absent here: ask the next replica

    async def read_on() -> bool:
        """One sparse range read from ``want``: True if it ended at a record rotted on ``src``."""
        async with contextlib.aclosing(sc.read_range(job.ledger_id, want, hi, max_frame_bytes=READ_FRAME_BYTES,
                                                     sparse=True, frame_timeout=sender.timeout)) as frames:
            async for resp in frames:
                if resp.status == Status.NO_SUCH_LEDGER:
                    return False
                if resp.status == Status.CHECKSUM_MISMATCH:
                    return True
                if resp.status != Status.OK:
                    stats.source_errors += 1
                    return False
                take(resp)
                await sender.room()
        return False

    try:
        while want <= hi and await read_on():
            stats.bad_records += 1
            gap(want)   # the rotted one (the bookie reports it to autorecovery itself)
    except (BookieUnavailable, asyncio.TimeoutError):
        stats.source_errors += 1
    gap(hi)
    return missing


def _resend(rec: memoryview, h: entry_codec.EntryHeader, term: int) -> bytes:
    if h.is_truncate:  # see the module docstring
        return entry_codec.encode(h.ledger_id, h.entry_id, bytes(rec[entry_codec.HEADER_SIZE:]), lac=h.lac,
                                  lafr=h.lafr, data_flags=entry_codec.FLAG_NOOP,
                                  req_flags=entry_codec.REQ_RECOVERY, term=term, origin=h.origin)
    return entry_codec.resend_as(rec, req_flags=entry_codec.REQ_RECOVERY, term=term)


class _Sender:
    """Frames of up to FRAME_BYTES to the target, MAX_INFLIGHT in flight
    (counting those waiting for their turn under the pace)."""

    def __init__(self, tc, target: str, timeout: float, stats: CopyStats, progress, master_key: bytes = b"",
                 pace: Pace | None = None) -> None:
        self.tc, self.target, self.timeout, self.stats, self.progress = tc, target, timeout, stats, progress
        self.master_key, self.pace = master_key, pace
        self.buf: list[bytes] = []
        self.size = 0
        self.inflight: list[asyncio.Task] = []
        self.error: BaseException | None = None

    def send(self, records: list[bytes]) -> None:
        for r in records:
            if self.size and self.size + len(r) > FRAME_BYTES:
                self._flush()
            self.buf.append(r)
            self.size += len(r)

    def _flush(self) -> None:
        if not self.buf:
            return
        wait = 0.0
        if self.pace is not None:
            held = self.pace.held
            wait = self.pace.take(asyncio.get_running_loop().time(), self.size)
            self.stats.paced_seconds += self.pace.held - held
        recs, self.buf, self.size = self.buf, [], 0
        self.inflight.append(asyncio.ensure_future(self._one(recs, wait)))

    async def _one(self, recs: list[bytes], wait: float = 0.0) -> None:
        if wait > 0:
            await asyncio.sleep(wait)  # the rate limit's turn (not a synchronisation)
        try:
            ack = await asyncio.wait_for(self.tc.add_records(recs, self.master_key), self.timeout)
        except (BookieUnavailable, asyncio.TimeoutError) as e:
            raise CopyFailed(f"target {self.target}: {e!r}") from e
        if ack.status != Status.OK or ack.errors:
            raise CopyFailed(f"target {self.target} refused the copy: status {ack.status} "
                             f"{[(e.index, e.status) for e in ack.errors][:3]} {ack.message}")
        self.stats.entries += len(recs)
        self.stats.bytes += sum(map(len, recs))
        if self.progress is not None:
            self.progress(len(recs), sum(map(len, recs)))

    def check(self) -> None:
        for t in self.inflight:
            if t.done() and t.exception() is not None:
                raise t.exception()

    async def room(self) -> None:
        while len(self.inflight) >= MAX_INFLIGHT:
            done, _ = await asyncio.wait(self.inflight, return_when=asyncio.FIRST_COMPLETED)
            self.inflight = [t for t in self.inflight if t not in done]
            for t in done:
                if t.exception() is not None:
                    self._cancel()
                    raise t.exception()

    async def drain(self) -> None:
        self._flush()
        try:
            for t in self.inflight:
                await t
        finally:
            self._cancel()

    def _cancel(self) -> None:
        for t in self.inflight:
            t.cancel()


__all__ = ["copy_fragment", "CopyStats", "CopyFailed", "FRAME_BYTES"]
