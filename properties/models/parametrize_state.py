"""The model of ``torch.nn.utils.parametrize`` the ``PARAMETRIZE-`` properties judge by: which
tensor of a drawn tree they parametrize, its originals, the value a registration makes it read,
and the module's parametrization layout."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from swapspec.properties.models.invariants import input_for
from swapspec.properties.models.outcomes import Outcome, attempt
from swapspec.strategies import build_tree, tree_info
from swapspec.strategies.tree_needs import plain_matrices


def matrix_slot(module: nn.Module) -> tuple[str, str]:
    """``(path, name)`` of the tree's first plain matrix parameter (a tree drawn with the need
    ``'parametrizable'`` has one, kept out of ties); it may carry a drawn parametrization."""
    return plain_matrices(tree_info(module).spec.root)[0]


def owner_at(module: nn.Module, path: str) -> nn.Module:
    return module.get_submodule(path) if path else module


def originals(owner: nn.Module, name: str) -> list[Tensor]:
    """The originals of the parametrized ``owner.name``: ``[original]`` or ``original0, ...``."""
    plist = owner.parametrizations[name]
    if plist.is_tensor:
        return [plist.original]
    return [getattr(plist, f"original{i}") for i in range(plist.ntensors)]


def read(owner: nn.Module, name: str) -> Tensor:
    """A detached copy of what ``owner.name`` reads now."""
    with torch.no_grad():
        return getattr(owner, name).detach().clone()


def registered_value(parametrization: nn.Module, value: Tensor, *, stacked: bool) -> Tensor:
    """What a tensor reading ``value`` reads after registering ``parametrization`` on it: stacked,
    the parametrization of the value; first, the parametrization of its ``right_inverse`` (the
    identity where it has none or raises ``NotImplementedError``)."""
    with torch.no_grad():
        if stacked:
            return parametrization(value)
        stored: Any = value
        if hasattr(parametrization, "right_inverse"):
            with contextlib.suppress(NotImplementedError):
                stored = parametrization.right_inverse(value)
        return parametrization(*stored) if isinstance(stored, tuple) else parametrization(stored)


def forward(module: nn.Module) -> Outcome:
    """The module's forward on the suite's fixed input, without grad."""
    with torch.no_grad():
        return attempt(lambda: module(input_for(module)))


def layout(module: nn.Module) -> dict[str, tuple]:
    """Per module path: its class, its class before parametrizations, and per parametrized name
    the parametrization classes in order."""
    out = {}
    for path, m in module.named_modules(remove_duplicate=False):
        lists = getattr(m, "parametrizations", {}) if parametrize.is_parametrized(m) else {}
        out[path] = (type(m).__name__, parametrize.type_before_parametrizations(m).__name__,
                     {n: tuple(type(p).__name__ for p in plist) for n, plist in lists.items()})
    return out


def undecorated_build(module: nn.Module) -> nn.Module:
    """A fresh build of the tree without its drawn decorations (its tensors plain)."""
    return build_tree(dataclasses.replace(tree_info(module).spec, decorations=()))
