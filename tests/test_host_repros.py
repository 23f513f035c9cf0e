"""Repros of host material stand alone: a host conversion's ``imports`` and a host module's import
head the script, and a functional-call repro builds the host's module (``tests.planted.quantized``:
``buggy`` is torch's target with two planted bugs, ``target`` the same without them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import find, settings
from hypothesis import strategies as st
from torch import nn

from swapspec.properties.declarations.torch import TORCH_DEVIATIONS
from swapspec.properties.harness import checker
from swapspec.properties.harness.repro import HELPERS, apply_repro, call_repro, retargeted
from swapspec.properties.harness.targets import builtin_target, load_target, torch_apply
from swapspec.properties.models import standalone
from swapspec.properties.models.examples import Example
from swapspec.properties.models.standalone import NoHostSource
from swapspec.properties.vocabulary import Violation
from swapspec.strategies import (
    Conversion,
    FlagSetting,
    HostModule,
    call_inputs,
    host_trees,
    module_trees,
)
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


def test_the_readme_documents_builtin_target_and_every_conversion_field():
    text = " ".join((REPO / "README.md").read_text().split())
    assert "`builtin_target` gives it" in text
    assert f"({len(builtin_target('torch').deviations)} in torch 2.13" in text
    assert f"`TORCH_DEVIATIONS` alone holds {len(TORCH_DEVIATIONS)}" in text
    assert all(f"`{field.name}`" in text for field in dataclasses.fields(Conversion))
    assert "The function must accept its own output" in text


@pytest.mark.parametrize("swap", [False, True])
def test_apply_hands_a_conversion_its_own_output_at_a_tie(swap):
    """What the README's rule rests on: torch's ``_apply`` on its default and swap paths."""
    module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    module[1].weight = module[0].weight
    seen = []

    def fn(t):
        seen.append(t.dtype)
        return t.double()

    torch_apply(module, fn, overwrite=False, swap=swap)
    assert seen == [torch.float32, torch.float32, torch.float64, torch.float32]


def test_a_repro_describes_a_subclass_by_its_parts():
    namespace = {"torch": torch, "nn": nn}
    exec("\n".join(standalone.definitions({"describe"}, HELPERS)), namespace)
    weight = QLinear().weight
    text = namespace["describe"](weight)
    assert text.startswith("a new object: QTensor(torch.float32, cpu, (4, 4), requires_grad=False)")
    assert str(weight.qdata.reshape(-1).tolist()) in text and "'context': 'None'" in text
    other = namespace["describe"](QLinear(seed=1).weight)
    assert other != text  # values the class cannot list still tell two tensors apart
