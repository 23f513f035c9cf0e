"""Public method calls: ``module.to(...)``, ``module.half()``, ``module.to_empty(device=...)``...

Users call ``nn.Module``'s public methods, not ``_apply(fn)``. A :class:`MethodCall` is one such
call, written as its source (``method`` and ``arguments``, evaluated in a namespace with ``torch``,
so the repro and the behaviour cannot drift apart), of one of three kinds:

* ``conversion``: ``to`` (by dtype, by device ``'cpu'``/``'meta'``, by tensor, with
  ``memory_format=torch.channels_last`` and ``non_blocking=True``, positional and keyword
  forms), ``to_empty(device=..., recurse=...)``, ``half/float/double/bfloat16()``,
  ``type(dst_type)``, ``cpu()``, ``share_memory()``. Each is described by the per-tensor
  function torch's method passes to ``_apply`` (:func:`implied_conversion`: a ``Conversion``
  whose ``call`` is the method call), so the APPLY properties judge its effect as they judge
  ``_apply(fn)``;
* ``grad``: ``requires_grad_(bool)`` and ``zero_grad(set_to_none=bool)``, judged by their own
  rules (``reference.methods``);
* ``bad``: a form torch refuses (an integral dtype for ``to``, a bad argument type or count, an
  unknown device or type string), with the error type it must raise (``error``) and, where the
  reference keeps torch's sentence, the start of the message (``message``).

``cuda()`` is not drawn (no CUDA on the machines the suite is checked on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.strategies.contracts import Contract
from swapspec.strategies.conversions import Conversion, is_uninitialized, runs_on


@dataclass(frozen=True)
class MethodCall:
    """``module.<method>(<arguments>)``; see the module docstring."""

    method: str
    arguments: str = ""
    kind: str = "conversion"  # "conversion", "grad" or "bad"
    error: type[BaseException] | None = None  # the error a bad form raises
    message: str = ""  # the start of its message, where the reference keeps torch's
    recurse: bool = True

    @property
    def name(self) -> str:
        return f"module.{self.method}({self.arguments})"

    def code(self, var: str = "module") -> str:
        """The call as Python source."""
        return f"{var}.{self.method}({self.arguments})"

    def args(self) -> tuple[tuple, dict]:
        """Fresh ``(args, kwargs)`` evaluated from ``arguments``."""
        return eval(f"(lambda *a, **k: (a, k))({self.arguments})", {"torch": torch})


# ---- the conversion forms, each with the per-tensor function torch's method applies ----------
_FLOATING = "{} if t.is_floating_point() or t.is_complex() else None"


def _to_fn(device: str | None, dtype: str | None, non_blocking: bool = False,
           memory_format: str | None = None) -> str:
    """``to``'s per-tensor function (``reference.methods.to_fn``) as source."""
    args = f"{device!r}, {'None' if dtype is None else _FLOATING.format(dtype)}, {non_blocking}"
    plain = f"t.to({args})"
    if memory_format is None:
        return f"lambda t: {plain}"
    return (f"lambda t: t.to({args}, memory_format={memory_format}) if t.dim() in (4, 5) "
            f"else {plain}")


@dataclass(frozen=True)
class CastTo:
    """A dtype rule: ``dtype`` for the input dtypes ``kinds`` takes (``"floating"``, or
    ``"floating or complex"``, or ``"every"``), any other dtype kept."""

    dtype: torch.dtype
    kinds: str = "floating or complex"

    def __call__(self, dtype: torch.dtype) -> torch.dtype:
        if self.kinds == "every" or dtype.is_floating_point or (
                self.kinds == "floating or complex" and dtype.is_complex):
            return self.dtype
        return dtype


def _cast(dtype: torch.dtype, kinds: str = "floating or complex",
          device: str | None = None) -> Contract:
    """The contract of a cast to ``dtype`` of the tensors of ``kinds`` (others keep theirs),
    every tensor moved to ``device`` (None: kept): values within the result's rounding (on
    meta, none kept)."""
    on = f", every tensor on {device}" if device else ""
    values = "no values" if device == "meta" else f"values within {dtype}'s rounding"
    return Contract(f"{dtype} for {kinds} tensors{on}, {values}", dtype=CastTo(dtype, kinds),
                    device=device, values=device != "meta")


