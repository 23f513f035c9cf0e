"""The reference's conversion flags, mirroring ``torch.__future__``.

Rules:
- Two process-global booleans, both ``False`` by default.
- ``flags(...)`` sets the given ones for a ``with`` block and restores the previous
  values on exit, also when the block raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_state = {"overwrite": False, "swap": False}


def get_overwrite_module_params_on_conversion() -> bool:
    """Whether ``apply`` replaces parameters with new objects instead of ``.data =``."""
    return _state["overwrite"]


def set_overwrite_module_params_on_conversion(value: bool) -> None:
    """Set the overwrite flag (see ``get_overwrite_module_params_on_conversion``)."""
    _state["overwrite"] = bool(value)


def get_swap_module_params_on_conversion() -> bool:
    """Whether ``apply`` swaps parameter contents in place with ``swap_tensors``."""
    return _state["swap"]


def set_swap_module_params_on_conversion(value: bool) -> None:
    """Set the swap flag (see ``get_swap_module_params_on_conversion``)."""
    _state["swap"] = bool(value)


@contextmanager
def flags(*, overwrite: bool | None = None, swap: bool | None = None) -> Iterator[None]:
    """Set the given flags inside the block; restore both previous values on exit."""
    saved = dict(_state)
    try:
        if overwrite is not None:
            set_overwrite_module_params_on_conversion(overwrite)
        if swap is not None:
            set_swap_module_params_on_conversion(swap)
        yield
    finally:
        _state.update(saved)
