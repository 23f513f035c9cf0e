"""Strategies for ``load_state_dict`` inputs: a state dict for a given module, and the call's flags."""

from __future__ import annotations

import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.strategies.trees import DTYPES, join, slot_values, tensor_values

VALUE_KINDS = ("own", "fresh", "other-dtype", "meta", "two-tensor", "own-tensor", "one-element")
# The kinds that are the slot's own data, which a load treats as unchanged (reference rule 6).
OWN_KINDS = ("own", "own-tensor")
ALIAS_KINDS = ("same-object", "equal-copies", "independent")
INVALID_KINDS = ("missing", "unexpected", "wrong-shape", "non-tensor")
OUTCOMES = ("any", "succeeds", "fails")
# Why a load fails: a bad input of INVALID_KINDS (missing and unexpected only with ``strict``), or
# tied keys given values that are not all equal.
FAIL_REASONS = (*INVALID_KINDS, "conflict")
FLOATING = ("float64", "float32", "float16", "bfloat16")


@dataclass
class LoadInput:
    """Arguments for ``load_state_dict(module, state_dict, strict=..., assign=...)`` under ``swap``.

    ``kinds``: the value kind drawn for each key the module's own state dict has (``VALUE_KINDS``;
    ``"missing"`` when dropped). ``invalid``: the bad inputs drawn (``INVALID_KINDS``), with
    ``bad_keys`` the keys they concern. ``features`` are the tags reported as
    ``hypothesis.event('load: <tag>')``.
    """

    state_dict: dict[str, Any]
    strict: bool
    assign: bool
    swap: bool
    kinds: dict[str, str] = field(default_factory=dict)
    invalid: tuple[str, ...] = ()
    bad_keys: tuple[str, ...] = ()
    features: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_valid(self) -> bool:
        """No bad key, so a strict load of it succeeds unless aliases conflict."""
        return not self.invalid


