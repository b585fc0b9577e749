"""Ledger metadata: the in-memory :class:`LedgerMetadata` and its storage in
etcd, :class:`LedgerStore`.

A ledger is stored as one header key (``LedgerHeader``) and one key per
fragment (``Fragment``), see :mod:`metadata.layout`.  Every change of a
ledger's metadata, fragments included, is one etcd transaction that CASes the
header on its mod_revision; so the header's mod_revision is the version of
the whole ledger's metadata, and readers that pin the header's revision see
a consistent set of fragments.

The header's ``fragment_count`` and ``last_fragment_first_entry`` are kept
by this module (callers must not change them): they let a reader fetch the
newest fragment with one point read, however many fragments the ledger has.

Why the newest fragment is read by key and not with a descending range:
etcd 3.5 serves a sorted range by fetching the *whole* range from its
backend and truncating afterwards, so a ``descending, limit=1`` range over
many fragments costs hundreds of point reads (bench/notes.md).
:meth:`LedgerStore.fragment_for` likewise probes narrow descending windows
below the entry instead of one range down to the first fragment.
"""
from __future__ import annotations

import bisect
import dataclasses
import enum
import time
from typing import Iterator, Literal, Mapping, Sequence


from bookstream_pb import metadata_pb2 as pb
from metadata.errors import (
    decode_message,
    BadVersion,
    CorruptMetadata,
    GuardFailed,
    InvalidLedgerConfig,
    NoFragment,
    NoSuchLedger,
    TxnConflict,
)
from metadata.layout import MAX_ENTRY_ID, MAX_LEDGER_ID, KeyLayout, validate_name
from metadata.store import Compare, Delete, Get, MetadataStore, Put, absent, exists, mod_revision_is, prefix_end

MAX_ENSEMBLE_SIZE = 1024
_MAX_CREATE_ATTEMPTS = 5
_MAX_PROBES = 40


class LedgerState(enum.IntEnum):
    """Mirrors ``bookstream.v1.LedgerState``."""

    OPEN = pb.OPEN
    IN_RECOVERY = pb.IN_RECOVERY
    CLOSED = pb.CLOSED


class LedgerMode(enum.IntEnum):
    """Mirrors ``bookstream.v1.LedgerMode``."""

    CLASSIC = pb.CLASSIC
    UNBOUNDED = pb.UNBOUNDED


