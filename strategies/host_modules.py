"""A host's own modules, drawn by the properties alongside the built-in trees.

A host describes each of its modules as a :class:`HostModule`; its target's ``modules`` is a
strategy of them (``st.sampled_from([...])`` or ``st.builds(HostModule, ...)``). Rules:

* ``name`` identifies the module: one name, one module. The tree spec records only the name
  (``LeafSpec(kind="host", entry=name)``), and rebuilding looks it up here.
* ``build()`` returns a fresh module with the same tensors on every call (seed what it draws).
* ``inputs(x)`` turns the properties' forward input ``x``, a float32 tensor of shape
  ``(BATCH, FEATURES)``, into the positional arguments of the module's forward (default ``(x,)``).
  The forward returns a tensor.

:func:`host_trees` makes each drawn ``HostModule`` a one-leaf tree: a :class:`HostLeaf` root
whose child ``inner`` is the host's module, so every property that rebuilds, copies or
reports a drawn tree does the same with it. Names the properties give are the module's names
under ``inner.`` (``inner.weight``). ``HostModule.source`` gives the lines a standalone repro
needs to build the module without swapspec, when ``build`` is importable.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from torch import Tensor, nn


def _as_args(x: Tensor) -> tuple[Tensor]:
    return (x,)


def _literal(value: Any) -> bool:
    """Whether ``repr(value)`` evaluates back to an equal value (plain literals only)."""
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):
        return False


@dataclass(frozen=True)
class HostModule:
    """One of a host's modules: a name, a builder, and how forward takes the input (see the module
    docstring for the rules)."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[Tensor], tuple[Any, ...]] = _as_args

    def source(self, var: str = "inner") -> str | None:
        """Python lines that build the module into ``var``, when ``build`` is an importable
        class or function, or a ``functools.partial`` of one with literal arguments; else None."""
        func, args, kwargs = self.build, (), {}
        if isinstance(func, partial):
            func, args, kwargs = func.func, func.args, func.keywords
        module, name = getattr(func, "__module__", None), getattr(func, "__qualname__", "")
        if module is None or not name.isidentifier() or not _literal((args, kwargs)):
            return None
        call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        return f"from {module} import {name}\n{var} = {name}({call})\n"


class HostLeaf(nn.Module):
    """A host's module (child ``inner``) with the swapspec forward contract: ``forward(x, **kwargs)``
    runs ``inner(*inputs(x))``; ``kwargs`` (``fail``, ``report``) are not passed on."""

    def __init__(self, entry: str, inner: nn.Module, inputs: Callable[[Tensor], tuple]) -> None:
        super().__init__()
        self.entry = entry
        self.inner = inner
        self.inputs = inputs

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        return self.inner(*self.inputs(x))

    def extra_repr(self) -> str:
        return f"entry={self.entry!r}"


_REGISTERED: dict[str, HostModule] = {}


def register(host: HostModule) -> str:
    """Make ``host`` buildable by name (a later one of the same name replaces it); its name."""
    if not isinstance(host, HostModule):
        raise TypeError(f"a target's modules strategy must draw HostModule, got {type(host).__name__}")
    _REGISTERED[host.name] = host
    return host.name


def build_leaf(entry: str) -> HostLeaf:
    """A fresh :class:`HostLeaf` for the registered module ``entry``."""
    try:
        host = _REGISTERED[entry]
    except KeyError:
        raise KeyError(f"no host module {entry!r} registered: draw it from host_trees first") from None
    return HostLeaf(entry, host.build(), host.inputs)


def host_trees(modules: st.SearchStrategy[HostModule]) -> st.SearchStrategy[nn.Module]:
    """Draw one of ``modules`` as a built one-leaf tree (``tree_info`` knows it). Reports
    ``hypothesis.event('tree: host: <name>')``."""
    return modules.map(_host_tree)


def _host_tree(host: HostModule) -> nn.Module:
    from swapspec.strategies.trees import LeafSpec, TreeSpec, build_tree

    tree = build_tree(TreeSpec(root=LeafSpec(kind="host", entry=register(host))))
    event(f"tree: host: {host.name}")
    return tree
