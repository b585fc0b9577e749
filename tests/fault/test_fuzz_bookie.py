"""Fuzzing every gRPC method of a real bookie process (hypothesis).

One bookie process serves the whole module.  Before the fuzzing it stores a
*baseline* ledger (BASE, term BASE_TERM, entries 0..BASE_COUNT-1 and an
explicit LAC); every request then drawn may target it only with stale terms
(or none), so it must come out byte for byte unchanged, which each test
checks at its end, and again after a kill -9 and restart of the bookie (the
journal of everything the fuzzing got accepted must replay).

Every request gets a typed answer: a status code of proto/bookie.proto in the
method's own response (BAD_REQUEST for malformed input, INVALID_TERM for a
stale term, TOO_LARGE, CHECKSUM_MISMATCH, ...), never a gRPC error; the only
gRPC error allowed is INVALID_ARGUMENT where there is no response to carry a
status (an Add stream whose message is not an AddFrame, an undecodable Info).
Frames are built with ``bookie.entry.encode`` (never hand-packed headers), so
they follow the record layout wherever it goes.

``FUZZ_EXAMPLES=N`` sets the examples per test (default 40; derandomized, so
CI runs the same ones every time); ``FUZZ_RANDOM=1`` draws new ones each run.
"""
from __future__ import annotations

import os
import socket
import struct

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bookie import entry as E
from bookie import wire
from bookie.core import MAX_TERM, Status
from bookstream.processes import BookieProcess
from bookstream_pb import bookie_pb2 as pb
from bookstream_pb import bookie_pb2_grpc as pb_grpc

BASE = 0x5EED_0000_0001
BASE_TERM = 1 << 40
BASE_COUNT = 20
MAX_ENTRY = 64 << 10          # the bookie's --max-entry-size here
U64 = (1 << 64) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1

FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "40")), deadline=None,
                derandomize=not os.environ.get("FUZZ_RANDOM"), database=None,
                suppress_health_check=list(HealthCheck))

pytestmark = pytest.mark.fault

SERVICE = pb.DESCRIPTOR.services_by_name["Bookie"]
STATUSES = set(pb.StatusCode.values())


class Target:
    """The bookie under fuzz, a blocking channel to it, and its baseline."""

    def __init__(self, data_dir):
        self.proc = BookieProcess(data_dir, extra_args=["--max-entry-size", str(MAX_ENTRY)]).start()
        self.connect()
        self.records = [E.encode(BASE, i, b"baseline-%d" % i * (i + 1), lac=i - 1, lafr=i - 1, term=BASE_TERM)
                        for i in range(BASE_COUNT)]
        assert self.add_frame(b"".join(self.records))[0].status == Status.OK
        last = BASE_COUNT - 1
        assert self.stub.WriteLac(pb.WriteLacRequest(ledger_id=BASE, lac=last, lafr=last, term=BASE_TERM)).status == 0
        self.lac = self.lac_state()
        assert (self.lac.lac, self.lac.last_entry, self.lac.term) == (last, last, BASE_TERM)

    def connect(self) -> None:
        self.channel = grpc.insecure_channel(self.proc.address)
        self.stub = pb_grpc.BookieStub(self.channel)
        self.add = self.channel.stream_stream("/bookstream.v1.Bookie/Add", request_serializer=None,
                                              response_deserializer=pb.AddAcks.FromString)

    def add_frame(self, entries: bytes, frame_id: int = 1) -> list[pb.AddAck]:
        msgs = list(self.add(iter([wire.encode_add_frame(frame_id, [entries])]), timeout=30))
        return [a for m in msgs for a in m.acks]

    def raw(self, method: str):
        m = SERVICE.methods_by_name[method]
        path = f"/{SERVICE.full_name}/{method}"
        if m.server_streaming:
            return self.channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        return self.channel.unary_unary(path, request_serializer=None, response_deserializer=None)

    def lac_state(self):
        return self.stub.ReadLac(pb.ReadLacRequest(ledger_id=BASE))

    def check_baseline(self) -> None:
        """The bookie is up and serves the baseline exactly as stored."""
        assert self.proc.alive(), self.proc.log_tail()
        got = list(self.stub.ReadRange(pb.ReadRangeRequest(ledger_id=BASE, first_entry=0, last_entry=BASE_COUNT - 1),
                                       timeout=30))
        assert [r.status for r in got if r.status] == [] and b"".join(r.entries for r in got) == b"".join(self.records)
        for i in (0, BASE_COUNT - 1):
            r = self.stub.ReadEntry(pb.ReadEntryRequest(ledger_id=BASE, entry_id=i))
            assert r.status == Status.OK and r.entry == self.records[i]
        now = self.lac_state()
        assert (now.status, now.lac, now.lafr, now.last_entry, now.term, now.fenced) == (
            self.lac.status, self.lac.lac, self.lac.lafr, self.lac.last_entry, self.lac.term, self.lac.fenced)
        assert self.stub.Info(pb.InfoRequest()).bookie_id == self.proc.bookie_id

    def restart(self) -> None:
        self.channel.close()
        self.proc.kill()
        self.proc.start()
        self.connect()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    t = Target(tmp_path_factory.mktemp("fuzz") / "bookie")
    yield t
    t.channel.close()
    t.proc.kill()


