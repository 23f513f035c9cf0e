"""The model's load rule (``ModuleModel.load``) predicts what ``reference.load_state_dict``
does, path by path, slot by slot (checked with the sequences' own ``check_state``)."""

from __future__ import annotations

import itertools

import pytest
import torch

from swapspec import reference
from swapspec.properties.models.module_model import ModuleModel
from swapspec.properties.rules.sequence_machine import check_state, load_value
from swapspec.properties.vocabulary import Violation
from swapspec.strategies import TaggedParameter, build_tree, tree_info
from swapspec.strategies.trees import LeafSpec, TensorSpec, TreeSpec

SPEC = TreeSpec(root=LeafSpec(tensors=(TensorSpec(name="p0", grad=True, tagged=True),
                                       TensorSpec(name="p1"),
                                       TensorSpec(name="b0", buffer=True))))


class _Collected:
    """Collects the violations ``check_state`` reports."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []

    def that(self, holds: bool, clause: str, message: str, code: str) -> bool:
        if not holds:
            self.violations.append(Violation(clause, message, code))
        return bool(holds)


def _load_both(kind: str, assign: bool, swap: bool) -> tuple[ModuleModel, torch.nn.Module]:
    module = build_tree(SPEC)
    model = ModuleModel.observe(module, tree_info(module).spec)
    state_dict = module.state_dict()
    values = {}
    for key in list(state_dict):
        index = model.slots[key]
        values[index] = state_dict[key] if kind == "own" else load_value(
            model.tensors[index].value, kind)
        state_dict[key] = values[index]
    prediction = model.load(values, assign=assign, swap=swap, own=kind == "own")
    assert prediction.error is None
    reference.load_state_dict(module, state_dict, strict=True, assign=assign, swap=swap)
    return model, module


@pytest.mark.parametrize(("kind", "assign", "swap"), list(itertools.product(
    ("other-values", "float64", "own"), (False, True), (False, True))))
def test_model_load_matches_the_reference(kind: str, assign: bool, swap: bool) -> None:
    """Rule: after a load, the module the reference loaded matches the model slot by slot."""
    model, module = _load_both(kind, assign, swap)
    check = _Collected()
    check_state(check, model, module, "load_state_dict")
    assert not check.violations, [v.message for v in check.violations]


def test_model_load_predicts_what_each_path_does_to_a_tagged_parameter() -> None:
    """Rule: copy and swap keep the object, its class and grad; assign puts in a new plain
    Parameter without grad; swap with assign makes the class Parameter and keeps the grad,
    in the value's dtype."""
    outcomes = {}
    for assign, swap in itertools.product((False, True), repeat=2):
        model, _ = _load_both("float64", assign, swap)
        state = model.tensors[model.slots["p0"]]
        outcomes[assign, swap] = (state.obj is not None, state.cls, state.grad is not None,
                                  state.value.dtype)
    assert outcomes == {
        (False, False): (True, TaggedParameter, True, torch.float32),
        (True, False): (False, torch.nn.Parameter, False, torch.float64),
        (False, True): (True, TaggedParameter, True, torch.float32),
        (True, True): (True, torch.nn.Parameter, True, torch.float64),
    }


def test_the_class_a_load_predicts_is_the_class_nn_parameter_gives() -> None:
    """Rule: ``nn.Parameter(value)`` is an ``nn.Parameter`` for a plain tensor or a parameter,
    and keeps a tensor subclass's own class (flagged ``_is_param``), as a load that assigns or
    swaps in a quantized weight leaves it."""
    from torch.testing._internal.two_tensor import TwoTensor

    from swapspec.properties.models.module_model import parameter_class
    from tests.planted.quantized import QLinear

    plain = torch.ones(2)
    for value in (plain, torch.nn.Parameter(plain), TwoTensor(plain, plain.clone()),
                  QLinear().weight.detach()):
        assert parameter_class(value) is type(torch.nn.Parameter(value)), type(value)
