"""Typed errors of the ledger client (``stream.client`` / ``stream.ledger``).

Every error derives from :class:`BookKeeperError` and carries ``retriable``:
``True`` when the same call may succeed if tried again later (bookies or etcd
unreachable, a recovery that could not decide and must be retried), ``False``
when retrying the same call cannot help (the ledger is fenced, closed,
deleted, the configuration is invalid).

:func:`translate` maps the errors of the layers below (``metadata.errors``,
the writer core, the bookie client) to these types, so an application only
ever catches ``stream.errors`` types.
"""
from __future__ import annotations


class BookKeeperError(Exception):
    """Base class of every ledger client error."""

    retriable: bool = False


# -- configuration and lookup ---------------------------------------------------

class InvalidLedgerConfig(BookKeeperError, ValueError):
    """E >= Qw >= Qa >= 1 does not hold, or another bad create argument."""


class NoSuchLedger(BookKeeperError, LookupError):
    """The ledger does not exist (never created, or deleted)."""

    def __init__(self, ledger_id: int | None, message: str = ""):
        super().__init__(message or f"no such ledger: {ledger_id}")
        self.ledger_id = ledger_id


class NotEnoughBookies(BookKeeperError):
    """Fewer writable bookies than needed (for an ensemble or a replacement).
    ``excluded`` maps each bookie left out to why (in the ensemble already,
    read-only, failed recently and still not enough with it...)."""

    retriable = True

    def __init__(self, needed: int, available: int, message: str = "",
                 excluded: "dict[str, str] | None" = None):
        super().__init__(message or f"need {needed} writable bookies, {available} available")
        self.needed = needed
        self.available = available
        self.excluded = dict(excluded or {})


class EntryTooLarge(BookKeeperError, ValueError):
    """An append's payload is larger than the cluster's maximum entry size
    (the smallest ``--max-entry-size`` of the registered bookies).  Refused
    before anything is sent: the writer and the bookies are unaffected, and
    the same payload will never fit (not retriable)."""

    def __init__(self, size: int, limit: int, message: str = ""):
        super().__init__(message or f"entry of {size} bytes is larger than the maximum entry size "
                                    f"({limit} bytes)")
        self.size, self.limit = size, limit


# -- writing --------------------------------------------------------------------

class LedgerFenced(BookKeeperError):
    """The ledger was fenced (recovered by another client): this handle can
    no longer add.  The outcome of an add that failed with it is unknown
    until the ledger is recovered (treat it like a timeout)."""


class LedgerClosed(BookKeeperError):
    """The ledger is closed (or this handle is read-only): no more adds."""


class LedgerInRecovery(LedgerFenced):
    """A close found the ledger IN_RECOVERY: another client is recovering it."""


class CloseMismatch(LedgerClosed):
    """A close found the ledger already CLOSED at another last entry."""

    def __init__(self, ledger_id: int, ours: int, theirs: int):
        super().__init__(f"ledger {ledger_id} was closed at entry {theirs}, this writer acknowledged "
                         f"up to {ours}")
        self.ledger_id, self.ours, self.theirs = ledger_id, ours, theirs


class NotWriter(BookKeeperError):
    """Term mode: this client is not (or no longer) the ledger's writer."""


class WriterFenced(NotWriter):
    """Term mode: a newer term took the ledger over."""

    def __init__(self, message: str, term: int = 0):
        super().__init__(message)
        self.term = term


class NotLeader(BookKeeperError):
    """Logs: another node took the log over (its ledger list changed under
    this leader's CAS); this one must stop serving writes."""


class TooManyPendingAdds(BookKeeperError):
    """Back-pressure: the pending-add window is full; retry after acks."""

    retriable = True


class AddFailed(BookKeeperError):
    """An add could not be replicated (e.g. a bookie refused it for good)."""


class QuorumTimeout(BookKeeperError):
    """Not enough bookies answered in time."""

    retriable = True


# -- recovery and reading -------------------------------------------------------

class LedgerRecoveryFailed(BookKeeperError):
    """Recovery could not decide (coverage out of reach, an entry's outcome
    unknown, no bookie to replace one with).  Nothing was guessed; retry.
    ``missing``: the bookies that did not answer (or could not be replaced)."""

    retriable = True

    def __init__(self, message: str = "", missing: "list[str] | tuple[str, ...]" = ()):
        super().__init__(message)
        self.missing = tuple(missing)


class ReadBeyondLac(BookKeeperError):
    """A read past the last add confirmed (or the last entry of a closed
    ledger): such entries are not readable yet, or never will be."""

    def __init__(self, ledger_id: int, entry_id: int, lac: int):
        super().__init__(f"ledger {ledger_id}: entry {entry_id} is beyond the last add confirmed {lac}")
        self.ledger_id, self.entry_id, self.lac = ledger_id, entry_id, lac


