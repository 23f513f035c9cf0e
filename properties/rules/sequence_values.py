"""The values and small actions of the sequence machine's steps: the tensors a call or a load
is given, a slot's owner, a vmapped call, a backward, a forward without grad, counting hooks, and
how an outcome is described in a message.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch
from torch import Tensor, nn

from swapspec.properties.models.examples import by_parts, is_wrapper, same_values, value_copy
from swapspec.properties.models.module_model import ModuleModel, Prediction
from swapspec.properties.models.outcomes import Outcome


def trainable(model: ModuleModel | None) -> list[int]:
    """Indices of the parameters that require grad (an optimizer's and a hook's choice)."""
    return [] if model is None else [i for i, t in enumerate(model.tensors)
                                     if t.parameter and t.requires_grad]


def agrees(outcome: Outcome, prediction: Prediction) -> bool:
    """Both raised the same exception type, or both returned equal tensors."""
    if outcome.error is not None or prediction.error is not None:
        return type(outcome.error) is prediction.error
    return same_values(outcome.result.detach(), prediction.result)


def load_value(value: Tensor, kind: str) -> Tensor:
    """A load's value for a slot now holding ``value`` (see ``LOAD_KINDS``)."""
    new = given_value(value)
    return new.double() if kind == "float64" and new.is_floating_point() else new


def shifted(value: Tensor, times: int) -> Tensor:
    """``value`` through ``given_value`` ``times`` times (0: a copy of it)."""
    out = value_copy(value)
    for _ in range(times):
        out = given_value(out)
    return out


def own_copy(t: Tensor, *, buffer: bool) -> Tensor:
    """What untie puts in a slot: ``nn.Parameter(t.detach().clone(), requires_grad=...)`` for a
    parameter slot, ``t.detach().clone()`` for a buffer slot (also where it holds a parameter)."""
    if not buffer:
        return nn.Parameter(value_copy(t), requires_grad=t.requires_grad)
    return value_copy(t)


def slot_owner(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The submodule holding slot ``name``, and the slot's key in it."""
    prefix, _, key = name.rpartition(".")
    return module.get_submodule(prefix), key


def given_value(value: Tensor) -> Tensor:
    """A tensor of ``value``'s dtype and shape with other values (for calls and loads)."""
    v = value.detach()
    if v.device.type == "meta":
        return torch.empty_like(v)
    if v.dtype == torch.bool:
        return ~v
    try:
        return (v + (0.5 if v.is_floating_point() or v.is_complex() else 1)).clone()
    except (NotImplementedError, TypeError):  # a host's class without add: by its parts
        if not is_wrapper(v):
            raise
    return by_parts(v, given_value)


def vmapped_call(target: Any, module: nn.Module, stacked: dict[str, Tensor], x: Tensor) -> Tensor:
    """``torch.func.vmap`` of ``target.functional_call(module, p, (x,), {})`` over the stacked
    tensors' first dimension, ``x`` unbatched (a batching rule's fallback warning silenced)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "There is a performance drop", UserWarning)
        return torch.func.vmap(lambda p, inputs: target.functional_call(module, p, (inputs,), {}),
                               in_dims=(0, None))(stacked, x.clone())


def run_backward(module: nn.Module, x: Tensor, create_graph: bool) -> None:
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # create_graph=True warns of a cycle
        out = module(x.clone())
        if out.requires_grad:
            out.float().sum().backward(create_graph=create_graph)


def graph_forward(module: nn.Module, x: Tensor) -> Tensor:
    """The module's output on ``x`` with its autograd graph (grad mode on)."""
    with torch.enable_grad():
        return module(x.clone())


def no_grad_forward(module: nn.Module, x: Tensor) -> Tensor:
    with torch.no_grad():
        return module(x.clone())


def count_hooks(param: Tensor, key: str, fired: Counter) -> None:
    param.register_hook(lambda g: fired.update([f"{key}:hook"]))
    param.register_post_accumulate_grad_hook(lambda p: fired.update([f"{key}:post-accumulate"]))


def describe(t: Any) -> str:
    if isinstance(t, Tensor):
        return f"{type(t).__name__}({t.dtype}, {t.device}, shape={tuple(t.shape)})"
    return repr(t)


def shown(outcome: Any) -> str:
    if outcome.error is not None:
        error = outcome.error
        return f"raised {error.__name__ if isinstance(error, type) else type(error).__name__}"
    return f"returned {describe(outcome.result)}"
