"""Metadata of a bookstream cluster, kept in etcd.

Modules:

* :mod:`metadata.store` -- :class:`MetadataStore`, a typed interface over etcd
  (CAS, transactions, paged ranges, watches, leases), with
  :mod:`metadata.txn` (a transaction's conditions, operations, results),
  :mod:`metadata.watch` (watches that resume) and :mod:`metadata.lease`
  (leases, :class:`KeepAlive`);
* :mod:`metadata.layout` -- the key layout (:class:`KeyLayout`) and name rules;
* :mod:`metadata.ledgers` -- ledger metadata (:class:`LedgerMetadata`,
  :class:`LedgerStore`);
* :mod:`metadata.registration` -- bookie membership (:class:`BookieRegistry`);
* :mod:`metadata.keeper` / :mod:`metadata.keeper_core` -- a lease-bound key
  kept alive and created again after a lost lease (:class:`KeptKey`), and its
  pure policy (:class:`KeeperCore`), for every lease holder;
* :mod:`metadata.cluster` -- the cluster record;
* :mod:`metadata.etcd_server` -- :class:`ManagedEtcd`, a local etcd process;
* :mod:`metadata.errors` -- the typed errors (each has ``retriable``).
"""
import bookstream_pb  # noqa: F401  (first: it sets gRPC's fork default before gRPC loads)
from metadata.errors import (
    BadVersion,
    BookieDecommissioned,
    BookieIdInUse,
    Compacted,
    ConditionFailed,
    CorruptMetadata,
    GuardFailed,
    InvalidKey,
    InvalidLedgerConfig,
    InvalidName,
    KeyExists,
    LeaseExpired,
    MetadataError,
    MetadataUnavailable,
    NoFragment,
    NoSuchLedger,
    RegistrationLost,
    TxnConflict,
)
from metadata.etcd_server import EtcdServerError, ManagedEtcd
from metadata.layout import KeyLayout, validate_name
from metadata.ledgers import Fragment, LedgerMetadata, LedgerMode, LedgerState, LedgerStore
from metadata.keeper import KeptKey
from metadata.keeper_core import KeeperCore, KeeperState
from metadata.registration import BookieRegistry, MembershipChange, MembershipEvent, Registration
from metadata.store import (
    Delete,
    EventType,
    Get,
    KeepAlive,
    Lease,
    MetadataStore,
    Put,
    TxnResult,
    Versioned,
    WatchEvent,
    absent,
    created_at,
    exists,
    mod_revision_is,
)
from metadata.cluster import get_cluster_info, init_cluster

__all__ = [
    "BadVersion", "BookieDecommissioned", "BookieIdInUse", "Compacted", "ConditionFailed", "CorruptMetadata",
    "GuardFailed", "InvalidKey",
    "InvalidLedgerConfig", "InvalidName", "KeyExists", "LeaseExpired", "MetadataError", "MetadataUnavailable",
    "NoFragment", "NoSuchLedger", "RegistrationLost", "TxnConflict", "EtcdServerError", "ManagedEtcd",
    "KeyLayout", "validate_name", "Fragment", "LedgerMetadata", "LedgerMode", "LedgerState", "LedgerStore",
    "BookieRegistry", "MembershipChange", "MembershipEvent", "Registration", "Delete", "EventType", "Get",
    "KeepAlive", "Lease", "MetadataStore", "Put", "TxnResult", "Versioned", "WatchEvent", "absent", "created_at",
    "exists", "mod_revision_is", "get_cluster_info", "init_cluster", "KeptKey", "KeeperCore", "KeeperState",
]
