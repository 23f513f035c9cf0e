"""Old-style reparametrizations the unit tests apply: one of each pruning method, a second
pruning, the old weight norm both ways, the old spectral norm along both dims; and the conversion to ``TwoTensor``."""

from __future__ import annotations

import math

import torch
from torch.testing._internal.two_tensor import TwoTensor

from swapspec.strategies.old_style import OldStyle, Pruning

PRUNING_CASES = [Pruning("l1_unstructured", amount=0.5), Pruning("random_unstructured", amount=0.25),
                 Pruning("global_unstructured", amount=0.5),
                 Pruning("ln_structured", amount=0.5, n=math.inf, dim=-1),
                 Pruning("random_structured", amount=0.5, dim=1), Pruning("identity", amount=0.0),
                 Pruning("custom_from_mask", every=3)]
CASES = [OldStyle(p, seed=7) for p in PRUNING_CASES] + [
    OldStyle(Pruning("ln_structured", amount=0.5), Pruning("l1_unstructured", amount=0.25), seed=3),
    OldStyle(None, norm_dim=0), OldStyle(None, norm_dim=None),
    OldStyle(None, norm_dim=None, seed=5, norm="spectral_norm"),
    OldStyle(None, norm_dim=1, seed=2, norm="spectral_norm", power_iterations=3)]


def two_tensor(t: torch.Tensor) -> torch.Tensor:
    return TwoTensor(t.detach(), t.detach().clone()) if t.is_floating_point() else t
