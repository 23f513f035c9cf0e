"""The LOAD- properties' model of tied names (``properties.models.load_examples``) predicts what
``reference.load_state_dict``'s rule 6 does: a value that is the object's own data yields to a
tied name's other value, in either order; two genuine values that differ conflict. Also the
torch declarations built on it (checked against plain torch) and the spec's RNN swap rule."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn

from swapspec import reference
from swapspec.properties.declarations.torch_load_failures import (
    refused_on_a_succeeding_load,
    rnn_swap_refused,
)
from swapspec.properties.declarations.torch_load_objects import (
    assign_keeps_a_slot_given_itself,
    assign_keeps_tied_own_data,
)
from swapspec.properties.models.examples import Example, named_tensors
from swapspec.properties.models.load_examples import (
    conflicting_groups,
    expected_load_paths,
    key_model,
    loaded_values,
    spec_swap_refused,
)
from swapspec.strategies.state_dicts import LoadInput, swap_refused


@contextmanager
def torch_swap_flag(on: bool) -> Iterator[None]:
    saved = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(on)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(saved)


PATHS = list(itertools.product((False, True), (False, True)))  # (assign, swap)


def _tied() -> nn.Module:
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    m[1].weight = m[0].weight
    return m


def _given(m: nn.Module, own_key: str, other: torch.Tensor) -> dict[str, torch.Tensor]:
    """``m.state_dict()`` (own data for every key) with the tied key other than ``own_key``
    given ``other``."""
    sd = dict(m.state_dict())
    sd[({"0.weight", "1.weight"} - {own_key}).pop()] = other
    return sd


@pytest.mark.parametrize("own_key", ["0.weight", "1.weight"])
@pytest.mark.parametrize(("assign", "swap"), PATHS)
def test_own_data_yields_to_a_tied_names_value_in_either_order(own_key, assign, swap):
    m = _tied()
    new = torch.full((2, 2), 7.0)
    sd = _given(m, own_key, new)
    before = named_tensors(m)
    load = LoadInput(sd, True, assign, swap)
    assert conflicting_groups(m, sd) == []
    assert not key_model(m, sd).fails(True)
    loaded = loaded_values(before, sd)
    assert loaded["0.weight"] is new and loaded["1.weight"] is new
    path = "swap" if swap else "assign" if assign else "copy"
    assert expected_load_paths(before, load) == {"0.weight": path, "0.bias": "kept" if assign
                                                 else path, "1.bias": "kept" if assign else path}
    reference.load_state_dict(m, sd, assign=assign, swap=swap)
    assert m[0].weight is m[1].weight
    assert torch.equal(m[0].weight.detach(), new)


@pytest.mark.parametrize(("assign", "swap"), PATHS)
def test_every_key_giving_own_data_loads_from_the_first_and_keeps_with_assign(assign, swap):
    m = _tied()
    w, sd = m[0].weight, dict(m.state_dict())
    before = named_tensors(m)
    assert loaded_values(before, sd)["1.weight"] is sd["0.weight"]
    paths = expected_load_paths(before, LoadInput(sd, True, assign, swap))
    assert paths["0.weight"] == ("kept" if assign else "swap" if swap else "copy")
    cdata = w._cdata
    reference.load_state_dict(m, sd, assign=assign, swap=swap)
    assert m[0].weight is w and m[1].weight is w
    assert (w._cdata == cdata) == (assign or not swap)


@pytest.mark.parametrize(("assign", "swap"), PATHS)
def test_two_genuine_values_that_differ_conflict_and_change_nothing(assign, swap):
    m = _tied()
    sd = dict(m.state_dict())
    sd["0.weight"], sd["1.weight"] = torch.zeros(2, 2), torch.ones(2, 2)
    assert conflicting_groups(m, sd) == [["0.weight", "1.weight"]]
    assert key_model(m, sd).fails(False)
    w, old = m[0].weight, m[0].weight.detach().clone()
    with pytest.raises(RuntimeError, match=re.escape('tied names "0.weight" and "1.weight"')):
        reference.load_state_dict(m, sd, strict=False, assign=assign, swap=swap)
    assert m[0].weight is w and m[1].weight is w and torch.equal(w.detach(), old)


def test_own_data_between_two_genuine_values_that_differ_still_conflicts():
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    m[1].weight = m[2].weight = m[0].weight
    sd = dict(m.state_dict())
    sd["0.weight"], sd["2.weight"] = torch.zeros(2, 2), torch.ones(2, 2)  # 1.weight: own data
    assert conflicting_groups(m, sd) == [["0.weight", "1.weight", "2.weight"]]
    with pytest.raises(RuntimeError, match=re.escape('tied names "0.weight" and "2.weight"')):
        reference.load_state_dict(m, sd)


def test_a_value_a_class_puts_in_is_not_given_own_data():
    """A batch norm's absent ``num_batches_tracked`` is filled with the buffer itself; the
    reference tells own data by the given values, so it conflicts with a tied key's value."""
    m = nn.Sequential(nn.BatchNorm1d(2), nn.BatchNorm1d(2))
    m[1].num_batches_tracked = m[0].num_batches_tracked
    sd = dict(m.state_dict())  # no _metadata: the batch norms fill the absent key
    del sd["0.num_batches_tracked"]
    sd["1.num_batches_tracked"] = torch.tensor(5)
    assert key_model(m, sd).conflicts == [["0.num_batches_tracked", "1.num_batches_tracked"]]
    with pytest.raises(RuntimeError, match="tied names"):
        reference.load_state_dict(m, sd, strict=False)


