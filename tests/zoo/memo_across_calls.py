"""Sequence zoo: ``apply`` keeps a memo of converted tensors from one call to the next.

The memo maps (tensor object, its dtype, device and shape, conversion source and the values
its closure holds, so ``double()`` and ``float()`` are two conversions) to ``fn``'s
result, and a later ``apply`` of the same conversion on the same tensor object, while it has the
same dtype, device and shape, reuses the old result instead of calling ``fn`` again ("that
weight was already converted"). Within one call this is the reference's own memo; across calls
it is stale as soon as the tensor's values changed: the set_data and swap paths keep the
parameter object, so ``add(1)`` twice adds 1 once, and ``half()``, ``float()``, an optimizer
step, ``half()`` brings back the weights from before the step. One-shot properties that convert
twice compare the module with itself (``APPLY-FORWARD`` builds its fresh copy from the
converted tensors), so none can see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.nn.parameter import UninitializedTensorMixin

from swapspec import reference
from tests.zoo import ZooTarget

ORIGIN = "swapspec sequences: a conversion cache kept across apply calls"
CAUGHT_BY = frozenset({"SEQ-STATE", "SEQ-FORWARD"})
ONE_SHOT_PATHS = ("properties/rules/test_apply.py", "properties/rules/test_apply_training.py",
                  "properties/rules/test_together.py")

# key -> (the tensor, fn's result); strong references: a weak one would make swap_tensors refuse
_MEMO: dict[tuple[Any, ...], tuple[Tensor, Tensor]] = {}


def _key(t: Tensor, fn: Callable) -> tuple[Any, ...]:
    code = fn.__code__
    shape = None if isinstance(t, UninitializedTensorMixin) else tuple(t.shape)
    cells = tuple(repr(cell.cell_contents) for cell in fn.__closure__ or ())
    return (id(t), t.dtype, t.device, shape, code.co_code, repr(code.co_consts), code.co_names,
            cells)


def apply(module: nn.Module, fn: Callable[[Tensor], Tensor], *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """The reference's ``apply`` with ``fn`` memoized per tensor object and conversion source,
    the memo kept between calls (the bug)."""

    def memoized(t: Tensor) -> Tensor:
        key = _key(t, fn)
        hit = _MEMO.get(key)
        if hit is not None and hit[0] is t:
            return hit[1]
        result = fn(t)
        _MEMO[key] = (t, result)
        return result

    return reference.apply(module, memoized, overwrite=overwrite, swap=swap, recurse=recurse)


target = ZooTarget("zoo-memo-across-calls", apply, reference.functional_call)
