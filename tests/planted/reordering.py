"""A functional call that reorders the parameters of the first module holding two or more before
forward, and then shifts the output: its FC-ORACLE failures come with a changed slot order, for
``tests/test_slot_order.py``."""

from __future__ import annotations

import torch

from swapspec import reference

name = "reordering"


def functional_call(module, tensors, args=(), kwargs=None, *, tie_weights=True, strict=False):
    owner = next((m for m in module.modules() if len(m._parameters) > 1), None)
    if owner is not None:
        first = next(iter(owner._parameters))
        owner._parameters[first] = owner._parameters.pop(first)
    out = reference.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights,
                                    strict=strict)
    return out + 1 if owner is not None and isinstance(out, torch.Tensor) else out
