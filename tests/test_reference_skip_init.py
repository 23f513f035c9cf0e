"""The reference's ``skip_init`` (rule 8 of ``reference/methods.py``): build on ``meta``, then
``to_empty`` on the requested device, under the flags; refused classes before anything is built."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swapspec import reference
from swapspec.reference.methods import Methods
from swapspec.strategies.constructions import default_dtype


@pytest.mark.parametrize("swap", [False, True])
def test_skip_init_builds_on_meta_then_empties_on_the_device(swap):
    seen = []
    methods = Methods(lambda m, fn, **kw: (seen.append((next(m.parameters()).device.type, kw)),
                                           reference.apply(m, fn, **kw))[1])
    module = methods.skip_init(nn.Linear, 3, 4, bias=False, swap=swap, overwrite=False)
    assert seen == [("meta", {"overwrite": False, "swap": swap, "recurse": True})]
    assert type(module) is nn.Linear and module.weight.shape == (4, 3)
    assert module.weight.device.type == "cpu" and module.bias is None


def test_skip_init_takes_the_device_from_the_keywords():
    assert reference.skip_init(nn.Linear, 2, 2, device="meta").weight.is_meta


def test_skip_init_uses_the_default_dtype():
    with default_dtype(torch.float64):
        assert reference.skip_init(nn.Linear, 2, 2).weight.dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("cls, message", [
    (dict, "^Expected a Module; got <class 'dict'>$"),
    (nn.LSTM, "^Module must support a 'device' arg to skip initialization$"),
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
