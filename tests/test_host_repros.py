"""Repros of host material stand alone: a host conversion's ``imports`` and a host module's import
head the script, and a functional-call repro builds the host's module (``tests.planted.quantized``:
``buggy`` is torch's target with two planted bugs, ``target`` the same without them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import find, settings
from hypothesis import strategies as st

from swapspec.properties.harness import checker
from swapspec.properties.harness.repro import apply_repro, call_repro, retargeted
from swapspec.properties.harness.targets import load_target
from swapspec.properties.models.examples import Example
from swapspec.properties.models.standalone import NoHostSource
from swapspec.properties.vocabulary import Violation
from swapspec.strategies import FlagSetting, HostModule, call_inputs, host_trees, module_trees
from swapspec.strategies.conversions import is_uninitialized
from tests.planted.quantized import Q_LINEARS, QUANTIZE, QLinear
from tests.repro_scripts import run_script

REPO = Path(__file__).resolve().parent.parent
BUGGY = "tests.planted.quantized:buggy"
FOUND = settings(database=None, max_examples=200)


def _head(script: str) -> list[str]:
    """The script's lines before its first definition."""
    lines = script.splitlines()
    return lines[:next(i for i, line in enumerate(lines) if line.startswith("def "))]


def _exit(script: str, tmp_path: Path) -> int:
    run = run_script(script, tmp_path, pythonpath=REPO)
    assert "NameError" not in run.stderr and "ModuleNotFoundError" not in run.stderr, run.stderr
    return run.returncode


def test_a_host_conversions_imports_head_its_repro(tmp_path):
    module = find(module_trees(), lambda m: any(
        not is_uninitialized(p) and p.dim() == 2 and p.is_floating_point()
        for p in m.parameters()), settings=FOUND)
    example = Example(module, conversion=QUANTIZE, flags=FlagSetting(False, False))
    script = apply_repro(example, load_target(BUGGY), [Violation("value", "a matrix kept")])
    assert "from tests.planted.quantized import quantize" in _head(script)
    assert "fn = lambda t: quantize(t)" in script
    assert _exit(script, tmp_path) == 1
    assert _exit(retargeted(script, load_target("tests.planted.quantized:target")), tmp_path) == 0


def test_a_functional_call_repro_builds_the_host_module(tmp_path):
    module = find(host_trees(Q_LINEARS), lambda m: True, settings=FOUND)
    call = find(call_inputs(module, strict=True),
                lambda c: c.invalid is None and "inner.weight" not in c.merged(), settings=FOUND)
    script = call_repro(Example(module, call=call), load_target(BUGGY),
                        [Violation("strict", "strict ignored")])
    assert "from tests.planted.quantized import QLinear" in _head(script)
    assert "HostLeaf('planted.QLinear(seed=0)', inner, _as_args)" in script
    assert _exit(script, tmp_path) == 1
    assert _exit(retargeted(script, load_target("tests.planted.quantized:target")), tmp_path) == 0


def test_a_host_module_a_script_cannot_build_says_why():
    module = find(host_trees(st.just(HostModule("anonymous", lambda: QLinear()))), lambda m: True,
                  settings=FOUND)
    example = Example(module, call=find(call_inputs(module), lambda c: True, settings=FOUND))
    with pytest.raises(NoHostSource, match="'anonymous': its build is no importable"):
        call_repro(example, load_target(BUGGY), [Violation("strict", "strict ignored")])
    text = checker.Checker._repro(lambda v: call_repro(example, load_target(BUGGY), v),
                                  [Violation("strict", "strict ignored")])
    assert text.startswith("# no repro: NoHostSource: host module 'anonymous'")
