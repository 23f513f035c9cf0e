"""Unit tests for the atomicity of ``reference.load_state_dict`` (rule 8): a load that fails leaves
the module as it was, whatever its hooks did meanwhile."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from tests.helpers_load import (
    error_of,
    load,
    paths,
    restore_swap_flags,  # noqa: F401  (autouse: the swap flags restored)
    shifted,
)
from tests.helpers_modules import (
    Tied,
    assert_unchanged,
    fill_grads,
    linear,
    snapshot,
)


@pytest.mark.parametrize("strict", [True, False])
@paths
def test_rule8_a_bad_key_leaves_the_module_as_it_was(swap, assign, strict):
    module = nn.Sequential(linear(), Tied())
    fill_grads(module)
    given = {k: v + 1 for k, v in module.state_dict().items()}
    given["1.dec.bias"] = torch.zeros(7)  # the last key: everything before it was written
    before = snapshot(module)
    error_of(lambda: load(module, given, strict=strict, swap=swap, assign=assign))
    assert_unchanged(before, module)


@paths
def test_rule8_a_missing_key_leaves_the_module_as_it_was(swap, assign):
    module = nn.Sequential(linear(), linear())
    given = shifted(module)
    del given["1.bias"]
    before = snapshot(module)
    error_of(lambda: load(module, given, swap=swap, assign=assign))
    assert_unchanged(before, module)


def test_rule8_refused_swap_rolls_back():
    module = nn.Sequential(linear(), linear())
    keep = weakref.ref(module[1].weight)  # swap_tensors refuses a tensor with a weakref
    before = snapshot(module)
    text = error_of(lambda: load(module, shifted(module), swap=True))
    assert 'While swapping the parameter named "1.weight"' in text and "weakref" in text
    assert_unchanged(before, module)
    assert keep() is module[1].weight


def test_rule8_hook_error_rolls_back_and_propagates():
    module = nn.Sequential(linear(), linear())

    def boom(module, keys):
        raise KeyError("boom")

    module.register_load_state_dict_post_hook(boom)
    before = snapshot(module)
    with pytest.raises(KeyError, match="boom"):
        load(module, shifted(module), assign=True)
    assert_unchanged(before, module)


def test_rule8_post_hook_returning_a_value_is_torchs_assertion():
    module = linear()
    module.register_load_state_dict_post_hook(lambda m, keys: 1)
    before = snapshot(module)
    with pytest.raises(AssertionError, match="not expected to return new values"):
        load(module, shifted(module))
    assert_unchanged(before, module)


def test_rule8_extra_state_and_given_parameter_restored():
    class WithExtra(nn.Linear):
        extra = 0

        def get_extra_state(self):
            return self.extra

        def set_extra_state(self, state):
            self.extra = state

    module = WithExtra(2, 2)
    given = {"weight": nn.Parameter(torch.ones(2, 2), requires_grad=False),
             "bias": torch.zeros(5), "_extra_state": 9}
    error_of(lambda: load(module, given, assign=True))
    assert module.extra == 0 and not given["weight"].requires_grad
    assert module.weight is not given["weight"]


def test_rule8_lazy_materialization_rolled_back():
    module = nn.Sequential(nn.LazyLinear(2), linear(2, 2))
    given = {"0.weight": torch.ones(2, 4), "0.bias": torch.ones(2), "1.weight": torch.ones(9)}
    error_of(lambda: load(module, given, strict=False))
    assert isinstance(module[0].weight, nn.UninitializedParameter)
    load(module, {**given, "1.weight": torch.ones(2, 2), "1.bias": torch.ones(2)})
    assert module[0].weight.shape == (2, 4) and type(module[0].weight) is nn.Parameter


def test_rule8_rnn_flat_weights_follow_the_rollback():
    module = nn.LSTM(2, 2)
    weights = list(module._flat_weights)
    given = shifted(module)
    given["bias_hh_l0"] = torch.zeros(3)
    error_of(lambda: load(module, given, assign=True))
    assert all(a is b for a, b in zip(module._flat_weights, weights, strict=True))


class Marked(nn.Parameter):
    """A Parameter subclass a hook may turn a parameter into."""


def meddling_pre_hook(module, state_dict, prefix, *rest):
    """Changes everything a hook can change on the module's tensors, before the load fails."""
    weight = module.weight
    weight.__class__ = Marked
    weight.note = "added"
    weight.requires_grad_(False)
    weight.grad = None
    with torch.no_grad():
        module.bias.add_(5)
    module.running.data = torch.zeros(7)
    module._parameters["extra"] = nn.Parameter(torch.ones(1))
    module._non_persistent_buffers_set.add("running")
    module._parameters["weight"] = nn.Parameter(torch.zeros(3, 3))


