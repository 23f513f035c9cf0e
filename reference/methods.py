"""Reference public methods: ``nn.Module.to``, ``half``, ``to_empty``... built on ``apply``.

torch builds its public conversion methods on ``nn.Module._apply``; the reference builds the same
methods on any ``apply(module, fn, *, overwrite, swap, recurse=True)``. ``Methods(apply)`` is that
builder: ``Methods(reference.apply)`` gives the reference's own methods (the module-level
functions below), ``Methods(mylib.apply)`` gives a host's for free. Each method takes the module
first, then torch's own arguments, then the keyword-only ``overwrite`` and ``swap`` that go to
``apply`` (``None``: the reference reads its flags; a method that converts nothing ignores them).

Rules common to every method:

1. A conversion method is ``apply(module, fn)`` with the per-tensor ``fn`` torch's method uses
   (its docstring gives it), and returns ``module``.
2. Argument forms are exactly torch's: a method takes the arguments torch's method takes, and
   a form torch refuses raises torch's error type (``TypeError`` for a bad argument type or
   count, torch's own ``RuntimeError``/``ValueError`` for a bad device or type string).
3. Bad input leaves the module as it was: every argument is checked before ``apply`` runs (or
   before any ``requires_grad`` changes), whatever the module holds.
4. ``cuda(device)`` is ``t.cuda(device)`` per tensor; it is not exercised here (no CUDA on
   the machines the suite is checked on).
5. ``prune_remove``, ``remove_weight_norm`` and ``remove_spectral_norm``
   (``torch.nn.utils.prune.remove``, ``remove_weight_norm``, ``remove_spectral_norm``) are
   ``reference.reparametrizations``': they convert
   nothing, so they never call ``apply`` and ignore the flags.
6. The registration methods (``register_parameter``, ``register_buffer``, ``add_module``,
   ``register_module``, ``set_submodule``, ``setattr``, ``delattr``, ``register_parametrization``) are
   ``reference.registration``'s: they convert
   nothing, so they never call ``apply`` and ignore the flags.
7. ``convert_conv2d_weight_memory_format`` and ``convert_conv3d_weight_memory_format``
   (``torch.nn.utils``'s) give the weight of every convolution of their rank in the tree (the
   root included; ``Conv2d``/``ConvTranspose2d``, ``Conv3d``/``ConvTranspose3d``) the layout
   ``weight.detach().clone(memory_format=memory_format)``, written in place (``.data =``;
   into each inner tensor of a traceable wrapper subclass too, which is what it computes with):
   the weight keeps its object, class, ``requires_grad``, grad and values; every other tensor
   is left as it is. They convert nothing else, so they never call ``apply`` and ignore the
   flags. ``preserve_format`` (no layout), a format the weights' rank cannot take, or a weight
   without strides (sparse) raises torch's ``RuntimeError`` before anything changes (rule 3).
8. ``skip_init(module_cls, *args, **kwargs)`` (``torch.nn.utils.skip_init``) builds
   ``module_cls(*args, **kwargs)`` on ``meta`` and gives it ``to_empty(device=...)`` (the
   ``device`` of ``kwargs``, ``"cpu"`` without one) with the flags: the module a plain build
   gives, its tensors' values left uninitialized. A class that is no ``nn.Module``, or whose
   constructor does not name ``device`` in its signature (torch's documented contract: a
   ``device`` taken through ``**kwargs`` only is not seen), raises torch's ``RuntimeError``
   before anything is built.
"""

from __future__ import annotations

import builtins
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.reference import registration, reparametrizations

COMPLEX_WARNING = (
    "Complex modules are a new feature under active development whose design may change, "
    "and some modules might not work as expected when using complex tensors as parameters or "
    "buffers. Please file an issue at https://github.com/pytorch/pytorch/issues/new?template="
    "bug-report.yml if a complex module does not work as expected.")
META_HINT = ("Please use torch.nn.Module.to_empty() instead of torch.nn.Module.to() when moving "
             "module from meta to a different device.")

CONVERSION_METHODS = ("to", "to_empty", "half", "float", "double", "bfloat16", "type", "cpu",
                      "cuda", "share_memory")
GRAD_METHODS = ("requires_grad_", "zero_grad")
METHODS = (*CONVERSION_METHODS, *GRAD_METHODS)
REGISTRATION_METHODS = registration.REGISTRATION_METHODS  # converts nothing: flags ignored
# they convert nothing
REPARAMETRIZATION_METHODS = ("prune_remove", "remove_weight_norm", "remove_spectral_norm")
# ``torch.nn.utils``' layout conversions of convolution weights: the flags ignored
MEMORY_FORMAT_METHODS = ("convert_conv2d_weight_memory_format",
                         "convert_conv3d_weight_memory_format")