@pytest.fixture
def bookie(target):
    yield target
    target.check_baseline()


# -- strategies ------------------------------------------------------------------

EDGE_IDS = [0, 1, I64_MAX - 1, I64_MAX]
ledgers = st.one_of(st.just(BASE), st.sampled_from([0, 1, 1 << 63, U64]), st.integers(1 << 48, U64))
other_ledgers = ledgers.filter(lambda lid: lid != BASE)
entry_ids = st.one_of(st.integers(-2, BASE_COUNT + 2), st.sampled_from([-1, I64_MIN] + EDGE_IDS),
                      st.integers(I64_MIN, I64_MAX))
terms = st.one_of(st.sampled_from([0, 1, BASE_TERM - 1, BASE_TERM, BASE_TERM + 1, MAX_TERM, MAX_TERM + 1, U64]),
                  st.integers(0, U64))
stale_terms = st.one_of(st.just(0), st.integers(1, BASE_TERM - 1))
flag_words = st.one_of(st.sampled_from([0, pb.READ_FENCE, 2, 3, 1 << 31]), st.integers(0, (1 << 32) - 1))


@st.composite
def targeted(draw, fence_allowed: bool = True):
    """(ledger, term, flags): the baseline only with a stale term and no
    fence (requests that may legally change it are kept off it)."""
    lid = draw(ledgers)
    if lid == BASE:
        return lid, draw(stale_terms), draw(flag_words.filter(lambda f: not f & pb.READ_FENCE))
    return lid, draw(terms), draw(flag_words if fence_allowed else flag_words.map(lambda f: f & ~pb.READ_FENCE))


def term_verdict(lid: int, term: int) -> set[int]:
    """What the term rule allows for a term-carrying request."""
    if term > MAX_TERM:
        return {Status.BAD_REQUEST}
    if lid == BASE and 0 < term < BASE_TERM:
        return {Status.INVALID_TERM}
    return {Status.OK, Status.INVALID_TERM, Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY, Status.FENCED}


# -- unary methods -----------------------------------------------------------------

@FUZZ
@given(req=targeted(), eid=entry_ids)
def test_read_entry(bookie, req, eid):
    lid, term, flags = req
    r = bookie.stub.ReadEntry(pb.ReadEntryRequest(ledger_id=lid, entry_id=eid, term=term, flags=flags))
    if eid < 0 or flags & ~pb.READ_FENCE:
        assert r.status == Status.BAD_REQUEST
    elif term or flags:
        assert r.status in term_verdict(lid, term), r
    if r.status == Status.OK:
        assert E.decode(r.entry).entry_id == eid
        if lid == BASE:
            assert r.entry == bookie.records[eid]
    elif lid == BASE and not term and 0 <= eid < BASE_COUNT and not flags:
        pytest.fail(f"baseline entry {eid}: {r}")


