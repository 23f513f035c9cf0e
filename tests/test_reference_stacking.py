"""The reference's ``stack_module_state`` (``reference/stacking.py``): each rule, and where
torch's differs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swapspec import reference
from swapspec.strategies.ensembles import Ensemble, departs, ensemble_models, skeleton_of


def pair(build=lambda: nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))):
    torch.manual_seed(0)
    return [build(), build()]


def test_stacks_parameters_and_buffers_by_name_in_model_order():
    models = pair()
    params, buffers = reference.stack_module_state(models)
    assert list(params) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert list(buffers) == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    for name, stacked in params.items():
        want = torch.stack([m.get_parameter(name).detach() for m in models])
        assert torch.equal(stacked.detach(), want)
        assert stacked.is_leaf and stacked.requires_grad
    assert buffers["1.num_batches_tracked"].dtype == torch.int64
    assert not buffers["1.running_mean"].requires_grad


def test_one_model_stacks_into_a_leading_dimension_of_one():
    model = nn.Linear(2, 3)
    model.bias.requires_grad_(False)
    params, _ = reference.stack_module_state([model])
    assert params["weight"].shape == (1, 3, 2) and params["weight"].requires_grad
    assert not params["bias"].requires_grad
    assert torch.equal(params["weight"][0].detach(), model.weight.detach())


def test_stacked_tensors_share_no_memory_with_the_models():
    models = pair()
    params, buffers = reference.stack_module_state(models)
    with torch.no_grad():
        for t in (*params.values(), *buffers.values()):
            t.fill_(7)
    assert not any(bool((p == 7).all()) for m in models for p in m.parameters())
    assert float(models[0][1].running_var.sum()) == 3.0


def test_tied_weights_stack_under_their_first_name():
    def tied():
        m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        m[1].weight = m[0].weight
        return m
    params, _ = reference.stack_module_state(pair(tied))
    assert list(params) == ["0.weight", "0.bias", "1.bias"]


def _shared_linear():
    linear = nn.Linear(2, 2)
    return nn.Sequential(linear, linear)


PREFIX = "stack_module_state: Expected "


@pytest.mark.parametrize("depart, message", [
    (lambda ms: ms.clear(), "at least one model, got 0."),
    (lambda ms: ms.__setitem__(1, nn.ModuleList(ms[1])), "all models to be of the same class."),
    (lambda ms: ms[1].__setitem__(1, nn.LayerNorm(3)),
     "all models to be of the same class: model 1 has LayerNorm at '1', model 0 has BatchNorm1d."),
    (lambda ms: ms[1].eval(), "all models to have the same training/eval mode."),
    (lambda ms: ms[1][1].eval(),
     "all models to have the same training/eval mode: model 1 differs from model 0 at '1'."),
    (lambda ms: ms[1].add_module("2", nn.Identity()),
     "all models to have the same submodules: model 1 and model 0 differ in ['2']."),
    (lambda ms: ms[1][0].weight.requires_grad_(False),
     "parameter '0.weight' of each model to have the same .requires_grad: model 1 has False, "
     "model 0 has True."),
    (lambda ms: ms[1][0].register_parameter("extra", nn.Parameter(torch.zeros(1))),
     "all models to have the same parameter names: model 1 and model 0 differ in ['0.extra']."),
    (lambda ms: ms[1].register_buffer("extra", torch.zeros(1)),
     "all models to have the same buffer names: model 1 and model 0 differ in ['extra']."),
    (lambda ms: ms[0].register_buffer("extra", torch.zeros(1)),
     "all models to have the same buffer names: model 1 and model 0 differ in ['extra']."),
    (lambda ms: (ms.append(pair()[0]), ms[2].register_buffer("extra", torch.zeros(1))),
     "all models to have the same buffer names: model 2 and model 0 differ in ['extra']."),
    (lambda ms: (ms.append(pair()[0]), ms[2].add_module("2", nn.Identity())),
     "all models to have the same submodules: model 2 and model 0 differ in ['2']."),
    (lambda ms: ms[1].double(),
     "parameter '0.weight' of each model to have the same .dtype: model 1 has "
     "torch.float64, model 0 has torch.float32."),
    (lambda ms: ms[1][1].register_buffer("running_mean", torch.zeros(3, dtype=torch.float64)),
     "buffer '1.running_mean' of each model to have the same .dtype: model 1 has "
     "torch.float64, model 0 has torch.float32."),
    (lambda ms: ms.__setitem__(1, nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4))),
     "parameter '0.weight' of each model to have the same .shape: model 1 has "
     "torch.Size([4, 2]), model 0 has torch.Size([3, 2])."),
    (lambda ms: ms.__setitem__(0, _shared_linear()) or ms.__setitem__(1, nn.Sequential(
        nn.Linear(2, 2), nn.Linear(2, 2))),
     "all models to have the same parameter names: model 1 and model 0 differ in "
     "['1.bias', '1.weight']."),
    (lambda ms: ms.__setitem__(0, nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
     or ms.__setitem__(1, _shared_linear()),
     "all models to have the same parameter names: model 1 and model 0 differ in "
     "['1.bias', '1.weight']."),
])
def test_models_that_are_not_alike_are_refused_naming_the_difference(depart, message):
    models = pair()
    depart(models)
    before = [{n: t.clone() for n, t in m.state_dict().items()} for m in models]
    with pytest.raises(RuntimeError, match="stack_module_state") as raised:
        reference.stack_module_state(models)
    assert str(raised.value).endswith(message) and str(raised.value).startswith(PREFIX)
    for m, saved in zip(models, before, strict=True):
        assert all(torch.equal(saved[n], t) for n, t in m.state_dict().items())


def test_torch_drops_a_name_only_a_later_model_has():
    """The deviation ``torch.stack-module-state-reads-first-model-names``, as torch shows it."""
    models = pair()
    models[1].register_buffer("extra", torch.zeros(1))
    _, buffers = torch.func.stack_module_state(models)
    assert "extra" not in buffers
    with pytest.raises(KeyError):
        torch.func.stack_module_state(models[::-1])


def test_torch_stacks_models_whose_submodules_differ_in_mode():
    """The deviation ``torch.stack-module-state-checks-root-mode-only``."""
    models = pair()
    models[1][1].eval()
    params, _ = torch.func.stack_module_state(models)
    assert params["0.weight"].shape == (2, 3, 2)


def test_an_ensemble_is_scaled_copies_and_leaves_the_module_alone():
    module = nn.Linear(2, 2)
    weight = module.weight.detach().clone()
    models = ensemble_models(module, Ensemble(size=3, container="ModuleList"))
    assert isinstance(models, nn.ModuleList) and len(models) == 3
    assert torch.equal(module.weight.detach(), weight)
    assert torch.allclose(models[2].weight.detach(), weight * 1.5)
    assert skeleton_of(models, Ensemble(skeleton="meta")).weight.is_meta
    assert skeleton_of(models, Ensemble()) is models[0]


@pytest.mark.parametrize("unlike", ["submodule-mode", "requires-grad", "dtype", "mode"])
def test_each_departure_makes_the_models_unlike(unlike):
    module = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
    assert departs(module, unlike)
    with pytest.raises(RuntimeError):
        reference.stack_module_state(ensemble_models(module, Ensemble(unlike=unlike)))


def test_a_departure_needs_what_it_changes():
    bare = nn.Module()
    assert not departs(bare, "submodule-mode")
    assert not departs(bare, "requires-grad")
    assert not departs(bare, "dtype")


def test_the_dtype_departure_converts_a_tied_tensor_once():
    module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    module[1].weight = module[0].weight
    models = ensemble_models(module, Ensemble(unlike="dtype"))
    assert models[1][1].weight.dtype == torch.float64
    with pytest.raises(RuntimeError, match=r"\.dtype"):
        reference.stack_module_state(models)
