"""The zoo: targets that each reimplement one historical bug of ``_apply`` or ``functional_call``.

Rules every zoo module follows:

- it defines ``target`` (a :class:`ZooTarget`, selectable as ``tests.zoo.<module>:target``);
- ``ORIGIN`` names where the behaviour comes from (an issue, a PR, a torch release);
- ``CAUGHT_BY`` is the set of property IDs expected to fail on it (at least one must);
- ``PATHS`` are the property files that exercise it (the half it breaks, plus
  ``test_together.py``); the half it does not break is the reference's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

ZOO = (
    "old_set_data",
    "ignores_overwrite_flag",
    "apply_no_memo",
    "class_swap",
    "make_functional",
    "no_tie_weights",
    "no_strict",
    "no_finally",
    "tuple_write_back_lost",
    "shared_slot_restore",
)

APPLY_PATHS = ("properties/test_apply.py", "properties/test_together.py")
FC_PATHS = ("properties/test_functional_call.py", "properties/test_together.py")


@dataclass(frozen=True)
class ZooTarget:
    """A swapspec target (``name``, ``apply``, ``functional_call``) carrying one known bug."""

    name: str
    apply: Callable[..., Any]
    functional_call: Callable[..., Any]


def zoo_module(name: str) -> ModuleType:
    """The zoo module called ``name`` (one of :data:`ZOO`)."""
    return importlib.import_module(f"{__name__}.{name}")


def selector(name: str) -> str:
    """The ``--swapspec-target`` string that selects zoo target ``name``."""
    return f"{__name__}.{name}:target"


@dataclass
class PreparedCall:
    """A validated functional call: what the reference has decided before swapping anything."""

    given: dict[str, Any]
    sources: dict[str, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    slots: list[Any]


def prepare_call(module: Any, tensors: Any, args: Any, kwargs: Any, *, tie_weights: bool,
                 strict: bool) -> PreparedCall:
    """The reference's rules 1-5 (input forms, ties, one value per slot, strict, bad input),
    unchanged, for zoo targets that break only how tensors are swapped in or restored."""
    from reference import functional_call as ref

    given, sources = ref._merge(tensors)
    ref._refuse_jitted(module)
    args = () if args is None else args if isinstance(args, tuple) else (args,)
    kwargs = {} if kwargs is None else kwargs
    named = ref._expand_ties(module, given) if tie_weights else dict(given)
    ref._check_one_value_per_slot(module, named)
    if strict:
        ref._check_strict(module, named)
    return PreparedCall(given, sources, args, kwargs, ref._resolve_slots(module, named))
