"""Pass-through torch modes an operation can run under: a ``TorchFunctionMode`` and a
``TorchDispatchMode`` that call every function exactly as it was called.

Rules: under either mode an operation must do exactly what it does without one, since the mode
changes no call. ``torch.utils.swap_tensors`` and ``Tensor.module_load`` dispatch through
``__torch_function__`` (so through an active function mode), and every tensor op of ``_apply``,
``load_state_dict`` and ``functional_call`` through the dispatcher (so through an active dispatch
mode). :func:`active_mode` enters one by name (:data:`MODES`), or none for ``None``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.overrides
import torch.utils._python_dispatch

MODES = ("function", "dispatch")


class PassThroughFunctionMode(torch.overrides.TorchFunctionMode):
    """Calls every torch function as it was called."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class PassThroughDispatchMode(torch.utils._python_dispatch.TorchDispatchMode):
    """Calls every aten op as it was called."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


MODE_CLASSES = {"function": PassThroughFunctionMode, "dispatch": PassThroughDispatchMode}


def active_mode(kind: str | None) -> contextlib.AbstractContextManager:
    """The mode ``kind`` (one of :data:`MODES`) entered, or no mode for ``None``."""
    return contextlib.nullcontext() if kind is None else MODE_CLASSES[kind]()
