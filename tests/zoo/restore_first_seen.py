"""Sequence zoo: ``functional_call`` restores the tensors a module held at its first call.

At its first call on a module the target records what every parameter and buffer slot held,
and after each call it puts back, in the slots the call filled, the recorded tensor instead of
what the slot held at this call (the bug). With nothing between two calls the record is still
the module's state; after a conversion rebinds slots (every buffer, parameters on the overwrite
path) the next call rewinds the slots it fills to the tensors from before the conversion.
One-shot properties call a fresh module, or convert it once and then call it: none calls it,
converts it and calls it again.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from swapspec import reference
from swapspec.reference.functional_call import prepare_call
from tests.zoo import ZooTarget
from tests.zoo import ref_fc as ref

ORIGIN = "swapspec sequences: functional_call restores the slots recorded at its first call"
CAUGHT_BY = frozenset({"SEQ-STATE", "SEQ-FORWARD"})
CAUGHT_BY_PAIR = "vmap>tie"  # vmap, tie, vmap
ONE_SHOT_PATHS = ("properties/rules/test_functional_call.py", "properties/rules/test_together.py")

# id(module) -> (the module, {(id(owner), key): what the slot held at the first call})
_FIRST_SEEN: dict[int, tuple[weakref.ref, dict[tuple[int, str], Any]]] = {}


def _record(module: nn.Module) -> dict[tuple[int, str], Any]:
    seen = _FIRST_SEEN.get(id(module))
    if seen is None or seen[0]() is not module:
        slots = {(id(m), key): t for m in module.modules()
                 for table in ("_parameters", "_buffers") for key, t in getattr(m, table).items()}
        seen = _FIRST_SEEN[id(module)] = (weakref.ref(module), slots)
    return seen[1]


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """The reference's ``functional_call``, restoring recorded tensors (the bug)."""
    recorded = _record(module)
    call = prepare_call(module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict)
    originals = [recorded.get(slot.ident, original)
                 for slot, original in zip(call.slots, ref._swap_in(call.slots), strict=True)]
    try:
        return module(*call.args, **call.kwargs)
    finally:
        rebound = ref._restore(call.slots, originals)
        ref._write_back(rebound, call.slots, call.given, call.sources)


target = ZooTarget("zoo-restore-first-seen", reference.apply, functional_call)
