"""A place in a stream (:class:`Position`), a list of them as appends return
it (:class:`Positions`), and a record as readers return it (:class:`Record`).
Re-exported by ``stream.stream``."""
from __future__ import annotations

import collections
import collections.abc
import functools
import struct
from typing import NamedTuple



@functools.total_ordering
class Position:
    """A place in a stream: opaque, comparable, serializable.

    ``Position.EARLIEST`` sorts before every position and ``Position.LATEST``
    after every one.  ``bytes(p)`` / ``Position.from_bytes`` and ``str(p)`` /
    ``Position.parse`` round-trip."""

    __slots__ = ("_v",)
    _EARLIEST_V = -1
    _LATEST_V = (1 << 63) - 1
    EARLIEST: "Position"
    LATEST: "Position"
    _FMT = struct.Struct(">q")

    def __init__(self, entry_id: int):
        if not isinstance(entry_id, int) or not (self._EARLIEST_V <= entry_id <= self._LATEST_V):
            raise ValueError(f"bad position {entry_id!r}")
        self._v = entry_id

    @classmethod
    def _of(cls, entry_id: int) -> "Position":
        """An entry's position, from an id known to be valid (hot paths)."""
        p = object.__new__(cls)
        p._v = entry_id
        return p

    @property
    def entry_id(self) -> int:
        if self.is_sentinel:
            raise ValueError(f"{self} names no entry")
        return self._v

    @property
    def is_sentinel(self) -> bool:
        return self._v in (self._EARLIEST_V, self._LATEST_V)

    def __eq__(self, other) -> bool:
        return isinstance(other, Position) and self._v == other._v

    def __lt__(self, other: "Position") -> bool:
        if not isinstance(other, Position):
            return NotImplemented
        return self._v < other._v

    def __hash__(self) -> int:
        return hash(("Position", self._v))

    def __repr__(self) -> str:
        return f"Position({self})"

    def __str__(self) -> str:
        if self._v == self._EARLIEST_V:
            return "earliest"
        if self._v == self._LATEST_V:
            return "latest"
        return str(self._v)

    def __bytes__(self) -> bytes:
        return self._FMT.pack(self._v)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Position":
        if len(data) != 8:
            raise ValueError(f"not a serialized Position: {data!r}")
        return cls(cls._FMT.unpack(data)[0])

    @classmethod
    def parse(cls, text: str) -> "Position":
        if text == "earliest":
            return cls.EARLIEST
        if text == "latest":
            return cls.LATEST
        return cls(int(text))


Position.EARLIEST = Position(Position._EARLIEST_V)
Position.LATEST = Position(Position._LATEST_V)


class Positions(collections.abc.Sequence):
    """The positions of a batch of consecutive appends (built on demand)."""

    __slots__ = ("first", "last")

    def __init__(self, first: int, last: int):
        self.first, self.last = first, last

    def __len__(self) -> int:
        return self.last - self.first + 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [Position(e) for e in range(self.first, self.last + 1)[i]]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return Position(self.first + (i % n))

    def __repr__(self) -> str:
        return f"Positions({self.first}..{self.last})"


class Record(NamedTuple):
    """A record read from a stream (a tuple: cheap to make by the thousand)."""

    position: Position
    payload: bytes



__all__ = ["Position", "Positions", "Record"]
