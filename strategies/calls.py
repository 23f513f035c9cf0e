"""Strategies for ``torch.func.functional_call`` inputs, forward inputs and the ``torch.__future__`` flags."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.strategies.modules import BATCH, FEATURES
from swapspec.strategies.trees import DTYPES, join, slot_values, tensor_values

FORMS = ("dict", "tuple-single", "tuple-disjoint", "tuple-overlap")
# The autograd modes a call can run under, and the context that enters each.
GRAD_MODES = ("enabled", "no_grad", "inference_mode")
GRAD_MODE_CONTEXTS = {"enabled": torch.enable_grad, "no_grad": torch.no_grad,
                      "inference_mode": torch.inference_mode}
VALUE_KINDS = ("fresh", "own", "none", "other-dtype")
FLOATING = ("float64", "float32", "float16", "bfloat16")
INVALID_KINDS = ("non-tensor-value", "empty-leaf-name", "non-mapping", "non-dict-element",
                 "uninitialized-value")


class FlagSetting(NamedTuple):
    """Values for ``torch.__future__.set_overwrite_module_params_on_conversion`` / ``..._swap_...``."""

    overwrite: bool
    swap: bool


def flag_settings() -> st.SearchStrategy[FlagSetting]:
    """Draw a :class:`FlagSetting`; shrinks to ``(False, False)`` (torch's default). Reports ``flags: ...``."""
    return st.builds(FlagSetting, overwrite=st.booleans(), swap=st.booleans()).map(_report_flags)


def _report_flags(flags: FlagSetting) -> FlagSetting:
    event(f"flags: overwrite={flags.overwrite}, swap={flags.swap}")
    return flags


def forward_inputs() -> st.SearchStrategy[tuple[Tensor]]:
    """Draw ``(x,)``: a float32 tensor of shape ``(BATCH, FEATURES)`` with values in [-2, 2]; shrinks to zeros."""
    values = st.lists(st.floats(-2, 2, width=32), min_size=BATCH * FEATURES, max_size=BATCH * FEATURES)
    return values.map(lambda v: (torch.tensor(v, dtype=torch.float32).reshape(BATCH, FEATURES),))


@dataclass
class CallInput:
    """Arguments for ``functional_call(module, tensors, args, kwargs, tie_weights=..., strict=...)``.

    ``form``: ``'dict'`` (one dict), ``'tuple-single'`` (a 1-tuple of it), ``'tuple-disjoint'`` (split into two
    dicts without common keys, one may be empty), ``'tuple-overlap'`` (two dicts sharing at least one key: torch
    raises ``ValueError``). ``invalid`` names the bad input drawn with ``invalid=True`` (None otherwise);
    ``features`` are the tags reported as ``hypothesis.event('call: <tag>')``.
    """

    tensors: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    tie_weights: bool = True
    strict: bool = False
    form: str = "dict"
    invalid: str | None = None
    features: frozenset[str] = field(default_factory=frozenset)
    # Keywords the target under test does not take: fixed to what a call without them means,
    # and left out of the repr (a falsifying example never shows an option the target lacks).
    lacking: frozenset[str] = field(default_factory=frozenset, compare=False)
    # The target's designs (``Target.designs``) the oracle judges the call by; not shown.
    designs: frozenset[str] = field(default_factory=frozenset, compare=False)
    # The autograd mode the call runs under (one of ``GRAD_MODES``).
    grad_mode: str = "enabled"

    def grad_context(self) -> Any:
        """A fresh context manager that enters the call's autograd mode."""
        return GRAD_MODE_CONTEXTS[self.grad_mode]()

    def _shown(self) -> dict[str, Any]:
        hidden = {"lacking", "designs", *self.lacking}
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in hidden}
        shown["features"] = frozenset(t for t in self.features
                                      if t.partition("=")[0] not in self.lacking)
        return shown

    def __repr__(self) -> str:
        return "CallInput(" + ", ".join(f"{k}={v!r}" for k, v in self._shown().items()) + ")"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis' pretty printer: the shown fields, one per line when long."""
        printer.repr_call("CallInput", [], self._shown())

    def merged(self) -> dict[str, Any]:
        """All given dicts merged into one (for ``tuple-overlap`` the later dict wins); non-dicts are skipped."""
        if isinstance(self.tensors, dict):
            return dict(self.tensors)
        out: dict[str, Any] = {}
        for part in self.tensors if isinstance(self.tensors, (tuple, list)) else ():
            if isinstance(part, dict):
                out.update(part)
        return out


