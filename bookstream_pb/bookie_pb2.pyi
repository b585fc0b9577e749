from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[StatusCode]
    NO_SUCH_LEDGER: _ClassVar[StatusCode]
    NO_SUCH_ENTRY: _ClassVar[StatusCode]
    FENCED: _ClassVar[StatusCode]
    INVALID_TERM: _ClassVar[StatusCode]
    BAD_REQUEST: _ClassVar[StatusCode]
    READ_ONLY: _ClassVar[StatusCode]
    CHECKSUM_MISMATCH: _ClassVar[StatusCode]
    TOO_LARGE: _ClassVar[StatusCode]
    UNKNOWN_ENTRY: _ClassVar[StatusCode]
    INTERNAL_ERROR: _ClassVar[StatusCode]
    UNAUTHORIZED_ACCESS: _ClassVar[StatusCode]

class ReadFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_NONE: _ClassVar[ReadFlag]
    READ_FENCE: _ClassVar[ReadFlag]

class BookieState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITABLE: _ClassVar[BookieState]
    READ_ONLY_STATE: _ClassVar[BookieState]
OK: StatusCode
NO_SUCH_LEDGER: StatusCode
NO_SUCH_ENTRY: StatusCode
FENCED: StatusCode
INVALID_TERM: StatusCode
BAD_REQUEST: StatusCode
READ_ONLY: StatusCode
CHECKSUM_MISMATCH: StatusCode
TOO_LARGE: StatusCode
UNKNOWN_ENTRY: StatusCode
INTERNAL_ERROR: StatusCode
UNAUTHORIZED_ACCESS: StatusCode
READ_NONE: ReadFlag
READ_FENCE: ReadFlag
WRITABLE: BookieState
READ_ONLY_STATE: BookieState

class AddFrame(_message.Message):
    __slots__ = ("frame_id", "entries", "master_key")
    FRAME_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    frame_id: int
    entries: bytes
    master_key: bytes
    def __init__(self, frame_id: _Optional[int] = ..., entries: _Optional[bytes] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class EntryError(_message.Message):
    __slots__ = ("index", "status", "term")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    index: int
    status: StatusCode
    term: int
    def __init__(self, index: _Optional[int] = ..., status: _Optional[_Union[StatusCode, str]] = ..., term: _Optional[int] = ...) -> None: ...

class AddAck(_message.Message):
    __slots__ = ("frame_id", "status", "errors", "message")
    FRAME_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    frame_id: int
    status: StatusCode
    errors: _containers.RepeatedCompositeFieldContainer[EntryError]
    message: str
    def __init__(self, frame_id: _Optional[int] = ..., status: _Optional[_Union[StatusCode, str]] = ..., errors: _Optional[_Iterable[_Union[EntryError, _Mapping]]] = ..., message: _Optional[str] = ...) -> None: ...

class AddAcks(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[AddAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[AddAck, _Mapping]]] = ...) -> None: ...

class ReadEntryRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "term", "flags", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    term: int
    flags: int
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., term: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class ReadEntryResponse(_message.Message):
    __slots__ = ("status", "entry", "term", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    entry: bytes
    term: int
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., entry: _Optional[bytes] = ..., term: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry", "last_entry", "max_frame_bytes", "term", "flags", "sparse", "stripe", "residues", "master_key", "reader_verifies")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    RESIDUES_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    READER_VERIFIES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry: int
    last_entry: int
    max_frame_bytes: int
    term: int
    flags: int
    sparse: bool
    stripe: int
    residues: int
    master_key: bytes
    reader_verifies: bool
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry: _Optional[int] = ..., last_entry: _Optional[int] = ..., max_frame_bytes: _Optional[int] = ..., term: _Optional[int] = ..., flags: _Optional[int] = ..., sparse: _Optional[bool] = ..., stripe: _Optional[int] = ..., residues: _Optional[int] = ..., master_key: _Optional[bytes] = ..., reader_verifies: _Optional[bool] = ...) -> None: ...

