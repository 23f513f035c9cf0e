"""Strategies for ``load_state_dict`` inputs: a state dict for a given module, and the call's flags."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.strategies.trees import DTYPES, join, tensor_values

VALUE_KINDS = ("own", "fresh", "other-dtype", "meta", "two-tensor", "own-tensor")
ALIAS_KINDS = ("same-object", "equal-copies", "independent")
INVALID_KINDS = ("missing", "unexpected", "wrong-shape", "non-tensor")
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
    return kind


def _value(t: Tensor, kind: str, dtype: str, gen: torch.Generator) -> Any:
    """The value of one kind for slot tensor ``t`` (as ``module.state_dict(keep_vars=True)``
    holds it)."""
    shape = tuple(t.shape) if not is_lazy(t) else ()
    if kind == "own":
        return t if is_lazy(t) else t.detach()  # a lazy module's state dict holds the slot
    if kind == "own-tensor":
        return t
    if kind == "meta":
        return torch.empty(shape, dtype=t.dtype, device="meta")
    if t.is_meta:
        return torch.empty(shape, dtype=DTYPES[dtype], device="meta")
    fresh = tensor_values(shape, dtype, gen).to(t.device)
    if kind == "two-tensor":
        return TwoTensor(fresh, fresh.clone())
    return fresh


def _draw_value(draw: Any, t: Any, kinds: Sequence[str], gen: torch.Generator) -> tuple[Any, str]:
    if not isinstance(t, Tensor):
        return t, "extra-state"
    kind = _kind_for(t, draw(st.sampled_from(list(kinds))))
    dtype = _dtype_name(t) if _makeable(t) else ""
    if kind == "other-dtype":
        dtype = draw(st.sampled_from([d for d in FLOATING if d != dtype]))
    return _value(t, kind, dtype, gen), kind


def _alias_groups(own: dict[str, Any]) -> list[list[str]]:
    """Keys whose slots hold one tensor object, for every object with two or more keys."""
    groups: dict[int, list[str]] = {}
    for key, t in own.items():
        if isinstance(t, Tensor):
            groups.setdefault(id(t), []).append(key)
    return [keys for keys in groups.values() if len(keys) > 1]


def _alias_values(draw: Any, own: dict[str, Any], given: dict[str, Any],
                  tags: set[str]) -> None:
    """For each tie group, give its keys one object, equal copies, or what was drawn."""
    for keys in _alias_groups(own):
        present = [k for k in keys if k in given]
        if len(present) < 2:
            continue
        mode = draw(st.sampled_from(ALIAS_KINDS))
        first = given[present[0]]
        for key in present[1:]:
            if mode == "same-object":
                given[key] = first
            elif mode == "equal-copies" and isinstance(first, Tensor) and not is_lazy(first):
                given[key] = first.detach().clone()
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
    return a.is_meta or bool(torch.equal(a.detach(), b.detach()))


def _invalidate(draw: Any, module: nn.Module, given: dict[str, Any], kinds: dict[str, str],
                gen: torch.Generator) -> tuple[str, str]:
    """One bad input; returns (kind, key)."""
    tensor_keys = [k for k, v in given.items() if isinstance(v, Tensor) and not is_lazy(v)]
    kind = draw(st.sampled_from(list(INVALID_KINDS)))
    if kind in ("missing", "wrong-shape", "non-tensor") and not tensor_keys:
        kind = "unexpected"
    if kind == "unexpected":
        path = draw(st.sampled_from([p for p, _ in module.named_modules()]))
        key = join(path, "extra")
        given[key] = tensor_values((2,), "float32", gen)
        return kind, key
    key = draw(st.sampled_from(tensor_keys))
    if kind == "missing":
        del given[key]
        kinds[key] = "missing"
    elif kind == "wrong-shape":
        given[key] = torch.zeros((*given[key].shape, 2), dtype=given[key].dtype)
    else:
        given[key] = 0.5
    return kind, key


@st.composite
def _state_dicts(draw: Any, module: nn.Module, kinds: Sequence[str], invalid: bool,
                 strict: bool | None, assign: bool | None, swap: bool | None) -> LoadInput:
    own = module.state_dict(keep_vars=True)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    tags: set[str] = set()
    given: dict[str, Any] = {}
    drawn: dict[str, str] = {}
    for key, t in own.items():
        given[key], drawn[key] = _draw_value(draw, t, kinds, gen)
        tags.add(f"value: {drawn[key]}")
    _alias_values(draw, own, given, tags)
    bad: list[tuple[str, str]] = []
    if invalid and _chance(draw, 40):
        for _ in range(draw(st.integers(1, 2))):
            bad.append(_invalidate(draw, module, given, drawn, gen))
    tags |= {f"invalid: {k}" for k, _ in bad}
    strict = (not _chance(draw, 30)) if strict is None else strict
    assign = _chance(draw, 50) if assign is None else assign
    swap = _chance(draw, 50) if swap is None else swap
    tags |= {t for t, on in (("strict", strict), ("assign", assign), ("swap", swap)) if on}
    for tag in sorted(tags):
        event(f"load: {tag}")
    return LoadInput(given, strict, assign, swap, drawn, tuple(k for k, _ in bad),
                     tuple(key for _, key in bad), frozenset(tags))


def state_dicts(
    module: nn.Module,
    *,
    kinds: Sequence[str] = VALUE_KINDS,
    invalid: bool = True,
    strict: bool | None = None,
    assign: bool | None = None,
    swap: bool | None = None,
) -> st.SearchStrategy[LoadInput]:
    """Draw a :class:`LoadInput` for ``module``: a state dict, ``strict``, ``assign`` and the swap flag.

    Keys: every key of ``module.state_dict()`` (both paths of a shared submodule, every alias of
    a tie, extra state). Values per key, from ``kinds`` (default all of ``VALUE_KINDS``, which
    shrink towards the first): ``own`` (the state dict's own detached tensor), ``fresh`` (new
    values, same shape, dtype and device, from a drawn seed), ``other-dtype`` (another floating
    dtype), ``meta`` (an empty ``meta`` tensor of the shape and dtype), ``two-tensor`` (a
    ``TwoTensor`` of fresh values), ``own-tensor`` (the module's own Parameter or buffer object).
    A tensor that allows no new values (lazy, sparse, a wrapper subclass) gets ``own``; a
    non-floating one gets ``fresh`` for ``other-dtype`` and ``two-tensor``. The keys of one tie
    group get one object, equal copies, or their own draws (``alias: same-object``,
    ``equal-values``, ``different-values``).

    * ``invalid``: in 40% of draws, one or two bad inputs (``INVALID_KINDS``): a missing key, an
      unexpected ``<path>.extra`` key, a wrong shape (a trailing dimension of 2), a non-tensor value.
    * ``strict`` (drawn True in 70%), ``assign`` and ``swap`` (50% each): fix one instead of drawing it.
    """
    unknown = set(kinds) - set(VALUE_KINDS)
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {VALUE_KINDS}, got {tuple(kinds)}")
    return _state_dicts(module, tuple(kinds), invalid, strict, assign, swap)