_KEEP = Contract("the same tensor values, dtype and device")
_TO_META = Contract("on meta, dtype kept, values not kept", device="meta", values=False)
_EMPTY_CPU = Contract("a new tensor of the same dtype on cpu, values not kept", device="cpu",
                      values=False)
_META = {"preserves_values": False, "changes_impl": True, "device": "meta",
         "contract": _TO_META}
_LAZY = {"lazy_safe": True}


def five_dimensional(t: torch.Tensor) -> bool:
    """A 5-D tensor: ``to(memory_format=torch.channels_last)`` converts it and torch refuses it
    (``required rank 4 tensor``), so that conversion may raise on it."""
    return t.dim() == 5


def _channels_last(contract: Contract) -> Contract:
    return replace(contract, raises=five_dimensional)


def _with(options: dict, contract: Contract) -> dict:
    return {**options, "contract": contract}


# (call, per-tensor fn source, Conversion options)
CONVERSION_FORMS: tuple[tuple[MethodCall, str, dict], ...] = (
    (MethodCall("to", "torch.float64"), _to_fn(None, "torch.float64"),
     _with(_LAZY, _cast(torch.float64))),
    (MethodCall("to", "dtype=torch.float16"), _to_fn(None, "torch.float16"),
     _with(_LAZY, _cast(torch.float16))),
    (MethodCall("to", "torch.complex64"), _to_fn(None, "torch.complex64"),
     _with(_LAZY, _cast(torch.complex64))),
    (MethodCall("to", "torch.bfloat16, non_blocking=True"),
     _to_fn(None, "torch.bfloat16", True), {"contract": _cast(torch.bfloat16)}),
    (MethodCall("to", "'cpu'"), _to_fn("cpu", None), _with(_LAZY, _KEEP)),
    (MethodCall("to", "device='meta'"), _to_fn("meta", None), _META),
    (MethodCall("to", "'cpu', torch.float64, True"), _to_fn("cpu", "torch.float64", True),
     _with(_LAZY, _cast(torch.float64, device="cpu"))),
    (MethodCall("to", "device='meta', dtype=torch.float16, non_blocking=True"),
     _to_fn("meta", "torch.float16", True),
     _with(_META, _cast(torch.float16, device="meta"))),
    (MethodCall("to", "torch.empty(0, dtype=torch.float64)"), _to_fn("cpu", "torch.float64"),
     _with(_LAZY, _cast(torch.float64, device="cpu"))),
    (MethodCall("to", "torch.empty(0, dtype=torch.float16, device='meta'), non_blocking=True"),
     _to_fn("meta", "torch.float16", True), _with(_META, _cast(torch.float16, device="meta"))),
    (MethodCall("to", "memory_format=torch.channels_last"),
     _to_fn(None, None, memory_format="torch.channels_last"), {"contract": _channels_last(_KEEP)}),
    (MethodCall("to", "torch.float64, memory_format=torch.channels_last"),
     _to_fn(None, "torch.float64", memory_format="torch.channels_last"),
     {"contract": _channels_last(_cast(torch.float64))}),
    (MethodCall("to_empty", "device='cpu'"), "lambda t: torch.empty_like(t, device='cpu')",
     {"preserves_values": False, "contract": _EMPTY_CPU}),
    (MethodCall("to_empty", "device='meta', recurse=True"),
     "lambda t: torch.empty_like(t, device='meta')", _META),
    (MethodCall("half"), "lambda t: t.half() if t.is_floating_point() else t",
     _with(_LAZY, _cast(torch.float16, "floating"))),
    (MethodCall("float"), "lambda t: t.float() if t.is_floating_point() else t",
     _with(_LAZY, _cast(torch.float32, "floating"))),
    (MethodCall("double"), "lambda t: t.double() if t.is_floating_point() else t",
     _with(_LAZY, _cast(torch.float64, "floating"))),
    (MethodCall("bfloat16"), "lambda t: t.bfloat16() if t.is_floating_point() else t",
     {"contract": _cast(torch.bfloat16, "floating")}),
    (MethodCall("type", "torch.float64"), "lambda t: t.type(torch.float64)",
     {"contract": _cast(torch.float64, "every")}),
    (MethodCall("type", "dst_type='torch.HalfTensor'"), "lambda t: t.type('torch.HalfTensor')",
     {"contract": _cast(torch.float16, "every")}),
    (MethodCall("cpu"), "lambda t: t.cpu()", _with(_LAZY, _KEEP)),
    (MethodCall("share_memory"), "lambda t: t.share_memory_()", {"contract": _KEEP}),
)
# Only for APPLY-RECURSE-FALSE: the one public method that takes ``recurse``.
RECURSE_FALSE_FORMS: tuple[tuple[MethodCall, str, dict], ...] = (
    (MethodCall("to_empty", "device='cpu', recurse=False", recurse=False),
     "lambda t: torch.empty_like(t, device='cpu')", {"preserves_values": False}),
    (MethodCall("to_empty", "device='meta', recurse=False", recurse=False),
     "lambda t: torch.empty_like(t, device='meta')", _META),
)

