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
    if stacked and kind in FIRST_ONLY:
        pytest.skip(f"{kind} is not drawn stacked (torch checks it on a first registration only)")
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


@pytest.mark.parametrize("kind", BAD)
def test_the_reference_refuses_a_first_registration_without_writing(kind):
    """Rule (reference rule 7): a first registration ``unsafe=False`` refuses raises torch's
    ``ValueError`` and leaves the tensor as it was (torch writes ``right_inverse``'s result into
    it before its forward checks: the torch declaration's case, ``inverse-shape``)."""
    from swapspec import reference

    m = _linear()
    before = m.weight.detach().clone()
    name = MISSING_NAME if kind == "missing-name" else "weight"
    with pytest.raises((ValueError, AttributeError)) as raised:
        reference.registration.register_parametrization(m, name, make_parametrization(kind))
    if kind != "missing-name":
        assert BAD_WORDS[kind] in str(raised.value).lower()
    assert not parametrize.is_parametrized(m) and torch.equal(m.weight, before)
    assert m.weight.shape == before.shape


def test_torch_writes_a_refused_first_registration_into_the_tensor():
    """The torch behaviour the declaration ``torch.parametrize.refused-first-writes`` names:
    ``inverse-shape`` refused, the weight already flattened."""
    m = _linear()
    before = m.weight.detach().clone()
    with pytest.raises(ValueError):
        parametrize.register_parametrization(m, "weight", make_parametrization("inverse-shape"))
    assert m.weight.shape != before.shape


def test_the_reference_refuses_on_a_wrapper_subclass_with_the_checks_error():
    """Rule (reference rule 7): on a traceable wrapper subclass the refusal is the checks'
    ``ValueError`` (torch raises ``swap_tensors``' ``RuntimeError``: the declaration
    ``torch.parametrize.refused-first-swap-refused``), and the tensor is left as it was."""
    from torch.testing._internal.two_tensor import TwoTensor

    from swapspec import reference

    m = _linear()
    m.weight = torch.nn.Parameter(TwoTensor(m.weight.detach(), m.weight.detach().clone()))
    before = m.weight
    with pytest.raises(ValueError, match="shape"):
        reference.registration.register_parametrization(m, "weight",
                                                        make_parametrization("inverse-shape"))
    assert m.weight is before and not parametrize.is_parametrized(m)
    with pytest.raises(RuntimeError, match="use_count"):
        parametrize.register_parametrization(m, "weight", make_parametrization("inverse-shape"))