# ``torch.nn.utils.skip_init``: builds a module (its first argument is a class)
CONSTRUCTION_METHODS = ("skip_init",)
CONVOLUTIONS_2D = (nn.Conv2d, nn.ConvTranspose2d)
CONVOLUTIONS_3D = (nn.Conv3d, nn.ConvTranspose3d)


def parse_to(*args: Any, **kwargs: Any) -> tuple[Any, Any, bool, Any]:
    """``to``'s arguments as ``(device, dtype, non_blocking, memory_format)``.

    torch's own parser (``torch._C._nn._parse_to``): ``to(device=None, dtype=None,
    non_blocking=False)``, ``to(dtype, non_blocking=False)``, ``to(tensor, non_blocking=False)``
    (its device and dtype), each with the keyword ``memory_format``; anything else raises
    ``TypeError`` (``RuntimeError`` for an unknown device string). Then the dtype must be
    floating or complex: ``TypeError`` "nn.Module.to only accepts floating point or complex
    dtypes, but got desired dtype=...". A complex dtype warns (``UserWarning``) and proceeds.
    """
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if dtype is not None:
        if not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError("nn.Module.to only accepts floating point or complex "
                            f"dtypes, but got desired dtype={dtype}")
        if dtype.is_complex:
            warnings.warn(COMPLEX_WARNING, stacklevel=3)
    return device, dtype, non_blocking, memory_format


def to_fn(device: Any, dtype: Any, non_blocking: bool, memory_format: Any
          ) -> Callable[[Tensor], Tensor]:
    """``to``'s per-tensor function: ``t.to(device, dtype, non_blocking)`` where ``dtype`` is
    given only to floating and complex tensors (integral ones keep theirs), with
    ``memory_format`` for 4-d and 5-d tensors; a copy out of a meta tensor raises
    ``NotImplementedError`` pointing at ``to_empty``."""
    def convert(t: Tensor) -> Tensor:
        own = dtype if t.is_floating_point() or t.is_complex() else None
        try:
            if memory_format is not None and t.dim() in (4, 5):
                return t.to(device, own, non_blocking, memory_format=memory_format)
            return t.to(device, own, non_blocking)
        except NotImplementedError as e:
            if str(e) == "Cannot copy out of meta tensor; no data!":
                raise NotImplementedError(f"{e} {META_HINT}") from None
            raise

    return convert


def _floating(method: str) -> Callable[[Tensor], Tensor]:
    return lambda t: getattr(t, method)() if t.is_floating_point() else t


def _write_layout(t: Tensor, laid_out: Tensor) -> None:
    """Give ``t`` the values and layout of ``laid_out`` in place (``.data =``, so its object,
    class, attributes, grad and ``requires_grad`` stay), and for a traceable wrapper subclass
    each of its inner tensors those of ``laid_out``'s, which is what it computes with."""
    t.data = laid_out
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        for name in names:
            _write_layout(getattr(t, name), getattr(laid_out, name))