GRAD_CALLS: tuple[MethodCall, ...] = (
    MethodCall("requires_grad_", kind="grad"),
    MethodCall("requires_grad_", "False", kind="grad"),
    MethodCall("requires_grad_", "requires_grad=True", kind="grad"),
    MethodCall("zero_grad", kind="grad"),
    MethodCall("zero_grad", "set_to_none=False", kind="grad"),
    MethodCall("zero_grad", "False", kind="grad"),
)

_DTYPE_ONLY = "nn.Module.to only accepts floating point or complex dtypes"
BAD_CALLS: tuple[MethodCall, ...] = (
    MethodCall("to", "torch.int64", "bad", TypeError, _DTYPE_ONLY),
    MethodCall("to", "dtype=torch.bool", "bad", TypeError, _DTYPE_ONLY),
    MethodCall("to", "torch.empty(0, dtype=torch.int32)", "bad", TypeError, _DTYPE_ONLY),
    MethodCall("to", "'cpu', torch.float64, False, 1", "bad", TypeError,
               "to() received an invalid combination of arguments"),
    MethodCall("to", "memory_format=torch.float32", "bad", TypeError,
               "to() received an invalid combination of arguments"),
    MethodCall("to", "device='nodevice'", "bad", RuntimeError, "Expected one of"),
    MethodCall("to", "torch.float64, copy=True", "bad", RuntimeError,
               ".to() does not accept copy argument"),
    MethodCall("to_empty", "", "bad", TypeError),
    MethodCall("to_empty", "'cpu'", "bad", TypeError),
    MethodCall("to_empty", "device=1.5", "bad", TypeError,
               "empty_like(): argument 'device' must be torch.device"),
    MethodCall("half", "torch.float16", "bad", TypeError),
    MethodCall("cpu", "0", "bad", TypeError),
    MethodCall("share_memory", "True", "bad", TypeError),
    MethodCall("type", "'torch.NoSuchTensor'", "bad", ValueError, "invalid type"),
    MethodCall("type", "1", "bad", TypeError, "dtype must be a type, str, or dtype object"),
    MethodCall("requires_grad_", "'yes'", "bad", TypeError,
               "requires_grad_(): argument 'requires_grad' (position 1) must be bool"),
    MethodCall("zero_grad", "True, 1", "bad", TypeError),
)


def implied_conversion(form: tuple[MethodCall, str, dict]) -> Conversion:
    """The ``Conversion`` a conversion form stands for: torch's per-tensor function, named by the
    call, with ``call`` set to the call."""
    call, repro, options = form
    return Conversion(call.name, repro, call=call, **options)


METHOD_CONVERSIONS: tuple[Conversion, ...] = tuple(map(implied_conversion, CONVERSION_FORMS))
RECURSE_FALSE_CONVERSIONS: tuple[Conversion, ...] = tuple(
    map(implied_conversion, RECURSE_FALSE_FORMS))


def _plain(devices: Sequence[str] | None, where: Callable[[Conversion], bool] | None,
           recurse: bool = True) -> tuple[Conversion, ...]:
    from swapspec.strategies.devices import detected_devices

    allowed = {"cpu", *(detected_devices() if devices is None else devices)}
    pool = METHOD_CONVERSIONS if recurse else RECURSE_FALSE_CONVERSIONS
    return tuple(c for c in pool if c.device in allowed and (where is None or where(c)))


