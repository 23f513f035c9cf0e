"""mylib's quantized weights: ``QWeight`` (an int8 wrapper tensor subclass), ``quantize`` (a
per-tensor conversion), ``quantize_`` (a module-level one) and ``QLinear`` (a quantized layer).

``QWeight`` holds ``qdata`` (int8, the tensor's shape) and ``scale`` (one per row, its dtype is
the tensor's) and stands for ``qdata * scale``. It is a traceable wrapper subclass that
implements only the ops its forward and the operations users call on its modules need:
``detach`` and ``alias`` (``nn.Parameter``, ``state_dict``), ``t`` (the dequantized transpose,
so ``F.linear`` runs on plain tensors), ``_to_copy`` (``module.half()``, ``module.to(...)``: a
new dtype for the scale, a new device for both), ``empty_like`` (``module.to_empty``) and
``copy_`` (``load_state_dict``), and ``copy.deepcopy`` by its parts. Not ``equal``, ``clone``,
``isnan`` or ``tolist``. ``quantize_dequantize`` rounds a plain tensor to its own grid and
keeps it plain (a conversion that keeps a module trainable).

Quantization is symmetric, per row: ``scale = amax(|row|) / 127``, ``qdata = round(w / scale)``,
so each value comes back within half a scale step. Non-finite values are refused
(``ValueError``). ``quantize_(module)`` quantizes the weight of every ``nn.Linear`` in place,
each tied weight once (its slots keep sharing one new ``nn.Parameter``: a documented
rebinding, as torchao's ``quantize_`` does), after checking every weight first: a weight it
refuses leaves the module as it was.

``MYLIB_PLANTED_BUG`` plants bugs (comma-separated): ``untie`` quantizes each tied slot on its
own, ``not-atomic`` quantizes weight by weight and raises half-way, ``scale-dtype`` gives
``quantize``'s scale the dtype float64 (its result is no longer of the input's dtype).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from torch import Tensor, nn

aten = torch.ops.aten


def _planted(bug: str) -> bool:
    return bug in os.environ.get("MYLIB_PLANTED_BUG", "").split(",")


class QWeight(Tensor):
    """``qdata * scale``: int8 ``qdata`` of the tensor's shape and a ``scale`` column."""

    @staticmethod
    def __new__(cls, qdata: Tensor, scale: Tensor) -> QWeight:
        return Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=scale.dtype,
                                             device=qdata.device)

    def __init__(self, qdata: Tensor, scale: Tensor) -> None:
        self.qdata = qdata
        self.scale = scale

    def __repr__(self) -> str:
        return f"QWeight(qdata={self.qdata!r}, scale={self.scale!r})"

    def __deepcopy__(self, memo: dict) -> QWeight:
        """A copy of its parts, a parameter staying one (``copy.deepcopy`` of a quantized
        model, ``torch.save``'s checkpoints of it)."""
        if id(self) in memo:
            return memo[id(self)]
        out = QWeight(copy.deepcopy(self.qdata, memo), copy.deepcopy(self.scale, memo))
        if getattr(self, "_is_param", False):
            out = nn.Parameter(out, requires_grad=self.requires_grad)
        memo[id(self)] = out
        return out

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Tensor], ctx: Any, size: Any,
                             stride: Any) -> QWeight:
        return QWeight(inner["qdata"], inner["scale"])

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: Any = None) -> Any:
        handler = _OPS.get(func)
        if handler is None:
            raise NotImplementedError(f"QWeight does not implement {func}")
        return handler(*args, **(kwargs or {}))


def dequantize(t: Tensor) -> Tensor:
    """A ``QWeight``'s values as a plain tensor (``qdata * scale``); any other tensor as it is."""
    if isinstance(t, QWeight):
        return t.qdata.to(t.scale.dtype) * t.scale
    return t


def _to_copy(q: QWeight, *, dtype: Any = None, device: Any = None, **_: Any) -> QWeight:
    return QWeight(q.qdata.to(device=device), q.scale.to(device=device, dtype=dtype))


def _empty_like(q: QWeight, *, dtype: Any = None, device: Any = None, **_: Any) -> QWeight:
    return QWeight(torch.empty_like(q.qdata, device=device),
                   torch.empty_like(q.scale, dtype=dtype, device=device))


def _copy_(q: QWeight, src: Tensor, non_blocking: bool = False) -> QWeight:
    """``q``'s parts from ``src``: a ``QWeight``'s parts, or a plain tensor quantized."""
    src = src if isinstance(src, QWeight) else _quantized(src.detach())
    q.qdata.copy_(src.qdata)
    q.scale.copy_(src.scale)
    return q


