"""What the sequence machine checks after a step: the invariants of every operation
(``models.invariants``: INV-RAISE-UNCHANGED where the step raised, else INV-KINDS and
INV-WORKING; INV-INDEPENDENT always), and each SEQ property's own rule: the module against the
model slot by slot (SEQ-STATE), the hooks' counts (SEQ-HOOKS), the optimizer's parameters
(SEQ-OPTIMIZER).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import torch
from torch import Tensor, nn
from torch._C._functorch import is_batchedtensor

from swapspec.properties.harness import sequence_repro as repro
from swapspec.properties.harness.checker import OBSERVED
from swapspec.properties.harness.step_checker import StepCheck
from swapspec.properties.models import invariants
from swapspec.properties.models.apply_state import same_metadata
from swapspec.properties.models.examples import named_tensors, same_values
from swapspec.properties.models.module_model import UNNAMED, ModuleModel
from swapspec.properties.models.outcomes import Outcome
from swapspec.properties.rules.sequence_values import describe
from swapspec.properties.vocabulary import Violation

STATE, FORWARD, HOOKS, OPTIMIZER = "SEQ-STATE", "SEQ-FORWARD", "SEQ-HOOKS", "SEQ-OPTIMIZER"

# Steps that call the module functionally: a slot they leave holding another object or other
# values is ``not-restored`` (FC-RESTORE's clause).
CALL_STEPS = ("functional_call", "vmap")


# ---- the invariants of every step (``models.invariants``) ----------------------------
def step_snapshot(machine: Any, step: str, example: dict) -> Any:
    """Before a step: the world, the kinds and (at the build) the bystander, an independent
    copy of the module that no later step may touch."""
    if not invariants.enabled(machine.target):
        return None
    if step == "build" or machine.module is None:
        machine.bystander = invariants.bystander(machine.module) if machine.module else None
        return None
    load = example.get("load")
    mappings = (load.state_dict,) if load is not None else (
        (example["call"].tensors,) if example.get("call") is not None else ())
    return (invariants.world([machine.module], mappings), invariants.kinds(machine.module),
            load)


# steps that run the module's own forward
FORWARD_RUNNING_STEPS = ("backward", "functional_call", "vmap", "keep_graph")


def step_invariants(machine: Any, step: str, outcome: Outcome) -> list[Violation]:
    """After a step: INV-RAISE-UNCHANGED where it raised, else INV-KINDS and INV-WORKING (on a
    copy: the model holds the module's grads and hook counts); INV-INDEPENDENT always."""
    found = invariants.independent(getattr(machine, "bystander", None))
    before = getattr(machine, "invariants_before", None)
    if before is None:
        return found
    world, kinds, load = before
    if outcome.error is not None:
        # a step that raised in the module's own forward keeps what that forward did before it
        # raised (a forward pre-hook's power iteration, BatchNorm's running statistics, a buffer
        # rebound): slots and values are held to the model (SEQ-STATE), registrations to the world
        return found + invariants.unchanged(world, forward_ran=step in FORWARD_RUNNING_STEPS)
    # a requires_grad_ step sets requires_grad; a tie or an untie puts another parameter in a
    # slot, with its own class, attributes and requires_grad
    retied = step in ("tie", "untie")
    found += invariants.kinds_kept(kinds, machine.module,
                                   requires_grad=not retied and step != "requires_grad_",
                                   classes=not (load and load.assign) and not retied,
                                   attributes=step != "deepcopy")
    try:
        copied = copy.deepcopy(machine.module)
    except Exception:
        return found
    return found + invariants.works(copied, machine.x)


# ---- the invariants ------------------------------------------------------------------
def check_state(check: StepCheck, model: ModuleModel, module: nn.Module, step: str) -> None:
    """SEQ-STATE: names, objects, ties, class, attributes, requires_grad, values and grads.

    After a functional call (``CALL_STEPS``) the object, tie and value clauses are
    ``not-restored`` (FC-RESTORE's: a call must put every slot's own object back, so a tie split
    by a call is a slot it did not restore). A slot left holding a batched tensor that escaped a vmapped function (on
    which every use raises) breaks the object clause, and nothing more of it is read."""
    named = named_tensors(module)
    moved = "not-restored" if step in CALL_STEPS else "object-changed"
    for state in model.tensors:
        first = state.names[0]
        if not check.that(all(n in named for n in state.names), "slot-missing",
                          f"names {list(state.names)} are not all registered",
                          code=f"all(n in named(module) for n in {list(state.names)!r})"):
            continue
        now = named[first]
        if not check.that(not is_batchedtensor(now), moved,
                          f"{first!r} holds a batched tensor escaped from vmap",
                          code=f"not torch._C._functorch.is_batchedtensor(named(module)[{first!r}])"):
            continue
        kind = "parameter" if state.parameter else "buffer"
        split = moved if step in CALL_STEPS else f"{kind}-tie-split"
        for other in state.names[1:]:
            check.that(named[other] is now, split,
                       f"tied {kind} names {first!r} and {other!r} hold two objects",
                       code=f"named(module)[{first!r}] is named(module)[{other!r}]")
        if state.obj is not None:
            check.that(now is state.obj, moved, f"{first!r} holds another object, where the "
                       "path promised the same one", code=f"named(module)[{first!r}] is before[{first!r}]")
        code = f"named(module)[{first!r}]"
        if state.parameter:
            check.that(type(now) is state.cls, "class",
                       f"{first!r} is a {type(now).__name__}, not a {state.cls.__name__}",
                       code=f"type({code}).__name__ == {state.cls.__name__!r}")
            check.that(all(getattr(now, a, None) == v for a, v in (state.attributes or {}).items()),
                       "attributes", f"{first!r} lost its attributes {sorted(state.attributes or {})}",
                       code=f"all(getattr({code}, a, None) == v for a, v in "
                            f"{state.attributes!r}.items())")
            check.that(now.requires_grad == state.requires_grad, "requires-grad",
                       f"{first!r} requires_grad is {now.requires_grad}",
                       code=f"{code}.requires_grad == {state.requires_grad}")
        check.that(_matches(now, state.value, state.values_known),
                   "not-restored" if step in CALL_STEPS else "value",
                   f"{first!r} is {describe(now)}, the model says {describe(state.value)}",
                   code=f"same({code}, {repro.tensor_code(state.value)})" if state.values_known
                   else f"{code}.dtype == {state.value.dtype}")
        if state.parameter and state.values_known:
            _check_grad(check, state, now, code)


def _check_grad(check: StepCheck, state: Any, now: Tensor, code: str) -> None:
    grad = now.grad
    if state.grad is None:
        check.that(grad is None, "grad-value", f"{state.names[0]!r} has a grad the model does not",
                   code=f"{code}.grad is None")
        return
    if check.that(grad is not None, "grad-lost", f"{state.names[0]!r} lost its grad",
                  code=f"{code}.grad is not None"):
        check.that(_matches(grad, state.grad, True), "grad-value",
                   f"{state.names[0]!r}.grad is {describe(grad)}, the model says "
                   f"{describe(state.grad)}", code=f"same({code}.grad, {repro.tensor_code(state.grad)})")


def _matches(actual: Tensor, expected: Tensor, values: bool) -> bool:
    return same_values(actual, expected) if values else same_metadata(actual, expected)


def check_hooks(check: StepCheck, model: ModuleModel, fired: Counter, target: Any) -> None:
    """SEQ-HOOKS: each hook fired as often as the model says. A hook a declared deviation may
    have lost is not held to it; a difference there counts as that deviation."""
    for hook in model.hooks:
        if hook.checked:
            check.that(fired[hook.key] == hook.fired, "hook-count",
                       f"hook {hook.key!r} fired {fired[hook.key]} time(s), the model says "
                       f"{hook.fired}", code=f"fired[{hook.key!r}] == {hook.fired}")
        elif fired[hook.key] != hook.fired:
            OBSERVED[(HOOKS, target.name, "hook-lost-declared")] += 1
            hook.fired = fired[hook.key]


def check_optimizer(check: StepCheck, model: ModuleModel, module: nn.Module,
                    opt: torch.optim.Optimizer | None) -> None:
    """SEQ-OPTIMIZER: every entry the model still holds is the module's parameter (a stale
    entry and one whose tensor no name holds any more, ``UNNAMED``, are not held to it)."""
    if opt is None or model.optimizer is None:
        return
    named = named_tensors(module)
    held = opt.param_groups[0]["params"]
    for position, index in enumerate(model.optimizer):
        if index is None or index == UNNAMED:
            continue
        name = model.tensors[index].names[0]
        check.that(held[position] is named.get(name), "optimizer-stale",
                   f"the optimizer's entry {position} is not {name!r}, where the path promised "
                   "identity", code=f"opt.param_groups[0]['params'][{position}] is named(module)[{name!r}]")
