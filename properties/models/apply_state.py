"""The apply model: what ``_apply`` must do to a module, read before the call.

The snapshot of the module before ``apply`` (slots, grads, ``_cdata``, ``fn``'s result per
tensor), the path the spec chooses for each parameter, the parameters ``swap_tensors`` refuses,
tensor comparisons, the repro code that names a slot, and the built-in conversion by name.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.models.examples import (
    holds_values,
    is_fake,
    named_tensors,
    same_values,
    slots,
    value_copy,
)
from swapspec.reference.apply import put_grad
from swapspec.strategies import tree_info


def is_uninitialized(t: Any) -> bool:
    return isinstance(t, UninitializedTensorMixin)


# ---- apply -----------------------------------------------------------------------------
def distinct(tensors: list[Tensor]) -> list[Tensor]:
    return list({id(t): t for t in tensors}.values())


@dataclass
class ApplySnapshot:
    """The module before ``apply``: slot contents, grads, ``_cdata``, and ``fn``'s results."""

    slots: dict[str, Any]
    names: dict[str, Tensor]
    grads: dict[int, Tensor | None]
    cdata: dict[int, int]
    requires_grad: dict[int, bool]
    classes: dict[int, type]
    attributes: dict[int, dict]
    expected: dict[int, Any] = field(default_factory=dict)
    expected_error: BaseException | None = None
    swap_refused: set[str] = field(default_factory=set)  # parameters the swap path would refuse


def snapshot_for_apply(module: nn.Module, make_fn: Callable[[], Callable],
                       recurse: bool = True, flags: Any = None) -> ApplySnapshot:
    """Record the module and what a fresh ``fn`` returns for each distinct tensor.

    With ``flags``, also the parameters that would take the swap path and that
    ``swap_tensors`` refuses (``swap_refused``; see ``refused_by_swap``).
    """
    names = named_tensors(module)
    params = distinct(list(module.parameters()))
    snap = ApplySnapshot(
        slots=slots(module), names=names,
        grads={id(p): p.grad for p in params},
        cdata={id(t): t._cdata for t in [*names.values(), *_grads(params)]},
        requires_grad={id(p): p.requires_grad for p in params},
        classes={id(p): type(p) for p in params},
        attributes={id(p): dict(p.__dict__) for p in params},
    )
    fn = make_fn()
    tensors = distinct(_tensors_in_apply_order(module, recurse))
    try:
        with torch.no_grad():
            for t in tensors:
                snap.expected[id(t)] = _frozen(fn(t))
    except Exception as e:
        snap.expected_error = e
    if flags is not None:
        swapped = {name for name, t in names.items() if id(t) in snap.classes
                   and id(t) in snap.expected  # converted (recurse=False converts fewer)
                   and expected_path(t, snap.expected[id(t)], flags.overwrite, flags.swap) == "swap"}
        snap.swap_refused = swapped & refused_by_swap(module)
    return snap


def refused_by_swap(module: nn.Module) -> set[str]:
    """Names of the parameters ``swap_tensors`` refuses, read on the module as it is now.

    Only trees trained with ``backward(create_graph=True)`` have any: their grads' autograd
    graphs can hold parameters (a use count ``swap_tensors`` refuses), and so can the
    AccumulateGrad node a parameter had before a conversion changed its dtype on the ``.data``
    path; and trees built under ``FakeTensorMode``, whose mode holds a weak reference to every
    fake parameter. A parameter counts when its grad is refused too (a view or a graph can hold
    the grad). The module itself is read, after whatever conversions it went through, with
    ``swap_tensors``' own checks and no swap (``swap_tensors_takes``).
    """
    info = tree_info(module)
    if info.spec.trained != "backward-create-graph" and info.spec.world != "fake":
        return set()
    return {name for name, p in module.named_parameters(remove_duplicate=False)
            if not is_uninitialized(p) and not (swap_tensors_takes(p) and _grad_swappable(p))}


