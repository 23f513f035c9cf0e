"""Zoo: ``_apply`` without a memo across modules: tied tensors are converted once per slot.

Origin: torch's ``_apply`` (up to 2.13, see ``properties/declarations/torch.py``:
``converts_some_tensor_twice``) recurses ``module._apply(fn)`` into each child with no
shared memo, so a tensor tied across modules, or a submodule shared by two parents, is
converted twice: ``t + 1`` becomes ``t + 2`` on the set_data/swap paths and the tie
splits on the overwrite path. Each module's own conversion is the reference's.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from swapspec import reference
from tests.zoo import APPLY_PATHS, ZooTarget

ORIGIN = "torch _apply recursion: no memo across modules (tied weights converted twice)"
CAUGHT_BY = frozenset({"APPLY-FN-ONCE", "APPLY-TIES"})
PATHS = APPLY_PATHS


def apply(module: nn.Module, fn: Callable[[Tensor], Tensor], *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """Rules: children first (``children()``, repeats dropped per parent only), then the
    module's own tensors with ``reference.apply(..., recurse=False)``; nothing is shared
    between the calls (the bug)."""
    if recurse:
        for child in module.children():
            apply(child, fn, overwrite=overwrite, swap=swap)
    return reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=False)


target = ZooTarget("zoo-apply-no-memo", apply, reference.functional_call)