_OPS = {
    aten.detach.default: lambda q: QWeight(q.qdata, q.scale),
    aten.alias.default: lambda q: QWeight(q.qdata, q.scale),
    aten.t.default: lambda q: dequantize(q).t(),
    aten._to_copy.default: _to_copy,
    aten.empty_like.default: _empty_like,
    aten.copy_.default: _copy_,
}


def quantizable(t: Tensor) -> bool:
    """An initialized plain floating matrix with values (not on meta): what ``quantize``
    converts."""
    return (type(t).__torch_dispatch__ is Tensor.__torch_dispatch__
            and not isinstance(t, nn.parameter.UninitializedTensorMixin)
            and t.device.type != "meta" and t.is_floating_point() and t.dim() == 2)


def refused(t: Tensor) -> bool:
    """A quantizable tensor with a non-finite value: ``quantize`` refuses it."""
    return quantizable(t) and not bool(torch.isfinite(t).all())


def _quantized(data: Tensor) -> QWeight:
    if not bool(torch.isfinite(data).all()):
        raise ValueError("mylib.quantize: cannot quantize non-finite values")
    scale = (data.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-8)
    if _planted("scale-dtype"):
        scale = scale.double()
    return QWeight(torch.round(data / scale).clamp(-127, 127).to(torch.int8), scale)


def quantize(t: Tensor) -> Tensor:
    """A plain floating matrix as a ``QWeight`` (an ``nn.Parameter`` stays one, frozen);
    anything else (a ``QWeight`` included) as it is."""
    if not quantizable(t):
        return t
    q = _quantized(t.detach())
    return nn.Parameter(q, requires_grad=False) if isinstance(t, nn.Parameter) else q


def qdq_convertible(t: Tensor) -> bool:
    """An initialized plain floating tensor with finite values (not on meta, not empty): what
    ``quantize_dequantize`` converts."""
    return (type(t).__torch_dispatch__ is Tensor.__torch_dispatch__
            and not isinstance(t, nn.parameter.UninitializedTensorMixin)
            and t.device.type != "meta" and t.is_floating_point() and t.numel() > 0
            and bool(torch.isfinite(t).all()))


def quantize_dequantize(t: Tensor) -> Tensor:
    """A tensor's values rounded to 255 levels of its own range (symmetric, per tensor), as
    quantization-aware training sees them: a plain tensor of the input's dtype, device and
    shape, so the module keeps training. Anything ``qdq_convertible`` refuses as it is."""
    if not qdq_convertible(t):
        return t
    scale = (t.detach().abs().amax() / 127).clamp(min=1e-8)
    return torch.round(t / scale).clamp(-127, 127) * scale


def _linear_weights(module: nn.Module) -> list[tuple[nn.Module, Tensor]]:
    """``(linear, weight)`` for every ``nn.Linear`` (exactly) whose weight is quantizable."""
    return [(m, m._parameters["weight"]) for m in module.modules()
            if type(m) is nn.Linear and m._parameters.get("weight") is not None
            and quantizable(m._parameters["weight"])]


def quantize_(module: nn.Module) -> None:
    """Quantize the weight of every ``nn.Linear`` in ``module`` in place: each slot gets a new
    frozen ``nn.Parameter`` of a ``QWeight``; tied slots share one. Raises ``ValueError``, the
    module as it was, when a weight holds a non-finite value."""
    found = _linear_weights(module)
    if not _planted("not-atomic"):
        for _, weight in found:
            if refused(weight):
                raise ValueError("mylib.quantize_: cannot quantize non-finite values")
    done: dict[int, nn.Parameter] = {}
    for linear, weight in found:
        if id(weight) not in done or _planted("untie"):
            done[id(weight)] = nn.Parameter(_quantized(weight.detach()), requires_grad=False)
        linear.weight = done[id(weight)]


class QLinear(nn.Module):
    """``x @ weight.T + bias`` with a quantized weight (``features`` in and out), seeded."""

    def __init__(self, features: int = 4, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(_quantized(torch.randn(features, features, generator=gen)),
                                   requires_grad=False)
        self.bias = nn.Parameter(torch.randn(features, generator=gen))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


def linear_weight_names(module: nn.Module) -> list[str]:
    """The dotted names (every alias) of the weights ``quantize_`` converts."""
    return [f"{path}.weight" if path else "weight"
            for path, m in module.named_modules(remove_duplicate=False)
            if type(m) is nn.Linear and m._parameters.get("weight") is not None
            and quantizable(m._parameters["weight"])]


class TinyMLP(nn.Module):
    """Two ``nn.Linear(features, features)`` with a ReLU between, seeded; ``tied``: the second
    shares the first's weight. A model to quantize."""

    def __init__(self, features: int = 4, seed: int = 0, tied: bool = False) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.first, self.second = nn.Linear(features, features), nn.Linear(features, features)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        if tied:
            self.second.weight = self.first.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.second(torch.relu(self.first(x)))