class BadChecksum(BookKeeperError):
    """Every replica that answered served a record failing its checksum."""

    retriable = True


class ReadFailed(BookKeeperError):
    """No replica of an entry could serve it (errors, timeouts)."""

    retriable = True

    def __init__(self, ledger_id: int, entry_id: int, message: str = ""):
        super().__init__(message or f"ledger {ledger_id}: entry {entry_id} could not be read from any replica")
        self.ledger_id, self.entry_id = ledger_id, entry_id


class EntryMissing(ReadFailed):
    """Every replica said it does not hold an entry below the LAC: the
    acknowledged entry is lost (more than Qa - 1 bookies of its write quorum
    lost their data).  Never returned silently: reads skip nothing."""

    retriable = False


class MetadataUnavailable(BookKeeperError):
    """etcd could not be reached; the outcome of a metadata write is unknown."""

    retriable = True


class AuthenticationFailed(BookKeeperError):
    """etcd refused the client's credentials (none given where auth is on,
    a wrong user or password, no permission): ClientConfig.etcd_auth."""

    retriable = False


class UnauthorizedAccess(BookKeeperError):
    """The ledger was created with a password, and none or another was
    given (at open), or a bookie refused the request's master key
    (UNAUTHORIZED_ACCESS: stream/password.py)."""

    retriable = False


class MetadataConflict(BookKeeperError):
    """A metadata compare-and-swap kept failing."""

    retriable = True


class ClientClosed(BookKeeperError):
    """The client (or handle) was closed."""


# -- translation ----------------------------------------------------------------

# -- streams ---------------------------------------------------------------------

class NoSuchStream(BookKeeperError, LookupError):
    """No stream of that name (open it as a writer to create it)."""

    def __init__(self, name: str):
        super().__init__(f"no stream named {name!r}")
        self.name = name


class PositionTrimmed(BookKeeperError):
    """The position lies below the stream's trim point: its entries are gone."""

    def __init__(self, name: str, position, trimmed_before: int):
        super().__init__(f"stream {name!r}: {position} is below the trim point (entry {trimmed_before})")
        self.name, self.position, self.trimmed_before = name, position, trimmed_before


def translate(exc: BaseException) -> BaseException:
    """The ``stream.errors`` type for an error of a lower layer (returned
    unchanged when it already is one, or is not an error we know)."""
    if isinstance(exc, BookKeeperError):
        return exc
    from metadata import errors as me
    from stream import writer_core as wc
    from stream.bookie_client import BookieUnavailable
    from stream.quorum import InvalidQuorum

    out: BookKeeperError | None = None
    if isinstance(exc, me.NoSuchLedger):
        out = NoSuchLedger(exc.ledger_id)
    elif isinstance(exc, (me.InvalidLedgerConfig, InvalidQuorum)):
        out = InvalidLedgerConfig(str(exc))
    elif isinstance(exc, me.InvalidName):
        out = InvalidLedgerConfig(str(exc))
    elif isinstance(exc, me.AuthenticationFailed):
        out = AuthenticationFailed(str(exc))
    elif isinstance(exc, (me.MetadataUnavailable, me.Compacted)):
        out = MetadataUnavailable(str(exc))
    elif isinstance(exc, me.ConditionFailed):
        out = MetadataConflict(str(exc))
    elif isinstance(exc, me.MetadataError):
        out = BookKeeperError(str(exc))
        out.retriable = exc.retriable
    elif isinstance(exc, wc.WriterFenced):
        # a term's writer was fenced by a newer term; a classic one by recovery
        out = WriterFenced(str(exc), exc.term) if exc.term else LedgerFenced(str(exc))
    elif isinstance(exc, wc.WriterClosed):
        out = LedgerClosed(str(exc))
    elif isinstance(exc, wc.WriterUnauthorized):
        out = UnauthorizedAccess(str(exc))
    elif isinstance(exc, wc.WindowFull):
        out = TooManyPendingAdds(str(exc))
    elif isinstance(exc, wc.WriterFailed):
        out = AddFailed(str(exc))
    elif isinstance(exc, BookieUnavailable):
        out = QuorumTimeout(str(exc))
    if out is None:
        return exc
    out.__cause__ = exc
    return out


__all__ = [
    "BookKeeperError", "InvalidLedgerConfig", "NoSuchLedger", "NotEnoughBookies", "EntryTooLarge", "LedgerFenced",
    "LedgerClosed", "LedgerInRecovery", "CloseMismatch", "NotWriter", "WriterFenced", "NotLeader",
    "TooManyPendingAdds",
    "AddFailed", "QuorumTimeout", "LedgerRecoveryFailed", "ReadBeyondLac", "BadChecksum", "ReadFailed",
    "EntryMissing", "MetadataUnavailable", "MetadataConflict", "AuthenticationFailed", "UnauthorizedAccess", "ClientClosed", "NoSuchStream",
    "PositionTrimmed", "translate",
]
