"""Leaf and container classes that the tree strategies build.

Rules every class here follows:

* ``forward(x, **kwargs)`` maps a float tensor of shape ``(BATCH, FEATURES)`` to a tensor of the same shape and
  dtype, and passes ``**kwargs`` on to its children.
* A leaf's output depends on every tensor registered on it (parameters and buffers, integer and bool ones
  included): :func:`dependence` folds them into one scalar ``s`` and the leaf returns ``f(x) + s * pattern(x)``
  where ``pattern`` varies over batch and features (so LayerNorm / BatchNorm later in the chain cannot erase it).
* Real layers cast ``x`` to their weight's dtype and their output back to ``x``'s dtype (complex -> real part).
* Nothing here touches torch's global RNG.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

BATCH = 2
FEATURES = 4
EMBEDDINGS = 5


class ForwardError(RuntimeError):
    """Raised by a leaf with the ``raise`` behaviour when called with ``fail=True``."""


class TaggedParameter(nn.Parameter):
    """A ``Parameter`` subclass that carries an instance attribute ``tag`` (a str)."""

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True, tag: str = ""):
        p = super().__new__(cls, data, requires_grad)
        p.tag = tag
        return p


class SelfLoadingParameter(TaggedParameter):
    """A ``TaggedParameter`` with its own ``Tensor.module_load``, as a subclass that must keep
    itself through a swap-path load writes one (the hook torch documents for it): the loaded
    tensor is torch's default result, given back as this class with this parameter's ``tag``
    and ``requires_grad``."""

    def module_load(self, other: Tensor, assign: bool = False) -> Tensor:
        loaded = super().module_load(other, assign=assign)
        return type(self)(loaded, self.requires_grad, tag=self.tag)


class Observation(NamedTuple):
    """What a reporting leaf saw during one forward call (appended to ``kwargs['report']``)."""

    module: nn.Module
    parameters: tuple[tuple[str, Tensor], ...]
    buffers: tuple[tuple[str, Tensor], ...]
    state_dict: dict[str, Any]


def dependence(module: nn.Module, like: Tensor) -> Tensor:
    """Return ``sum_i c_i * sum(t_i)`` over the module's own non-None tensors, as a 0-d tensor like ``like``.

    ``c_i`` is distinct per slot (parameters first, then buffers, in registration order, then the
    values of parametrized attributes) so that substituting
    one tensor for another changes the result. Complex tensors contribute their real part; bool and integer
    tensors are summed as float64. Uninitialized (lazy) parameters are skipped.
    """
    total = torch.zeros((), dtype=torch.float64, device=like.device)
    slots = [*module._parameters.values(), *module._buffers.values(), *_parametrized(module)]
    for i, t in enumerate(slots):
        if t is None or isinstance(t, nn.parameter.UninitializedTensorMixin):
            continue
        v = t.real if t.is_complex() else t
        total = total + v.to(dtype=torch.float64, device=like.device).sum() * (0.01 * (i + 1))
    return total.to(like.dtype)


def _parametrized(module: nn.Module) -> list[Tensor]:
    """The values of a parametrized module's parametrized attributes (they left ``_parameters``)."""
    if not parametrize.is_parametrized(module):
        return []
    return [getattr(module, name) for name in module.parametrizations]


def pattern(x: Tensor) -> Tensor:
    """A fixed tensor shaped like ``x`` whose entries differ across batch and features."""
    return torch.arange(x.numel(), dtype=x.dtype, device=x.device).reshape(x.shape).sin() + 1


def _finish(module: nn.Module, x: Tensor, out: Tensor) -> Tensor:
    """Cast ``out`` back to ``x``'s dtype/shape and add the dependence term of ``module``."""
    if out.is_complex():
        out = out.real
    out = out.reshape(x.shape).to(x.dtype)
    return out + dependence(module, x) * pattern(x)


def _cast(x: Tensor, weight: Tensor | None) -> Tensor:
    return x if weight is None else x.to(weight.dtype)


# ---------------------------------------------------------------- real layers


class SwLinear(nn.Linear):
    """``nn.Linear(4, 4)`` with the swapspec forward contract."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        return _finish(self, x, F.linear(_cast(x, self.weight), self.weight, self.bias))


class SwLazyLinear(nn.LazyLinear):
    """``nn.LazyLinear(4)``; on materialization fills values from its own seed and becomes :class:`SwLinear`."""

    cls_to_become = SwLinear
    sw_seed: int = 0

    def initialize_parameters(self, input: Tensor, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize_parameters(input)

    def reset_parameters(self) -> None:
        if self.has_uninitialized_params() or self.in_features == 0:
            return
        gen = torch.Generator().manual_seed(self.sw_seed)
        with torch.no_grad():
            for p in (self.weight, self.bias):
                if p is not None:
                    p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1)

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:  # pragma: no cover - class is swapped first
        return SwLinear.forward(self, x)  # type: ignore[arg-type]


class SwConv1d(nn.Conv1d):
    """``nn.Conv1d(1, 1, 3, padding=1)`` on ``x.view(B, 1, F)``."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        h = _cast(x, self.weight).reshape(x.shape[0], 1, -1)
        return _finish(self, x, self._conv_forward(h, self.weight, self.bias))


class SwConv2d(nn.Conv2d):
    """``nn.Conv2d(2, 2, (1, 3), padding='same')`` on ``x.view(B, 2, 1, 2)`` (weight is a 4-D (2, 2, 1, 3))."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        h = _cast(x, self.weight).reshape(x.shape[0], 2, 1, -1)
        return _finish(self, x, self._conv_forward(h, self.weight, self.bias))


class SwBatchNorm1d(nn.BatchNorm1d):
    """``nn.BatchNorm1d(4)``; in train mode it updates ``running_*`` and ``num_batches_tracked`` in place."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        ref = self.weight if self.weight is not None else self.running_mean
        return _finish(self, x, super().forward(_cast(x, ref)))


class SwLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm(4)``."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        return _finish(self, x, super().forward(_cast(x, self.weight)))


class SwEmbedding(nn.Embedding):
    """``nn.Embedding(5, 4)`` (``sparse=True``: sparse grads); indices are ``floor(|x|.sum(1) * 7) % 5``, the looked-up rows are added to ``x``."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        idx = (x.detach().abs().sum(dim=1) * 7).floor().long() % self.num_embeddings
        rows = F.embedding(idx, self.weight, sparse=self.sparse)
        return _finish(self, x, _cast(x, self.weight) + rows)


# ---------------------------------------------------------------- generic leaf


class GenericLeaf(nn.Module):
    """A leaf with arbitrary registered tensors and optional behaviours.

    Behaviours (a tuple of names, set by the builder):

    * ``'inplace'``: a float32 buffer ``steps`` gets ``add_(1)`` in every forward.
    * ``'rebind'``: an int64 buffer ``count`` is rebound, ``self.count = self.count + 1``.
    * ``'report'``: appends an :class:`Observation` to ``kwargs['report']`` when that key is given.
    * ``'raise'``: raises :class:`ForwardError` when ``kwargs.get('fail')`` (after the updates above).
    """

    def __init__(self, behaviours: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.behaviours = tuple(behaviours)

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        if "inplace" in self.behaviours and self.steps is not None:
            with torch.no_grad():
                self.steps.add_(1)
        if "rebind" in self.behaviours and self.count is not None:
            self.count = self.count + 1
        if "report" in self.behaviours and kwargs.get("report") is not None:
            kwargs["report"].append(observe(self))
        out = x + dependence(self, x) * pattern(x)
        if "raise" in self.behaviours and kwargs.get("fail"):
            raise ForwardError(f"{type(self).__name__} asked to fail")
        return out

    def extra_repr(self) -> str:
        return f"behaviours={self.behaviours!r}" if self.behaviours else ""


class OwnApplyLeaf(GenericLeaf):
    """A generic leaf whose class overrides ``_apply``, as a user module that keeps state derived
    from its tensors does: after ``super()._apply`` has converted them, ``record_conversion``
    counts the conversion (``conversions``) and records each own tensor's name, dtype and device
    (``record``), kept in private attributes as a class keeps its derived state (an RNN's
    ``_flat_weights``). Its forward is :class:`GenericLeaf`'s: the record changes no output.

    The reference converts tensors itself and runs a class's ``_apply`` work as a registered
    description (``reference.register_apply_override``): this class's is registered below.
    """

    def __init__(self, behaviours: tuple[str, ...] = ()) -> None:
        super().__init__(behaviours)
        self._conversions = 0
        self._record: tuple[tuple[str, str, str], ...] = ()

    @property
    def conversions(self) -> int:
        """How many conversions ran the override's work."""
        return self._conversions

    @property
    def record(self) -> tuple[tuple[str, str, str], ...]:
        """What the override's last run recorded (``own_tensors``); empty before any."""
        return self._record

    def _apply(self, fn: Any, recurse: bool = True) -> nn.Module:
        result = super()._apply(fn, recurse)
        self.record_conversion()
        return result

    def own_tensors(self) -> tuple[tuple[str, str, str], ...]:
        """``(name, dtype, device type)`` of each own non-None parameter and buffer."""
        slots = [*self._parameters.items(), *self._buffers.items()]
        return tuple((name, str(t.dtype), t.device.type) for name, t in slots if t is not None)

    def record_conversion(self) -> None:
        """The work of the override: count the conversion, record the converted tensors."""
        self._conversions += 1
        self._record = self.own_tensors()


def known_to_reference(cls: type[OwnApplyLeaf]) -> None:
    """Describe ``cls``'s ``_apply`` work to the reference (``register_apply_override``) unless
    it is described already; a standalone repro defines its own copy of the class and calls
    this where swapspec is installed."""
    try:
        from swapspec.reference import overrides
    except ImportError:  # plain torch: torch runs the class's own _apply
        return
    if cls not in overrides.registered_apply_overrides():
        overrides.register_apply_override(cls, before=lambda module: None,
                                          after=cls.record_conversion)


known_to_reference(OwnApplyLeaf)


def observe(module: nn.Module) -> Observation:
    """Snapshot of what ``parameters()``, ``buffers()`` and ``state_dict(keep_vars=True)`` show right now."""
    return Observation(
        module=module,
        parameters=tuple(module.named_parameters(remove_duplicate=False)),
        buffers=tuple(module.named_buffers(remove_duplicate=False)),
        state_dict=dict(module.state_dict(keep_vars=True)),
    )


# ---------------------------------------------------------------- containers


def _run(children: Any, x: Tensor, kwargs: dict[str, Any]) -> Tensor:
    for child in children:
        x = child(x, **kwargs)
    return x


class SwSequential(nn.Sequential):
    """``nn.Sequential`` whose forward passes ``**kwargs`` to every child."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:  # type: ignore[override]
        return _run(self._modules.values(), x, kwargs)


class SwModuleList(nn.ModuleList):
    """``nn.ModuleList`` that runs its children in order."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        return _run(self._modules.values(), x, kwargs)


class SwModuleDict(nn.ModuleDict):
    """``nn.ModuleDict`` that runs its values in insertion order."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        return _run(self._modules.values(), x, kwargs)


class Block(nn.Module):
    """A custom container with named children (``first``, ``second``, ...), run in registration order."""

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        return _run(self._modules.values(), x, kwargs)
