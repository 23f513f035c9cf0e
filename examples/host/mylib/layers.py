"""mylib's own layer."""

from __future__ import annotations

import torch
from torch import nn


class Gate(nn.Module):
    """``x * sigmoid(gate) * scale + bias``: two parameters and a buffer, seeded."""

    def __init__(self, features: int = 4, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.gate = nn.Parameter(torch.randn(features, generator=gen))
        self.bias = nn.Parameter(torch.randn(features, generator=gen))
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.gate) * self.scale + self.bias
