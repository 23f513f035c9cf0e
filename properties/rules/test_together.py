"""Properties of ``apply`` and ``functional_call`` used together: one rule per test."""

from __future__ import annotations

import dataclasses
from functools import partial

from hypothesis import assume, event, given
from hypothesis import strategies as st

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import call_repro
from swapspec.properties.harness.target_calls import call_target, target_call_inputs
from swapspec.properties.models.apply_state import WORLD_CHANCE, conversion_named, is_uninitialized
from swapspec.properties.models.call_state import module_state, replaced_originals
from swapspec.properties.models.examples import Example, named_tensors, value_copy
from swapspec.properties.models.oracle import ExpectedError, expected_outcome, slot_of
from swapspec.properties.models.outcomes import attempt
from swapspec.properties.rules.clauses import check_untouched
from swapspec.strategies import FlagSetting, flag_settings, module_trees, tree_info
from swapspec.strategies.conversions import modules_with_conversions

trees = module_trees(world_chance=WORLD_CHANCE)
converted = modules_with_conversions(trees, ["cpu"],
                                     where=lambda c: c.preserves_values and not c.changes_impl)


DEFAULT_FLAGS = FlagSetting(overwrite=False, swap=False)


def _converted(target, module, conversion, flags: FlagSetting):
    """``(module, flags, outcome)``: the module converted on ``target`` with ``flags``; where
    the target's apply raises there (torch refuses swaps the spec accepts, as of old-style
    ``weight_norm`` parameters; the spec refuses a swap after ``create_graph=True``), a fresh
    build of it converted with torch's default flags instead (tag ``flags: default after a
    refused apply``)."""
    def convert(m, f: FlagSetting):
        return attempt(lambda: target.apply(m, conversion.make_fn(), overwrite=f.overwrite,
                                            swap=f.swap))

    outcome = convert(module, flags)
    if outcome.error is None or flags == DEFAULT_FLAGS:
        return module, flags, outcome
    event("flags: default after a refused apply")
    module = tree_info(module).build()
    return module, DEFAULT_FLAGS, convert(module, DEFAULT_FLAGS)


@spec_property("TOGETHER-CONVERTED-CALL")
@given(data=st.data())
def test_functional_call_on_converted_module(target, data):
    """A functional call on a module converted by ``apply`` leaves the converted module intact.

    Origin: ``model.half()`` then ``torch.func.functional_call`` (PR #92536 tests).
    """
    module, conversion = data.draw(converted, label="module and conversion")
    flags = data.draw(flag_settings(), label="flags")
    module, flags, outcome = _converted(target, module, conversion, flags)
    assume(outcome.error is None)  # the target's apply refuses even the default flags
    call = data.draw(target_call_inputs(target, module, valid=True), label="call")
    example = Example(module, conversion=conversion, flags=flags, call=call)
    check = Checker("TOGETHER-CONVERTED-CALL", target, example)
    before = module_state(module)
    filled = expected_outcome(module, call.tensors, tie_weights=call.tie_weights,
                              strict=call.strict,
                              registered_only="registered-names-only" in call.designs)
    assume(not isinstance(filled, ExpectedError))
    replaced = replaced_originals(module, filled)
    reached = {slot_of(module, n) for n in filled}
    attempt(lambda: call_target(target, module, call.tensors, call.args, call.kwargs,
                                tie_weights=call.tie_weights, strict=call.strict))
    check_untouched(check, before, module, "not-restored", values_of=replaced,
                    names={n for n in before.slots if slot_of(module, n) in reached})
    check.verdict(partial(call_repro, example, target))


@spec_property("TOGETHER-APPLY-IN-FORWARD")
@given(data=st.data())
def test_apply_inside_forward_leaves_original_intact(target, data):
    """``apply`` run inside forward during a functional call (``self.to('meta')``) leaves the original module intact.

    Every name is given, so the conversion inside forward only reaches the given tensors.
    Origin: swapspec spec; ``torch.func`` users call ``.to`` inside forward.
    """
    module = data.draw(trees, label="module")
    flags = data.draw(flag_settings(), label="flags")
    to_meta = conversion_named("to('meta')")
    registered = named_tensors(module)
    assume(not any(is_uninitialized(t) for t in registered.values()))
    clones = {id(t): value_copy(t) for t in registered.values()}
    fresh = {n: clones[id(t)] for n, t in registered.items()}  # aliases share one clone
    call = data.draw(target_call_inputs(target, module), label="call")
    call = dataclasses.replace(call, tensors=fresh, tie_weights=False, strict=False)
    example = Example(module, conversion=to_meta, flags=flags, call=call)
    check = Checker("TOGETHER-APPLY-IN-FORWARD", target, example)
    before = module_state(module)

    def convert_inside(mod, args, kwargs):
        target.apply(mod, to_meta.make_fn(), overwrite=flags.overwrite, swap=flags.swap)

    handle = module.register_forward_pre_hook(convert_inside, with_kwargs=True)
    try:
        attempt(lambda: call_target(target, module, call.tensors, call.args, call.kwargs,
                                    tie_weights=call.tie_weights))
    finally:
        handle.remove()
    check_untouched(check, before, module, "original-changed")
    check.verdict(partial(call_repro, example, target))
