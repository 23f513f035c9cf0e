"""Strategies a target plugs into: its own conversions and modules, drawn alongside the built-ins.

The plugin sets ``CURRENT`` to the target of the running property test (and resets it after),
so a property's module-level strategy can read the target at draw time: ``with_conversions(base)``
draws from ``base`` or from the target's ``conversions``, one chance in two each;
``with_modules(base)`` likewise from ``base`` or the target's ``modules``
(``swapspec.strategies.HostModule`` s, built as one-leaf trees). A target without them, or no
running target, draws from ``base`` alone.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from hypothesis import event
from hypothesis import strategies as st

from swapspec.strategies import host_trees

CURRENT: ContextVar[Any] = ContextVar("swapspec_current_target", default=None)

_PLUGGED: dict[tuple[int, int], tuple[Any, st.SearchStrategy]] = {}


def _one_of(base: st.SearchStrategy, extra: Any, make: Any) -> st.SearchStrategy:
    """``st.one_of(base, make(extra))``, made once per pair (each draw would rebuild it)."""
    key = (id(base), id(extra))
    if key not in _PLUGGED:
        _PLUGGED[key] = ((base, extra), st.one_of(base, make(extra)))
    return _PLUGGED[key][1]


@st.composite
def _plugged(draw: Any, base: st.SearchStrategy, field: str, make: Any) -> Any:
    extra = getattr(CURRENT.get(), field, None)
    return draw(base if extra is None else _one_of(base, extra, make))


def with_conversions(base: st.SearchStrategy) -> st.SearchStrategy:
    """``base`` plus the running target's ``conversions`` (each reported as the event
    ``conversion: <name>``, as the built-ins are)."""
    return _plugged(base, "conversions", lambda s: s.map(_reported))


def _reported(conversion: Any) -> Any:
    event(f"conversion: {conversion.tag}")
    return conversion


def with_modules(base: st.SearchStrategy) -> st.SearchStrategy:
    """``base`` plus the running target's ``modules``, each as a one-leaf tree."""
    return _plugged(base, "modules", host_trees)


@st.composite
def _with_own_conversion(draw: Any, base: st.SearchStrategy) -> tuple[Any, Any]:
    module, conversion = draw(base)
    extra = getattr(CURRENT.get(), "conversions", None)
    if extra is not None and draw(st.booleans()):
        conversion = _reported(draw(extra))
    return module, conversion


def with_converted(base: st.SearchStrategy) -> st.SearchStrategy:
    """``base`` draws ``(module, conversion)``; with the running target's ``conversions``, the
    conversion is one of the target's own one chance in two."""
    return _with_own_conversion(base)
