"""Zoo: ``_apply`` that commits tensor by tensor and never undoes a commit when a swap is refused.

Origin: torch's ``_apply`` (2.1 to 2.13, the swap path of pytorch #113000): a parameter that
``torch.utils.swap_tensors`` refuses (a weak reference to it, as ``torch.compile``'s guards hold)
raises ``RuntimeError: _apply(): Couldn't swap ...`` after the tensors before it were converted,
and a refused grad leaves its parameter swapped and its grad ``None``. Declared for the torch
target as ``converts_before_refused_swap`` in ``properties/declarations/torch.py``. Everything else
here is the reference's: one ``fn`` call per tensor, all calls before any commit, its paths.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import Tensor, nn

from swapspec import reference
from tests.zoo import APPLY_PATHS, ZooTarget

ref_apply = importlib.import_module("swapspec.reference.apply")  # the module, not the function

ORIGIN = "torch _apply swap path: a refused swap leaves earlier tensors converted (pytorch #113000)"
CAUGHT_BY = frozenset({"APPLY-REFUSED-SWAP"})
PATHS = APPLY_PATHS


def apply(module: nn.Module, fn: Callable[[Tensor], Tensor], *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """The reference's ``apply`` with its undo log dropped (the bug)."""
    modules = ref_apply._modules_to_convert(module, recurse)
    params = ref_apply._collect(modules, "_parameters")
    buffers = ref_apply._collect(modules, "_buffers")
    grads = [s.tensor.grad for s in params if s.tensor.grad is not None]
    results = ref_apply._convert_all(fn, [s.tensor for s in params] + grads
                                     + [s.tensor for s in buffers])
    ignored_undo: list[Callable[[], None]] = []
    for slots in params:
        final = ref_apply._commit_param(slots, results, ignored_undo, overwrite=overwrite,
                                        swap=swap)
        results[id(slots.tensor)] = final
    for slots in buffers:
        ref_apply._rebind(slots, results[id(slots.tensor)], "_buffers", ignored_undo)
    return module


target = ZooTarget("zoo-no-rollback", apply, reference.functional_call)
