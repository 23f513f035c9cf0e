"""Contracts: what a conversion's result must be, checked on every tensor it converts.

A :class:`Contract` states, for each input tensor, what the converted tensor must be, so the
suite judges a conversion by what it promises, not by what its own function returns:

* ``converts(t)``: the inputs it changes (default: every tensor); any other tensor comes back
  as it was (same class, dtype, device and values);
* ``dtype``: the result's dtype: a ``torch.dtype``, a function of the input's dtype, or None
  (kept); ``device`` the result's device type (``"meta"``), or None (kept); ``cls`` the result's
  class (a subclass of it qualifies), or None (the input's class, as ``type(t)`` says);
* ``values``: whether values survive; if so, within ``atol`` (a number, or a function of the
  input) and ``rtol`` (None: the rounding of the result's dtype, half an ulp relative to the
  value and, below its smallest normal, half the spacing of its subnormals), read through
  ``dequantize`` (the library's own map of the result to a plain tensor) where given. A
  complex input converted to a real dtype keeps its real part, as torch's casts do;
* ``raises(t)``: the inputs it may refuse (default: none). A conversion that raises on a tensor
  its contract accepts breaks the contract; it is not an expected error.

:class:`ModuleConversion` is a conversion that takes a whole module and changes it in place
(as torchao's ``quantize_(model)``), with the contract each tensor it converts must meet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

DtypeRule = torch.dtype | Callable[[torch.dtype], torch.dtype] | None


def every_tensor(t: Tensor) -> bool:
    """Every tensor (what ``type(dtype)`` and ``to(device)`` convert)."""
    return True


def _never(t: Tensor) -> bool:
    return False


def is_floating(t: Tensor) -> bool:
    """A floating-point tensor (what ``half()``, ``float()``... convert)."""
    return t.is_floating_point()


def floating_or_complex(t: Tensor) -> bool:
    """A floating-point or complex tensor (what ``to(dtype)`` converts)."""
    return t.is_floating_point() or t.is_complex()


@dataclass(frozen=True)
class Contract:
    """What a conversion's result must be; see the module docstring."""

    text: str  # the contract in words, for messages
    converts: Callable[[Tensor], bool] = every_tensor
    dtype: DtypeRule = None
    device: str | None = None
    cls: type | None = None
    values: bool = True
    atol: float | Callable[[Tensor], float] = 0.0
    rtol: float | None = None
    dequantize: Callable[[Tensor], Tensor] | None = field(default=None, compare=False)
    raises: Callable[[Tensor], bool] = _never

    def dtype_for(self, before: Tensor, converted: bool | None = None) -> torch.dtype:
        """The dtype the result of converting ``before`` must have (``converted``: whether the
        conversion converts it; None: as ``converts`` says)."""
        converted = self.converts(before) if converted is None else converted
        if self.dtype is None or not converted:
            return before.dtype
        return self.dtype if isinstance(self.dtype, torch.dtype) else self.dtype(before.dtype)

    def problems(self, before: Tensor, after: Tensor, converted: bool | None = None
                 ) -> list[str]:
        """How ``after`` (the result of converting ``before``, a copy of the input) breaks the
        contract; empty when it meets it. ``converted``: whether the conversion converts
        ``before`` (None: as ``converts`` says)."""
        if not (self.converts(before) if converted is None else converted):
            return _unchanged_problems(before, after)
        out = []
        want_cls = self.cls or tensor_class(before)
        if not isinstance(after, want_cls):
            out.append(f"class {type(after).__name__}, want {want_cls.__name__}")
        if after.dtype != self.dtype_for(before, True):
            out.append(f"dtype {after.dtype}, want {self.dtype_for(before, True)}")
        device = self.device or before.device.type
        if after.device.type != device:
            out.append(f"device {after.device.type}, want {device}")
        if _has_shape(before) and _has_shape(after) and tuple(after.shape) != tuple(before.shape):
            out.append(f"shape {tuple(after.shape)}, want {tuple(before.shape)}")
        if not out and self.values:
            out += self._value_problems(before, after)
        return out

    def _value_problems(self, before: Tensor, after: Tensor) -> list[str]:
        got, want = self.plain(after), plain_values(before)
        if got is None or want is None:
            return []  # no values to read: meta, fake, or a subclass without a dequantization
        atol, rtol = self.tolerance(before, after)
        if close(got, want, atol, rtol):
            return []
        return [f"values off by {_worst_error(got, want, atol, rtol)} (tolerance "
                f"atol={atol:.3g}, rtol={rtol:.3g})"]

    def tolerance(self, before: Tensor, after: Tensor) -> tuple[float, float]:
        """``(atol, rtol)`` for ``after``'s values against ``before``'s: the contract's own, and
        with ``rtol`` None the rounding of ``after``'s dtype (``rounding``, ``subnormal_rounding``
        added to ``atol``)."""
        atol = self.atol(before) if callable(self.atol) else self.atol
        if self.rtol is not None:
            return atol, self.rtol
        return atol + subnormal_rounding(after.dtype), rounding(after.dtype)

    def plain(self, t: Tensor) -> Tensor | None:
        """``t``'s values as a plain tensor, through ``dequantize`` where given."""
        if self.dequantize is not None and (self.cls is None or isinstance(t, self.cls)):
            return plain_values(self.dequantize(t))
        return plain_values(t)


