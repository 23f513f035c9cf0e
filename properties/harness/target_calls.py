"""Calling a target: its ``apply`` and ``functional_call`` with only the options and keywords it
takes (``Target.has``), and call inputs drawn to match."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from swapspec.properties.models.examples import (
    Example,
)
from swapspec.properties.models.outcomes import Outcome, attempt
from swapspec.strategies import call_inputs


def run_apply(target: Any, example: Example, fn: Callable) -> Outcome:
    flags = example.flags
    return attempt(lambda: target.apply(example.module, fn, overwrite=flags.overwrite,
                                        swap=flags.swap, recurse=example.recurse))


# ---- functional_call ---------------------------------------------------------------------
KEYWORD_DEFAULTS = {"tie_weights": True, "strict": False}


def target_call_inputs(target: Any, module: nn.Module, **options: Any):
    """``call_inputs`` drawing only what ``target`` takes: its ``call_forms``, and each keyword it
    lacks (``Target.has``) fixed to the spec's default."""
    fixed = {k: v for k, v in KEYWORD_DEFAULTS.items() if not target.has(k)}
    return call_inputs(module, forms=target.call_forms, **{**options, **fixed})


def call_target(target: Any, module: nn.Module, tensors: Any, args: tuple, kwargs: dict, *,
                tie_weights: bool = True, strict: bool = False) -> Any:
    """``target.functional_call``, passing only the keywords the target takes."""
    return target.functional_call(module, tensors, args, kwargs,
                                  **target.call_keywords(tie_weights=tie_weights, strict=strict))
