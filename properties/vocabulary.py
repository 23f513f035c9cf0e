"""The suite's vocabulary: every property ID (grouped by family, for hosts to name in skips and
deviations), the target features each property needs, and the ``Deviation`` a declaration is,
with the ``Violation`` of a clause and the version helpers declarations use.

Plain data: it imports nothing of swapspec's, so the declarations, the models and the harness
can all read it. ``tests/test_plugin.py`` checks that the ID tuples list exactly the properties
the rule files define, so a host can rely on them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

APPLY = (
    "APPLY-ATOMIC", "APPLY-CONTRACT", "APPLY-CONV-MEMORY-FORMAT", "APPLY-FN-ONCE", "APPLY-FORWARD", "APPLY-GRAD-MISMATCH", "APPLY-GRADS", "APPLY-METHOD-ARGS",
    "APPLY-METHOD-GRADS", "APPLY-NO-SET-DATA-ACROSS-IMPL",
    "APPLY-NONE-SLOTS", "APPLY-PARAMETER-IDENTITY", "APPLY-PATH", "APPLY-RECURSE-FALSE",
    "APPLY-OPTIMIZER", "APPLY-OVERRIDE", "APPLY-REFUSED-SWAP", "APPLY-ROUND-TRIP", "APPLY-SKIP-INIT",
    "APPLY-SKIP-INIT-REFUSED", "APPLY-TENSOR-HOOKS", "APPLY-TIES", "APPLY-VALUES",
)
FUNCTIONAL_CALL = (
    "FC-BAD-INPUT", "FC-DATA-PARALLEL", "FC-FUNC-GRAD", "FC-GRADIENTS", "FC-INPUT-FORMS", "FC-JIT-REFUSED", "FC-ORACLE", "FC-PARAMETRIZED",
    "FC-RESTORE", "FC-STACKED-ENSEMBLE", "FC-STRICT",
    "FC-TIES", "FC-VISIBLE", "FC-WRITE-BACK",
)
STACKING = ("STACK-MODULE-STATE", "STACK-MODULE-STATE-REFUSED")
TOGETHER = ("TOGETHER-APPLY-IN-FORWARD", "TOGETHER-CONVERTED-CALL")
XLA = (
    "XLA-DTYPE-PATH", "XLA-FUNCTIONAL-CALL", "XLA-LOAD-FROM", "XLA-LOAD-INTO",
    "XLA-MOVE-ALL-FLAGS", "XLA-ROUND-TRIP", "XLA-SET-DATA-REFUSED", "XLA-STATE",
)
SEQUENCES = ("SEQ-FORWARD", "SEQ-HOOKS", "SEQ-OPTIMIZER", "SEQ-STATE")
LOAD = (
    "LOAD-ATOMIC", "LOAD-IDENTITY", "LOAD-KEYS", "LOAD-PATH", "LOAD-ROUND-TRIP", "LOAD-TIES",
    "LOAD-VALUES",
)
CHECKPOINT = (
    "CHECKPOINT-EXTRA-STATE", "CHECKPOINT-LOAD-HOOKS", "CHECKPOINT-META-TO",
    "CHECKPOINT-NOT-A-MAPPING", "CHECKPOINT-PICKLE",
    "CHECKPOINT-POST-HOOK-RETURN", "CHECKPOINT-RNN-FLAT-WEIGHTS", "CHECKPOINT-RNN-LEGACY",
    "CHECKPOINT-STATE-DICT-FORMS", "CHECKPOINT-VECTOR",
)
REGISTRATION = ("REGISTER-HOOKS", "REGISTER-REFUSED", "REGISTER-SLOT", "REGISTER-SWAP",
                "REGISTER-SWAP-REFUSED")
PARAMETRIZE = (
    "PARAMETRIZE-ASSIGN", "PARAMETRIZE-CACHED", "PARAMETRIZE-DEEPCOPY", "PARAMETRIZE-REFUSED",
    "PARAMETRIZE-REMOVE", "PARAMETRIZE-STACK", "PARAMETRIZE-TRANSFER", "PARAMETRIZE-UNSAFE",
)
OLD_STYLE = ("OLD-STYLE-REMOVE",)
ACCESSOR = ("ACCESSOR-DEL", "ACCESSOR-GET", "ACCESSOR-REFUSED", "ACCESSOR-SET", "ACCESSOR-SWAP")
MODULE_CONVERSIONS = (
    "MODCONV-ATOMIC", "MODCONV-CONTRACT", "MODCONV-HOOKS", "MODCONV-IDENTITY", "MODCONV-TIES",
    "MODCONV-WORKING",
)
FAMILIES: dict[str, tuple[str, ...]] = {
    "apply": APPLY, "functional_call": FUNCTIONAL_CALL, "together": TOGETHER, "xla": XLA,
    "sequences": SEQUENCES, "load_state_dict": LOAD, "checkpoint": CHECKPOINT,
    "registration": REGISTRATION, "parametrize": PARAMETRIZE, "old_style": OLD_STYLE,
    "accessor": ACCESSOR, "stacking": STACKING,
    "module_conversions": MODULE_CONVERSIONS,
}
ALL: tuple[str, ...] = tuple(pid for family in FAMILIES.values() for pid in family)

# What each property calls on the target. A target without one of them is skipped there
# (``properties.harness.targets.Target.has``); a property not listed needs ``FAMILY_NEEDS`` of its family.
FAMILY_NEEDS: dict[str, tuple[str, ...]] = {
    "apply": ("apply",), "functional_call": ("functional_call",),
    "together": ("apply", "functional_call"), "xla": ("apply",),
    "load_state_dict": ("load_state_dict",), "sequences": ("apply", "functional_call"),
    "checkpoint": ("apply",),
    "registration": ("apply",),  # the registration methods a target lacks are built beside apply
    "parametrize": ("apply",),
    "old_style": ("apply",),  # the removals a target lacks are the reference's
    "accessor": ("apply",),  # torch's accessor, on modules the target's apply converted
    "module_conversions": ("module_conversions",),  # the host's own; nothing else of the target
    "stacking": ("stack_module_state",),
}
NEEDS: dict[str, tuple[str, ...]] = {
    **{pid: FAMILY_NEEDS[family] for family, pids in FAMILIES.items() for pid in pids},
    "FC-STRICT": ("functional_call", "strict"),
    "FC-INPUT-FORMS": ("functional_call", "tuple_inputs"),
    "XLA-FUNCTIONAL-CALL": ("functional_call",),
    "XLA-LOAD-FROM": ("load_state_dict",),
    "XLA-LOAD-INTO": ("load_state_dict",),
    "PARAMETRIZE-CACHED": ("apply", "functional_call"),
    "XLA-SET-DATA-REFUSED": (),  # a fact about the torch build, whatever the target
    "CHECKPOINT-EXTRA-STATE": ("load_state_dict",),
    "CHECKPOINT-LOAD-HOOKS": ("load_state_dict",),
    "CHECKPOINT-NOT-A-MAPPING": ("load_state_dict",),
    "CHECKPOINT-POST-HOOK-RETURN": ("load_state_dict",),
    "CHECKPOINT-STATE-DICT-FORMS": ("load_state_dict",),
    "REGISTER-SWAP": (),  # the target's swap_tensors, torch's by default
    "REGISTER-SWAP-REFUSED": (),
}


# ---- declarations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Deviation:
    """A known, reproduced way a target departs from the spec.

    - ``property_id``: the property it concerns (``"APPLY-TIES"``), or a tuple of them.
    - ``applies``: a predicate over the drawn example (``properties.models.examples.Example``),
      evaluated before the target runs, that is true exactly where the deviation shows.
    - ``observed``: the clause code the target violates there, or a tuple of codes of
      which the example must violate at least one (one bug, several symptoms). ``"crash"``
      (``CRASH``) declares that the target kills the interpreter there, or leaves the module
      so broken that reading it does: a property that calls ``Checker.skips_declared_crash``
      then does not run the target on the example (a test runs the repro in a subprocess).
    - ``reason``: why, with a link and a minimal repro.
    - ``torch_versions``: ``(lowest, below)`` bounds on ``torch.__version__`` where the
      deviation holds (``None`` for no bound), for deviations of some torch releases only.
    - ``always``: True when every example in the region shows the behaviour (checked per
      example). False when it shows in some only, for a reason no predicate can see (a
      freed TensorImpl address reused): then it is stale when at least ``stale_after`` of one
      test's examples fall in the region and none shows it.
    - ``stale_after``: for ``always=False``, that count (default 10); ``None`` where no count
      can tell a stale declaration from bad luck (a behaviour of the allocator, whose rate no
      run controls): such a declaration is never judged stale by a run, and a test of its
      predicate must keep it true.
    - ``id``: a stable, readable name unique across all declarations
      (``"torch.fc.shared-slot-not-restored"``: owner, area, what), by which a host selects a
      declaration to reuse (``properties.declarations.torch_declarations``) and the report
      names the declarations that matched.
    """

    property_id: str | tuple[str, ...]
    applies: Callable[[Any], bool]
    observed: str | tuple[str, ...]
    reason: str
    torch_versions: tuple[str | None, str | None] = (None, None)
    always: bool = True
    id: str = ""
    stale_after: int | None = 10

    @property
    def key(self) -> str:
        """A short stable name for counting: the ``id``; without one, the clauses and the
        reason's first words."""
        return self.id or f"{'|'.join(self.clauses)}: {self.reason[:60]}"

    @property
    def property_ids(self) -> tuple[str, ...]:
        return _as_tuple(self.property_id)

    @property
    def clauses(self) -> tuple[str, ...]:
        return _as_tuple(self.observed)

    def holds_for_installed_torch(self) -> bool:
        """Whether the installed torch falls inside ``torch_versions`` (always, in survey mode)."""
        return surveying() or version_in_range(torch.__version__, *self.torch_versions)


def surveying() -> bool:
    """Survey mode: count stale declarations and undeclared violations instead of failing."""
    return os.environ.get("SWAPSPEC_SURVEY") == "1"


def _as_tuple(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def version_in_range(version: str, lowest: str | None, below: str | None) -> bool:
    """``lowest <= version < below`` on the numeric release part, bounds optional."""
    release = _release(version)
    if lowest is not None and release < _release(lowest):
        return False
    return below is None or release < _release(below)


def _release(version: str) -> tuple[int, int, int]:
    """``major.minor.patch`` as numbers; missing parts are 0, suffixes (rc1, +cpu) ignored."""
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    major, minor, patch = (int(g or 0) for g in match.groups())
    return major, minor, patch


@dataclass
class Violation:
    """One clause of a rule that did not hold, with a line of code that shows it."""

    clause: str
    message: str
    code: str | None = None


CRASH = "crash"  # the clause of a declared crash (see ``Deviation.observed``)
