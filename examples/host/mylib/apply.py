"""``apply``: convert a module's tensors with ``fn``, choosing the path by two flags.

mylib's design: the flags are arguments, not global state. It sets torch's ``torch.__future__``
flags for the call, runs ``module._apply`` and puts the flags back, so it behaves as torch does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def apply(module: nn.Module, fn: Callable, *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """``module._apply(fn, recurse)`` under the given flags (restored afterwards)."""
    future = torch.__future__
    saved = (future.get_overwrite_module_params_on_conversion(),
             future.get_swap_module_params_on_conversion())
    future.set_overwrite_module_params_on_conversion(overwrite)
    future.set_swap_module_params_on_conversion(swap)
    try:
        return module._apply(fn, recurse=recurse)
    finally:
        future.set_overwrite_module_params_on_conversion(saved[0])
        future.set_swap_module_params_on_conversion(saved[1])