class Methods:
    """``nn.Module``'s public methods, built on ``apply`` (see the module docstring)."""

    def __init__(self, apply: Callable[..., Any]) -> None:
        self.apply = apply

    def _run(self, module: nn.Module, fn: Callable[[Tensor], Tensor], overwrite: bool | None,
             swap: bool | None, recurse: bool = True) -> nn.Module:
        self.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)
        return module

    def to(self, module: nn.Module, *args: Any, overwrite: bool | None = None,
           swap: bool | None = None, **kwargs: Any) -> nn.Module:
        """``module.to(*args, **kwargs)``: the forms and errors of ``parse_to``, then
        ``apply`` with ``to_fn``. Floating and complex tensors take the dtype; every tensor the
        device; 4-d and 5-d tensors the memory format."""
        return self._run(module, to_fn(*parse_to(*args, **kwargs)), overwrite, swap)

    def to_empty(self, module: nn.Module, *, device: Any, recurse: bool = True,
                 overwrite: bool | None = None, swap: bool | None = None) -> nn.Module:
        """``module.to_empty(*, device, recurse=True)``: ``torch.empty_like(t, device=device)``
        per tensor (values not kept), only ``module``'s own tensors with ``recurse=False``.
        ``device`` is keyword-only and required (``TypeError``); one ``empty_like`` refuses
        (``TypeError`` for a non-device) is refused before anything changes."""
        torch.empty_like(torch.empty(0), device=device)  # rule 3: the device, checked first
        return self._run(module, lambda t: torch.empty_like(t, device=device), overwrite, swap,
                         recurse=recurse)

    def half(self, module: nn.Module, *, overwrite: bool | None = None,
             swap: bool | None = None) -> nn.Module:
        """``module.half()``: floating tensors become float16; others stay as they are."""
        return self._run(module, _floating("half"), overwrite, swap)

    def float(self, module: nn.Module, *, overwrite: bool | None = None,
              swap: bool | None = None) -> nn.Module:
        """``module.float()``: floating tensors become float32; others stay as they are."""
        return self._run(module, _floating("float"), overwrite, swap)

    def double(self, module: nn.Module, *, overwrite: bool | None = None,
               swap: bool | None = None) -> nn.Module:
        """``module.double()``: floating tensors become float64; others stay as they are."""
        return self._run(module, _floating("double"), overwrite, swap)

    def bfloat16(self, module: nn.Module, *, overwrite: bool | None = None,
                 swap: bool | None = None) -> nn.Module:
        """``module.bfloat16()``: floating tensors become bfloat16; others stay as they are."""
        return self._run(module, _floating("bfloat16"), overwrite, swap)

    def type(self, module: nn.Module, dst_type: Any, *, overwrite: bool | None = None,
             swap: bool | None = None) -> nn.Module:
        """``module.type(dst_type)``: ``t.type(dst_type)`` on every tensor, integral and bool
        ones included. ``dst_type`` is a dtype or a type string (``'torch.DoubleTensor'``); a
        bad one raises what ``Tensor.type`` raises (``TypeError``; ``ValueError`` for an unknown
        string) before anything changes."""
        torch.empty(0).type(dst_type)  # rule 3: the type, checked first
        return self._run(module, lambda t: t.type(dst_type), overwrite, swap)

    def cpu(self, module: nn.Module, *, overwrite: bool | None = None,
            swap: bool | None = None) -> nn.Module:
        """``module.cpu()``: ``t.cpu()`` per tensor (a CPU tensor is returned as it is)."""
        return self._run(module, lambda t: t.cpu(), overwrite, swap)

    def cuda(self, module: nn.Module, device: Any = None, *, overwrite: bool | None = None,
             swap: bool | None = None) -> nn.Module:
        """``module.cuda(device=None)``: ``t.cuda(device)`` per tensor (not exercised: rule 4)."""
        return self._run(module, lambda t: t.cuda(device), overwrite, swap)

    def share_memory(self, module: nn.Module, *, overwrite: bool | None = None,
                     swap: bool | None = None) -> nn.Module:
        """``module.share_memory()``: ``t.share_memory_()`` per tensor (in place: the same
        object, its storage moved to shared memory)."""
        return self._run(module, lambda t: t.share_memory_(), overwrite, swap)

    def requires_grad_(self, module: nn.Module, requires_grad: bool = True, *,
                       overwrite: bool | None = None, swap: bool | None = None) -> nn.Module:
        """``module.requires_grad_(requires_grad=True)``: every parameter (each object once)
        gets ``requires_grad``, an uninitialized one (a lazy module's, before its first
        forward) too; buffers, grads and the slots' objects are untouched. A non-``bool``
        raises ``TypeError``, and ``True`` with an integral parameter ``RuntimeError``, before
        anything changes, whatever the module holds."""
        if not builtins.isinstance(requires_grad, bool):
            raise TypeError("requires_grad_(): argument 'requires_grad' (position 1) must be "
                            f"bool, not {builtins.type(requires_grad).__name__}")
        params = list(module.parameters())
        if requires_grad and any(not (p.is_floating_point() or p.is_complex()) for p in params):
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        for p in params:
            if builtins.isinstance(p, UninitializedTensorMixin):
                p.requires_grad = requires_grad  # its requires_grad_ refuses to run
            else:
                p.requires_grad_(requires_grad)
        return module

    def zero_grad(self, module: nn.Module, set_to_none: bool = True, *,
                  overwrite: bool | None = None, swap: bool | None = None) -> None:
        """``module.zero_grad(set_to_none=True)``: every parameter's grad becomes ``None``, or
        with ``set_to_none=False`` stays the same object, detached from any graph, with
        ``requires_grad=False`` and every value zero. Returns ``None``."""
        for p in module.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
                continue
            if p.grad.grad_fn is not None:
                p.grad.detach_()
            else:
                p.grad.requires_grad_(False)
            p.grad.zero_()

    def convert_conv2d_weight_memory_format(self, module: nn.Module, memory_format: Any, *,
                                            overwrite: bool | None = None,
                                            swap: bool | None = None) -> nn.Module:
        """``torch.nn.utils.convert_conv2d_weight_memory_format(module, memory_format)`` by
        rule 7: the weight of every ``Conv2d``/``ConvTranspose2d``."""
        return self._convert_weights(module, memory_format, CONVOLUTIONS_2D)

    def convert_conv3d_weight_memory_format(self, module: nn.Module, memory_format: Any, *,
                                            overwrite: bool | None = None,
                                            swap: bool | None = None) -> nn.Module:
        """``torch.nn.utils.convert_conv3d_weight_memory_format(module, memory_format)`` by
        rule 7: the weight of every ``Conv3d``/``ConvTranspose3d``."""
        return self._convert_weights(module, memory_format, CONVOLUTIONS_3D)

    def _convert_weights(self, module: nn.Module, memory_format: Any,
                         kinds: tuple[builtins.type, ...]) -> nn.Module:
        if memory_format is torch.preserve_format:
            raise RuntimeError("Unsupported memory formatPreserve")
        weights = {id(m.weight): m.weight for m in module.modules()
                   if builtins.isinstance(m, kinds) and m.weight is not None}
        laid_out = {key: w.detach().clone(memory_format=memory_format)
                    for key, w in weights.items()}  # rule 3: every clone before any write
        with torch.no_grad():
            for key, w in weights.items():
                _write_layout(w, laid_out[key])
        return module

    def skip_init(self, module_cls: Any, *args: Any, overwrite: bool | None = None,
                  swap: bool | None = None, **kwargs: Any) -> nn.Module:
        """Rule 8: ``module_cls(*args, **kwargs)`` built on ``meta``, then ``to_empty``."""
        if not issubclass(module_cls, nn.Module):
            raise RuntimeError(f"Expected a Module; got {module_cls}")
        if "device" not in inspect.signature(module_cls).parameters:
            raise RuntimeError("Module must support a 'device' arg to skip initialization")
        device = kwargs.pop("device", "cpu")
        module = module_cls(*args, **kwargs, device="meta")
        return self.to_empty(module, device=device, overwrite=overwrite, swap=swap)

    # Registration (``reference.registration``) converts nothing: it never calls ``apply``.
    register_parameter = staticmethod(registration.register_parameter)
    register_buffer = staticmethod(registration.register_buffer)
    add_module = staticmethod(registration.add_module)
    register_module = staticmethod(registration.register_module)
    set_submodule = staticmethod(registration.set_submodule)
    setattr = staticmethod(registration.setattr)
    delattr = staticmethod(registration.delattr)
    register_parametrization = staticmethod(registration.register_parametrization)
    prune_remove = staticmethod(reparametrizations.prune_remove)
    remove_weight_norm = staticmethod(reparametrizations.remove_weight_norm)
    remove_spectral_norm = staticmethod(reparametrizations.remove_spectral_norm)