def _grad_swappable(param: nn.Parameter) -> bool:
    """Whether ``swap_tensors`` takes the parameter's grad, read with the grad taken off the
    parameter meanwhile (as a conversion does: the parameter's own reference would count)."""
    grad, param.grad = param.grad, None
    try:
        return grad is None or swap_tensors_takes(grad)
    finally:
        put_grad(param, grad)  # a grad of another dtype too


def swap_tensors_takes(t: Tensor) -> bool:
    """Whether ``torch.utils.swap_tensors`` takes ``t`` now, by its own checks, read without
    swapping (a swap would leave its AccumulateGrad node unusable): no weak reference to it,
    and its TensorImpl held by its object alone, or also by its own AccumulateGrad node (the
    one ``get_gradient_edge`` finds without making a new one). A leaf held twice that does not
    require grad is refused, as ``swap_tensors`` refuses it (``get_gradient_edge`` raises)."""
    if weakref.getweakrefs(t):
        return False
    count = t._use_count()
    if count == 1:
        return True
    if count > 2 or not (t.is_leaf and t.requires_grad):
        return False
    node = torch.autograd.graph.get_gradient_edge(t).node  # made here if it did not exist
    made = t._use_count() > count
    del node
    return not made


def _swappable(param: nn.Parameter) -> bool:
    grad, param.grad = param.grad, None
    probe = nn.Parameter(value_copy(param), requires_grad=param.requires_grad)
    try:
        torch.utils.swap_tensors(param, probe)
    except RuntimeError:
        return False
    else:
        torch.utils.swap_tensors(param, probe)
        return True
    finally:
        put_grad(param, grad)


def _grads(params: list[Tensor]) -> list[Tensor]:
    return [p.grad for p in params if p.grad is not None]


def _tensors_in_apply_order(module: nn.Module, recurse: bool) -> list[Tensor]:
    """Parameters, then grads, then buffers: the order the reference converts them in."""
    modules = distinct_modules(module) if recurse else [module]
    params = distinct([p for m in modules for p in m._parameters.values() if p is not None])
    buffers = [b for m in modules for b in m._buffers.values() if b is not None]
    return [*params, *_grads(params), *buffers]


def distinct_modules(module: nn.Module) -> list[nn.Module]:
    return list({id(m): m for m in module.modules()}.values())


def _frozen(result: Any) -> Any:
    """A value copy of ``fn``'s result, so later in-place changes do not move it."""
    if not isinstance(result, Tensor) or is_uninitialized(result):
        return result
    if not holds_values(result) or is_traceable_wrapper_subclass(result):
        return result
    return value_copy(result)


def expected_path(param: Tensor, applied: Tensor, overwrite: bool, swap: bool) -> str:
    """The spec's choice of path for one parameter."""
    if swap or is_traceable_wrapper_subclass(applied):
        return "swap"
    if torch._has_compatible_shallow_copy_type(param, applied) and not overwrite and not is_fake(applied):
        return "set_data"
    return "overwrite"


def same_metadata(a: Tensor, b: Tensor) -> bool:
    return (a.dtype, a.device, a.layout, a.shape) == (b.dtype, b.device, b.layout, b.shape)


def converted_like(actual: Tensor, expected: Tensor, values: bool) -> bool:
    """``actual`` has ``expected``'s dtype, device, layout and shape, and values if asked."""
    if is_uninitialized(expected) or is_uninitialized(actual):
        return actual.dtype == expected.dtype and actual.device == expected.device
    if values:
        return same_values(actual, expected)
    return same_metadata(actual, expected)


def slot_code(name: str) -> str:
    """Repro code for the object in slot ``name`` after the call."""
    return f"named(module)[{name!r}]"


def conversion_named(name: str):
    """The built-in conversion called ``name`` (``"double()"``, ``"to('meta')"``...)."""
    from swapspec.strategies.conversions import CONVERSIONS

    return next(c for c in CONVERSIONS if c.name == name)


# Percent of the untrained trees of the conversion, FC-* and TOGETHER-* properties built in a
# tensor world (meta, TwoTensor parameters; see strategies.tree_worlds.move_to_world).
WORLD_CHANCE = 10