class ReadRangeResponse(_message.Message):
    __slots__ = ("status", "entries", "count", "message", "through", "term")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    entries: bytes
    count: int
    message: str
    through: int
    term: int
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., entries: _Optional[bytes] = ..., count: _Optional[int] = ..., message: _Optional[str] = ..., through: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id", "term", "flags", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    term: int
    flags: int
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., term: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "lac", "lafr", "last_entry", "term", "fenced", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LAFR_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    lac: int
    lafr: int
    last_entry: int
    term: int
    fenced: bool
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., lac: _Optional[int] = ..., lafr: _Optional[int] = ..., last_entry: _Optional[int] = ..., term: _Optional[int] = ..., fenced: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class LongPollLacRequest(_message.Message):
    __slots__ = ("ledger_id", "previous_lac", "timeout_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    previous_lac: int
    timeout_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class WriteLacRequest(_message.Message):
    __slots__ = ("ledger_id", "lac", "lafr", "term", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LAFR_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    lac: int
    lafr: int
    term: int
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., lac: _Optional[int] = ..., lafr: _Optional[int] = ..., term: _Optional[int] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("status", "term", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    term: int
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., term: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry", "term", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry: int
    term: int
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry: _Optional[int] = ..., term: _Optional[int] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class PrepareResponse(_message.Message):
    __slots__ = ("status", "term", "entries_deleted", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    term: int
    entries_deleted: int
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., term: _Optional[int] = ..., entries_deleted: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("ledger_id", "has_range", "first_entry", "last_entry", "master_key", "copy_token")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_RANGE_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    COPY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    has_range: bool
    first_entry: int
    last_entry: int
    master_key: bytes
    copy_token: int
    def __init__(self, ledger_id: _Optional[int] = ..., has_range: _Optional[bool] = ..., first_entry: _Optional[int] = ..., last_entry: _Optional[int] = ..., master_key: _Optional[bytes] = ..., copy_token: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("status", "entries_deleted", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_DELETED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    entries_deleted: int
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., entries_deleted: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("bookie_id", "state", "free_bytes", "total_bytes", "used_bytes", "ledgers", "entries", "segments", "replayed_records", "replayed_bytes", "journal_fsyncs", "journal_bytes", "replay_seconds", "read_entry_requests", "read_range_requests", "read_range_entries", "journal_sync_histogram", "journal_sync_max_seconds", "registration_state", "unregistered_seconds", "halted", "scrub_last_end", "scrub_next_due", "scrub_rotted_entries", "set_aside_bytes", "scrub_pass_checked", "scrub_pass_entries", "scrub_requested", "scrub_interval")
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FSYNCS_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    READ_ENTRY_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    READ_RANGE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    READ_RANGE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_SYNC_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_SYNC_MAX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_STATE_FIELD_NUMBER: _ClassVar[int]
    UNREGISTERED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HALTED_FIELD_NUMBER: _ClassVar[int]
    SCRUB_LAST_END_FIELD_NUMBER: _ClassVar[int]
    SCRUB_NEXT_DUE_FIELD_NUMBER: _ClassVar[int]
    SCRUB_ROTTED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SET_ASIDE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SCRUB_PASS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    SCRUB_PASS_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SCRUB_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    SCRUB_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    bookie_id: str
    state: BookieState
    free_bytes: int
    total_bytes: int
    used_bytes: int
    ledgers: int
    entries: int
    segments: int
    replayed_records: int
    replayed_bytes: int
    journal_fsyncs: int
    journal_bytes: int
    replay_seconds: float
    read_entry_requests: int
    read_range_requests: int
    read_range_entries: int
    journal_sync_histogram: _containers.RepeatedScalarFieldContainer[int]
    journal_sync_max_seconds: float
    registration_state: str
    unregistered_seconds: float
    halted: str
    scrub_last_end: float
    scrub_next_due: float
    scrub_rotted_entries: int
    set_aside_bytes: int
    scrub_pass_checked: int
    scrub_pass_entries: int
    scrub_requested: int
    scrub_interval: float
    def __init__(self, bookie_id: _Optional[str] = ..., state: _Optional[_Union[BookieState, str]] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., ledgers: _Optional[int] = ..., entries: _Optional[int] = ..., segments: _Optional[int] = ..., replayed_records: _Optional[int] = ..., replayed_bytes: _Optional[int] = ..., journal_fsyncs: _Optional[int] = ..., journal_bytes: _Optional[int] = ..., replay_seconds: _Optional[float] = ..., read_entry_requests: _Optional[int] = ..., read_range_requests: _Optional[int] = ..., read_range_entries: _Optional[int] = ..., journal_sync_histogram: _Optional[_Iterable[int]] = ..., journal_sync_max_seconds: _Optional[float] = ..., registration_state: _Optional[str] = ..., unregistered_seconds: _Optional[float] = ..., halted: _Optional[str] = ..., scrub_last_end: _Optional[float] = ..., scrub_next_due: _Optional[float] = ..., scrub_rotted_entries: _Optional[int] = ..., set_aside_bytes: _Optional[int] = ..., scrub_pass_checked: _Optional[int] = ..., scrub_pass_entries: _Optional[int] = ..., scrub_requested: _Optional[int] = ..., scrub_interval: _Optional[float] = ...) -> None: ...
