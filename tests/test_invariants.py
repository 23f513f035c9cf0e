"""The invariants of every operation (``swapspec.properties.models.invariants``) can fail: each
planted target of ``tests/planted/broken_invariants.py`` breaks one, and its clause fires where
a one-shot property calls the target (``harness.target_calls``) and, for one of them, after a
sequence step (``SequenceMachine.after``). The reference keeps them all."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

from swapspec import reference
from swapspec.properties.harness.checker import Checker, ConformanceError
from swapspec.properties.harness.target_calls import call_target, run_apply
from swapspec.properties.harness.targets import from_object
from swapspec.properties.models import invariants
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.models.examples import Example
from swapspec.properties.rules.sequence_machine import STATE, run_sequences
from swapspec.strategies import FlagSetting, build_tree
from swapspec.strategies.trees import LeafSpec, TensorSpec, TreeSpec
from tests.planted import broken_invariants as planted


@pytest.fixture(autouse=True)
def _invariants_on(monkeypatch):
    monkeypatch.setenv("SWAPSPEC_INVARIANTS", "1")


SPEC = TreeSpec(seed=3, root=LeafSpec(tensors=(TensorSpec(name="p0"),
                                               TensorSpec(name="b0", buffer=True))))


def _apply_verdict(target, conversion: str = "double()") -> Checker:
    """One apply on a fresh build of ``SPEC`` through the harness, judged (no property clause)."""
    module = build_tree(SPEC)
    c = conversion_named(conversion)
    example = Example(module, conversion=c, flags=FlagSetting(False, False))
    check = Checker("APPLY-VALUES", from_object(target), example)
    run_apply(check.target, example, c.make_fn())
    check.verdict()
    return check


@pytest.mark.parametrize("planted_target, clause", [
    (planted.raise_after_change, invariants.RAISE_UNCHANGED),
    (planted.buffer_to_parameter, invariants.KINDS),
    (planted.global_cache, invariants.INDEPENDENT),
    (planted.grad_hook_left, invariants.WORKING),
])
def test_an_apply_invariant_fires_on_its_planted_break(planted_target, clause):
    with pytest.raises(ConformanceError) as caught:
        _apply_verdict(planted_target)
    assert clause in {v.clause for v in caught.value.violations}, str(caught.value)
    assert f"[{clause}]" in str(caught.value)


def test_the_reference_keeps_the_invariants_of_an_apply():
    assert _apply_verdict(reference).violations == []


def _strict_call(target) -> Checker:
    module = build_tree(SPEC)
    tensors = {"p0": module.p0.detach() + 1, "nope": module.p0.detach(), "also.nope": module.p0}
    example = Example(module)
    check = Checker("FC-STRICT", from_object(target), example)
    with pytest.raises(RuntimeError):
        call_target(check.target, module, tensors, (build_tree(SPEC).p0,), {}, strict=True)
    return check


def test_strict_exact_fires_where_the_strict_error_misses_a_key():
    check = _strict_call(planted.strict_misses_key)
    assert [v.clause for v in check.violations] == [invariants.STRICT_EXACT]
    assert "'nope'" in check.violations[0].message


def test_the_reference_names_every_unexpected_key():
    assert _strict_call(reference).violations == []


def test_unexpected_keys_of_a_load_must_name_every_extra_key():
    module = build_tree(SPEC)

    class Result:
        unexpected_keys = ["x"]

    assert invariants.strict_exact(invariants.load_extras(module, ["p0", "x", "y"]), None, Result(),
                                   strict=False)[0].clause == invariants.STRICT_EXACT
    assert invariants.load_extras(module, list(module.state_dict())) == []


def test_a_sequence_step_checks_the_invariants():
    """The after-step hook: the planted buffer-to-parameter conversion fails a sequence on
    INV-KINDS."""
    quick = settings(max_examples=60, stateful_step_count=15, deadline=None, database=None,
                     phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                     derandomize=True)  # a fixed seed: a few random sequences can miss the plant
    with pytest.raises(ConformanceError) as caught:
        run_sequences(from_object(planted.buffer_to_parameter), STATE, settings_=quick)
    assert f"[{invariants.KINDS}]" in str(caught.value)


@pytest.mark.parametrize(("chosen", "reference_on", "torch_on"),
                         [(None, True, True), ("1", True, True), ("0", False, False)])
def test_invariants_are_on_for_the_reference_and_chosen_by_the_environment(
        monkeypatch, chosen, reference_on, torch_on):
    """Rule: unset, the target's ``invariants`` field decides (on for the built-in targets, off
    for a host's unless it sets it); ``SWAPSPEC_INVARIANTS`` decides for every target when set."""
    from swapspec.properties.harness.targets import builtin_target

    if chosen is None:
        monkeypatch.delenv("SWAPSPEC_INVARIANTS", raising=False)
    else:
        monkeypatch.setenv("SWAPSPEC_INVARIANTS", chosen)
    assert invariants.enabled(builtin_target("reference")) is reference_on
    assert invariants.enabled(builtin_target("torch")) is torch_on
    assert invariants.enabled(builtin_target("torch-stateless")) is torch_on
    host = from_object(reference)
    assert invariants.enabled(host) is (chosen == "1")


