"""``functional_call`` and ``call_with``: run a module with other tensors in place of its own.

mylib's design, on top of ``torch.func.functional_call``:

- a tuple of dicts is read like a ``collections.ChainMap``: when two dicts give one name, the
  later dict wins (torch raises ``ValueError`` there);
- errors keep torch's types but speak mylib's words (``mylib.functional_call: ...``);
- ``call_with(module, tensors, *args, **kwargs)`` is the short form: one dict, each name
  written on its own (torch's ``tie_weights=False``), no ``strict``.

Setting ``MYLIB_PLANTED_BUG=ignore-strict`` plants a bug: ``strict`` is ignored.
"""

from __future__ import annotations

import os
from collections import ChainMap
from typing import Any

import torch
from torch import nn

_REWORDED = (ValueError, TypeError, KeyError, AttributeError, RuntimeError)


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: dict | None = None,
                    *, tie_weights: bool = True, strict: bool = False) -> Any:
    """Call ``module`` with ``tensors`` in place of its own parameters and buffers."""
    if isinstance(tensors, tuple | list) and _overlapping(tensors):
        tensors = dict(ChainMap(*reversed(tensors)))
    if os.environ.get("MYLIB_PLANTED_BUG") == "ignore-strict":
        strict = False
    try:
        return torch.func.functional_call(module, tensors, args, kwargs,
                                          tie_weights=tie_weights, strict=strict)
    except _REWORDED as e:
        if type(e) not in _REWORDED:
            raise  # the forward's own error types pass unchanged
        raise type(e)(f"mylib.functional_call: {_text(e)}") from e


def call_with(module: nn.Module, tensors: dict, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with ``tensors`` in place of its own tensors."""
    return functional_call(module, tensors, args, kwargs, tie_weights=False)


def _overlapping(dicts: Any) -> bool:
    if not all(isinstance(d, dict) for d in dicts):
        return False
    keys = [k for d in dicts for k in d]
    return len(keys) != len(set(keys))


def _text(e: BaseException) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
