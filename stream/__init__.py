"""The client side: streams, classic ledgers, logs, recovery, autorecovery, Spark."""
import bookstream_pb  # noqa: F401  (first: it sets gRPC's fork default before gRPC loads)
