"""Targets: the implementations the suite tests, and how one is chosen.

A target is any object (a module qualifies) with a ``name: str`` and at least one of:

- ``apply(module, fn, *, overwrite: bool, swap: bool, recurse: bool = True)``;
- ``functional_call(module, tensors, args=(), kwargs=None, *, tie_weights=True, strict=False)``;

and optionally the data the suite reads next to it:

- ``deviations``: a sequence of ``properties.harness.checker.Deviation`` it is known to have;
- ``skips``: a mapping ``{property_id: reason}`` of properties that do not apply to it;
- ``call_forms``: the ``tensors`` forms its ``functional_call`` takes (default: a dict, and
  tuples of dicts); the properties draw only these;
- ``load_state_dict(module, state_dict, *, strict=True, assign=False, swap: bool)``, returning
  torch's ``(missing_keys, unexpected_keys)`` named tuple; without it the ``LOAD-`` properties
  are skipped for the target.
- ``lacks``: names from ``FEATURES`` it does not implement, beyond the callables it simply
  does not have (e.g. ``{"tie_weights", "strict"}`` for a ``functional_call`` without those
  keywords; ``tuple_inputs`` follows from ``call_forms``);
- ``conversions``: a Hypothesis strategy of ``swapspec.strategies.Conversion`` (its own
  tensor subclass, its device move), drawn alongside the built-in conversions;
- ``modules``: a Hypothesis strategy of ``swapspec.strategies.HostModule`` (its own
  ``nn.Module`` s), drawn alongside the built-in module trees;
- ``module_conversions``: a Hypothesis strategy of ``swapspec.strategies.ModuleConversion``
  (conversions that change a whole module in place, as ``quantize_(model)``), which the
  ``MODCONV-`` properties hold to ``_apply``'s rules; without it they are skipped;
- ``methods``: ``nn.Module``'s public methods (``to``, ``to_empty``, ``half``, ``float``,
  ``double``, ``bfloat16``, ``type``, ``cpu``, ``share_memory``, ``requires_grad_``,
  ``zero_grad``; and the registration methods ``register_parameter``, ``register_buffer``,
  ``add_module``, ``register_module``, ``setattr``, ``delattr``; the ``torch.nn.utils``
  functions the reference implements, ``skip_init`` among them), an object with any of them as
  attributes, each called ``method(module, *torch_args, overwrite=..., swap=..., **torch_kwargs)``
  (``skip_init`` takes the module's class first). Without it (or for
  a name it lacks), a target with ``apply`` gets them built on its ``apply`` as the reference
  builds its own (``swapspec.reference.methods.Methods``); ``Target.method(name)`` gives the one
  to call;
- ``swap_tensors``: the ``swap_tensors(t1, t2)`` its swap paths use (default
  ``torch.utils.swap_tensors``; the reference's checks its refusals first), which the
  ``REGISTER-SWAP-REFUSED`` property holds to its refusals;
- ``stack_module_state``: the ``stack_module_state(models) -> (params, buffers)`` a user pairs
  with a functional call under ``torch.vmap`` to run an ensemble (the built-in torch targets:
  ``torch.func.stack_module_state``; the reference's refuses models that are not alike), which
  the ``STACK-`` properties hold to its rules; without it they are skipped (``FC-STACKED-ENSEMBLE``
  stacks with torch's, to judge the target's ``functional_call``);
- ``accessor``: the class whose instance ``accessor(module)`` reads and writes a module's tensors
  and children by dotted name (default torch's ``NamedMemberAccessor``; the reference's makes
  every batched write atomic), which the ``ACCESSOR-`` properties hold to its rules;
- ``exact_messages``: True to be held to torch's exact error type and wording (the built-in
  targets are). Otherwise an error is checked by type, by the keys its message names and by the
  module being left untouched (``properties.models.oracle.ExpectedError``), so a host need not copy
  torch's sentences.
- ``comparisons``: ``{tensor class: same(a, b) -> bool}``, how the suite compares the values
  of the host's own tensor classes (a subclass of a class listed uses its function). Without
  one, values compare through torch's ops, and two tensors of one traceable wrapper subclass
  that lacks them compare by their parts (``properties.models.examples.same_values``);
- ``designs``: names from ``DESIGNS``, the functional-call designs it follows where torch's
  differs (``{"registered-names-only", "no-write-back"}``); the properties draw and judge
  accordingly, with no predicate written by the host;
- ``coverage_modules``: the modules (importable names; a package stands for every file in it)
  whose functions ``--swapspec-coverage`` measures; default: the module the target is loaded
  from.

What a target implements (``Target.has``): each of ``FEATURES``. A callable feature
(``apply``, ``functional_call``, ``load_state_dict``) is there when the object has it (not
None); a feature of the call (``tie_weights``, ``strict``, ``tuple_inputs``) is there unless
``lacks`` names it, and never without ``functional_call``; ``tuple_inputs`` needs a tuple form
in ``call_forms``. A property that needs a missing feature
(``properties.vocabulary.NEEDS``) is skipped with one stated reason, and the calls draw only the
options the target has: without ``tie_weights`` every call is made without the keyword and
judged as torch's ``tie_weights=False`` (each name written on its own: giving one name of a tie
leaves the others as they are); without ``strict``, as a ``strict=False`` call.

Select one with ``--swapspec-target``, ``SWAPSPEC_TARGET`` or the ini key ``swapspec_target``:
a built-in name, ``all`` (every built-in), ``module`` or ``package.module`` (the module is the
target) or either with ``:attribute``; comma-separated for several. A module not importable
otherwise is looked for in the folder pytest was started in, then in its rootdir.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils import prune
from torch.nn.utils._named_member_accessor import NamedMemberAccessor

from swapspec import reference
from swapspec.properties.declarations import select
from swapspec.properties.declarations.torch import (
    STATELESS_DEVIATIONS,
    TORCH_DEVIATIONS,
    TORCH_METHOD_DEVIATIONS,
)
from swapspec.properties.declarations.torch_accessor import ACCESSOR_DEVIATIONS
from swapspec.properties.declarations.torch_checkpoint import CHECKPOINT_DEVIATIONS
from swapspec.properties.declarations.torch_contracts import CONTRACT_DEVIATIONS
from swapspec.properties.declarations.torch_load import LOAD_DEVIATIONS
from swapspec.properties.declarations.torch_memory_format import MEMORY_FORMAT_DEVIATIONS
from swapspec.properties.declarations.torch_old_style import OLD_STYLE_DEVIATIONS
from swapspec.properties.declarations.torch_parametrize import PARAMETRIZE_DEVIATIONS
from swapspec.properties.declarations.torch_reach import REACH_DEVIATIONS
from swapspec.properties.declarations.torch_registration import REGISTRATION_DEVIATIONS
from swapspec.properties.declarations.torch_stacking import STACKING_DEVIATIONS
from swapspec.properties.declarations.xla import XLA_DEVIATIONS
from swapspec.properties.vocabulary import Deviation

BUILTIN_NAMES = ("reference", "torch", "torch-stateless")

FEATURES: dict[str, str] = {
    "apply": "apply(module, fn, *, overwrite, swap, recurse)",
    "functional_call": "functional_call(module, tensors, args, kwargs, ...)",
    "tie_weights": "functional_call's tie_weights keyword",
    "strict": "functional_call's strict keyword",
    "tuple_inputs": "functional_call taking a tuple of dicts",
    "load_state_dict": "load_state_dict(module, state_dict, *, strict, assign, swap)",
    "module_conversions": "module conversions (a strategy of ModuleConversion)",
    "stack_module_state": "stack_module_state(models)",
}
# Functional-call designs of real libraries where torch's differs (``Target.designs``): what
# each means, and how the properties draw and judge a target that follows it.
DESIGNS: dict[str, str] = {
    "registered-names-only": "a name that is not a registered parameter or buffer raises "
                             "KeyError naming it (torch sets it as a plain attribute for the "
                             "call); valid calls give only registered names",
    "no-write-back": "a buffer that forward rebinds is not written back into the caller's "
                     "mapping, which keeps the object it gave (torch writes the new one back); "
                     "in-place updates still land on the given tensor",
    "no-input-checks": "inputs are not validated: only calls the spec accepts are drawn (no bad "
                       "input, no conflicting values, no overlapping split) and torch's "
                       "refusals of bad input (FC-BAD-INPUT) are not asked of it",
}
# The properties a design takes out of a target's run, with the reason reported.
DESIGN_SKIPS: dict[str, dict[str, str]] = {
    "no-input-checks": {"FC-BAD-INPUT": "it follows the design no-input-checks (inputs are "
                                        "not validated)"},
}
CALLABLE_FEATURES = ("apply", "functional_call", "load_state_dict")
KEYWORD_FEATURES = {"tie_weights": "functional_call", "strict": "functional_call",
                    "tuple_inputs": "functional_call"}


class TargetError(Exception):
    """A target string that names nothing usable."""


@dataclass(frozen=True)
class Target:
    """One implementation under test, with its declared deviations and skips."""

    name: str
    apply: Callable[..., nn.Module] | None = None
    functional_call: Callable[..., Any] | None = None
    deviations: tuple[Deviation, ...] = ()
    skips: Mapping[str, str] = field(default_factory=dict)
    spec: str = ""  # the string that selects it, for repros; defaults to ``name``
    call_forms: tuple[str, ...] = ("dict", "tuple-single", "tuple-disjoint", "tuple-overlap")
    lacks: frozenset[str] = frozenset()
    designs: frozenset[str] = frozenset()  # names from DESIGNS
    conversions: Any = None  # a strategy of Conversion, or None
    modules: Any = None  # a strategy of HostModule, or None
    module_conversions: Any = None  # a strategy of ModuleConversion, or None
    exact_messages: bool = False
    methods: Any = None  # nn.Module's public methods; see the module docstring
    coverage_modules: tuple[str, ...] = ()  # --swapspec-coverage's scope; () = its own module
    swap_tensors: Callable[[Any, Any], None] = torch.utils.swap_tensors
    stack_module_state: Callable[[Any], Any] | None = None
    accessor: Callable[[nn.Module], Any] = NamedMemberAccessor
    comparisons: Any = None  # {tensor class: same(a, b)}: how values of the host's classes compare
    # The five invariants of every operation (``models.invariants``) are checked on this target;
    # ``SWAPSPEC_INVARIANTS=1``/``0`` turns them on/off for every target.
    invariants: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "lacks", frozenset(self.lacks))
        object.__setattr__(self, "designs", frozenset(self.designs))
        modules = self.coverage_modules
        object.__setattr__(self, "coverage_modules",
                           (modules,) if isinstance(modules, str) else tuple(modules))
        unknown = sorted(self.lacks - set(FEATURES))
        if unknown:
            raise TargetError(f"target {self.name!r} lacks unknown feature(s) {', '.join(unknown)}"
                              f"; known: {', '.join(FEATURES)}")
        unknown = sorted(self.designs - set(DESIGNS))
        if unknown:
            raise TargetError(f"target {self.name!r} follows unknown design(s) "
                              f"{', '.join(unknown)}; known: {', '.join(DESIGNS)}")
        if not any(self.has(f) for f in CALLABLE_FEATURES):
            raise TargetError(f"target {self.name!r} implements none of "
                              f"{', '.join(CALLABLE_FEATURES)}")

    def has(self, feature: str) -> bool:
        """Whether the target implements ``feature`` (one of ``FEATURES``)."""
        if feature not in FEATURES:
            raise KeyError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
        if feature in self.lacks:
            return False
        if feature == "tuple_inputs" and not any(f.startswith("tuple") for f in self.call_forms):
            return False
        if feature in KEYWORD_FEATURES:
            return self.has(KEYWORD_FEATURES[feature])
        return getattr(self, feature, None) is not None

    def follows(self, design: str) -> bool:
        """Whether the target follows ``design`` (one of ``DESIGNS``)."""
        if design not in DESIGNS:
            raise KeyError(f"unknown design {design!r}; known: {', '.join(DESIGNS)}")
        return design in self.designs

    def design_skip(self, property_id: str) -> str | None:
        """Why one of the target's designs takes ``property_id`` out of its run, else None."""
        for design in sorted(self.designs):
            reason = DESIGN_SKIPS.get(design, {}).get(property_id)
            if reason is not None:
                return reason
        return None

    def method(self, name: str) -> Callable[..., Any] | None:
        """The public method ``name`` (``"to"``, ``"half"``...): the target's own, else the
        reference's built on the target's ``apply``; None with neither."""
        own = getattr(self.methods, name, None)
        if own is not None:
            return own
        return None if self.apply is None else getattr(reference.Methods(self.apply), name)

    def missing(self, needed: Iterable[str]) -> list[str]:
        """The features of ``needed`` the target does not implement, in order."""
        return [f for f in needed if not self.has(f)]

    def call_keywords(self, *, tie_weights: bool = True, strict: bool = False) -> dict[str, bool]:
        """The keywords to pass to ``functional_call``: only those the target takes."""
        wanted = {"tie_weights": tie_weights, "strict": strict}
        return {k: v for k, v in wanted.items() if self.has(k)}
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


