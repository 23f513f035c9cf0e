"""Zoo: ``_apply`` before the conversion flags, ``param.data = fn(param.data)``.

Origin: torch <= 1.1 ``nn.Module._apply``; pytorch #17072 (it broke ``model.to(xla_device)``
and any conversion that changes the TensorImpl type), fixed by #21613 (the overwrite
flag and ``_has_compatible_shallow_copy_type``). The historical code, flags ignored::

    for module in self.children(): module._apply(fn)
    for param in self._parameters.values():
        if param is not None:
            param.data = fn(param.data)
            if param._grad is not None:
                param._grad.data = fn(param._grad.data)
    for key, buf in self._buffers.items():
        if buf is not None:
            self._buffers[key] = fn(buf)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec import reference
from tests.zoo import APPLY_PATHS, ZooTarget

ORIGIN = "torch <= 1.1 _apply: param.data = fn(param.data) (pytorch #17072)"
CAUGHT_BY = frozenset({"APPLY-PATH", "APPLY-NO-SET-DATA-ACROSS-IMPL"})
PATHS = APPLY_PATHS


def apply(module: nn.Module, fn: Callable[[Tensor], Tensor], *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """Rules: children first; every parameter and grad through ``.data =``; buffers rebound.

    ``overwrite`` and ``swap`` are accepted and ignored (the bug).
    """
    if recurse:
        for child in module.children():
            apply(child, fn, overwrite=overwrite, swap=swap)
    for param in module._parameters.values():
        if param is None:
            continue
        param.data = _refuse_wrapper(fn(param.data))
        if param._grad is not None:
            param._grad.data = _refuse_wrapper(fn(param._grad.data))
    for key, buf in module._buffers.items():
        if buf is not None:
            module._buffers[key] = fn(buf)
    return module


def _refuse_wrapper(t: Tensor) -> Tensor:
    """Raise for a traceable wrapper subclass (``TwoTensor``), as ``.data =`` does for other
    TensorImpl changes: torch 1.1 had no such subclasses, and today's ``.data =`` accepts one
    and later crashes the interpreter, which would end the run instead of failing a property."""
    if is_traceable_wrapper_subclass(t):
        raise RuntimeError("Attempted to call `variable.set_data(tensor)` with a wrapper subclass")
    return t


target = ZooTarget("zoo-old-set-data", apply, reference.functional_call)