@FUZZ
@given(req=targeted(), first=entry_ids, last=entry_ids, sparse=st.booleans(),
       frame=st.one_of(st.sampled_from([0, 1, 53, 200]), st.integers(0, (1 << 32) - 1)))
def test_read_range(bookie, req, first, last, sparse, frame):
    lid, term, flags = req
    rs = list(bookie.stub.ReadRange(pb.ReadRangeRequest(ledger_id=lid, first_entry=first, last_entry=last,
                                                        term=term, flags=flags, sparse=sparse,
                                                        max_frame_bytes=frame), timeout=30))
    assert rs and all(r.status in STATUSES for r in rs)
    if first < 0 or last < first or flags & ~pb.READ_FENCE:
        assert [r.status for r in rs] == [Status.BAD_REQUEST]
        return
    if term or flags:
        assert rs[0].status in term_verdict(lid, term) | {Status.OK}, rs[0]
    got = E.decode_all(b"".join(r.entries for r in rs))
    ids = [e.entry_id for e in got]
    assert ids == sorted(set(ids)) and all(first <= i <= last for i in ids)
    if not sparse:
        assert ids == list(range(first, first + len(ids)))
    if lid == BASE and rs[0].status != Status.INVALID_TERM:
        want = [i for i in range(max(first, 0), min(last, BASE_COUNT - 1) + 1)]
        assert ids == want
        assert b"".join(r.entries for r in rs) == b"".join(bookie.records[i] for i in want)


@FUZZ
@given(req=targeted())
def test_read_lac(bookie, req):
    lid, term, flags = req
    r = bookie.stub.ReadLac(pb.ReadLacRequest(ledger_id=lid, term=term, flags=flags))
    if flags & ~pb.READ_FENCE:
        assert r.status == Status.BAD_REQUEST
    elif term or flags:
        assert r.status in term_verdict(lid, term), r
    else:
        assert r.status in (Status.OK, Status.NO_SUCH_LEDGER)
    if lid == BASE and r.status == Status.OK:
        assert (r.lac, r.last_entry) == (bookie.lac.lac, bookie.lac.last_entry)


@FUZZ
@given(lid=ledgers, prev=entry_ids, timeout_ms=st.integers(0, 30))
def test_long_poll_lac(bookie, lid, prev, timeout_ms):
    r = bookie.stub.LongPollLac(pb.LongPollLacRequest(ledger_id=lid, previous_lac=prev, timeout_ms=timeout_ms),
                                timeout=30)
    assert r.status in (Status.OK, Status.NO_SUCH_LEDGER)
    if lid == BASE:
        assert r.lac == bookie.lac.lac


@FUZZ
@given(req=targeted(fence_allowed=False), lac=entry_ids, lafr=entry_ids)
def test_write_lac(bookie, req, lac, lafr):
    lid, term, _ = req
    r = bookie.stub.WriteLac(pb.WriteLacRequest(ledger_id=lid, lac=lac, lafr=lafr, term=term))
    if lac < -1 or lafr < -1 or lafr > lac or term > MAX_TERM:
        assert r.status == Status.BAD_REQUEST, r
    elif lid == BASE:
        assert r.status == Status.INVALID_TERM, r
    else:
        assert r.status in (Status.OK, Status.NO_SUCH_LEDGER, Status.INVALID_TERM, Status.FENCED), r


@FUZZ
@given(req=targeted(fence_allowed=False), first=entry_ids)
def test_prepare(bookie, req, first):
    lid, term, _ = req
    r = bookie.stub.Prepare(pb.PrepareRequest(ledger_id=lid, first_entry=first, term=term))
    if first < 0 or term > MAX_TERM:
        assert r.status == Status.BAD_REQUEST, r
    else:
        assert r.status in term_verdict(lid, term), r


