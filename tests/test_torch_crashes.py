"""The torch declarations of a crash (clause ``crash``) hold on the installed torch: each case
runs in a fresh interpreter, and the predicate is true exactly where torch breaks the module."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing._internal.two_tensor import TwoTensor

from swapspec.properties.declarations.torch_functional_call import restore_sets_wrapper_into_plain
from swapspec.properties.models.examples import Example
from swapspec.strategies import CallInput
from tests.helpers_modules import torch_swap_flag_set
from tests.repro_scripts import run_script

# (parametrization, originals as TwoTensor, value as TwoTensor, swap flag, grad enabled)
CASES = {
    "orthogonal, TwoTensor original": ("orthogonal", True, False, False, True),
    "orthogonal, swap flag": ("orthogonal", True, False, True, True),
    "orthogonal, TwoTensor value": ("orthogonal", True, True, False, True),
    "orthogonal, plain original": ("orthogonal", False, False, False, True),
    "weight_norm, grad disabled": ("weight_norm", True, False, False, False),
    "weight_norm, refused swap": ("weight_norm", True, False, False, True),
}

BUILD = """
import torch
from torch import nn
from torch.testing._internal.two_tensor import TwoTensor

def build(kind, wrapped):
    m = nn.Linear(3, 3)
    if wrapped:
        w = m.weight.detach()
        m.weight = nn.Parameter(TwoTensor(w, w.clone()))
    getattr(torch.nn.utils.parametrizations, kind)(m)
    return m
"""

CALL = """
m = build({kind!r}, {wrapped})
v = torch.rand(3, 3)
value = TwoTensor(v, v.clone()) if {wrapped_value} else v
torch.__future__.set_swap_module_params_on_conversion({swap})
torch.set_grad_enabled({grad})
try:
    torch.func.functional_call(m, {{'weight': value}}, (torch.rand(1, 3),))
except RuntimeError:
    pass  # a refused swap raises before anything is swapped: the module must still be whole
for t in [m.weight, *m.parametrizations.weight._parameters.values()]:
    t.detach().sum().item()
print('whole')
"""


def _build(kind: str, wrapped: bool) -> nn.Module:
    namespace: dict = {}
    exec(BUILD, namespace)
    return namespace["build"](kind, wrapped)


def _predicted(kind, wrapped, wrapped_value, swap, grad) -> bool:
    v = torch.rand(3, 3)
    value = TwoTensor(v, v.clone()) if wrapped_value else v
    call = CallInput({"weight": value}, (torch.rand(1, 3),), {}, tie_weights=True, strict=False)
    example = Example(_build(kind, wrapped), call=call)
    with torch_swap_flag_set() if swap else nullcontext(), torch.set_grad_enabled(grad):
        return restore_sets_wrapper_into_plain(example)


@pytest.mark.parametrize("case", CASES)
def test_a_restore_through_set_breaks_the_module_exactly_where_predicted(case, tmp_path: Path):
    kind, wrapped, wrapped_value, swap, grad = CASES[case]
    script = BUILD + CALL.format(kind=kind, wrapped=wrapped, wrapped_value=wrapped_value,
                                 swap=swap, grad=grad)
    done = run_script(script, tmp_path)
    broken = done.returncode != 0
    assert broken == _predicted(*CASES[case]), (
        f"{case}: torch {'broke' if broken else 'kept'} the module, the declaration predicts "
        f"otherwise (remove or narrow restore_sets_wrapper_into_plain):\n{done.stderr[-2000:]}")
