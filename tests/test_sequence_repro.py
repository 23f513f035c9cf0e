"""A failing sequence's repro is standalone: in a fresh interpreter it fails on the target
and passes once the target is swapped for the reference.

The sequence comes from a sequence zoo target (``tests/zoo/grads_lost_after_training.py``), run
in-process with fixed settings (derandomized, no database).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from swapspec.properties.deviations import ConformanceError
from swapspec.properties.sequences import STATE, STEPS, repro_of, run_sequences, steps_in
from swapspec.properties.targets import load_target

ROOT = Path(__file__).resolve().parents[1]
ZOO = "tests.zoo.grads_lost_after_training:target"
FIXED = settings(max_examples=100, derandomize=True, database=None, deadline=None,
                 stateful_step_count=STEPS)


def _run(script: str, path: Path) -> subprocess.CompletedProcess:
    path.write_text(script)
    return subprocess.run([sys.executable, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False, env={"PYTHONPATH": str(ROOT), "PATH": ""})


def test_failing_sequence_prints_a_standalone_asserting_repro(tmp_path: Path) -> None:
    """Rule: the script ends in an assert that fails on the target and passes on the reference."""
    with pytest.raises(ConformanceError) as caught:
        run_sequences(load_target(ZOO), STATE, settings_=FIXED)
    script = repro_of(caught.value)
    assert steps_in(script) >= 1 and script.rstrip().splitlines()[-1].startswith("assert ")
    on_target = _run(script, tmp_path / "repro_target.py")
    assert on_target.returncode != 0 and "AssertionError" in on_target.stderr, on_target.stderr
    on_reference = _run(script.replace(repr(ZOO), repr("reference")), tmp_path / "repro_ref.py")
    assert on_reference.returncode == 0, on_reference.stderr[-2000:]