def method_conversions(devices: Sequence[str] | None = None, *,
                       where: Callable[[Conversion], bool] | None = None
                       ) -> st.SearchStrategy[Conversion]:
    """Draw the implied ``Conversion`` of a public conversion call (``conversion.call``), uniform
    over the forms on ``devices`` (default: detected; cpu always) that ``where`` accepts.
    Shrinks towards ``module.to(torch.float64)``. Reports the event ``method: <name>``."""
    return _reported(st.sampled_from(_plain(devices, where)))


def _reported(strategy: st.SearchStrategy) -> st.SearchStrategy:
    def report(value: Any) -> Any:
        event(f"method: {value.name.removeprefix('module.')}")
        return value
    return strategy.map(report)


def wraps_subclass(module: Any) -> bool:
    """Whether a parameter, grad or buffer of ``module`` is a traceable wrapper subclass
    (``TwoTensor``): ``share_memory_()`` on one kills the interpreter (torch 2.13)."""
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [p.grad for p in module.parameters() if p.grad is not None]
    return any(is_traceable_wrapper_subclass(t) for t in tensors)


def usable_on(module: Any, conversions: Sequence[Conversion]) -> tuple[Conversion, ...]:
    """The method conversions that can be called on ``module``: no ``share_memory()`` where a
    wrapper subclass would crash it, and, where the module holds uninitialized or meta tensors
    (which refuse some conversions), those that run on them (all, if none does)."""
    usable = tuple(c for c in conversions
                   if not (c.call.method == "share_memory" and wraps_subclass(module)))
    picky = [t for t in (*module.parameters(), *module.buffers())
             if is_uninitialized(t) or t.is_meta]
    if picky:
        usable = tuple(c for c in usable if runs_on(c, picky)) or usable
    return usable


@st.composite
def modules_with_method_conversions(
    draw: Any, modules: st.SearchStrategy[Any], devices: Sequence[str] | None = None, *,
    where: Callable[[Conversion], bool] | None = None, recurse: bool = True,
) -> tuple[Any, Conversion]:
    """Draw ``(module, conversion)``: a module, then a public conversion call's implied
    ``Conversion`` among those usable on it (``usable_on``). ``recurse=False`` draws only
    ``to_empty(device=..., recurse=False)``."""
    module = draw(modules)
    return module, draw(_reported(_uniform(usable_on(module, _plain(devices, where, recurse)))))


def method_calls(kinds: Sequence[str] = ("conversion", "grad", "bad")
                 ) -> st.SearchStrategy[MethodCall]:
    """Draw a :class:`MethodCall`: a kind of ``kinds`` (uniform), then one of its forms
    (uniform); shrinks towards the first kind's first form. Reports the event
    ``method: <name>``."""
    pool = {"conversion": [c.call for c in METHOD_CONVERSIONS], "grad": list(GRAD_CALLS),
            "bad": list(BAD_CALLS)}
    return st.sampled_from(list(kinds)).flatmap(lambda k: _reported(st.sampled_from(pool[k])))


@st.composite
def modules_with_method_calls(draw: Any, modules: st.SearchStrategy[Any],
                              kinds: Sequence[str] = ("conversion", "grad", "bad")
                              ) -> tuple[Any, MethodCall]:
    """Draw ``(module, call)``: a module, then a kind of ``kinds`` (uniform), then a
    :class:`MethodCall` of that kind (uniform), its conversion forms among those usable on the
    module (``usable_on``)."""
    module = draw(modules)
    kind = draw(_uniform(kinds))
    pool = {"conversion": lambda: [c.call for c in usable_on(module, _plain(None, None))],
            "grad": lambda: list(GRAD_CALLS), "bad": lambda: list(BAD_CALLS)}[kind]()
    return module, draw(_reported(_uniform(pool)))


def _uniform(choices: Sequence[Any]) -> st.SearchStrategy[Any]:
    """One of ``choices``, shrinking towards the first: an index drawn from a wide range and
    folded, so the draws after a tree spread over the choices (``st.sampled_from``'s few
    indices, drawn there, favour the first choice)."""
    return st.integers(0, 4095).map(lambda i: choices[i % len(choices)])
