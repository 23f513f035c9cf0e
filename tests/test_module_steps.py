"""The sequence machine's in-place steps: ``module_apply`` (``Module.apply`` of a weight-init
function) and ``clip_grads`` (a ``torch.nn.utils.clip_grad_*`` call). The model's rule for them
(``ModuleModel.in_place_on_fresh``) predicts what torch does to a module slot by slot (the
sequences' own ``check_state``), the step catches a module a buggy earlier step left aliased, and
each step's repro code does what the step did."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from swapspec.properties.harness.checker import ConformanceError
from swapspec.properties.harness.targets import builtin_target
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.models.outcomes import attempt
from swapspec.properties.rules.sequence_machine import STATE, SequenceMachine, run_backward
from swapspec.strategies import build_tree
from swapspec.strategies.module_steps import (
    MODULE_FNS,
    GradClip,
    grad_clips,
    module_fn_source,
)
from tests.test_module_model_ties import FLAT, TIED, X, _both, _Scripted, _violations


def _trained(tied: bool) -> tuple:
    model, module = _both(TIED if tied else FLAT)
    run_backward(module, X, False)
    model.forward(X, backward="plain")
    return model, module


@settings(max_examples=40, deadline=None, database=None)
@given(clip=grad_clips(), tied=st.booleans())
def test_a_clipping_call_is_predicted_slot_by_slot(clip: GradClip, tied: bool) -> None:
    """Rule: after any drawn clipping call the module's grads, values and objects are the
    model's, and the call raised exactly where the model's call on a fresh build raised."""
    model, module = _trained(tied)
    prediction = model.in_place_on_fresh(clip)
    outcome = attempt(lambda: clip(module))
    assert (prediction.error is None) == (outcome.error is None), (prediction, outcome.error)
    assert not _violations(model, module, "clip_grads")


def test_clipping_by_value_changes_the_grads_and_the_model_follows() -> None:
    """Rule: ``clip_grad_value_`` with a small bound rewrites every grad in place (the same
    grad objects), and the model predicts the clipped values, not the old ones."""
    model, module = _trained(tied=False)
    before = {n: p.grad.clone() for n, p in module.named_parameters()}
    grads = {n: p.grad for n, p in module.named_parameters()}
    model.in_place_on_fresh(GradClip("clip_grad_value_", {"clip_value": 0.01}))
    GradClip("clip_grad_value_", {"clip_value": 0.01})(module)
    assert all(module.get_parameter(n).grad is g for n, g in grads.items())
    assert any(not torch.equal(before[n], module.get_parameter(n).grad) for n in before)
    assert not _violations(model, module, "clip_grads")


def test_a_nonfinite_norm_is_refused_before_any_grad_changes() -> None:
    """Rule: with ``error_if_nonfinite`` a NaN grad makes the model and torch raise
    ``RuntimeError``, and the module keeps its grads."""
    model, module = _trained(tied=False)
    module.p1.grad[0] = float("nan")
    model.tensors[model.slots["p1"]].grad = module.p1.grad.clone()
    clip = GradClip("clip_grad_norm_", {"max_norm": 0.5, "error_if_nonfinite": True})
    assert model.in_place_on_fresh(clip).error is RuntimeError
    before = {n: p.grad.clone() for n, p in module.named_parameters()}
    with pytest.raises(RuntimeError):
        clip(module)
    assert all(torch.equal(before[n].nan_to_num(), p.grad.nan_to_num())
               for n, p in module.named_parameters())
    assert not _violations(model, module, "clip_grads")


@pytest.mark.parametrize("fn", MODULE_FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_module_function_is_predicted_slot_by_slot(fn, tied: bool) -> None:
    """Rule: after ``module.apply(fn)`` the module's values are the model's (a tie written
    twice included) and its objects are kept; ``reset_parameters`` leaves the RNG as it was."""
    model, module = _both(TIED if tied else FLAT)
    rng = torch.get_rng_state()
    model.in_place_on_fresh(lambda copy: copy.apply(fn))
    module.apply(fn)
    assert torch.equal(rng, torch.get_rng_state())
    assert not _violations(model, module, "module_apply")


def test_halving_rewrites_the_values_once_per_tensor() -> None:
    """Rule: ``halve_floating_tensors`` halves each floating tensor once, a tied one too."""
    _, module = _both(TIED)
    before = {n: t.clone() for n, t in module.state_dict().items()}
    module.apply(MODULE_FNS[1])
    assert all(torch.equal(t, before[n] * 0.5) for n, t in module.state_dict().items()
               if t.is_floating_point())


@settings(max_examples=1, database=None, deadline=None)
@given(st.none())  # a machine's steps record Hypothesis events: they run inside a test
def test_module_apply_catches_two_parameters_left_sharing_storage(_: None) -> None:
    """Rule: a module whose two parameters share one storage (what a buggy conversion could
    leave: the model holds them apart) fails SEQ-STATE at the next ``module_apply``, which
    writes one and so both."""
    machine = SequenceMachine.for_target(builtin_target("reference"), STATE)()
    machine.build(build_tree(FLAT), (X,), [conversion_named("double()")])
    machine.module_apply(_Scripted(MODULE_FNS[1]))  # judged and passing on an honest module
    with torch.no_grad():
        machine.module.p0.data = machine.module.p1.data  # p0 now shares p1's storage
    machine.model.tensors[machine.model.slots["p0"]].value = machine.module.p1.detach().clone()
    with pytest.raises(ConformanceError, match="value"):
        machine.module_apply(_Scripted(MODULE_FNS[1]))


@pytest.mark.parametrize("fn", MODULE_FNS, ids=lambda f: f.__name__)
def test_a_module_function_source_defines_the_same_function(fn) -> None:
    """Rule: the repro's definition of a module function does to a module what it does."""
    namespace: dict = {"torch": torch, "nn": nn}
    exec(module_fn_source(fn), namespace)
    ours, theirs = build_tree(FLAT), build_tree(FLAT)
    ours.apply(fn)
    theirs.apply(namespace[fn.__name__])
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(),
                                                 theirs.state_dict().values(), strict=True))


