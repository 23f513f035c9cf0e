"""Unit tests for the old-style reparametrizations the ``OLD-STYLE-`` properties draw
(``strategies.old_style``), the model they are judged by (``properties.models.old_style_state``)
and torch's declared deviation (``properties.declarations.torch_old_style``); the reference's
removals are tested in ``tests/test_reference_reparametrizations.py``."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from torch import nn
from torch.nn.utils import prune

from swapspec.properties.declarations.torch_old_style import (
    pruning_lost_on_wrapper,
    spectral_norm_removed,
)
from swapspec.properties.models.examples import Example
from swapspec.properties.models.old_style_state import kept_slots, reparametrized_value
from swapspec.properties.models.parametrize_state import matrix_slot, owner_at
from swapspec.strategies import build_tree
from swapspec.strategies.conversions import CONVERSIONS
from swapspec.strategies.old_style import METHODS, OldStyle, Pruning, old_styles
from swapspec.strategies.tree_spec import LeafSpec
from swapspec.strategies.trees import TreeSpec
from tests.helpers_modules import linear
from tests.helpers_old_style import CASES, two_tensor


def _run(lines: list[str], module: nn.Module) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        exec("\n".join(lines), {"torch": torch, "module": module})


@pytest.mark.parametrize("old_style", CASES, ids=str)
def test_repro_source_does_what_apply_does(old_style):
    applied, sourced = linear(4, 3), linear(4, 3)
    rng = torch.get_rng_state()
    old_style.apply(applied, "weight")
    assert torch.equal(torch.get_rng_state(), rng), "apply advanced the caller's RNG"
    _run(old_style.source("module", "weight"), sourced)
    assert applied.state_dict().keys() == sourced.state_dict().keys()
    for key, value in applied.state_dict().items():
        assert torch.equal(value, sourced.state_dict()[key]), key


@pytest.mark.parametrize("old_style", CASES, ids=str)
def test_the_model_reads_what_forward_computes(old_style):
    module = linear(4, 3)
    old_style.apply(module, "weight")
    module(torch.ones(2, 4))
    assert torch.equal(module.weight.detach(), reparametrized_value(module, "weight", old_style))


def test_every_method_is_drawn():
    seen: set[str] = set()

    @settings(max_examples=300, database=None, deadline=None)
    @given(old_styles(2))
    def collect(old_style):
        seen.update(old_style.features)

    collect()
    assert seen == {f"method: {m}" for m in METHODS} | {"pruned twice"}


@given(old_styles(1))
@settings(max_examples=50, database=None, deadline=None)
def test_every_drawn_reparametrization_of_a_vector_applies(old_style):
    module = nn.Module()
    module.v = nn.Parameter(torch.arange(1.0, 7.0))
    old_style.apply(module, "v")
    assert set(module.state_dict()) == set(kept_slots(old_style, "v"))


def test_torchs_prune_remove_loses_the_pruning_on_a_wrapper_subclass():
    """The behaviour ``torch.prune.remove-loses-pruning-on-wrapper`` declares: fails once
    torch writes the pruned value into the inner tensors."""
    module = linear(4, 3)
    prune.l1_unstructured(module, "weight", amount=0.5)
    module._apply(two_tensor)
    prune.remove(module, "weight")
    assert int((module.weight.a == 0).sum()) == 0


def _example(old_style: OldStyle, conversion_name: str) -> Example:
    tree = build_tree(TreeSpec(root=LeafSpec(kind="Linear")))
    path, name = matrix_slot(tree)
    old_style.apply(owner_at(tree, path), name)
    conversion = next(c for c in CONVERSIONS if c.name == conversion_name)
    return Example(tree, conversion=conversion, method=old_style)


@pytest.mark.parametrize(("old_style", "conversion", "applies"), [
    (OldStyle(Pruning("l1_unstructured", amount=0.5)), "TwoTensor", True),
    (OldStyle(Pruning("identity", amount=0.0)), "TwoTensor", False),
    (OldStyle(Pruning("l1_unstructured", amount=0.5)), "double()", False),
    (OldStyle(None), "TwoTensor", False),
])
def test_the_declared_deviation_applies_where_the_pruning_is_lost(old_style, conversion, applies):
    assert pruning_lost_on_wrapper(_example(old_style, conversion)) is applies


def test_torchs_remove_spectral_norm_leaves_its_load_pre_hook():
    """The behaviour ``torch.remove-spectral-norm-leaves-load-pre-hook`` declares: fails once
    torch removes the hook it registered."""
    module = linear(4, 3)
    torch.nn.utils.spectral_norm(module)
    torch.nn.utils.remove_spectral_norm(module)
    assert len(module._load_state_dict_pre_hooks) == 1


@pytest.mark.parametrize("old_style", CASES, ids=str)
def test_the_spectral_norm_deviation_applies_to_spectral_norm_only(old_style):
    assert spectral_norm_removed(_example(old_style, "double()")) is (old_style.norm == "spectral_norm"
                                                                      and old_style.first is None)
