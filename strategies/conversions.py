"""Conversion functions for ``nn.Module._apply(fn)``, modelled on the real ``nn.Module`` methods.

Each :class:`Conversion` is defined by its ``repro`` expression: ``make_fn()`` evaluates that very string (in a
namespace with ``torch``, ``TwoTensor``, ``xla_device`` and ``raise_on``), so the repro and the behaviour cannot
drift apart, and every call gives a fresh function. Rules mirrored from ``torch/nn/modules/module.py``:

* ``half()/float()/double()/bfloat16()`` change floating-point tensors only (int, bool, complex returned as is).
* ``to(dtype)`` is ``t.to(None, dtype if t.is_floating_point() or t.is_complex() else None, False)``: floating AND
  complex tensors change; with a real target a complex tensor loses its imaginary part (torch warns), with a
  complex target a floating tensor becomes complex.
* ``to(memory_format=torch.channels_last)`` applies to 4-D and 5-D tensors; 5-D ones make torch (and so this fn)
  raise ``RuntimeError: required rank 4 tensor`` (catalogue leaves such as ``nn.Conv3d`` hold 5-D tensors).
* ``to_empty(device=d)`` is ``torch.empty_like(t, device=d)``; ``share_memory()`` is ``t.share_memory_()`` (wrapper subclasses such as
  ``TwoTensor`` returned as they are: torch 2.13 crashes on theirs) and
  ``cpu()`` on a CPU tensor return their argument.
* ``to_sparse()`` is ``t.to_sparse()`` (sparse COO; works for every dtype and shape the trees draw, 0-d included).
* ``TwoTensor`` wraps floating tensors as ``TwoTensor(t.detach(), t.detach().clone())`` (both halves must agree on
  ``requires_grad``) (a traceable wrapper subclass, so
  ``_apply`` takes the swap path whatever the flags; ``_has_compatible_shallow_copy_type`` says True for it).
* ``add(1)`` is ``t + 1`` (not idempotent; bool becomes int64). ``raise_on(k=K)`` is ``add(1)`` that raises
  :class:`ConversionError` on the K-th call (1-based) of that fresh fn: out of place, so a half-done conversion shows.
* ``add(1), TwoTensor for matrices`` is ``add(1)`` that wraps 2-D floating results in ``TwoTensor`` (as quantizers
  wrap only weight matrices): matrices take the swap path, the rest the path the flags choose, in one ``_apply``.

``changes_impl`` is relative to a CPU dense source: True for meta, sparse and XLA results.

A conversion may state a ``contract`` (``strategies.contracts.Contract``): what each converted
tensor must be (dtype, device, class, values within a tolerance read through the library's own
dequantization, which inputs it may refuse). APPLY-CONTRACT checks results against it, not
against the function's own output. The public methods' implied conversions carry theirs.

A host's own conversion is a :class:`Conversion` too: ``imports`` holds the Python lines its
``repro`` needs (``"from mylib.tensors import Scaled"``); they run before ``repro`` is evaluated
and head its source, so repros of host conversions stand alone as well. Its function must accept
its own output: ``_apply`` converts a tied tensor once per slot, and where it keeps the object
(``.data`` set, the default path, or swapped in place) the second slot hands the function what it
returned for the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import Tensor
from torch.nn.parameter import UninitializedTensorMixin

from swapspec.strategies.devices import detected_devices, xla_device
from swapspec.strategies.host_material import host_material

REPRO_IMPORTS = (
    "import torch\n"
    "from torch.testing._internal.two_tensor import TwoTensor  # noqa: F401\n"
    "from swapspec.strategies.conversions import raise_on  # noqa: F401\n"
    "from swapspec.strategies.devices import xla_device  # noqa: F401\n"
)


class ConversionError(RuntimeError):
    """Raised by a ``raise_on(k)`` conversion on its k-th call."""


def raise_on(k: int, base: Callable[[Tensor], Tensor] | None = None
             ) -> Callable[[Tensor], Tensor]:
    """A fresh fn that raises :class:`ConversionError` on its ``k``-th call (1-based) and
    otherwise returns ``base(t)`` (default ``t + 1``)."""
    calls = 0

    def fn(t: Tensor) -> Tensor:
        nonlocal calls
        calls += 1
        if calls == k:
            raise ConversionError(f"raise_on({k}): call {calls}")
        return t + 1 if base is None else base(t)

    return fn


def is_uninitialized(t: Any) -> bool:
    """An ``UninitializedParameter`` or ``UninitializedBuffer`` (a lazy module before its first call)."""
    return isinstance(t, UninitializedTensorMixin)


def _namespace() -> dict[str, Any]:
    from torch.testing._internal.two_tensor import TwoTensor

    return {"torch": torch, "TwoTensor": TwoTensor, "xla_device": xla_device, "raise_on": raise_on}


@dataclass(frozen=True)
class Conversion:
    """A named conversion fn for ``_apply``; see the module docstring for the rules."""

    name: str
    repro: str
    preserves_values: bool = True
    changes_impl: bool = False
    raises_on: int | None = None
    device: str = field(default="cpu", compare=False)
    lazy_safe: bool = field(default=False, compare=False)
    imports: str = ""
    # The public method call (``strategies.method_calls.MethodCall``) this conversion is the
    # per-tensor function of, or None: an ``_apply(fn)`` conversion.
    call: Any = field(default=None, compare=False)
    # What each converted tensor must be (``strategies.contracts.Contract``), checked by
    # APPLY-CONTRACT instead of the function's own output; None: no contract stated.
    contract: Any = field(default=None, compare=False)
    # Whether a module converted by it still trains on the CPU as it did: every floating
    # tensor comes back a dense floating CPU tensor of its own dtype (same shape), so forward,
    # backward, tensor hooks and optimizer steps run. The properties about training
    # (APPLY-OPTIMIZER, APPLY-TENSOR-HOOKS, APPLY-FORWARD's earlier conversions, the sequences'
    # palette, PARAMETRIZE-) draw a host's conversion only where it says so.
    trainable: bool = field(default=False, compare=False)

    def make_fn(self) -> Callable[[Tensor], Tensor]:
        """A fresh fn (its own call counter for ``raise_on``), evaluated from ``repro`` after
        ``imports``."""
        namespace = _namespace()
        if self.imports:
            exec(self.imports, namespace)
        return eval(self.repro, namespace)

    def source(self, var: str = "fn") -> str:
        """Python lines that define the fn as ``var``."""
        imports = f"{self.imports.rstrip()}\n" if self.imports else ""
        return f"{REPRO_IMPORTS}{imports}{var} = {self.repro}\n"

    @property
    def tag(self) -> str:
        """The name without the ``k`` of ``raise_on`` (used for events and reach tables)."""
        return "raise_on" if self.raises_on is not None else self.name

    @property
    def recurse(self) -> bool:
        """Whether the conversion reaches submodules: False only for a method call made with
        ``recurse=False`` (``to_empty(device=..., recurse=False)``)."""
        return self.call is None or self.call.recurse


def _floating(method: str) -> Conversion:
    return Conversion(f"{method}()", f"lambda t: t.{method}() if t.is_floating_point() else t", lazy_safe=method != "bfloat16")


def _to(target: str | None, dtype: str | None, name: str, **kw: Any) -> Conversion:
    dev = "None" if target is None else ("xla_device()" if target == "xla" else repr(target))
    dt = "None" if dtype is None else f"{dtype} if t.is_floating_point() or t.is_complex() else None"
    return Conversion(name, f"lambda t: t.to({dev}, {dt}, False)", **kw)


CONVERSIONS: tuple[Conversion, ...] = (
    _floating("float"),
    _floating("half"),
    _floating("double"),
    _floating("bfloat16"),
    _to(None, "torch.float64", "to(torch.float64)", lazy_safe=True),
    _to(None, "torch.complex64", "to(torch.complex64)", lazy_safe=True),
    Conversion("cpu()", "lambda t: t.cpu()", lazy_safe=True),
    # share_memory_() on a TwoTensor kills the interpreter (torch 2.13): wrapper subclasses keep theirs
    Conversion("share_memory()", "lambda t: t if torch.utils._python_dispatch.is_traceable_wrapper_subclass(t) else t.share_memory_()"),
    Conversion(
        "to(memory_format=torch.channels_last)",
        "lambda t: t.to(None, None, False, memory_format=torch.channels_last) if t.dim() in (4, 5) else t.to(None, None, False)",
    ),
    Conversion("add(1)", "lambda t: t + 1"),
    Conversion("to_empty(device='cpu')", "lambda t: torch.empty_like(t, device='cpu')", preserves_values=False),
    _to("meta", None, "to('meta')", preserves_values=False, changes_impl=True, device="meta"),
    Conversion("to_empty(device='meta')", "lambda t: torch.empty_like(t, device='meta')", preserves_values=False, changes_impl=True, device="meta"),
    Conversion("to_sparse()", "lambda t: t.to_sparse()", changes_impl=True),
    Conversion("TwoTensor", "lambda t: TwoTensor(t.detach(), t.detach().clone()) if t.is_floating_point() else t"),
    Conversion("cuda()", "lambda t: t.cuda()", device="cuda", lazy_safe=True),
    _to("cuda", "torch.float16", "to('cuda', torch.float16)", device="cuda", lazy_safe=True),
    _to("xla", None, "to('xla')", changes_impl=True, device="xla"),
    _to("xla", "torch.bfloat16", "to('xla', torch.bfloat16)", changes_impl=True, device="xla"),
)


ADD_ONE = next(c for c in CONVERSIONS if c.name == "add(1)")
ADD_ONE_WRAPPING_MATRICES = Conversion(
    "add(1), TwoTensor for matrices",
    "lambda t: TwoTensor((t + 1).detach(), (t + 1).detach()) if t.dim() == 2 and t.is_floating_point() else t + 1",
)


def value_changing_conversions(*, hosted: bool = False) -> st.SearchStrategy[Conversion]:
    """Draw ``add(1)`` or ``add(1), TwoTensor for matrices``; shrinks towards ``add(1)``.

    Both give every tensor a new object with new values, so every change ``_apply`` commits shows; the second mixes
    the swap path with the flags' path in one call. Neither works on ``UninitializedParameter``.
    With ``hosted``, one of the running target's own CPU conversions that do not raise is drawn
    instead, one chance in two (as :func:`conversions` draws them): a property that draws it
    must not rely on every tensor changing (a host's conversion may return some as they are).
    Reports ``hypothesis.event('conversion: <tag>')``.
    """
    return _conversions((ADD_ONE, ADD_ONE_WRAPPING_MATRICES), False,
                        _cpu_not_raising if hosted else None)


def among(plain: Sequence[Conversion], *, host: Callable[[Conversion], bool] | None = None
          ) -> st.SearchStrategy[Conversion]:
    """Draw one of ``plain`` (shrinking towards the first) or, with ``host``, one chance in two
    one of the running target's own conversions that ``host`` accepts (as :func:`conversions`
    draws them). Without host material it draws exactly what ``st.sampled_from(plain)`` draws."""
    return _conversions(tuple(plain), False, host)


def trainable_on_cpu(conversion: Conversion) -> bool:
    """A host conversion the training properties may draw: ``trainable``, on the CPU, never
    raising by design."""
    return conversion.trainable and conversion.device == "cpu" and conversion.raises_on is None


def raising_conversion(k: int, base: Conversion | None = None) -> Conversion:
    """``raise_on(k=k)``: ``t + 1`` (or ``base``'s fn) that raises :class:`ConversionError` on
    its k-th call. Over a ``base``, the name, repro and imports are ``base``'s, wrapped."""
    if base is None:
        return Conversion(f"raise_on(k={k})", f"raise_on({k})", raises_on=k)
    return Conversion(f"raise_on(k={k}) over {base.name}", f"raise_on({k}, {base.repro})",
                      preserves_values=base.preserves_values, raises_on=k, device=base.device,
                      imports=base.imports)


@st.composite
def raising_bases(draw: Any) -> Conversion | None:
    """The fn a ``raise_on(k)`` conversion wraps: None (``t + 1``) or, one chance in two, one
    of the running target's own CPU conversions that do not raise on their own (as
    :func:`conversions` draws them). Without host material it draws nothing: always None."""
    return _host_conversion(draw, _cpu_not_raising)


def _cpu_not_raising(conversion: Conversion) -> bool:
    return conversion.device == "cpu" and conversion.raises_on is None


def conversions(
    devices: Sequence[str] | None = None, *, raising: bool = True, lazy_safe: bool = False,
    where: Callable[[Conversion], bool] | None = None,
) -> st.SearchStrategy[Conversion]:
    """Draw a :class:`Conversion`.

    * ``devices``: device kinds whose conversions may be drawn (default :func:`~strategies.devices.detected_devices`:
      cpu and meta, plus cuda / xla when present). CPU conversions are always included.
    * ``raising``: also draw ``raise_on(k=K)`` (never with ``lazy_safe``) with K in 1..6 (one more choice after the plain ones).
    * ``lazy_safe``: only conversions that work on ``UninitializedParameter`` and keep it uninitialized
      (``half/float/double``, ``to(float64/complex64)``, ``cpu()``, cuda moves).
    * ``where``: only the plain conversions it accepts (``lambda c: c.changes_impl``), chosen before
      drawing, so nothing is filtered.

    The running target's own conversions (:mod:`~strategies.host_material`) are drawn too, one
    chance in two, where they pass ``devices``, ``lazy_safe``, ``where`` and ``raising`` (a host
    conversion with ``raises_on`` only with ``raising``).

    Shrinks towards ``float()``. Reports ``hypothesis.event('conversion: <tag>')``.
    """
    return _conversions(_plain(devices, lazy_safe, where), raising and not lazy_safe,
                        _accepting(devices, lazy_safe, where, raising and not lazy_safe))


def _accepting(devices: Sequence[str] | None, lazy_safe: bool,
               where: Callable[[Conversion], bool] | None,
               raising: bool) -> Callable[[Conversion], bool]:
    """Whether a host's conversion passes the filters the built-ins were chosen by: its
    ``device`` among ``devices``, ``lazy_safe`` where asked, ``where``, and ``raises_on`` only
    where raising conversions may be drawn."""
    allowed = {"cpu", *(detected_devices() if devices is None else devices)}

    def accept(c: Conversion) -> bool:
        return (c.device in allowed and (c.lazy_safe or not lazy_safe)
                and (c.raises_on is None or raising) and (where is None or bool(where(c))))

    return accept


def _plain(devices: Sequence[str] | None, lazy_safe: bool,
           where: Callable[[Conversion], bool] | None) -> tuple[Conversion, ...]:
    allowed = {"cpu", *(detected_devices() if devices is None else devices)}
    plain = tuple(c for c in CONVERSIONS if c.device in allowed and (c.lazy_safe or not lazy_safe)
                  and (where is None or where(c)))
    if not plain:
        raise ValueError(f"no conversion on devices {sorted(allowed)} passes `where`")
    return plain


def runs_on(conversion: Conversion, tensors: Sequence[Tensor]) -> bool:
    """Whether a fresh fn of ``conversion`` returns (does not raise) on each of ``tensors``."""
    fn = conversion.make_fn()
    try:
        with torch.no_grad():
            for t in tensors:
                fn(t)
    except Exception:
        return False
    return True


@st.composite
def modules_with_conversions(
    draw: Any, modules: st.SearchStrategy[Any], devices: Sequence[str] | None = None, *,
    where: Callable[[Conversion], bool] | None = None,
) -> tuple[Any, Conversion]:
    """Draw ``(module, conversion)``: a module from ``modules``, then a plain conversion (as
    ``conversions(devices, raising=False, where=where)`` draws one) among those that run on the
    module's tensors that refuse some: uninitialized ones, which refuse most conversions (an
    uninitialized ``LazyLinear``), and ``meta`` ones (a meta world's: ``to_sparse()`` has no meta
    kernel). Every conversion runs on initialized real tensors, so none is filtered out. The
    running target's own conversions are drawn as :func:`conversions` draws them (one that
    refuses the picky tensors gives way to a built-in)."""
    module = draw(modules)
    plain = _plain(devices, False, where)
    picky = [t for t in (*module.parameters(), *module.buffers())
             if is_uninitialized(t) or t.is_meta]
    if picky:
        plain = tuple(c for c in plain if runs_on(c, picky)) or plain
    accept = _accepting(devices, False, where, False)
    return module, draw(_conversions(
        plain, False, lambda c: accept(c) and (not picky or runs_on(c, picky))))


HOST_CONVERSION_CHANCE = 50  # percent of conversion draws that try the target's own ones
HOST_CONVERSION_TRIES = 3  # draws from the target's conversions before giving way to a built-in


@st.composite
def _conversions(draw: Any, plain: tuple[Conversion, ...], raising: bool,
                 host: Callable[[Conversion], bool] | None = None) -> Conversion:
    """Uniform over ``plain`` (plus one slot for ``raise_on``, whose k is drawn next).

    With ``host`` (which of the running target's own conversions fit), first
    :func:`_host_conversion`; without one (or where it draws none) the draw above.
    """
    own = _host_conversion(draw, host)
    if own is not None:
        return own
    choice = draw(st.sampled_from([*plain, "raise_on"] if raising else plain))
    conversion = raising_conversion(draw(st.integers(1, 6))) if choice == "raise_on" else choice
    event(f"conversion: {conversion.tag}")
    return conversion


def _host_conversion(draw: Any, host: Callable[[Conversion], bool] | None) -> Conversion | None:
    """One of the running target's own conversions (:mod:`~strategies.host_material`) that
    ``host`` accepts, with ``HOST_CONVERSION_CHANCE`` percent: a coin that shrinks to None, then
    up to ``HOST_CONVERSION_TRIES`` draws from the target's strategy until ``host`` accepts one
    (a target whose conversions suit different properties); None if it accepts none. Without
    ``host`` or host material no choice is drawn."""
    extra = host_material().conversions if host is not None else None
    if extra is None or draw(st.integers(0, 99)) < 100 - HOST_CONVERSION_CHANCE:
        return None
    for _ in range(HOST_CONVERSION_TRIES):
        own = draw(extra)
        if not isinstance(own, Conversion):
            raise TypeError("a target's conversions strategy must draw Conversion, got "
                            f"{type(own).__name__}")
        if host(own):
            event(f"conversion: {own.tag}")
            event(f"host conversion: {own.tag}")
            return own
    return None
