"""The cluster record (``/bookstream/<cluster>/cluster``, a ClusterInfo)."""
from __future__ import annotations

import time
import uuid


from bookstream_pb import metadata_pb2 as pb
from metadata.errors import CorruptMetadata, KeyExists, decode_message
from metadata.layout import LAYOUT_VERSION, KeyLayout
from metadata.store import MetadataStore


def _decode(data: bytes) -> pb.ClusterInfo:
    return decode_message(pb.ClusterInfo, data)


def get_cluster_info(store: MetadataStore, cluster: str) -> pb.ClusterInfo | None:
    """The cluster's record, or None if it was never initialised."""
    value = store.get(KeyLayout(cluster).cluster_key())
    return None if value is None else _decode(value.value)


def init_cluster(store: MetadataStore, cluster: str) -> pb.ClusterInfo:
    """Create the cluster record if absent (create-if-absent, so concurrent
    callers agree on one ``cluster_id``) and return the stored one.  Raises
    ``CorruptMetadata`` if the stored layout version is newer than ours."""
    assert isinstance(store, MetadataStore)
    layout = KeyLayout(cluster)
    info = pb.ClusterInfo(cluster_id=uuid.uuid4().hex, created_ms=int(time.time() * 1000),
                          layout_version=LAYOUT_VERSION)
    try:
        store.create(layout.cluster_key(), info.SerializeToString(deterministic=True))
    except KeyExists as exists:
        assert exists.current is not None
        info = _decode(exists.current.value)
    if info.layout_version > LAYOUT_VERSION:
        raise CorruptMetadata(f"cluster {cluster!r} uses layout version {info.layout_version}, "
                              f"this code knows up to {LAYOUT_VERSION}")
    return info
