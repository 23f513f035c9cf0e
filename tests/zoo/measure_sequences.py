"""Measure how long the sequence properties take to catch each sequence zoo target, and the
length of the shrunk sequence.

``python -m tests.zoo.measure_sequences`` (from the checkout) runs each target's ``CAUGHT_BY``
properties in-process under the CI profile's generation (derandomized, no database, the
budget of ``properties.rules.sequence_machine.sequence_settings``): once without shrinking (time to the
first failing sequence) and once with it (total time, and the steps of the shrunk sequence),
and prints a Markdown table.
"""

from __future__ import annotations

import time
import warnings

from hypothesis import Phase, settings

from swapspec.properties.harness.checker import ConformanceError
from swapspec.properties.harness.isolation import isolated_global_state
from swapspec.properties.harness.targets import load_target
from swapspec.properties.rules.sequence_machine import (
    repro_of,
    run_sequences,
    sequence_settings,
    steps_in,
)
from tests.zoo import SEQUENCE_ZOO, SEQUENCE_ZOO_SLOW, selector, zoo_module


def measure(name: str, property_id: str, shrink: bool) -> tuple[float, int | None]:
    """(seconds until the property fails, steps of the reported sequence; None: not caught)."""
    with _ci_profile():
        base = sequence_settings()
    phases = list(Phase) if shrink else [Phase.explicit, Phase.generate]
    start = time.perf_counter()
    try:
        with isolated_global_state(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_sequences(load_target(selector(name)), property_id,
                          settings_=settings(base, phases=phases))
    except ConformanceError as e:
        return time.perf_counter() - start, steps_in(repro_of(e))
    return time.perf_counter() - start, None


class _ci_profile:
    """Load the CI profile for the duration (restoring the previous default after)."""

    def __enter__(self) -> None:
        self.saved = settings.default
        settings.load_profile("swapspec-ci")

    def __exit__(self, *exc: object) -> None:
        settings.register_profile("swapspec-measure-restore", self.saved)
        settings.load_profile("swapspec-measure-restore")


def main() -> None:
    print("| zoo target | property | first failure (no shrinking) | with shrinking | shrunk steps |")
    print("|---|---|---:|---:|---:|")
    for name in (*SEQUENCE_ZOO, *SEQUENCE_ZOO_SLOW):
        for pid in sorted(zoo_module(name).CAUGHT_BY):
            first, _ = measure(name, pid, shrink=False)
            total, steps = measure(name, pid, shrink=True)
            shown = "not caught" if steps is None else str(steps)
            print(f"| `{name}` | {pid} | {first:.1f} s | {total:.1f} s | {shown} |")


if __name__ == "__main__":
    main()
