"""Tests of ``.mutation/summary.py``: parsing mutmut's results and scoring against the equivalents file."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_summary", ROOT / ".mutation" / "summary.py")
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)

RESULTS = """\
    reference.apply.x_apply__mutmut_1: killed
    reference.apply.x_apply__mutmut_2: survived
    reference.apply.x_apply__mutmut_3: survived
    reference.apply.x_apply__mutmut_4: timeout
not a result line
"""


def test_parse_results_reads_name_and_status() -> None:
    parsed = summary.parse_results(RESULTS)
    assert parsed == {
        "reference.apply.x_apply__mutmut_1": "killed",
        "reference.apply.x_apply__mutmut_2": "survived",
        "reference.apply.x_apply__mutmut_3": "survived",
        "reference.apply.x_apply__mutmut_4": "timeout",
    }


def test_listed_survivor_counts_as_equivalent_and_others_stay_survived(tmp_path: Path) -> None:
    equivalent = tmp_path / "equivalent.md"
    equivalent.write_text("- `reference.apply.x_apply__mutmut_2` (a change): a reason\n")
    names = summary.equivalent_names(equivalent)
    counts = summary.summarize(summary.parse_results(RESULTS), names)
    assert dict(counts) == {"killed": 1, "equivalent": 1, "survived": 1, "timeout": 1}


def test_repo_equivalents_file_lists_only_mutant_names_with_reasons() -> None:
    text = (ROOT / ".mutation" / "equivalent.md").read_text()
    entries = re.findall(r"^- `.*(?:\n  .*)*", text, flags=re.M)  # an entry and its wrapped lines
    assert entries, "no equivalent mutants listed"
    for line in entries:
        name = line.split("`")[1]
        assert re.fullmatch(r"swapspec\.reference\.\w+\.x(_\w+|ǁ\w+ǁ\w+)__mutmut_\d+", name), line
        assert ":" in line.split(name, 1)[1], f"no reason given: {line}"


def test_main_fails_below_the_minimum_score(tmp_path: Path, capsys) -> None:
    results = tmp_path / "results.txt"
    results.write_text(RESULTS)
    equivalent = tmp_path / "equivalent.md"
    equivalent.write_text("- `reference.apply.x_apply__mutmut_2` (a change): a reason\n")
    assert summary.main(str(results), str(equivalent), 95.0) == 1  # 2 of 3 scored: 66.7%
    assert summary.main(str(results), str(equivalent), 60.0) == 0
    out = capsys.readouterr().out
    assert "66.7%" in out and "SURVIVED reference.apply.x_apply__mutmut_3" in out


def test_main_fails_when_nothing_ran(tmp_path: Path) -> None:
    results = tmp_path / "results.txt"
    results.write_text("")
    assert summary.main(str(results), str(tmp_path / "none.md"), 0.0) == 1
