"""The pure frame pipeline (stream/frames.py) and write-ack decoding
(stream/bookie_client.py decode_ack): no I/O."""
from bookie.core import Status
from bookstream_pb import bookie_pb2 as pb
from stream.bookie_client import decode_ack
from stream.frames import FramePipeline


def recs(n, size=10):
    return [bytes([k % 256]) * size for k in range(n)]


def test_first_batch_goes_at_once_then_waits_for_the_ack():
    p = FramePipeline(frame_bytes=100, max_inflight=2, pipeline_bytes=50)
    out = p.offer(0, "b1", [0, 1], recs(2))
    assert [f.entry_ids for f in out] == [[0, 1]] and p.inflight["b1"] == 1
    assert p.offer(0, "b1", [2], recs(1)) == []  # small: gathered behind the frame ahead
    at, frames = p.frame_done("b1")
    assert at == 0 and [f.entry_ids for f in frames] == [[2]] and p.inflight["b1"] == 1


def test_a_large_backlog_goes_up_to_the_inflight_limit():
    p = FramePipeline(frame_bytes=100, max_inflight=2, pipeline_bytes=50)
    p.offer(0, "b1", [0], recs(1))
    assert [f.entry_ids for f in p.offer(0, "b1", list(range(1, 7)), recs(6))] == [[1, 2, 3, 4, 5, 6]]
    assert p.inflight["b1"] == 2
    assert p.offer(0, "b1", list(range(7, 13)), recs(6)) == []  # the limit: held
    assert p.frame_done("b1")[1][0].entry_ids == list(range(7, 13))


def test_a_run_is_encoded_once_for_every_bookie_and_split_by_frame_size():
    p = FramePipeline(frame_bytes=25)
    a = p.offer(0, "b1", [0, 1, 2], recs(3))
    b = p.offer(1, "b2", [0, 1, 2], recs(3))
    assert [f.entry_ids for f in a] == [[0, 1], [2]]
    assert a[-1].frame_id == b[-1].frame_id and a[-1].message is b[-1].message  # the last run, shared
    again = p.frames_made
    c = p.offer(0, "b1", [0, 1, 2], recs(3))  # b1 is busy: held, never the same frame id twice
    assert c == [] and p.frames_made == again


def test_unsent_and_encode_do_not_leave_counts_behind():
    p = FramePipeline()
    p.unsent(p.offer(0, "b1", [0], recs(1)))
    assert p.inflight["b1"] == 0
    assert p.encode(0, "b1", [1], recs(1)) and p.inflight["b1"] == 0


def test_decode_ack():
    assert decode_ack(pb.AddAck(status=Status.OK), 3) is None
    whole = decode_ack(pb.AddAck(status=Status.READ_ONLY), 2)
    assert whole == [(Status.READ_ONLY, 0)] * 2
    one = decode_ack(pb.AddAck(status=Status.INVALID_TERM,
                               errors=[pb.EntryError(index=1, status=Status.INVALID_TERM, term=9)]), 3)
    assert one == [(Status.OK, 0), (Status.INVALID_TERM, 9), (Status.OK, 0)]
    # a code this client does not know is an error, never OK
    assert decode_ack(pb.AddAck(status=999), 1) == [(Status.INTERNAL_ERROR, 0)]
    assert decode_ack(pb.AddAck(errors=[pb.EntryError(index=0, status=999)]), 1) == [(Status.INTERNAL_ERROR, 0)]
