"""Unit tests for rule 11 of ``reference.apply``: a parameter's tensor hooks (``register_hook``,
``register_post_accumulate_grad_hook``) fire after a conversion on every path, exactly once per
backward; hooks registered after it fire too; their handles still remove them."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import nn

from swapspec import reference
from tests.helpers_decorations import X, double
from tests.helpers_modules import (
    assert_unchanged,
    fill_grads,
    flag_settings,
    linear,
    snapshot,
)

HOOKS = ("hook:weight", "post:weight", "hook:bias", "post:bias")


def counting(counts: Counter, key: str) -> Callable[[torch.Tensor], None]:
    """A hook that counts its firings under ``key`` and changes nothing (returns None)."""

    def hook(_: torch.Tensor) -> None:
        counts[key] += 1

    return hook


def hooked_linear():
    """A Linear whose weight and bias both have a counting ``register_hook`` and
    ``register_post_accumulate_grad_hook`` hook; also returns the counts and the handles."""
    lin = linear(3, 4, seed=41)
    counts: Counter = Counter()
    handles = {}
    for name, p in lin.named_parameters():
        handles[f"hook:{name}"] = p.register_hook(counting(counts, f"hook:{name}"))
        handles[f"post:{name}"] = p.register_post_accumulate_grad_hook(
            counting(counts, f"post:{name}"))
    return lin, counts, handles


def backward(module: nn.Module, dtype: torch.dtype) -> None:
    module(X.to(dtype)).sum().backward()


@flag_settings
def test_tensor_hooks_fire_once_per_backward_after_conversion(overwrite, swap):
    """Rule 11: both kinds of hooks fire after the conversion, on every path, once per backward."""
    lin, counts, _ = hooked_linear()
    weight = lin.weight
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    assert (lin.weight is weight) == (swap or not overwrite)  # overwrite path: a new parameter
    assert lin.weight.dtype == torch.float64
    assert counts == {}
    backward(lin, torch.float64)
    assert counts == dict.fromkeys(HOOKS, 1)
    backward(lin, torch.float64)
    assert counts == dict.fromkeys(HOOKS, 2)


@flag_settings
def test_tensor_hooks_fire_once_after_two_conversions(overwrite, swap):
    """Rule 11: converting twice neither loses nor doubles the hooks."""
    lin, counts, _ = hooked_linear()
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    reference.apply(lin, lambda t: t.float(), overwrite=overwrite, swap=swap)
    backward(lin, torch.float32)
    assert counts == dict.fromkeys(HOOKS, 1)


@flag_settings
@pytest.mark.parametrize("hooked_before", [True, False], ids=["had-hooks", "no-hooks"])
def test_hook_registered_after_conversion_fires_once(overwrite, swap, hooked_before):
    """Rule 11: a hook registered after the conversion fires (after a swap too), next to any
    registered before it."""
    lin = linear(3, 4, seed=41)
    counts: Counter = Counter()
    if hooked_before:
        lin.weight.register_hook(counting(counts, "hook:before"))
        lin.weight.register_post_accumulate_grad_hook(counting(counts, "post:before"))
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    lin.weight.register_hook(counting(counts, "hook:after"))
    lin.weight.register_post_accumulate_grad_hook(counting(counts, "post:after"))
    backward(lin, torch.float64)
    expected = {"hook:after": 1, "post:after": 1}
    if hooked_before:
        expected |= {"hook:before": 1, "post:before": 1}
    assert counts == expected


@flag_settings
@pytest.mark.parametrize("removed", HOOKS)
def test_hook_removed_through_its_handle_after_conversion_stops_firing(overwrite, swap, removed):
    """Rule 11: the handle ``register_hook`` returned before the conversion still removes it."""
    lin, counts, handles = hooked_linear()
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    handles[removed].remove()
    backward(lin, torch.float64)
    assert counts == {key: 1 for key in HOOKS if key != removed}


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("with_grads", [False, True], ids=["no-grads", "grads"])
def test_tensor_hooks_fire_once_after_refused_swap(overwrite, with_grads):
    """Rules 4 and 11: after a swap refused mid-way (a weakref on the bias) and rolled back,
    the hooks of the restored parameters fire exactly once."""
    lin, counts, _ = hooked_linear()
    if with_grads:
        fill_grads(lin)
    bias = lin.bias
    before = snapshot(lin)
    held = weakref.ref(bias)
    with pytest.raises(RuntimeError, match=r"^_apply\(\): Couldn't swap Linear\.bias$"):
        reference.apply(lin, double, overwrite=overwrite, swap=True)
    assert_unchanged(before, lin)
    assert held() is lin.bias
    backward(lin, torch.float32)
    assert counts == dict.fromkeys(HOOKS, 1)
