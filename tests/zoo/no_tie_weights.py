"""Zoo: ``functional_call`` without weight tying: only the given name is replaced.

Origin: pytorch #86708 (``functional_call`` ignored tied weights; giving ``l1.weight`` left
its alias ``tied`` showing the module's own tensor), fixed by ``tie_weights`` in PR #92536.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from swapspec import reference
from tests.zoo import FC_PATHS, ZooTarget

ORIGIN = "functional_call without weight tying (pytorch #86708)"
CAUGHT_BY = frozenset({"FC-TIES"})
PATHS = FC_PATHS


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """The reference's ``functional_call`` with ``tie_weights`` forced to ``False`` (the bug)."""
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=False,
                                     strict=strict)


target = ZooTarget("zoo-no-tie-weights", reference.apply, functional_call)
