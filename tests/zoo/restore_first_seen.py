"""Sequence zoo: ``functional_call`` restores what a slot held the first time it was called.

The target keeps the originals it swapped out, per (module, slot), from its first call on a
module and restores those on every later call (the bug: it should restore what the slot holds
now). Within one call, or over calls with nothing in between, the slot still holds that
object; after a conversion rebinds the slot (any buffer, or a parameter on the overwrite
path) the next call puts the pre-conversion tensor back. One-shot properties call a module
once, or convert it once and then call it: none calls it, converts it and calls it again.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from swapspec import reference
from swapspec.reference.functional_call import prepare_call
from tests.zoo import ZooTarget
from tests.zoo import ref_fc as ref

ORIGIN = "swapspec sequences: functional_call restores originals cached from an earlier call"
CAUGHT_BY = frozenset({"SEQ-STATE"})
ONE_SHOT_PATHS = ("properties/test_functional_call.py", "properties/test_together.py")

_FIRST_SEEN: dict[tuple[int, str], tuple[weakref.ref, Any]] = {}


def _remembered(slot: Any, original: Any) -> Any:
    """The original seen at the first call on this slot of this module object."""
    seen = _FIRST_SEEN.get(slot.ident)
    if seen is not None and seen[0]() is slot.module:
        return seen[1]
    _FIRST_SEEN[slot.ident] = (weakref.ref(slot.module), original)
    return original


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """The reference's ``functional_call``, restoring first-seen originals (the bug)."""
    call = prepare_call(module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict)
    originals = [_remembered(s, o) for s, o in zip(call.slots, ref._swap_in(call.slots), strict=True)]
    try:
        return module(*call.args, **call.kwargs)
    finally:
        rebound = ref._restore(call.slots, originals)
        ref._write_back(rebound, call.slots, call.given, call.sources)


target = ZooTarget("zoo-restore-first-seen", reference.apply, functional_call)
