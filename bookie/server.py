"""The bookie's gRPC server (grpc.aio): a thin adapter around Storage.

Every handler turns a request into calls on the storage (never on its protocol
core directly: every verdict, NO_SUCH_LEDGER included, is the core's), and every
outcome into a typed status code.  No input reaches an unhandled
exception: a malformed request gets BAD_REQUEST and changes nothing, an I/O
failure gets INTERNAL_ERROR (never NO_SUCH_ENTRY).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bookie import entry as E
from bookie import wire
from bookie.core import Status
from bookie.data_dir import DamagedDataDir, set_aside, set_aside_bytes
from bookie.grpc_methods import register
from bookie.journal import JournalWriteError
from bookie.metrics import BookieMetrics, observed
from bookie.range_read import good_prefix
from bookie.storage import Storage, StorageConfig
from bookstream_pb import bookie_pb2 as pb
from bookstream_pb import bookie_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20
# The shortest interval between a client's keepalive pings the bookie
# accepts, with or without calls in flight.  Clients ping every 10 s, idle
# too (stream/bookie_client.py CHANNEL_OPTIONS).  gRPC servers allow one
# ping per 5 minutes by default, without calls none, and answer the third
# early one with GOAWAY too_many_pings: an idle client's keepalive was
# refused (its connection dropped, or the GOAWAY logged when it closed).
MIN_CLIENT_PING_INTERVAL_MS = 5_000
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
]
MAX_LONG_POLL_S = 120.0


@dataclass
class BookieConfig:
    data_dir: str
    host: str = "127.0.0.1"
    port: int = 0
    bookie_id: str = ""
    # The address registered for clients, when they reach the bookie through
    # something in front of it (the fault suite's proxies); default host:port.
    advertise_address: str = ""
    # The read port (bookie/read_port.py): 0 any free port, None none (and
    # none with TLS).  Registered as host:port, or as advertise_read_address;
    # with advertise_address set and no advertise_read_address, not opened
    # (clients reach the bookie through something in front of it, which
    # does not say where they would reach this port: none left open unnamed).
    read_port: int | None = 0
    advertise_read_address: str = ""
    storage: StorageConfig = field(default_factory=StorageConfig)
    # Unacknowledged bytes one add stream may have in flight before the
    # bookie stops reading it (back-pressure).
    stream_inflight_bytes: int = 64 << 20
    read_frame_bytes: int = 4 << 20
    disk_check_interval_s: float = 1.0
    gc_interval_s: float = 30.0
    # Every this long, the ledgers deleted from the metadata are deleted here
    # too (bookie/ledger_gc.py; with a registration only).  0: never.
    ledger_gc_interval_s: float = 600.0
    # Every this long, the entries of ledgers whose metadata no longer names
    # this bookie are cleared (bookie/ledger_gc.py; a metadata read per
    # ledger held; with a registration only).  0: never.
    over_replicated_gc_interval_s: float = 86400.0
    # Every this long, etcd's revision is read against the highest this
    # bookie read before, and its cookie against the data dir's
    # (bookie/cookie.py ``CookieGuard``; with a cookie only): a bookie whose
    # etcd went back in time, lost its mark or is no longer its own halts
    # (``bookie.cookie.halt``: read-only for good, recorded).  0: never
    # while it runs (its start still refuses such an etcd, and a GC pass
    # finding it halts the bookie likewise).
    etcd_check_interval_s: float = 30.0
    # Every this long, every entry held is read back and checked; a rotted
    # one is reported to autorecovery (bookie/scrub.py).  0: never.  At most
    # scrub_rate bytes/s (0: no limit).
    scrub_interval_s: float = 7 * 86400.0
    scrub_rate: float = 32e6
    # A damaged data dir (bookie.data_dir.DamagedDataDir) set aside and the
    # start gone on empty, its cookie then finding the data lost (the
    # bookie's --on-lost-disk rejoin); False: refused.
    set_aside_damaged: bool = False
    tls: object = None  # metadata.tls.TlsFiles: the server's cert and key; with a ca, mutual TLS
    trace: str = ""     # a file for the protocol trace (bookie/tracelog.py; tla/README.md): tests only


def range_request_problem(request) -> str:
    """What makes a ReadRangeRequest one no bookie serves ("" if nothing)."""
    first, last, stripe, residues = request.first_entry, request.last_entry, request.stripe, request.residues
    if first < 0 or last < first or request.flags & ~pb.READ_FENCE or (stripe or residues) and not (
            request.sparse and 0 < stripe <= 64 and 0 < residues < 1 << stripe):
        return "bad range, flags or stripe"
    return ""


class BookieService(pb_grpc.BookieServicer):
    def __init__(self, storage: Storage, config: BookieConfig, metrics: BookieMetrics | None = None):
        self.storage = storage
        self.config = config
        self.read_entry_requests = 0
        self.read_range_requests = 0
        self.read_range_entries = 0
        self.registration_status = lambda: None  # set by BookieServer: the etcd registration's status()
        self.metrics = metrics or BookieMetrics()  # bookie/metrics.py; served by bookstream/admin_http.py
        storage.journal.on_commit = self.metrics.commit
        self.scrubber = None   # bookie/scrub.py: told of the rotted records reads meet

    def _rotted(self, e: E.ChecksumMismatch) -> None:
        log.error("stored entry failed its checksum: %s", e)
        if self.scrubber is not None:
            self.scrubber.found(e.ledger_id, e.entry_id, "a read")   # (which checkpoints past it too)
        else:
            self.storage.checkpoint_past(e.ledger_id, e.entry_id)

    # -- adds ----------------------------------------------------------------

    async def Add(self, request_iterator, context):
        acks: asyncio.Queue = asyncio.Queue()
        budget = Budget(self.config.stream_inflight_bytes)
        storage = self.storage
        state = {"inflight": 0, "reading": True}

        def finish_if_done():
            if not state["reading"] and state["inflight"] == 0:
                acks.put_nowait(None)

        async def read_frames():
            try:
                async for message in request_iterator:
                    # raw bytes (see register): the entries are a view into them
                    try:
                        frame_id, entries, master_key = wire.decode_add_frame(message)
                    except wire.MalformedFrame as e:
                        state["malformed"] = f"not an AddFrame: {e}"
                        break  # the stream ends with INVALID_ARGUMENT once its acks are out
                    size = len(entries)
                    status, msg, runs = storage.validate_frame(entries)
                    if status is not Status.OK:
                        acks.put_nowait(pb.AddAck(frame_id=frame_id, status=status, message=msg))
                        continue
                    try:
                        refused, durable = storage.admit_frame(entries, runs, master_key)
                    except Exception as e:  # never let a frame kill the stream
                        log.exception("add frame failed")
                        acks.put_nowait(pb.AddAck(frame_id=frame_id, status=Status.INTERNAL_ERROR, message=str(e)))
                        continue
                    errors = [pb.EntryError(index=i, status=v.status, term=v.term) for i, v in refused]
                    count = E.count_entries(runs)
                    if durable is None:
                        acks.put_nowait(_ack(frame_id, errors, count))
                        continue
                    await budget.acquire(size)
                    state["inflight"] += 1
                    durable.add_done_callback(_on_durable(frame_id, errors, count, size))
            except asyncio.CancelledError:
                raise
            except Exception:  # the client went away mid-stream
                log.debug("add stream ended", exc_info=True)
            finally:
                state["reading"] = False
                finish_if_done()

        def _on_durable(frame_id, errors, count, size):
            t0 = time.perf_counter()

            def cb(f: asyncio.Future):
                budget.release(size)
                state["inflight"] -= 1
                if f.cancelled():
                    pass
                elif f.exception() is not None:
                    exc = f.exception()
                    refused_idx = {e.index for e in errors}
                    errors.extend(
                        pb.EntryError(index=i, status=Status.INTERNAL_ERROR)
                        for i in range(count) if i not in refused_idx
                    )
                    errors.sort(key=lambda e: e.index)
                    ack = _ack(frame_id, errors, count, str(exc))
                    acks.put_nowait(ack)
                    if isinstance(exc, JournalWriteError):
                        storage.update_read_only()
                else:
                    self.metrics.added(count - len(errors), size, time.perf_counter() - t0)
                    acks.put_nowait(_ack(frame_id, errors, count))
                finish_if_done()
            return cb

        reader = asyncio.create_task(read_frames())
        try:
            while True:
                ack = await acks.get()
                if ack is None:
                    break
                batch = [ack]
                done = False
                while not acks.empty():
                    nxt = acks.get_nowait()
                    if nxt is None:
                        done = True
                        break
                    batch.append(nxt)
                self.metrics.acked(batch)
                yield pb.AddAcks(acks=batch)
                if done:
                    break
        finally:
            reader.cancel()
        if "malformed" in state:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, state["malformed"])

    # -- reads ---------------------------------------------------------------

    async def _fence_if_asked(self, request, entry: int | None = None) -> tuple[Status, int]:
        """A read carrying a term or READ_FENCE: the core's fence rules, its
        master key checked (a normal read is neither)."""
        term, flags = request.term, request.flags
        if term == 0 and not flags & pb.READ_FENCE:
            return Status.OK, 0
        v = await self.storage.fence(request.ledger_id, term, bool(flags & pb.READ_FENCE), request.master_key)
        if self.storage.tracer is not None:  # the read's step, once its barrier let it answer
            self.storage.tracer.read(request.ledger_id, term, bool(flags & pb.READ_FENCE), v.status, entry)
        return v.status, v.term

    @observed
    async def ReadEntry(self, request, context):
        self.read_entry_requests += 1
        try:
            if request.entry_id < 0 or request.flags & ~pb.READ_FENCE:
                return pb.ReadEntryResponse(status=Status.BAD_REQUEST, message="bad entry id or flags")
            status, term = await self._fence_if_asked(request, request.entry_id)
            if status is not Status.OK:
                return pb.ReadEntryResponse(status=status, term=term)
            status, rec = self.storage.read_record(request.ledger_id, request.entry_id)
            if status is Status.OK and E.rotted(rec, request.ledger_id, ((request.entry_id, 0, len(rec)),)):
                raise E.ChecksumMismatch(request.ledger_id, request.entry_id)   # (its header too may have rotted)
            return pb.ReadEntryResponse(status=status, entry=rec, term=self.storage.term_of(request.ledger_id))
        except E.ChecksumMismatch as e:
            self._rotted(e)
            return pb.ReadEntryResponse(status=Status.CHECKSUM_MISMATCH, message=str(e))
        except Exception as e:
            log.exception("read failed")
            return pb.ReadEntryResponse(status=Status.INTERNAL_ERROR, message=str(e))

    @observed
    async def ReadRange(self, request, context):
        self.read_range_requests += 1
        first, last = request.first_entry, request.last_entry
        stripe, residues = request.stripe, request.residues
        problem = range_request_problem(request)
        if problem:
            yield pb.ReadRangeResponse(status=Status.BAD_REQUEST, message=problem)
            return
        try:  # a recovery read: term and fence admitted as for ReadEntry, before anything is read
            status, term = await self._fence_if_asked(request, first)
        except Exception as e:
            log.exception("range read failed")
            yield pb.ReadRangeResponse(status=Status.INTERNAL_ERROR, message=str(e))
            return
        if status is not Status.OK:
            yield pb.ReadRangeResponse(status=status, term=term)
            return
        frame_bytes = self.frame_bytes(request)
        if request.sparse:
            for out in self.sparse_frames(request.ledger_id, first, last, frame_bytes, stripe, residues,
                                          request.reader_verifies):
                # (the frame built here, one copy of the records: serialize_range_response passes it on)
                yield wire.encode_range_frame(*out) if type(out) is tuple else out
            return
        nxt = first
        while nxt <= last:
            try:
                status, recs, after = self.storage.read_range(request.ledger_id, nxt, last, frame_bytes)
                data = b"".join(recs)
                if not request.reader_verifies:
                    E.verify_all(data)  # never serve a record that rotted on disk (unless the reader checks)
            except E.ChecksumMismatch as e:
                self._rotted(e)
                yield pb.ReadRangeResponse(status=Status.CHECKSUM_MISMATCH, message=str(e))
                return
            except Exception as e:
                log.exception("range read failed")
                yield pb.ReadRangeResponse(status=Status.INTERNAL_ERROR, message=str(e))
                return
            self.read_range_entries += after - nxt
            self.metrics.range_frame(after - nxt, len(data))
            yield wire.encode_range_frame(status, (data,), after - nxt)
            if status is not Status.OK:
                return
            nxt = after

    def frame_bytes(self, request) -> int:
        """A range read's frame size: as asked, else the bookie's default."""
        return min(request.max_frame_bytes or self.config.read_frame_bytes, MAX_MESSAGE_BYTES // 2)

    def sparse_frames(self, ledger_id: int, first: int, last: int, frame_bytes: int,
                      stripe: int = 0, residues: int = 0, reader_verifies: bool = False, read_at=None):
        """A sparse range read's frames (proto/bookie.proto ReadRangeResponse),
        for ReadRange and the read port (bookie/read_port.py): each a tuple
        (status, records, count, through, term), ``wire.encode_range_frame``'s
        arguments, or a ``ReadRangeResponse`` that ends the read.  Each
        vouches for the absence of the ids up to its `through` that it and
        the earlier frames did not return (with a stripe filter: of the ids
        it selects).  An entry failing its checksum ends the stream with
        CHECKSUM_MISMATCH after the good entries below it, unless the reader
        checks them itself (``reader_verifies``: served as stored, a quarter
        of a 1 KiB range read's CPU saved; ``read_at``, with it only: what
        stands for a span of records, ``Storage.read_sparse``).  Before it,
        always a frame of the good records (none, maybe) whose ``through`` is
        the id before the bad one's, named by the index: a reader asks
        another replica for that one id and reads on here after it.  Each
        frame is read from storage when the one before it has been taken."""
        nxt = first
        while True:
            try:
                status, recs, through, count = self.storage.read_sparse(ledger_id, nxt, last, frame_bytes,
                                                                        stripe, residues,
                                                                        read_at if reader_verifies else None)
                if reader_verifies:  # the count from the index walk: the records served as stored
                    bad, size = None, sum(map(len, recs))
                else:
                    recs, n = (b"".join(recs),), count
                    count, good_end, bad = good_prefix(recs[0], n, ledger_id, lambda: self.storage.held_records(
                        ledger_id, nxt, last, n, stripe, residues))
                    size = len(recs[0])
            except Exception as e:
                log.exception("range read failed")
                yield pb.ReadRangeResponse(status=Status.INTERNAL_ERROR, message=str(e))
                return
            term = self.storage.term_of(ledger_id)
            if bad is not None:
                self._rotted(bad)
                if count:
                    self.read_range_entries += count
                    self.metrics.range_frame(count, good_end)
                yield Status.OK, (recs[0][:good_end],), count, bad.entry_id - 1, term
                yield pb.ReadRangeResponse(status=Status.CHECKSUM_MISMATCH, message=str(bad), term=term)
                return
            self.read_range_entries += count
            self.metrics.range_frame(count, size)
            yield status, recs, count, through, term
            if wire.ends_sparse_read(status, through, last):
                return
            nxt = through + 1

    def _lac_response(self, ledger_id: int, status: Status = Status.OK, term: int = 0) -> pb.ReadLacResponse:
        info = self.storage.lac_info(ledger_id)
        if status is not Status.OK:
            return pb.ReadLacResponse(status=status, term=term, lac=-1, lafr=-1, last_entry=-1)
        if info is None:
            return pb.ReadLacResponse(status=Status.NO_SUCH_LEDGER, lac=-1, lafr=-1, last_entry=-1)
        return pb.ReadLacResponse(
            status=Status.OK, lac=info.lac, lafr=info.lafr, last_entry=info.last_entry, term=info.term, fenced=info.fenced
        )

    @observed
    async def ReadLac(self, request, context):
        try:
            if request.flags & ~pb.READ_FENCE:
                return pb.ReadLacResponse(status=Status.BAD_REQUEST, message="unknown flags")
            status, term = await self._fence_if_asked(request)
            return self._lac_response(request.ledger_id, status, term)
        except Exception as e:
            log.exception("LAC read failed")
            return pb.ReadLacResponse(status=Status.INTERNAL_ERROR, message=str(e))

    async def LongPollLac(self, request, context):
        timeout = min(request.timeout_ms / 1000.0, MAX_LONG_POLL_S)
        await self.storage.wait_lac(request.ledger_id, request.previous_lac, timeout)
        return self._lac_response(request.ledger_id)

    @observed
    async def WriteLac(self, request, context):
        if request.lac < -1 or request.lafr < -1 or request.lafr > request.lac:
            return pb.WriteLacResponse(status=Status.BAD_REQUEST, message="need -1 <= LAFR <= LAC")
        try:
            v = await self.storage.write_lac(request.ledger_id, request.lac, request.lafr, request.term,
                                             request.master_key)
        except Exception as e:
            log.exception("LAC write failed")
            return pb.WriteLacResponse(status=Status.INTERNAL_ERROR, message=str(e))
        return pb.WriteLacResponse(status=v.status, term=v.term)

    @observed
    async def Prepare(self, request, context):
        if request.first_entry < 0:
            return pb.PrepareResponse(status=Status.BAD_REQUEST, message="bad first entry")
        try:
            v, n = await self.storage.prepare(request.ledger_id, request.first_entry, request.term,
                                              request.master_key)
        except Exception as e:
            log.exception("prepare failed")
            return pb.PrepareResponse(status=Status.INTERNAL_ERROR, message=str(e))
        if self.storage.tracer is not None:  # the prepare's step, once durable (or refused)
            self.storage.tracer.prepare(request.ledger_id, request.first_entry, request.term, v.status is Status.OK)
        return pb.PrepareResponse(status=v.status, term=v.term, entries_deleted=n)

    # -- deletion and info -----------------------------------------------------

    @observed
    async def Delete(self, request, context):
        if request.has_range and (request.first_entry < 0 or request.last_entry < request.first_entry):
            return pb.DeleteResponse(status=Status.BAD_REQUEST, message="bad range")
        if request.copy_token and not request.has_range:
            return pb.DeleteResponse(status=Status.BAD_REQUEST, message="a copy token clears a range only")
        rng = (request.first_entry, request.last_entry) if request.has_range else None
        try:
            if request.copy_token:  # a copy's clearing of its target (bookie/core.py admit_clear)
                status, n = await self.storage.clear(request.ledger_id, *rng, request.copy_token, request.master_key)
            else:
                status, n = await self.storage.delete(request.ledger_id, rng, request.master_key)
        except Exception as e:
            log.exception("delete failed")
            return pb.DeleteResponse(status=Status.INTERNAL_ERROR, message=str(e))
        return pb.DeleteResponse(status=status, entries_deleted=n)

    async def Info(self, request, context):
        used, free, total = self.storage.disk_usage()
        storage = self.storage
        return pb.InfoResponse(
            bookie_id=self.config.bookie_id,
            state=pb.READ_ONLY_STATE if storage.read_only else pb.WRITABLE,
            halted=storage.core.halted or "",
            free_bytes=free,
            total_bytes=total,
            used_bytes=used,
            ledgers=storage.ledger_count,
            entries=storage.entry_count,
            segments=len(self.storage.journal.segments()),
            replayed_records=self.storage.replayed_records,
            replayed_bytes=self.storage.replayed_bytes,
            journal_fsyncs=self.storage.journal.fsyncs,
            journal_bytes=self.storage.journal.bytes_appended,
            replay_seconds=self.storage.replay_seconds,
            read_entry_requests=self.read_entry_requests,
            read_range_requests=self.read_range_requests,
            read_range_entries=self.read_range_entries,
            journal_sync_histogram=self.storage.journal.sync_histogram,
            journal_sync_max_seconds=self.storage.journal.sync_max_seconds,
            **_registration_fields(self.registration_status()),
            **_scrub_fields(self.scrubber),
            scrub_interval=self.config.scrub_interval_s,
            set_aside_bytes=set_aside_bytes(storage.dir),
        )


def _scrub_fields(sc) -> dict:
    if sc is None:
        return {}
    return {"scrub_last_end": sc.last_end or 0.0, "scrub_next_due": sc.next_due or 0.0,
            "scrub_rotted_entries": sc.rotted_found, "scrub_pass_checked": sc.pass_checked,
            "scrub_pass_entries": sc.pass_entries, "scrub_requested": sc.requested or 0}


def _registration_fields(status: dict | None) -> dict:
    if not status:
        return {}
    return {"registration_state": status["state"], "unregistered_seconds": status["unregistered_seconds"]}


def _ack(frame_id: int, errors: list, count: int, message: str = "") -> pb.AddAck:
    status = errors[0].status if errors else Status.OK
    return pb.AddAck(frame_id=frame_id, status=status, errors=errors, message=message)


class Budget:
    """Bytes in flight on one stream; acquire waits while over the limit
    (one frame is always let through, however large)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Event()

    async def acquire(self, n: int) -> None:
        while self.used and self.used + n > self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.used += n

    def release(self, n: int) -> None:
        self.used -= n
        self._freed.set()


