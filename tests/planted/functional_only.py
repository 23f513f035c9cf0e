"""A functional-call-only target without ``tie_weights`` or ``strict``, with its own module and
conversion, for ``tests/test_targets.py``.

``functional_call`` takes no keywords at all: a property that passed ``tie_weights`` or
``strict`` to it would get a ``TypeError``. It writes each name it is given on its own, as
torch's ``tie_weights=False`` does, which is what the suite holds a target without the keyword
to. Select it with ``--swapspec-target=tests.planted.functional_only``; ``:tying`` is the same
target filling a tie's other names too (``tie_weights=True``), which breaks those rules.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import strategies as st
from torch import nn

from swapspec import reference
from swapspec.strategies import Conversion, HostModule

name = "functional-only"
lacks = ("tie_weights", "strict")
call_forms = ("dict",)


def functional_call(module, tensors, args=(), kwargs=None):
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=False)


def tying_functional_call(module, tensors, args=(), kwargs=None):
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=True)


tying = SimpleNamespace(name="functional-only-tying", functional_call=tying_functional_call,
                        lacks=lacks, call_forms=call_forms)


class Scale(nn.Module):
    """``x * weight``, its weight drawn from a fixed seed."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return x * self.weight


modules = st.just(HostModule("planted.Scale", Scale))
conversions = st.just(Conversion("planted.double_it", "lambda t: double_it(t)",
                                 imports="double_it = lambda t: t * 2"))
