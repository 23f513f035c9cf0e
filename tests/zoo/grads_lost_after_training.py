"""Sequence zoo: ``apply`` drops a grad that a backward made after this target's last conversion.

The target remembers, for every parameter it converted, the grad object it left there, and on
its next conversion it drops any other grad as "stale" (the bug: a grad made by training after
the last conversion is the current one). A one-shot property converts a tree once, or converts
it again with no backward in between, so the grads it meets are always the remembered ones:
only a sequence (convert, backward, convert) loses a grad.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from torch import Tensor, nn

from swapspec import reference
from tests.zoo import ZooTarget

ORIGIN = "swapspec sequences: grads made by training after a conversion are lost by the next one"
CAUGHT_BY = frozenset({"SEQ-STATE"})
ONE_SHOT_PATHS = ("properties/test_apply.py", "properties/test_apply_training.py",
                  "properties/test_together.py")

# id(parameter) -> (the parameter, the grad this target left on it, or None)
_LEFT: dict[int, tuple[weakref.ref, weakref.ref | None]] = {}


def _stale(p: Tensor) -> bool:
    """A grad other than the one this target left on ``p`` at its last conversion."""
    left = _LEFT.get(id(p))
    if left is None or left[0]() is not p or p.grad is None:
        return False
    return left[1] is None or left[1]() is not p.grad


def apply(module: nn.Module, fn: Callable[[Tensor], Tensor], *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """Drop "stale" grads (the bug), convert with the reference, remember the grads left."""
    for p in module.parameters():
        if _stale(p):
            p.grad = None
    reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)
    for p in module.parameters():
        _LEFT[id(p)] = (weakref.ref(p), None if p.grad is None else weakref.ref(p.grad))
    return module


target = ZooTarget("zoo-grads-lost-after-training", apply, reference.functional_call)
