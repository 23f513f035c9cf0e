"""Unit tests for the layout conversions of convolution weights: the reference's
``convert_conv2d_weight_memory_format``/``convert_conv3d_weight_memory_format``, the calls
``APPLY-CONV-MEMORY-FORMAT`` draws (``strategies.memory_formats``), the trees' ``conv2d``/``conv3d``
needs and torch's declared deviation (``properties.declarations.torch_memory_format``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from torch import nn

from swapspec import reference
from swapspec.properties.declarations.torch_memory_format import layout_lost_on_wrapper
from swapspec.properties.models.examples import Example
from swapspec.properties.rules.test_apply_memory_format import conv_weights, laid_out
from swapspec.strategies import module_trees
from swapspec.strategies.conversions import CONVERSIONS
from swapspec.strategies.memory_formats import ConvFormat, conv_formats
from tests.helpers_modules import assert_unchanged, fill_grads, snapshot
from tests.helpers_old_style import two_tensor

CL, CL3, CONTIGUOUS = torch.channels_last, torch.channels_last_3d, torch.contiguous_format


def convolutions(seed: int = 0) -> nn.Module:
    """A linear layer beside a 2-D convolution, a transposed one and a 3-D convolution."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 3), nn.Conv2d(2, 3, 3), nn.ConvTranspose2d(3, 2, 2),
                         nn.Conv3d(2, 2, 2))


@pytest.mark.parametrize(("rank", "memory_format"), [(2, CL), (2, CONTIGUOUS), (3, CL3)])
@pytest.mark.parametrize("wrap", [False, True], ids=["plain", "two-tensor"])
def test_reference_lays_out_every_weight_of_its_rank_and_keeps_the_rest(rank, memory_format, wrap):
    module = convolutions()
    if wrap:
        module._apply(two_tensor)
    fill_grads(module)
    weights = conv_weights(module, rank)
    before = {n: (t, t.grad, t.detach().clone(), t.stride()) for n, t in module.named_parameters()}
    getattr(reference, ConvFormat(rank, memory_format).method)(module, memory_format)
    for name, t in module.named_parameters():
        obj, grad, value, stride = before[name]
        assert t is obj and t.grad is grad and torch.equal(t.detach(), value), name
        assert laid_out(t, memory_format) if id(t) in weights else t.stride() == stride, name


@pytest.mark.parametrize(("rank", "memory_format"), [(2, CL3), (3, CL), (2, torch.preserve_format),
                                                     (3, torch.preserve_format)])
def test_reference_refuses_a_format_its_weights_cannot_take_and_changes_nothing(rank, memory_format):
    module = convolutions()
    before = snapshot(module)
    with pytest.raises(RuntimeError):
        getattr(reference, ConvFormat(rank, memory_format).method)(module, memory_format)
    assert_unchanged(before, module)


def test_reference_refuses_a_sparse_weight_before_it_lays_out_any_other():
    module = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Conv2d(3, 3, 3))
    module[1]._apply(lambda t: t.to_sparse())
    strides = module[0].weight.stride()
    with pytest.raises(RuntimeError):
        reference.convert_conv2d_weight_memory_format(module, CL)
    assert module[0].weight.stride() == strides


def test_torch_lays_out_a_plain_weight_before_it_refuses_a_sparse_one():
    """torch converts the convolutions one by one: the refusal comes after the first wrote."""
    module = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Conv2d(3, 3, 3))
    module[1]._apply(lambda t: t.to_sparse())
    with pytest.raises(RuntimeError):
        torch.nn.utils.convert_conv2d_weight_memory_format(module, CL)
    assert module[0].weight.is_contiguous(memory_format=CL)


@pytest.mark.parametrize(("rank", "memory_format"), [(2, CL), (3, CL3)])
def test_reference_matches_torch_on_plain_modules(rank, memory_format):
    ours, theirs = convolutions(), convolutions()
    method = ConvFormat(rank, memory_format).method
    getattr(reference, method)(ours, memory_format)
    getattr(torch.nn.utils, method)(theirs, memory_format)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert a.stride() == b.stride() and torch.equal(a, b), name


def test_every_call_is_drawn():
    seen: set[ConvFormat] = set()

    @settings(max_examples=200, database=None, deadline=None)
    @given(conv_formats())
    def collect(call):
        seen.add(call)

    collect()
    assert {(c.rank, c.fits) for c in seen} == {(2, True), (2, False), (3, True), (3, False)}
    assert len(seen) == 8


@pytest.mark.parametrize("rank", [2, 3])
def test_every_tree_drawn_with_the_need_has_a_convolution_of_its_rank(rank):
    @settings(max_examples=25, database=None, deadline=None)
    @given(module_trees(needs=(f"conv{rank}d",), lazy=False))
    def check(module):
        assert conv_weights(module, rank)

    check()


def test_torchs_conversion_loses_the_layout_on_a_wrapper_subclass():
    """The behaviour ``torch.conv-memory-format-lost-on-wrapper`` declares: fails once torch
    lays out the inner tensors."""
    module = nn.Conv2d(2, 3, 3)
    module._apply(two_tensor)
    torch.nn.utils.convert_conv2d_weight_memory_format(module, CL)
    assert module.weight.is_contiguous(memory_format=CL)
    assert not module.weight.a.is_contiguous(memory_format=CL)


@pytest.mark.parametrize(("call", "conversion", "applies"), [
    (ConvFormat(2, CL), "TwoTensor", True),
    (ConvFormat(2, CONTIGUOUS), "TwoTensor", False),
    (ConvFormat(2, CL3), "TwoTensor", False),
    (ConvFormat(2, CL), "double()", False),
    (ConvFormat(3, CL3), "TwoTensor", True),
])
def test_the_declared_deviation_applies_where_the_layout_is_lost(call, conversion, applies):
    example = Example(convolutions(), conversion=next(c for c in CONVERSIONS if c.name == conversion),
                      method=call)
    assert layout_lost_on_wrapper(example) is applies
