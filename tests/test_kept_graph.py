"""A forward's output held with its autograd graph (the sequence machine's ``keep_graph``): the
graph holds the tensors a forward saved, so a swapping conversion or load may be refused, and a
refusal must leave the module as it was. The model allows the refusal exactly while a graph is
held (``ModuleModel.kept_graph``), and the machine's steps stay judged on the reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swapspec import reference
from swapspec.properties.harness.targets import builtin_target
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.models.examples import named_tensors
from swapspec.properties.rules.sequence_machine import STATE, SequenceMachine
from swapspec.strategies import FlagSetting, build_tree
from swapspec.strategies.trees import ContainerSpec, LeafSpec, TreeSpec
from tests.test_module_model_ties import X, _both, _Scripted

# the second linear's input requires grad, so its forward saves its weight for the backward
LINEAR = TreeSpec(root=ContainerSpec(kind="Sequential",
                                     children=(LeafSpec(kind="Linear"), LeafSpec(kind="Linear"))))
DOUBLE = conversion_named("double()")


def test_a_swap_while_a_graph_holds_the_weight_is_refused_and_changes_nothing() -> None:
    """Rule: with two linears' output held (its graph saved a weight), the reference's swapping
    conversion raises ``RuntimeError`` and leaves every slot its object, dtype and values."""
    _, module = _both(LINEAR)
    with torch.enable_grad():
        out = module(X.clone())
    before = {n: (t, t.detach().clone()) for n, t in named_tensors(module).items()}
    with pytest.raises(RuntimeError):
        reference.apply(module, DOUBLE.make_fn(), swap=True)
    for name, (obj, value) in before.items():
        now = named_tensors(module)[name]
        assert now is obj and now.dtype == value.dtype and torch.equal(now, value), name
    assert out.grad_fn is not None


@pytest.mark.parametrize("kept", [False, True], ids=["released", "held"])
def test_the_model_allows_a_refused_swap_exactly_while_a_graph_is_held(kept: bool) -> None:
    """Rule: a swapping conversion may be refused while a forward's graph is held, not before
    it is held or after it is released; a set_data conversion never."""
    model, _ = _both(LINEAR)
    model.kept_graph = kept
    assert model.snapshot().convert(DOUBLE.make_fn, False, True).may_refuse is kept
    assert not model.snapshot().convert(DOUBLE.make_fn, False, False).may_refuse


def test_a_node_poisoned_under_a_held_graph_stays_poisoned_after_zero_grad() -> None:
    """Rule: ``zero_grad`` does not let a backward run while the held graph keeps a poisoned
    AccumulateGrad node alive; once released it does."""
    model, _ = _both(LINEAR)
    model.kept_graph, model.poisoned = True, True
    model.zero_grad(set_to_none=True)
    assert model.poisoned
    model.kept_graph = False
    model.zero_grad(set_to_none=True)
    assert not model.poisoned


@settings(max_examples=1, database=None, deadline=None)
@given(st.none())  # a machine's steps record Hypothesis events: they run inside a test
def test_held_graph_steps_stay_judged_on_the_reference(_: None) -> None:
    """Rule: on the reference, keeping a graph, a refused swapping conversion, a swapping load
    and releasing the graph are each judged and pass (the machine raises on a violation)."""
    machine = SequenceMachine.for_target(builtin_target("reference"), STATE)()
    machine.build(build_tree(LINEAR), (X,), [DOUBLE])
    machine.keep_graph()
    assert machine.kept is not None and machine.model.kept_graph
    weight = machine.module[1].weight
    machine.convert(_Scripted(DOUBLE), FlagSetting(overwrite=False, swap=True))
    assert machine.module[1].weight is weight and weight.dtype == torch.float32
    machine.load_state_dict(_Scripted(False, True, "other-values"))
    machine.keep_graph()
    assert machine.kept is None and not machine.model.kept_graph and machine.judged
