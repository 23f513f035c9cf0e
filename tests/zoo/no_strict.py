"""Zoo: ``functional_call`` that accepts ``strict`` and ignores it.

Origin: pytorch #92153 (request for a strict mode: missing or misspelled keys silently
fell back to the module's own tensors), added in PR #92536.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from swapspec import reference
from tests.zoo import FC_PATHS, ZooTarget

ORIGIN = "strict accepted and ignored (pytorch #92153)"
CAUGHT_BY = frozenset({"FC-STRICT"})
PATHS = FC_PATHS


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """The reference's ``functional_call`` with ``strict`` forced to ``False`` (the bug)."""
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights,
                                     strict=False)


target = ZooTarget("zoo-no-strict", reference.apply, functional_call)
