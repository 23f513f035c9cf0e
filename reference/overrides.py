"""The ``_apply`` overrides the reference honours, and the ones it refuses.

A class that overrides ``nn.Module._apply`` is described by an ``ApplyOverride``: the work its
own ``_apply`` does before it calls ``super()._apply`` (``before``) and after that returns
(``after``). ``reference.apply`` converts the tensors itself and runs these steps around the
conversion (rules 9 and 10 of its docstring).

Rules:
1. Lookup walks ``type(module).__mro__`` up to ``nn.Module``. Every class on the way that
   defines ``_apply`` in its own ``__dict__`` must be described (built in, or registered with
   ``register_apply_override``); a description covers that one class's own code, so a subclass
   of ``nn.LSTM`` that overrides ``_apply`` again needs its own. The module's descriptions come
   outermost class first (``overrides_of``).
2. A class in ``REFUSED`` cannot be converted by the reference at all: ``ApplyOverrideError``
   with the stated reason.
3. A class that defines ``_apply`` and is described nowhere is unknown: ``ApplyOverrideError``
   naming it and saying how to register it.
5. Old-style reparametrizations (``torch.nn.utils.weight_norm``, ``spectral_norm`` and
   ``prune``) keep a computed attribute (``weight``) that their forward pre-hook recomputes,
   and whose autograd graph holds the tensors it is computed from (so ``swap_tensors``
   refuses them). Each such hook is described per module (``hook_overrides_of``): ``before``
   drops the computed attribute, ``after`` computes it again from the converted tensors, the
   way the hook would, without a power iteration. Where that computation fails on the
   converted tensors (sparse ones), the attribute stays absent, for the hook to compute at the
   next forward (which then raises, as torch's stale attribute would). When the conversion
   fails, ``undo`` runs instead of ``after``: it puts back a dropped attribute that carries no
   autograd graph (a spectral norm's attribute before its first forward is the raw weight, not
   what the hook computes), and computes one that carries a graph again from the restored
   tensors (keeping it would keep the graph, and the swap refused).
4. ``register_apply_override`` describes a class that defines ``_apply`` itself and is not yet
   described (built in, refused or registered); ``unregister_apply_override`` removes a
   registration again. Built-in descriptions cannot be replaced or removed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from torch import Tensor, nn
from torch.nn.cpp import ModuleWrapper
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm


class ApplyOverrideError(TypeError):
    """A module whose class overrides ``_apply`` in a way the reference cannot follow."""


@dataclass(frozen=True)
class ApplyOverride:
    """What one class's ``_apply`` does around its ``super()._apply(fn, recurse)`` call.

    Neither step may change the tensors in the module's slots; both get the module itself.
    ``undo``, where given, runs instead of ``after`` when the conversion failed: it puts back
    what ``before`` changed.
    """

    before: Callable[[nn.Module], None]
    after: Callable[[nn.Module], None]
    undo: Callable[[nn.Module], None] | None = None


def _drop_flat_weight_refs(rnn: nn.RNNBase) -> None:
    """``RNNBase._apply`` before: drop the weakrefs that would block ``swap_tensors``."""
    rnn._flat_weight_refs = []


def _init_flat_weights(rnn: nn.RNNBase) -> None:
    """``RNNBase._apply`` after: point ``_flat_weights`` (and its weakrefs) at the parameters."""
    rnn._init_flat_weights()


BUILTIN: Mapping[type, ApplyOverride] = MappingProxyType({
    nn.RNNBase: ApplyOverride(before=_drop_flat_weight_refs, after=_init_flat_weights),
})

REFUSED: Mapping[type, str] = MappingProxyType({
    ModuleWrapper: (
        "it wraps a C++ frontend module: its _apply rewrites `param.data` of the C++ module's "
        "tensors itself and never calls super()._apply, so there is no conversion to take over"
    ),
})

_registered: dict[type, ApplyOverride] = {}


def register_apply_override(
    cls: type,
    *,
    before: Callable[[nn.Module], None],
    after: Callable[[nn.Module], None],
) -> None:
    """Rule 4: teach the reference the ``_apply`` override of ``cls``.

    ``before(module)`` is the work ``cls._apply`` does before ``super()._apply``; ``after(module)``
    the work after it. Bad input raises (``TypeError``, ``ValueError``) and registers nothing.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_apply_override: expected a class, got {cls!r}")
    for step_name, step in (("before", before), ("after", after)):
        if not callable(step):
            raise TypeError(f"register_apply_override: {step_name} must be callable, got {step!r}")
    if cls is nn.Module or "_apply" not in vars(cls):
        raise ValueError(
            f"register_apply_override: {_qualname(cls)} does not override _apply itself; "
            "there is nothing to describe"
        )
    if cls in BUILTIN or cls in REFUSED or cls in _registered:
        raise ValueError(f"register_apply_override: {_qualname(cls)} is already described")
    _registered[cls] = ApplyOverride(before=before, after=after)