def valid_names(module: nn.Module) -> dict[str, Tensor]:
    """``named_parameters(remove_duplicate=False)`` then ``named_buffers(remove_duplicate=False)`` (None excluded)."""
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return dict(named)


def _chance(draw: Any, percent: int) -> bool:
    return draw(st.integers(0, 99)) >= 100 - percent


def is_uninitialized(t: Any) -> bool:
    return isinstance(t, nn.parameter.UninitializedTensorMixin)


def _can_make(t: Tensor) -> bool:
    """Fresh values are made for dense, initialized, non-wrapper tensors only (others get their own tensor)."""
    lazy = isinstance(t, nn.parameter.UninitializedTensorMixin)
    return t.layout == torch.strided and not lazy and not is_traceable_wrapper_subclass(t)


def _fresh(t: Tensor, dtype: str, gen: torch.Generator, names: Sequence[str]) -> Tensor:
    """New values with ``t``'s shape and device, dtype ``dtype``, ``requires_grad`` as ``t`` (when
    floating), that every slot in ``names`` (the names holding ``t``) can hold (``slot_values``)."""
    shape = tuple(t.shape)
    if t.device.type == "meta":
        v = torch.empty(shape, dtype=DTYPES[dtype], device="meta")
    else:
        v = slot_values(names, shape, dtype, gen).to(t.device)
    if t.requires_grad and (v.is_floating_point() or v.is_complex()):
        v.requires_grad_(True)
    return v


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _value(draw: Any, t: Tensor, gen: torch.Generator, tags: set[str], names: Sequence[str],
           none: bool = True, same_kind: bool = False) -> Tensor | None:
    kinds = [k for k in VALUE_KINDS if (none and not same_kind) or k != "none"]
    kind = draw(st.sampled_from([k for k in kinds if not same_kind or k != "other-dtype"]))
    if kind in ("fresh", "other-dtype") and (not _can_make(t) or _dtype_name(t) not in DTYPES):
        kind = "own"
    if kind == "other-dtype" and not t.is_floating_point():
        kind = "fresh"
    tags.add(f"value: {kind}")
    if kind == "own":
        return t
    if kind == "none":
        return None
    dtype = _dtype_name(t)
    if kind == "other-dtype":
        dtype = draw(st.sampled_from([d for d in FLOATING if d != dtype]))
    return _fresh(t, dtype, gen, names)


def meta_built(module: nn.Module) -> bool:
    """Whether every registered tensor of ``module`` is a ``meta`` tensor (and there is one):
    forward's input then goes there too, so forward runs on shapes and dtypes, as for a tree
    built under ``torch.device('meta')``."""
    tensors = [t for t in valid_names(module).values() if not is_uninitialized(t)]
    return bool(tensors) and all(t.device.type == "meta" for t in tensors)


def _module_paths(module: nn.Module) -> dict[int, list[str]]:
    paths: dict[int, list[str]] = {}
    for path, m in module.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), []).append(path)
    return paths


def _tie_groups(names: dict[str, Tensor]) -> list[list[str]]:
    """The names of each tensor object, one group per object (a lone name is a group of one)."""
    groups: dict[int, list[str]] = {}
    for name, t in names.items():
        groups.setdefault(id(t), []).append(name)
    return list(groups.values())


def _aliases(names: dict[str, Tensor]) -> dict[str, list[str]]:
    """For each name, every name that holds the same tensor object (itself included)."""
    return {name: group for group in _tie_groups(names) for name in group}


