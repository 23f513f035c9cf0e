"""The parametrizations ``strategies.parametrizations`` draws, and the model of
``properties.models.parametrize_state``: good ones register (first or stacked) and read what the
model says; bad ones are refused by torch with a ValueError naming the problem."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import parametrize

from swapspec.properties.models.parametrize_state import layout, originals, registered_value
from swapspec.strategies.parametrizations import (
    BAD,
    BAD_WORDS,
    FIRST_ONLY,
    GOOD,
    MISSING_NAME,
    WRITES_BEFORE_CHECK,
    bad_registrations,
    good_parametrizations,
    make_parametrization,
)


def _linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("kind", GOOD)
def test_good_kinds_read_the_modelled_value(kind, stacked):
    if stacked and kind in FIRST_ONLY:
        pytest.skip(f"{kind} is drawn for first registrations only")
    m = _linear()
    if stacked:
        parametrize.register_parametrization(m, "weight", make_parametrization("negate"))
    value = m.weight.detach().clone()
    expected = registered_value(make_parametrization(kind), value, stacked=stacked)
    parametrize.register_parametrization(m, "weight", make_parametrization(kind))
    assert torch.allclose(m.weight.detach(), expected)
    assert len(originals(m, "weight")) == (2 if kind == "split-sum" else 1)
    assert layout(m)[""][2]["weight"][-1] == type(make_parametrization(kind)).__name__


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("kind", BAD)
def test_bad_kinds_are_refused_naming_the_problem(kind, stacked):
    if kind in (FIRST_ONLY if stacked else WRITES_BEFORE_CHECK):
        pytest.skip(f"{kind} is not drawn {'stacked' if stacked else 'first'}")
    m = _linear()
    if stacked:
        parametrize.register_parametrization(m, "weight", make_parametrization("negate"))
    name = MISSING_NAME if kind == "missing-name" else "weight"
    with pytest.raises(ValueError) as raised:
        parametrize.register_parametrization(m, name, make_parametrization(kind))
    assert BAD_WORDS[kind] in str(raised.value).lower()


@settings(max_examples=20, database=None)
@given(stacked=st.booleans(), data=st.data())
def test_draws_respect_first_only_kinds(stacked: bool, data: st.DataObject):
    kind = data.draw(good_parametrizations(stacked=stacked))
    registration = data.draw(bad_registrations(stacked=stacked))
    assert kind in GOOD and registration.kind in BAD and registration.stacked == stacked
    if stacked:
        assert kind not in FIRST_ONLY and registration.kind not in FIRST_ONLY
    else:
        assert registration.kind not in WRITES_BEFORE_CHECK
