"""The construction strategy and the helpers of ``properties/rules/test_construction.py`` (the
reference's ``skip_init`` itself: ``tests/test_reference_skip_init.py``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from swapspec.properties.harness.targets import builtin_target
from swapspec.properties.rules.test_construction import (
    copy_values,
    eval_forward,
    plain_build,
    same_output,
    tensor_table,
    uninitialized_build,
)
from swapspec.strategies import FlagSetting
from swapspec.strategies.constructions import (
    Construction,
    accepts_device,
    constructions,
)


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
