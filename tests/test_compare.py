"""``python -m swapspec.properties.harness.compare`` on two real reports, each with a planted bug.

Both reports come from the real properties (CI profile, APPLY-TIES and FC-RESTORE) run against
the two ``tests/planted/pair.py`` targets, which share one name: one declares a tie split, the
other fails FC-RESTORE undeclared. They are made once per module (about 20 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swapspec.properties.harness.compare import DIFFERENT, SAME, UNREADABLE, compare_reports

REPO = Path(__file__).resolve().parents[1]
PROPERTIES = "APPLY-TIES,FC-RESTORE"


def _report(tmp: Path, target: str) -> Path:
    path = tmp / f"{target}.json"
    env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "SWAPSPEC_NO_REPRO": "1",
           "PYTHONPATH": str(REPO), "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp / "hypothesis")}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--swapspec-profile=swapspec-ci", f"--swapspec-target=tests.planted.pair:{target}",
         f"--swapspec-property={PROPERTIES}", f"--swapspec-report={path}", "properties"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("compare")
    return _report(tmp, "ties_declared"), _report(tmp, "no_restore")


def _compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swapspec.properties.harness.compare", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # a pytest run in a subprocess per case: CI-only (see pyproject's markers)
def test_the_planted_reports_differ_where_the_bugs_were_planted(reports):
    a, b = (json.loads(p.read_text()) for p in reports)
    assert a["table"]["APPLY-TIES"]["planted-pair"]["status"] == "deviation"
    assert b["table"]["FC-RESTORE"]["planted-pair"]["status"] == "fail"


def test_diff_names_what_appeared_and_disappeared_and_exits_1(reports):
    proc = _compare(*map(str, reports))
    assert proc.returncode == DIFFERENT, proc.stderr
    out = proc.stdout
    appeared = out.split("appeared in B:")[1].split("disappeared from B:")[0]
    disappeared = out.split("disappeared from B:")[1]
    assert "FC-RESTORE [planted-pair] status fail" in appeared
    assert "FC-RESTORE [planted-pair] failure:" in appeared
    assert "APPLY-TIES [planted-pair] status pass" in appeared
    assert "APPLY-TIES [planted-pair] status deviation" in disappeared
    assert "APPLY-TIES [planted-pair] declared clause parameter-tie-split (x" in disappeared
    assert "APPLY-TIES [planted-pair] declaration shown: planted.apply.tie-split" in disappeared
    assert "FC-RESTORE [planted-pair] status pass" in disappeared


def test_a_report_compared_with_itself_has_no_differences_and_exits_0(reports):
    proc = _compare(str(reports[0]), str(reports[0]))
    assert (proc.returncode, proc.stdout.splitlines()[-1]) == (SAME, "no differences")


def test_count_changes_are_listed_and_presence_ignores_them(reports, tmp_path):
    report = json.loads(reports[0].read_text())
    cell = report["table"]["APPLY-TIES"]["planted-pair"]
    cell["deviations"]["parameter-tie-split"] += 5
    more = tmp_path / "more.json"
    more.write_text(json.dumps(report))
    n = cell["deviations"]["parameter-tie-split"]
    proc = _compare(str(reports[0]), str(more))
    assert proc.returncode == DIFFERENT
    assert (f"APPLY-TIES [planted-pair] declared clause parameter-tie-split: {n - 5} -> {n}"
            in proc.stdout)
    proc = _compare("--presence", str(reports[0]), str(more))
    assert (proc.returncode, proc.stdout.splitlines()[-1]) == (SAME, "no differences in presence")


def test_a_file_that_is_not_a_report_exits_2_with_one_line(reports, tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text('{"tests": []}')
    proc = _compare(str(reports[0]), str(junk))
    assert proc.returncode == UNREADABLE
    assert proc.stderr.strip() == f"compare: {junk}: not a swapspec report (no 'table'; write one with pytest --swapspec-report=PATH)"
    assert _compare(str(reports[0]), str(tmp_path / "missing.json")).returncode == UNREADABLE


def test_a_cell_run_on_one_side_only_is_named():
    a = {"torch": "2.3.0", "table": {"APPLY-TIES": {"torch": {"status": "pass"}}}}
    b = {"torch": "2.14.1", "table": {"APPLY-TIES": {"torch": {"status": "pass"}},
                                      "FC-TIES": {"torch": {"status": "skipped", "reason": "r"}}}}
    whats = {(c.kind, c.property_id, c.what) for c in compare_reports(a, b)}
    assert whats == {("appeared", "FC-TIES", "cell (property x target run)"),
                     ("appeared", "FC-TIES", "status skipped"),
                     ("appeared", "FC-TIES", "skipped (r)")}


def test_table_puts_one_targets_cells_side_by_side(reports):
    proc = _compare("--table", "planted-pair", *map(str, reports))
    lines = proc.stdout.splitlines()
    assert proc.returncode == DIFFERENT
    assert lines[0].startswith("| property | torch ") and len(lines) == 4
    assert lines[2].startswith("| `APPLY-TIES` | dev (deviations seen: parameter-tie-split x")
    assert lines[2].endswith(" | pass |")
    assert lines[3].startswith("| `FC-RESTORE` | pass | FAIL (broken: [not-restored]")
