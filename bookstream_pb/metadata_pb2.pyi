from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LedgerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPEN: _ClassVar[LedgerState]
    IN_RECOVERY: _ClassVar[LedgerState]
    CLOSED: _ClassVar[LedgerState]

class LedgerMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLASSIC: _ClassVar[LedgerMode]
    UNBOUNDED: _ClassVar[LedgerMode]
OPEN: LedgerState
IN_RECOVERY: LedgerState
CLOSED: LedgerState
CLASSIC: LedgerMode
UNBOUNDED: LedgerMode

class LedgerHeader(_message.Message):
    __slots__ = ("ledger_id", "ensemble_size", "write_quorum", "ack_quorum", "state", "last_entry", "term", "mode", "trimmed_before", "ctime_ms", "custom", "last_fragment_first_entry", "fragment_count", "fragment_size_bytes", "fragment_size_entries")
    class CustomEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUORUM_FIELD_NUMBER: _ClassVar[int]
    ACK_QUORUM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TRIMMED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    CTIME_MS_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    LAST_FRAGMENT_FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_SIZE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerState
    last_entry: int
    term: int
    mode: LedgerMode
    trimmed_before: int
    ctime_ms: int
    custom: _containers.ScalarMap[str, str]
    last_fragment_first_entry: int
    fragment_count: int
    fragment_size_bytes: int
    fragment_size_entries: int
    def __init__(self, ledger_id: _Optional[int] = ..., ensemble_size: _Optional[int] = ..., write_quorum: _Optional[int] = ..., ack_quorum: _Optional[int] = ..., state: _Optional[_Union[LedgerState, str]] = ..., last_entry: _Optional[int] = ..., term: _Optional[int] = ..., mode: _Optional[_Union[LedgerMode, str]] = ..., trimmed_before: _Optional[int] = ..., ctime_ms: _Optional[int] = ..., custom: _Optional[_Mapping[str, str]] = ..., last_fragment_first_entry: _Optional[int] = ..., fragment_count: _Optional[int] = ..., fragment_size_bytes: _Optional[int] = ..., fragment_size_entries: _Optional[int] = ...) -> None: ...

class Fragment(_message.Message):
    __slots__ = ("first_entry", "ensemble")
    FIRST_ENTRY_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
    first_entry: int
    ensemble: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, first_entry: _Optional[int] = ..., ensemble: _Optional[_Iterable[str]] = ...) -> None: ...

class BookieRegistration(_message.Message):
    __slots__ = ("bookie_id", "address", "read_only", "free_bytes", "total_bytes", "started_ms", "version", "max_entry_size", "read_address", "rejoined_at", "halted")
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRY_SIZE_FIELD_NUMBER: _ClassVar[int]
    READ_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REJOINED_AT_FIELD_NUMBER: _ClassVar[int]
    HALTED_FIELD_NUMBER: _ClassVar[int]
    bookie_id: str
    address: str
    read_only: bool
    free_bytes: int
    total_bytes: int
    started_ms: int
    version: str
    max_entry_size: int
    read_address: str
    rejoined_at: int
    halted: str
    def __init__(self, bookie_id: _Optional[str] = ..., address: _Optional[str] = ..., read_only: _Optional[bool] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., started_ms: _Optional[int] = ..., version: _Optional[str] = ..., max_entry_size: _Optional[int] = ..., read_address: _Optional[str] = ..., rejoined_at: _Optional[int] = ..., halted: _Optional[str] = ...) -> None: ...

class ClusterInfo(_message.Message):
    __slots__ = ("cluster_id", "created_ms", "layout_version")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_VERSION_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    created_ms: int
    layout_version: int
    def __init__(self, cluster_id: _Optional[str] = ..., created_ms: _Optional[int] = ..., layout_version: _Optional[int] = ...) -> None: ...

class StreamRecord(_message.Message):
    __slots__ = ("name", "ledger_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    ledger_id: int
    def __init__(self, name: _Optional[str] = ..., ledger_id: _Optional[int] = ...) -> None: ...

class LogRecord(_message.Message):
    __slots__ = ("name", "ledger_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEDGER_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ledger_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., ledger_ids: _Optional[_Iterable[int]] = ...) -> None: ...
