"""Unit tests for rule 6 of ``reference.functional_call``: a parametrized attribute given under its
own name reads the given value itself; ``parametrizations.<name>.original`` is the
parametrization's input."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from swapspec import reference
from tests.helpers_decorations import X, seeded
from tests.helpers_modules import (
    Boom,
    assert_unchanged,
    linear,
    randn,
    snapshot,
)


class Double(nn.Module):
    """A parametrization without ``right_inverse``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


class Negate(nn.Module):
    """A parametrization with ``right_inverse``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -x

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        return -x


PARAMETRIZE = {
    "custom": lambda m: parametrize.register_parametrization(m, "weight", Double()),
    "custom-inverse": lambda m: parametrize.register_parametrization(m, "weight", Negate()),
    "weight_norm": parametrizations.weight_norm,
    "spectral_norm": parametrizations.spectral_norm,
    "orthogonal": parametrizations.orthogonal,
}


ORIGINAL = "parametrizations.weight.original"


def parametrized(kind: str) -> nn.Linear:
    lin = linear(3, 3, seed=46)
    seeded(lambda: PARAMETRIZE[kind](lin))
    return lin


def record_reads(module: nn.Module) -> dict[str, object]:
    """A forward pre-hook (returning None) that records ``weight`` and ``named_parameters()``."""
    seen: dict[str, object] = {}

    def hook(mod: nn.Module, args: tuple) -> None:
        seen["weight"] = mod.weight
        seen["parameters"] = dict(mod.named_parameters())
        seen["extra"] = getattr(mod, "extra", None)

    module.register_forward_pre_hook(hook)
    return seen


def assert_read_given(seen: dict[str, object], v: torch.Tensor, bias: torch.Tensor) -> None:
    assert seen["weight"] is v
    assert list(seen["parameters"]) == ["bias", ORIGINAL]
    assert seen["parameters"]["bias"] is bias
    assert seen["parameters"][ORIGINAL] is v


parametrization_kinds = pytest.mark.parametrize("kind", PARAMETRIZE)


@parametrization_kinds
def test_parametrized_attribute_given_by_its_name_is_read_as_given(kind):
    """Rule 6: forward reads the given tensor itself, shown as ``parametrizations.weight.original``;
    rule 7: afterwards the same ParametrizationList, originals and buffers, unchanged."""
    m = parametrized(kind)
    plist = m.parametrizations.weight
    seen = record_reads(m)
    before = snapshot(m)
    v = randn(3, 3, seed=47)
    given = {"weight": v}
    out = reference.functional_call(m, given, (X,))
    assert_read_given(seen, v, m.bias)
    assert torch.equal(out, F.linear(X, v, m.bias))
    assert m.parametrizations.weight is plist
    assert_unchanged(before, m)
    assert list(given) == ["weight"]
    assert given["weight"] is v


@parametrization_kinds
def test_parametrized_attribute_given_none_is_read_as_none(kind):
    """Rule 6: ``None`` under the attribute's name: forward reads None (Linear then raises)."""
    m = parametrized(kind)
    plist = m.parametrizations.weight
    seen = record_reads(m)
    before = snapshot(m)
    given = {"weight": None}
    with pytest.raises(TypeError, match="must be Tensor, not NoneType"):
        reference.functional_call(m, given, (X,))
    assert seen["weight"] is None
    assert list(seen["parameters"]) == ["bias"]
    assert m.parametrizations.weight is plist
    assert_unchanged(before, m)
    assert given == {"weight": None}


@parametrization_kinds
def test_parametrization_original_given_is_the_parametrizations_input(kind):
    """Rule 6: values under ``parametrizations.weight.original*`` go through the parametrization."""
    m = parametrized(kind)
    twin = copy.deepcopy(m)
    plist = m.parametrizations.weight
    originals = dict(plist.named_parameters())
    values = {name: o.detach().clone() for name, o in originals.items()}
    given = {f"parametrizations.weight.{name}": randn(*o.shape, seed=48 + i)
             for i, (name, o) in enumerate(originals.items())}
    with torch.no_grad():
        for name, o in twin.parametrizations.weight.named_parameters():
            o.copy_(given[f"parametrizations.weight.{name}"])
    expected = twin.weight
    seen = record_reads(m)
    reference.functional_call(m, given, (X,))
    assert torch.equal(seen["weight"], expected)
    assert not torch.equal(seen["weight"], m.weight)
    assert m.parametrizations.weight is plist
    assert dict(plist.named_parameters()) == originals
    for name, o in plist.named_parameters():
        assert torch.equal(o, values[name])


@parametrization_kinds
def test_parametrized_attribute_of_a_nested_module_given_by_dotted_name(kind):
    """Rules 6 and 7 through a dotted name: ``0.weight`` of an ``nn.Sequential``."""
    inner = parametrized(kind)
    outer = nn.Sequential(inner)
    seen = record_reads(inner)
    before = snapshot(outer)
    v = randn(3, 3, seed=49)
    out = reference.functional_call(outer, {"0.weight": v}, (X,))
    assert_read_given(seen, v, inner.bias)
    assert torch.equal(out, F.linear(X, v, inner.bias))
    assert_unchanged(before, outer)


@parametrization_kinds
def test_parametrized_attribute_restored_when_forward_raises(kind):
    """Rule 7: forward raising still puts the ParametrizationList back."""
    m = parametrized(kind)
    plist = m.parametrizations.weight
    seen = record_reads(m)

    def boom(mod, args):
        raise Boom("forward failed")

    m.register_forward_pre_hook(boom)
    before = snapshot(m)
    v = randn(3, 3, seed=50)
    with pytest.raises(Boom):
        reference.functional_call(m, {"weight": v}, (X,))
    assert_read_given(seen, v, m.bias)
    assert m.parametrizations.weight is plist
    assert_unchanged(before, m)


def test_unknown_name_on_a_parametrized_module_is_a_temporary_attribute():
    """Rule 6: a name that is neither a slot nor parametrized stays a plain attribute for the
    call; the parametrization keeps working."""
    m = parametrized("custom")
    seen = record_reads(m)
    before = snapshot(m)
    extra = torch.ones(1)
    reference.functional_call(m, {"extra": extra}, (X,))
    assert seen["extra"] is extra
    assert torch.equal(seen["weight"], 2 * m.parametrizations.weight.original)
    assert "extra" not in m.__dict__
    assert_unchanged(before, m)


def test_non_tensor_attribute_of_a_parametrized_module_is_refused():
    """Rule 5: a parametrized module's non-tensor attribute cannot be given (torch's TypeError)."""
    m = parametrized("custom")
    m.foo = 1.5
    before = snapshot(m)
    with pytest.raises(TypeError, match=r"^attribute `foo`: 1\.5 is not an instance of torch\.Tensor$"):
        reference.functional_call(m, {"foo": torch.ones(1)}, (X,))
    assert_unchanged(before, m)