def test_the_spec_swaps_an_rnn_that_swap_tensors_refuses():
    m = nn.LSTM(3, 4)
    assert swap_refused(m) and not spec_swap_refused(m)
    sd = {k: v + 1 for k, v in m.state_dict().items()}
    example = Example(m, load=LoadInput(sd, True, False, True))
    assert rnn_swap_refused(example) and not refused_on_a_succeeding_load(example)
    assert not rnn_swap_refused(Example(m, load=LoadInput(sd, True, False, False)))
    with torch_swap_flag(True), pytest.raises(RuntimeError, match="weakref"):
        m.load_state_dict(sd)
    w = m.weight_ih_l0
    reference.load_state_dict(m, sd, swap=True)
    assert m.weight_ih_l0 is w and torch.equal(w.detach(), sd["weight_ih_l0"])


@pytest.mark.parametrize("itself", [False, True])
@pytest.mark.parametrize("own_key", ["0.weight", "1.weight"])
@pytest.mark.parametrize(("assign", "swap"), PATHS)
def test_assign_keeps_tied_own_data_predicts_torch(own_key, assign, swap, itself):
    """The declaration holds exactly where torch leaves some name of the tie without the value
    the spec loads: with ``assign``, without the swap flag in either order, under it where
    state_dict()'s alias comes last (the parameter itself, swapped with itself, keeps what the
    swap before put in)."""
    m = _tied()
    new = torch.full((2, 2), 7.0)
    sd = _given(m, own_key, new)
    if itself:
        sd[own_key] = m[0].weight
    declared = assign_keeps_tied_own_data(Example(m, load=LoadInput(sd, True, assign, swap)))
    assert declared == (assign and (not swap or (own_key == "1.weight" and not itself)))
    with torch_swap_flag(swap):
        m.load_state_dict(sd, assign=assign)
    held = all(torch.equal(w.detach(), new) for w in (m[0].weight, m[1].weight))
    assert held != declared


@pytest.mark.parametrize(("assign", "swap"), PATHS)
def test_assign_keeps_a_slot_given_itself_predicts_torch(assign, swap):
    """Declared only with assign and no swap flag, where torch's first slot keeps its object."""
    m = _tied()
    w = m[0].weight
    sd = dict(m.state_dict())
    sd["0.weight"], sd["1.weight"] = w, w.detach().clone()
    declared = assign_keeps_a_slot_given_itself(Example(m, load=LoadInput(sd, True, assign, swap)))
    assert declared == (assign and not swap)
    with torch_swap_flag(swap):
        m.load_state_dict(sd, assign=assign)
    if declared:  # the spec's path is assign (another object); torch leaves w in the slot
        assert m[0].weight is w and m[1].weight is not w


@pytest.mark.parametrize(("assign", "swap"), PATHS)
def test_assign_leaves_an_unwritten_tied_slot_with_the_old_object(assign, swap):
    """A non-persistent buffer tied to a persistent one: no key writes its slot, so torch's
    assign without the swap flag leaves the old object (and values) there."""
    m = nn.Module()
    m.register_buffer("b0", torch.zeros(2))
    m.register_buffer("b2", m.b0, persistent=False)
    sd = {"b0": torch.ones(2)}
    declared = assign_keeps_tied_own_data(Example(m, load=LoadInput(sd, True, assign, swap)))
    assert declared == (assign and not swap)
    with torch_swap_flag(swap):
        m.load_state_dict(sd, assign=assign)
    assert torch.equal(m.b2, sd["b0"]) != declared
