"""Zoo: ``make_functional``-style swapping with ``delattr`` then ``setattr``.

Origin: functorch's ``make_functional`` (``_del_nested_attr`` / ``_set_nested_attr``) and
the ``delattr``/``setattr`` reparametrization that PR #92536 replaced: a given plain tensor
becomes a plain attribute, so during forward ``parameters()``/``buffers()`` no longer list
it and ``state_dict()`` misses it. Validation, exact restore (``finally``) and write-back
are the reference's, so the forward view is the only bug.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from swapspec import reference
from swapspec.reference.functional_call import prepare_call
from tests.zoo import FC_PATHS, ZooTarget
from tests.zoo import ref_fc as ref

ORIGIN = "functorch make_functional: delattr + setattr (given tensors become plain attributes)"
CAUGHT_BY = frozenset({"FC-VISIBLE", "FC-ORACLE"})
PATHS = FC_PATHS

_ABSENT: Any = object()


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """Rules: the reference's validation; each name is ``delattr``-ed and ``setattr`` to its
    value (the bug); afterwards every owner's registries and ``__dict__`` entry are put back
    exactly, and a rebound attribute is written back to the caller's mapping."""
    call = prepare_call(module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict)
    saved = [_save(slot.module, slot.key) for slot in call.slots]
    for slot in call.slots:
        _del_then_set(slot.module, slot.key, slot.value)
    try:
        return module(*call.args, **call.kwargs)
    finally:
        rebound = {}
        for slot, state in zip(reversed(call.slots), reversed(saved), strict=True):
            now = _restore(slot.module, slot.key, state)
            if now is not slot.value:
                rebound[slot.ident] = now
        ref._write_back(rebound, call.slots, call.given, call.sources)


def _save(owner: nn.Module, key: str) -> tuple[dict, dict, Any]:
    """Copies of ``owner``'s registries and its ``__dict__`` entry for ``key``."""
    return dict(owner._parameters), dict(owner._buffers), owner.__dict__.get(key, _ABSENT)


def _del_then_set(owner: nn.Module, key: str, value: Any) -> None:
    """``delattr(owner, key)`` when it exists, then ``setattr(owner, key, value)``."""
    if hasattr(owner, key):
        delattr(owner, key)
    setattr(owner, key, value)


def _restore(owner: nn.Module, key: str, state: tuple[dict, dict, Any]) -> Any:
    """Put ``owner`` back as saved; return what ``key`` held just before."""
    now = getattr(owner, key, None)
    params, buffers, attribute = state
    owner.__dict__.pop(key, None)
    for table, old in ((owner._parameters, params), (owner._buffers, buffers)):
        table.clear()
        table.update(old)
    if attribute is not _ABSENT:
        owner.__dict__[key] = attribute
    return now


target = ZooTarget("zoo-make-functional", reference.apply, functional_call)
