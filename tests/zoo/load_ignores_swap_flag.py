"""Zoo: ``load_state_dict`` that ignores the swap flag and copies in place (or assigns).

Origin: torch's ``load_state_dict`` before the swap path reached it (``Tensor.module_load`` and
``swap_tensors`` in ``_load_from_state_dict``): ``torch.__future__``'s swap flag changed
``_apply`` only, so a tensor-subclass parameter or a new device could not be loaded by swapping.
Everything else here is the reference's.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from swapspec import reference
from tests.zoo import LOAD_PATHS, ZooTarget

ORIGIN = "torch load_state_dict before module_load: the swap flag reached _apply only"
CAUGHT_BY = frozenset({"LOAD-PATH"})
PATHS = LOAD_PATHS


def load_state_dict(module: nn.Module, state_dict: Any, *, strict: bool = True,
                    assign: bool = False, swap: bool) -> Any:
    """The reference's load with the swap flag dropped (the bug)."""
    return reference.load_state_dict(module, state_dict, strict=strict, assign=assign, swap=False)


target = ZooTarget("zoo-load-ignores-swap-flag", reference.apply, reference.functional_call,
                   load_state_dict)