def _unchanged_problems(before: Tensor, after: Tensor) -> list[str]:
    """A tensor the conversion does not convert: same class, dtype, device and values."""
    out = [f"{what} {got}, want it kept ({want})" for what, got, want in (
        ("class", tensor_class(after).__name__, tensor_class(before).__name__),
        ("dtype", after.dtype, before.dtype), ("device", after.device.type, before.device.type))
        if got != want]
    if not out:
        got, want = plain_values(after), plain_values(before)
        if got is not None and want is not None and not close(got, want, 0.0, 0.0):
            out.append("values changed where the contract keeps them")
    return out


def _has_shape(t: Tensor) -> bool:
    """Whether ``t`` has a shape to read (an uninitialized parameter has none)."""
    return not isinstance(t, nn.parameter.UninitializedTensorMixin)


def tensor_class(t: Tensor) -> type:
    """The class that holds ``t``'s values: its own for a tensor subclass with its own dispatch
    (``QWeight``, ``TwoTensor``), else ``Tensor`` (a parameter, a buffer, a plain tensor)."""
    return type(t) if type(t).__torch_dispatch__ is not Tensor.__torch_dispatch__ else Tensor


def plain_values(t: Tensor) -> Tensor | None:
    """``t``'s values as a plain strided CPU tensor, or None where it holds none to read
    (uninitialized, meta, fake, or a tensor subclass: only its own dequantization reads it)."""
    if isinstance(t, nn.parameter.UninitializedTensorMixin) or t.device.type == "meta":
        return None
    if type(t).__torch_dispatch__ is not Tensor.__torch_dispatch__:
        return None
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, FakeTensor) or torch._C._functorch.is_batchedtensor(t):
        return None
    plain = t.detach()
    plain = plain.to_dense() if plain.layout != torch.strided else plain
    return plain.cpu()


def rounding(dtype: torch.dtype) -> float:
    """Half an ulp of ``dtype`` relative to the value (0 for exact dtypes)."""
    if dtype.is_floating_point:
        return torch.finfo(dtype).eps / 2
    if dtype.is_complex:
        return torch.finfo(dtype.to_real()).eps / 2
    return 0.0


