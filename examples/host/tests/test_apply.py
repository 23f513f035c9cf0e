"""mylib's own tests of ``apply`` (swapspec has a ``test_apply.py`` too; they never clash)."""

import mylib
import torch
from hypothesis import given

from strategies import flags, gates


@given(gates, flags)
def test_double_converts_every_tensor_and_keeps_the_module(gate, flag_pair):
    overwrite, swap = flag_pair
    out = mylib.apply(gate, lambda t: t.double(), overwrite=overwrite, swap=swap)
    assert out is gate
    assert all(t.dtype == torch.float64 for t in (*gate.parameters(), *gate.buffers()))


@given(gates)
def test_functional_call_with_own_tensors_is_a_plain_call(gate):
    x = torch.ones(2, 4)
    tensors = dict(gate.named_parameters())
    assert torch.equal(mylib.functional_call(gate, tensors, (x,)), gate(x))
