"""A quantized-weight library in miniature, for swapspec's own tests: ``QTensor``, a wrapper tensor
subclass that implements only the ops its Linear forward needs, ``QLinear`` (a Linear whose weight
is one), ``quantize`` (a per-tensor conversion), ``fake_quantize`` (a per-tensor conversion that
keeps a module trainable) and a target that reuses torch's built-in one.

``QTensor`` holds ``qdata`` (int8) and ``scale`` (one per row) and stands for ``qdata * scale``.
It is a traceable wrapper subclass (``__tensor_flatten__``/``__tensor_unflatten__``) whose
``__torch_dispatch__`` answers ``detach``, ``t`` (the dequantized transpose, so that ``addmm``
and ``mm`` run on plain tensors), ``_to_copy`` (a new dtype for the scale, a new device for
both), ``alias`` and ``copy_`` (parts copied in place: ``load_state_dict`` loads a QLinear); every other op raises ``NotImplementedError``, as many subclass libraries
do. Nothing here implements ``equal``, ``clone``, ``isnan`` or ``tolist``: the suite's
comparisons, snapshots and repros must do without them.

Select the targets with ``--swapspec-target=tests.planted.quantized:target`` (and ``:opaque``,
whose ``OpaqueQTensor`` is no traceable subclass: the suite cannot copy it, a harness error).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import torch
from hypothesis import strategies as st
from torch import Tensor, nn

from swapspec.properties.harness.targets import builtin_target, torch_apply
from swapspec.strategies import Conversion, HostModule

aten = torch.ops.aten


class OpaqueQTensor(Tensor):
    """``qdata * scale``: int8 ``qdata`` of the tensor's shape, a ``scale`` column (one per row).
    Not traceable (no ``__tensor_flatten__``): the suite cannot see its parts."""

    @staticmethod
    def __new__(cls, qdata: Tensor, scale: Tensor) -> OpaqueQTensor:
        return Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=scale.dtype,
                                             device=qdata.device)

    def __init__(self, qdata: Tensor, scale: Tensor) -> None:
        self.qdata = qdata
        self.scale = scale

    def __repr__(self) -> str:
        return f"{type(self).__name__}(qdata={self.qdata!r}, scale={self.scale!r})"

    def dequantize(self) -> Tensor:
        return self.qdata.to(self.scale.dtype) * self.scale

    def __deepcopy__(self, memo: dict) -> OpaqueQTensor:
        """A copy of its parts (``copy.deepcopy`` of a module that holds one)."""
        import copy

        if id(self) in memo:
            return memo[id(self)]
        out = type(self)(copy.deepcopy(self.qdata, memo), copy.deepcopy(self.scale, memo))
        if getattr(self, "_is_param", False):
            out = nn.Parameter(out, requires_grad=self.requires_grad)
        memo[id(self)] = out
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        handler = _OPS.get(func)
        if handler is None:
            raise NotImplementedError(f"{cls.__name__} does not implement {func}")
        return handler(*args, **(kwargs or {}))


class QTensor(OpaqueQTensor):
    """An ``OpaqueQTensor`` that is a traceable wrapper subclass: its parts are ``qdata`` and
    ``scale``."""

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Tensor], ctx: Any, size: Any, stride: Any) -> QTensor:
        return QTensor(inner["qdata"], inner["scale"])


def _to_copy(q: OpaqueQTensor, *, dtype: Any = None, device: Any = None, **_: Any) -> OpaqueQTensor:
    return type(q)(q.qdata.to(device=device), q.scale.to(device=device, dtype=dtype))


def _copy_(q: OpaqueQTensor, src: Tensor, non_blocking: bool = False) -> OpaqueQTensor:
    """``q.copy_(src)``: ``src``'s parts (a quantized tensor), or ``src`` quantized (a plain
    one), written into ``q``'s own parts (what ``load_state_dict`` needs)."""
    parts = src if isinstance(src, OpaqueQTensor) else quantize_values(src)
    q.qdata.copy_(parts.qdata)
    q.scale.copy_(parts.scale)
    return q