@dataclasses.dataclass(frozen=True)
class Fragment:
    """The ensemble that stores entries from ``first_entry`` up to the next
    fragment's first entry (or the ledger's end)."""

    first_entry: int
    ensemble: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ensemble", tuple(self.ensemble))
        assert isinstance(self.first_entry, int) and 0 <= self.first_entry <= MAX_ENTRY_ID, \
            f"bad first_entry {self.first_entry!r}"
        assert all(isinstance(b, str) for b in self.ensemble), "bookie ids are str"

    def to_proto(self) -> pb.Fragment:
        return pb.Fragment(first_entry=self.first_entry, ensemble=list(self.ensemble))

    @classmethod
    def from_proto(cls, msg: pb.Fragment) -> "Fragment":
        if msg.first_entry < 0:
            raise CorruptMetadata(f"fragment with negative first entry {msg.first_entry}")
        return cls(msg.first_entry, tuple(msg.ensemble))

    def to_bytes(self) -> bytes:
        return self.to_proto().SerializeToString(deterministic=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Fragment":
        return cls.from_proto(decode_message(pb.Fragment, data))


def validate_config(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Raise ``InvalidLedgerConfig`` unless E >= Qw >= Qa >= 1."""
    for name, v in (("ensemble_size", ensemble_size), ("write_quorum", write_quorum), ("ack_quorum", ack_quorum)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise InvalidLedgerConfig(f"{name} must be an int, got {v!r}")
    if not (MAX_ENSEMBLE_SIZE >= ensemble_size >= write_quorum >= ack_quorum >= 1):
        raise InvalidLedgerConfig(f"need E >= Qw >= Qa >= 1 (E <= {MAX_ENSEMBLE_SIZE}), got "
                                  f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}")


def validate_ensemble(ensemble: Sequence[str], ensemble_size: int) -> tuple[str, ...]:
    """Raise ``InvalidLedgerConfig`` unless ``ensemble`` has
    ``ensemble_size`` distinct bookie ids (``InvalidName`` for a bad id)."""
    ens = tuple(ensemble)
    if len(ens) != ensemble_size:
        raise InvalidLedgerConfig(f"ensemble has {len(ens)} bookies, ensemble size is {ensemble_size}")
    for b in ens:
        validate_name(b, "bookie id")
    if len(set(ens)) != len(ens):
        raise InvalidLedgerConfig(f"ensemble has duplicate bookies: {list(ens)}")
    return ens


@dataclasses.dataclass(frozen=True)
class LedgerMetadata:
    """A ledger's header fields plus the fragments that were loaded.

    ``fragments`` is sorted by first entry.  It holds every fragment when
    read with ``fragments="all"`` (then :attr:`fragments_complete`), only the
    newest with ``"last"``, none with ``"none"``.  ``ledger_id`` is None
    before creation.  Derive changed copies with :meth:`with_`.
    """

    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ledger_id: int | None = None
    state: LedgerState = LedgerState.OPEN
    last_entry: int = -1
    term: int = 0
    mode: LedgerMode = LedgerMode.CLASSIC
    trimmed_before: int = 0
    ctime_ms: int = 0
    custom: Mapping[str, str] = dataclasses.field(default_factory=dict)
    last_fragment_first_entry: int = 0
    fragment_count: int = 0
    fragment_size_bytes: int = 0
    fragment_size_entries: int = 0
    fragments: tuple[Fragment, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fragments", tuple(self.fragments))
        object.__setattr__(self, "custom", dict(self.custom))
        object.__setattr__(self, "state", LedgerState(self.state))
        object.__setattr__(self, "mode", LedgerMode(self.mode))
        assert self.ledger_id is None or (isinstance(self.ledger_id, int) and 0 < self.ledger_id <= MAX_LEDGER_ID)
        assert all(isinstance(f, Fragment) for f in self.fragments)
        firsts = [f.first_entry for f in self.fragments]
        assert firsts == sorted(set(firsts)), f"fragments must be sorted by distinct first entries: {firsts}"
        assert isinstance(self.last_entry, int) and self.last_entry >= -1
        assert self.term >= 0 and self.trimmed_before >= 0 and self.ctime_ms >= 0
        assert self.fragment_size_bytes >= 0 and self.fragment_size_entries >= 0
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in self.custom.items())

    __hash__ = None  # type: ignore[assignment]  # custom is a dict

    def with_(self, **changes) -> "LedgerMetadata":
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Raise ``InvalidLedgerConfig`` unless E >= Qw >= Qa >= 1 and every
        loaded fragment has E distinct valid bookie ids."""
        validate_config(self.ensemble_size, self.write_quorum, self.ack_quorum)
        for f in self.fragments:
            validate_ensemble(f.ensemble, self.ensemble_size)

    @property
    def last_fragment(self) -> Fragment | None:
        """The newest loaded fragment (the current one if any was loaded)."""
        return self.fragments[-1] if self.fragments else None

    @property
    def fragments_complete(self) -> bool:
        """True when :attr:`fragments` holds all the ledger's fragments."""
        return len(self.fragments) == self.fragment_count

    def fragment_at(self, entry_id: int) -> Fragment:
        """The loaded fragment covering ``entry_id``; ``NoFragment`` if none
        does (the entry is below the first fragment, or the fragments that
        would cover it were not loaded)."""
        assert isinstance(entry_id, int) and 0 <= entry_id <= MAX_ENTRY_ID, f"bad entry id {entry_id!r}"
        firsts = [f.first_entry for f in self.fragments]
        i = bisect.bisect_right(firsts, entry_id) - 1
        if i < 0:
            why = "not loaded" if not self.fragments_complete else "below the first fragment"
            raise NoFragment(self.ledger_id, entry_id,
                             f"no fragment of ledger {self.ledger_id} covers entry {entry_id} ({why})")
        return self.fragments[i]

    def ensemble_at(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble that stores ``entry_id`` (see :meth:`fragment_at`)."""
        return self.fragment_at(entry_id).ensemble

    # -- protobuf -------------------------------------------------------------

    def to_header(self) -> pb.LedgerHeader:
        assert self.ledger_id is not None, "a header needs a ledger id"
        return pb.LedgerHeader(
            ledger_id=self.ledger_id, ensemble_size=self.ensemble_size, write_quorum=self.write_quorum,
            ack_quorum=self.ack_quorum, state=int(self.state), last_entry=self.last_entry, term=self.term,
            mode=int(self.mode), trimmed_before=self.trimmed_before, ctime_ms=self.ctime_ms,
            custom=dict(self.custom), last_fragment_first_entry=self.last_fragment_first_entry,
            fragment_count=self.fragment_count, fragment_size_bytes=self.fragment_size_bytes,
            fragment_size_entries=self.fragment_size_entries,
        )

    def header_bytes(self) -> bytes:
        return self.to_header().SerializeToString(deterministic=True)

    @classmethod
    def from_header(cls, msg: pb.LedgerHeader, fragments: Sequence[Fragment] = ()) -> "LedgerMetadata":
        try:
            validate_config(msg.ensemble_size, msg.write_quorum, msg.ack_quorum)
            state, mode = LedgerState(msg.state), LedgerMode(msg.mode)
        except (InvalidLedgerConfig, ValueError) as exc:
            raise CorruptMetadata(f"bad header of ledger {msg.ledger_id}: {exc}") from exc
        if msg.ledger_id == 0 or msg.last_entry < -1 or msg.trimmed_before < 0 or msg.last_fragment_first_entry < 0:
            raise CorruptMetadata(f"bad header of ledger {msg.ledger_id}: {msg}")
        return cls(
            ledger_id=msg.ledger_id, ensemble_size=msg.ensemble_size, write_quorum=msg.write_quorum,
            ack_quorum=msg.ack_quorum, state=state, last_entry=msg.last_entry, term=msg.term, mode=mode,
            trimmed_before=msg.trimmed_before, ctime_ms=msg.ctime_ms, custom=dict(msg.custom),
            last_fragment_first_entry=msg.last_fragment_first_entry, fragment_count=msg.fragment_count,
            fragment_size_bytes=msg.fragment_size_bytes, fragment_size_entries=msg.fragment_size_entries,
            fragments=tuple(fragments),
        )

    @classmethod
    def from_header_bytes(cls, data: bytes, fragments: Sequence[Fragment] = ()) -> "LedgerMetadata":
        return cls.from_header(decode_message(pb.LedgerHeader, data), fragments)


FragmentsToRead = Literal["all", "last", "none"]


class LedgerStore:
    """Ledger metadata of one cluster, stored in etcd through ``store``."""

    def __init__(self, store: MetadataStore, cluster: str) -> None:
        assert isinstance(store, MetadataStore)
        self.store = store
        self.layout = KeyLayout(cluster)

    # -- ids ------------------------------------------------------------------

    def allocate_id(self) -> int:
        """A new ledger id, unique in the cluster: the revision of a put of
        the ``idgen/last`` key (see :mod:`metadata.layout`)."""
        revision = self.store.put(self.layout.idgen_key(), b"")
        assert 0 < revision <= MAX_LEDGER_ID
        return revision

    # -- create / read --------------------------------------------------------

    def create(self, header: LedgerMetadata, first_ensemble: Sequence[str]) -> tuple[LedgerMetadata, int]:
        """Create a ledger from ``header`` (no id, no fragments, OPEN) with
        its first fragment (entry 0 on ``first_ensemble``), atomically.

        Returns ``(metadata, header_revision)``.  Raises
        ``InvalidLedgerConfig`` / ``InvalidName`` on a bad config.
        """
        assert isinstance(header, LedgerMetadata)
        if header.ledger_id is not None:
            raise InvalidLedgerConfig("create() allocates the ledger id: pass a header without one")
        if header.fragments or header.fragment_count:
            raise InvalidLedgerConfig("create() writes the first fragment: pass a header without fragments")
        if header.state != LedgerState.OPEN or header.last_entry != -1:
            raise InvalidLedgerConfig("a new ledger is OPEN with last_entry -1")
        header.validate()
        ensemble = validate_ensemble(first_ensemble, header.ensemble_size)
        first = Fragment(0, ensemble)
        for _ in range(_MAX_CREATE_ATTEMPTS):
            lid = self.allocate_id()
            meta = header.with_(ledger_id=lid, ctime_ms=header.ctime_ms or int(time.time() * 1000),
                                trimmed_before=0, fragment_count=1, last_fragment_first_entry=0,
                                fragments=(first,))
            hkey, fkey = self.layout.ledger_header_key(lid), self.layout.fragment_key(lid, 0)
            try:
                result = self.store.txn([absent(hkey), absent(fkey)],
                                        [Put(hkey, meta.header_bytes()), Put(fkey, first.to_bytes())])
            except TxnConflict:
                continue  # the id is taken (a restored backup?): allocate another
            return meta, result.revision
        raise CorruptMetadata(f"{_MAX_CREATE_ATTEMPTS} freshly allocated ledger ids were all taken")

    def read(self, ledger_id: int, fragments: FragmentsToRead = "all") -> tuple[LedgerMetadata, int]:
        """The ledger's metadata and header revision.

        ``fragments``: ``"all"`` loads every fragment (paged, at the header's
        revision), ``"last"`` only the newest (one point read), ``"none"``
        none.  Raises ``NoSuchLedger``.
        """
        assert fragments in ("all", "last", "none"), f"bad fragments mode {fragments!r}"
        hkey = self.layout.ledger_header_key(ledger_id)
        if fragments == "all":
            fprefix = self.layout.fragments_prefix(ledger_id)
            (hpage, fpage), rev = self.store.read([Get(hkey), Get.prefix(fprefix, limit=self.store._page_size)])
            if not hpage.items:
                raise NoSuchLedger(ledger_id)
            header = hpage.items[0][1]
            frags = [Fragment.from_bytes(v.value) for _, v in fpage.items]
            if fpage.more:
                rest = self.store.iter_key_range(fpage.items[-1][0] + "\0", prefix_end(fprefix.encode()),
                                                 revision=rev)
                frags.extend(Fragment.from_bytes(v.value) for _, v in rest)
            meta = LedgerMetadata.from_header_bytes(header.value, frags)
            self._check_fragments(meta, complete=True)
            return meta, header.mod_revision
        header, rev = self.store.get_with_revision(hkey)
        if header is None:
            raise NoSuchLedger(ledger_id)
        meta = LedgerMetadata.from_header_bytes(header.value)
        if fragments == "last":
            last = self._get_fragment(ledger_id, meta.last_fragment_first_entry, rev)
            if last is None:
                raise CorruptMetadata(f"ledger {ledger_id}: header names fragment "
                                      f"{meta.last_fragment_first_entry}, which does not exist")
            meta = meta.with_(fragments=(last,))
            self._check_fragments(meta, complete=False)
        return meta, header.mod_revision

    def _get_fragment(self, ledger_id: int, first_entry: int, revision: int) -> Fragment | None:
        v = self.store.get(self.layout.fragment_key(ledger_id, first_entry), revision=revision)
        return None if v is None else Fragment.from_bytes(v.value)

    def _check_fragments(self, meta: LedgerMetadata, complete: bool) -> None:
        lid = meta.ledger_id
        if meta.fragment_count < 1 or (complete and len(meta.fragments) != meta.fragment_count):
            raise CorruptMetadata(f"ledger {lid}: header says {meta.fragment_count} fragments, "
                                  f"found {len(meta.fragments)}")
        last = meta.last_fragment
        if last is None or last.first_entry != meta.last_fragment_first_entry:
            raise CorruptMetadata(f"ledger {lid}: last fragment {last} does not start at "
                                  f"{meta.last_fragment_first_entry}")
        for f in meta.fragments:
            if len(f.ensemble) != meta.ensemble_size:
                raise CorruptMetadata(f"ledger {lid}: fragment {f} does not have {meta.ensemble_size} bookies")

    def fragment_for(self, ledger_id: int, entry_id: int) -> Fragment:
        """The fragment covering ``entry_id``, read without reading the
        other fragments.  Raises ``NoSuchLedger``, or ``NoFragment`` when the
        entry is below the first fragment (trimmed).

        The newest fragment is a point read; an older one is found with
        descending ranges over windows ``[entry - w, entry]`` of growing
        ``w`` (starting near the mean fragment length), all at the header's
        revision, so etcd never scans far below the entry.
        """
        assert isinstance(entry_id, int) and 0 <= entry_id <= MAX_ENTRY_ID, f"bad entry id {entry_id!r}"
        header, rev = self.store.get_with_revision(self.layout.ledger_header_key(ledger_id))
        if header is None:
            raise NoSuchLedger(ledger_id)
        meta = LedgerMetadata.from_header_bytes(header.value)
        if entry_id >= meta.last_fragment_first_entry:
            frag = self._get_fragment(ledger_id, meta.last_fragment_first_entry, rev)
            if frag is None:
                raise CorruptMetadata(f"ledger {ledger_id}: newest fragment is missing")
            return frag
        span = (meta.last_fragment_first_entry - meta.trimmed_before) // max(1, meta.fragment_count - 1)
        width = max(1, 2 * span)
        end = self.layout.fragment_key(ledger_id, entry_id).encode() + b"\0"
        for _ in range(_MAX_PROBES):
            low = max(0, entry_id - width)
            (page,), _ = self.store.read([Get(self.layout.fragment_key(ledger_id, low), end, limit=1,
                                              descending=True)], revision=rev)
            if page.items:
                return Fragment.from_bytes(page.items[0][1].value)
            if low == 0:
                raise NoFragment(ledger_id, entry_id,
                                 f"entry {entry_id} of ledger {ledger_id} is below its first fragment")
            width *= 4
        raise AssertionError("unreachable: the window reaches entry 0 within the probe limit")

    def fragment_span(self, ledger_id: int, entry_id: int) -> tuple[Fragment, int | None]:
        """The fragment covering ``entry_id`` and the first entry of the
        fragment after it (None for the newest), so a reader knows how far
        the fragment reaches without listing the others: two small reads."""
        frag = self.fragment_for(ledger_id, entry_id)
        nxt = self.store.range(self.layout.fragments_prefix(ledger_id), limit=1,
                               start_after=self.layout.fragment_key(ledger_id, frag.first_entry))
        if not nxt:
            return frag, None
        return frag, Fragment.from_bytes(nxt[0][1].value).first_entry

    # -- updates --------------------------------------------------------------

    def update_header(self, meta: LedgerMetadata, expected_revision: int) -> int:
        """CAS the header to ``meta``'s fields; returns the new revision.

        Raises ``BadVersion`` if the header changed since
        ``expected_revision``, ``NoSuchLedger`` if it is gone.  Fragments
        are not touched (see :meth:`add_fragment`).
        """
        assert isinstance(meta, LedgerMetadata) and meta.ledger_id is not None
        validate_config(meta.ensemble_size, meta.write_quorum, meta.ack_quorum)
        hkey = self.layout.ledger_header_key(meta.ledger_id)
        try:
            return self.store.cas(hkey, meta.header_bytes(), expected_revision)
        except BadVersion as bv:
            if bv.current is None:
                raise NoSuchLedger(meta.ledger_id) from None
            raise

    def add_fragment(self, ledger_id: int, fragment: Fragment, header: LedgerMetadata,
                     expected_header_revision: int) -> tuple[LedgerMetadata, int]:
        """Atomically write ``fragment`` and CAS the header to ``header``'s
        fields (so an ensemble change can be published with a state change,
        as recovery does).  See :meth:`add_fragments`."""
        return self.add_fragments(ledger_id, [fragment], header, expected_header_revision)

    def add_fragments(self, ledger_id: int, fragments: Sequence[Fragment], header: LedgerMetadata,
                      expected_header_revision: int, guards: Sequence[Compare] = ()) -> tuple[LedgerMetadata, int]:
        """Atomically write ``fragments`` and CAS the header.

        A fragment starting after the current last fragment is appended; one
        starting at the current last fragment's first entry replaces it; one
        starting at an older fragment's first entry replaces that fragment
        (re-replication), which must exist (else ``NoFragment``).
        ``fragment_count`` and ``last_fragment_first_entry`` are computed
        here.  Returns ``(metadata, new_header_revision)``; the metadata's
        fragments are ``header``'s with the new ones merged in.

        ``guards``: conditions of the same transaction besides the header's
        version (``created_at`` of a recovery's lock: a replacement is
        published only while the lock it was copied under is still held).

        Raises ``BadVersion`` (header changed), ``NoSuchLedger``,
        ``GuardFailed``, ``InvalidLedgerConfig``.
        """
        assert isinstance(header, LedgerMetadata) and header.ledger_id == ledger_id, "header of another ledger"
        fragments = list(fragments)
        assert fragments and all(isinstance(f, Fragment) for f in fragments)
        header.validate()
        firsts = [f.first_entry for f in fragments]
        if firsts != sorted(set(firsts)):
            raise InvalidLedgerConfig(f"new fragments must have increasing first entries: {firsts}")
        for f in fragments:
            validate_ensemble(f.ensemble, header.ensemble_size)
        count, last = header.fragment_count, header.last_fragment_first_entry
        assert count >= 1, "the header has no fragments: was it read from the store?"
        compares = [mod_revision_is(self.layout.ledger_header_key(ledger_id), expected_header_revision)]
        for f in fragments:
            if f.first_entry > last:
                count, last = count + 1, f.first_entry
            elif f.first_entry < last:
                compares.append(exists(self.layout.fragment_key(ledger_id, f.first_entry)))
        merged = {f.first_entry: f for f in header.fragments}
        merged.update({f.first_entry: f for f in fragments})
        meta = header.with_(fragment_count=count, last_fragment_first_entry=last,
                            fragments=tuple(merged[k] for k in sorted(merged)))
        ops = [Put(self.layout.fragment_key(ledger_id, f.first_entry), f.to_bytes()) for f in fragments]
        ops.append(Put(self.layout.ledger_header_key(ledger_id), meta.header_bytes()))
        revision = self._cas_txn(ledger_id, expected_header_revision, compares, ops, guards)
        return meta, revision

    def remove_fragments_before(self, ledger_id: int, entry_id: int, header: LedgerMetadata,
                                expected_header_revision: int) -> tuple[LedgerMetadata, int]:
        """Trim: delete the fragments that lie wholly below ``entry_id`` and
        set ``trimmed_before`` to ``entry_id`` (never lowering it), with a CAS
        on the header, atomically.  The fragment covering ``entry_id`` (and
        so the newest fragment) is always kept.

        Returns ``(metadata, new_header_revision)``.  Raises ``BadVersion``,
        ``NoSuchLedger``.
        """
        assert isinstance(header, LedgerMetadata) and header.ledger_id == ledger_id, "header of another ledger"
        assert isinstance(entry_id, int) and 0 <= entry_id <= MAX_ENTRY_ID, f"bad entry id {entry_id!r}"
        try:
            keep_from = self.fragment_for(ledger_id, entry_id).first_entry
        except NoFragment:
            keep_from = None  # everything below entry_id is already gone
        ops: list = []
        removed = 0
        if keep_from is not None:
            start = self.layout.fragments_prefix(ledger_id)
            end = self.layout.fragment_key(ledger_id, keep_from)
            removed = self.store.count_range(start, end)
            if removed:
                ops.append(Delete(start, end.encode()))
        if removed >= header.fragment_count:
            raise CorruptMetadata(f"ledger {ledger_id}: trimming would remove all {header.fragment_count} fragments")
        meta = header.with_(trimmed_before=max(header.trimmed_before, entry_id),
                            fragment_count=header.fragment_count - removed,
                            fragments=tuple(f for f in header.fragments
                                            if keep_from is None or f.first_entry >= keep_from))
        ops.append(Put(self.layout.ledger_header_key(ledger_id), meta.header_bytes()))
        compares = [mod_revision_is(self.layout.ledger_header_key(ledger_id), expected_header_revision)]
        # The count above is exact: every fragment change CASes the header,
        # so if the header is still at expected_header_revision, no fragment
        # changed since the caller read it.
        revision = self._cas_txn(ledger_id, expected_header_revision, compares, ops)
        return meta, revision

    def _cas_txn(self, ledger_id: int, expected: int, compares, ops, guards: Sequence[Compare] = ()) -> int:
        """The transaction of ``compares`` and ``guards`` (``created_at``
        conditions: ``GuardFailed`` when one fails), then ``ops``."""
        hkey = self.layout.ledger_header_key(ledger_id)
        try:
            return self.store.txn([*compares, *guards], ops).revision
        except TxnConflict as c:
            cur = c.current.get(hkey)
            if cur is None:
                raise NoSuchLedger(ledger_id) from None
            if cur.mod_revision != expected:
                raise BadVersion(hkey, expected, cur) from None
            for g in guards:
                now = c.current.get(g.key)
                if now is None or now.create_revision != g.operand:
                    raise GuardFailed(g.key, now) from None
            missing = [k for k, v in c.current.items() if v is None]
            entry = self.layout.parse_ledger_key(missing[0])[2] if missing else -1
            raise NoFragment(ledger_id, entry if entry is not None else -1,
                             f"ledger {ledger_id} has no fragment starting at {entry} to replace") from None

    # -- delete / list --------------------------------------------------------

    def delete(self, ledger_id: int, expected_header_revision: int | None = None) -> bool:
        """Delete the ledger's header and fragments atomically.  Returns
        whether it existed.  With ``expected_header_revision``, only at that
        header version (``BadVersion`` / ``NoSuchLedger`` otherwise)."""
        op = Delete.prefix(self.layout.ledger_prefix(ledger_id))
        if expected_header_revision is None:
            return self.store.txn([], [op]).results[0] > 0
        hkey = self.layout.ledger_header_key(ledger_id)
        self._cas_txn(ledger_id, expected_header_revision, [mod_revision_is(hkey, expected_header_revision)], [op])
        return True

    def exists(self, ledger_id: int) -> bool:
        return self.store.get(self.layout.ledger_header_key(ledger_id)) is not None

    def named_bookies(self, revision: int | None = None,
                      page_size: int | None = None) -> Iterator[tuple[int, frozenset[str]]]:
        """``(ledger id, the bookies its fragments name)`` for every ledger,
        ascending: one paged scan of every ledger key, fragments decoded and
        the rest skipped; a page of keys a request, not a request a ledger.
        What finds the ledgers a bookie's loss touches (autorecovery's
        auditor and periodic check, manual recovery) and what a bookie's old
        id must be free of before it serves an empty disk (:meth:`naming`).

        With ``revision``, every page is read at it.  Without, each page at
        the then current revision: a scan read lazily between other work (a
        full check reads every entry between two pages) may outlast etcd's
        compaction retention.  A ledger whose keys two pages share is then
        named by fragments read at two revisions; a bookie named at the
        first and not the second was replaced there, and one named only at
        the second was placed there since: the union holds every bookie
        named when the scan began and not replaced before its read."""
        lid: int | None = None
        named: set[str] = set()
        for key, v in self.store.iter_range(self.layout.ledgers_prefix(), revision=revision, page_size=page_size,
                                            pin=False):
            this, kind, _ = self.layout.parse_ledger_key(key)
            if this != lid:
                if lid is not None:
                    yield lid, frozenset(named)
                lid, named = this, set()
            if kind == "fragment":
                named.update(Fragment.from_bytes(v.value).ensemble)
        if lid is not None:
            yield lid, frozenset(named)

    def naming(self, bookie_id: str, revision: int | None = None) -> list[int]:
        """The ids of the ledgers a fragment of which names ``bookie_id``,
        ascending (:meth:`named_bookies`): what ``bookstream bookies cookie
        delete`` and a bookie's ``--on-lost-disk rejoin`` wait for
        (bookie/cookie.py)."""
        return [lid for lid, named in self.named_bookies(revision) if bookie_id in named]

    def list_ledgers(self, page_size: int | None = None, revision: int | None = None) -> Iterator[int]:
        """The ids of all ledgers, ascending, read lazily page by page at one
        revision (``revision``, or the first page's).  After each page, the
        rest of the last ledger's keys (its fragments) are skipped, so big
        ledgers do not slow the listing."""
        page = page_size or self.store._page_size
        assert page > 0
        start = self.layout.ledgers_prefix()
        end = prefix_end(start.encode())
        last: int | None = None
        while True:
            (items,), revision = self.store.read([Get(start, end, limit=page, keys_only=True)], revision)
            for key, _ in items.items:
                lid = self.layout.parse_ledger_id(key)
                if lid != last:
                    assert last is None or lid > last
                    last = lid
                    yield lid
            if not items.more or not items.items:
                return
            assert last is not None
            start = prefix_end(self.layout.ledger_prefix(last).encode()).decode("utf-8")


__all__ = [
    "LedgerState", "LedgerMode", "Fragment", "LedgerMetadata", "LedgerStore", "validate_config",
    "validate_ensemble",
]
