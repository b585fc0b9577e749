"""The add-frame pipeline as pure code (no I/O, no clock): how a bookie's
batch of records leaves as frames.

- a frame holds at most ``FRAME_BYTES`` of records (``split_frames``);
- at most ``MAX_INFLIGHT_FRAMES`` frames wait for their ack per bookie;
- a small batch waits for the frame ahead of it to be acknowledged,
  gathering what comes meanwhile (fewer, larger frames: gRPC's cost is per
  message); a backlog of ``PIPELINE_BYTES`` or more goes at once (up to the
  in-flight limit), so large entries keep the bookie busy;
- a run of consecutive entries is encoded once for every bookie it goes to
  (with Qw = E each bookie of the write set is sent the same runs).

:class:`FramePipeline` holds the per-bookie counts and backlogs; the writer
(``stream/ledger_write.py``) and the recovery write-back
(``stream/ledger_recovery.py``) send what it returns and tell it of acks.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Iterator

from bookie import wire

# At 1 MiB gRPC's cost per message is already small beside its cost per byte,
# and a large batch in several frames lets a bookie journal one while the next
# arrives (with 4 MiB the whole window moved as one frame, a stage at a time:
# bench medians of six alternating runs, 1 KiB and 64 KiB appends, about 8 %
# higher at 1 MiB).
FRAME_BYTES = 1 << 20
MAX_INFLIGHT_FRAMES = 4
PIPELINE_BYTES = 256 << 10
RECENT_RUNS = 8  # encoded runs kept for the other bookies of their write sets


def split_frames(records: list[bytes], ids: list[int], frame_bytes: int = FRAME_BYTES
                 ) -> Iterator[tuple[list[int], list[bytes]]]:
    """Splits one bookie's batch into frames of at most ``frame_bytes`` (a
    single record larger than that is a frame of its own)."""
    if sum(map(len, records)) <= frame_bytes:
        yield ids, records
        return
    start, size = 0, 0
    for k, rec in enumerate(records):
        if size and size + len(rec) > frame_bytes:
            yield ids[start:k], records[start:k]
            start, size = k, 0
        size += len(rec)
    if start < len(records):
        yield ids[start:], records[start:]


@dataclass(slots=True)
class Frame:
    """One encoded frame for one bookie: ``message`` carries ``frame_id``
    (``wire.encode_add_frame``), the records of ``entry_ids``."""

    bookie_index: int
    bookie_id: str
    entry_ids: list[int]
    frame_id: int
    message: bytes


class FramePipeline:
    """Per-bookie in-flight frames and backlog.  ``offer`` a bookie's batch:
    the frames to send now come back (the rest waits); ``frame_done`` when a
    frame's ack (or failure) comes: the backlog's frames to send now come
    back.  ``forget`` drops a bookie's backlog (replaced, or stopped)."""

    def __init__(self, frame_bytes: int = FRAME_BYTES, max_inflight: int = MAX_INFLIGHT_FRAMES,
                 pipeline_bytes: int = PIPELINE_BYTES, master_key: bytes = b""):
        self.frame_bytes, self.max_inflight, self.pipeline_bytes = frame_bytes, max_inflight, pipeline_bytes
        self.master_key = master_key                 # the ledger's, in every frame (stream/password.py)
        self.inflight: dict[str, int] = {}          # bookie id -> frames awaiting their ack
        self._backlog: dict[str, list] = {}          # bookie id -> [index, ids, records, bytes]
        # the last runs encoded: (first, last) -> [frame id, message, bookies sent to]
        self._recent: collections.OrderedDict[tuple[int, int], list] = collections.OrderedDict()
        self.frames_made = 0

    def offer(self, index: int, bookie_id: str, ids: list[int], records: list[bytes]) -> list[Frame]:
        inflight = self.inflight.get(bookie_id, 0)
        if inflight == 0:
            return self._frames(index, bookie_id, ids, records)
        held = self._backlog.setdefault(bookie_id, [index, [], [], 0])
        held[1].extend(ids)
        held[2].extend(records)
        held[3] += sum(map(len, records))
        if held[3] >= self.pipeline_bytes and inflight < self.max_inflight:
            del self._backlog[bookie_id]
            return self._frames(index, bookie_id, held[1], held[2])
        return []

    def frame_done(self, bookie_id: str) -> tuple[int, list[Frame]]:
        """A frame to ``bookie_id`` was answered (or failed): returns the
        ensemble index its backlog was for and the backlog's frames, to send
        if that bookie is still at that index (``(-1, [])``: no backlog)."""
        self.inflight[bookie_id] -= 1
        held = self._backlog.pop(bookie_id, None)
        if held is None:
            return -1, []
        return held[0], self._frames(held[0], bookie_id, held[1], held[2])

    def unsent(self, frames: list[Frame]) -> None:
        """Frames made but never sent (no channel to their bookie)."""
        for f in frames:
            self.inflight[f.bookie_id] -= 1

    def forget(self, bookie_id: str | None = None) -> None:
        if bookie_id is None:
            self._backlog.clear()
        else:
            self._backlog.pop(bookie_id, None)

    def encode(self, index: int, bookie_id: str, ids: list[int], records: list[bytes]) -> list[Frame]:
        """The batch as encoded frames, now, not counted in flight (a
        caller that bounds what it sends itself: the recovery write-back,
        whose core caps the write-backs in flight)."""
        return self._frames(index, bookie_id, ids, records, count=False)

    def _frames(self, index: int, bookie_id: str, ids: list[int], records: list[bytes], count: bool = True
                ) -> list[Frame]:
        out = []
        for fids, frecs in split_frames(records, ids, self.frame_bytes):
            fid, msg = self._encoded(bookie_id, fids, frecs)
            out.append(Frame(index, bookie_id, fids, fid, msg))
        if count:
            self.inflight[bookie_id] = self.inflight.get(bookie_id, 0) + len(out)
        self.frames_made += len(out)
        return out

    def _encoded(self, bookie_id: str, ids: list[int], records: list[bytes]) -> tuple[int, bytes]:
        """Only a run of consecutive ids is shared (its ids name its
        records); one frame id never goes twice to one bookie."""
        key = (ids[0], ids[-1])
        shared = key[1] - key[0] + 1 == len(ids)
        c = self._recent.get(key) if shared else None
        if c is not None and bookie_id not in c[2]:
            c[2].add(bookie_id)
            return c[0], c[1]
        fid = next(wire.frame_ids)
        msg = wire.encode_add_frame(fid, records, self.master_key)
        if shared:
            self._recent[key] = [fid, msg, {bookie_id}]
            self._recent.move_to_end(key)
            while len(self._recent) > RECENT_RUNS:
                self._recent.popitem(last=False)
        return fid, msg


__all__ = ["FRAME_BYTES", "MAX_INFLIGHT_FRAMES", "PIPELINE_BYTES", "Frame", "FramePipeline", "split_frames"]
