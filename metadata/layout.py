"""The etcd key layout of a bookstream cluster.

Every key of cluster ``<cluster>`` lives under the root ``/bookstream/<cluster>/``.
Keys below are relative to that root; ``<lid>`` is a ledger id and ``<entry>``
an entry id, both written as 20-digit zero-padded decimals so that the
lexical order of keys is their numeric order.

=========================================  ==================  ======================================
key                                        value               notes
=========================================  ==================  ======================================
``cluster``                                ClusterInfo         created once (create-if-absent)
``bookies/writable/<bookie_id>``           BookieRegistration  under the bookie's lease
``bookies/readonly/<bookie_id>``           BookieRegistration  under the bookie's lease; a bookie id
                                                               is under at most one of the two
``cookies/<bookie_id>``                    JSON cookie         the bookie's data dir and cluster
                                                               (create-if-absent; bookie/cookie.py)
``marks/<bookie_id>``                      decimal counter     raised by the bookie's etcd check; a
                                                               value below the bookie's own note: etcd
                                                               lost writes (bookie/cookie.py)
``scrub-requests/<bookie_id>``             JSON (asked: time)  a scrub pass asked of the bookie; deleted
                                                               at its revision once a pass served it
                                                               (bookie/scrub.py)
``ledgers/<lid>/header``                   LedgerHeader        CAS'd by every metadata change
``ledgers/<lid>/fragments/<entry>``        Fragment            ``<entry>`` = the fragment's first
                                                               entry; fragments sort by it
``ledgers/<lid>/writer``                   JSON (id, host,     a stream writer's registration, under
                                           pid, term, start)   its lease (stream/writer_lease.py)
``idgen/last``                             (empty)             ledger id allocation (see below)
``streams/<name>``                         StreamRecord
``logs/<name>``                            LogRecord
``autorecovery/underreplicated/<lid>``     JSON task           one per ledger: the lost bookies it names,
                                                               what was found unrecoverable
``autorecovery/locks/<lid>``               worker id           under the worker's lease (a task lock)
``autorecovery/auditor``                   JSON (id, address)  under the auditor's lease (the election)
``autorecovery/enabled``                   ``true``/``false``  absent: enabled (cluster-wide switch)
``autorecovery/check-pass``                decimal integer     the sampled full check's last pass number
                                                               (its windows taken in turn, replica_check)
``autorecovery/decommissioned/<bookie>``   JSON                a decommissioned bookie id (refused)
=========================================  ==================  ======================================

Fragments are separate keys so that one ledger's metadata never becomes one
huge value, a fragment can be added by writing one small key, and the
fragment covering an entry can be read without reading the others.  The
header carries ``fragment_count`` and ``last_fragment_first_entry``, so the
newest fragment is one point read away.

Ledger id allocation (no global lock)
-------------------------------------
Every etcd write gets a fresh, cluster-wide revision, strictly greater than
every earlier one and never reused (revisions survive restarts and
compaction).  To allocate an id, a client does one unconditional ``put`` of
``idgen/last`` and takes the revision of that put as the ledger id.  Two
allocations are two writes, so they get two different revisions: ids are
unique under any concurrency, across clients and processes, with no
compare, no retry and no lock (etcd's raft log already orders the writes).
Ids are positive, below 2**63, and increase in allocation order.  The ledger
is then created with a create-if-absent on its header, which also guards
against any id reuse (e.g. after restoring an old backup: the create fails
with ``KeyExists`` and the caller allocates again).

Names (cluster names, bookie ids, stream and log names) must be non-empty,
at most 255 bytes of UTF-8, without ``/`` or control characters, and not
``.`` or ``..``; otherwise :class:`~metadata.errors.InvalidName`.
"""
from __future__ import annotations

import unicodedata

from metadata.errors import InvalidKey, InvalidName

ROOT = "/bookstream/"
LAYOUT_VERSION = 1
MAX_NAME_BYTES = 255
ID_DIGITS = 20
MAX_LEDGER_ID = 2**64 - 1
MAX_ENTRY_ID = 2**63 - 1


