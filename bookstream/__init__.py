"""The command line and the processes it runs."""
import bookstream_pb  # noqa: F401  (first: it sets gRPC's fork default before gRPC loads)