class BookieServer:
    """A running bookie: storage, gRPC server, background upkeep, and an
    optional registration hook (set_read_only / close) for etcd."""

    def __init__(self, config: BookieConfig, registration_factory=None, cookie_check=None):
        self.config = config
        self.storage = Storage(config.data_dir, config.storage)
        self._registration_factory = registration_factory
        self._cookie_check = cookie_check  # (server) -> Cookie, before any port serves (bookie/cookie.py)
        self.cookie = None
        self.registration = None
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.read_port = None   # bookie/read_port.py ReadPort, once started
        self._tasks: list[asyncio.Task] = []
        self._stop_scrub_watch = None   # the scrub-request watch's cancel
        self.service: BookieService | None = None   # once its storage is open and its cookie judged
        self.metrics = BookieMetrics()   # (before start: the admin port serves while it starts)
        # What start() is doing, None once it serves: the admin port's /ready
        # and /info say it (a long journal replay, a lost disk waiting to rejoin).
        self.starting: str | None = "not started"

    @property
    def address(self) -> str:
        return self.config.advertise_address or f"{self.config.host}:{self.port}"

    @property
    def read_address(self) -> str:
        """Where clients reach the read port ("" when there is none to reach)."""
        if self.read_port is None:
            return ""
        return self.config.advertise_read_address or f"{self.config.host}:{self.read_port.port}"

    async def _judge_cookie(self) -> None:
        """The cookie check (raises InvalidCookie: nothing served)."""
        if self._cookie_check is not None:
            try:
                self.cookie = await asyncio.get_running_loop().run_in_executor(None, self._cookie_check, self)
            except BaseException:
                self.storage.close()
                raise
            self.storage.core.rejoined_at = self.cookie.rejoined_at   # (bookie/core.py: a lost disk's rejoin)

    async def _open_storage(self) -> None:
        """Opens the storage; a damaged data dir is refused, or set aside
        (``set_aside_damaged``) and an empty one opened in its place."""
        run = asyncio.get_running_loop().run_in_executor
        try:
            await run(None, self.storage.open)
        except DamagedDataDir as e:
            if not self.config.set_aside_damaged:
                raise
            self.starting = "setting its damaged data aside"
            try:
                to = await run(None, set_aside, Path(self.config.data_dir), str(e))
            except OSError as why:   # (a disk that takes no rename, no new directory: refused as it is)
                raise DamagedDataDir(f"{e}; and setting its data aside failed: {why}") from None
            log.error("the data dir is damaged (%s): its data set aside in %s (kept for a look, never read again: "
                      "remove it once done); starting as a lost disk, to rejoin under its id once nothing names "
                      "it", e, to)
            self.storage = Storage(self.config.data_dir, self.config.storage)
            await run(None, self.storage.open)

    async def start(self) -> None:
        t0 = time.monotonic()
        restarted = self.config.trace and self.storage.has_history()  # (tests only: the trace's restart)
        self.starting = "opening its storage (replaying the journal)"
        await self._open_storage()
        log.info("storage opened in %.2fs", time.monotonic() - t0)
        if self.config.trace:  # (after the replay: a restart's replay is one step, with what it replayed)
            from bookie.tracelog import BookieTracer
            self.storage.tracer = BookieTracer(self.config.trace, self.config.bookie_id, self.storage)
            if restarted:
                self.storage.tracer.restart()
        self.storage.update_read_only()
        self.starting = "checking its cookie"
        if self.config.bookie_id:   # (known: judged before any port is bound, so a refused or waiting bookie
            await self._judge_cookie()   # refuses connections rather than leave them unanswered)
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        service = BookieService(self.storage, self.config, self.metrics)
        service.registration_status = lambda: self.registration.status() if self.registration else None
        self.service = service  # the admin HTTP port reads its Info (bookstream/admin_http.py)
        register(service, self.server)
        bind, tls = f"{self.config.host}:{self.config.port}", self.config.tls
        self.port = self.server.add_secure_port(bind, tls.server_credentials()) if tls else \
            self.server.add_insecure_port(bind)
        if not self.port:
            raise OSError(f"cannot bind {self.config.host}:{self.config.port}")
        if not self.config.bookie_id:   # (its address is its id: judged once bound, before it serves)
            self.config.bookie_id = self.address
            await self._judge_cookie()
        await self.server.start()
        cfg = self.config
        if cfg.read_port is not None and not tls and (cfg.advertise_read_address or not cfg.advertise_address):
            from bookie.read_port import ReadPort
            self.read_port = ReadPort(service, cfg.host, cfg.read_port)
            await self.read_port.start()
        if self._registration_factory is not None:
            self.starting = "registering in etcd"
            self.registration = await asyncio.get_running_loop().run_in_executor(
                None, self._registration_factory, self
            )
        self._tasks = [
            asyncio.create_task(self._disk_loop(), name="disk-check"),
            asyncio.create_task(self._upkeep_loop(), name="upkeep"),
        ]
        if self.registration is not None:  # the ledger GCs (bookie/ledger_gc.py), each a loop of its own
            from bookie.ledger_gc import deleted_ledgers_loop, over_replicated_loop
            cfg, args = self.config, (self.storage, self.registration, self.service.metrics)
            if cfg.ledger_gc_interval_s > 0:
                self._tasks.append(asyncio.create_task(
                    deleted_ledgers_loop(*args, cfg.ledger_gc_interval_s, self.cookie), name="ledger-gc"))
            if cfg.over_replicated_gc_interval_s > 0:
                self._tasks.append(asyncio.create_task(
                    over_replicated_loop(*args, cfg.over_replicated_gc_interval_s, cfg.bookie_id, self.cookie),
                    name="over-replicated-gc"))
        if cfg.scrub_interval_s > 0:
            from bookie.scrub import Scrubber, damaged_publisher, scrub_loop, watch_requests
            publish = damaged_publisher(self.registration, cfg.bookie_id) if self.registration else None
            service.scrubber = Scrubber(self.storage, cfg.scrub_rate, publish=publish, metrics=service.metrics)
            served = None
            if self.registration is not None:   # (a pass asked for: `bookstream bookies scrub`)
                loop = asyncio.get_running_loop()
                try:
                    served, self._stop_scrub_watch = await loop.run_in_executor(
                        None, watch_requests, self.registration, cfg.bookie_id, service.scrubber, loop)
                except Exception as e:   # (MetadataError: etcd away; the passes go on at their interval)
                    log.warning("scrub: not watching for asked passes (until the next start): %s", e)
            self._tasks.append(asyncio.create_task(scrub_loop(service.scrubber, cfg.scrub_interval_s, served=served),
                                                   name="scrub"))
        if self.registration is not None and self.cookie is not None and cfg.etcd_check_interval_s > 0:
            from bookie.cookie import etcd_check_loop
            self._tasks.append(asyncio.create_task(
                etcd_check_loop(self.storage, self.registration, self.cookie, cfg.etcd_check_interval_s),
                name="etcd-check"))
        self.starting = None

    async def _disk_loop(self) -> None:
        """Re-checks disk usage, and keeps the etcd registration in step with
        the mode (which the add path may also have changed)."""
        while True:
            await asyncio.sleep(self.config.disk_check_interval_s)
            try:
                self.storage.update_read_only()
                ro, reg = self.storage.read_only, self.registration
                if reg is not None and reg.read_only != ro:
                    await asyncio.get_running_loop().run_in_executor(None, reg.set_read_only, ro)
                    log.info("registration moved to %s", "read-only" if ro else "writable")
                halted = self.storage.core.halted or ""
                if reg is not None and reg.halted != halted:   # (why, for `bookies list`)
                    await asyncio.get_running_loop().run_in_executor(None, lambda: reg.update(halted=halted))
            except Exception:
                log.exception("disk check failed")

    async def _upkeep_loop(self) -> None:
        last_gc = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, self.config.gc_interval_s))
            try:
                if self.storage.checkpoint_due:
                    await self.storage.checkpoint()
                if time.monotonic() - last_gc >= self.config.gc_interval_s:
                    last_gc = time.monotonic()
                    done = await self.storage.collect_garbage()
                    self.service.metrics.gc(done)
                    if done["removed_segments"] or done["compacted_segments"]:
                        log.info("gc: %s", done)
            except Exception:
                log.exception("upkeep failed")

    async def stop(self, grace: float = 2.0) -> None:
        for t in self._tasks:
            t.cancel()
        if self._stop_scrub_watch is not None:
            self._stop_scrub_watch()
        if self.read_port is not None:
            await self.read_port.stop()
        if self.server is not None:
            await self.server.stop(grace)
        try:
            await self.storage.journal.sync()
            await self.storage.checkpoint()
        except Exception:
            log.exception("final checkpoint failed")
        if self.registration is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.registration.close)
            except Exception:
                log.exception("deregistration failed")
        self.storage.close()
