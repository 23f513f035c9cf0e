"""The model of the old-style (forward-pre-hook) reparametrizations the ``OLD-STYLE-`` properties
judge by: the slots one keeps, the value it makes its tensor read, and the hooks it leaves."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from swapspec.properties.models.outcomes import Outcome, seeded_attempt
from swapspec.strategies.old_style import OldStyle

HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_state_dict_pre_hooks",
               "_state_dict_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def kept_slots(old_style: OldStyle, name: str) -> tuple[str, ...]:
    """The slots the reparametrization of ``name`` keeps on its module in place of ``name``:
    ``<name>_orig`` and ``<name>_mask`` (pruning), ``<name>_g`` and ``<name>_v`` (weight_norm)."""
    suffixes = ("_g", "_v") if old_style.first is None else ("_orig", "_mask")
    return tuple(name + s for s in suffixes)


def reparametrized_value(owner: nn.Module, name: str, old_style: OldStyle) -> Tensor:
    """What the reparametrization makes ``owner.name`` read, computed from the slots it keeps:
    ``mask * orig`` in ``orig``'s dtype, or ``g * v / ||v||`` with the norm over every dimension
    but ``dim`` (all of them where ``dim`` is None)."""
    first, second = (getattr(owner, s) for s in kept_slots(old_style, name))
    with torch.no_grad():
        if old_style.first is None:
            dim = -1 if old_style.norm_dim is None else old_style.norm_dim
            return torch._weight_norm(second, first, dim).detach().clone()
        return (second.to(dtype=first.dtype) * first).detach().clone()


def hook_keys(owner: nn.Module) -> dict[str, tuple[int, ...]]:
    """The handle ids of each of the module's hook tables, by table name."""
    return {table: tuple(getattr(owner, table, {})) for table in HOOK_TABLES}


def seeded_forward(module: nn.Module, x: Tensor | None) -> Outcome:
    """The module's forward on ``x`` without grad, under a forked RNG seeded alike every time
    (so dropout drops the same entries)."""
    with torch.no_grad():
        return seeded_attempt(lambda: module(x))
