"""The model of the old-style (forward-pre-hook) reparametrizations the ``OLD-STYLE-`` properties
judge by: the slots one keeps, the value it makes its tensor read, and the hooks it leaves."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from swapspec.strategies.old_style import OldStyle

HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_state_dict_pre_hooks",
               "_state_dict_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


KEPT_SUFFIXES = {"prune": ("_orig", "_mask"), "weight_norm": ("_g", "_v"),
                 "spectral_norm": ("_orig", "_u", "_v")}
TRANSPOSED_CONVOLUTIONS = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def kept_slots(old_style: OldStyle, name: str) -> tuple[str, ...]:
    """The slots the reparametrization of ``name`` keeps on its module in place of ``name``:
    ``<name>_orig`` and ``<name>_mask`` (pruning), ``<name>_g`` and ``<name>_v`` (weight_norm),
    ``<name>_orig``, ``<name>_u`` and ``<name>_v`` (spectral_norm)."""
    kind = "prune" if old_style.first is not None else old_style.norm
    return tuple(name + s for s in KEPT_SUFFIXES[kind])


def reparametrized_value(owner: nn.Module, name: str, old_style: OldStyle) -> Tensor:
    """What the reparametrization makes ``owner.name`` read, computed from the slots it keeps:
    ``mask * orig`` in ``orig``'s dtype; ``g * v / ||v||`` with the norm over every dimension
    but ``dim`` (all of them where ``dim`` is None); ``orig / (u . (W v))`` with ``W`` the
    tensor as a matrix along the spectral dim (:func:`spectral_dim`)."""
    slots = [getattr(owner, s) for s in kept_slots(old_style, name)]
    with torch.no_grad():
        if old_style.first is not None:
            orig, mask = slots
            return (mask.to(dtype=orig.dtype) * orig).detach().clone()
        if old_style.norm == "weight_norm":
            g, v = slots
            dim = -1 if old_style.norm_dim is None else old_style.norm_dim
            return torch._weight_norm(v, g, dim).detach().clone()
        return spectral_value(*slots, spectral_dim(owner, old_style)).detach().clone()


def spectral_value(orig: Tensor, u: Tensor, v: Tensor, dim: int) -> Tensor:
    """``orig / (u . (W v))``, ``W`` being ``orig`` as a matrix whose rows run along ``dim``."""
    matrix = orig.movedim(dim, 0)
    matrix = matrix.reshape(matrix.shape[0], -1)
    return orig / torch.dot(u, torch.mv(matrix, v))


def spectral_dim(owner: nn.Module, old_style: OldStyle) -> int:
    """The dimension spectral_norm reads as the matrix's rows: the drawn one, else 1 for a
    transposed convolution and 0 for any other module (torch's documented default)."""
    if old_style.norm_dim is not None:
        return old_style.norm_dim
    return 1 if isinstance(owner, TRANSPOSED_CONVOLUTIONS) else 0


def hook_keys(owner: nn.Module) -> dict[str, tuple[int, ...]]:
    """The handle ids of each of the module's hook tables, by table name."""
    return {table: tuple(getattr(owner, table, {})) for table in HOOK_TABLES}

