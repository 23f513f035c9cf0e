"""Calling a target: its ``apply`` and ``functional_call`` with only the options and keywords it
takes (``Target.has``), and call inputs drawn to match."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from swapspec.properties.harness import checker
from swapspec.properties.models import invariants
from swapspec.properties.models.examples import (
    Example,
)
from swapspec.properties.models.outcomes import Outcome, attempt, mark_target_error
from swapspec.strategies import call_inputs
from swapspec.strategies.calls import GRAD_MODE_CONTEXTS


def run_apply(target: Any, example: Example, fn: Callable) -> Outcome:
    flags = example.flags
    return watched(lambda: target.apply(example.module, fn, overwrite=flags.overwrite,
                                        swap=flags.swap, recurse=example.recurse), example.module)


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
        return watched(lambda: method(example.module, *args, overwrite=flags.overwrite,
                                      swap=flags.swap, **kwargs), example.module,
                       requires_grad=call.method != "requires_grad_")


# ---- functional_call ---------------------------------------------------------------------
# What a call means on a target without the keyword (``Target.has``): a functional call that
# takes no ``tie_weights`` writes each name it is given on its own, which is torch's
# ``tie_weights=False``; one without ``strict`` accepts any subset of names, ``strict=False``.
WITHOUT_KEYWORD = {"tie_weights": False, "strict": False}


def target_call_inputs(target: Any, module: nn.Module, **options: Any):
    """``call_inputs`` drawing only what ``target`` takes: its ``call_forms``, each keyword it
    lacks (``Target.has``) fixed to what a call without it means (``WITHOUT_KEYWORD``), and
    only the calls its designs admit (``design_options``), each call carrying those designs so
    the oracle judges it by the target's rules."""
    fixed = {k: v for k, v in WITHOUT_KEYWORD.items() if not target.has(k)}
    marks = {k: v for k, v in (("lacking", frozenset(fixed)), ("designs", target.designs)) if v}
    options = {**options, **design_options(target.designs, options), **fixed}
    drawn = call_inputs(module, forms=target.call_forms, **options)
    return drawn.map(lambda call: dataclasses.replace(call, **marks)) if marks else drawn


def design_options(designs: frozenset[str], options: dict[str, Any]) -> dict[str, Any]:
    """``call_inputs`` options a target's designs (``targets.DESIGNS``) impose on a draw:
    ``registered-names-only`` draws no unknown name into a valid call (one drawn to be bad may
    hold one: the target must refuse it), ``no-input-checks`` draws only valid calls without
    conflicting values."""
    imposed: dict[str, Any] = {}
    if "registered-names-only" in designs and options.get("valid") and not options.get("invalid"):
        imposed["unknown_names"] = False
    if "no-input-checks" in designs:
        imposed.update(valid=True, invalid=False, conflicts=False)
    return imposed


def fixed_keywords(target: Any) -> dict[str, Any]:
    """``CallInput`` fields for a call a property builds itself: each keyword ``target`` lacks
    fixed to what a call without it means (so the oracle judges it by the target's rules), and
    named in ``lacking`` (so it is not shown); the target's designs in ``designs``."""
    fixed = {k: v for k, v in WITHOUT_KEYWORD.items() if not target.has(k)}
    designs = {"designs": target.designs} if target.designs else {}
    return {**fixed, "lacking": frozenset(fixed), **designs} if fixed else designs


def call_target(target: Any, module: nn.Module, tensors: Any, args: tuple, kwargs: dict, *,
                tie_weights: bool = True, strict: bool = False, grad_mode: str = "enabled") -> Any:
    """``target.functional_call`` under the autograd mode ``grad_mode`` (``GRAD_MODES``),
    passing only the keywords the target takes; a call that raises raises (``watched`` checks
    the invariants on the way, in the caller's mode)."""
    keywords = target.call_keywords(tie_weights=tie_weights, strict=strict)

    def run() -> Any:
        with GRAD_MODE_CONTEXTS[grad_mode]():
            return target.functional_call(module, tensors, args, kwargs, **keywords)

    outcome = watched(run,
                      module, mappings=(tensors,), extras=_call_extras(module, tensors),
                      strict=keywords.get("strict", False), forwards=True)
    if outcome.error is not None:
        raise outcome.error
    return outcome.result


def _call_extras(module: nn.Module, tensors: Any) -> list[str] | None:
    dicts = tensors if isinstance(tensors, (tuple, list)) else (tensors,)
    try:
        return invariants.call_extras(module, [k for d in dicts for k in d])
    except Exception:  # a bad input (not a dict): the call's own error
        return None


# ---- the invariants, at every call -------------------------------------------------------
_DEPTH = [0]  # a target call inside a target call (apply inside forward) is its caller's


def watched(call: Callable[[], Any], module: nn.Module, *, mappings: tuple = (),
            extras: list[str] | None = None, strict: bool = False, load: bool = False,
            classes: bool = True, requires_grad: bool = True, forwards: bool = False) -> Outcome:
    """``attempt(call)``, adding to the running example's checker (``checker.current``) the
    invariants every call must keep (``models.invariants``): raising changed nothing
    (``INV-RAISE-UNCHANGED``), success kept every kind (``INV-KINDS``), and strict reported every
    key of ``extras`` (``INV-STRICT-EXACT``; ``load``: a load, whose ``unexpected_keys`` report
    them without strict). ``forwards``: the call runs the module's forward (``functional_call``);
    an error raised once the forward began (its pre-hooks included) is the forward's, and what
    the forward changed on the way is its own business, not the call's."""
    check = checker.current()
    if check is None or _DEPTH[0] or not invariants.enabled(check.target):
        return _marked(attempt(call))
    if check.bystander is None:  # made before the example's first call, once
        check.bystander = invariants.bystander(module) or False
    before = invariants.world([module], mappings)
    kinds = invariants.kinds(module)
    began: list[bool] = []
    # first among the module's pre-hooks: they are its forward's own code (an old-style
    # spectral norm's power iteration), so an error in one of them is the forward's
    hook = (module.register_forward_pre_hook(lambda *_: began.append(True), prepend=True)
            if forwards else None)
    _DEPTH[0] += 1
    try:
        outcome = attempt(call)
    finally:
        _DEPTH[0] -= 1
        if hook is not None:
            hook.remove()
    if outcome.error is not None:
        found = [] if began else invariants.unchanged(before)
    else:
        check.succeeded = True
        found = invariants.kinds_kept(kinds, module, classes=classes, requires_grad=requires_grad)
    if extras is not None:
        found += invariants.strict_exact(extras, outcome.error, outcome.result if load else None,
                                         strict=strict)
    check.violations += found
    return _marked(outcome)


def _marked(outcome: Outcome) -> Outcome:
    """``outcome``, its error marked as the target's (``outcomes.raised_by_target``)."""
    if outcome.error is not None:
        mark_target_error(outcome.error)
    return outcome


def run_load(target: Any, example: Example) -> Outcome:
    """``target.load_state_dict`` of the example's ``load`` (``strategies.LoadInput``)."""
    load = example.load
    module = example.module
    return watched(lambda: target.load_state_dict(module, load.state_dict, strict=load.strict,
                                                  assign=load.assign, swap=load.swap),
                   module, mappings=(load.state_dict,),
                   extras=_load_extras(module, load.state_dict), strict=load.strict, load=True,
                   classes=not load.assign)


def _load_extras(module: nn.Module, state_dict: Any) -> list[str] | None:
    try:
        return invariants.load_extras(module, list(state_dict))
    except Exception:  # a state dict that is no mapping: the load's own error
        return None
