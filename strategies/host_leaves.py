"""A host's own modules as leaves of drawn trees: ``HostModule`` (a name, a builder, how forward
takes the input), the registry that makes one buildable by name, and the ``HostLeaf`` a tree
builds for it. The rules are in ``strategies.host_modules``, which draws host trees; the tree
builder (``strategies.trees``) imports this module only, so the two never import each other.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import Tensor, nn

from swapspec.strategies.torch_modules import seeded


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


def _floating_dtype(module: nn.Module) -> Any:
    """The dtype of the module's first floating or complex parameter or buffer, else None."""
    for t in (*module.parameters(), *module.buffers()):
        if t.is_floating_point() or t.is_complex():
            return t.dtype
    return None


class HostLeaf(nn.Module):
    """A host's module (child ``inner``) with the swapspec forward contract: ``forward(x, **kwargs)``
    runs ``inner(*inputs(x))`` with ``x`` in the dtype of the module's first floating tensor (a
    converted module takes its own dtype, as the built-in layers cast their input), and returns
    the result in ``x``'s dtype (a complex result's real part); ``kwargs`` (``fail``,
    ``report``) are not passed on."""

    def __init__(self, entry: str, inner: nn.Module, inputs: Callable[[Tensor], tuple]) -> None:
        super().__init__()
        self.entry = entry
        self.inner = inner
        self.inputs = inputs

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        dtype = _floating_dtype(self.inner)
        out = self.inner(*self.inputs(x if dtype is None else x.to(dtype)))
        if not isinstance(out, Tensor):
            return out
        return (out.real if out.is_complex() else out).to(x.dtype)

    def extra_repr(self) -> str:
        return f"entry={self.entry!r}"


_REGISTERED: dict[str, HostModule] = {}


def register(host: HostModule) -> str:
    """Make ``host`` buildable by name (a later one of the same name replaces it); its name."""
    if not isinstance(host, HostModule):
        raise TypeError(f"a target's modules strategy must draw HostModule, got {type(host).__name__}")
    _REGISTERED[host.name] = host
    return host.name


def registered(entry: str) -> HostModule:
    """The registered host module ``entry`` (``KeyError`` if none)."""
    try:
        return _REGISTERED[entry]
    except KeyError:
        raise KeyError(f"no host module {entry!r} registered: draw it from host_trees first") from None


def build_leaf(entry: str) -> HostLeaf:
    """A fresh :class:`HostLeaf` for the registered module ``entry``, built with torch's and
    Python's global RNGs seeded with 0 and restored after (``seeded``): a host's constructor may
    draw from them (``nn.Linear``'s initialization does), so a build gives the same values every
    time and drawing a tree changes no global state."""
    host = registered(entry)
    with seeded(0):
        module = host.build()
    return HostLeaf(entry, module, host.inputs)