_OPS = {
    aten.detach.default: lambda q: type(q)(q.qdata, q.scale),
    aten.alias.default: lambda q: type(q)(q.qdata, q.scale),
    aten.t.default: lambda q: q.dequantize().t(),
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
}


def quantize_values(t: Tensor, cls: type = QTensor) -> OpaqueQTensor:
    """A floating matrix's values as a ``cls`` (symmetric, per row)."""
    data = t.detach()
    scale = (data.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-8)
    return cls(torch.round(data / scale).clamp(-127, 127).to(torch.int8), scale)


def quantize(t: Tensor, cls: type = QTensor) -> Tensor:
    """A floating matrix as a ``cls`` (symmetric, per row); anything else as it is."""
    if not (t.is_floating_point() and t.dim() == 2) or isinstance(t, OpaqueQTensor):
        return t
    q = quantize_values(t, cls)
    return nn.Parameter(q, requires_grad=False) if isinstance(t, nn.Parameter) else q


def fake_quantize(t: Tensor) -> Tensor:
    """A floating tensor rounded to 255 levels of its own range (symmetric, per tensor), as
    quantization-aware training does: a plain tensor of the input's dtype, device and shape, so
    a module keeps training. Anything else, and a ``QTensor``, as it is."""
    if not t.is_floating_point() or isinstance(t, OpaqueQTensor) or t.numel() == 0:
        return t
    scale = (t.detach().abs().amax() / 127).clamp(min=1e-8)
    return torch.round(t / scale).clamp(-127, 127) * scale


class QLinear(nn.Module):
    """``x @ weight.T + bias`` with a quantized weight (4 features in, 4 out), seeded."""

    weight_class: type = QTensor

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(quantize(torch.randn(4, 4, generator=gen), self.weight_class),
                                   requires_grad=False)
        self.bias = nn.Parameter(torch.randn(4, generator=gen))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class OpaqueQLinear(QLinear):
    """A ``QLinear`` whose weight is an ``OpaqueQTensor``."""

    weight_class = OpaqueQTensor


QUANTIZE = Conversion("planted.quantize", "lambda t: quantize(t)",
                      imports="from tests.planted.quantized import quantize")
FAKE_QUANTIZE = Conversion("planted.fake_quantize", "lambda t: fake_quantize(t)", trainable=True,
                           imports="from tests.planted.quantized import fake_quantize")
Q_LINEARS = st.sampled_from([HostModule(f"planted.QLinear(seed={s})",
                                        partial(QLinear, seed=s))
                             for s in range(2)])

target = dataclasses.replace(builtin_target("torch"), name="quantized",
                             modules=Q_LINEARS,
                             conversions=st.sampled_from([QUANTIZE, FAKE_QUANTIZE]))

# torch's target drawing a module whose weight the suite cannot copy or compare: a run of it
# shows harness errors (no verdict), never the target's FAIL.
opaque = dataclasses.replace(target, name="opaque", conversions=None, modules=st.just(
    HostModule("planted.OpaqueQLinear", OpaqueQLinear)))


def _apply_keeping_matrices(module: nn.Module, fn: Any, *, overwrite: bool, swap: bool,
                            recurse: bool = True) -> nn.Module:
    """torch's ``_apply`` that leaves every matrix as it was (a planted bug)."""
    return torch_apply(module, lambda t: t if t.dim() == 2 else fn(t), overwrite=overwrite,
                       swap=swap, recurse=recurse)


def _call_ignoring_strict(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                          tie_weights: bool = True, strict: bool = False) -> Any:
    """torch's ``functional_call`` with ``strict`` ignored (a planted bug)."""
    return torch.func.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights)


# torch's target with two planted bugs, for repros of host material
buggy = dataclasses.replace(target, name="quantized-buggy", apply=_apply_keeping_matrices,
                            functional_call=_call_ignoring_strict)
