"""Unit tests for rule 12 of ``reference.apply``: a grad that carries an autograd graph keeps
``requires_grad``; when its graph holds the parameter the swap is refused, rolled back, and the
error notes it. The swap check agrees with torch's ``swap_tensors`` on every way a parameter's
TensorImpl can be held."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from swapspec import reference
from tests.helpers_decorations import X, double, seeded
from tests.helpers_modules import (
    assert_unchanged,
    fill_grads,
    linear,
    randn,
    snapshot,
    torch_swap_flag_set,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Using backward\\(\\) with create_graph=True:UserWarning"
)


GRAPH_NOTE = ("weight's grad carries an autograd graph (backward(create_graph=True)) that can "
              "hold the parameter; clear or detach the grads first")


def conv_with_graph_grads() -> nn.Conv1d:
    """A Conv1d after ``backward(create_graph=True)``: its weight grad's graph holds the weight."""
    conv = seeded(lambda: nn.Conv1d(2, 3, 2))
    conv(randn(1, 2, 5, seed=42)).pow(2).sum().backward(create_graph=True)
    return conv


@pytest.mark.parametrize("overwrite", [False, True])
def test_swap_refused_by_a_grad_graph_notes_it_and_rolls_back(overwrite):
    """Rules 4 and 12: the weight's swap is refused; the error notes the graph; nothing changed."""
    conv = conv_with_graph_grads()
    assert conv.weight.grad.grad_fn is not None  # (setup) the grad carries a graph
    before = snapshot(conv)
    with pytest.raises(RuntimeError) as info:
        reference.apply(conv, double, overwrite=overwrite, swap=True)
    assert str(info.value) == "_apply(): Couldn't swap Conv1d.weight"
    assert info.value.__notes__ == [GRAPH_NOTE]
    assert_unchanged(before, conv)
    assert conv.weight.grad.grad_fn is not None


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("grads", ["none", "leaf"])
def test_refused_swap_without_a_grad_graph_has_no_note(overwrite, grads):
    """Rule 12: a refused parameter without a grad, or with a leaf grad, gets no note."""
    lin = linear()
    if grads == "leaf":
        fill_grads(lin)
    held = weakref.ref(lin.weight)
    with pytest.raises(RuntimeError) as info:
        reference.apply(lin, double, overwrite=overwrite, swap=True)
    assert str(info.value) == "_apply(): Couldn't swap Linear.weight"
    assert not hasattr(info.value, "__notes__")
    assert held() is lin.weight


@pytest.mark.parametrize("overwrite", [False, True])
def test_swaps_are_checked_before_any_so_a_refusal_leaves_backward_usable(overwrite):
    """Rule 13: after ``backward(create_graph=True)`` through two layers, ``1.weight`` is held by
    ``0.weight``'s grad graph and is refused, while ``0.weight`` alone could be swapped. Nothing
    is swapped, so while the error (and through its traceback the old grads' graphs) is still
    held, the next backward runs and fills every grad."""
    module = seeded(lambda: nn.Sequential(linear(), linear()))
    module(X).pow(2).sum().backward(create_graph=True)
    impls = {name: p._cdata for name, p in module.named_parameters()}
    before = snapshot(module)
    with pytest.raises(RuntimeError) as info:
        reference.apply(module, double, overwrite=overwrite, swap=True)
    assert str(info.value) == "_apply(): Couldn't swap Linear.weight"
    assert "references" in str(info.value.__cause__)
    assert {name: p._cdata for name, p in module.named_parameters()} == impls
    assert_unchanged(before, module)
    module.zero_grad(set_to_none=True)
    module(X).sum().backward()  # raises if a swap marked an AccumulateGrad node unusable
    assert all(p.grad is not None for p in module.parameters())
    assert info.value is not None  # the error was held until here


def _held(count: int) -> str:
    return (f"the TensorImpl has {count} references, more than its object and its "
            "AccumulateGrad node; something else holds it (a view, a saved tensor)")


def _viewed_under_no_grad(p: nn.Parameter) -> list[object]:
    with torch.no_grad():
        return [p[:1]]  # the view holds p's TensorImpl as its base; no AccumulateGrad node yet


# Ways a parameter's TensorImpl can be held, each returning what holds it; the reason the
# reference gives for refusing the swap (None: no refusal), counting the object's own reference.
HOLDERS = {
    "nothing": (lambda p: [], None),
    "a weakref": (lambda p: [weakref.ref(p)], "the tensor has a weakref associated with it"),
    "its AccumulateGrad node": (lambda p: [p * 2], None),
    "a view": (lambda p: [p[:1]], _held(3)),  # the view's base, and the node its graph holds
    "a saved tensor": (lambda p: [p * p], _held(4)),  # saved twice, beside the node
    "a view under no_grad": (_viewed_under_no_grad, _held(2)),
    "a view of a frozen parameter": (lambda p: [p.requires_grad_(False)[:1]], _held(2)),
}


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_swap_check_agrees_with_torchs_swap(holder):
    """Rule 13: the check before the swaps refuses exactly the parameters whose swap torch's
    ``_apply`` refuses, and its cause says what holds the TensorImpl."""
    hold, reason = HOLDERS[holder]
    results = {}
    for name, run in (("reference", lambda m: reference.apply(m, double, swap=True)),
                      ("torch", lambda m: m._apply(double))):
        module = nn.Module()
        module.p = nn.Parameter(randn(3, seed=44))
        held = hold(module.p)
        try:
            with torch_swap_flag_set():
                run(module)
            results[name] = None
        except RuntimeError as error:
            assert str(error) == "_apply(): Couldn't swap Module.p", f"{name}: {error}"
            results[name] = str(error.__cause__) if name == "reference" else "refused"
        del held
    assert results["reference"] == reason, f"the reference's cause for {holder}"
    assert (results["torch"] is None) == (reason is None), f"torch's outcome for {holder}"


@pytest.mark.parametrize("viewed", [False, True], ids=["alone", "viewed"])
def test_swap_check_agrees_with_torch_on_a_grad_carrying_a_graph(viewed):
    """Rule 13: a grad that carries a graph (not a leaf, so no AccumulateGrad node of its own) is
    swapped while its object alone holds it, and refused, as torch refuses it, once a view does."""
    outcomes = {}
    for name, run in (("reference", lambda m: reference.apply(m, double, swap=True)),
                      ("torch", lambda m: m._apply(double))):
        module = nn.Module()
        module.p = nn.Parameter(randn(3, seed=45))
        module.p.grad = randn(3, seed=46).requires_grad_() * 2  # its graph does not hold p
        with torch.no_grad():
            held = [module.p.grad[:1]] if viewed else []
        try:
            with torch_swap_flag_set():
                run(module)
            outcomes[name] = "swapped"
        except RuntimeError as error:
            assert str(error) == "_apply(): Couldn't swap Module.p.grad", f"{name}: {error}"
            outcomes[name] = str(error.__cause__) if name == "reference" else "refused"
        del held
    assert outcomes["torch"] == ("refused" if viewed else "swapped")
    assert outcomes["reference"] == (_held(2) if viewed else "swapped")


@pytest.mark.parametrize("overwrite", [False, True], ids=["set_data", "overwrite"])
def test_grad_carrying_a_graph_keeps_requires_grad(overwrite):
    """Rule 12: off the swap path, a graph-carrying grad is converted and keeps requires_grad."""
    conv = conv_with_graph_grads()
    reference.apply(conv, double, overwrite=overwrite, swap=False)
    for p in conv.parameters():
        assert p.dtype == p.grad.dtype == torch.float64
        assert p.grad.requires_grad
