"""What calling a target did: its result or the exception it raised, captured so that a rule
can judge either."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def same_output(a: Outcome, b: Outcome) -> bool:
    """Both raised the same exception type, or both returned equal tensors."""
    if a.error is not None or b.error is not None:
        return type(a.error) is type(b.error)
    x, y = a.result, b.result
    if isinstance(x, Tensor) and isinstance(y, Tensor):
        return same_values(x.detach(), y.detach())
    return x == y
