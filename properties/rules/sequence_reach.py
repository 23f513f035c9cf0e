"""How far the sequence machine reaches: the steps derandomized sequences on the reference run, and
the sequences' lengths.

``python -m swapspec.properties.rules.sequence_reach [N]`` prints both as Markdown tables for
``N // 10`` sequences (N defaults to 1000), as ``python -m swapspec.strategies.reach`` does for
what the strategies draw.
"""

from __future__ import annotations

import sys
from typing import Any

from hypothesis import Phase, settings

from swapspec.strategies.reach import frequencies, table


def sequence_reach(n: int) -> tuple[list[frozenset[str]], list[int]]:
    """For ``n`` derandomized sequences of ``properties.rules.sequence_machine`` run on the reference:
    the set of steps each sequence ran (rule names, ``train``/``checkpoint`` by their kind, and
    ``default dtype: <dtype>``, ``global hooks: <kind>`` and ``mode: <kind>``, drawn at its build,
    and ``inference mode: convert`` / ``inference mode: load_state_dict`` where the life ran that
    step under ``torch.inference_mode()``) and each sequence's length (steps after the build)."""
    from hypothesis import HealthCheck as Checks

    from swapspec.properties.harness.targets import builtin_target
    from swapspec.properties.rules.sequence_machine import (
        STATE,
        STEPS,
        SequenceMachine,
        run_sequences,
    )

    seen: list[frozenset[str]] = []
    lengths: list[int] = []

    class Recording(SequenceMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ran: list[str] = []

        def after(self, check: Any, *args: Any, **kwargs: Any) -> None:
            super().after(check, *args, **kwargs)
            self.ran.append(check.example.step)

        def teardown(self) -> None:
            super().teardown()
            dtype = str(self.default_dtype).removeprefix("torch.")
            hooks = {f"global hooks: {self.global_hooks}"}
            inference = ({f"inference mode: {step}" for step in ("convert", "load_state_dict")
                          if step in self.ran} if self.inference else set())
            seen.append(frozenset(self.ran) - {"build"} | {f"default dtype: {dtype}"} | hooks
                        | {f"mode: {self.mode}"} | inference)
            lengths.append(len(self.ran) - 1)

    run_sequences(builtin_target("reference"), STATE, Recording, settings(
        max_examples=n, derandomize=True, database=None, deadline=None,
        stateful_step_count=STEPS, phases=[Phase.generate], suppress_health_check=list(Checks)))
    return seen, lengths


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 1000
    steps, lengths = sequence_reach(n // 10)
    print(table(f"sequence step ({n // 10} sequences on the reference)", frequencies(steps)), "\n")
    print(table("sequence length (steps after the build)",
                frequencies([frozenset({f"{k} steps"}) for k in lengths])), "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
