"""Zoo: swap in and restore once per *name*, so a shared submodule's slot keeps a given tensor.

Origin: torch 2.13 ``_reparametrize_module`` (``NamedMemberAccessor.swap_tensors_dict``):
two names reaching one slot through a shared submodule are swapped one after the other;
the second swap records the first's given tensor as the "original", and restoring in the
same order leaves it in the module. Declared for the torch target as
``swaps_one_slot_twice`` in ``properties/declarations/torch.py``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from swapspec import reference
from swapspec.reference.functional_call import prepare_call
from tests.zoo import FC_PATHS, ZooTarget
from tests.zoo import ref_fc as ref

ORIGIN = "torch 2.13 _reparametrize_module: per-name swap leaves a given tensor in a shared slot"
CAUGHT_BY = frozenset({"FC-RESTORE", "TOGETHER-CONVERTED-CALL"})
PATHS = FC_PATHS


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """The reference's ``functional_call``, but each name swaps its slot and records what
    it found, and the records are replayed in the same order (the bug)."""
    call = prepare_call(module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict)
    records = [(slot, ref._put(slot, slot.value)) for slot in call.slots for _ in slot.names]
    try:
        return module(*call.args, **call.kwargs)
    finally:
        rebound: dict[tuple[int, str], Any] = {}
        seen: set[tuple[int, str]] = set()
        for slot, original in records:
            now = ref._put(slot, original)
            if slot.ident not in seen and now is not slot.value:
                rebound[slot.ident] = now
            seen.add(slot.ident)
        ref._write_back(rebound, call.slots, call.given, call.sources)


target = ZooTarget("zoo-shared-slot-restore", reference.apply, functional_call)
