"""Zoo: ``functional_call`` that lets jitted modules and tracing through.

Origin: ``torch.nn.utils.stateless._functional_call`` refuses ``torch.jit.is_tracing()``,
``torch.jit.is_scripting()`` and jitted modules ("The stateless API can't be used with Jitted
modules"); a call that swaps tensors in regardless either fails on a ``ScriptModule``'s
registries with another error or, while tracing, bakes the given tensors into the traced graph
as constants.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

from swapspec import reference
from tests.zoo import FC_PATHS, ZooTarget

ORIGIN = "functional_call without the jit refusal of torch's _functional_call"
CAUGHT_BY = frozenset({"FC-JIT-REFUSED"})
PATHS = FC_PATHS


def functional_call(module: nn.Module, tensors: Any, args: Any = (), kwargs: Any = None, *,
                    tie_weights: bool = True, strict: bool = False) -> Any:
    """Rules: torch's swap in and out (``_reparametrize_module``) around the forward, with no
    check of jit first (the bug)."""
    args = args if isinstance(args, tuple) else (args,)
    with _reparametrize_module(module, tensors, tie_weights=tie_weights, strict=strict):
        return module(*args, **(kwargs or {}))


target = ZooTarget("zoo-no-jit-refusal", reference.apply, functional_call)
