"""The model's tie, untie and vmap rules (``ModuleModel.tie``, ``untie``, ``vmap_call``)
predict what plain torch does to a module, slot by slot (checked with the sequences' own
``check_state``), and the sequence machine's steps stay judged where torch deviates."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from swapspec import reference
from swapspec.properties.harness.targets import builtin_target
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.models.examples import named_tensors
from swapspec.properties.models.module_model import LR, UNNAMED, ModuleModel
from swapspec.properties.rules.sequence_machine import (
    STATE,
    SequenceMachine,
    check_state,
    count_hooks,
    load_value,
    own_copy,
    run_backward,
    shifted,
    slot_owner,
)
from swapspec.strategies import build_tree, tree_info
from swapspec.strategies.decorations import DecorationSpec
from swapspec.strategies.trees import (
    ContainerSpec,
    LeafSpec,
    ShareSpec,
    TensorSpec,
    TieSpec,
    TreeSpec,
)
from tests.test_module_model_load import _Collected

X = torch.ones(2, 4)
LEAF = LeafSpec(tensors=(TensorSpec(name="p0", tagged=True), TensorSpec(name="p1"),
                         TensorSpec(name="b0", buffer=True), TensorSpec(name="b1", buffer=True)))
FLAT = TreeSpec(root=LEAF)
TIED = TreeSpec(root=LEAF, ties=(TieSpec(slots=(("", "p0"), ("", "p1"))),))
SHARED = TreeSpec(root=ContainerSpec(children=(LEAF, LeafSpec(tensors=(TensorSpec(name="p0"),)))),
                  shares=(ShareSpec(source="0", parent="", name="2"),))


def _both(spec: TreeSpec) -> tuple[ModuleModel, nn.Module]:
    module = build_tree(spec)
    return ModuleModel.observe(module, tree_info(module).spec), module


def _tie(model: ModuleModel, module: nn.Module, slot: str, source: str) -> None:
    names = next(g for g in model.slot_groups() if slot in g)
    owner, key = slot_owner(module, slot)
    setattr(owner, key, named_tensors(module)[source])
    model.tie(names, model.slots[source])


def _untie(model: ModuleModel, module: nn.Module, slot: str) -> None:
    names = next(g for g in model.slot_groups() if slot in g)
    owner, key = slot_owner(module, slot)
    setattr(owner, key, own_copy(getattr(owner, key), buffer=key in owner._buffers))
    model.untie(names)


def _violations(model: ModuleModel, module: nn.Module, step: str = "tie") -> list[str]:
    check = _Collected()
    check_state(check, model, module, step)
    model.adopt(module)
    return [v.message for v in check.violations]


def _forward_agrees(model: ModuleModel, module: nn.Module) -> bool:
    with torch.no_grad():
        return torch.equal(module(X.clone()), model.forward(X).result)


def test_tie_points_a_slot_at_another_tensor() -> None:
    """Rule: after a tie both names hold one object (the source's, with its class and
    attributes); the slot's old tensor, left with no name, is no longer checked."""
    model, module = _both(FLAT)
    source = module.p0
    _tie(model, module, "p1", "p0")
    _tie(model, module, "b1", "b0")
    assert module.p1 is source and len(model.tensors) == 2
    assert model.slots["p0"] == model.slots["p1"] and model.slots["b0"] == model.slots["b1"]
    assert not _violations(model, module)
    assert _forward_agrees(model, module)


def test_tie_choices_match_kind_dtype_and_shape() -> None:
    """Rule: a tie joins a parameter slot to a parameter and a buffer slot to a buffer, never
    to the tensor it already holds; a slot of another dtype or shape has no partner."""
    spec = TreeSpec(root=LeafSpec(tensors=(TensorSpec(name="p0"), TensorSpec(name="p1", shape=(3,)),
                                           TensorSpec(name="b0", buffer=True))))
    model, _ = _both(spec)
    assert model.tie_choices() == [] and model.untie_choices() == []
    model, _ = _both(FLAT)
    pairs = {(names[0], model.tensors[j].names[0]) for names, j in model.tie_choices()}
    assert pairs == {("p0", "p1"), ("p1", "p0"), ("b0", "b1"), ("b1", "b0")}


