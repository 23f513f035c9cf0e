"""The zoo: targets that each reimplement one historical bug of ``_apply``, ``functional_call``
or ``load_state_dict``.

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

import pytest

ref_fc = importlib.import_module("swapspec.reference.functional_call")  # the module, not the function

ZOO = (
    "old_set_data",
    "ignores_overwrite_flag",
    "apply_no_memo",
    "no_rollback",
    "class_swap",
    "make_functional",
    "no_tie_weights",
    "no_strict",
    "no_finally",
    "tuple_write_back_lost",
    "shared_slot_restore",
    "load_ignores_swap_flag",
    "load_commit_as_you_go",
    "no_jit_refusal",
)

# Targets correct on every one-shot property and wrong only in sequence (tests/test_zoo_sequences.py);
# each names ONE_SHOT_PATHS, the one-shot property files of the half it changes, instead of PATHS.
SEQUENCE_ZOO = (
    "grads_lost_after_training",
    "memo_across_calls",
    "restore_first_seen",
    "stale_tie_groups",
    "load_into_first_seen",
)
# Wrong only in sequence too, but caught only beyond the sequence zoo test's budget: measured by
# tests/zoo/measure_sequences.py, not asserted.
SEQUENCE_ZOO_SLOW: tuple[str, ...] = ()

APPLY_PATHS = ("properties/rules/test_apply.py", "properties/rules/test_together.py")
FC_PATHS = ("properties/rules/test_functional_call.py", "properties/rules/test_together.py")
LOAD_PATHS = ("properties/rules/test_load_state_dict.py",)


@dataclass(frozen=True)
class ZooTarget:
    """A swapspec target (``name``, ``apply``, ``functional_call``, optionally
    ``load_state_dict``) carrying one known bug."""

    name: str
    apply: Callable[..., Any]
    functional_call: Callable[..., Any]
    load_state_dict: Callable[..., Any] | None = None


def zoo_module(name: str) -> ModuleType:
    """The zoo module called ``name`` (one of :data:`ZOO`)."""
    return importlib.import_module(f"{__name__}.{name}")


def selector(name: str) -> str:
    """The ``--swapspec-target`` string that selects zoo target ``name``."""
    return f"{__name__}.{name}:target"


# ---- pytest plugin (``-p tests.zoo``): run only some properties -------------------------

PROPERTIES_ENV = "SWAPSPEC_ZOO_PROPERTIES"
NO_SHRINK_ENV = "SWAPSPEC_ZOO_NO_SHRINK"


@pytest.hookimpl(trylast=True)  # after properties.harness.plugin has loaded --swapspec-profile
def pytest_configure(config: Any) -> None:
    """With ``SWAPSPEC_ZOO_NO_SHRINK=1``, drop the shrink (and explain) phases from the loaded
    profile, keeping everything else. Whether a derandomized run fails is decided in the
    generate phase, so this changes the reported counterexample and the time, not the verdict.
    """
    import os

    if os.environ.get(NO_SHRINK_ENV) != "1":
        return
    from hypothesis import Phase, settings

    settings.register_profile("swapspec-zoo-no-shrink", settings(
        settings.default, phases=[Phase.explicit, Phase.reuse, Phase.generate]))
    settings.load_profile("swapspec-zoo-no-shrink")



def pytest_collection_modifyitems(config: Any, items: list) -> None:
    """With ``SWAPSPEC_ZOO_PROPERTIES=ID,ID`` set, deselect every property test not listed.

    Items without a property marker (plain unit tests) are deselected too; without the
    variable nothing changes.
    """
    import os

    wanted = {p for p in os.environ.get(PROPERTIES_ENV, "").split(",") if p}
    if not wanted:
        return
    from swapspec.properties.harness.marking import property_id

    keep = [item for item in items if property_id(item) in wanted]
    dropped = [item for item in items if property_id(item) not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
