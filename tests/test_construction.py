"""The reference's ``skip_init`` (rule 8 of ``reference/methods.py``), the construction strategy
and the helpers of ``properties/rules/test_construction.py``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from torch import nn

from swapspec import reference
from swapspec.properties.harness.targets import builtin_target
from swapspec.properties.rules.test_construction import (
    copy_values,
    eval_forward,
    plain_build,
    same_output,
    tensor_table,
    uninitialized_build,
)
from swapspec.reference.methods import Methods
from swapspec.strategies import FlagSetting
from swapspec.strategies.constructions import (
    Construction,
    accepts_device,
    constructions,
    default_dtype,
)


@pytest.mark.parametrize("swap", [False, True])
def test_skip_init_builds_on_meta_then_empties_on_the_device(swap):
    seen = []
    methods = Methods(lambda m, fn, **kw: (seen.append(next(m.parameters()).device.type),
                                           reference.apply(m, fn, **kw))[1])
    module = methods.skip_init(nn.Linear, 3, 4, bias=False, swap=swap, overwrite=False)
    assert seen == ["meta"]
    assert type(module) is nn.Linear and module.weight.shape == (4, 3)
    assert module.weight.device.type == "cpu" and module.bias is None


def test_skip_init_takes_the_device_from_the_keywords():
    assert reference.skip_init(nn.Linear, 2, 2, device="meta").weight.is_meta


def test_skip_init_uses_the_default_dtype():
    with default_dtype(torch.float64):
        assert reference.skip_init(nn.Linear, 2, 2).weight.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("cls, message", [
    (dict, "Expected a Module"),
    (nn.LSTM, "must support a 'device' arg"),
])
def test_skip_init_refuses_before_it_builds(cls, message):
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match=message):
        reference.skip_init(cls, 2, 2)
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_refused_classes_are_refused_by_torch_too():
    """The spec's refusals are torch's documented ones (rule 8)."""
    for cls in (dict, nn.LSTM):
        with pytest.raises(RuntimeError):
            torch.nn.utils.skip_init(cls, 2, 2)


def test_accepts_device_reads_the_signature():
    assert accepts_device("nn.Linear")
    assert not accepts_device("nn.LSTM")


@settings(max_examples=20, deadline=None)
@given(constructions(refused=True))
def test_refused_constructions_never_take_the_default_device_path(build):
    assert build.path == "skip_init" and build.refused in ("no-device-arg", "not-a-module")


@pytest.mark.parametrize("path", ["skip_init", "default-device"])
def test_an_uninitialized_build_given_the_plain_values_computes_the_same(path):
    build = Construction("nn.Linear", path=path)
    plain = plain_build(build)
    module = uninitialized_build(builtin_target("reference"), build, FlagSetting(False, True))
    assert tensor_table(module) == tensor_table(plain)
    copy_values(plain, module)
    assert same_output(eval_forward(module, build), eval_forward(plain, build))


def test_tensor_table_sees_a_tensor_left_on_meta():
    build = Construction("nn.Linear")
    with torch.device("meta"):
        module = plain_build(build)
    assert tensor_table(module) != tensor_table(plain_build(build))


def test_same_output_compares_values_and_structure():
    a = torch.ones(2)
    assert same_output((a, None), (a.clone(), None))
    assert not same_output(a, a + 1e-3)
    assert not same_output((a,), (a, a))
    assert not same_output(a, a.double())
