"""The suite's overriding module (``strategies.modules.OwnApplyLeaf``), APPLY-OVERRIDE's check
and torch's declared deviation of it: the check tells a conversion that runs a class's own
``_apply`` work once from one that skips it or runs it twice."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swapspec import reference
from swapspec.properties.declarations.torch_apply import runs_an_override_twice
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.models.examples import Example
from swapspec.properties.rules.test_apply import _check_override
from swapspec.strategies import FlagSetting
from swapspec.strategies.modules import OwnApplyLeaf
from tests.test_module_model_load import _Collected


def _leaf() -> OwnApplyLeaf:
    leaf = OwnApplyLeaf()
    leaf.p0 = nn.Parameter(torch.ones(2))
    leaf.register_buffer("b0", torch.zeros(3, dtype=torch.int64))
    return leaf


def _clauses(leaf: OwnApplyLeaf, before: int, reached: bool = True) -> list[str]:
    check = _Collected()
    _check_override(check, "", leaf, before, reached)
    return [v.clause for v in check.violations]


@pytest.mark.parametrize("convert", [
    lambda m: m.double(),
    lambda m: reference.apply(m, lambda t: t.double() if t.is_floating_point() else t),
], ids=["torch", "reference"])
def test_the_override_runs_once_after_the_conversion(convert) -> None:
    """torch runs the class's ``_apply``; the reference runs its registered description: both
    count one conversion and record the converted tensors."""
    leaf = _leaf()
    convert(leaf)
    assert leaf.conversions == 1
    assert leaf.record == (("p0", "torch.float64", "cpu"), ("b0", "torch.int64", "cpu"))
    assert not _clauses(leaf, 0)


def test_a_conversion_that_skips_the_override_breaks_the_rule() -> None:
    """``nn.Module._apply`` called on the base class (as a host walking modules itself does)
    converts the tensors without the class's work: clause ``override-runs``."""
    leaf = _leaf()
    nn.Module._apply(leaf, lambda t: t.double() if t.is_floating_point() else t)
    assert _clauses(leaf, 0) == ["override-runs"]


def test_work_that_saw_the_tensors_before_the_conversion_breaks_the_rule() -> None:
    """Work done before the tensors are converted records the old dtype: ``override-record``."""
    leaf = _leaf()
    leaf.record_conversion()
    nn.Module._apply(leaf, lambda t: t.double() if t.is_floating_point() else t)
    assert _clauses(leaf, 0) == ["override-record"]


def test_a_module_out_of_reach_runs_no_work() -> None:
    """With ``recurse=False`` a child's override must not run: a run breaks ``override-runs``."""
    leaf = _leaf()
    leaf.double()
    assert _clauses(leaf, 0, reached=False) == ["override-runs"]
    assert not _clauses(leaf, 0, reached=True)


def _example(module: nn.Module, recurse: bool = True) -> Example:
    return Example(module, conversion=conversion_named("double()"), flags=FlagSetting(overwrite=False, swap=False),
                   recurse=recurse)


def test_torch_runs_a_shared_override_twice_where_the_declaration_says() -> None:
    """``torch.apply.runs-shared-override-twice``: its predicate holds exactly where torch's
    traversal reaches an overriding module twice, and torch then counts two runs."""
    shared = _leaf()
    tree = nn.Sequential(nn.Sequential(shared), nn.Sequential(shared))
    assert runs_an_override_twice(_example(tree))
    tree.double()
    assert shared.conversions == 2
    assert not runs_an_override_twice(_example(tree, recurse=False))
    assert not runs_an_override_twice(_example(nn.Sequential(_leaf(), _leaf())))
    reference.apply(tree, lambda t: t.float() if t.is_floating_point() else t)
    assert shared.conversions == 3  # the reference visits a shared module once