def subnormal_rounding(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype``'s subnormals: the absolute error of rounding a value below
    its smallest normal, where half an ulp relative to the value no longer bounds it (0 for exact
    dtypes)."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0
    info = torch.finfo(dtype if dtype.is_floating_point else dtype.to_real())
    return info.smallest_normal * info.eps / 2


def _widened(got: Tensor, want: Tensor) -> tuple[Tensor, Tensor]:
    """Both in float64, or complex128 where either is complex (a complex ``want`` against a real
    ``got``: its real part)."""
    if want.is_complex() and not got.is_complex():
        want = want.real
    wide = torch.complex128 if got.is_complex() or want.is_complex() else torch.float64
    return got.to(wide), want.to(wide)


def close(got: Tensor, want: Tensor, atol: float, rtol: float) -> bool:
    """Equal shapes and values within ``atol + rtol * |want|``, NaNs equal (a complex ``want``
    against a real ``got``: its real part)."""
    got, want = _widened(got, want)
    if got.shape != want.shape:
        return False
    both_nan = got.isnan() & want.isnan()
    near = (got - want).abs() <= atol + rtol * want.abs() + torch.finfo(torch.float64).tiny
    same_inf = got == want  # infinities of one sign
    return bool((near | same_inf | both_nan).all())


def _worst_error(got: Tensor, want: Tensor, atol: float, rtol: float) -> str:
    """The element furthest past its tolerance: its error, index, and both values."""
    got, want = (t.reshape(-1) for t in _widened(got, want))
    if got.shape != want.shape or not got.numel():
        return "a shape change" if got.shape != want.shape else "0"
    error = (got - want).abs()
    excess = torch.nan_to_num(error - atol - rtol * want.abs(), nan=float("inf"))
    excess[(got.isnan() & want.isnan()) | (got == want)] = -float("inf")
    i = int(excess.argmax())
    return (f"{error[i].item():.3g} at flat index {i} (got {got[i].item():.6g}, "
            f"want {want[i].item():.6g})")


def raising_allowed(contract: Contract | None, tensors: list[Tensor]) -> bool:
    """Whether the contract lets a conversion of ``tensors`` raise: one of them is an input it
    may refuse (no contract: anything may raise)."""
    return contract is None or any(contract.raises(t) for t in tensors)


@dataclass(frozen=True)
class ModuleConversion:
    """A conversion of a whole module, in place (``quantize_(model)``).

    ``repro`` is the source of a callable ``module -> None`` (``"lambda m: quantize_(m)"``),
    evaluated after ``imports`` (the lines it needs, which also head its repros); ``contract``
    what each converted tensor must be (``Contract``, input: the tensor before). ``rebinds``:
    False, the conversion keeps every parameter object (it swaps or sets its data), so an
    optimizer built before still steps it; True, it puts new ``nn.Parameter`` s in the slots it
    converts (a documented rebinding: an optimizer must be built after). ``refuse``: the source
    of an in-place function ``tensor -> None`` that makes a tensor the conversion converts one
    it refuses (``"lambda t: t.fill_(float('nan'))"``), for the atomicity property; None when
    the conversion refuses nothing. ``selects(module)``: the dotted names of the tensors it
    converts (a quantizer converts the weights of some layers only); None: every tensor its
    contract's ``converts`` accepts. Every other tensor must come back as it was.
    """

    name: str
    repro: str
    contract: Contract
    imports: str = ""
    rebinds: bool = False
    refuse: str | None = None
    selects: Callable[[nn.Module], Any] | None = field(default=None, compare=False)

    def converted_names(self, module: nn.Module, names: Any) -> set[str]:
        """Which of ``names`` (``{name: tensor}`` of ``module``, before) it converts."""
        if self.selects is not None:
            return set(self.selects(module)) & set(names)
        return {name for name, t in names.items() if self.contract.converts(t)}

    def _eval(self, source: str) -> Any:
        namespace: dict[str, Any] = {"torch": torch, "nn": nn}
        if self.imports:
            exec(self.imports, namespace)
        return eval(source, namespace)

    def make_fn(self) -> Callable[[nn.Module], Any]:
        """A fresh ``module -> None``, evaluated from ``repro`` after ``imports``."""
        return self._eval(self.repro)

    def make_refuse(self) -> Callable[[Tensor], Any] | None:
        """The in-place function that makes a tensor one the conversion refuses, or None."""
        return None if self.refuse is None else self._eval(self.refuse)

    def source(self) -> list[str]:
        """Python lines that define ``convert`` (and ``refuse``, where given)."""
        lines = [f"convert = {self.repro}"]
        if self.refuse is not None:
            lines.append(f"refuse = {self.refuse}")
        return lines
