"""The shared example database: a failure one pytest process finds replays in another.

Run 1 searches (the fast host profile) against a planted broken target with
``--swapspec-database`` and fails. Run 2, a fresh process on the same directory, may only
replay saved examples (``tests/planted/replay_only.py``: no generation at all), so its failure
can only come from the database; the same run on an empty database passes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_plugin import PLANTED, TIES, run_pytest

pytestmark = pytest.mark.slow  # CI-only: each case runs pytest twice in subprocesses (see pyproject's markers)

TARGET = f"{PLANTED}:tie_split"
TEST = f"{TIES}[broken-tie-split]"


def _run(tmp: Path, database: Path, profile: str, *extra: str):
    return run_pytest(tmp, TEST, f"--swapspec-target={TARGET}", "-p", profile,
                      f"--swapspec-database={database}", "-q", *extra, timeout=300)


def test_a_failure_found_in_one_process_replays_in_another_from_the_database(tmp_path):
    database = tmp_path / "examples"
    found = run_pytest(tmp_path, TEST, f"--swapspec-target={TARGET}", "-p", "tests.planted.fast_profile",
                       f"--swapspec-database={database}", "-q", timeout=300)
    assert found.returncode == 1, found.output[-2000:]
    assert "broken rule [parameter-tie-split]" in found.output
    assert any(p.is_file() for p in database.rglob("*")), "the failing example was not saved"

    replayed = _run(tmp_path, database, "tests.planted.replay_only")
    assert replayed.returncode == 1, replayed.output[-2000:]
    assert "broken rule [parameter-tie-split]" in replayed.output


def test_replay_only_passes_on_an_empty_database(tmp_path):
    empty = tmp_path / "empty"
    run = _run(tmp_path, empty, "tests.planted.replay_only")
    assert run.returncode == 0, run.output[-2000:]


def test_the_database_is_the_properties_only(tmp_path):
    """A host test in the same run keeps Hypothesis' own database, not swapspec's."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "test_host.py").write_text(
        "from hypothesis import given, strategies as st\n"
        "@given(st.integers())\n"
        "def test_host(x):\n"
        "    assert x < 10\n")
    database = tmp_path / "examples"
    run = run_pytest(tmp_path, "test_host.py", f"--swapspec-database={database}", "-q", cwd=host)
    assert run.returncode == 1, run.output[-2000:]  # the host's own failure
    assert not database.exists() or not any(p.is_file() for p in database.rglob("*"))
    own = tmp_path / "hypothesis"  # HYPOTHESIS_STORAGE_DIRECTORY of run_pytest
    assert any(p.is_file() for p in own.rglob("*")), "the host's failure went nowhere"


def test_saved_examples_replay_on_their_own_target_only(tmp_path):
    database = tmp_path / "examples"
    found = _run(tmp_path, database, "tests.planted.fast_profile")
    assert found.returncode == 1, found.output[-2000:]
    other = run_pytest(tmp_path, f"{TIES}[reference]", "--swapspec-target=reference",
                       "-p", "tests.planted.replay_only", f"--swapspec-database={database}", "-q",
                       timeout=300)
    assert other.returncode == 0, other.output[-2000:]
    assert re.search(r"told to run no (examples|test cases)", other.output), (
        "the reference replayed the broken target's examples: the targets share a database key\n"
        + other.output[-2000:])