def test_rule8_rollback_undoes_what_hooks_did_to_tensors_and_slots():
    module = linear()
    module.register_buffer("running", torch.arange(3.0))
    fill_grads(module)
    weight, grad = module.weight, module.weight.grad
    running_data = module.running.data
    module.register_load_state_dict_pre_hook(meddling_pre_hook)
    before = snapshot(module)
    given = {"weight": torch.ones(3, 3), "bias": torch.zeros(9), "running": torch.ones(3)}
    error_of(lambda: load(module, given))
    assert module._parameters["weight"] is weight and type(weight) is nn.Parameter
    assert "note" not in weight.__dict__ and weight.requires_grad and weight.grad is grad
    assert module.running.data.data_ptr() == running_data.data_ptr()
    assert "extra" not in module._parameters and "running" not in module._non_persistent_buffers_set
    assert_unchanged(before, module)


def emptying_pre_hook(module, state_dict, prefix, *rest):
    module._parameters["bias"] = None
    module._buffers["running"] = torch.full((3,), 9.0)


def test_rule8_rollback_puts_back_none_and_rebound_slots():
    module = linear()
    module.register_buffer("running", torch.arange(3.0))
    bias, running = module.bias, module.running
    module.register_load_state_dict_pre_hook(emptying_pre_hook)
    before = snapshot(module)
    error_of(lambda: load(module, {"weight": torch.ones(2), "running": torch.ones(3)},
                          strict=False))
    assert module.bias is bias and module.running is running
    assert_unchanged(before, module)


def test_rule8_rollback_puts_back_a_none_buffer_slot_as_a_buffer():
    module = linear()
    module.register_buffer("spare", None)

    def fill(state_dict, prefix, *args):
        module.spare = torch.ones(1)

    module._register_load_state_dict_pre_hook(fill)
    given = shifted(module)
    del given["bias"]
    error_of(lambda: load(module, given))
    assert "spare" in module._buffers and module._buffers["spare"] is None
    assert "spare" not in module._parameters


def test_rule8_rollback_puts_back_the_storage_a_hook_replaced():
    module = linear()
    weight, address = module.weight, module.weight.data_ptr()

    def replace(state_dict, prefix, *args):
        weight.data = weight.data.clone()

    module._register_load_state_dict_pre_hook(replace)
    given = shifted(module)
    del given["bias"]
    error_of(lambda: load(module, given, assign=True))
    assert module.weight is weight and weight.data_ptr() == address


@pytest.mark.parametrize("swap", [False, True])
def test_rule8_a_failed_load_that_wrote_nothing_leaves_versions_alone(swap):
    module = linear()
    versions = {k: v._version for k, v in module.state_dict(keep_vars=True).items()}
    given = shifted(module)
    given["bias"] = torch.zeros(7)
    error_of(lambda: load(module, given, swap=swap, assign=True))
    assert {k: v._version for k, v in module.state_dict(keep_vars=True).items()} == versions


@pytest.mark.parametrize("bad", ["0.weight", "1.bias", "missing"])
def test_rule8_a_load_failing_on_its_input_swaps_nothing_so_backward_still_runs(bad):
    """After ``backward(create_graph=True)`` through two layers each grad holds a graph over
    the other layer's autograd nodes, and a swap marks those unusable. A swap-path load that
    fails on its input (a wrong shape at the first key or the last, a missing key) writes
    nothing, so the next backward runs."""
    module = nn.Sequential(linear(), linear())
    module(torch.ones(1, 3)).sum().backward(create_graph=True)
    before = snapshot(module)
    impls = {name: p._cdata for name, p in module.named_parameters()}
    state_dict = {k: v.clone() for k, v in module.state_dict().items()}
    if bad == "missing":
        del state_dict["1.weight"]
    else:
        state_dict[bad] = torch.zeros(5)
    message = "Missing key" if bad == "missing" else f"size mismatch for {bad}"
    with pytest.raises(RuntimeError, match=message):
        load(module, state_dict, swap=True)
    assert {name: p._cdata for name, p in module.named_parameters()} == impls
    assert_unchanged(before, module)
    module(torch.ones(1, 3)).sum().backward()


def test_rule8_a_given_parameter_gets_its_requires_grad_back_when_a_later_hook_fails():
    """Rule 4's assign sets a given Parameter's ``requires_grad`` to the slot's; a failure after
    the writes (a post hook raising) rolls that back too: the caller's tensor is as it was."""
    module = nn.Linear(2, 2)

    def failing_hook(*_):
        raise ValueError("post hook")

    module.register_load_state_dict_post_hook(failing_hook)
    given = {"weight": nn.Parameter(torch.ones(2, 2), requires_grad=False), "bias": torch.zeros(2)}
    with pytest.raises(ValueError, match="post hook"):
        load(module, given, assign=True)
    assert not given["weight"].requires_grad and module.weight is not given["weight"]
