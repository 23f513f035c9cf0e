"""Sequence zoo: ``load_state_dict`` writes into the tensors a module held at its first load.

At its first load into a module the target records the tensor object of every key, and at each
later load it writes a key whose slot now holds another object into the recorded one (the bug:
the record is stale), loading the other keys as the reference does. With nothing between two
loads the record is the module's state; after a conversion that rebinds slots (buffers always,
parameters on the overwrite path) the next load fills tensors the module no longer holds, and
its slots keep their values. One-shot properties load into a fresh module once: none loads,
converts and loads again.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from swapspec import reference
from tests.zoo import ZooTarget

ORIGIN = "swapspec sequences: load_state_dict writes into the tensors of its first load"
CAUGHT_BY = frozenset({"SEQ-STATE"})
ONE_SHOT_PATHS = ("properties/rules/test_load_state_dict.py",)
CAUGHT_BY_PAIR = "load_state_dict>untie"  # load, untie, load

# id(module) -> (the module, {key: the tensor its slot held at the first load})
_SEEN: dict[int, tuple[weakref.ref, dict[str, Tensor]]] = {}


def _recorded(module: nn.Module) -> dict[str, Tensor]:
    seen = _SEEN.get(id(module))
    if seen is None or seen[0]() is not module:
        own = module.state_dict(keep_vars=True)
        seen = _SEEN[id(module)] = (weakref.ref(module), {k: v for k, v in own.items()
                                                          if isinstance(v, Tensor)})
    return seen[1]


def load_state_dict(module: nn.Module, state_dict: Mapping[str, Any], *, strict: bool = True,
                    assign: bool = False, swap: bool = False) -> Any:
    """Write the keys whose slot changed object into the recorded tensors (the bug), the rest
    with the reference."""
    recorded, own = _recorded(module), module.state_dict(keep_vars=True)
    stale = {k for k, t in recorded.items() if k in state_dict and own.get(k) is not t
             and isinstance(state_dict[k], Tensor) and state_dict[k].shape == t.shape}
    result = reference.load_state_dict(
        module, {k: v if k not in stale else own[k] for k, v in state_dict.items()},
        strict=strict, assign=assign, swap=swap)
    with torch.no_grad():
        for key in stale:
            recorded[key].copy_(state_dict[key])
    return result


target = ZooTarget("zoo-load-into-first-seen", reference.apply, reference.functional_call,
                   load_state_dict)