def validate_name(name: str, what: str = "name") -> str:
    """Return ``name`` if usable as one key segment, else raise
    ``InvalidName``."""
    if not isinstance(name, str):
        raise InvalidName(name, f"{what} must be a str")
    if not name:
        raise InvalidName(name, f"{what} is empty")
    if name in (".", ".."):
        raise InvalidName(name, f"{what} may not be '.' or '..'")
    if "/" in name:
        raise InvalidName(name, f"{what} contains '/'")
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in name):
        raise InvalidName(name, f"{what} contains a control character")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # pragma: no cover - surrogates are caught above
        raise InvalidName(name, f"{what} is not valid unicode") from None
    if size > MAX_NAME_BYTES:
        raise InvalidName(name, f"{what} is {size} bytes, more than {MAX_NAME_BYTES}")
    return name


def format_id(value: int, what: str = "id", maximum: int = MAX_LEDGER_ID) -> str:
    """``value`` as a 20-digit zero-padded decimal."""
    assert isinstance(value, int) and not isinstance(value, bool), f"{what} must be an int, got {value!r}"
    assert 0 <= value <= maximum, f"{what} out of range: {value}"
    return f"{value:0{ID_DIGITS}d}"


def parse_id(text: str, what: str = "id", maximum: int = MAX_LEDGER_ID) -> int:
    """Inverse of :func:`format_id`; raises ``InvalidKey``."""
    if len(text) != ID_DIGITS or not text.isascii() or not text.isdigit():
        raise InvalidKey(f"not a {ID_DIGITS}-digit {what}: {text!r}")
    value = int(text)
    if value > maximum:
        raise InvalidKey(f"{what} out of range: {text!r}")
    return value