@settings(max_examples=20, deadline=None, database=None)
@given(clip=grad_clips())
def test_a_clipping_source_does_what_the_call_does(clip: GradClip) -> None:
    """Rule: the repro's line of a clipping call leaves the grads the call leaves (or raises the
    same error type)."""
    _, ours = _trained(tied=False)
    _, theirs = _trained(tied=False)
    error = attempt(lambda: clip(ours)).error
    try:
        exec(clip.source(), {"torch": torch, "module": theirs})
    except Exception as e:  # the call's own refusal, compared below
        assert type(e) is type(error)
    else:
        assert error is None
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours.parameters(), theirs.parameters(),
                                                           strict=True))


@settings(max_examples=1, database=None, deadline=None)
@given(st.none())  # a machine's steps record Hypothesis events: they run inside a test
def test_a_clipping_call_that_raises_on_a_fresh_build_is_not_run(_: None) -> None:
    """Rule: the machine does not run a clipping call the model's fresh build raises on (torch's
    clipping writes grad by grad and can raise midway): no step is recorded, the module keeps
    its grads, and the sequence stays judged."""
    machine = SequenceMachine.for_target(builtin_target("reference"), STATE)()
    machine.build(build_tree(FLAT), (X,), [conversion_named("double()")])
    machine.backward(create_graph=False)
    machine.module.p1.grad[0] = float("nan")
    machine.model.tensors[machine.model.slots["p1"]].grad = machine.module.p1.grad.clone()
    steps, grads = len(machine.steps), [p.grad.clone() for p in machine.module.parameters()]
    machine.clip_grads(GradClip("clip_grad_norm_", {"max_norm": 0.5, "error_if_nonfinite": True}))
    assert len(machine.steps) == steps and machine.judged
    assert all(torch.equal(a.nan_to_num(), p.grad.nan_to_num())
               for a, p in zip(grads, machine.module.parameters(), strict=True))
    machine.clip_grads(GradClip("clip_grad_value_", {"clip_value": 0.01}))
    assert len(machine.steps) == steps + 1 and machine.judged
    machine.teardown()
