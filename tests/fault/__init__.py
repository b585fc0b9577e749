"""Fault tests on real processes: the gRPC fuzzing of a bookie
(test_fuzz_bookie.py) and the fault suite (nemesis, history, checker:
``python -m tests.fault``; its short seeded set in CI: test_fault_suite.py)."""
