"""The checker that holds a target to the spec or to its declarations (``vocabulary.Deviation``).

A property checks an example clause by clause with a ``Checker``: every clause that
does not hold is a *violation*, named by a short clause code (``"tie-split"``). At the
end of the example, ``Checker.verdict`` compares the violated clauses with the target's
declarations that apply to this example:

- a violated clause that no declaration covers fails the example (a conformance bug);
- a declared clause that was not violated fails too: the declaration is stale, the
  target now does what the spec says there (remove the declaration);
- otherwise the example passes, and each matching declaration counts one deviation.

Survey mode (``SWAPSPEC_SURVEY=1``, what ``.ci/oracle-matrix`` runs) observes instead of
judging: every declaration applies whatever its ``torch_versions``, and neither a stale
declaration nor an undeclared violation fails the example; both are only counted
(``DECLARED``, ``UNDECLARED``), so one run says what a torch release does everywhere.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from swapspec.properties.harness import crashes
from swapspec.properties.models import invariants
from swapspec.properties.vocabulary import CRASH, Deviation, Violation, surveying


class ConformanceError(AssertionError):
    """An example broke the spec where nothing declares a deviation, or a declaration is stale.

    ``violations`` are the broken rules nothing declares, ``repro`` the standalone script (empty
    while Hypothesis shrinks: it is made for the example Hypothesis reports).
    """

    def __init__(self, message: str, violations: list[Violation] = (), repro: str = "") -> None:
        super().__init__(message)
        self.violations = list(violations)
        self.repro = repro


def conformance_error_class(violations: list[Violation], stale: list[Deviation]
                            ) -> type[ConformanceError]:
    """The ``ConformanceError`` subclass of one kind of failure: its first broken clause (in
    sorted order), else its first stale declaration. Hypothesis tells failures apart by
    exception type and place, so each kind is shrunk and reported on its own, with its own
    repro, instead of the first failure found hiding the rest. An example that breaks two
    clauses is of the first one's kind (and its error names both); the second is reported on its
    own wherever it shows alone."""
    clauses = sorted({v.clause for v in violations})
    kind = clauses[0] if clauses else "stale " + min("|".join(d.clauses) for d in stale)
    if kind not in _ERROR_CLASSES:
        _ERROR_CLASSES[kind] = type(f"ConformanceError[{kind}]", (ConformanceError,),
                                    {"__module__": __name__})
    return _ERROR_CLASSES[kind]


_ERROR_CLASSES: dict[str, type[ConformanceError]] = {}


# Observed deviations in this process: (property_id, target_name, clause) -> examples.
OBSERVED: Counter[tuple[str, str, str]] = Counter()


# For ``always=False`` declarations: (property_id, target_name, key) -> examples in the
# region, and -> examples that showed the behaviour.
IN_REGION: Counter[tuple[str, str, str]] = Counter()


SHOWN: Counter[tuple[str, str, str]] = Counter()


# -> the declaration's ``stale_after`` (None: never judged stale by a run).
STALE_AFTER: dict[tuple[str, str, str], int | None] = {}


def stale_sometimes(hits: Counter, seen: Counter) -> list[tuple[str, str, str]]:
    """The ``always=False`` declarations of one test that are stale: ``hits`` examples in their
    region (at least their ``stale_after``), ``seen`` of them showing it (none)."""
    return [key for key, n in hits.items()
            if not seen[key] and STALE_AFTER.get(key) is not None and n >= STALE_AFTER[key]]


# Every declaration that applied to an example: (property_id, target_name, key) -> examples,
# and -> examples that showed it (violated one of its clauses).
DECLARED: Counter[tuple[str, str, str]] = Counter()


DECLARED_SHOWN: Counter[tuple[str, str, str]] = Counter()


# Examples a declared crash kept the target from running: (property_id, target_name, key) -> n.
NOT_RUN: Counter[tuple[str, str, str]] = Counter()


# Survey mode only: violations no declaration covers, (property_id, target_name, clause) -> examples.
UNDECLARED: Counter[tuple[str, str, str]] = Counter()


# The checker of the example running now (``Checker`` sets it when made, ``verdict`` clears it):
# the target calls of ``target_calls`` add the invariants' violations to it.
CURRENT: list[Checker | None] = [None]


def current() -> Checker | None:
    """The checker of the running example, or None between examples."""
    return CURRENT[0]


# Survey mode only: the first message of each undeclared clause, for its report cell.
UNDECLARED_MESSAGES: dict[tuple[str, str, str], str] = {}


@dataclass
class Checker:
    """Collects violations of one example; ``verdict`` decides against the declarations."""

    property_id: str
    target: Any
    example: Any
    declared: list[Deviation] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    bystander: Any = None  # ``invariants.Bystander``: a copy of the module no call may touch
    succeeded: bool = False  # a target call of this example returned (``target_calls.watched``)
    # the invariant clauses a declaration of any property explains here (read before the call)
    invariant_excuses: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        CURRENT[0] = self
        checks_invariants = invariants.enabled(self.target)
        self.declared = [
            d for d in self.target.deviations
            if self.property_id in d.property_ids
            and (checks_invariants or not _invariants_only(d))
            and d.holds_for_installed_torch()
            and d.applies(self.example)
        ]
        if checks_invariants:
            self.invariant_excuses = self._declared_invariants()
        crashes.record(self.property_id, self.target, self.example)

    def skips_declared_crash(self) -> bool:
        """Whether a declaration says the target crashes on this example (clause ``CRASH``).

        If so, the example counts as that declared deviation shown, and the property must
        return without running the target: nothing can judge a dead interpreter. A property
        that runs the target anyway reaches ``verdict``, where the declaration is stale.
        """
        crashing = [d for d in self.declared if CRASH in d.clauses]
        if not crashing:
            return False
        self.declared = crashing
        self._count({CRASH})
        for d in crashing:
            NOT_RUN[(self.property_id, self.target.name, d.key)] += 1
        return True

    def that(self, holds: bool, clause: str, message: str, code: str | None = None) -> bool:
        """Record a violation of ``clause`` unless ``holds``; return ``holds``."""
        if not holds:
            self.violations.append(Violation(clause, message, code))
        return bool(holds)

    def verdict(self, repro: Callable[[list[Violation]], str] | None = None) -> None:
        """Pass, count declared deviations, or raise ``ConformanceError`` with a repro.

        First the invariants that hold after every property (``models.invariants``): the
        bystander copy is untouched (``INV-INDEPENDENT``) and the module works
        (``INV-WORKING``). A violated invariant is explained only by a declaration of the
        target, of any property, that names the invariant's clause and applies here: a
        declaration covers exactly its clauses and the cases its predicate describes."""
        if CURRENT[0] is self:
            CURRENT[0] = None
        self.violations += after_property(self)
        violated = {v.clause for v in self.violations}
        declared = {c for d in self.declared for c in d.clauses}
        if violated & set(invariants.IDS):
            declared |= self.invariant_excuses
        unexplained = [v for v in self.violations if v.clause not in declared]
        stale = [d for d in self.declared if d.always and not violated & set(d.clauses)]
        for d in self.declared:
            if not d.always:
                key = (self.property_id, self.target.name, d.key)
                IN_REGION[key] += 1
                STALE_AFTER[key] = d.stale_after
                SHOWN[key] += bool(violated & set(d.clauses))
        if surveying():
            for clause in {v.clause for v in unexplained}:
                UNDECLARED[(self.property_id, self.target.name, clause)] += 1
            for v in unexplained:
                UNDECLARED_MESSAGES.setdefault((self.property_id, self.target.name, v.clause),
                                               v.message[:300])
            unexplained, stale = [], []
        if not unexplained and not stale:
            self._count(violated & declared)
            return
        script = self._repro(repro, unexplained)
        kind = conformance_error_class(unexplained, stale)
        raise kind(self._explain(unexplained, stale, bool(script)), unexplained, script)

    def _declared_invariants(self) -> set[str]:
        """The invariant clauses that a declaration of the target, of any property, names and
        applies to here. Read when the checker is made, before the call: a predicate describes
        the input, never the outcome."""
        excused: set[str] = set()
        for d in self.target.deviations:
            named = set(d.clauses) & set(invariants.IDS)
            if named and d.holds_for_installed_torch() and _applies(d, self.example):
                excused |= named
        return excused

    def _count(self, shown: set[str]) -> None:
        """Count a passing example: its declared clauses, and each declaration that applied."""
        for clause in shown:
            OBSERVED[(self.property_id, self.target.name, clause)] += 1
        for d in self.declared:
            key = (self.property_id, self.target.name, d.key)
            DECLARED[key] += 1
            DECLARED_SHOWN[key] += bool(shown & set(d.clauses))

    def _explain(self, unexplained, stale, has_repro: bool) -> str:
        lines = [f"{self.property_id} on target {self.target.name!r}:"]
        lines += [f"  broken rule [{v.clause}]: {v.message}" for v in unexplained]
        lines += [
            f"  stale deviation [{'|'.join(d.clauses)}]: declared ({d.reason.splitlines()[0]}) but the "
            "target now follows the spec here; remove or narrow the declaration"
            for d in stale
        ]
        if has_repro:
            lines.append(f"  standalone repro: printed below as '{REPRO_SECTION}'")
        return "\n".join(lines)

    @staticmethod
    def _repro(repro: Callable[[list[Violation]], str] | None, unexplained: list[Violation]) -> str:
        """The repro script, for the example Hypothesis reports only (none while it shrinks, none
        with ``SWAPSPEC_NO_REPRO=1``); a repro that cannot be made says why instead."""
        if repro is None or not unexplained or os.environ.get("SWAPSPEC_NO_REPRO") == "1" \
                or not _final_example():
            return ""
        try:
            return repro(unexplained)
        except Exception as e:  # a repro that cannot be written must not change the verdict
            return f"# no repro: {type(e).__name__}: {e}\n"


REPRO_SECTION = "swapspec standalone repro"


def _invariants_only(deviation: Deviation) -> bool:
    """Every clause of ``deviation`` is an invariant's: on a target whose invariants are not
    checked (``invariants.enabled``) it can never show, so it is not judged there, nor stale."""
    return set(deviation.clauses) <= set(invariants.IDS)


def _applies(deviation: Deviation, example: Any) -> bool:
    """A predicate of another property that cannot read this example does not apply."""
    try:
        return bool(deviation.applies(example))
    except Exception:
        return False


def after_property(check: Checker) -> list[Violation]:
    """``INV-INDEPENDENT`` and ``INV-WORKING`` at the end of a one-shot property (the module's
    own state is the property's no more: the forward and backward run on it)."""
    if not invariants.enabled(check.target):
        return []
    out = invariants.independent(check.bystander)
    module = getattr(check.example, "module", None)
    if isinstance(module, nn.Module) and check.succeeded and not check.violations:
        out += invariants.works(module, invariants.input_for(module))
    return out


def _final_example() -> bool:
    """Whether Hypothesis runs the example it reports (true outside a Hypothesis test)."""
    from hypothesis.control import _current_build_context

    context = _current_build_context.value
    return context is None or context.is_final
