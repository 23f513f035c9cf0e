"""What calling a target did: its result or the exception it raised, captured so that a rule
can judge either."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from swapspec.properties.models.examples import (
    same_values,
)


@dataclass
class Outcome:
    """What calling the target did: its result, or the exception it raised."""

    result: Any = None
    error: BaseException | None = None


def attempt(call: Callable[[], Any]) -> Outcome:
    """Run ``call``; capture any ``Exception`` instead of raising it."""
    try:
        return Outcome(result=call())
    except Exception as e:  # the property decides whether raising was right
        # without this frame in its traceback: the frame holds ``e``, a cycle that would keep
        # every frame below (and the tensors and graphs they hold) alive until a collection
        return Outcome(error=e.with_traceback(e.__traceback__.tb_next))


def seeded_attempt(call: Callable[[], Any]) -> Outcome:
    """:func:`attempt` under a forked CPU RNG seeded alike every time (so dropout draws the same
    masks), warnings silenced; the caller's RNG is left as it was."""
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.default_generator.manual_seed(0)  # the CPU RNG only: fork_rng(devices=[]) forks no other
        return attempt(call)


def seeded_forward(module: torch.nn.Module, x: Tensor | None) -> Outcome:
    """The module's forward on ``x`` without grad, under :func:`seeded_attempt` (so dropout
    drops the same entries every time)."""
    with torch.no_grad():
        return seeded_attempt(lambda: module(x))


TARGET_RAISED = "swapspec_target_raised"  # set on an exception a target call raised


def mark_target_error(error: BaseException) -> BaseException:
    """Mark ``error`` as raised by a target call (``raised_by_target``); return it."""
    with contextlib.suppress(AttributeError):  # a type that takes no attributes: unmarked
        setattr(error, TARGET_RAISED, True)
    return error


def raised_by_target(error: BaseException) -> bool:
    """Whether a target call raised ``error`` (``mark_target_error``): an error that escapes a
    property is then the target's, else the suite's own (a harness error)."""
    return bool(getattr(error, TARGET_RAISED, False))


def same_output(a: Outcome, b: Outcome) -> bool:
    """Both raised the same exception type, or both returned equal tensors."""
    if a.error is not None or b.error is not None:
        return type(a.error) is type(b.error)
    x, y = a.result, b.result
    if isinstance(x, Tensor) and isinstance(y, Tensor):
        return same_values(x.detach(), y.detach())
    return x == y
