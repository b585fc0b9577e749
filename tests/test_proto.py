"""The generated protobuf code is checked in and must match proto/."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from bookie.core import Status
from bookstream_pb import bookie_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def _load_genproto():
    spec = importlib.util.spec_from_file_location("genproto", ROOT / "scripts" / "genproto.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_code_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools")
    gen = _load_genproto()
    out = tmp_path / "bookstream_pb"
    gen.generate(out)
    checked_in = ROOT / "bookstream_pb"
    fresh = sorted(p.name for p in out.iterdir() if p.suffix in (".py", ".pyi"))
    present = sorted(p.name for p in checked_in.iterdir() if p.suffix in (".py", ".pyi"))
    assert fresh == present, "generated file set differs: run scripts/genproto.py"
    for name in fresh:
        assert (out / name).read_text() == (checked_in / name).read_text(), (
            f"bookstream_pb/{name} is stale: run scripts/genproto.py")


def test_generated_package_does_not_collide_with_proto_plus():
    import bookstream_pb

    assert bookstream_pb.__name__ == "bookstream_pb"
    assert "proto" not in sys.modules or not getattr(sys.modules["proto"], "__file__", "").startswith(str(ROOT))


def test_core_status_codes_equal_the_wire_codes():
    wire = {name: pb.StatusCode.Value(name) for name in pb.StatusCode.keys()}
    assert wire == {s.name: s.value for s in Status}


# -- bookie/wire.py: the Add stream's frames without protobuf's copies ----------------------------

import hypothesis  # noqa: E402
import hypothesis.strategies as st  # noqa: E402

from bookie import wire  # noqa: E402

FRAME_IDS = st.integers(0, (1 << 64) - 1)
RECORDS = st.lists(st.binary(max_size=300), max_size=6)
KEYS = st.one_of(st.just(b""), st.binary(min_size=1, max_size=40))


@hypothesis.given(FRAME_IDS, RECORDS, KEYS)
def test_an_encoded_frame_is_the_protobuf_encoding_of_add_frame(fid, records, key):
    raw = wire.encode_add_frame(fid, records, key)
    assert raw == pb.AddFrame(frame_id=fid, entries=b"".join(records), master_key=key).SerializeToString()
    got_id, entries, got_key = wire.decode_add_frame(raw)
    assert (got_id, bytes(entries), got_key) == (fid, b"".join(records), key)


def test_a_frame_without_a_key_is_unchanged_by_the_field():
    """A ledger without a password sends the bytes it sent before master_key."""
    assert wire.encode_add_frame(7, [b"abc"]) == b"\x08\x07\x12\x03abc"


def _field(number: int, wtype: int, body: bytes) -> bytes:
    return wire.varint(number << 3 | wtype) + body


@hypothesis.given(FRAME_IDS, st.binary(max_size=200), st.permutations(range(5)),
                  st.integers(4, 1000), st.binary(max_size=20), KEYS)
def test_decoding_reads_any_valid_encoding_as_protobuf_does(fid, entries, order, unknown, blob, key):
    """Fields in any order, unknown fields of every wire type between them:
    the decoder agrees with the generated class."""
    parts = [_field(1, 0, wire.varint(fid)), _field(2, 2, wire.varint(len(entries)) + entries),
             _field(unknown, 2, wire.varint(len(blob)) + blob),
             _field(unknown + 1, 0, wire.varint(len(blob))) + _field(unknown + 2, 1, bytes(8))
             + _field(unknown + 3, 5, bytes(4)),
             _field(3, 2, wire.varint(len(key)) + key)]
    raw = b"".join(parts[i] for i in order)
    want = pb.AddFrame.FromString(raw)
    got_id, got_entries, got_key = wire.decode_add_frame(raw)
    assert (got_id, bytes(got_entries), got_key) == (want.frame_id, want.entries, want.master_key)


@hypothesis.given(st.binary(max_size=60))
def test_decoding_junk_either_agrees_with_protobuf_or_is_refused(junk):
    try:
        got = wire.decode_add_frame(junk)
    except wire.MalformedFrame:
        return
    want = pb.AddFrame.FromString(junk)  # what we accept, protobuf reads the same way
    assert (got[0], bytes(got[1]), got[2]) == (want.frame_id, want.entries, want.master_key)


@hypothesis.given(st.sampled_from([0, 1, 2, 5, 8]), st.binary(max_size=300), st.integers(0, (1 << 32) - 1),
                  st.text(max_size=20), st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, (1 << 64) - 1))
def test_a_range_frame_reads_as_the_generated_class_reads_it(status, entries, count, message, through, term):
    """bookie_client's raw range-read frames (wire.decode_range_frame) see
    what ReadRangeResponse.FromString sees; the entries also as
    data[start:stop] of the message."""
    raw = pb.ReadRangeResponse(status=status, entries=entries, count=count, message=message, through=through,
                               term=term).SerializeToString()
    got = wire.decode_range_frame(raw)
    assert (got.status, bytes(got.entries), got.count, got.message, got.through, got.term) == (
        status, entries, count, message, through, term)
    assert got.data[got.start:got.stop] == entries


@hypothesis.given(st.sampled_from([0, 1, 2, 5, 8]), RECORDS, st.integers(0, (1 << 32) - 1),
                  st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, (1 << 64) - 1))
def test_a_range_frame_the_bookie_encodes_is_the_protobuf_encoding(status, records, count, through, term):
    """The bookie's ReadRange frames (wire.encode_range_frame) are byte for
    byte what the generated class serializes, so every reader, raw or
    generated, reads them; the method's serializer passes them on as they
    are and serializes any other message."""
    raw = wire.encode_range_frame(status, records, count, through, term)
    msg = pb.ReadRangeResponse(status=status, entries=b"".join(records), count=count, through=through, term=term)
    assert raw == msg.SerializeToString()
    assert wire.serialize_range_response(raw) is raw
    assert wire.serialize_range_response(msg) == raw


@hypothesis.given(st.binary(max_size=60))
def test_a_junk_range_frame_either_agrees_with_protobuf_or_is_refused(junk):
    try:
        got = wire.decode_range_frame(junk)
    except wire.MalformedFrame:
        return
    try:
        want = pb.ReadRangeResponse.FromString(junk)
    except Exception:
        return  # (protobuf refuses more: e.g. invalid UTF-8 in `message`, read here with replacement)
    assert (got.status, bytes(got.entries), got.count, got.through, got.term) == (
        want.status, want.entries, want.count, want.through, want.term)