@contextmanager
def torch_future_flags(*, overwrite: bool | None = None, swap: bool) -> Iterator[None]:
    """``torch.__future__``'s swap flag (and the overwrite flag unless ``None``) set inside the
    block and restored after it, even on failure."""
    future = torch.__future__
    saved = (future.get_overwrite_module_params_on_conversion(),
             future.get_swap_module_params_on_conversion())
    try:
        if overwrite is not None:
            future.set_overwrite_module_params_on_conversion(overwrite)
        future.set_swap_module_params_on_conversion(swap)
        yield
    finally:
        future.set_overwrite_module_params_on_conversion(saved[0])
        future.set_swap_module_params_on_conversion(saved[1])


def torch_apply(
    module: nn.Module, fn: Callable, *, overwrite: bool, swap: bool, recurse: bool = True
) -> nn.Module:
    """``module._apply(fn, recurse)`` with ``torch.__future__``'s flags set for the call."""
    with torch_future_flags(overwrite=overwrite, swap=swap):
        return module._apply(fn, recurse=recurse)


# torch's registration forms that are not methods of the module
BUILTIN_FORMS = {"setattr": setattr, "delattr": delattr,
                 "register_parametrization": torch.nn.utils.parametrize.register_parametrization,
                 "prune_remove": prune.remove,
                 "remove_weight_norm": torch.nn.utils.remove_weight_norm,
                 "remove_spectral_norm": torch.nn.utils.remove_spectral_norm,
                 "convert_conv2d_weight_memory_format":
                     torch.nn.utils.convert_conv2d_weight_memory_format,
                 "convert_conv3d_weight_memory_format":
                     torch.nn.utils.convert_conv3d_weight_memory_format,
                 "skip_init": torch.nn.utils.skip_init}


