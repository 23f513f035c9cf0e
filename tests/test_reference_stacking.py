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


@pytest.mark.parametrize("depart, message", [
    (lambda ms: ms.clear(), "at least one model"),
    (lambda ms: ms.__setitem__(1, nn.ModuleList(ms[1])), "same class."),
    (lambda ms: ms[1].__setitem__(1, nn.LayerNorm(3)), "LayerNorm at '1'"),
    (lambda ms: ms[1].eval(), "training/eval mode"),
    (lambda ms: ms[1][1].eval(), "at '1'"),
    (lambda ms: ms[1][0].weight.requires_grad_(False), ".requires_grad"),
    (lambda ms: ms[1].register_buffer("extra", torch.zeros(1)), "['extra']"),
    (lambda ms: ms[0].register_buffer("extra", torch.zeros(1)), "['extra']"),
    (lambda ms: ms[1].double(), ".dtype"),
    (lambda ms: ms.__setitem__(1, nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4))), ".shape"),
])
def test_models_that_are_not_alike_are_refused_naming_the_difference(depart, message):
    models = pair()
    depart(models)
    before = [{n: t.clone() for n, t in m.state_dict().items()} for m in models]
    with pytest.raises(RuntimeError, match="stack_module_state") as raised:
        reference.stack_module_state(models)
    assert message in str(raised.value)
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
