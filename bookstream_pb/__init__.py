"""Generated from proto/ by scripts/genproto.py. Do not edit.

Importing this package sets gRPC's fork support off unless the environment
says otherwise.  With it on, a process with live channels that forks to
exec (pyspark launching its JVM, ``subprocess`` with ``preexec_fn``) runs
gRPC's fork handlers, which abort the child now and then (SIGABRT, "Mutex::Fer
with pending CondVar") before it reaches exec; gRPC's fork_support.md asks
for this setting whenever a fork is followed by exec.  No bookstream
process forks a child that uses gRPC after using gRPC itself (Spark's
Python workers are forked by a daemon that never does).  Every bookstream
package imports this one first (metadata, stream, bookie, bookstream).
"""
import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
