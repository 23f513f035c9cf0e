"""The sequence zoo is caught by sequences only: each target fails a SEQ property and passes
every one-shot property of the half it changes (``ONE_SHOT_PATHS``; the other half is the
reference's own), under the CI profile.

Runs are subprocess ``pytest`` runs of the real property files, as in ``tests/test_zoo.py``
(no shrinking, JSON report). Figures, with shrinking: ``python -m tests.zoo.measure_sequences``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_zoo import run_suite, statuses
from tests.zoo import SEQUENCE_ZOO, selector, zoo_module

SEQUENCE_PATHS = ("properties/test_sequences.py",)


@pytest.mark.parametrize("name", SEQUENCE_ZOO)
def test_sequence_zoo_target_is_caught_by_a_sequence(name: str, tmp_path: Path) -> None:
    """Rule: a SEQ property the module names in ``CAUGHT_BY`` fails."""
    zoo = zoo_module(name)
    code, table, tail = run_suite(selector(name), SEQUENCE_PATHS, tmp_path / "report.json",
                                  zoo.CAUGHT_BY)
    failing = {pid for pid, status in statuses(table).items() if status == "fail"}
    assert code == 1 and failing & zoo.CAUGHT_BY, (
        f"{name}: failing {sorted(failing)} include none of {sorted(zoo.CAUGHT_BY)}\n{tail}")


@pytest.mark.parametrize("name", SEQUENCE_ZOO)
def test_sequence_zoo_target_passes_every_one_shot_property(name: str, tmp_path: Path) -> None:
    """Rule: every one-shot property of the half the target changes passes (or is skipped)."""
    zoo = zoo_module(name)
    code, table, tail = run_suite(selector(name), zoo.ONE_SHOT_PATHS, tmp_path / "report.json")
    bad = {pid: s for pid, s in statuses(table).items() if s not in ("pass", "skipped")}
    assert code == 0 and table and not bad, f"{name}: {bad}\n{tail}"


def test_sequence_zoo_declarations() -> None:
    """Rule: every sequence zoo module names an origin, SEQ properties and one-shot paths."""
    for name in SEQUENCE_ZOO:
        zoo = zoo_module(name)
        assert zoo.ORIGIN and zoo.ONE_SHOT_PATHS and zoo.target.name.startswith("zoo-"), name
        assert zoo.CAUGHT_BY and all(pid.startswith("SEQ-") for pid in zoo.CAUGHT_BY), name
