"""Unit tests for ``reference.load_state_dict`` on the RNN family under the swap flag (rule 9):
the parameters are swapped in place like any other, and ``_flat_weights`` is rebuilt."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import Tensor, nn

from swapspec import reference
from tests.helpers_modules import assert_unchanged, randn, snapshot

KINDS = [nn.RNN, nn.LSTM, nn.GRU]
kinds = pytest.mark.parametrize("kind", KINDS, ids=[k.__name__ for k in KINDS])
assigns = pytest.mark.parametrize("assign", [False, True], ids=["copy-in", "assign"])


class Parent(nn.Module):
    """A custom parent: its own parameter, and the RNN as ``body`` after a ``Linear``."""

    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.head = nn.Linear(3, 3)
        self.body = rnn

    def forward(self, x: Tensor) -> Tensor:
        return self.body(self.head(x * self.scale))[0]


class Bare(nn.Module):
    """The RNN alone, with forward returning its output only (so every tree is called alike)."""

    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: Tensor) -> Tensor:
        return self.rnn(x)[0]


def bare(rnn: nn.RNNBase) -> nn.Module:
    return rnn


def in_sequential(rnn: nn.RNNBase) -> nn.Module:
    return nn.Sequential(nn.Linear(3, 3), rnn)


TREES = [bare, in_sequential, Parent]
trees = pytest.mark.parametrize("tree", TREES, ids=["bare", "sequential", "parent"])


def build(kind: type[nn.RNNBase], tree, *, seed: int = 0) -> nn.Module:
    """``tree`` around a two-layer ``kind`` (input size 3), values from a local generator."""
    module = tree(kind(3, 4, num_layers=2))
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(randn(*p.shape, seed=seed + i))
    return module


def rnns(module: nn.Module) -> list[nn.RNNBase]:
    return [m for m in module.modules() if isinstance(m, nn.RNNBase)]


def output(module: nn.Module) -> Tensor:
    out = module(randn(5, 2, 3, seed=99))
    return out[0] if isinstance(out, tuple) else out


def value_of(module: nn.Module) -> Tensor:
    """``output`` without an autograd graph (one would hold the parameters, and swaps refuse)."""
    with torch.no_grad():
        return output(module)


def given_for(module: nn.Module, seed: int = 50) -> dict[str, Tensor]:
    """New values for every key of ``module``'s state dict (new objects)."""
    return {k: randn(*v.shape, seed=seed + i) for i, (k, v) in
            enumerate(module.state_dict().items())}


def swap_load(module: nn.Module, given, *, assign: bool):
    return reference.load_state_dict(module, given, strict=True, assign=assign, swap=True)


def assert_flat_weights_rebuilt(module: nn.Module) -> None:
    for rnn in rnns(module):
        names = rnn._flat_weights_names
        assert len(rnn._flat_weights) == len(names) == len(rnn._flat_weight_refs)
        for name, w, ref in zip(names, rnn._flat_weights, rnn._flat_weight_refs, strict=True):
            assert w is getattr(rnn, name) and ref() is w


@kinds
@trees
@assigns
def test_rule9_rnn_loads_on_the_swap_path_keeping_every_parameter_object(kind, tree, assign):
    module = build(kind, tree)
    params = dict(module.named_parameters())
    given = given_for(module)
    assert swap_load(module, given, assign=assign) == ([], [])
    for name, p in module.named_parameters():
        assert p is params[name] and type(p) is nn.Parameter and p.requires_grad
        assert torch.equal(p, given[name])
    assert_flat_weights_rebuilt(module)


@kinds
@trees
@assigns
def test_rule9_rnn_forward_after_the_load_matches_a_fresh_module_holding_the_values(kind, tree,
                                                                                     assign):
    module = build(kind, tree)
    value_of(module)  # a forward before the load, too
    given = given_for(module)
    swap_load(module, given, assign=assign)
    fresh = build(kind, tree, seed=7)
    fresh.load_state_dict(given)
    assert torch.equal(value_of(module), value_of(fresh))


