"""The running target, as the properties' strategies see it at draw time.

The plugin enters :func:`running` around each property test of a target: it sets ``CURRENT`` to
the target and, for a target that plugs in its own ``modules`` or ``conversions``, enters
``strategies.host_material.hosting`` with them, so every strategy that draws trees or
conversions (``module_trees``, ``conversions``, ``modules_with_conversions``, and all built on
them) draws the host's material beside the built-ins. Both are left when the test ends, however
it ends. A target without host material draws exactly the built-ins.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from swapspec.strategies.host_material import hosting

CURRENT: ContextVar[Any] = ContextVar("swapspec_current_target", default=None)


@contextmanager
def running(target: Any) -> Iterator[None]:
    """``target`` is the running one (``CURRENT``), its host material the one drawn."""
    token = CURRENT.set(target)
    try:
        with hosting(getattr(target, "modules", None), getattr(target, "conversions", None)):
            yield
    finally:
        CURRENT.reset(token)
