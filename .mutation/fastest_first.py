"""pytest plugin for mutation runs: run the selected tests fastest first.

Rule: with ``-x`` a killed mutant costs the time of the tests before the first failure, so
tests run in increasing order of the durations mutmut measured in its stats pass
(``mutmut-stats.json`` in the working directory); a test it never timed runs last. Without
that file (the stats pass itself) the order is left alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

STATS_FILE = Path("mutmut-stats.json")


def measured_durations() -> dict[str, float]:
    """``{node id: seconds}`` from mutmut's stats file, or ``{}`` before it exists."""
    if not STATS_FILE.exists():
        return {}
    return json.loads(STATS_FILE.read_text()).get("duration_by_test", {})


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    durations = measured_durations()
    if durations:
        items.sort(key=lambda item: durations.get(item.nodeid, math.inf))
