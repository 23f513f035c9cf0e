"""Zoo: ``load_state_dict`` that writes key by key and raises at the end, undoing nothing.

Origin: torch's ``load_state_dict`` (every release to 2.13): ``_load_from_state_dict`` copies,
assigns or swaps each key as it goes and only collects the errors, so a size mismatch or a
missing key raises after every other key was loaded. Declared for the torch target as
``writes_before_failing`` in ``properties/declarations/torch_load_failures.py``. Everything else here is
the reference's: its traversal, paths, ties and messages.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys

from swapspec import reference
from tests.zoo import LOAD_PATHS, ZooTarget

ref_load = importlib.import_module("swapspec.reference.load_state_dict")  # the module

ORIGIN = "torch load_state_dict: keys are written as they come, errors raised at the end"
CAUGHT_BY = frozenset({"LOAD-ATOMIC"})
PATHS = LOAD_PATHS


def load_state_dict(module: nn.Module, state_dict: Any, *, strict: bool = True,
                    assign: bool = False, swap: bool) -> Any:
    """The reference's load, but every valid key is written though the load fails, and
    nothing is undone: no snapshot, no undo log (the bug)."""
    load = ref_load._Load(module, swap=swap, assign=assign)
    copy = ref_load._copied(state_dict)
    load.metadata = getattr(copy, "_metadata", None)
    load.given = {id(v): v.detach().clone() for v in copy.values()
                  if isinstance(v, Tensor) and not ref_load.is_lazy(v)}
    with ref_load._routed_to(load):
        load.visit(module, copy, "")
    load.flush()
    load.raise_errors(strict)
    return _IncompatibleKeys(load.missing_keys, load.unexpected_keys)


target = ZooTarget("zoo-load-commit-as-you-go", reference.apply, reference.functional_call,
                   load_state_dict)
