"""The running target's host material: its own modules and conversions, which the suite's
strategies draw beside the built-ins.

A target may plug in ``modules`` (a strategy of :class:`~strategies.host_leaves.HostModule`) and
``conversions`` (a strategy of :class:`~strategies.conversions.Conversion`). The pytest plugin
enters :func:`hosting` with them around each property test of such a target (and leaves it after,
even on failure); the strategies read them at draw time with :func:`host_material`:

* :func:`~strategies.tree_draws.module_trees` draws a host module as some of a tree's leaves
  (its ``host_chance`` option), so host modules sit inside trees with sharing, ties elsewhere,
  grads, hooks, decorations, training mode, and everything else a tree carries;
* :func:`~strategies.conversions.conversions` and
  :func:`~strategies.conversions.modules_with_conversions` draw a host conversion as one of the
  plain ones (where the property's filters accept it).

Every property family draws its trees and conversions through those, so none of them wraps its
strategies itself. Outside :func:`hosting` (a target without host material, a host's own test,
``python -m strategies.reach``) the material is empty and every strategy draws exactly what it
draws without this module: not one extra choice.

The variable is a ``ContextVar``, so a thread or task started inside :func:`hosting` sees it and
one started elsewhere does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st


@dataclass(frozen=True)
class HostMaterial:
    """A target's own ``modules`` (a strategy of ``HostModule``) and ``conversions`` (a strategy
    of ``Conversion``); either may be None."""

    modules: st.SearchStrategy[Any] | None = None
    conversions: st.SearchStrategy[Any] | None = None

    def __bool__(self) -> bool:
        return self.modules is not None or self.conversions is not None


NONE = HostMaterial()

_MATERIAL: ContextVar[HostMaterial] = ContextVar("swapspec_host_material", default=NONE)


def host_material() -> HostMaterial:
    """The host material of the running target (empty outside :func:`hosting`)."""
    return _MATERIAL.get()


@contextmanager
def hosting(modules: st.SearchStrategy[Any] | None = None,
            conversions: st.SearchStrategy[Any] | None = None) -> Iterator[HostMaterial]:
    """Make ``modules`` and ``conversions`` the host material the strategies draw, until the
    block ends (however it ends)."""
    material = HostMaterial(modules, conversions)
    token = _MATERIAL.set(material)
    try:
        yield material
    finally:
        _MATERIAL.reset(token)
