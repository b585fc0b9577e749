"""Autorecovery: the auditor, the replication worker, manual recovery (issue 15).

Pure cores: ``auditor_core.py``, ``worker_core.py`` (and the fragment
replacement verdict in ``stream/lifecycle.py``).  Adapters: ``keys.py``
(tasks, locks, election, the enable switch in etcd), ``copier.py`` (the
batched copy between bookies), ``service.py`` (the auditor and worker
processes, and manual recovery).
"""
