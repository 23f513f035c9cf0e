"""The pair schedule: every ordered pair of the sequence machine's rules, run in that order.

Free sequences (``sequence_machine``) draw which rule comes next, so which ordered pairs a run
meets is chance: a bug that shows only when rule ``b`` follows rule ``a`` waits for a sequence
that happens to draw them in that order. The schedule removes the chance. For each target it
makes one case per ordered pair ``(a, b)`` of the rules the target offers (``rules_of``); a case
draws a module as a sequence's build does, runs rule ``a`` with drawn arguments, then rule
``b``, then rule ``a`` again, and checks each step exactly as a sequence step is checked (the
property's invariant, the five invariants, global state, the declarations). So every pair is met
in every run of every profile, and so is the shape most sequence bugs have: the first call
leaves state behind, the step between changes the module, the second call trusts that state (a
conversion cache, slots recorded at a first functional call, grads remembered by a conversion).
A failure's script has at most five steps.

Rules:
- a step some rule needs first is run first and is a step of the script like any other:
  ``build_optimizer`` before an ``optimizer_step`` with no optimizer, ``tie`` before an
  ``untie`` with no tie (``NEEDS``);
- an example whose module cannot run both rules (``vmap`` of an old-style reparametrization,
  ``tie`` with no two tensors that can share a slot, training with no trainable parameter) is
  not an example (``assume``), decided right after the build where the module alone decides;
- after a step that showed a declared deviation the case ends: the module is in a state the
  spec says nothing about, as in a free sequence. Where that step was the first rule, the pair
  was not met and the case is not an example either: the first step was checked, and another
  case is drawn until the pair is met (``filter_too_much`` is no health problem here: a target
  whose declared deviations show on most cases of a rule makes most cases of its pairs end so).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

from swapspec.properties.harness.heap import freeze_heap, heap_frozen, unfreeze_heap
from swapspec.properties.harness.marking import per_target_cases
from swapspec.properties.rules.sequence_machine import (
    DEFAULT_DTYPES,
    GLOBAL_HOOK_CHOICES,
    MODE_CHOICES,
    RULES,
    SequenceMachine,
    palettes,
    trees,
)
from swapspec.properties.rules.sequence_values import trainable
from swapspec.strategies import flag_settings, forward_inputs

# The share of the profile's max_examples each case runs (at least one): a case costs about as
# much as three one-shot examples, and a target has up to 169 of them.
EXAMPLES_DIVISOR = 20


def rules_of(target: Any) -> tuple[str, ...]:
    """The rules a target's sequences draw: every rule, ``load_state_dict`` only where the
    target has one."""
    return tuple(r for r in RULES
                 if r != "load_state_dict" or getattr(target, "load_state_dict", None) is not None)


def ordered_pairs(target: Any) -> list[tuple[str, tuple[str, str]]]:
    """``(id, (a, b))`` for every ordered pair of the target's rules, ``a`` equal to ``b`` too;
    the id is the report's name of the pair, ``a>b``."""
    rules = rules_of(target)
    return [(f"{a}>{b}", (a, b)) for a in rules for b in rules]


class FixedDraw:
    """A data object that answers the draw labelled ``label`` with ``value`` and passes every
    other draw to ``data``: how the schedule picks the step of a rule that draws between two
    (``tie`` or untie) without drawing it."""

    def __init__(self, data: st.DataObject, label: str, value: Any) -> None:
        self.data, self.label, self.value = data, label, value

    def draw(self, strategy: st.SearchStrategy, label: str | None = None) -> Any:
        return self.value if label == self.label else self.data.draw(strategy, label=label)


# Each rule as the schedule runs it: the machine's own step, its arguments drawn from ``data``.
RUNNERS: dict[str, Callable[[SequenceMachine, st.DataObject], None]] = {
    "convert": lambda m, d: m.convert(d, d.draw(flag_settings(), label="flags")),
    "functional_call": lambda m, d: m.plain_call(d),
    "vmap": lambda m, d: m.vmap(d),
    "tie": lambda m, d: m.tie(FixedDraw(d, "tie or untie", "tie")),
    "untie": lambda m, d: m.tie(FixedDraw(d, "tie or untie", "untie")),
    "load_state_dict": lambda m, d: m.load_state_dict(d),
    "backward": lambda m, d: m.backward(d.draw(st.booleans(), label="create_graph")),
    "build_optimizer": lambda m, d: m.build_optimizer(),
    "optimizer_step": lambda m, d: m.optimizer_step(),
    "zero_grad": lambda m, d: m.zero_grad(d.draw(st.booleans(), label="set_to_none")),
    "requires_grad_": lambda m, d: m.requires_grad_(d.draw(st.booleans(), label="requires_grad")),
    "register_hooks": lambda m, d: m.register_hooks(d),
    "state_dict_round_trip": lambda m, d: m.state_dict_round_trip(),
    "deepcopy": lambda m, d: m.deepcopy(),
}