def test_tie_keeps_hooks_and_optimizer_with_their_objects() -> None:
    """Rule: a re-pointed slot's old tensor keeps its hooks, which a backward no longer
    fires, and its optimizer entry, which is no longer checked (``UNNAMED``); the source's
    hooks fire once per backward for all its names."""
    model, module = _both(FLAT)
    fired: Counter = Counter()
    for key, name in (("h0", "p0"), ("h1", "p1")):
        count_hooks(named_tensors(module)[name], key, fired)
        model.add_hooks(model.slots[name], key)
    model.build_optimizer([model.slots["p0"], model.slots["p1"]])
    _tie(model, module, "p1", "p0")
    assert model.optimizer == [model.slots["p0"], UNNAMED]
    model.forward(X, backward="plain")
    run_backward(module, X, create_graph=False)
    assert {h.key: h.fired for h in model.hooks} == {k: fired[k] for k in (
        "h0:hook", "h0:post-accumulate", "h1:hook", "h1:post-accumulate")}
    assert fired["h0:hook"] == 1 and fired["h1:hook"] == 0
    assert not _violations(model, module, "backward")


def test_untie_gives_one_slot_its_own_copy() -> None:
    """Rule: an untied slot holds a new plain ``nn.Parameter`` of the same values and
    ``requires_grad``, without attributes or grad, in no optimizer; the tensor keeps its
    other names, object, grad and optimizer entry."""
    model, module = _both(TIED)
    tied = module.p0
    tied.grad = torch.ones(4)
    model.tensors[model.slots["p0"]].grad = torch.ones(4)
    model.build_optimizer([model.slots["p0"]])
    _untie(model, module, "p1")
    assert module.p0 is tied and module.p1 is not tied and type(module.p1) is nn.Parameter
    assert model.slots["p0"] != model.slots["p1"] and model.tensors[model.slots["p1"]].grad is None
    assert model.optimizer == [model.slots["p0"]]
    assert not _violations(model, module, "untie")
    assert _forward_agrees(model, module)


def test_a_shared_submodule_slot_is_one_slot() -> None:
    """Rule: a shared submodule's paths are the names of one slot: a tie re-points them all,
    and no untie splits them (they are one (module, key))."""
    model, module = _both(SHARED)
    assert ("0.p1", "2.p1") in model.slot_groups()
    assert ("0.p1", "2.p1") not in model.untie_choices()
    _tie(model, module, "0.p1", "1.p0")
    assert model.tensors[model.slots["1.p0"]].names == ("1.p0", "0.p1", "2.p1")
    assert not _violations(model, module)
    _untie(model, module, "2.p1")
    assert model.tensors[model.slots["0.p1"]].names == ("0.p1", "2.p1")
    assert not _violations(model, module, "untie")
    assert _forward_agrees(model, module)


def _stacked_call(model: ModuleModel, module: nn.Module, shifts: list[int]) -> tuple[Any, Any]:
    copies = [{i: shifted(t.value, k) for i, t in enumerate(model.tensors)} for k in shifts]
    given = {t.names[0]: torch.stack([c[i] for c in copies]) for i, t in enumerate(model.tensors)}
    fc = builtin_target("reference").functional_call
    try:
        out = torch.func.vmap(lambda p, x: fc(module, p, (x,), {}), in_dims=(0, None))(given, X)
    except RuntimeError as e:
        out = e
    return model.vmap_call(X, copies), out, copies


def test_vmap_call_is_the_stack_of_per_copy_forwards() -> None:
    """Rule: a vmapped call returns what the model's own vmap over its copies does, which is
    (to rounding) the stack of one forward per copy, and leaves the module as it was."""
    spec = TreeSpec(root=ContainerSpec(children=(LEAF, LeafSpec(kind="Linear"),
                                                 LeafSpec(kind="BatchNorm1d"))),
                    ties=(TieSpec(slots=(("0", "p0"), ("0", "p1"))),))
    model, module = _both(spec)
    prediction, out, copies = _stacked_call(model, module, [0, 1, 2])
    assert torch.equal(out, prediction.result)
    per_copy = []
    for copy in copies:
        fresh, _ = model.fresh()
        with torch.no_grad():
            per_copy.append(torch.func.functional_call(
                fresh, {t.names[0]: copy[i] for i, t in enumerate(model.tensors)}, (X,)))
    torch.testing.assert_close(prediction.result, torch.stack(per_copy))
    assert not _violations(model, module, "vmap")


