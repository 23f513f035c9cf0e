"""Sequence zoo: ``apply`` keeps the tie groups it found at its first call on a module.

To skip scanning for shared tensors on every call, the target records at its first conversion
of a module which slots held one tensor (its tie groups), and at each later conversion makes
every recorded group share one tensor again before converting, and converts a tie made since as
separate tensors (the bug: the groups are stale). With nothing between two conversions the
record is the module's state; after a slot of a tie was given its own copy
(``decoder.weight = nn.Parameter(w.clone())``) the next conversion ties it back, and after a new
tie (``decoder.weight = encoder.weight``) it splits it. One-shot properties convert a fresh
module, or convert it twice with nothing between: none ties or unties a slot between two
conversions.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable

from torch import Tensor, nn

from swapspec import reference
from tests.zoo import ZooTarget

ORIGIN = "swapspec sequences: a conversion re-ties slots by the tie groups of its first call"
CAUGHT_BY = frozenset({"SEQ-STATE"})
ONE_SHOT_PATHS = ("properties/rules/test_apply.py", "properties/rules/test_together.py")
CAUGHT_BY_PAIR = "convert>tie"  # convert, tie, convert: the pair schedule's case that shows it

# id(module) -> (the module, its tie groups at the first conversion: [(owner, table, key), ...])
_GROUPS: dict[int, tuple[weakref.ref, list[list[tuple[nn.Module, str, str]]]]] = {}


def _tie_groups(module: nn.Module) -> list[list[tuple[nn.Module, str, str]]]:
    """The slots holding one tensor object, for every tensor held by two slots or more."""
    by_tensor: dict[int, list[tuple[nn.Module, str, str]]] = {}
    for owner in module.modules():
        for table in ("_parameters", "_buffers"):
            for key, t in getattr(owner, table).items():
                if t is not None:
                    by_tensor.setdefault(id(t), []).append((owner, table, key))
    return [slots for slots in by_tensor.values() if len(slots) > 1]


def _recorded(module: nn.Module) -> list[list[tuple[nn.Module, str, str]]]:
    seen = _GROUPS.get(id(module))
    if seen is None or seen[0]() is not module:
        seen = _GROUPS[id(module)] = (weakref.ref(module), _tie_groups(module))
    return seen[1]


def apply(module: nn.Module, fn: Callable[[Tensor], Tensor], *, overwrite: bool, swap: bool,
          recurse: bool = True) -> nn.Module:
    """Re-tie the recorded groups, convert with the reference, split the ties made since the
    first call (the bug)."""
    recorded = _recorded(module)
    for (owner, table, key), *rest in recorded:
        shared = getattr(owner, table)[key]
        for other, other_table, other_key in rest:
            getattr(other, other_table)[other_key] = shared
    reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)
    known = [{(id(o), t, k) for o, t, k in group} for group in recorded]
    for _, *rest in _tie_groups(module):
        for owner, table, key in rest:
            if not any((id(owner), table, key) in group for group in known):
                tensor = getattr(owner, table)[key]
                getattr(owner, table)[key] = (copy.deepcopy(tensor) if tensor.is_leaf
                                              else tensor.detach().clone())
    return module


target = ZooTarget("zoo-stale-tie-groups", apply, reference.functional_call,
                   reference.load_state_dict)