def swap_refused(module: nn.Module) -> bool:
    """Some parameter or buffer ``swap_tensors`` refuses: a weak reference to it (an RNN's flat
    weights), or a grad carrying an autograd graph that can hold the parameter."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}.values()
    if any(weakref.getweakrefs(t) for t in tensors):
        return True
    return any(isinstance(t, nn.Parameter) and t.grad is not None and t.grad.grad_fn is not None
               for t in tensors)


def filled_by_overrides(module: nn.Module, given: dict[str, Any]) -> set[str]:
    """Keys a class's ``_load_from_state_dict`` puts in when absent: a batch norm's
    ``num_batches_tracked`` (a state dict without version metadata predates it)."""
    if getattr(given, "_metadata", None) is not None:
        return set()
    return {f"{path}.num_batches_tracked" if path else "num_batches_tracked"
            for path, m in module.named_modules(remove_duplicate=False)
            if isinstance(m, nn.modules.batchnorm._NormBase)
            and m._buffers.get("num_batches_tracked") is not None}


def swap_flags(module: nn.Module) -> st.SearchStrategy[bool]:
    """The swap flag for a load into ``module``: either value, or ``False`` where ``swap_tensors``
    refuses one of its tensors (``swap_refused``)."""
    return st.just(False) if swap_refused(module) else st.booleans()


def _chance(draw: Any, percent: int) -> bool:
    return draw(st.integers(0, 99)) >= 100 - percent


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _makeable(t: Tensor) -> bool:
    """New values are made for dense, initialized, non-wrapper tensors of a known dtype."""
    return (t.layout == torch.strided and not is_lazy(t) and not is_traceable_wrapper_subclass(t)
            and _dtype_name(t) in DTYPES)


def _kind_for(t: Tensor, kind: str) -> str:
    """The drawn kind, or the nearest one this tensor allows."""
    if not _makeable(t):
        return "own" if kind != "own-tensor" else kind
    floating = t.is_floating_point()
    if kind == "other-dtype" and not floating:
        return "fresh"
    if kind == "two-tensor" and (not floating or t.is_meta):
        return "fresh"
    if kind == "one-element" and (t.dim() != 0 or t.is_meta):
        return "fresh"
    return kind


def _value(t: Tensor, kind: str, dtype: str, gen: torch.Generator, keys: Sequence[str]) -> Any:
    """The value of one kind for slot tensor ``t`` (as ``module.state_dict(keep_vars=True)``
    holds it under ``keys``); fresh values are ones every such slot can hold (``slot_values``)."""
    shape = tuple(t.shape) if not is_lazy(t) else ()
    if kind == "own":
        return t if is_lazy(t) else t.detach()  # a lazy module's state dict holds the slot
    if kind == "own-tensor":
        return t
    if kind == "meta":
        return torch.empty(shape, dtype=t.dtype, device="meta")
    if t.is_meta:
        return torch.empty(shape, dtype=DTYPES[dtype], device="meta")
    fresh = slot_values(keys, shape, dtype, gen).to(t.device)
    if kind == "two-tensor":
        return TwoTensor(fresh, fresh.clone())
    if kind == "one-element":  # torch's 0.3 compatibility: a (1,) value loads a 0-dim slot
        return fresh.reshape(1)
    return fresh


def _draw_value(draw: Any, t: Any, kinds: Sequence[str], gen: torch.Generator,
                keys: Sequence[str]) -> tuple[Any, str]:
    if not isinstance(t, Tensor):
        return t, "extra-state"
    kind = _kind_for(t, draw(st.sampled_from(list(kinds))))
    dtype = _dtype_name(t) if _makeable(t) else ""
    if kind == "other-dtype":
        dtype = draw(st.sampled_from([d for d in FLOATING if d != dtype]))
    return _value(t, kind, dtype, gen, keys), kind


def _keys_by_tensor(own: dict[str, Any]) -> list[list[str]]:
    """The keys of each tensor object of the state dict, one group per object."""
    groups: dict[int, list[str]] = {}
    for key, t in own.items():
        if isinstance(t, Tensor):
            groups.setdefault(id(t), []).append(key)
    return list(groups.values())


def _alias_groups(own: dict[str, Any]) -> list[list[str]]:
    """Keys whose slots hold one tensor object, for every object with two or more keys."""
    return [keys for keys in _keys_by_tensor(own) if len(keys) > 1]


def _alias_values(draw: Any, own: dict[str, Any], given: dict[str, Any], tags: set[str],
                  agree: bool = False) -> None:
    """For each tie group, give its keys one object, equal copies, or what was drawn (``agree``:
    a drawn value that differs from the group's first is replaced by an equal copy of it)."""
    for keys in _alias_groups(own):
        present = [k for k in keys if k in given]
        if len(present) < 2:
            continue
        mode = draw(st.sampled_from(ALIAS_KINDS))
        first = given[present[0]]
        for key in present[1:]:
            if mode == "same-object":
                given[key] = first
            elif ((mode == "equal-copies" or (agree and not _equal(given[key], first)))
                  and isinstance(first, Tensor) and not is_lazy(first)):
                given[key] = _copy(first)
        tags.add(f"alias: {_alias_tag(given, present)}")


def _alias_tag(given: dict[str, Any], keys: list[str]) -> str:
    values = [given[k] for k in keys]
    if all(v is values[0] for v in values):
        return "same-object"
    if all(_equal(v, values[0]) for v in values):
        return "equal-values"
    return "different-values"


def _equal(a: Any, b: Any) -> bool:
    """Same kind, dtype, shape and device, and equal values (meta: no values to compare)."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or is_lazy(a) or is_lazy(b):
        return a is b
    if type(a.detach()) is not type(b.detach()) or (a.dtype, a.shape, a.device) != (
            b.dtype, b.shape, b.device):
        return False
    if a.is_meta:
        return True
    try:
        return bool(torch.equal(a.detach(), b.detach()))
    except (NotImplementedError, TypeError):  # a host's class without ``equal``: by its parts
        if not (is_traceable_wrapper_subclass(a) and type(a) is type(b)):
            raise
    (names, ctx), (other, other_ctx) = a.__tensor_flatten__(), b.__tensor_flatten__()
    return (names, ctx) == (other, other_ctx) and all(
        _equal(getattr(a, n), getattr(b, n)) for n in names)


def _copy(t: Tensor) -> Tensor:
    """``t.detach().clone()``; a traceable wrapper subclass whose class lacks ``clone`` (a host's
    quantized tensor) rebuilt from copies of its parts."""
    try:
        return t.detach().clone()
    except (NotImplementedError, TypeError):
        if not is_traceable_wrapper_subclass(t):
            raise
    names, ctx = t.__tensor_flatten__()
    inner = {name: _copy(getattr(t, name)) for name in names}
    return type(t).__tensor_unflatten__(inner, ctx, t.size(), t.stride())


def _invalidate(draw: Any, module: nn.Module, given: dict[str, Any], kinds: dict[str, str],
                gen: torch.Generator, keep: Collection[str] = ()) -> tuple[str, str]:
    """One bad input, for a key outside ``keep``; returns (kind, key)."""
    tensor_keys = [k for k, v in given.items()
                   if isinstance(v, Tensor) and not is_lazy(v) and k not in keep]
    kind = draw(st.sampled_from(list(INVALID_KINDS)))
    if kind in ("missing", "wrong-shape", "non-tensor") and not tensor_keys:
        kind = "unexpected"
    return kind, _bad_input(draw, module, given, kinds, gen, kind, tensor_keys)


def _bad_input(draw: Any, module: nn.Module, given: dict[str, Any], kinds: dict[str, str],
               gen: torch.Generator, kind: str, keys: list[str]) -> str:
    """Put in one bad input of ``kind`` (``INVALID_KINDS``) for one of ``keys`` (an unexpected
    ``<path>.extra`` key: under a drawn module path); returns its key."""
    if kind == "unexpected":
        path = draw(st.sampled_from([p for p, _ in module.named_modules()]))
        key = join(path, "extra")
        given[key] = tensor_values((2,), "float32", gen)
        return key
    key = draw(st.sampled_from(keys))
    if kind == "missing":
        del given[key]
        kinds[key] = "missing"
    elif kind == "wrong-shape":
        given[key] = torch.zeros((*given[key].shape, 2), dtype=given[key].dtype)
    else:
        given[key] = 0.5
    return key


def _fitting_keys(own: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The module's tensor keys given a dense, initialized tensor of the slot's shape."""
    return [k for k, v in given.items() if isinstance(own.get(k), Tensor) and isinstance(v, Tensor)
            and not is_lazy(v) and not is_lazy(own[k]) and v.layout == torch.strided
            and tuple(v.shape) == tuple(own[k].shape)]


def _conflict_groups(own: dict[str, Any], fitting: list[str]) -> list[list[str]]:
    """The tie groups with two or more keys given a fitting value (each can be made to conflict)."""
    groups = [[k for k in keys if k in fitting] for keys in _alias_groups(own)]
    return [keys for keys in groups if len(keys) >= 2]


def _fail_reasons(module: nn.Module, own: dict[str, Any], given: dict[str, Any],
                  strict: bool) -> dict[str, list[str]]:
    """Each reason of ``FAIL_REASONS`` this input allows, with the keys it can concern (a
    conflict: the first key of each group that can conflict)."""
    fitting = _fitting_keys(own, given)
    keys = {"unexpected": [""], "wrong-shape": fitting, "non-tensor": fitting,
            "missing": [k for k in fitting if k not in filled_by_overrides(module, given)],
            "conflict": [g[0] for g in _conflict_groups(own, fitting)]}
    if not strict:
        del keys["missing"], keys["unexpected"]
    return {r: keys[r] for r in FAIL_REASONS if keys.get(r)}


def _different(value: Tensor) -> Tensor:
    """A tensor of ``value``'s shape that is not equal to it: a plain one for a wrapper subclass,
    else other values, or another dtype where values cannot differ (meta, no elements)."""
    shape = tuple(value.shape)
    if is_traceable_wrapper_subclass(value):
        return torch.zeros(shape, dtype=value.dtype, device=value.device)
    plain = value.detach().clone()
    if not plain.is_meta and plain.numel():
        other = plain.logical_not() if plain.dtype == torch.bool else plain + 1
        if not torch.equal(other, plain):
            return other
    dtype = torch.float32 if value.dtype == torch.float64 else torch.float64
    return torch.empty(shape, dtype=dtype, device=value.device)


def _fail(draw: Any, module: nn.Module, own: dict[str, Any], given: dict[str, Any],
          kinds: dict[str, str], gen: torch.Generator, strict: bool) -> tuple[str, tuple[str, ...]]:
    """Make the load fail for one drawn reason (``FAIL_REASONS``); returns the reason and the
    keys it concerns (a conflict: the group's first and second key)."""
    reasons = _fail_reasons(module, own, given, strict)
    if not reasons:
        raise ValueError("outcome='fails' with strict=False needs a module with a tensor key")
    reason = draw(st.sampled_from(list(reasons)))
    if reason != "conflict":
        return reason, (_bad_input(draw, module, given, kinds, gen, reason, reasons[reason]),)
    first = draw(st.sampled_from(reasons["conflict"]))
    group = next(g for g in _conflict_groups(own, _fitting_keys(own, given)) if g[0] == first)
    if kinds.get(first) in OWN_KINDS:  # the slot's own data yields to any other value: a copy
        given[first], kinds[first] = _copy(given[first]), "fresh"  # does not
    given[group[1]] = _different(given[first])
    return reason, (first, group[1])


def _allowed_kinds(t: Any, kinds: Sequence[str], meta: bool) -> Sequence[str]:
    """``kinds`` for slot ``t``, without ``meta`` for a real slot where ``meta`` is False (copying
    out of meta fails)."""
    if meta or not isinstance(t, Tensor) or t.is_meta or "meta" not in kinds:
        return kinds
    return [k for k in kinds if k != "meta"] or ["own"]


@st.composite
def _state_dicts(draw: Any, module: nn.Module, kinds: Sequence[str], invalid: bool,
                 strict: bool | None, assign: bool | None, swap: bool | None, outcome: str,
                 refusable: bool) -> LoadInput:
    own = module.state_dict(keep_vars=True)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    succeeds = outcome == "succeeds"
    # the flags first: drawn after every key's value, they came out lumpy in small samples
    if strict is None:  # a load into a module without a tensor key fails only with strict
        strict = (outcome == "fails" and not _fitting_keys(own, own)) or not _chance(draw, 30)
    assign = _chance(draw, 50) if assign is None else assign
    swap = _swap(draw, module, swap, refusable and not succeeds)
    tags: set[str] = set()
    given: dict[str, Any] = {}
    drawn: dict[str, str] = {}
    keys_of = {key: keys for keys in _keys_by_tensor(own) for key in keys}
    for key, t in own.items():
        allowed = _allowed_kinds(t, kinds, meta=not succeeds or assign)
        given[key], drawn[key] = _draw_value(draw, t, allowed, gen, keys_of.get(key, (key,)))
        tags.add(f"value: {drawn[key]}")
    _alias_values(draw, own, given, tags, agree=succeeds)
    bad: list[tuple[str, str]] = []
    failed: tuple[str, ...] = ()  # the keys of the failure, which later bad inputs leave alone
    if outcome == "fails":
        # values that fit no slot leave only strict's reasons (an unexpected key)
        strict = strict or not _fail_reasons(module, own, given, strict=False)
        reason, failed = _fail(draw, module, own, given, drawn, gen, strict)
        tags |= {f"fails: {reason}", *(["alias: different-values"] if reason == "conflict" else [])}
        bad += [(reason, failed[0])] if reason in INVALID_KINDS else []
    if invalid and _chance(draw, 40):
        for _ in range(draw(st.integers(1, 2))):
            bad.append(_invalidate(draw, module, given, drawn, gen, keep=failed))
    tags |= {f"invalid: {k}" for k, _ in bad}
    tags |= {t for t, on in (("strict", strict), ("assign", assign), ("swap", swap)) if on}
    for tag in sorted(tags):
        event(f"load: {tag}")
    return LoadInput(given, strict, assign, swap, drawn, tuple(k for k, _ in bad),
                     tuple(key for _, key in bad), frozenset(tags))


def _swap(draw: Any, module: nn.Module, swap: bool | None, refusable: bool) -> bool:
    """The drawn swap flag (50%; ``False`` for a module ``swap_tensors`` refuses unless
    ``refusable``), or the fixed one."""
    if swap is None:
        return False if not refusable and swap_refused(module) else _chance(draw, 50)
    if swap and not refusable and swap_refused(module):
        raise ValueError("swap=True for a module whose tensors swap_tensors refuses; draw it "
                         "with module_trees(needs=('swappable',))")
    return swap


def state_dicts(
    module: nn.Module,
    *,
    kinds: Sequence[str] = VALUE_KINDS,
    invalid: bool = True,
    strict: bool | None = None,
    assign: bool | None = None,
    swap: bool | None = None,
    outcome: str = "any",
    refusable: bool = True,
) -> st.SearchStrategy[LoadInput]:
    """Draw a :class:`LoadInput` for ``module``: a state dict, ``strict``, ``assign`` and the swap flag.

    Keys: every key of ``module.state_dict()`` (both paths of a shared submodule, every alias of
    a tie, extra state). Values per key, from ``kinds`` (default all of ``VALUE_KINDS``, which
    shrink towards the first): ``own`` (the state dict's own detached tensor), ``fresh`` (new
    values, same shape, dtype and device, from a drawn seed), ``other-dtype`` (another floating
    dtype), ``meta`` (an empty ``meta`` tensor of the shape and dtype), ``two-tensor`` (a
    ``TwoTensor`` of fresh values), ``own-tensor`` (the module's own Parameter or buffer object),
    ``one-element`` (fresh values of shape ``(1,)`` for a 0-dim slot, which torch loads as the
    element: its 0.3 compatibility).
    A tensor that allows no new values (lazy, sparse, a wrapper subclass) gets ``own``; a
    non-floating one gets ``fresh`` for ``other-dtype`` and ``two-tensor``, one that is not 0-dim
    (or is meta) for ``one-element``. The keys of one tie
    group get one object, equal copies, or their own draws (``alias: same-object``,
    ``equal-values``, ``different-values``).

    * ``invalid``: in 40% of draws, one or two bad inputs (``INVALID_KINDS``): a missing key, an
      unexpected ``<path>.extra`` key, a wrong shape (a trailing dimension of 2), a non-tensor value.
    * ``strict`` (drawn True in 70%), ``assign`` and ``swap`` (50% each), drawn before the values:
      fix one instead of drawing it.
    * ``refusable=False``: a module ``swap_tensors`` refuses (``swap_refused``) gets ``swap=False``
      (fixing ``swap=True`` for one raises ``ValueError``); other modules draw it as above.
    * ``outcome`` (``OUTCOMES``): ``'any'`` (default, as above); ``'succeeds'``: a load the spec
      accepts, by construction: no bad input (needs ``invalid=False``), the keys of a tie group
      agree (a drawn value that differs from the group's first becomes an equal copy of it),
      ``meta`` values only for meta slots or with ``assign``, and the swap flag as with
      ``refusable=False``; ``'fails'``: a load the spec refuses, for a reason drawn (tag
      ``fails: <reason>``) after the values, before the ``invalid`` bad inputs (which leave its
      keys alone), among those the input allows
      (``FAIL_REASONS``: a missing key (not one a class fills in) or an unexpected key, both
      with ``strict`` only; a wrong shape; a non-tensor value; or tied keys given different
      values: the group's second key gets a value unequal to its first). With ``strict=False``
      the module needs a tensor key (``ValueError`` otherwise); drawn, ``strict`` is True for a
      module without one.
    """
    unknown = set(kinds) - set(VALUE_KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {VALUE_KINDS}, got {tuple(kinds)}")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    if outcome == "succeeds" and invalid:
        raise ValueError("outcome='succeeds' draws no bad input: pass invalid=False")
    return _state_dicts(module, tuple(kinds), invalid, strict, assign, swap, outcome, refusable)