@FUZZ
@given(lid=other_ledgers, has_range=st.booleans(), first=entry_ids, last=entry_ids)
def test_delete(bookie, lid, has_range, first, last):
    r = bookie.stub.Delete(pb.DeleteRequest(ledger_id=lid, has_range=has_range, first_entry=first, last_entry=last))
    if has_range and (first < 0 or last < first):
        assert r.status == Status.BAD_REQUEST
    else:
        assert r.status in (Status.OK, Status.NO_SUCH_LEDGER)


UNARY = [m.name for m in SERVICE.methods if not m.client_streaming]


@FUZZ
@given(method=st.sampled_from(UNARY), data=st.one_of(
    st.binary(max_size=64), st.sampled_from([b"\xff", b"\x08", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
                                             b"\x12\x05ab", b"\x0a\x80\x80\x80\x80\x10"])))
def test_undecodable_requests(bookie, method, data):
    """Bytes protobuf cannot parse get BAD_REQUEST in the method's response
    (INVALID_ARGUMENT for Info, whose response has no status); bytes it can
    parse are an ordinary request (kept off the baseline)."""
    m = SERVICE.methods_by_name[method]
    req_cls, resp_cls = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
    try:
        req = req_cls.FromString(data)
    except DecodeError:
        req = None
    if req is not None:
        lid = getattr(req, "ledger_id", None)
        assume(lid != BASE and method not in ("LongPollLac",))
    try:
        out = bookie.raw(method)(data, timeout=30)
        out = list(out) if m.server_streaming else [out]
    except grpc.RpcError as e:
        assert req is None and method == "Info" and e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        return
    resps = [resp_cls.FromString(b) for b in out]
    if req is None:
        assert [r.status for r in resps] == [Status.BAD_REQUEST], resps
    else:
        assert all(getattr(r, "status", 0) in STATUSES for r in resps)


# -- the read port (bookie/read_port.py) -------------------------------------------------

PORT_LENGTH = struct.Struct("<I")


