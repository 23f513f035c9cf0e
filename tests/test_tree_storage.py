"""The builder's storage layouts (``strategies/tree_storage.py``): parameters as slices of one flat
vector, buffers as views of one flat tensor; values, objects, ties and grads kept."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.testing._internal.two_tensor import TwoTensor

from swapspec.properties.models.examples import same_values
from swapspec.strategies.tree_parts import storage_of
from swapspec.strategies.tree_storage import STORAGES, share_storage
from swapspec.strategies.trees import (
    ContainerSpec,
    LeafSpec,
    TensorSpec,
    TieSpec,
    TreeSpec,
    build_tree,
    tree_info,
)

SPEC = TreeSpec(
    seed=3,
    root=ContainerSpec(children=(
        LeafSpec(tensors=(TensorSpec(name="p0", grad=True), TensorSpec(name="p1", dtype="float64"),
                          TensorSpec(name="b0", buffer=True),
                          TensorSpec(name="b1", dtype="int64", buffer=True))),
        LeafSpec(tensors=(TensorSpec(name="p0", shape=(2, 3)), TensorSpec(name="b0", buffer=True))),
        LeafSpec(tensors=(TensorSpec(name="p0"), TensorSpec(name="b0", buffer=True))),
    )),
    ties=(TieSpec(slots=(("0", "p0"), ("2", "p0"))), TieSpec(slots=(("0", "b0"), ("2", "b0")))),
)


def _laid_out(storage: str) -> tuple[nn.Module, nn.Module]:
    return build_tree(SPEC), build_tree(dataclasses.replace(SPEC, storage=storage))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_flat_parameters_share_one_storage_per_dtype_and_keep_everything_else():
    plain, flat = _laid_out("flat-parameters")
    assert _storage(flat[0].p0) == _storage(flat[1].p0) != _storage(flat[0].p1)
    assert _storage(flat[0].b0) != _storage(flat[1].b0)  # buffers keep their own
    assert flat[0].p0 is flat[2].p0  # the tie is one object still
    for (name, want), (_, got) in zip(plain.named_parameters(), flat.named_parameters(), strict=True):
        assert type(got) is nn.Parameter and got.requires_grad == want.requires_grad, name
        assert same_values(got.detach(), want.detach()), name
        assert (got.grad is None) == (want.grad is None), name
    assert same_values(flat[0].p0.grad, plain[0].p0.grad)
    assert tree_info(flat).features >= {"storage: flat-parameters"}


def test_view_buffers_are_views_of_a_table_each_and_ties_stay_one_object():
    plain, viewed = _laid_out("view-buffers")
    assert viewed[0].b0._base is not None and viewed[0].b1._base is not None
    assert viewed[0].b0._base.numel() == viewed[0].b0.numel() + 1
    assert _storage(viewed[0].b0) != _storage(viewed[1].b0)  # no version counter shared
    assert viewed[0].b0 is viewed[2].b0
    assert viewed[0].p0._base is None and _storage(viewed[0].p0) != _storage(viewed[1].p0)
    for (name, want), (_, got) in zip(plain.named_buffers(), viewed.named_buffers(), strict=True):
        assert same_values(got, want), name


@pytest.mark.parametrize("storage", STORAGES)
def test_slices_are_disjoint_so_writing_one_slot_changes_no_other(storage):
    _, module = _laid_out(storage)
    before = {n: t.detach().clone() for n, t in module.state_dict(keep_vars=True).items()}
    with torch.no_grad():
        module[1].p0.add_(1) if storage == "flat-parameters" else module[1].b0.add_(1)
    changed = {n for n, t in module.state_dict(keep_vars=True).items()
               if not same_values(t.detach(), before[n])}
    assert changed == ({"1.p0"} if storage == "flat-parameters" else {"1.b0"})


def test_meta_subclass_and_non_contiguous_tensors_keep_their_own_storage():
    module = nn.Module()
    module.a = nn.Parameter(torch.ones(2, device="meta"))
    module.b = nn.Parameter(TwoTensor(torch.ones(2), torch.ones(2)))
    module.register_buffer("c", torch.ones(2, 3).t())
    before = {n: (t, _layout(t)) for n, t in module.state_dict(keep_vars=True).items()}
    for storage in STORAGES:
        share_storage(module, storage)
    assert {n: (t, _layout(t)) for n, t in module.state_dict(keep_vars=True).items()} == before


def _layout(t: torch.Tensor) -> tuple:
    inner = [t.a, t.b] if isinstance(t, TwoTensor) else [] if t.is_meta else [t]
    return type(t), t.device, tuple(_storage(x) for x in inner), t._base is None


def test_an_unknown_storage_is_refused():
    with pytest.raises(ValueError, match="storage must be"):
        share_storage(nn.Linear(2, 2), "pinned")


def test_the_layout_is_read_off_the_seed_and_seed_zero_has_none():
    assert [storage_of(seed, 8) for seed in (0, 91, 92, 99, 192, 199)] == [
        "", "", STORAGES[0], STORAGES[0], STORAGES[1], STORAGES[1]]
    assert {storage_of(seed, 0) for seed in range(1000)} == {""}
    assert {storage_of(seed, 100) for seed in range(1000)} == set(STORAGES)
