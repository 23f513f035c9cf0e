"""Tests of ``.mutation/ledger.py``: which functions of reference/ a mutation run must cover."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_ledger", ROOT / ".mutation" / "ledger.py")
ledger = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ledger)

SOURCE = '''
def plain(x):
    def nested():
        return x
    return nested()

class Box:
    def put(self, x):
        return x + 1
'''


def test_names_follow_mutmut_top_level_functions_and_methods_only():
    names = [name for name, _ in ledger.mutmut_names(SOURCE)]
    assert names == ["x_plain", "xǁBoxǁput"]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "mod.py").write_text(SOURCE)
    monkeypatch.setattr(ledger, "ROOT", tmp_path)
    monkeypatch.setattr(ledger, "LEDGER", tmp_path / "ledger.json")
    monkeypatch.setattr(ledger, "EQUIVALENT", tmp_path / "equivalent.md")
    return tmp_path

RESULTS = """
    swapspec.reference.mod.x_plain__mutmut_1: killed
    swapspec.reference.mod.x_plain__mutmut_2: no tests
    swapspec.reference.mod.xǁBoxǁput__mutmut_1: timeout
    swapspec.reference.mod.xǁBoxǁput__mutmut_2: survived
"""


def test_everything_is_stale_before_a_run_and_nothing_after_it_is_recorded(tree):
    assert len(ledger.stale_functions({}, ledger.fingerprints())) == 2
    ledger.LEDGER.write_text(json.dumps(ledger.record(RESULTS)))
    assert ledger.stale_functions(ledger.load_ledger(), ledger.fingerprints()) == []


def test_a_changed_function_is_stale_and_its_neighbour_is_not(tree):
    ledger.LEDGER.write_text(json.dumps(ledger.record(RESULTS)))
    path = tree / "reference" / "mod.py"
    path.write_text(SOURCE.replace("x + 1", "x + 2"))
    assert ledger.stale_functions(ledger.load_ledger(), ledger.fingerprints()) == [
        "swapspec.reference.mod.xǁBoxǁput"]


def test_no_tests_is_counted_apart_and_timeout_as_killed(tree):
    counts = ledger.counts_by_function(ledger.parse_results(RESULTS), set())
    assert counts["swapspec.reference.mod.x_plain"]["untested"] == 1
    assert counts["swapspec.reference.mod.x_plain"]["survived"] == 0
    assert counts["swapspec.reference.mod.xǁBoxǁput"]["killed"] == 1
    percent, unmeasured = ledger.score(RESULTS)
    assert (percent, unmeasured) == (pytest.approx(100 * 2 / 3), [])


def test_a_listed_equivalent_leaves_the_score_and_an_unrun_function_is_unmeasured(tree):
    ledger.EQUIVALENT.write_text("- `swapspec.reference.mod.xǁBoxǁput__mutmut_2` (reason)\n")
    percent, _ = ledger.score(RESULTS)
    assert percent == 100.0
    partial = "    swapspec.reference.mod.x_plain__mutmut_1: killed\n" \
              "    swapspec.reference.mod.xǁBoxǁput__mutmut_1: not checked\n"
    assert ledger.score(partial)[1] == ["swapspec.reference.mod.xǁBoxǁput"]
    assert "swapspec.reference.mod.xǁBoxǁput" not in ledger.record(partial)


def test_a_function_without_mutants_in_a_covered_module_is_recorded_with_zero_counts(tree):
    """A function mutmut made no mutant of is measured once the results cover its module; one
    in a module the results do not cover stays stale."""
    (tree / "reference" / "other.py").write_text("def untouched(x):\n    return x\n")
    only_plain = "    swapspec.reference.mod.x_plain__mutmut_1: killed\n"
    recorded = ledger.record(only_plain)
    assert recorded["swapspec.reference.mod.xǁBoxǁput"]["mutants"] == 0
    assert "swapspec.reference.other.x_untouched" not in recorded
    ledger.LEDGER.write_text(json.dumps(recorded))
    assert ledger.stale_functions(ledger.load_ledger(), ledger.fingerprints()) == [
        "swapspec.reference.other.x_untouched"]