def _reference_apply(module: nn.Module, fn: Callable, *, overwrite: bool | None = None,
                     swap: bool | None = None, recurse: bool = True) -> nn.Module:
    from swapspec.reference.apply import apply

    return apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)


REFERENCE_METHODS = Methods(_reference_apply)
to = REFERENCE_METHODS.to
to_empty = REFERENCE_METHODS.to_empty
half = REFERENCE_METHODS.half
float = REFERENCE_METHODS.float  # nn.Module.float (shadows the builtin here only)
double = REFERENCE_METHODS.double
bfloat16 = REFERENCE_METHODS.bfloat16
type = REFERENCE_METHODS.type  # nn.Module.type (shadows the builtin here only)
cpu = REFERENCE_METHODS.cpu
cuda = REFERENCE_METHODS.cuda
share_memory = REFERENCE_METHODS.share_memory
requires_grad_ = REFERENCE_METHODS.requires_grad_
zero_grad = REFERENCE_METHODS.zero_grad
skip_init = REFERENCE_METHODS.skip_init
convert_conv2d_weight_memory_format = REFERENCE_METHODS.convert_conv2d_weight_memory_format
convert_conv3d_weight_memory_format = REFERENCE_METHODS.convert_conv3d_weight_memory_format
prune_remove = reparametrizations.prune_remove
remove_weight_norm = reparametrizations.remove_weight_norm
remove_spectral_norm = reparametrizations.remove_spectral_norm
register_parameter = registration.register_parameter
register_buffer = registration.register_buffer
add_module = registration.add_module
register_module = registration.register_module
set_submodule = registration.set_submodule
