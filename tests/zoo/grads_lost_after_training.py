"""Sequence zoo: ``apply`` drops a grad that training changed after this target's last conversion.

The target remembers, for every parameter it converted, the grad it left there (the object and
its version counter), and on its next conversion it drops any grad that is another object or
was changed in place since, as "stale" (the bug: that grad is the current one). A one-shot
property converts a tree once, or converts it again with no training in between, so the grads
it meets are always the remembered ones: only a sequence such as convert, ``backward()``,
convert loses a grad.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from swapspec import reference
from tests.zoo import ZooTarget

ORIGIN = "swapspec sequences: grads made by training after a conversion are lost by the next one"
CAUGHT_BY = frozenset({"SEQ-STATE"})
CAUGHT_BY_PAIR = "convert>backward"  # convert, backward, convert
ONE_SHOT_PATHS = ("properties/rules/test_apply.py", "properties/rules/test_apply_training.py",
                  "properties/rules/test_together.py")

# id(parameter) -> (the parameter, the grad this target left on it or None, its version);
# strong references: a weak one would make swap_tensors refuse the tensor
_LEFT: dict[int, tuple[Tensor, Tensor | None, int]] = {}


def _stale(p: Tensor) -> bool:
    """A grad other than the one this target left on ``p`` at its last conversion, or that one
    changed in place since."""
    left = _LEFT.get(id(p))
    if left is None or left[0] is not p or p.grad is None:
        return False
    return left[1] is not p.grad or left[2] != p.grad._version


def apply(module: nn.Module, fn: Callable[[Tensor], Tensor], *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """Drop "stale" grads (the bug), convert with the reference, remember the grads left."""
    for p in module.parameters():
        if _stale(p):
            p.grad = None
    reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)
    for p in module.parameters():
        _LEFT[id(p)] = (p, p.grad, -1 if p.grad is None else p.grad._version)
    return module


target = ZooTarget("zoo-grads-lost-after-training", apply, reference.functional_call)
