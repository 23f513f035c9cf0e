"""``swap_call``: mylib's own functional call, written by hand (no ``torch.func``).

Its design, where torch's differs:

- one dict, each name written on its own (no ties: torch's ``tie_weights=False``), no
  ``strict``;
- registered names only: a name that is not a registered parameter or buffer raises
  ``KeyError`` (torch sets it as a plain attribute for the call);
- no write-back: a buffer that forward rebinds is not written into the caller's dict.
- a lazy module's uninitialized tensor takes no value (``ValueError``), as the spec says;
  torch takes it and its forward initializes the module around it.

``MYLIB_PLANTED_BUG`` plants bugs (comma-separated, each independent of the other):
``detach`` swaps in ``value.detach()`` instead of the given tensor, ``refuse-none`` refuses a
name given ``None`` (which torch takes as "no tensor for the call").
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedTensorMixin


def swap_call(module: nn.Module, tensors: dict, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with ``tensors`` in the registered slots they name."""
    if not isinstance(tensors, dict):
        raise ValueError(f"swap_call: expected a dict of tensors, got {type(tensors)}")
    planted = os.environ.get("MYLIB_PLANTED_BUG", "").split(",")
    slots = {name: _slot(module, name, value, planted) for name, value in tensors.items()}
    _one_value_per_slot(tensors, slots)
    saved = []
    try:
        for name, (table, key) in slots.items():
            value = tensors[name]
            saved.append((table, key, table[key]))
            table[key] = value.detach() if "detach" in planted and value is not None else value
        return module(*args, **kwargs)
    finally:
        for table, key, original in reversed(saved):
            table[key] = original


def _slot(module: nn.Module, name: str, value: Any, planted: list[str]) -> tuple[dict, str]:
    """The slot table (``_parameters`` or ``_buffers``) holding ``name``, and its key."""
    if value is None and "refuse-none" in planted:
        raise TypeError(f"swap_call: {name!r} was given None")
    if value is not None and not isinstance(value, torch.Tensor):
        raise TypeError(f"swap_call: {name!r} was given {type(value).__name__}, not a tensor")
    prefix, _, key = name.rpartition(".")
    try:
        owner = module.get_submodule(prefix)
    except AttributeError:
        raise KeyError(f"swap_call: {name!r} is not a registered parameter or buffer") from None
    for table in (owner._parameters, owner._buffers):
        if key in table:
            _refuse_lazy(owner, name, table[key], value)
            return table, key
    raise KeyError(f"swap_call: {name!r} is not a registered parameter or buffer")


def _refuse_lazy(owner: nn.Module, name: str, current: Any, value: Any) -> None:
    """A lazy module's uninitialized tensor takes no other value: its first forward would
    initialize the module around it."""
    lazy = isinstance(owner, LazyModuleMixin) and hasattr(owner, "_initialize_hook")
    if lazy and isinstance(current, UninitializedTensorMixin) and value is not current:
        raise ValueError(f"swap_call: {name!r} is uninitialized: run one forward first")


def _one_value_per_slot(tensors: dict, slots: dict[str, tuple[dict, str]]) -> None:
    """Two names of one slot (a shared submodule's paths) must give one object."""
    first: dict[tuple[int, str], str] = {}
    for name, (table, key) in slots.items():
        other = first.setdefault((id(table), key), name)
        if tensors[other] is not tensors[name]:
            raise ValueError(f"swap_call: {other!r} and {name!r} name one slot with two values")
