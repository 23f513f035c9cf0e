"""Tests of ``strategies.checkpoints`` and of the checkpoint properties' helpers."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from torch import nn

from swapspec.properties.declarations.torch_checkpoint import extra_state_before_unexpected_key
from swapspec.properties.models.examples import Example
from swapspec.properties.rules.test_checkpoint import (
    _expected_entries,
    _flat_weights_are_parameters,
    _value_code,
    legacy_state,
)
from swapspec.strategies import tree_info
from swapspec.strategies.checkpoints import ExtraState, extra_states, rnn_trees, rnn_variants
from swapspec.strategies.state_dicts import LoadInput


def test_rnn_variants_cover_the_three_recurrent_classes():
    entries = {entry for entry, _ in rnn_variants()}
    assert entries == {"nn.RNN", "nn.GRU", "nn.LSTM"}


@settings(max_examples=10, deadline=None)
@given(module=rnn_trees())
def test_rnn_trees_hold_one_rnn_whose_flat_weights_are_its_parameters(module):
    rnns = [m for m in module.modules() if isinstance(m, nn.RNNBase)]
    assert len(rnns) == 1
    assert _flat_weights_are_parameters(rnns[0])
    rebuilt = tree_info(module).build()
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), rebuilt.parameters(),
                                                 strict=True))


def test_flat_weights_check_sees_a_stale_flat_weight():
    rnn = nn.RNN(2, 3)
    rnn.weight_ih_l0 = nn.Parameter(rnn.weight_ih_l0.detach().clone())  # setattr re-reads
    assert _flat_weights_are_parameters(rnn)
    rnn._flat_weights[0] = torch.zeros(3, 2)
    assert not _flat_weights_are_parameters(rnn)


def test_legacy_state_takes_torch_through_its_pre_1_8_branch():
    rnn = nn.LSTM(2, 3, num_layers=2, bidirectional=True)
    state = legacy_state(rnn)
    assert "proj_size" not in state and not isinstance(state["all_weights"][0][0], str)
    restored = nn.LSTM.__new__(nn.LSTM)
    restored.__setstate__(state)
    assert restored.proj_size == 0
    assert restored._flat_weights_names == rnn._flat_weights_names
    assert _flat_weights_are_parameters(restored)


def test_extra_state_module_records_what_it_receives():
    m = ExtraState("a")
    assert m.state_dict() == {"_extra_state": "a"}
    m.load_state_dict({"_extra_state": "b"})
    assert m.received == ["b"] and m.state == "b"


@settings(max_examples=20, deadline=None)
@given(value=extra_states())
def test_extra_states_survive_deepcopy(value):
    copied = copy.deepcopy(value)
    assert type(copied) is type(value)


def test_expected_entries_leave_out_none_and_non_persistent_slots_and_repeat_shared_paths():
    leaf = nn.Linear(2, 2, bias=False)
    leaf.register_buffer("kept", torch.ones(1))
    leaf.register_buffer("dropped", torch.ones(1), persistent=False)
    root = nn.Sequential(leaf, leaf)
    assert sorted(_expected_entries(root, "p.")) == ["p.0.kept", "p.0.weight", "p.1.kept",
                                                     "p.1.weight"]
    assert sorted(_expected_entries(root, "p.")) == sorted(root.state_dict(prefix="p."))


@pytest.mark.parametrize(("keys", "strict", "applies"), [
    (("extra._extra_state", "tree._extra_state"), True, True),
    (("extra._extra_state", "tree._extra_state"), False, False),
    (("extra._extra_state",), True, False),
    (("tree._extra_state",), True, False),
])
def test_extra_state_declaration_covers_strict_loads_with_an_unexpected_key(keys, strict,
                                                                            applies):
    load = LoadInput(dict.fromkeys(keys, 1), strict, assign=False, swap=False)
    assert extra_state_before_unexpected_key(Example(nn.Linear(1, 1), load=load)) is applies


@pytest.mark.parametrize("value", [("given", torch.arange(2.0)), ("saved", {"a": 1}),
                                   ("given", "s"), ("saved", [1, 2])])
def test_value_code_evaluates_to_an_equal_value(value):
    back = eval(_value_code(value), {"torch": torch})
    assert type(back) is tuple and back[0] == value[0]
    if isinstance(value[1], torch.Tensor):
        assert torch.equal(back[1], value[1])
    else:
        assert back[1] == value[1]
