"""Targets: the implementations the suite tests, and how one is chosen.

A target is any object (a module qualifies) with:

- ``name: str``;
- ``apply(module, fn, *, overwrite: bool, swap: bool, recurse: bool = True)``;
- ``functional_call(module, tensors, args=(), kwargs=None, *, tie_weights=True, strict=False)``;

and optionally the data the suite reads next to it:

- ``deviations``: a sequence of ``properties.deviations.Deviation`` it is known to have;
- ``skips``: a mapping ``{property_id: reason}`` of properties that do not apply to it;
- ``call_forms``: the ``tensors`` forms its ``functional_call`` takes (default: a dict, and
  tuples of dicts); the properties draw only these;
- ``load_state_dict(module, state_dict, *, strict=True, assign=False, swap: bool)``, returning
  torch's ``(missing_keys, unexpected_keys)`` named tuple; without it the ``LOAD-`` properties
  are skipped for the target.

Select one with ``--swapspec-target``, ``SWAPSPEC_TARGET`` or the ini key ``swapspec_target``:
a built-in name, ``all`` (every built-in), ``package.module`` (the module is the target) or
``package.module:attribute``; comma-separated for several.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from swapspec import reference
from swapspec.properties.deviations import Deviation
from swapspec.properties.torch_deviations import STATELESS_DEVIATIONS, TORCH_DEVIATIONS
from swapspec.properties.torch_load_deviations import LOAD_DEVIATIONS
from swapspec.properties.xla_deviations import XLA_DEVIATIONS

BUILTIN_NAMES = ("reference", "torch", "torch-stateless")


class TargetError(Exception):
    """A target string that names nothing usable."""


@dataclass(frozen=True)
class Target:
    """One implementation under test, with its declared deviations and skips."""

    name: str
    apply: Callable[..., nn.Module]
    functional_call: Callable[..., Any]
    deviations: tuple[Deviation, ...] = ()
    skips: Mapping[str, str] = field(default_factory=dict)
    spec: str = ""  # the string that selects it, for repros; defaults to ``name``
    call_forms: tuple[str, ...] = ("dict", "tuple-single", "tuple-disjoint", "tuple-overlap")
    load_state_dict: Callable[..., Any] | None = None

    @property
    def selector(self) -> str:
        """What ``load_target`` takes to get this target back."""
        return self.spec or self.name

    def __repr__(self) -> str:
        """The selector only: falsifying examples print this, not the declarations."""
        return f"Target({self.selector!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints dataclasses field by field unless told otherwise."""
        printer.text(repr(self))


def torch_apply(
    module: nn.Module, fn: Callable, *, overwrite: bool, swap: bool, recurse: bool = True
) -> nn.Module:
    """``module._apply(fn, recurse)`` with ``torch.__future__``'s flags set for the call."""
    future = torch.__future__
    saved = (
        future.get_overwrite_module_params_on_conversion(),
        future.get_swap_module_params_on_conversion(),
    )
    try:
        future.set_overwrite_module_params_on_conversion(overwrite)
        future.set_swap_module_params_on_conversion(swap)
        return module._apply(fn, recurse=recurse)
    finally:
        future.set_overwrite_module_params_on_conversion(saved[0])
        future.set_swap_module_params_on_conversion(saved[1])


def torch_load_state_dict(module: nn.Module, state_dict, *, strict: bool = True,
                          assign: bool = False, swap: bool) -> Any:
    """``module.load_state_dict(state_dict, strict, assign)`` with ``torch.__future__``'s swap
    flag set for the call and restored in ``finally``."""
    future = torch.__future__
    saved = future.get_swap_module_params_on_conversion()
    try:
        future.set_swap_module_params_on_conversion(swap)
        return module.load_state_dict(state_dict, strict=strict, assign=assign)
    finally:
        future.set_swap_module_params_on_conversion(saved)


def stateless_functional_call(module, tensors, args=(), kwargs=None, *, tie_weights=True,
                              strict=False):
    """``torch.nn.utils.stateless.functional_call``, its FutureWarning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.nn.utils.stateless.functional_call(
            module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict
        )


STATELESS_SKIPS = {
    "FC-INPUT-FORMS": "torch.nn.utils.stateless.functional_call takes a single dict only",
}


def builtin_target(name: str) -> Target:
    """The built-in target called ``name``."""
    if name == "reference":
        return from_object(reference)
    if name == "torch":
        return Target("torch", torch_apply, torch.func.functional_call,
                      deviations=TORCH_DEVIATIONS + XLA_DEVIATIONS + LOAD_DEVIATIONS,
                      load_state_dict=torch_load_state_dict)
    if name == "torch-stateless":
        return Target("torch-stateless", torch_apply, stateless_functional_call,
                      deviations=(TORCH_DEVIATIONS + XLA_DEVIATIONS + STATELESS_DEVIATIONS
                                  + LOAD_DEVIATIONS),
                      skips=STATELESS_SKIPS,
                      call_forms=("dict",),
                      load_state_dict=torch_load_state_dict)
    raise TargetError(f"unknown built-in target {name!r}; choose one of {', '.join(BUILTIN_NAMES)}"
                      " or give package.module:attribute")


def from_object(obj: Any) -> Target:
    """Wrap any object with ``name``, ``apply`` and ``functional_call`` as a Target."""
    if isinstance(obj, Target):
        return obj
    missing = [a for a in ("name", "apply", "functional_call") if not hasattr(obj, a)]
    if missing:
        raise TargetError(f"{obj!r} is not a target: it lacks {', '.join(missing)}")
    return Target(
        str(obj.name), obj.apply, obj.functional_call,
        deviations=tuple(getattr(obj, "deviations", ())),
        skips=dict(getattr(obj, "skips", {})),
        **({"call_forms": tuple(obj.call_forms)} if hasattr(obj, "call_forms") else {}),
        load_state_dict=getattr(obj, "load_state_dict", None),
    )


def load_target(spec: str) -> Target:
    """A built-in name, ``package.module`` or ``package.module:attribute`` naming a target."""
    spec = spec.strip()
    if ":" not in spec and (spec in BUILTIN_NAMES or "." not in spec):
        return builtin_target(spec)
    module_name, _, attribute = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
        if attribute:
            obj = getattr(obj, attribute)
    except (ImportError, AttributeError) as e:
        raise TargetError(f"cannot load target {spec!r}: {type(e).__name__}: {e}") from e
    return dataclasses.replace(from_object(obj), spec=spec)


def load_targets(spec: str) -> Sequence[Target]:
    """The targets ``spec`` names; ``all`` stands for every built-in."""
    names = [part.strip() for part in spec.split(",") if part.strip()]
    names = [n for part in names for n in (BUILTIN_NAMES if part == "all" else (part,))]
    if not names:
        raise TargetError(f"no target in {spec!r}")
    return [load_target(name) for name in names]