def _alias_tags(chosen: dict[str, Any], names: dict[str, Tensor]) -> set[str]:
    """Tags for tie groups (names holding one tensor object) that the chosen names touch."""
    tags = set()
    for members in _tie_groups(names):
        given = [n for n in members if n in chosen]
        if len(members) < 2 or not given:
            continue
        if len(given) == 1:
            tags.add("tie-one-alias")
        else:
            same = len({id(chosen[n]) for n in given}) == 1
            tags.add("tie-several-same" if same else "tie-several-different")
    return tags


def _tietensor_values(draw: Any, chosen: dict[str, Any], names: dict[str, Tensor]) -> None:
    """For each tie group with several given aliases, maybe give them all the first alias's value object."""
    for members in _tie_groups(names):
        given = [n for n in members if n in chosen]
        if len(given) >= 2 and not draw(st.booleans()):
            for n in given[1:]:
                chosen[n] = chosen[given[0]]


def _unknown(draw: Any, module: nn.Module, gen: torch.Generator, chosen: dict[str, Any], tags: set[str],
             *, submodules: bool = True) -> None:
    if _chance(draw, 35):
        path = draw(st.sampled_from([p for p, _ in module.named_modules()]))
        value = tensor_values((FEATURES,), "float32", gen)
        if _chance(draw, 50):
            value = nn.Parameter(value)
            tags.add("unknown-leaf-parameter")
        chosen[join(path, "extra")] = value
        tags.add("unknown-leaf")
    if submodules and _chance(draw, 15):
        chosen["nosuch.weight"] = tensor_values((FEATURES,), "float32", gen)
        tags.add("unknown-submodule")


def _shape(draw: Any, chosen: dict[str, Any], form: str) -> tuple[Any, str]:
    """Arrange ``chosen`` into the drawn form (falls back to ``tuple-single`` for an overlap without names)."""
    if form == "dict":
        return chosen, form
    if form == "tuple-disjoint":
        first = {k: v for k, v in chosen.items() if draw(st.booleans())}
        return (first, {k: v for k, v in chosen.items() if k not in first}), form
    if form == "tuple-overlap" and chosen:
        key = draw(st.sampled_from(sorted(chosen)))
        return (dict(chosen), {key: chosen[key]}), form
    return (chosen,), "tuple-single"


def _invalidate(
    draw: Any, module: nn.Module, tensors: Any, chosen: dict[str, Any], gen: torch.Generator, forms: Sequence[str],
    valid: bool = False,
) -> tuple[Any, str]:
    lazy = lazy_uninitialized_names(module)
    kinds = [k for k in INVALID_KINDS if (k != "non-dict-element" or set(forms) - {"dict"})
             and (k != "uninitialized-value" or lazy)]
    kind = draw(st.sampled_from(kinds))
    if kind == "non-mapping":
        return 7, kind
    if kind == "non-dict-element":
        return (chosen, [("weight", 1.0)]), kind
    bad = dict(chosen)
    if kind == "non-tensor-value":
        named = valid_names(module)
        name = draw(st.sampled_from(sorted(named) or ["extra"]))
        bad[name] = 0.5
        if valid:  # the given aliases of that tensor get the same object: no tie conflict
            bad.update({n: bad[name] for n in bad if name in named and named.get(n) is named[name]})
    elif kind == "uninitialized-value":
        bad[draw(st.sampled_from(lazy))] = (None if draw(st.booleans())
                                            else tensor_values((FEATURES,), "float32", gen))
    else:
        subs = [p for p, _ in module.named_modules() if p]
        bad[f"{draw(st.sampled_from(subs))}." if subs else "."] = tensor_values((FEATURES,), "float32", gen)
    return (bad if isinstance(tensors, dict) else (bad,)), kind


def initializes_lazily(module: nn.Module) -> bool:
    """Whether ``module`` is a lazy module whose first forward has not initialized it yet."""
    return isinstance(module, LazyModuleMixin) and hasattr(module, "_initialize_hook")


def lazy_uninitialized_names(module: nn.Module) -> list[str]:
    """Names of the uninitialized tensors of lazy modules not yet initialized (a first forward
    would initialize them), which a functional call may not give another value."""
    lazy = {id(m) for m in module.modules() if initializes_lazily(m)}
    return sorted(n for n, t in valid_names(module).items() if is_uninitialized(t)
                  and id(module.get_submodule(n.rpartition(".")[0])) in lazy)


