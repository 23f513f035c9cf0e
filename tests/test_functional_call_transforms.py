"""Unit tests for the helpers of ``FC-FUNC-GRAD`` (``properties/rules/
test_functional_call_transforms.py``): which modules ``torch.func`` can transform, the gradient
comparison, and the two gradient paths on a plain module."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from swapspec.properties.harness.targets import builtin_target
from swapspec.properties.models.examples import Example
from swapspec.properties.models.invariants import input_for
from swapspec.properties.rules.test_functional_call_transforms import (
    _stack_repro,
    backward_grads,
    differing,
    given_parameters,
    summed_call,
    tolerance,
    transformable,
)
from swapspec.strategies import CallInput
from swapspec.strategies.ensembles import Ensemble, ensemble_models, skeleton_of
from swapspec.strategies.trees import LeafSpec, TieSpec, TreeSpec, build_tree
from tests.repro_scripts import run_script


def two_layers() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))


@pytest.mark.parametrize("hook", ["full", "full-pre", "old", "none"])
def test_a_module_with_a_full_backward_hook_is_not_transformable(hook):
    module = two_layers()
    if hook == "full":
        module[2].register_full_backward_hook(lambda *a: None)
    elif hook == "full-pre":
        module.register_full_backward_pre_hook(lambda *a: None)
    elif hook == "old":
        module[0].register_backward_hook(lambda *a: None)
    assert transformable(module) is (hook in ("old", "none"))


def test_torch_func_cannot_transform_a_full_backward_hook():
    """The limit ``transformable`` reads: fails once torch.func runs BackwardHookFunction."""
    module = two_layers()
    module.register_full_backward_hook(lambda *a: None)
    params = {n: p.detach().clone() for n, p in module.named_parameters()}
    with pytest.raises(RuntimeError, match=r"autograd\.Function"):
        torch.func.grad(lambda ps: torch.func.functional_call(module, ps, (torch.ones(2, 3),)).sum())(params)


@pytest.mark.parametrize("target_name", ["reference", "torch"])
def test_both_gradient_paths_agree_on_a_plain_module(target_name):
    module = two_layers()
    target = builtin_target(target_name)
    params = given_parameters(module)
    loss = summed_call(target, module, {}, torch.linspace(-1, 1, 6).reshape(2, 3))
    assert not differing(torch.func.grad(loss)(params), backward_grads(loss, params), 1e-5)


def test_differing_names_a_gradient_off_by_more_than_the_tolerance_and_not_a_shared_nan():
    want = {"a": torch.tensor([1.0, float("nan")]), "b": torch.tensor([1.0, 2.0])}
    got = {"a": torch.tensor([1.0, float("nan")]), "b": torch.tensor([1.0, 2.1])}
    assert differing(got, want, 1e-3) == ["b"]
    assert differing(got, want, 1e-1) == []
    assert differing({"a": want["a"]}, want, 1e-1) == ["b"]


def test_the_tolerance_is_the_least_precise_dtypes():
    module = two_layers()
    assert tolerance(module) == 1e-4
    module[2].half()
    assert tolerance(module) == 1e-2


TIED_ENCODER = TreeSpec(
    seed=0, root=LeafSpec(kind="catalogue", entry="nn.TransformerEncoder", variant=0),
    ties=(TieSpec(slots=(("inner.layers.0.self_attn", "in_proj_weight"),
                         ("inner.layers.1.self_attn", "in_proj_weight"))),))
META_ENSEMBLE = Ensemble(size=2, container="list", skeleton="meta", unlike=None, pick=0)


def test_the_meta_skeleton_keeps_ties_that_torchs_to_meta_splits():
    """``skeleton_of``'s ``meta`` copy keeps one object per tie; the tutorial's
    ``deepcopy(model).to('meta')`` gives each tied slot a parameter of its own."""
    models = ensemble_models(build_tree(TIED_ENCODER), META_ENSEMBLE)
    layers = skeleton_of(models, META_ENSEMBLE).inner.layers
    assert layers[0].self_attn.in_proj_weight is layers[1].self_attn.in_proj_weight
    assert layers[0].self_attn.in_proj_weight.is_meta
    split = copy.deepcopy(models[0]).to("meta").inner.layers
    assert split[0].self_attn.in_proj_weight is not split[1].self_attn.in_proj_weight


def test_the_vmapped_repro_of_a_tied_meta_skeleton_passes_on_torch(tmp_path):
    module = build_tree(TIED_ENCODER)
    models = ensemble_models(module, META_ENSEMBLE)
    example = Example(module, call=CallInput({}, (input_for(module),), {}), method=META_ENSEMBLE)
    script = _stack_repro(example, builtin_target("torch"), META_ENSEMBLE, vmapped=True)
    assert "skeleton = root" in script and models
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