class TorchMethods:
    """torch's own public methods: ``module.<name>(*args, **kwargs)`` under
    ``torch.__future__``'s flags, set for the call and restored in ``finally``."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in (*reference.methods.METHODS, *reference.methods.REGISTRATION_METHODS,
                        *reference.methods.REPARAMETRIZATION_METHODS,
                        *reference.methods.MEMORY_FORMAT_METHODS,
                        *reference.methods.CONSTRUCTION_METHODS):
            raise AttributeError(name)

        def call(module: nn.Module, *args: Any, overwrite: bool, swap: bool, **kwargs: Any) -> Any:
            with torch_future_flags(overwrite=overwrite, swap=swap):
                if name in BUILTIN_FORMS:  # setattr(module, name, value), ...
                    return BUILTIN_FORMS[name](module, *args, **kwargs)
                return getattr(module, name)(*args, **kwargs)

        call.__name__ = name
        return call


TORCH_METHODS = TorchMethods()


def torch_load_state_dict(module: nn.Module, state_dict, *, strict: bool = True,
                          assign: bool = False, swap: bool) -> Any:
    """``module.load_state_dict(state_dict, strict, assign)`` with ``torch.__future__``'s swap
    flag set for the call and restored in ``finally``."""
    with torch_future_flags(swap=swap):
        return module.load_state_dict(state_dict, strict=strict, assign=assign)


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
    if name == "reference":  # swapspec's own: it keeps torch's wording, and is held to it
        return dataclasses.replace(from_object(reference), exact_messages=True, invariants=True)
    if name == "torch":
        return Target("torch", torch_apply, torch.func.functional_call,
                      deviations=(TORCH_DEVIATIONS + TORCH_METHOD_DEVIATIONS + XLA_DEVIATIONS
                                  + LOAD_DEVIATIONS + CHECKPOINT_DEVIATIONS
                                  + REGISTRATION_DEVIATIONS + PARAMETRIZE_DEVIATIONS
                                  + OLD_STYLE_DEVIATIONS + MEMORY_FORMAT_DEVIATIONS
                                  + ACCESSOR_DEVIATIONS + CONTRACT_DEVIATIONS
                                  + REACH_DEVIATIONS + STACKING_DEVIATIONS),
                      load_state_dict=torch_load_state_dict, exact_messages=True,
                      methods=TORCH_METHODS, invariants=True,
                      stack_module_state=torch.func.stack_module_state)
    if name == "torch-stateless":
        return Target("torch-stateless", torch_apply, stateless_functional_call,
                      deviations=(TORCH_DEVIATIONS + TORCH_METHOD_DEVIATIONS + XLA_DEVIATIONS
                                  + STATELESS_DEVIATIONS + LOAD_DEVIATIONS
                                  + CHECKPOINT_DEVIATIONS
                                  + REGISTRATION_DEVIATIONS + PARAMETRIZE_DEVIATIONS
                                  + OLD_STYLE_DEVIATIONS + MEMORY_FORMAT_DEVIATIONS
                                  + ACCESSOR_DEVIATIONS + CONTRACT_DEVIATIONS
                                  + REACH_DEVIATIONS + STACKING_DEVIATIONS),
                      skips=STATELESS_SKIPS,
                      call_forms=("dict",), load_state_dict=torch_load_state_dict,
                      exact_messages=True, methods=TORCH_METHODS, invariants=True,
                      stack_module_state=torch.func.stack_module_state)
    raise TargetError(f"unknown built-in target {name!r}; choose one of {', '.join(BUILTIN_NAMES)}"
                      " or give package.module:attribute")


def torch_declarations(*, ids: Iterable[str] = (), properties: Iterable[str] = (),
                       clauses: Iterable[str] = ()) -> tuple[Deviation, ...]:
    """The built-in ``torch`` and ``torch-stateless`` targets' declarations, each once, that
    match every criterion given (``properties.declarations.select``): for a host whose target
    wraps torch and inherits some of its deviations, e.g.
    ``torch_declarations(properties=["FC-PARAMETRIZED"])`` or ``torch_declarations(ids=[...])``.
    """
    found: dict[int, Deviation] = {}
    for name in ("torch", "torch-stateless"):
        for d in builtin_target(name).deviations:
            found.setdefault(id(d), d)
    return select(found.values(), ids=ids, properties=properties, clauses=clauses)


OPTIONAL_DATA = ("deviations", "skips", "call_forms", "lacks", "designs", "conversions", "modules",
                 "module_conversions",
                 "exact_messages", "methods", "coverage_modules", "swap_tensors", "accessor",
                 "comparisons", "stack_module_state")


def from_object(obj: Any) -> Target:
    """Wrap any object with a ``name`` and the callables it implements as a Target."""
    if isinstance(obj, Target):
        return obj
    if not hasattr(obj, "name"):
        raise TargetError(f"{obj!r} is not a target: it has no name")
    if not any(getattr(obj, f, None) is not None for f in CALLABLE_FEATURES):
        raise TargetError(f"{obj!r} is not a target: it has none of {', '.join(CALLABLE_FEATURES)}")
    fields = {f.name for f in dataclasses.fields(Target)}
    found = {f: getattr(obj, f) for f in (*CALLABLE_FEATURES, *OPTIONAL_DATA)
             if f in fields and getattr(obj, f, None) is not None}
    for key, kind in (("deviations", tuple), ("skips", dict), ("call_forms", tuple),
                      ("lacks", frozenset), ("designs", frozenset)):
        if key in found:
            found[key] = kind(found[key])
    return Target(str(obj.name), **found)


def load_target(spec: str, search: Sequence[str | Path] = ()) -> Target:
    """A built-in name, ``module`` (a top-level module), ``package.module`` or either with
    ``:attribute``, naming a target.

    A module that is not importable but lies in one of the ``search`` folders (the plugin's:
    the folder pytest was started in, then the rootdir) is imported from there: that folder goes
    first on ``sys.path``, as ``python -m pytest`` would have put it.
    """
    spec = spec.strip()
    if spec in BUILTIN_NAMES:
        return builtin_target(spec)
    module_name, _, attribute = spec.partition(":")
    try:
        obj = _import(module_name, search)
        if attribute:
            obj = getattr(obj, attribute)
    except (ImportError, AttributeError) as e:
        unknown = "" if ":" in spec or "." in spec else (
            f"not a built-in name ({', '.join(BUILTIN_NAMES)}) and ")
        raise TargetError(f"cannot load target {spec!r}: {unknown}{type(e).__name__}: {e}"
                          + _IMPORT_HINT * isinstance(e, ModuleNotFoundError)) from e
    return dataclasses.replace(from_object(obj), spec=spec)


_IMPORT_HINT = (". Run pytest from the folder that holds it (or its package), or put that "
                "folder on sys.path: PYTHONPATH, or pytest's ini option pythonpath = [\".\"]")


def _import(module_name: str, search: Sequence[str | Path]) -> Any:
    """``importlib.import_module``, retried from the first ``search`` folder that holds the
    module's top-level package or file."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.partition(".")[0]
        if e.name != top:
            raise
        for folder in map(Path, search):
            if (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file():
                sys.path.insert(0, str(folder))
                importlib.invalidate_caches()
                return importlib.import_module(module_name)
        raise


def load_targets(spec: str, search: Sequence[str | Path] = ()) -> Sequence[Target]:
    """The targets ``spec`` names; ``all`` stands for every built-in (``search``: see
    ``load_target``)."""
    names = [part.strip() for part in spec.split(",") if part.strip()]
    names = [n for part in names for n in (BUILTIN_NAMES if part == "all" else (part,))]
    if not names:
        raise TargetError(f"no target in {spec!r}")
    return [load_target(name, search) for name in names]