def _one_value_per_group(chosen: dict[str, Any], module: nn.Module, names: dict[str, Tensor],
                         tie_weights: bool) -> None:
    """Make the call free of conflicts: names that reach one slot (shared submodules) and, with
    ``tie_weights``, the aliases of one tie group all carry the first such name's value."""
    group_of: dict[str, Any] = {}
    for name in chosen:
        prefix, _, key = name.rpartition(".")
        owner = module.get_submodule(prefix) if prefix else module
        group_of[name] = ("tensor", id(names[name])) if tie_weights else ("slot", id(owner), key)
    first: dict[Any, str] = {}
    for name in list(chosen):
        leader = first.setdefault(group_of[name], name)
        chosen[name] = chosen[leader]


@st.composite
def _call_inputs(draw: Any, module: nn.Module, unknown_names: bool, invalid: bool,
                 strict: bool | None, tie_weights: bool | None, forms: Sequence[str], buffers: str,
                 valid: bool, conflicts: bool, invalid_chance: int, failing: bool,
                 forward_safe: bool, grad_modes: tuple[str, ...]) -> CallInput:
    names = valid_names(module)
    buffer_names = {n for n, _ in module.named_buffers(remove_duplicate=False)}
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    tags: set[str] = set()
    everything = bool(names) and _chance(draw, 30)
    candidates = [n for n in names if not (valid and is_uninitialized(names[n]))]
    picked = [n for n in candidates
              if everything or (buffers == "all" and n in buffer_names) or draw(st.booleans())]
    tags.add("all-names" if names and len(picked) == len(names) else ("no-names" if not picked else "some-names"))
    aliases = _aliases(names)
    chosen: dict[str, Any] = {n: _value(draw, names[n], gen, tags, aliases[n],
                                        none=not (buffers == "all" and n in buffer_names),
                                        same_kind=forward_safe)
                              for n in picked}
    _tietensor_values(draw, chosen, names)
    tie_weights = not _chance(draw, 30) if tie_weights is None else tie_weights
    drawn_strict = strict is None
    strict = _chance(draw, 30) if strict is None else strict
    if valid and drawn_strict and strict:
        if len(candidates) < len(names):
            strict = False  # an uninitialized tensor cannot be given: strict would refuse
        else:
            chosen.update({n: names[n] for n in names if n not in chosen})  # the rest: their own
    if valid and not conflicts:
        _one_value_per_group(chosen, module, names, tie_weights)
    tags |= _alias_tags(chosen, names)
    owners = _module_paths(module)
    if any(len(owners[id(module.get_submodule(n.rpartition(".")[0]))]) > 1 for n in chosen):
        tags.add("shared-path")
    if unknown_names and not (valid and drawn_strict and strict):  # strict refuses unknown names
        _unknown(draw, module, gen, chosen, tags, submodules=not valid)
    shapes = [f for f in forms if not (valid and f == "tuple-overlap")] or ["dict"]
    tensors, form = _shape(draw, chosen, draw(st.sampled_from(shapes)))
    bad = None
    if invalid and _chance(draw, invalid_chance):
        tensors, bad = _invalidate(draw, module, tensors, chosen, gen, forms, valid)
        tags.add(f"invalid: {bad}")
    kwargs: dict[str, Any] = {}
    if failing and _chance(draw, 15):
        kwargs["fail"] = True
    if _chance(draw, 20):
        kwargs["report"] = []
    args = draw(forward_inputs())
    if meta_built(module):
        args = tuple(a.to("meta") for a in args)
        tags.add("meta-input")
    tags |= {f"form={form}"} | {f"kwarg: {k}" for k in kwargs}
    tags |= {t for t, on in (("strict", strict), ("tie_weights=False", not tie_weights)) if on}
    grad_mode = draw(st.sampled_from(grad_modes))
    if grad_mode != "enabled":
        tags.add(f"grad-mode: {grad_mode}")
    for tag in sorted(tags):
        event(f"call: {tag}")
    return CallInput(tensors, args, kwargs, tie_weights, strict, form, bad, frozenset(tags),
                     grad_mode=grad_mode)


