"""The spec's ``NamedMemberAccessor``: torch's (``torch.nn.utils._named_member_accessor``), with
every batched write atomic (``set_tensors``, ``set_tensors_dict``, ``swap_tensors``,
``swap_tensors_dict``, ``del_tensors``): a call that raises leaves every module of the tree as it
was, whatever it wrote before the error (a name through a shared child included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn.utils._named_member_accessor import NamedMemberAccessor as TorchAccessor

R = TypeVar("R")
REGISTRIES = ("_parameters", "_buffers", "_modules")


def _saved(module: nn.Module) -> list[tuple[nn.Module, dict, dict[str, dict], set]]:
    """Per module of the tree: its ``__dict__``, its registries and its non-persistent set,
    shallow-copied."""
    return [(m, dict(m.__dict__), {r: dict(getattr(m, r)) for r in REGISTRIES},
             set(m._non_persistent_buffers_set)) for m in module.modules()]


def _restore(saved: list[tuple[nn.Module, dict, dict[str, dict], set]]) -> None:
    """Put every saved module back: its ``__dict__`` entries, then its registries' contents in
    their own dict objects."""
    for m, attributes, registries, non_persistent in saved:
        for key in [k for k in m.__dict__ if k not in attributes]:
            del m.__dict__[key]
        m.__dict__.update(attributes)
        for registry, content in registries.items():
            table = getattr(m, registry)
            table.clear()
            table.update(content)
        m._non_persistent_buffers_set.clear()
        m._non_persistent_buffers_set.update(non_persistent)


def atomic(module: nn.Module, run: Callable[[], R]) -> R:
    """``run()``; if it raises, every module of ``module``'s tree is put back first."""
    saved = _saved(module)
    try:
        return run()
    except BaseException:
        _restore(saved)
        raise


class NamedMemberAccessor(TorchAccessor):
    """torch's accessor whose batched writes leave the tree as it was when they raise."""

    def set_tensors(self, names: Iterable[str], values: Iterable[torch.Tensor]) -> None:
        atomic(self.module, lambda: super(NamedMemberAccessor, self).set_tensors(names, values))

    def set_tensors_dict(self, named_tensors: dict[str, torch.Tensor]) -> None:
        atomic(self.module,
               lambda: super(NamedMemberAccessor, self).set_tensors_dict(named_tensors))

    def del_tensors(self, names: Iterable[str]) -> None:
        atomic(self.module, lambda: super(NamedMemberAccessor, self).del_tensors(names))

    def swap_tensors(self, names: Iterable[str], values: Iterable[torch.Tensor],
                     allow_missing: bool = False) -> list[torch.Tensor]:
        return atomic(self.module, lambda: super(NamedMemberAccessor, self).swap_tensors(
            names, values, allow_missing=allow_missing))

    def swap_tensors_dict(self, named_tensors: dict[str, torch.Tensor],
                          allow_missing: bool = False) -> tuple[dict[str, Any], list[str]]:
        return atomic(self.module, lambda: super(NamedMemberAccessor, self).swap_tensors_dict(
            named_tensors, allow_missing=allow_missing))