class KeyLayout:
    """The keys of one cluster.  Builders return ``str`` keys; parsers take
    a full key and raise ``InvalidKey`` if it is not of their kind."""

    def __init__(self, cluster: str) -> None:
        self.cluster = validate_name(cluster, "cluster name")
        self.root = f"{ROOT}{cluster}/"

    def __repr__(self) -> str:
        return f"KeyLayout({self.cluster!r})"

    # -- cluster --------------------------------------------------------------

    def cluster_key(self) -> str:
        return self.root + "cluster"

    # -- bookies --------------------------------------------------------------

    def bookies_prefix(self) -> str:
        return self.root + "bookies/"

    def bookies_state_prefix(self, read_only: bool) -> str:
        return self.bookies_prefix() + ("readonly/" if read_only else "writable/")

    def bookie_key(self, bookie_id: str, read_only: bool) -> str:
        return self.bookies_state_prefix(read_only) + validate_name(bookie_id, "bookie id")

    def parse_bookie_key(self, key: str) -> tuple[str, bool]:
        """``(bookie_id, read_only)`` of a bookie key."""
        rest = self._strip(key, self.bookies_prefix())
        state, sep, bookie_id = rest.partition("/")
        if not sep or state not in ("writable", "readonly"):
            raise InvalidKey(f"not a bookie key: {key!r}")
        try:
            validate_name(bookie_id, "bookie id")
        except InvalidName as exc:
            raise InvalidKey(f"not a bookie key: {key!r} ({exc.reason})") from None
        return bookie_id, state == "readonly"

    def cookie_key(self, bookie_id: str) -> str:
        """The bookie's cookie (bookie/cookie.py)."""
        return self.root + "cookies/" + validate_name(bookie_id, "bookie id")

    def scrub_request_key(self, bookie_id: str) -> str:
        """A scrub pass asked of the bookie (``bookstream bookies scrub``):
        there while not yet served (bookie/scrub.py)."""
        return self.root + "scrub-requests/" + validate_name(bookie_id, "bookie id")

    def mark_key(self, bookie_id: str) -> str:
        """The bookie's mark, which its etcd check raises (bookie/cookie.py ``CookieGuard``)."""
        return self.root + "marks/" + validate_name(bookie_id, "bookie id")

    # -- ledgers --------------------------------------------------------------

    def ledgers_prefix(self) -> str:
        return self.root + "ledgers/"

    def ledger_prefix(self, ledger_id: int) -> str:
        return self.ledgers_prefix() + format_id(ledger_id, "ledger id") + "/"

    def ledger_header_key(self, ledger_id: int) -> str:
        return self.ledger_prefix(ledger_id) + "header"

    def fragments_prefix(self, ledger_id: int) -> str:
        return self.ledger_prefix(ledger_id) + "fragments/"

    def fragment_key(self, ledger_id: int, first_entry: int) -> str:
        return self.fragments_prefix(ledger_id) + format_id(first_entry, "first entry", MAX_ENTRY_ID)

    def writer_key(self, ledger_id: int) -> str:
        """A stream writer's lease-bound registration (deleted with the ledger)."""
        return self.ledger_prefix(ledger_id) + "writer"

    def parse_ledger_key(self, key: str) -> tuple[int, str, int | None]:
        """``(ledger_id, kind, first_entry)`` of a ledger key; ``kind`` is
        ``"header"`` or ``"writer"`` (first_entry None) or ``"fragment"``."""
        rest = self._strip(key, self.ledgers_prefix())
        parts = rest.split("/")
        ledger_id = parse_id(parts[0], "ledger id")
        if len(parts) == 2 and parts[1] in ("header", "writer"):
            return ledger_id, parts[1], None
        if len(parts) == 3 and parts[1] == "fragments":
            return ledger_id, "fragment", parse_id(parts[2], "first entry", MAX_ENTRY_ID)
        raise InvalidKey(f"not a ledger key: {key!r}")

    def parse_ledger_id(self, key: str) -> int:
        """The ledger id of any key under ``ledgers/<lid>/``."""
        rest = self._strip(key, self.ledgers_prefix())
        return parse_id(rest.split("/", 1)[0], "ledger id")

    def idgen_key(self) -> str:
        return self.root + "idgen/last"

    # -- streams and logs -----------------------------------------------------

    def streams_prefix(self) -> str:
        return self.root + "streams/"

    def stream_key(self, name: str) -> str:
        return self.streams_prefix() + validate_name(name, "stream name")

    def parse_stream_key(self, key: str) -> str:
        return self._parse_name(key, self.streams_prefix(), "stream name")

    def logs_prefix(self) -> str:
        return self.root + "logs/"

    def log_key(self, name: str) -> str:
        return self.logs_prefix() + validate_name(name, "log name")

    def parse_log_key(self, key: str) -> str:
        return self._parse_name(key, self.logs_prefix(), "log name")

    # -- autorecovery ----------------------------------------------

    def autorecovery_prefix(self) -> str:
        return self.root + "autorecovery/"

    def underreplicated_prefix(self) -> str:
        return self.autorecovery_prefix() + "underreplicated/"

    def underreplicated_key(self, ledger_id: int) -> str:
        return self.underreplicated_prefix() + format_id(ledger_id, "ledger id")

    def recovery_lock_key(self, ledger_id: int) -> str:
        return self.autorecovery_prefix() + "locks/" + format_id(ledger_id, "ledger id")

    def auditor_key(self) -> str:
        return self.autorecovery_prefix() + "auditor"

    def check_pass_key(self) -> str:
        return self.autorecovery_prefix() + "check-pass"

    def parse_underreplicated_key(self, key: str) -> int:
        return parse_id(self._strip(key, self.underreplicated_prefix()), "ledger id")

    def recovery_locks_prefix(self) -> str:
        return self.autorecovery_prefix() + "locks/"

    def parse_recovery_lock_key(self, key: str) -> int:
        return parse_id(self._strip(key, self.recovery_locks_prefix()), "ledger id")

    def autorecovery_enabled_key(self) -> str:
        return self.autorecovery_prefix() + "enabled"

    def decommissioned_prefix(self) -> str:
        return self.autorecovery_prefix() + "decommissioned/"

    def decommissioned_key(self, bookie_id: str) -> str:
        return self.decommissioned_prefix() + validate_name(bookie_id, "bookie id")

    # -- helpers --------------------------------------------------------------

    @staticmethod
    def _strip(key: str, prefix: str) -> str:
        if not isinstance(key, str) or not key.startswith(prefix):
            raise InvalidKey(f"{key!r} is not under {prefix!r}")
        return key[len(prefix):]

    def _parse_name(self, key: str, prefix: str, what: str) -> str:
        name = self._strip(key, prefix)
        try:
            return validate_name(name, what)
        except InvalidName as exc:
            raise InvalidKey(f"not a {what} key: {key!r} ({exc.reason})") from None