def test_vmap_call_predicts_the_error_of_a_module_vmap_cannot_run() -> None:
    """Rule: where vmap cannot run the module (spectral_norm's power iteration writes into its
    buffers with ``out=``), the prediction is that error type, and the module is unchanged."""
    spec = TreeSpec(root=LeafSpec(kind="Linear"),
                    decorations=(DecorationSpec("spectral_norm", "", "weight"),))
    model, module = _both(spec)
    prediction, out, _ = _stacked_call(model, module, [0, 1])
    assert prediction.error is RuntimeError and isinstance(out, RuntimeError)
    assert not _violations(model, module, "vmap")


class _Scripted:
    """A stand-in for ``st.data()`` that returns scripted values in order."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any, label: str = "") -> Any:
        return self.values.pop(0)


@settings(max_examples=1, database=None, deadline=None)
@given(st.none())  # a machine's steps record Hypothesis events: they run inside a test
def test_a_vmap_step_leaving_an_escaped_tensor_stops_judging(_: None) -> None:
    """Rule: torch's functional_call puts a shared submodule's given tensor back last
    (declared: ``swaps_one_slot_twice``); under vmap that is an escaped batched tensor, which
    the step reports as the declared ``not-restored`` and after which nothing is judged."""
    machine = SequenceMachine.for_target(builtin_target("torch"), STATE)()
    machine.build(build_tree(SHARED), (X,), [conversion_named("double()")])
    machine.vmap(_Scripted([0, 1]))
    assert not machine.judged
    assert torch._C._functorch.is_batchedtensor(machine.module.get_submodule("0").p0)


GRAPH_TRAINED_NORM = TreeSpec(
    root=ContainerSpec(kind="Sequential",
                       children=(LeafSpec(), LeafSpec(kind="BatchNorm1d"), LeafSpec())),
    trained="backward-create-graph")


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_a_tie_dropping_a_graph_carrying_grad_lets_a_later_swap_be_refused(tie: bool) -> None:
    """Rule: a tensor that leaves the module while its grad carries an autograd graph (a
    ``backward(create_graph=True)``) keeps that graph alive, and it holds the batch norm's
    running stats, so after ``zero_grad`` a swapping load may still be refused: the model allows
    the refusal exactly then (``may_refuse``), and the reference refuses exactly then."""
    model, module = _both(GRAPH_TRAINED_NORM)
    if tie:
        _tie(model, module, "1.weight", "1.bias")
    module.zero_grad(set_to_none=False)
    model.zero_grad(set_to_none=False)
    state_dict = module.state_dict()
    values: dict[int, torch.Tensor] = {}
    for key in state_dict:
        index = model.slots[key]
        state_dict[key] = values.setdefault(
            index, load_value(model.tensors[index].value, "other-values"))
    prediction = model.load(values, assign=False, swap=True, own=False)
    try:
        reference.load_state_dict(module, state_dict, strict=True, swap=True)
        refused = False
    except RuntimeError as error:
        refused = "running_mean" in str(error)
    assert (prediction.may_refuse, refused) == (tie, tie)


def test_a_tie_split_by_a_call_is_a_slot_it_did_not_restore() -> None:
    """Rule: after a functional call a tie group whose names hold two objects breaks
    ``not-restored`` (FC-RESTORE's clause, which torch's shared-slot declaration names), after
    any other step ``parameter-tie-split``/``buffer-tie-split``."""
    for step, clause in (("functional_call", "not-restored"), ("tie", "buffer-tie-split")):
        model, module = _both(TreeSpec(root=LEAF, ties=(TieSpec(slots=(("", "b0"), ("", "b1"))),)))
        module.b1 = module.b1.clone()  # what torch's restore of a shared slot can leave
        check = _Collected()
        check_state(check, model, module, step)
        assert [v.clause for v in check.violations] == [clause], step


MIXED = TreeSpec(root=LEAF, ties=(TieSpec(slots=(("", "p1"), ("", "b0"))),))


def test_a_buffer_slot_holding_a_parameter_stays_a_buffer_slot() -> None:
    """Rule: a slot keeps its kind. A buffer slot that holds a parameter (``register_buffer``
    accepts one) is offered only plain tensors to tie to, and untied it gets a plain copy, in
    the buffer table; the parameter keeps its own slot."""
    model, module = _both(MIXED)
    assert module._buffers["b0"] is module.p1
    pairs = {(names[0], model.tensors[j].names[0]) for names, j in model.tie_choices()}
    assert ("b0", "b1") in pairs and not any(slot == "b0" and source.startswith("p")
                                             for slot, source in pairs)
    assert ("b0",) in model.untie_choices()
    _untie(model, module, "b0")
    assert type(module._buffers["b0"]) is torch.Tensor and "b0" not in module._parameters
    assert module.p1 is not module.b0 and torch.equal(module.p1.detach(), module.b0)
    assert not _violations(model, module, "untie")
    assert _forward_agrees(model, module)


def test_a_parameter_left_in_buffer_slots_only_is_no_parameter_of_the_module() -> None:
    """Rule: re-pointing a parameter slot away from a parameter a buffer slot also holds leaves
    that object in the buffer slot only: ``requires_grad_`` no longer reaches it (torch's
    ``parameters()`` does not list it), though it stays a ``Parameter``."""
    model, module = _both(MIXED)
    left = module.p1
    _tie(model, module, "p1", "p0")
    assert module._buffers["b0"] is left and left is not module.p1
    module.requires_grad_(False)
    model.requires_grad_(False)
    assert left.requires_grad and type(left) is nn.Parameter
    assert not _violations(model, module, "requires_grad_")


@pytest.mark.parametrize("persistent", [True, False])
def test_a_tie_into_a_buffer_slot_keeps_it_a_buffer_slot(persistent: bool) -> None:
    """The tie step gives a buffer slot a ``Parameter`` object (one left in buffer slots by an
    untie of its parameter slot) through ``register_buffer``: the slot stays a buffer of the
    same persistence, holding that object; its repro line does the same in plain torch."""
    from swapspec.properties.harness.sequence_repro import tie_lines
    from swapspec.properties.rules.sequence_machine import tie_slot

    def build() -> nn.Module:
        m = nn.Module()
        m.p = nn.Parameter(torch.ones(2))
        m.register_buffer("b", torch.zeros(2), persistent=persistent)
        return m

    ours, by_repro = build(), build()
    tie_slot(ours, "b", ours.p, persistent)
    (line,) = tie_lines(("b",), "p", persistent)
    named = lambda m: dict([*m.named_parameters(), *m.named_buffers()])  # noqa: E731
    exec(line, {"module": by_repro, "named": named})
    for m in (ours, by_repro):
        assert m.b is m.p and "b" in m._buffers and "b" not in m._parameters
        assert ("b" in m.state_dict()) == persistent


def test_a_parameter_left_in_buffer_slots_only_keeps_its_grad_for_the_optimizer() -> None:
    """Rule: a ``Parameter`` object an untie leaves in buffer slots only is still the object
    an optimizer holds, with its grad: a step updates the buffer slots, ``module.zero_grad``
    does not reach its grad, and a forward reads the updated values."""
    model, module = _both(MIXED)
    left = module.p1
    left.grad = torch.full_like(left, 0.5)
    model.tensors[model.slots["p1"]].grad = torch.full_like(left.detach(), 0.5)
    model.build_optimizer([model.slots["p1"]])
    opt = torch.optim.SGD([left], lr=LR, foreach=False)
    _untie(model, module, "p1")
    assert module._buffers["b0"] is left and module.p1 is not left
    assert _forward_agrees(model, module)
    opt.step()
    assert not model.optimizer_step().error
    assert torch.equal(model.tensors[model.slots["b0"]].value, module.b0.detach())
    assert _forward_agrees(model, module)
    module.zero_grad()
    model.zero_grad(set_to_none=True)
    assert left.grad is not None
    assert torch.equal(model.tensors[model.slots["b0"]].grad, left.grad)
