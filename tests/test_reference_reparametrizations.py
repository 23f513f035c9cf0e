"""Unit tests for ``reference.reparametrizations``: ``prune_remove``, ``remove_weight_norm`` and
``remove_spectral_norm`` keep the reparametrized value (on a wrapper subclass too), refuse what is not reparametrized
without changing anything, and match torch where torch is right."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swapspec import reference
from swapspec.properties.models.old_style_state import hook_keys, reparametrized_value
from swapspec.strategies.old_style import OldStyle, Pruning
from tests.helpers_modules import assert_unchanged, linear, snapshot
from tests.helpers_old_style import CASES, two_tensor


@pytest.mark.parametrize("old_style", CASES, ids=str)
def test_reference_removal_keeps_the_reparametrized_value_on_a_wrapper_subclass(old_style):
    module = linear(4, 3)
    old_style.apply(module, "weight")
    with torch.no_grad():  # weight_norm's computed weight holds a graph over g and v until then
        module(torch.ones(2, 4))
    module._apply(two_tensor)
    value = reparametrized_value(module, "weight", old_style)
    kept = module._parameters.get("weight_orig") if old_style.first is not None else None
    remove = getattr(reference, old_style.removal)
    remove(module, "weight")
    assert type(module.weight) is type(two_tensor(torch.zeros(1)))
    assert torch.equal(module.weight.a, value.a) and torch.equal(module.weight.b, value.b)
    assert kept is None or module.weight is kept
    assert set(module.state_dict()) == {"weight", "bias"}
    assert not any(hook_keys(module).values()), hook_keys(module)


@pytest.mark.parametrize("removal", ["prune_remove", "remove_weight_norm", "remove_spectral_norm"])
def test_reference_removal_of_what_is_not_there_raises_and_changes_nothing(removal):
    module = linear(4, 3)
    OldStyle(None if removal == "prune_remove" else Pruning("l1_unstructured")).apply(module, "weight")
    before, hooks = snapshot(module), hook_keys(module)
    with pytest.raises(ValueError, match="'weight'"):
        getattr(reference, removal)(module, "weight")
    assert_unchanged(before, module)
    assert hook_keys(module) == hooks


@pytest.mark.parametrize("old_style", [c for c in CASES if c.first is None], ids=str)
def test_reference_removal_of_a_norm_matches_torch_on_a_plain_module(old_style):
    ours, theirs = linear(4, 3), linear(4, 3)
    for m in (ours, theirs):
        old_style.apply(m, "weight")
        m(torch.ones(2, 4))  # a training forward: spectral_norm's power iteration
    getattr(reference, old_style.removal)(ours, "weight")
    getattr(torch.nn.utils, old_style.removal)(theirs, "weight")
    assert type(ours.weight) is type(theirs.weight) is nn.Parameter
    assert torch.equal(ours.weight, theirs.weight)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert not ours._forward_pre_hooks and not theirs._forward_pre_hooks


@pytest.mark.parametrize("name", ["weight", None])
def test_reference_norm_removals_default_to_weight(name):
    """Called without ``name``, each removal makes ``weight``'s norm permanent."""
    for old_style in (OldStyle(None, norm_dim=0), OldStyle(None, norm="spectral_norm")):
        module = linear(4, 3)
        old_style.apply(module, "weight")
        remove = getattr(reference, old_style.removal)
        remove(module) if name is None else remove(module, name)
        assert set(module._parameters) == {"weight", "bias"}, old_style
