"""The zoo is caught: every zoo target fails the suite under the CI profile; the reference passes.

Each run is a subprocess ``pytest`` of the real property files under
``--swapspec-profile=swapspec-ci`` with a JSON report; a zoo run is restricted (``-p tests.zoo``
and ``SWAPSPEC_ZOO_PROPERTIES``) to the properties its module declares in ``CAUGHT_BY``,
and runs without the shrink phase (``SWAPSPEC_ZOO_NO_SHRINK``: same verdict, derandomized
generation is unchanged), to stay affordable. Figures, with shrinking:
``python -m tests.zoo.measure``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.zoo import NO_SHRINK_ENV, PROPERTIES_ENV, ZOO, selector, zoo_module

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # the whole suite in one process, on a loaded 2-core machine


def run_suite(target: str, paths: tuple[str, ...], report: Path,
              properties: frozenset[str] = frozenset()) -> tuple[int, dict, str]:
    """Run the suite on ``target``; return (exit code, JSON report table, output tail).

    The child gets a clean environment: no inherited ``SWAPSPEC_*``/``PYTEST_*`` settings,
    no repro scripts, no shrinking.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWAPSPEC_", "PYTEST_"))}
    env["SWAPSPEC_NO_REPRO"] = "1"
    env[NO_SHRINK_ENV] = "1"
    if properties:
        env[PROPERTIES_ENV] = ",".join(sorted(properties))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.zoo",
           *paths, f"--swapspec-target={target}", "--swapspec-profile=swapspec-ci",
           f"--swapspec-report={report}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    table = json.loads(report.read_text())["table"] if report.exists() else {}
    return proc.returncode, table, (proc.stdout + proc.stderr)[-3000:]


def statuses(table: dict) -> dict[str, str]:
    """``{property id: status}`` from a one-target report table."""
    return {pid: cell["status"] for pid, row in table.items() for cell in row.values()}


@pytest.mark.parametrize("name", ZOO)
def test_zoo_target_is_caught(name: str, tmp_path: Path) -> None:
    """Rule: the run fails, and at least one failing property is one the module expects."""
    zoo = zoo_module(name)
    code, table, tail = run_suite(selector(name), zoo.PATHS, tmp_path / "report.json",
                                  zoo.CAUGHT_BY)
    failing = {pid for pid, status in statuses(table).items() if status == "fail"}
    assert code == 1, f"{name}: the suite did not fail (exit {code})\n{tail}"
    assert failing & zoo.CAUGHT_BY, (f"{name}: failing {sorted(failing)} include none of "
                                     f"{sorted(zoo.CAUGHT_BY)}\n{tail}")


def test_zoo_declarations() -> None:
    """Rule: every zoo module declares an origin, known property IDs and its paths."""
    for name in ZOO:
        zoo = zoo_module(name)
        assert zoo.ORIGIN and zoo.CAUGHT_BY and zoo.PATHS, name
        assert all(pid.startswith(("APPLY-", "FC-", "TOGETHER-", "LOAD-")) for pid in zoo.CAUGHT_BY)
        assert zoo.target.name.startswith("zoo-"), name


def test_reference_passes_whole_suite(tmp_path: Path) -> None:
    """Rule: the clean reference passes every property under the same profile."""
    code, table, tail = run_suite("reference", ("properties",), tmp_path / "report.json")
    bad = {pid: s for pid, s in statuses(table).items() if s not in ("pass", "skipped")}
    assert code == 0 and table and not bad, f"reference: {bad}\n{tail}"