def read_port_exchange(address: str, payload: bytes) -> list[pb.ReadRangeResponse] | None:
    """Sends ``payload`` to the read port and reads one answer (frames up to
    the one that ends it, proto/bookie.proto via bookie/read_port.py), then
    closes; None if the bookie closed the connection without an answer."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(payload)
        f = s.makefile("rb")
        out = []
        while True:
            try:
                head = f.read(4)
            except ConnectionResetError:   # (closed with bytes unread: a reset, not an end)
                head = b""
            if not head:
                return None if not out else pytest.fail(f"connection closed mid-answer after {out}")
            n, = PORT_LENGTH.unpack(head)
            body = f.read(n)
            assert len(body) == n
            r = pb.ReadRangeResponse.FromString(body)
            out.append(r)
            if r.status != Status.OK or r.through >= last_of(payload):
                return out


def last_of(payload: bytes) -> int:
    try:
        return pb.ReadRangeRequest.FromString(payload[4:]).last_entry
    except DecodeError:
        return I64_MAX


@st.composite
def stripes(draw):
    """(stripe, residues): none, a valid filter, or anything."""
    kind = draw(st.sampled_from(["none", "valid", "valid", "any"]))
    if kind == "none":
        return 0, 0
    if kind == "valid":
        stripe = draw(st.integers(1, 64))
        return stripe, draw(st.integers(1, (1 << stripe) - 1))
    return draw(st.integers(0, 70)), draw(st.integers(0, U64))


@FUZZ
@given(req=targeted(), first=entry_ids, last=entry_ids, sparse=st.booleans(), verifies=st.booleans(),
       frame=st.one_of(st.sampled_from([0, 1, 53, 200]), st.integers(0, (1 << 32) - 1)),
       filt=stripes(), plain=st.booleans(), near=st.booleans())
def test_read_port_reads(bookie, req, first, last, sparse, verifies, frame, filt, plain, near):
    """Any ReadRangeRequest on the read port: a plain one (sparse, verified
    by the reader, no term, no flags) gets ReadRange's frames byte for byte;
    any other one BAD_REQUEST, alone.  (Half the draws are plain, half of
    those of the baseline's ids.)"""
    lid, term, flags = req
    stripe, residues = filt
    if plain:
        sparse, verifies, term, flags = True, True, 0, 0
        if near:
            lid, first, last = BASE, min(abs(first), BASE_COUNT + 2), min(abs(first), BASE_COUNT + 2) + abs(last) % 30
    request = pb.ReadRangeRequest(ledger_id=lid, first_entry=first, last_entry=last, term=term, flags=flags,
                                  sparse=sparse, reader_verifies=verifies, max_frame_bytes=frame,
                                  stripe=stripe, residues=residues)
    body = request.SerializeToString()
    got = read_port_exchange(bookie.proc.read_address, PORT_LENGTH.pack(len(body)) + body)
    assert got and all(r.status in STATUSES for r in got)
    plain = sparse and verifies and not term and not flags
    over_grpc = list(bookie.stub.ReadRange(request, timeout=30))
    if not plain or over_grpc[0].status == Status.BAD_REQUEST:
        assert [r.status for r in got] == [Status.BAD_REQUEST], got
        return
    assert got == over_grpc


@FUZZ
@given(data=st.one_of(st.binary(max_size=80), st.sampled_from([b"\x12\xff\xff\xff\xff\x0f", b"\x0b", b"\x08"])),
       declared=st.one_of(st.none(), st.integers(0, (1 << 32) - 1)))
def test_read_port_junk(bookie, data, declared):
    """Bytes that are no ReadRangeRequest get one BAD_REQUEST frame (or, if
    they parse, an answer); a length over the bound closes the connection
    unanswered; a length longer than what follows waits (the test closes)."""
    n = len(data) if declared is None else declared
    payload = PORT_LENGTH.pack(n) + data
    if n > len(data):
        if n > 64 << 10:
            assert read_port_exchange(bookie.proc.read_address, payload) is None
        return
    try:
        req = pb.ReadRangeRequest.FromString(data)
    except DecodeError:
        req = None
    got = read_port_exchange(bookie.proc.read_address, payload)
    assert got and all(r.status in STATUSES for r in got)
    if req is None:
        assert [r.status for r in got] == [Status.BAD_REQUEST]


# -- the add stream -------------------------------------------------------------------

DEFECTS = ["none", "none", "none", "crc", "truncated", "too_large", "lac_ahead", "lafr_ahead", "lac_below_-1",
           "top_term", "stale_term"]


@st.composite
def records(draw):
    """(record bytes, defect, ledger, term) built with entry.encode."""
    defect = draw(st.sampled_from(DEFECTS))
    lid = BASE if defect == "stale_term" else draw(other_ledgers)
    eid = draw(st.one_of(st.integers(0, 50), st.sampled_from(EDGE_IDS)))
    recovery = draw(st.booleans())
    noop = draw(st.sampled_from([0, E.FLAG_NOOP, E.FLAG_NOOP | E.FLAG_TRUNCATE]))
    size = MAX_ENTRY + draw(st.integers(1, 1000)) if defect == "too_large" else draw(st.integers(0, 300))
    payload = draw(st.binary(min_size=size, max_size=size)) if size <= 300 else b"z" * size
    term = {"top_term": draw(st.sampled_from([MAX_TERM + 1, U64])),
            "stale_term": draw(st.integers(1, BASE_TERM - 1))}.get(defect, draw(st.integers(0, MAX_TERM)))
    lac = lafr = min(eid - 1, draw(st.integers(-1, 60)))
    if defect == "lac_ahead":
        lac = eid + draw(st.sampled_from([0, 1, 10 ** 9]))
        if recovery:
            defect = "none"  # a recovery add carries the frozen LAC, which may be ahead (rule 7)
        lac = min(lac, I64_MAX)
    if defect == "lafr_ahead":
        lac = lafr = min(eid + draw(st.sampled_from([0, 1, 10 ** 9])), I64_MAX)
    if defect == "lac_below_-1":
        lac = draw(st.sampled_from([-2, I64_MIN]))
    rec = E.encode(lid, eid, payload, lac=lac, lafr=lafr, term=term, data_flags=noop,
                   req_flags=E.REQ_RECOVERY if recovery else 0)
    if defect == "crc":
        if payload:
            rec = rec[:-1] + bytes([rec[-1] ^ 0x40])  # a payload byte changed: no longer its CRC
        else:
            defect = "truncated"
    if defect == "truncated":
        rec = rec[:draw(st.integers(1, len(rec) - 1))] if len(rec) > 1 else rec
    return rec, defect, lid, term


SCAN_STATUS = {"crc": Status.CHECKSUM_MISMATCH, "truncated": Status.BAD_REQUEST, "too_large": Status.TOO_LARGE,
               "lac_below_-1": Status.BAD_REQUEST}
POSITION_DEFECTS = {"lac_ahead", "lafr_ahead"}


@FUZZ
@given(recs=st.lists(records(), min_size=1, max_size=4))
def test_add_frames(bookie, recs):
    """A frame's ack: the first record that does not scan sets the frame's
    status and nothing is stored; a LAC/LAFR ahead of its entry refuses the
    frame; otherwise each record gets its own verdict (a term above MAX_TERM:
    BAD_REQUEST, a stale one on the baseline: INVALID_TERM)."""
    # a truncated record can only be the frame's last: what follows would be read as part of it
    cut = next((i for i, r in enumerate(recs) if r[1] == "truncated"), None)
    if cut is not None:
        recs = recs[:cut + 1]
    acks = bookie.add_frame(b"".join(r[0] for r in recs))
    assert len(acks) == 1
    ack = acks[0]
    scan = [SCAN_STATUS[d] for _, d, _, _ in recs if d in SCAN_STATUS]
    if scan:
        assert (ack.status, list(ack.errors)) == (scan[0], []), ack
        return
    if any(d in POSITION_DEFECTS for _, d, _, _ in recs):
        assert (ack.status, list(ack.errors)) == (Status.BAD_REQUEST, []), ack
        return
    errors = {e.index: e.status for e in ack.errors}
    assert ack.status == (min(errors.items())[1] if errors else Status.OK)
    for i, (rec, defect, lid, term) in enumerate(recs):
        if defect == "top_term":
            assert errors.get(i) == Status.BAD_REQUEST, ack
        elif defect == "stale_term":
            assert errors.get(i) == Status.INVALID_TERM, ack
        else:
            assert errors.get(i) in (None, Status.INVALID_TERM, Status.FENCED), ack
    if len(recs) == 1 and not errors:  # what was acknowledged is served as sent
        h = E.parse_header(recs[0][0])
        r = bookie.stub.ReadEntry(pb.ReadEntryRequest(ledger_id=h.ledger_id, entry_id=h.entry_id))
        assert r.status == Status.OK and r.entry == recs[0][0]


@FUZZ
@given(data=st.one_of(st.binary(max_size=80), st.sampled_from([b"\x12\xff\xff\xff\xff\x0f", b"\x0b", b"\x08"])))
def test_junk_add_messages(bookie, data):
    """Bytes that are not an AddFrame end the stream with INVALID_ARGUMENT;
    an AddFrame of junk records gets an ack with BAD_REQUEST (or another
    scan status) and changes nothing."""
    try:
        wire.decode_add_frame(data)
        is_frame = True
    except wire.MalformedFrame:
        is_frame = False
    try:
        msgs = list(bookie.add(iter([data]), timeout=30))
    except grpc.RpcError as e:
        assert not is_frame and e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        return
    assert is_frame
    acks = [a for m in msgs for a in m.acks]
    assert len(acks) == 1 and acks[0].status in STATUSES


def test_survives_kill_and_restart(target):
    """Everything the fuzzing got accepted replays after kill -9; the
    baseline is still served unchanged."""
    target.check_baseline()
    target.restart()
    target.check_baseline()


# -- the three found by hand (issue 12), as plain regression tests ------------------------

def test_an_add_claiming_a_lac_ahead_of_its_entry_is_refused(bookie):
    """Before: accepted, and the bookie's LAC stayed at 10^9 for good."""
    lid = 0x5EED_0000_0002
    for lac, lafr in ((10 ** 9, -1), (0, -1), (-1, 0), (-1, 10 ** 9)):
        ack, = bookie.add_frame(E.encode(lid, 0, b"x", lac=lac, lafr=lafr, term=1))
        assert (ack.status, list(ack.errors)) == (Status.BAD_REQUEST, []), ack
    assert bookie.stub.ReadLac(pb.ReadLacRequest(ledger_id=lid)).status == Status.NO_SUCH_LEDGER
    # a run whose later records confirm the earlier ones is fine (an ensemble change resends such runs)
    ack, = bookie.add_frame(b"".join(E.encode(lid, i, b"x", lac=i - 1, lafr=max(i - 2, -1), term=1) for i in range(3)))
    assert ack.status == Status.OK
    # a recovery add carries the LAC frozen when recovery began, which may be above it (rule 7)
    ack, = bookie.add_frame(E.encode(lid, 3, b"x", lac=7, lafr=2, term=2, req_flags=E.REQ_RECOVERY))
    assert ack.status == Status.OK
    r = bookie.stub.ReadLac(pb.ReadLacRequest(ledger_id=lid))
    assert (r.lac, r.lafr, r.last_entry) == (7, 2, 3)


def test_an_undecodable_request_gets_bad_request(bookie):
    """Before: gRPC's UNKNOWN status and a traceback in the bookie's log."""
    for method in UNARY:
        resp_cls = getattr(pb, SERVICE.methods_by_name[method].output_type.name)
        call = bookie.raw(method)
        if method == "Info":
            with pytest.raises(grpc.RpcError) as e:
                call(b"\xff\xff", timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            continue
        out = call(b"\xff\xff", timeout=10)
        out = list(out) if SERVICE.methods_by_name[method].server_streaming else [out]
        assert [resp_cls.FromString(b).status for b in out] == [Status.BAD_REQUEST], method
    assert "Traceback" not in bookie.proc.log_tail(200)


def test_terms_at_the_top_of_their_range_are_refused(bookie):
    """A term with no successor would leave a ledger that can never be taken
    over again; every term-carrying request refuses it and changes nothing."""
    lid = 0x5EED_0000_0003
    for term in (MAX_TERM + 1, U64):
        ack, = bookie.add_frame(E.encode(lid, 0, b"x", term=term))
        assert [e.status for e in ack.errors] == [Status.BAD_REQUEST]
        assert bookie.stub.ReadLac(pb.ReadLacRequest(ledger_id=lid, term=term)).status == Status.BAD_REQUEST
        assert bookie.stub.ReadEntry(pb.ReadEntryRequest(ledger_id=lid, entry_id=0, term=term)).status == Status.BAD_REQUEST
        assert bookie.stub.Prepare(pb.PrepareRequest(ledger_id=lid, first_entry=0, term=term)).status == Status.BAD_REQUEST
        rs = list(bookie.stub.ReadRange(pb.ReadRangeRequest(ledger_id=lid, first_entry=0, last_entry=5, term=term)))
        assert [r.status for r in rs] == [Status.BAD_REQUEST]
    assert bookie.stub.ReadLac(pb.ReadLacRequest(ledger_id=lid)).status == Status.NO_SUCH_LEDGER
    # MAX_TERM itself, and the top entry id, are fine
    ack, = bookie.add_frame(E.encode(lid, E.MAX_ENTRY_ID, b"top", lac=0, lafr=0, term=MAX_TERM))
    assert ack.status == Status.OK
    r = bookie.stub.ReadEntry(pb.ReadEntryRequest(ledger_id=lid, entry_id=E.MAX_ENTRY_ID))
    assert r.status == Status.OK and E.decode(r.entry).payload == b"top" and r.term == MAX_TERM
