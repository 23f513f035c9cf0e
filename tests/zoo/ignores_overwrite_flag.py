"""Zoo: ``_apply`` that ignores the overwrite flag and always uses ``.data =`` when compatible.

Origin: the overwrite flag (``torch.__future__.set_overwrite_module_params_on_conversion``,
pytorch #21613) exists so that users can ask for new parameter objects on conversion;
an implementation that reads only the swap flag keeps the pre-#21613 set_data path.
Everything else is the reference's.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from swapspec import reference
from tests.zoo import APPLY_PATHS, ZooTarget

ORIGIN = "overwrite flag ignored (pytorch #21613 added it)"
CAUGHT_BY = frozenset({"APPLY-PATH"})
PATHS = APPLY_PATHS


def apply(module: nn.Module, fn: Callable[[Tensor], Tensor], *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """The reference's ``apply`` with ``overwrite`` forced to ``False`` (the bug)."""
    return reference.apply(module, fn, overwrite=False, swap=swap, recurse=recurse)


target = ZooTarget("zoo-ignores-overwrite-flag", apply, reference.functional_call)
