"""What the tests of decorated and trained modules share: one input, one conversion, and builds
under a seeded global RNG that leave torch's own RNG as it was."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tests.helpers_modules import randn

X = randn(2, 3, seed=40)  # an input for every Linear(3, n) of the tests


def double(t: torch.Tensor) -> torch.Tensor:
    return t.double()


def seeded(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` under a forked, seeded global RNG: torch's own RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()
