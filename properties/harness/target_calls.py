"""Calling a target: its ``apply`` and ``functional_call`` with only the options and keywords it
takes (``Target.has``), and call inputs drawn to match."""

from __future__ import annotations

import warnings
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


def run_converted(target: Any, example: Example) -> Outcome:
    """The example's conversion on ``target``: the public method call it stands for
    (``conversion.call``: ``module.half()``, ``module.to(...)``), else ``apply`` with a fresh
    ``fn``."""
    call = getattr(example.conversion, "call", None)
    if call is None:
        return run_apply(target, example, example.conversion.make_fn())
    return run_method(target, example, call)


def run_method(target: Any, example: Example, call: Any) -> Outcome:
    """``target.method(call.method)(module, *args, overwrite=..., swap=..., **kwargs)``: the
    target's own public method (torch: ``module.to(...)``), or the reference's built on its
    ``apply``."""
    method = target.method(call.method)
    args, kwargs = call.args()
    flags = example.flags
    with warnings.catch_warnings():  # to(complex dtype) warns that complex modules are new
        warnings.filterwarnings("ignore", "Complex modules", UserWarning)
        return attempt(lambda: method(example.module, *args, overwrite=flags.overwrite,
                                      swap=flags.swap, **kwargs))


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
