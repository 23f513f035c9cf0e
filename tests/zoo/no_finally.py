"""Zoo: ``functional_call`` that restores the module only when forward returns normally.

Origin: hand-rolled reparametrization that restores after forward without ``try/finally``
(FC-RESTORE's docstring: "the old implementations leaked on exceptions"); PR #92536
restores in ``finally``. If forward raises, the given tensors stay in the module.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from swapspec import reference
from swapspec.reference.functional_call import prepare_call
from tests.zoo import FC_PATHS, ZooTarget
from tests.zoo import ref_fc as ref

ORIGIN = "restore only on normal return (no finally)"
CAUGHT_BY = frozenset({"FC-RESTORE"})
PATHS = FC_PATHS


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """The reference's ``functional_call`` with the restore and write-back after a normal
    return only (the bug)."""
    call = prepare_call(module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict)
    originals = ref._swap_in(call.slots)
    out = module(*call.args, **call.kwargs)
    rebound = ref._restore(call.slots, originals)
    ref._write_back(rebound, call.slots, call.given, call.sources)
    return out


target = ZooTarget("zoo-no-finally", reference.apply, functional_call)
