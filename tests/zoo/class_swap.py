"""Zoo: class-swapping ``functional_call``.

Origin: ``torch.nn.utils.stateless.functional_call`` of torch 1.12/1.13 (pytorch #92295):
each owning module's class was replaced by a subclass ``StatelessReplacer<Cls>`` whose
``__getattribute__``/``__setattr__`` serve the given tensors. ``self.weight`` works, but
``parameters()``, ``named_parameters()``, ``state_dict()`` and ``get_parameter()`` read the
registries and still return the module's own tensors. Validation, restore (``finally``)
and write-back are the reference's.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from swapspec import reference
from swapspec.reference.functional_call import prepare_call
from tests.zoo import FC_PATHS, ZooTarget
from tests.zoo import ref_fc as ref

ORIGIN = "class-swapping stateless.functional_call (pytorch #92295)"
CAUGHT_BY = frozenset({"FC-VISIBLE", "FC-ORACLE"})
PATHS = FC_PATHS


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """Rules: the reference's validation; then every owning module's class is swapped for
    one that serves its given names through attribute access only (the bug); the classes
    are restored in ``finally`` and rebinds are written back to the caller's mapping."""
    call = prepare_call(module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict)
    served = _served_by_owner(call.slots)
    classes = {key: _swap_class(owner, names) for key, (owner, names) in served.items()}
    try:
        return module(*call.args, **call.kwargs)
    finally:
        for key, (owner, _) in served.items():
            owner.__class__ = classes[key]
        ref._write_back(_rebound(call.slots, served), call.slots, call.given, call.sources)


def _served_by_owner(slots: list) -> dict[int, tuple[nn.Module, dict[str, Any]]]:
    """``{id(owner): (owner, {key: given value})}``."""
    served: dict[int, tuple[nn.Module, dict[str, Any]]] = {}
    for slot in slots:
        served.setdefault(id(slot.module), (slot.module, {}))[1][slot.key] = slot.value
    return served


def _swap_class(owner: nn.Module, names: dict[str, Any]) -> type:
    """Give ``owner`` a replacer subclass serving ``names``; return the original class."""
    cls = type(owner)

    def getattribute(self, name: str) -> Any:
        if name in names:
            return names[name]
        return cls.__getattribute__(self, name)

    def setattr_(self, name: str, value: Any) -> None:
        if name in names:
            names[name] = value
        else:
            cls.__setattr__(self, name, value)

    owner.__class__ = type(f"StatelessReplacer{cls.__name__}", (cls,),
                           {"__getattribute__": getattribute, "__setattr__": setattr_})
    return cls


def _rebound(slots: list, served: dict) -> dict[tuple[int, str], Any]:
    """Slots whose served value forward replaced."""
    out = {}
    for slot in slots:
        now = served[id(slot.module)][1][slot.key]
        if now is not slot.value:
            out[slot.ident] = now
    return out


target = ZooTarget("zoo-class-swap", reference.apply, functional_call)
