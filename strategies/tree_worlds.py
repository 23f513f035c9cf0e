"""Tensor worlds: rebinding every tensor of a built tree into ``meta``, ``FakeTensor``, ``TwoTensor`` or
``DTensor`` values, as if the tree had been built there (:func:`move_to_world`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def move_to_world(root: nn.Module, world: str) -> None:
    """Put every registered tensor of ``root`` into ``world``, as if the tree had been built there.

    - ``'meta'``: every tensor becomes a ``meta`` tensor of its shape and dtype (``torch.device('meta')``
      at construction); ``to_empty`` is how such a tree gets storage.
    - ``'fake'``: every tensor becomes a ``FakeTensor`` of one ``FakeTensorMode`` (built under
      ``FakeTensorMode``); forward runs, on no values.
    - ``'two-tensor'``: every floating parameter holds a ``TwoTensor`` of its value and a copy (a
      traceable wrapper subclass, as ``DTensor`` and quantized weights are).
    - ``'dtensor'``: every floating parameter holds a ``DTensor`` of its value, replicated over the
      one-rank CPU mesh of :mod:`~strategies.dtensor_world` (as ``fully_shard`` and tensor
      parallelism leave parameters; buffers stay plain). Forward does not run there: DTensor
      refuses the plain tensors the suite's leaves mix in.

    Slots are rebound directly (torch's ``_apply`` is what the suite tests, so the builder never runs it):
    one tensor object stays one object in every slot that held it, parameters keep ``requires_grad``,
    and RNNs rebuild ``_flat_weights`` from the new parameters. Moved parameters carry no grad.
    A lazy module's uninitialized tensors are made again on ``meta`` in the ``'meta'`` world (so its
    first forward materializes them there, as under ``torch.device('meta')``) and stay as they are
    in the other worlds. ``''`` changes nothing.
    """
    if not world:
        return
    convert = _WORLD_MAKERS[world]()
    moved: dict[int, tuple[Tensor, Tensor]] = {}  # id -> (old, new); old kept alive so ids stay unique
    for module in root.modules():
        for slots in (module._parameters, module._buffers):
            for name, t in slots.items():
                lazy = isinstance(t, nn.parameter.UninitializedTensorMixin)
                if t is None or (lazy and world != "meta"):
                    continue
                if id(t) not in moved:
                    moved[id(t)] = (t, uninitialized_on_meta(t) if lazy else _moved(t, convert))
                slots[name] = moved[id(t)][1]
        if isinstance(module, nn.RNNBase):
            module._init_flat_weights()


def _moved(t: Tensor, convert: Any) -> Tensor:
    """``t`` in the new world (``t`` itself where the world leaves it): a parameter stays a parameter,
    with its ``requires_grad``; a moved parameter has no grad (a tree built there is untrained)."""
    is_param = isinstance(t, nn.Parameter)
    data = convert(t.detach(), is_param)
    if data is None:
        return t
    if not is_param:
        return data
    return data if isinstance(data, nn.Parameter) else nn.Parameter(data, requires_grad=t.requires_grad)


def uninitialized_on_meta(t: Tensor) -> Tensor:
    """A new uninitialized parameter or buffer like ``t`` (dtype, ``requires_grad``, a buffer's
    ``persistent`` where torch has it: 2.5 and later) whose data is on ``meta``, so it
    materializes there."""
    if isinstance(t, nn.parameter.UninitializedParameter):
        return nn.parameter.UninitializedParameter(t.requires_grad, device="meta", dtype=t.dtype)
    persistent = {"persistent": t.persistent} if hasattr(t, "persistent") else {}
    return nn.parameter.UninitializedBuffer(t.requires_grad, device="meta", dtype=t.dtype,
                                            **persistent)


def _meta_maker() -> Any:
    return lambda t, is_param: torch.empty_like(t, device="meta")


def _fake_maker() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return lambda t, is_param: mode.from_tensor(t)


def _two_tensor_maker() -> Any:
    from torch.testing._internal.two_tensor import TwoTensor

    return lambda t, is_param: TwoTensor(t, t.clone()) if is_param and t.is_floating_point() else None


def _dtensor_maker() -> Any:
    from torch.distributed.tensor import Replicate, distribute_tensor

    from swapspec.strategies import dtensor_world

    mesh = dtensor_world.mesh()
    return lambda t, is_param: (distribute_tensor(t, mesh, [Replicate()])
                                if is_param and t.is_floating_point() else None)


_WORLD_MAKERS = {"meta": _meta_maker, "fake": _fake_maker, "two-tensor": _two_tensor_maker,
                 "dtensor": _dtensor_maker}