# The step a rule needs before it where the module's state lacks it.
NEEDS = {"optimizer_step": "build_optimizer", "untie": "tie"}


def can_run(machine: SequenceMachine, rule: str) -> bool:
    """Whether ``rule`` can run on the machine's module now (the free machine's own choices)."""
    model = machine.model
    if rule == "vmap":
        return machine.vmappable
    if rule == "tie":
        return bool(model.tie_choices())
    if rule == "untie":
        return bool(model.untie_choices())
    if rule == "backward":
        return not model.poisoned
    if rule in ("build_optimizer", "register_hooks"):
        return bool(trainable(model))
    if rule == "optimizer_step":
        return bool(trainable(model)) and machine.opt is not None
    return True


def can_reach(machine: SequenceMachine, rule: str) -> bool:
    """Whether ``rule`` can run now or after the step it needs (``NEEDS``)."""
    need = NEEDS.get(rule)
    return can_run(machine, rule) or (need is not None and can_run(machine, need))


def run_rule(machine: SequenceMachine, rule: str, data: st.DataObject) -> None:
    """Run ``rule``, and first the step it needs where the module lacks it; nothing once a
    declared deviation has shown."""
    need = NEEDS.get(rule)
    if machine.judged and need is not None and not can_run(machine, rule) \
            and can_run(machine, need):
        RUNNERS[need](machine, data)
    if not machine.judged:
        return
    assume(can_run(machine, rule))
    RUNNERS[rule](machine, data)


# A case freezes the heap it starts on (``gc.freeze``), so the collections its steps make scan
# only what it made; garbage of earlier cases is frozen with it, and every this many cases a full
# collection (about a tenth of a second with torch loaded) frees it.
CASES_PER_FULL_COLLECTION = 64
_cases = itertools.count()


@contextlib.contextmanager
def heap_of_one_case() -> Iterator[None]:
    """Freeze the objects alive now until the case ends, collecting garbage first on every
    ``CASES_PER_FULL_COLLECTION``-th case; nothing where something else froze objects already."""
    if heap_frozen():
        yield
        return
    if next(_cases) % CASES_PER_FULL_COLLECTION == 0:
        gc.collect()
    freeze_heap()
    try:
        yield
    finally:
        unfreeze_heap()


def run_pair(target: Any, property_id: str, pair: tuple[str, str], data: st.DataObject) -> None:
    """One case of the schedule: build a module, run ``pair``'s first rule, its second, and its
    first again, each step checked for ``property_id`` as a sequence step is."""
    with heap_of_one_case():
        machine = SequenceMachine.for_target(target, property_id)()
        try:
            machine.build(data.draw(trees, label="module"),
                          data.draw(forward_inputs(), label="x"),
                          data.draw(palettes, label="palette"),
                          data.draw(st.sampled_from(DEFAULT_DTYPES), label="default dtype"),
                          data.draw(st.sampled_from(GLOBAL_HOOK_CHOICES), label="global hooks"),
                          data.draw(st.sampled_from(MODE_CHOICES), label="mode"))
            assume(all(can_reach(machine, rule) for rule in pair))
            first, then = pair
            run_rule(machine, first, data)
            assume(machine.judged)  # the first step showed a declared deviation: pair not met
            run_rule(machine, then, data)
            run_rule(machine, first, data)
        finally:
            machine.teardown()


def pair_property(property_id: str) -> Callable:
    """Mark a test of ``(target, pair)`` as one case of the schedule per target and ordered pair,
    checking ``property_id``: ``1/EXAMPLES_DIVISOR`` of the profile's examples (at least one),
    with the relaxations of every property test (``marking.spec_property``)."""
    current = settings()
    relax = settings(current, max_examples=max(1, current.max_examples // EXAMPLES_DIVISOR),
                     deadline=None, print_blob=True,
                     suppress_health_check=[*current.suppress_health_check,
                                            HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.filter_too_much])

    def mark(test: Callable) -> Callable:
        marked = pytest.mark.swapspec_property(property_id)(relax(test))
        return per_target_cases("pair", ordered_pairs)(marked)

    return mark
