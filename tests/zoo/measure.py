"""Figures for the zoo: which property catches each target, after how many examples, how fast,
and how small the shrunk counterexample is.

Run from the repo root: ``python -m tests.zoo.measure [--all] [NAME ...]``.

Rules:
- Each zoo target runs in its own subprocess (``--one NAME``): ``pytest`` in-process on the
  target's ``PATHS`` under ``--swapspec-profile=swapspec-ci`` (derandomized, 40 examples),
  restricted to its ``CAUGHT_BY`` properties unless ``--all``.
- Examples are counted from Hypothesis' observability stream (one observation per test
  case the property ran): ``examples`` is the 1-based index of the first failing test case
  of the generate phase, counting every test case Hypothesis ran before it, including
  invalid ones (``assume`` failed); ``invalid`` is how many of those were invalid.
- ``caught after`` is the wall time from the start of that property's test run (Hypothesis'
  ``run_start``) to the first failing test case; ``test time`` adds shrinking and reporting.
- The shrunk size is ``tree_info(module).n_modules`` / ``n_tensors`` of the module in the
  final (minimal) failing example, rebuilt from the ``TreeSpec`` in the failure's repro.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TREE_RE = re.compile(r"build_tree\((TreeSpec\(.*\))\)\s*$", re.MULTILINE)


@dataclass
class PropertyFigures:
    """What one property test did on one zoo target."""

    property: str
    failed: bool = False
    examples: int | None = None
    invalid: int | None = None
    caught_after_s: float | None = None
    test_time_s: float | None = None
    n_modules: int | None = None
    n_tensors: int | None = None


@dataclass
class TargetFigures:
    """All property figures of one zoo target, plus the total run time."""

    name: str
    origin: str
    properties: list[PropertyFigures] = field(default_factory=list)
    run_time_s: float = 0.0

    def catcher(self) -> PropertyFigures | None:
        """The failing property whose first failure came soonest."""
        failed = [p for p in self.properties if p.failed and p.caught_after_s is not None]
        return min(failed, key=lambda p: p.caught_after_s, default=None)


# ---- in the subprocess ------------------------------------------------------------------


class _Recorder:
    """A pytest plugin that records observations and failure texts per property test."""

    def __init__(self) -> None:
        self.cases: dict[str, list[tuple[float, Any]]] = {}
        self.reports: dict[str, Any] = {}
        self.durations: dict[str, float] = {}

    def observe(self, obs: Any) -> None:
        if getattr(obs, "type", None) == "test_case":
            self.cases.setdefault(obs.property, []).append((time.time(), obs))

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call":
            self.reports[report.nodeid] = report
            self.durations[report.nodeid] = report.duration


def _figures(nodeid: str, recorder: _Recorder, pid: str) -> PropertyFigures:
    """Count test cases up to the first generate-phase failure; size the minimal example."""
    report = recorder.reports.get(nodeid)
    fig = PropertyFigures(pid, failed=bool(report and report.failed),
                          test_time_s=round(recorder.durations.get(nodeid, 0.0), 2))
    cases = recorder.cases.get(nodeid, [])
    for index, (stamp, obs) in enumerate(cases, start=1):
        if obs.status == "failed":
            fig.examples = index
            fig.invalid = sum(1 for _, o in cases[:index] if o.status == "gave_up")
            fig.caught_after_s = round(stamp - obs.run_start, 2)
            break
    if fig.failed:
        fig.n_modules, fig.n_tensors = _shrunk_size(str(report.longrepr))
    return fig


def _shrunk_size(text: str) -> tuple[int | None, int | None]:
    """Module/tensor counts of the last ``build_tree(TreeSpec(...))`` in a failure text."""
    from swapspec.strategies import build_tree, tree_info
    from swapspec.strategies import trees as spec_classes

    specs = TREE_RE.findall(text)
    if not specs:
        return None, None
    namespace = {name: getattr(spec_classes, name) for name in spec_classes.SPEC_CLASSES}
    info = tree_info(build_tree(eval(specs[-1], namespace)))
    return info.n_modules, info.n_tensors


def measure_one(name: str, run_all: bool) -> TargetFigures:
    """Run one zoo target's properties in this process and collect its figures."""
    import pytest
    from hypothesis.internal.observability import add_observability_callback

    from swapspec.properties.harness.marking import property_id
    from tests.zoo import PROPERTIES_ENV, selector, zoo_module

    zoo = zoo_module(name)
    if not run_all:
        os.environ[PROPERTIES_ENV] = ",".join(sorted(zoo.CAUGHT_BY))
    recorder = _Recorder()
    add_observability_callback(recorder.observe)
    ids: dict[str, str] = {}

    class _Ids:
        def pytest_collection_finish(self, session: Any) -> None:
            ids.update({item.nodeid: property_id(item) for item in session.items})

    start = time.monotonic()
    pytest.main(["-q", "-p", "no:cacheprovider", "-p", "tests.zoo", *zoo.PATHS,
                 f"--swapspec-target={selector(name)}", "--swapspec-profile=swapspec-ci"],
                plugins=[recorder, _Ids()])
    figures = TargetFigures(name, zoo.ORIGIN, run_time_s=round(time.monotonic() - start, 1))
    figures.properties = [_figures(nodeid, recorder, pid) for nodeid, pid in ids.items() if pid]
    return figures


# ---- the driver ---------------------------------------------------------------------------


def run_subprocess(name: str, run_all: bool) -> TargetFigures:
    """Measure one zoo target in a fresh interpreter (no shared torch/Hypothesis state)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SWAPSPEC_", "PYTEST_", "HYPOTHESIS_"))}
    env["HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [sys.executable, "-m", "tests.zoo.measure", "--one", name, "--out", str(out)]
        cmd += ["--all"] if run_all else []
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        if not out.exists():
            raise RuntimeError(f"measuring {name} wrote no figures:\n{done.stderr[-2000:]}")
        data = json.loads(out.read_text())
    props = [PropertyFigures(**p) for p in data.pop("properties")]
    return TargetFigures(**data, properties=props)


def table(rows: list[TargetFigures]) -> list[str]:
    """A markdown table: one line per zoo target."""
    lines = ["| zoo target | origin | caught by (first) | all failing | examples (invalid) "
             "| caught after | test time | shrunk modules/tensors |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        first = row.catcher()
        failing = ", ".join(sorted(p.property for p in row.properties if p.failed)) or "NONE"
        if first is None:
            lines.append(f"| {row.name} | {row.origin} | NOT CAUGHT | {failing} | - | - | - | - |")
            continue
        lines.append(f"| {row.name} | {row.origin} | {first.property} | {failing} | "
                     f"{first.examples} ({first.invalid}) | {first.caught_after_s} s | "
                     f"{first.test_time_s} s | {first.n_modules}/{first.n_tensors} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    from tests.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="zoo targets (default: all)")
    parser.add_argument("--all", action="store_true", help="run every property in PATHS")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        figures = measure_one(args.one, args.all)
        Path(args.out).write_text(json.dumps(asdict(figures)))
        return
    rows = []
    for name in args.names or ZOO:
        rows.append(run_subprocess(name, args.all))
        print(f"measured {name}: {rows[-1].run_time_s} s", file=sys.stderr, flush=True)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