def unregister_apply_override(cls: type) -> None:
    """Rule 4: remove the registration of ``cls`` (``ValueError`` if it has none)."""
    if cls not in _registered:
        raise ValueError(f"unregister_apply_override: {_qualname(cls)} is not registered")
    del _registered[cls]


def registered_apply_overrides() -> dict[type, ApplyOverride]:
    """A copy of the registrations made with ``register_apply_override``."""
    return dict(_registered)


def restore_registered_apply_overrides(saved: Mapping[type, ApplyOverride]) -> None:
    """Make the registrations exactly ``saved`` (a ``registered_apply_overrides()`` copy)."""
    _registered.clear()
    _registered.update(saved)


def overrides_of(module: nn.Module) -> list[ApplyOverride]:
    """Rules 1-3: the descriptions of ``module``'s ``_apply`` overrides, outermost class first."""
    found = []
    for klass in type(module).__mro__:
        if klass is nn.Module:
            break
        if klass in REFUSED:
            raise ApplyOverrideError(
                f"reference.apply refuses the _apply override of {_named(klass, module)}, "
                f"because {REFUSED[klass]}"
            )
        override = BUILTIN.get(klass) or _registered.get(klass)
        if override is not None:
            found.append(override)
        elif "_apply" in vars(klass):
            raise ApplyOverrideError(
                f"reference.apply does not know the _apply override of {_named(klass, module)}; "
                "describe the work it does before and after super()._apply with "
                f"swapspec.reference.register_apply_override({klass.__name__}, before=..., after=...)"
            )
    return found


def _recomputed(hook: object) -> Callable[[nn.Module], object]:
    """The computed attribute of one old-style reparametrization hook, as the hook computes it."""
    if isinstance(hook, SpectralNorm):
        return lambda m: hook.compute_weight(m, do_power_iteration=False)
    if isinstance(hook, BasePruningMethod):
        return hook.apply_mask
    return hook.compute_weight


def _derived_attribute(hook: WeightNorm | SpectralNorm | BasePruningMethod) -> ApplyOverride:
    """Rule 5 for one hook."""
    compute = _recomputed(hook)
    name = hook._tensor_name if isinstance(hook, BasePruningMethod) else hook.name
    kept: dict[int, Tensor] = {}  # a dropped attribute without a graph: it cannot block a swap

    def before(module: nn.Module) -> None:
        value = module.__dict__.pop(name, None)
        if value is not None and value.grad_fn is None:
            kept[id(module)] = value

    def after(module: nn.Module) -> None:
        try:
            value = compute(module)
        except RuntimeError:
            return  # left absent: the forward pre-hook computes it (and raises) when needed
        setattr(module, name, value)

    def undo(module: nn.Module) -> None:
        if id(module) in kept:
            setattr(module, name, kept.pop(id(module)))
        else:
            after(module)  # from the restored tensors: the value it had

    return ApplyOverride(before=before, after=after, undo=undo)


OLD_STYLE_HOOKS = (WeightNorm, SpectralNorm, BasePruningMethod)


def hook_overrides_of(module: nn.Module) -> list[ApplyOverride]:
    """Rule 5: one description per old-style reparametrization hook of ``module``."""
    return [_derived_attribute(hook) for hook in module._forward_pre_hooks.values()
            if isinstance(hook, OLD_STYLE_HOOKS)]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _named(klass: type, module: nn.Module) -> str:
    """``klass`` by its full name, and the module's own class when that is a subclass of it."""
    if klass is type(module):
        return _qualname(klass)
    return f"{_qualname(klass)} (a base of {_qualname(type(module))})"
