"""The sequence zoo is caught by sequences only: each target fails a SEQ property and passes
every one-shot property of the half it changes (``ONE_SHOT_PATHS``; the other half is the
reference's own). A target that names ``CAUGHT_BY_PAIR`` is caught by that case of the pair
schedule (``properties/rules/sequence_pairs.py``) under the CI profile itself.

Sequences run with fixed settings (derandomized, no database, no shrinking, up to ``SEQUENCES``
sequences, 1000: the deepest zoo target, memo_across_calls, needs four steps in order and is
met after 600 to 800 of them, a figure the derandomized draws move with every change of the
suite's code), each property in a fresh Python process that has loaded every swapspec module
(``tests.fresh_sample``): Hypothesis draws some values from the constants of the local modules
loaded so far, so in a pytest worker the draws would depend on which tests ran there before. One-shot
properties run as subprocess ``pytest`` runs under the CI profile, as in ``tests/test_zoo.py``.
Figures, with shrinking:
``python -m tests.zoo.measure_sequences``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from hypothesis import Phase, settings

from swapspec.properties.harness.checker import ConformanceError
from swapspec.properties.harness.isolation import isolated_global_state
from swapspec.properties.harness.targets import load_target
from swapspec.properties.rules.sequence_machine import STEPS, run_sequences
from swapspec.properties.rules.sequence_pairs import ordered_pairs
from tests.fresh_sample import sample_in_fresh_process
from tests.test_zoo import run_suite, statuses
from tests.zoo import SEQUENCE_ZOO, selector, zoo_module

pytestmark = pytest.mark.slow  # CI-only: each case runs the sequence properties until a zoo target is caught (see pyproject's markers)

SEQUENCES = 1000
FIXED = settings(max_examples=SEQUENCES, derandomize=True, database=None, deadline=None,
                 stateful_step_count=STEPS, phases=[Phase.explicit, Phase.generate])


def sequence_catches(name: str, property_id: str) -> bool:
    """Whether ``property_id``'s derandomized sequences (``FIXED``) fail on the zoo target
    ``name``, run in this process (``tests.fresh_sample`` calls it in a fresh one)."""
    with isolated_global_state(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            run_sequences(load_target(selector(name)), property_id, settings_=FIXED)
        except ConformanceError:
            return True
    return False


@pytest.mark.parametrize("name", SEQUENCE_ZOO)
def test_sequence_zoo_target_is_caught_by_a_sequence(name: str) -> None:
    """Rule: a SEQ property the module names in ``CAUGHT_BY`` fails."""
    zoo = zoo_module(name)
    caught = any(sample_in_fresh_process("tests.test_zoo_sequences:sequence_catches", name, pid)
                 for pid in sorted(zoo.CAUGHT_BY))
    assert caught, f"{name}: no sequence of {sorted(zoo.CAUGHT_BY)} failed in {SEQUENCES} sequences"


PAIR_CAUGHT = tuple(n for n in SEQUENCE_ZOO if hasattr(zoo_module(n), "CAUGHT_BY_PAIR"))


def test_most_of_the_sequence_zoo_is_caught_by_the_pair_schedule() -> None:
    """Rule: at least four sequence zoo targets name the pair schedule case that catches them."""
    assert len(PAIR_CAUGHT) >= 4, PAIR_CAUGHT


@pytest.mark.parametrize("name", PAIR_CAUGHT)
def test_sequence_zoo_target_is_caught_by_the_pair_schedule(name: str, tmp_path: Path) -> None:
    """Rule: under the CI profile the schedule's case ``CAUGHT_BY_PAIR`` fails SEQ-STATE."""
    zoo = zoo_module(name)
    case = f"{zoo.target.name}-{zoo.CAUGHT_BY_PAIR}"
    item = f"properties/rules/test_sequences.py::test_sequence_pair_state[{case}]"
    code, table, tail = run_suite(selector(name), (item,), tmp_path / "report.json")
    assert code == 1 and statuses(table) == {"SEQ-STATE": "fail"}, f"{name}: {table}\n{tail}"


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
        pair = getattr(zoo, "CAUGHT_BY_PAIR", None)
        assert pair is None or pair in dict(ordered_pairs(zoo.target)), name
