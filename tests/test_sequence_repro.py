"""A failing sequence's repro is standalone: in a fresh interpreter it fails on the target
and passes once the target is swapped for the reference.

The sequences come from zoo targets, run in-process with fixed settings (derandomized, no
database, no shrinking): ``tests/zoo/grads_lost_after_training.py`` (a conversion step breaks the state) and
``tests/zoo/load_commit_as_you_go.py`` (a load step does: it writes keys before it fails).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from swapspec.properties.harness.checker import ConformanceError
from swapspec.properties.harness.targets import builtin_target, load_target
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.rules.sequence_machine import (
    STATE,
    STEPS,
    SequenceMachine,
    repro_of,
    run_sequences,
    steps_in,
)
from swapspec.strategies import build_tree
from tests.test_module_model_ties import FLAT, X, _Scripted

pytestmark = pytest.mark.slow  # CI-only: two cases run up to 300 sequences until a zoo target is caught, and each runs its repro in a subprocess (see pyproject's markers)
ROOT = Path(__file__).resolve().parents[1]
ZOO = "tests.zoo.grads_lost_after_training:target"
LOAD_ZOO = "tests.zoo.load_commit_as_you_go:target"
# as tests/test_zoo_sequences.py catches the zoo (300 sequences); no shrinking, for time: the
# repro of the first failing sequence is as standalone as a shrunk one
FIXED = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                 stateful_step_count=STEPS, phases=(Phase.explicit, Phase.generate))


def _run(script: str, path: Path) -> subprocess.CompletedProcess:
    path.write_text(script)
    return subprocess.run([sys.executable, str(path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False, env={"PYTHONPATH": str(ROOT), "PATH": ""})


def _repro_of_failing_sequence(selector: str) -> tuple[str, str]:
    """(the message, the repro script) of the first failing SEQ-STATE sequence on ``selector``."""
    with pytest.raises(ConformanceError) as caught:
        run_sequences(load_target(selector), STATE, settings_=FIXED)
    return str(caught.value), repro_of(caught.value)


def _assert_fails_on_target_only(selector: str, script: str, tmp_path: Path) -> None:
    assert steps_in(script) >= 1 and script.rstrip().splitlines()[-1].startswith("assert ")
    on_target = _run(script, tmp_path / "repro_target.py")
    assert on_target.returncode != 0 and "AssertionError" in on_target.stderr, on_target.stderr
    on_reference = _run(script.replace(repr(selector), repr("reference")),
                        tmp_path / "repro_ref.py")
    assert on_reference.returncode == 0, on_reference.stderr[-2000:]


@pytest.mark.slow  # a pytest run in a subprocess per case: CI-only (see pyproject's markers)
def test_failing_sequence_prints_a_standalone_asserting_repro(tmp_path: Path) -> None:
    """Rule: the script ends in an assert that fails on the target and passes on the reference."""
    _, script = _repro_of_failing_sequence(ZOO)
    _assert_fails_on_target_only(ZOO, script, tmp_path)


def test_failing_load_step_prints_a_standalone_asserting_repro(tmp_path: Path) -> None:
    """Rule: a sequence failing at a load step prints the load (the state dict as given, the
    flags) in a script that fails on the target and passes on the reference."""
    message, script = _repro_of_failing_sequence(LOAD_ZOO)
    assert "at step 'load_state_dict'" in message, message[:2000]
    assert "target.load_state_dict(module, sd, strict=True" in script
    _assert_fails_on_target_only(LOAD_ZOO, script, tmp_path)


@settings(max_examples=1, database=None, deadline=None)
@given(st.none())  # a machine's steps record Hypothesis events: they run inside a test
def test_tie_untie_and_vmap_steps_print_plain_torch_lines(_: None) -> None:
    """Rule: a tie, an untie and a vmap step print plain torch lines (``setattr`` on the
    slot's owner, ``torch.func.vmap`` of ``torch.func.functional_call``) that run standalone
    and leave the module as the sequence did."""
    machine = SequenceMachine.for_target(builtin_target("torch"), STATE)()
    machine.build(build_tree(FLAT), (X,), [conversion_named("double()")])
    machine.tie(_Scripted("tie", machine.model.tie_choices()[0]))
    machine.tie(_Scripted("untie", machine.model.untie_choices()[0]))
    machine.vmap(_Scripted([0, 2]))
    assert machine.judged
    script = machine.script([])
    assert "setattr(module.get_submodule(''), 'p0', named(module)['p1'])" in script
    assert "torch.nn.Parameter(named(module)['p0'].detach().clone()" in script
    assert "out = torch.func.vmap(lambda p, x: torch.func.functional_call(module, p, (x,), {})" \
        in script
    checked = script + "\nassert error is None and out.shape == (2, *x.shape)\n"
    checked += "assert named(module)['p0'] is not named(module)['p1']\n"
    done = subprocess.run([sys.executable, "-c", checked], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
