"""The step checker of the sequence machine: one step's violations, judged against the target's
declarations for the one-shot properties that cover that kind of step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from swapspec.properties import vocabulary
from swapspec.properties.declarations.torch import APPLY_IDS
from swapspec.properties.harness.checker import (
    DECLARED,
    DECLARED_SHOWN,
    OBSERVED,
    conformance_error_class,
)
from swapspec.properties.models.examples import StepExample
from swapspec.properties.vocabulary import Deviation, Violation

# The one-shot properties whose declarations a step of each kind is judged against.
STEP_PROPERTIES: dict[str, tuple[str, ...]] = {
    "convert": (*APPLY_IDS, "APPLY-ATOMIC", "APPLY-REFUSED-SWAP"),
    "functional_call": (*vocabulary.FUNCTIONAL_CALL, "TOGETHER-CONVERTED-CALL"),
    "load_state_dict": tuple(pid for pid in vocabulary.ALL if pid.startswith("LOAD")),
}


STEP_PROPERTIES["vmap"] = STEP_PROPERTIES["functional_call"]


@dataclass
class StepCheck:
    """The violations of one step and the declarations that apply to it.

    Rules: where an applicable declaration names a clause the step violated, the step shows
    that declared deviation, and every other violation of the step counts as its symptom (one
    bug, several symptoms: what torch leaves behind is that declaration's business); each
    violated clause is counted in the report. Any other violation fails the sequence. A
    declaration that does not show at a step is not stale: whether a behaviour shows depends
    on the earlier steps, and the one-shot properties judge staleness. After a step where a
    declaration applies, shown or not, the model takes the module's state as its own (a
    deviation's effect can show only in a later step's invariant).
    """

    property_id: str
    target: Any
    example: StepExample
    declared: list[Deviation] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    shown: bool = False  # a declared deviation showed here (set by ``verdict``)

    def __post_init__(self) -> None:
        wanted = {self.property_id, *STEP_PROPERTIES.get(self.example.step, ())}
        self.declared = [d for d in self.target.deviations
                         if wanted & set(d.property_ids) and d.holds_for_installed_torch()
                         and _applies(d, self.example)]

    def that(self, holds: bool, clause: str, message: str, code: str) -> bool:
        if not holds:
            self.violations.append(Violation(clause, message, code))
        return bool(holds)

    @property
    def declared_clauses(self) -> set[str]:
        return {c for d in self.declared for c in d.clauses}

    def verdict(self, repro_script: Callable[[list[Violation]], str],
                symptoms: list[Violation] = ()) -> bool:
        """Raise ``ConformanceError`` for an unexplained violation; return whether the model
        must take the module's state (a declaration applies here).

        ``symptoms`` are the step's state violations, for a property that does not assert the
        state: a declared deviation they show excuses the step too (its effect on the
        property's own invariant is one more symptom)."""
        violated = {v.clause for v in self.violations}
        shown = (violated | {v.clause for v in symptoms}) & self.declared_clauses
        unexplained = [] if shown else self.violations
        if unexplained:
            lines = [f"{self.property_id} on target {self.target.name!r}, at step "
                     f"{self.example.step!r}:"]
            lines += [f"  broken rule [{v.clause}]: {v.message}" for v in unexplained]
            script = repro_script(unexplained)
            lines += ["", "Standalone repro (save it as a file and run it with python):", "",
                      script]
            kind = conformance_error_class(unexplained, [])
            raise kind("\n".join(lines), unexplained, script)
        for clause in violated | shown:
            OBSERVED[(self.property_id, self.target.name, clause)] += 1
        for d in self.declared:  # the report's evidence per declaration, as one-shot checks give
            key = (self.property_id, self.target.name, d.key)
            DECLARED[key] += 1
            DECLARED_SHOWN[key] += bool(shown & set(d.clauses))
        self.shown = bool(shown)
        return bool(self.declared)


def _applies(deviation: Deviation, example: StepExample) -> bool:
    """A one-shot predicate that cannot read a step's example (a deep-copied module has no
    tree spec) does not apply there."""
    try:
        return bool(deviation.applies(example))
    except Exception:
        return False
