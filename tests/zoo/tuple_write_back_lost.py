"""Zoo: a tuple of dicts is merged into a new dict, so rebinds are written back there and lost.

Origin: torch 2.13 ``torch.func.functional_call`` (``torch/_functorch/functional_call.py``
merges the dicts, then ``_functional_call`` writes rebinds into the merged dict); declared
for the torch target as ``tuple_rebind_lost`` in ``properties/declarations/torch.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from swapspec import reference
from tests.zoo import FC_PATHS, ZooTarget
from tests.zoo import ref_fc as ref

ORIGIN = "torch 2.13 torch.func.functional_call: tuple-of-dicts write-back lost"
CAUGHT_BY = frozenset({"FC-WRITE-BACK"})
PATHS = FC_PATHS


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """The reference's ``functional_call`` on one merged dict (the bug) when given a
    list/tuple of dicts; torch's input-form errors are raised first, unchanged."""
    if not isinstance(tensors, Mapping):
        tensors, _ = ref._merge(tensors)
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights,
                                     strict=strict)


target = ZooTarget("zoo-tuple-write-back-lost", reference.apply, functional_call)
