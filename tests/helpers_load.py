"""The load tests' shared vocabulary: the four load paths as one parametrization, the reference's
load, a module's state dict with new values, and the text of a load's error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swapspec import reference

PATHS = [(False, False), (False, True), (True, False), (True, True)]
PATH_IDS = ["copy", "assign", "swap", "swap+assign"]
paths = pytest.mark.parametrize(("swap", "assign"), PATHS, ids=PATH_IDS)


def shifted(module: nn.Module, by: float = 1.0) -> dict[str, torch.Tensor]:
    """The module's state dict with every floating value moved by ``by`` (new objects)."""
    return {k: v + by if v.is_floating_point() else v.clone() for k, v in module.state_dict().items()}


def load(module, state_dict, **kwargs):
    return reference.load_state_dict(module, state_dict, **kwargs)


def error_of(call) -> str:
    with pytest.raises(RuntimeError) as info:
        call()
    return str(info.value)


@pytest.fixture(autouse=True)
def restore_swap_flags():
    """Leave the reference's and torch's swap flags as each test found them."""
    saved = (reference.get_swap_module_params_on_conversion(),
             torch.__future__.get_swap_module_params_on_conversion())
    try:
        yield
    finally:
        reference.set_swap_module_params_on_conversion(saved[0])
        torch.__future__.set_swap_module_params_on_conversion(saved[1])
