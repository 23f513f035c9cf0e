"""Measure how long the CI profile's pair schedule takes to catch each sequence zoo target that
names ``CAUGHT_BY_PAIR``, and the length of the shrunk script.

``python -m tests.zoo.measure_pairs`` (from the checkout) runs, for each such target, the
whole pair schedule (``test_sequence_pair_state``) under the CI profile in one process, in
collection order, stopping at the first failure, without shrinking (the time to catch, and the
case that caught it); then that one case with shrinking, writing its repro (the steps of the
shrunk script). It prints a Markdown table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swapspec.properties.rules.sequence_machine import steps_in
from tests.zoo import NO_SHRINK_ENV, SEQUENCE_ZOO, selector, zoo_module

ROOT = Path(__file__).resolve().parents[2]
SCHEDULE = "properties/rules/test_sequences.py::test_sequence_pair_state"


def run(name: str, selection: str, *, shrink: bool, repro_dir: Path) -> tuple[float, str]:
    """(seconds, output) of one pytest run of ``selection`` on zoo target ``name``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SWAPSPEC_", "PYTEST_"))}
    if not shrink:
        env[NO_SHRINK_ENV] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "tests.zoo", selection, f"--swapspec-target={selector(name)}",
           "--swapspec-profile=swapspec-ci", f"--swapspec-repro-dir={repro_dir}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    return time.perf_counter() - start, proc.stdout + proc.stderr


def first_failure(output: str) -> str | None:
    """The case id of the first ``FAILED`` line, or None."""
    for line in output.splitlines():
        if line.startswith("FAILED ") and "[" in line:
            return line.split("[", 1)[1].split("]", 1)[0]
    return None


def main() -> None:
    print("| zoo target | caught by case | time to catch (no shrinking) | shrinking | shrunk steps |")
    print("|---|---|---:|---:|---:|")
    for name in SEQUENCE_ZOO:
        if not hasattr(zoo_module(name), "CAUGHT_BY_PAIR"):
            continue
        with tempfile.TemporaryDirectory() as folder:
            seconds, output = run(name, SCHEDULE, shrink=False, repro_dir=Path(folder) / "a")
            case = first_failure(output)
            if case is None:
                print(f"| `{name}` | not caught | {seconds:.1f} s | | |")
                continue
            shrunk_s, _ = run(name, f"{SCHEDULE}[{case}]", shrink=True,
                              repro_dir=Path(folder) / "b")
            scripts = sorted((Path(folder) / "b").glob("*.py"))
            steps = min(steps_in(s.read_text()) for s in scripts) if scripts else None
            print(f"| `{name}` | `{case}` | {seconds:.1f} s | {shrunk_s:.1f} s | {steps} |")


if __name__ == "__main__":
    main()
