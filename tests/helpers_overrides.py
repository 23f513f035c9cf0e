"""What the override tests share: builds under a seeded global RNG, conversion functions that count
their calls or raise on one, and the check that every RNN's flat weights are its parameters."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``build()`` with torch's global RNG seeded for the call and restored after it."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


def rnns(module: nn.Module) -> list[nn.RNNBase]:
    return [m for m in module.modules() if isinstance(m, nn.RNNBase)]


def assert_flat_weights_current(module: nn.Module) -> None:
    """Every RNN's ``_flat_weights`` (and their weakrefs) are its parameters, in names order."""
    found = rnns(module)
    assert found
    for rnn in found:
        current = [rnn._parameters[name] for name in rnn._flat_weights_names]
        assert len(rnn._flat_weights) == len(current) > 0
        assert all(w is p for w, p in zip(rnn._flat_weights, current, strict=True))
        assert all(r() is p for r, p in zip(rnn._flat_weight_refs, current, strict=True))


def counting(fn: Callable) -> tuple[Callable, list[torch.Tensor]]:
    seen: list[torch.Tensor] = []

    def wrapped(t: torch.Tensor) -> torch.Tensor:
        seen.append(t)
        return fn(t)

    return wrapped, seen


class Refused(Exception):
    pass


def raising_on(k: int, fn: Callable) -> tuple[Callable, Refused]:
    error = Refused(f"tensor {k}")
    count = 0

    def wrapped(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        if count == k:
            raise error
        count += 1
        return fn(t)

    return wrapped, error