def test_kinds_after_a_deepcopy_are_what_parameter_deepcopy_makes():
    """Rule: ``copy.deepcopy`` drops a plain Parameter's instance attributes (torch's
    ``Parameter.__deepcopy__``); INV-KINDS holds a deepcopy step to that, any other step not."""
    import copy

    from torch import nn

    module = nn.Linear(2, 2)
    module.weight.tag = "kept?"
    before = invariants.kinds(module)
    copied = copy.deepcopy(module)
    assert not hasattr(copied.weight, "tag")
    assert invariants.kinds_kept(before, copied, attributes=False) == []
    lost = invariants.kinds_kept(before, copied)
    assert [v.clause for v in lost] == ["INV-KINDS"] and "tag" in lost[0].message


def test_a_raise_inside_the_forward_may_keep_what_the_forward_did():
    """Rule: with ``forward_ran`` (a step that raised inside the module's own forward) a value
    changed in place and a buffer rebound are not INV-RAISE-UNCHANGED's; a registration that
    changed still is."""
    import torch
    from torch import nn

    module = nn.BatchNorm1d(2)
    before = invariants.world([module])
    with torch.no_grad():
        module.running_mean.add_(1)  # what a training forward does before a later layer raises
    module.running_var = torch.ones(2)  # ``self.count = self.count + 1`` before a raise
    assert invariants.unchanged(before, forward_ran=True) == []
    assert {v.clause for v in invariants.unchanged(before)} == {"INV-RAISE-UNCHANGED"}
    assert len(invariants.unchanged(before)) == 2  # the rebound slot, the changed values
    module.register_buffer("extra", torch.zeros(1))
    messages = [v.message for v in invariants.unchanged(before, forward_ran=True)]
    assert "slot 'extra' appeared" in messages


def test_a_raise_inside_the_forward_may_keep_its_in_place_update_of_a_given_tensor():
    """Rule: with ``forward_ran`` a caller's tensor that forward updated in place before it
    raised (a functional call's given ``steps``) is the forward's doing, and so is a given
    buffer it rebound, which the call writes back into the caller's dict on a raise too (the
    spec's write-back); the caller's dict's keys are still held unchanged."""
    import torch

    given = {"steps": torch.zeros(1)}
    before = invariants.world([], mappings=[given])
    given["steps"].add_(1)  # a leaf's ``self.steps.add_(1)`` before a later layer raises
    assert invariants.unchanged(before, forward_ran=True) == []
    assert [v.message for v in invariants.unchanged(before)] == [
        "the caller's tensor under 'steps' changed value"]
    given["steps"] = torch.zeros(1)  # ``self.count = self.count + 1``, written back
    assert invariants.unchanged(before, forward_ran=True) == []
    assert [v.message for v in invariants.unchanged(before)] == [
        "the caller's dict changed (keys or the objects they hold)"]
    given["extra"] = torch.zeros(1)
    assert [v.message for v in invariants.unchanged(before, forward_ran=True)] == [
        "the caller's dict changed (keys or the objects they hold)"]


