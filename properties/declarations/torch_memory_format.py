"""Declared deviations of torch's layout conversions of convolution weights
(``torch.nn.utils.convert_conv2d_weight_memory_format`` and the 3-D one) from
``APPLY-CONV-MEMORY-FORMAT``.

The predicates read the drawn call (``Example.method``, a ``strategies.memory_formats.ConvFormat``)
and the module before the target converts it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.declarations.torch_parametrize import TORCH_CHECKED, converts_to_wrapper
from swapspec.properties.models.outcomes import attempt
from swapspec.properties.vocabulary import Deviation
from swapspec.reference.methods import CONVOLUTIONS_2D, CONVOLUTIONS_3D
from swapspec.strategies.memory_formats import ConvFormat


def layout_lost_on_wrapper(example: Any) -> bool:
    """A layout a convolution's weight does not have yet, on weights the conversion makes a
    traceable wrapper subclass (``TwoTensor``) that copies itself in it."""
    call = example.method
    if not isinstance(call, ConvFormat) or not call.fits or not converts_to_wrapper(example):
        return False
    kinds = CONVOLUTIONS_2D if call.rank == 2 else CONVOLUTIONS_3D
    converted = [_converted(example, m.weight) for m in example.module.modules()
                 if isinstance(m, kinds) and isinstance(m.weight, torch.Tensor)]
    if any(c is None or not _copies_in(c, call.memory_format) for c in converted):
        return False  # torch raises before it writes anything
    return any(is_traceable_wrapper_subclass(c)
               and not c.is_contiguous(memory_format=call.memory_format) for c in converted)


def _converted(example: Any, weight: torch.Tensor) -> torch.Tensor | None:
    """The weight as the example's conversion makes it (None where the conversion raises)."""
    return attempt(lambda: example.conversion.make_fn()(weight.detach())).result


def _copies_in(t: torch.Tensor, memory_format: torch.memory_format) -> bool:
    """Whether ``t`` copies itself in the format (a sparse tensor, or a class that does not
    implement the copy, cannot)."""
    return attempt(lambda: t.detach().clone(memory_format=memory_format)).error is None


MEMORY_FORMAT_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "APPLY-CONV-MEMORY-FORMAT", layout_lost_on_wrapper, "layout",
        "convert_conv2d_weight_memory_format (and the 3-D one) writes the new layout with "
        "`module.weight.data = ...`, and on a traceable wrapper subclass (TwoTensor) set_data "
        "replaces the outer TensorImpl but not the inner tensors the subclass computes with: the "
        "weight's strides say channels_last while the tensors the convolution runs on keep their "
        "old layout (torch 2.13, 2.14). Repro: from torch.testing._internal.two_tensor import "
        "TwoTensor; m = nn.Conv2d(2, 3, 3); m._apply(lambda t: TwoTensor(t.detach(), "
        "t.detach().clone())); torch.nn.utils.convert_conv2d_weight_memory_format(m, "
        "torch.channels_last); m.weight.is_contiguous(memory_format=torch.channels_last)  # True; "
        "m.weight.a.is_contiguous(memory_format=torch.channels_last)  # False",
        torch_versions=TORCH_CHECKED, id="torch.conv-memory-format-lost-on-wrapper"),
)