def call_inputs(
    module: nn.Module,
    *,
    unknown_names: bool = True,
    invalid: bool = False,
    strict: bool | None = None,
    tie_weights: bool | None = None,
    forms: Sequence[str] = FORMS,
    buffers: str = "some",
    valid: bool = False,
    conflicts: bool = False,
    invalid_chance: int = 60,
    failing: bool = True,
    forward_safe: bool = False,
    grad_modes: Sequence[str] = ("enabled",),
) -> st.SearchStrategy[CallInput]:
    """Draw a :class:`CallInput` for ``functional_call(module, ...)``.

    Names: any subset of the valid names (``named_parameters``/``named_buffers`` with ``remove_duplicate=False``,
    so both paths of a shared submodule and every alias of a tie), sometimes all of them. Values per name:
    a fresh tensor (same shape/dtype/device, other values, ``requires_grad`` as the original), the module's own
    tensor, ``None``, or a fresh tensor of another floating dtype. When several aliases of one tie group are
    given they are either one object or independent values. Fresh values come from a drawn seed and a local
    ``torch.Generator``.

    * ``unknown_names``: sometimes add ``'<path>.extra'`` (an unknown leaf on an existing module; a tensor or a
      ``Parameter``) and ``'nosuch.weight'`` (an unknown submodule).
    * ``invalid``: sometimes replace the input by a bad one: a non-tensor value, an empty leaf name
      (``'<path>.'``), a non-mapping ``tensors`` (``7``), a tuple with a non-dict element, or
      (where the tree has a lazy module not yet initialized) ``None`` or a tensor for one of its
      uninitialized tensors (``lazy_uninitialized_names``).
    * ``strict``, ``tie_weights``: fix the keyword to this value instead of drawing it (for an
      implementation without the keyword: its default).
    * ``forms``: the input forms to draw from (default all of ``FORMS``); ``("dict",)`` for an
      implementation that takes a single dict only.
    * ``buffers``: ``"some"`` (default) draws buffer names like the others; ``"all"`` gives every buffer name
      a tensor (never ``None``), so a counterexample that needs a given buffer keeps it while the tree
      shrinks around it.

    * ``valid``: draw only calls the spec accepts, by construction: no uninitialized tensor is given,
      no unknown submodule, no overlapping split; a drawn ``strict=True`` gives no unknown name and every other name its
      own tensor (or turns to False where an uninitialized tensor cannot be given); and, unless
      ``conflicts``, names that reach one slot, and with ``tie_weights`` one tie group, carry one
      value. (``invalid`` still replaces the input by a bad one when asked.)
    * ``invalid_chance``: with ``invalid``, the percent of calls made bad (default 60; 100: all).
    * ``failing``: whether ``kwargs`` may hold ``fail=True`` (a forward that raises).
    * ``forward_safe``: every value is a fresh tensor of the slot's dtype or the slot's own tensor
      (no ``None``, no other dtype), so a real layer's forward runs as it does on the module.
    * ``grad_modes``: the autograd modes of :data:`GRAD_MODES` the call may run under (drawn
      uniformly, shrinking to the first; event ``call: grad-mode: <mode>`` for a mode other than
      ``enabled``). Default: ``enabled`` only.

    ``args`` is ``(x,)`` from :func:`forward_inputs`, moved to ``meta`` when every registered
    tensor of the module is a ``meta`` tensor (event ``call: meta-input``); ``kwargs`` may hold ``fail=True`` and ``report=[]``;
    ``tie_weights`` shrinks to True and ``strict`` to False (torch's defaults).
    """
    if buffers not in ("some", "all"):
        raise ValueError(f"buffers must be 'some' or 'all', got {buffers!r}")
    unknown = sorted(set(grad_modes) - set(GRAD_MODES))
    if not grad_modes or unknown:
        raise ValueError(f"grad_modes must be a non-empty subset of {GRAD_MODES}; got {grad_modes!r}")
    return _call_inputs(module, unknown_names, invalid, strict, tie_weights, tuple(forms), buffers,
                        valid, conflicts, invalid_chance, failing, forward_safe, tuple(grad_modes))
