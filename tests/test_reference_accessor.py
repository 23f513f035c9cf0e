"""The reference's ``NamedMemberAccessor``: a refused batched write leaves the tree as it was
(where torch's keeps its earlier writes: ``properties/declarations/torch_accessor.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swapspec.reference import NamedMemberAccessor


def _state(module: nn.Module) -> list[tuple]:
    return [(path, {k: id(v) for k, v in m.__dict__.items()},
             {k: id(v) for k, v in m._parameters.items()},
             {k: id(v) for k, v in m._buffers.items()})
            for path, m in module.named_modules(remove_duplicate=False)]


REFUSED = [
    ("set_tensors", lambda a: a.set_tensors(["0.weight", "training.x"],
                                            [torch.ones(2, 2), torch.ones(2)]), TypeError),
    ("swap_tensors", lambda a: a.swap_tensors(["0.weight", "nope"],
                                              [torch.ones(2, 2), torch.ones(2)]), AttributeError),
    ("set_tensors new attribute", lambda a: a.set_tensors(["0.fresh", "nope.x"],
                                                          [torch.ones(2), torch.ones(2)]),
     AttributeError),
    ("del_tensors", lambda a: a.del_tensors(["0.weight", "0.nope"]), AttributeError),
    ("set_tensors_dict", lambda a: a.set_tensors_dict({"0.weight": torch.ones(2, 2),
                                                       "0.bias": 3}), TypeError),
    ("swap_tensors_dict shared", lambda a: a.swap_tensors_dict(
        {"0.weight": torch.ones(2, 2), "1.weight": torch.zeros(2, 2), "training": torch.ones(1)},
        allow_missing=True), TypeError),
    ("swap_tensors_dict new Parameter", lambda a: a.swap_tensors_dict(
        {"0.acc_new": nn.Parameter(torch.ones(2)), "nope.x": torch.ones(2)}), AttributeError),
]


@pytest.mark.parametrize(("call", "error"), [(c, e) for _, c, e in REFUSED],
                         ids=[i for i, _, _ in REFUSED])
def test_refused_batched_write_leaves_the_tree_as_it_was(call, error):
    lin = nn.Linear(2, 2)
    module = nn.Sequential(lin, lin)
    before = _state(module)
    with pytest.raises(error):
        call(NamedMemberAccessor(module))
    assert _state(module) == before


def test_a_good_batched_write_writes_every_name():
    module = nn.Sequential(nn.Linear(2, 2))
    weight, bias = nn.Parameter(torch.ones(2, 2)), nn.Parameter(torch.ones(2))
    old = NamedMemberAccessor(module).swap_tensors(["0.weight", "0.bias"], [weight, bias])
    assert module[0].weight is weight and module[0].bias is bias
    assert all(isinstance(t, nn.Parameter) for t in old)


def test_swap_tensors_allow_missing_writes_a_new_name_as_torchs():
    """``swap_tensors(..., allow_missing=True)`` writes a name the tree lacks, as torch's does."""
    from torch.nn.utils._named_member_accessor import NamedMemberAccessor as TorchAccessor

    results = []
    for accessor in (TorchAccessor, NamedMemberAccessor):
        module = nn.Sequential(nn.Linear(2, 2))
        value = torch.ones(2)
        old = accessor(module).swap_tensors(["0.fresh"], [value], allow_missing=True)
        assert module[0].fresh is value
        results.append([type(t).__name__ for t in old])
    assert results[1] == results[0]


def test_swap_tensors_dict_allow_missing_reports_the_missing_names_as_torchs():
    """``swap_tensors_dict(..., allow_missing=True)`` writes a name the tree lacks and reports it
    missing, as torch's does."""
    from torch.nn.utils._named_member_accessor import NamedMemberAccessor as TorchAccessor

    results = []
    for accessor in (TorchAccessor, NamedMemberAccessor):
        module = nn.Sequential(nn.Linear(2, 2))
        value = torch.ones(2)
        _, missing = accessor(module).swap_tensors_dict({"0.fresh": value}, allow_missing=True)
        assert module[0].fresh is value
        results.append(missing)
    assert results[1] == results[0] == ["0.fresh"]
