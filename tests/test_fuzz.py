"""A failure a HypoFuzz campaign finds replays in plain pytest from the campaign's database.

The campaign (``python -m swapspec.properties.harness.fuzz run --stop-on-failure``, one HypoFuzz worker)
fuzzes one property against a planted broken target until it has found, shrunk and saved the
failure, then stops; ``fuzz report`` counts the saved failure; a fresh pytest process that may only
replay saved examples (``tests/planted/replay_only.py``) then fails with the same broken rule
from ``--swapspec-database=$HYPOTHESIS_STORAGE_DIRECTORY/examples``, and passes on an empty
database (``tests/test_database.py``).

A worker that dies (a segfault inside the target) is reported with the fuzz target and the repro
of the example it was running, and restarted without that target for the time left.

HypoFuzz 25.11.1 reads ``ConjectureResult.slice_comments``, which Hypothesis releases after
6.157.0 no longer have, so it runs with the pins of ``constraints/fuzz.txt`` (the CI fuzz leg).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_plugin import PLANTED, REPO, TIES, _env, run_pytest

pytest.importorskip("hypofuzz", reason="HypoFuzz is not installed; this test runs in an "
                                       "environment made from constraints/fuzz.txt (CI's fuzz leg)")

TARGET = f"{PLANTED}:tie_split"
TEST = f"{TIES}[broken-tie-split]"
SECONDS = 300  # a bound: the worker finds the failure in its first test cases, and stops
CRASH_SECONDS = 150  # the crash comes at the first example; the other worker gets the rest


def _fuzz(tmp: Path, *command: str, tests: tuple[str, ...] = (TEST,), target: str = TARGET
          ) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swapspec.properties.harness.fuzz", *command, "--", *tests,
         f"--swapspec-target={target}", "-p", "no:xdist", "-p", "no:cacheprovider"],
        cwd=REPO, env=_env(tmp), capture_output=True, text=True, timeout=SECONDS + 240)


def test_a_failure_hypofuzz_finds_replays_in_pytest_from_the_campaign_database(tmp_path):
    campaign = _fuzz(tmp_path, "run", str(SECONDS), "-n", "1", "--stop-on-failure")
    assert campaign.returncode == 0, campaign.stdout[-2000:] + campaign.stderr[-3000:]
    assert "AttributeError" not in campaign.stderr, campaign.stderr[-3000:]
    report = _fuzz(tmp_path, "report")
    assert report.returncode == 0, report.stderr[-3000:]
    found = re.search(r"total: (\d+) test cases, (\d+) failures", report.stdout)
    assert found and int(found.group(2)) >= 1, f"the campaign saved no failure:\n{report.stdout}"
    database = tmp_path / "hypothesis" / "examples"
    replay = run_pytest(tmp_path, TEST, f"--swapspec-target={TARGET}",
                        "-p", "tests.planted.replay_only", f"--swapspec-database={database}",
                        "-q", timeout=300)
    assert replay.returncode == 1, replay.output[-2000:]
    assert "broken rule [parameter-tie-split]" in replay.output, replay.output[-2000:]


def test_a_worker_that_crashes_is_reported_with_its_repro_and_the_other_targets_fuzz_on(
        tmp_path):
    """Two workers, one target each: the crashing target's worker dies at its first example,
    is reported with the target and its repro, and is not restarted on that target; the other
    worker fuzzes on. (One worker holding both targets would reach the crashing one only when
    HypoFuzz's scheduler picks it: the first pick is a coin, later ones favour the target that
    has found behaviours.)"""
    campaign = _fuzz(tmp_path, "run", str(CRASH_SECONDS), "-n", "2",
                     tests=(f"{TIES}[crashing]", f"{TIES}[reference]"),
                     target="reference,tests.planted.crashing")
    assert campaign.returncode == 1, campaign.stdout[-2000:] + campaign.stderr[-3000:]
    crash = re.search(r"fuzz: CRASH \(exit code (-?\d+)\) in (\S+); repro: (\S+)", campaign.stdout)
    assert crash, campaign.stdout[-2000:]
    assert crash.group(2).endswith("test_apply_keeps_ties[crashing]"), crash.group(0)
    assert "importlib.import_module('tests.planted.crashing')" in Path(crash.group(3)).read_text()
    assert "1 crash(es)" in campaign.stdout, campaign.stdout[-2000:]
    report = _fuzz(tmp_path, "report", tests=(f"{TIES}[reference]",), target="reference")
    found = re.search(r"total: (\d+) test cases", report.stdout)
    assert found and int(found.group(1)) > 0, (
        f"the other worker fuzzed nothing:\n{report.stdout}")