def test_a_raise_inside_vmap_that_leaves_a_batched_tensor_is_judged_without_reading_it():
    """Rule: a slot left holding a batched tensor that escaped a vmapped function (torch's, as
    a vmap step that raised can leave) is read by its object, never by its values (every op on
    it raises), so the invariant reports, not the suite."""
    import torch
    from torch import nn

    module = nn.Linear(2, 2)
    before = invariants.world([module])

    def escape(x):
        module.bias = nn.Parameter(x)  # a forward that stores a vmapped value, then raises
        raise RuntimeError("forward failed")

    with pytest.raises(RuntimeError, match="forward failed"):
        torch.vmap(escape)(torch.ones(3, 2))
    assert torch._C._functorch.is_batchedtensor(module.bias)
    assert invariants.unchanged(before, forward_ran=True) == []
    assert [v.message for v in invariants.unchanged(before)] == ["slot 'bias' holds another object"]


def test_an_error_in_the_modules_own_pre_hook_is_the_forwards():
    """Rule: a call's forward begins with the module's own forward pre-hooks (an old-style
    spectral norm's power iteration updates its buffers there), so what a pre-hook changed before
    it raised is not INV-RAISE-UNCHANGED's."""
    import torch
    from torch import nn

    from swapspec.properties.harness.checker import Checker
    from swapspec.properties.harness.target_calls import call_target
    from swapspec.properties.harness.targets import builtin_target
    from swapspec.properties.models.examples import Example

    module = nn.Linear(2, 2)
    module.register_buffer("u", torch.zeros(2))

    def power_iteration(m, args):
        m.u.add_(1)  # updated in place, then the hook fails
        raise RuntimeError("power iteration failed")

    module.register_forward_pre_hook(power_iteration)
    target = builtin_target("reference")
    check = Checker("FC-RESTORE", target, Example(module))
    with pytest.raises(RuntimeError, match="power iteration"):
        call_target(target, module, {"weight": torch.ones(2, 2)}, (torch.ones(1, 2),), {})
    assert [v.clause for v in check.violations] == []


def _conv_with_a_meta_bias() -> torch.nn.Module:
    """A catalogue ``Conv1d`` given a CPU weight and a ``meta`` bias by an ``assign`` load: a
    state a load may leave, whose forward reads memory no tensor defines."""
    module = build_tree(TreeSpec(root=LeafSpec(kind="catalogue", tensors=(), entry="nn.Conv1d",
                                               variant=0)))
    weight = module.inner.weight.detach().clone()
    module.load_state_dict({"inner.weight": weight,
                            "inner.bias": torch.empty(weight.shape[0], device="meta")},
                           assign=True)
    return module


def test_a_module_mixing_meta_and_values_is_held_to_its_forwards_kinds_not_its_values():
    module = _conv_with_a_meta_bias()
    assert invariants.mixes_meta_with_values(module)
    assert invariants.works(module, invariants.input_for(module)) == []


def test_outputs_without_defined_values_still_differ_by_class_dtype_and_shape():
    from torch.testing._internal.two_tensor import TwoTensor

    a, garbage = torch.zeros(2, 3), torch.full((2, 3), 1e14)
    assert invariants._same(a, garbage, by_values=False)
    assert not invariants._same(a, garbage)
    for other in (torch.zeros(3, 2), a.double(), TwoTensor(a, a.clone())):
        assert not invariants._same(a, other, by_values=False), other
