"""Storage layouts of a built tree: parameters that are slices of one flat vector, buffers that are
views of longer tensors (:func:`share_storage`).

Both are states users' modules are in: ``torch.nn.utils.vector_to_parameters`` (and flat-buffer
optimizers, FSDP's flat parameters) leaves every parameter's data a slice of one vector, and a
buffer registered as a slice of a precomputed table (``self.register_buffer('pe', table[:n])``)
is a view (``_base`` set). The slices are disjoint, so every slot keeps values of its own.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

STORAGES = ("flat-parameters", "view-buffers")


def share_storage(root: nn.Module, storage: str) -> None:
    """Lay out ``root``'s plain tensors as ``storage`` says, values kept:

    - ``'flat-parameters'``: the distinct plain parameters of each dtype (registration order)
      become slices of one flat vector, through ``torch.nn.utils.vector_to_parameters``; each
      parameter object stays in its slots with its ``requires_grad`` and grad.
    - ``'view-buffers'``: each distinct plain buffer becomes the leading slice of a longer
      tensor of its own (``buffer._base`` is that tensor); every slot that held it holds the
      view. One table per buffer: views of one base share its version counter, so an in-place
      update of one buffer (a running statistic) would fail a backward through another.

    Plain means exactly ``nn.Parameter``/``torch.Tensor``, strided, contiguous and holding values:
    lazy, meta, sparse and subclass tensors keep their own storage. ``''`` changes nothing.
    """
    if storage == "flat-parameters":
        for group in _groups(root, "_parameters", nn.Parameter).values():
            _flatten_parameters(group)
    elif storage == "view-buffers":
        _view_buffers(root, [b for group in _groups(root, "_buffers", torch.Tensor).values()
                             for b in group])
    elif storage:
        raise ValueError(f"storage must be '' or one of {STORAGES}, not {storage!r}")


def _groups(root: nn.Module, registry: str, cls: type) -> dict[torch.dtype, list[Tensor]]:
    """The distinct plain tensors of one registry, by dtype, in registration order."""
    groups: dict[torch.dtype, dict[int, Tensor]] = {}
    for module in root.modules():
        for t in getattr(module, registry).values():
            if _is_plain(t, cls):
                groups.setdefault(t.dtype, {})[id(t)] = t
    return {dtype: list(ts.values()) for dtype, ts in groups.items()}


def _is_plain(t: object, cls: type) -> bool:
    return (type(t) is cls and t.layout == torch.strided and not t.is_meta
            and t.is_contiguous() and t.numel() > 0)


def _flatten_parameters(group: list[Tensor]) -> None:
    flat = torch.cat([p.detach().reshape(-1) for p in group])
    nn.utils.vector_to_parameters(flat, group)


def _view_buffers(root: nn.Module, group: list[Tensor]) -> None:
    views = {id(b): _as_view(b) for b in group}
    for module in root.modules():
        for name, b in module._buffers.items():
            if b is not None and id(b) in views:
                module._buffers[name] = views[id(b)]


def _as_view(b: Tensor) -> Tensor:
    """``b``'s values as the leading slice of a longer tensor of its own."""
    table = torch.cat([b.reshape(-1), b.new_zeros(1)])
    return table[:b.numel()].view(b.shape)