@kinds
@trees
@assigns
def test_rule9_rnn_grads_hooks_and_optimizer_survive_the_load(kind, tree, assign):
    module = build(kind, tree)
    output(module).sum().backward()
    grads = {n: (p.grad, p.grad.clone()) for n, p in module.named_parameters()}
    fired = []
    rnn = rnns(module)[0]
    rnn.weight_hh_l0.register_hook(lambda g: fired.append("hook"))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5, momentum=0.9)
    optimizer.step()
    given = given_for(module)
    loaded = {k: v.clone() for k, v in given.items()}  # with assign the module shares given's
    swap_load(module, given, assign=assign)
    for name, p in module.named_parameters():
        grad, values = grads[name]
        assert p.grad is grad and torch.equal(p.grad, values)
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert all(a is b for a, b in zip(held, module.parameters(), strict=True))
    assert all("momentum_buffer" in optimizer.state[p] for p in module.parameters())
    optimizer.zero_grad()
    output(module).sum().backward()
    assert fired == ["hook"]
    before = rnn.weight_hh_l0.detach().clone()
    optimizer.step()  # moves the loaded parameters in the module
    assert not torch.equal(rnn.weight_hh_l0, before)
    assert torch.equal(before, loaded[_key_of(module, rnn.weight_hh_l0)])


def _key_of(module: nn.Module, param: Tensor) -> str:
    return next(n for n, p in module.named_parameters() if p is param)


@kinds
@assigns
def test_rule9_rnn_reads_the_swap_flag_from_reference_flags(kind, assign):
    module = build(kind, bare)
    weight = module.weight_ih_l0
    cdata = weight._cdata
    given = given_for(module)
    with reference.flags(swap=True):
        reference.load_state_dict(module, given, assign=assign)
    assert module.weight_ih_l0 is weight and weight._cdata != cdata  # swapped, not copied
    assert_flat_weights_rebuilt(module)


@kinds
@trees
@assigns
def test_rule9_a_failing_rnn_load_leaves_it_as_it_was_and_usable(kind, tree, assign):
    module = build(kind, tree)
    expected = value_of(module)
    given = given_for(module)
    given[next(iter(given))] = torch.zeros(1, 1)  # a size mismatch
    before = snapshot(module)
    with pytest.raises(RuntimeError, match="size mismatch"):
        swap_load(module, given, assign=assign)
    assert_unchanged(before, module)
    assert_flat_weights_rebuilt(module)
    assert torch.equal(value_of(module), expected)
    swap_load(module, given_for(module), assign=assign)  # the weak references are back: it swaps


@kinds
@assigns
def test_rule9_a_refused_swap_in_an_rnn_rolls_back_and_rebuilds_flat_weights(kind, assign):
    module = build(kind, in_sequential)
    rnn = module[1]
    expected = value_of(module)
    blocker = weakref.ref(rnn.bias_hh_l1)  # a weak reference of the host's own: swap refuses
    before = snapshot(module)
    with pytest.raises(RuntimeError, match="While swapping the parameter named"):
        swap_load(module, given_for(module), assign=assign)
    assert_unchanged(before, module)
    assert_flat_weights_rebuilt(module)
    assert torch.equal(value_of(module), expected) and blocker() is rnn.bias_hh_l1


@kinds
@assigns
def test_rule9_rnn_round_trip_changes_no_object_or_value(kind, assign):
    module = build(kind, Parent)
    values = {k: v.clone() for k, v in module.state_dict().items()}
    params = list(module.parameters())
    swap_load(module, module.state_dict(), assign=assign)
    assert all(a is b for a, b in zip(module.parameters(), params, strict=True))
    assert all(torch.equal(v, values[k]) for k, v in module.state_dict().items())
    assert_flat_weights_rebuilt(module)


@kinds
def test_rule9_shared_rnn_is_loaded_once_with_its_flat_weights_rebuilt(kind):
    rnn = build(kind, bare)
    module = nn.ModuleDict({"a": rnn, "b": rnn})
    given = {f"{p}.{k}": v for k, v in given_for(rnn).items() for p in ("a", "b")}
    swap_load(module, given, assign=False)
    assert module["a"] is module["b"]
    assert torch.equal(rnn.weight_ih_l0, given["a.weight_ih_l0"])
    assert_flat_weights_rebuilt(module)


def test_rule9_only_the_swap_path_touches_flat_weights():
    module = build(nn.LSTM, bare)
    refs = module._flat_weight_refs
    reference.load_state_dict(module, given_for(module), swap=False)
    assert module._flat_weight_refs is refs
