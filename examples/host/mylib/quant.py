"""mylib's own conversion: fake quantization to a grid of eighths."""

from __future__ import annotations

import torch


def fake_quantize(t: torch.Tensor) -> torch.Tensor:
    """Round floating tensors to the nearest multiple of 1/8; others unchanged."""
    return torch.round(t * 8) / 8 if t.is_floating_point() else t
