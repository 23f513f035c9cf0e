"""Declared deviations of ``torch.func.stack_module_state`` from ``STACK-MODULE-STATE-REFUSED``.

The predicates read the drawn ensemble (``Example.method``, a ``strategies.ensembles.Ensemble``):
which way one model departs from the others.
"""

from __future__ import annotations

from typing import Any

from swapspec.properties.declarations.torch_parametrize import TORCH_CHECKED
from swapspec.properties.vocabulary import Deviation
from swapspec.strategies.ensembles import Ensemble


def departs_by(*kinds: str):
    """A predicate: the drawn ensemble's one departure is one of ``kinds``."""
    def applies(example: Any) -> bool:
        return isinstance(example.method, Ensemble) and example.method.unlike in kinds
    applies.__name__ = f"departs_by_{'_or_'.join(k.replace('-', '_') for k in kinds)}"
    return applies


STACKING_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "STACK-MODULE-STATE-REFUSED", departs_by("extra-name", "missing-name"), "raised",
        "stack_module_state stacks the names of the first model only: a name only a later model "
        "has is dropped without a word, and a name a later model lacks raises a bare KeyError "
        "(torch 2.13, 2.14). Repro: from torch.func import stack_module_state; a, b = "
        "nn.Linear(2, 2), nn.Linear(2, 2); b.register_buffer('extra', torch.zeros(1)); "
        "stack_module_state([a, b])[1]  # {}: b's buffer is lost; stack_module_state([b, a])  "
        "# KeyError: 'extra'",
        torch_versions=TORCH_CHECKED, id="torch.stack-module-state-reads-first-model-names"),
    Deviation(
        "STACK-MODULE-STATE-REFUSED", departs_by("dtype"), "raised",
        "stack_module_state stacks tensors of different dtypes with torch.stack, which promotes "
        "them: models of different dtypes are not refused, and the stacked values are not of "
        "the first model's dtype (torch 2.13, 2.14). Repro: from torch.func import "
        "stack_module_state; p, _ = stack_module_state([nn.Linear(2, 2), nn.Linear(2, "
        "2).double()]); p['weight'].dtype  # torch.float64",
        torch_versions=TORCH_CHECKED, id="torch.stack-module-state-promotes-dtype"),
    Deviation(
        "STACK-MODULE-STATE-REFUSED", departs_by("submodule-mode"), "raised",
        "stack_module_state compares the training mode of the models' roots only; models whose "
        "submodules are in different modes are stacked, and vmap then runs every model in the "
        "first one's modes (torch 2.13, 2.14). Repro: from torch.func import "
        "stack_module_state; a, b = (nn.Sequential(nn.Linear(2, 2), nn.Dropout()) for _ in "
        "range(2)); b[1].eval(); stack_module_state([a, b])  # returns",
        torch_versions=TORCH_CHECKED, id="torch.stack-module-state-checks-root-mode-only"),
)
