"""Unit tests for the three paths of ``reference.load_state_dict`` (rules 4, 5 and 9): what copy,
assign and swap put in a slot, identity on the swap path, and the round trip."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing._internal.two_tensor import TwoTensor

from swapspec.reference.load_state_dict import choose_load_path
from tests.helpers_load import (
    error_of,
    load,
    paths,
    restore_swap_flags,  # noqa: F401  (autouse: the swap flags restored)
    shifted,
)
from tests.helpers_modules import (
    TaggedParameter,
    Tied,
    assert_unchanged,
    fill_grads,
    linear,
    snapshot,
    tagged,
)


def test_rule4_path_choice():
    assert choose_load_path(swap=True, assign=True) == "swap"
    assert choose_load_path(swap=True, assign=False) == "swap"
    assert choose_load_path(swap=False, assign=True) == "assign"
    assert choose_load_path(swap=False, assign=False) == "copy"


def test_rule4_copy_keeps_object_and_cdata():
    module = linear()
    weight, cdata = module.weight, module.weight._cdata
    given = shifted(module)
    load(module, given)
    assert module.weight is weight and weight._cdata == cdata
    assert torch.equal(weight, given["weight"])


def test_rule4_assign_puts_the_value_in_with_the_slots_requires_grad():
    module = linear()
    module.bias.requires_grad_(False)
    given = {"weight": torch.ones(3, 3, dtype=torch.float64), "bias": nn.Parameter(torch.ones(3))}
    load(module, given, assign=True)
    assert isinstance(module.weight, nn.Parameter) and module.weight.dtype == torch.float64
    assert module.weight.requires_grad
    assert module.bias is given["bias"] and not given["bias"].requires_grad


def test_rule4_assign_buffer_is_the_value_itself():
    module = nn.BatchNorm1d(3)
    given = shifted(module)
    load(module, given, assign=True)
    assert module.running_mean is given["running_mean"]


@pytest.mark.parametrize("assign", [False, True], ids=["copy", "assign"])
def test_rule4_swap_keeps_object_with_new_contents(assign):
    module = linear()
    weight, cdata = module.weight, module.weight._cdata
    given = {k: v.double() for k, v in shifted(module).items()}
    load(module, given, swap=True, assign=assign)
    assert module.weight is weight and weight._cdata != cdata
    assert weight.dtype == (torch.float64 if assign else torch.float32)
    assert torch.equal(weight.double(), given["weight"])


def test_rule4_swap_honours_subclass_module_load():
    class Halving(nn.Parameter):
        def module_load(self, other, assign=False):
            return (other / 2).detach()

    module = linear()
    module.weight = Halving(module.weight.detach().clone())
    load(module, {"weight": torch.full((3, 3), 4.0), "bias": torch.zeros(3)}, swap=True)
    assert torch.equal(module.weight.detach(), torch.full((3, 3), 2.0))


def test_rule4_module_load_returning_an_input_is_torchs_error():
    class Lazy(nn.Parameter):
        def module_load(self, other, assign=False):
            return other

    module = linear()
    module.weight = Lazy(module.weight.detach().clone())
    before = snapshot(module)
    text = error_of(lambda: load(module, shifted(module), swap=True))
    assert 'While swapping the parameter named "weight"' in text
    assert "module_load returned one of self or other" in text
    assert_unchanged(before, module)


def test_rule4_swap_honours_torch_function_of_a_subclass():
    calls = []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    module = nn.Module()
    module.register_buffer("b", torch.zeros(2).as_subclass(Watched))
    load(module, {"b": torch.ones(2)}, swap=True)
    assert "module_load" in calls and torch.equal(module.b.as_subclass(torch.Tensor), torch.ones(2))


def test_rule4_two_tensor_value():
    module = linear()
    value = TwoTensor(torch.ones(3, 3), torch.ones(3, 3))
    load(module, {"weight": value, "bias": torch.zeros(3)}, swap=True, assign=True)
    assert isinstance(module.weight, TwoTensor) and isinstance(module.weight, nn.Parameter)


@pytest.mark.parametrize("assign", [False, True], ids=["copy", "assign"])
def test_rule5_swap_keeps_class_attributes_grad_hooks_and_optimizer(assign):
    module = linear()
    module.weight = tagged(module.weight.detach().clone(), "w")
    module.bias.requires_grad_(False)
    fill_grads(module)
    weight, grad = module.weight, module.weight.grad
    fired = []
    weight.register_hook(lambda g: fired.append("hook"))
    weight.register_post_accumulate_grad_hook(lambda p: fired.append("post"))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    load(module, shifted(module), swap=True, assign=assign)
    assert module.weight is weight and weight.tag == "w"
    assert type(weight) is (nn.Parameter if assign else TaggedParameter)
    assert weight.grad is grad and not module.bias.requires_grad
    assert optimizer.param_groups[0]["params"][0] is weight
    module(torch.ones(1, 3)).sum().backward()
    assert fired == ["hook", "post"]


def test_rule5_grad_follows_a_dtype_change():
    module = linear()
    fill_grads(module)
    load(module, {k: v.double() for k, v in module.state_dict().items()}, swap=True, assign=True)
    assert module.weight.grad.dtype == torch.float64


@paths
def test_rule9_round_trip_changes_nothing(swap, assign):
    module = nn.Sequential(Tied(), nn.BatchNorm1d(3), linear())
    module[2].weight = tagged(module[2].weight.detach().clone())
    fill_grads(module)
    before = snapshot(module)
    load(module, module.state_dict(), swap=swap, assign=assign)
    assert module[0].enc.weight is module[0].dec.weight
    if swap:  # new TensorImpls with the same contents
        for state in before:
            for t in [*state.params.values(), *state.buffers.values()]:
                t.cdata = t.obj._cdata
    assert_unchanged(before, module)


def test_rule4_assign_of_a_copy_of_own_data_is_a_new_object():
    module = linear()
    weight = module.weight
    load(module, {k: v.clone() for k, v in module.state_dict().items()}, assign=True)
    assert module.weight is not weight


@paths
def test_rule4_uninitialized_into_uninitialized_is_left_as_it_is(swap, assign):
    module = nn.Sequential(nn.LazyLinear(2))
    weight = module[0].weight
    load(module, module.state_dict(), swap=swap, assign=assign)
    assert module[0].weight is weight and isinstance(weight, nn.UninitializedParameter)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_rule9_old_weight_norm_on_the_swap_path():
    module = nn.utils.weight_norm(linear())
    g = module.weight_g
    given = shifted(module)
    load(module, given, swap=True)
    assert module.weight_g is g and torch.equal(g, given["weight_g"])
    assert torch.allclose(module.weight, torch._weight_norm(module.weight_v, g, 0))
    before = snapshot(module)
    error_of(lambda: load(module, {**given, "bias": torch.ones(5)}, swap=True))
    assert_unchanged(before, module)


def test_rule4_assign_into_a_frozen_parameter_keeps_it_frozen():
    module = linear()
    module.weight.requires_grad_(False)
    load(module, {"weight": torch.ones(3, 3), "bias": torch.ones(3)}, assign=True)
    assert isinstance(module.weight, nn.Parameter) and not module.weight.requires_grad
    assert module.bias.requires_grad


def test_rule4_assign_updates_an_rnns_flat_weights():
    module = nn.LSTM(2, 2)
    load(module, shifted(module), assign=True)
    names = module._flat_weights_names
    assert all(w is getattr(module, n) for w, n in zip(module._flat_weights, names, strict=True))


def test_rule4_module_load_returning_self_is_torchs_error():
    class Selfish(nn.Parameter):
        def module_load(self, other, assign=False):
            return self

    ours, theirs = linear(), linear()
    for module in (ours, theirs):
        module.weight = Selfish(module.weight.detach().clone())
    given = shifted(ours)
    mine = error_of(lambda: load(ours, given, swap=True))
    torch.__future__.set_swap_module_params_on_conversion(True)
    assert mine == error_of(lambda: theirs.load_state_dict(given))
    assert "module_load returned one of self or other, please .detach() the result" in mine


@pytest.mark.parametrize("assign", [False, True])
def test_rule4_module_load_gets_the_assign_flag_as_a_bool(assign):
    seen = []

    class Recording(nn.Parameter):
        def module_load(self, other, assign=False):
            seen.append(assign)
            return super().module_load(other, assign=assign)

    module = linear()
    module.weight = Recording(module.weight.detach().clone())
    load(module, shifted(module), swap=True, assign=assign)
    assert seen == [assign] and type(seen[0]) is bool


def test_rule5_module_load_returning_a_frozen_parameter_gets_the_slots_requires_grad():
    class Frozen(nn.Parameter):
        def module_load(self, other, assign=False):
            return nn.Parameter(other.detach().clone(), requires_grad=False)

    module = linear()
    module.weight = Frozen(module.weight.detach().clone())
    load(module, shifted(module), swap=True)
    assert module.weight.requires_grad


def test_rule5_grad_follows_a_device_change():
    module = linear()
    fill_grads(module)
    load(module, {k: v.to("meta") for k, v in module.state_dict().items()}, swap=True, assign=True)
    assert module.weight.is_meta and module.weight.grad.is_meta


def test_rule4_assign_of_an_alias_with_another_layout_puts_the_value_in():
    module = nn.Module()
    module.register_buffer("square", torch.arange(4.0).reshape(2, 2))
    old = module.square
    transposed = old.detach().t()
    load(module, {"square": transposed}, assign=True)
    assert module.square is transposed and module.square is not old


def test_rule4_assign_of_a_real_value_into_an_uninitialized_slot_puts_it_in():
    module = nn.Module()
    module.w = nn.parameter.UninitializedParameter()
    value = torch.ones(2)
    load(module, {"w": value}, assign=True)
    assert type(module.w) is nn.Parameter and torch.equal(module.w, value)


def test_rule5_a_buffers_grad_goes_with_its_old_contents_as_in_torch():
    ours, theirs = nn.Module(), nn.Module()
    for module in (ours, theirs):
        buffer = torch.ones(2, requires_grad=True)
        (buffer * 2).sum().backward()
        module.register_buffer("b", buffer)
    load(ours, {"b": torch.zeros(2)}, swap=True)
    torch.__future__.set_swap_module_params_on_conversion(True)
    theirs.load_state_dict({"b": torch.zeros(2)})
    assert ours.b.grad is None and theirs.b.grad is None
