"""swapspec's pytest plugin: target selection, Hypothesis profiles, isolation, the report.

Options (each also read from an environment variable):

- ``--swapspec-target`` / ``SWAPSPEC_TARGET``: a built-in target name or
  ``package.module:attribute`` (comma-separated for several). Default: every built-in.
- ``--swapspec-profile`` / ``SWAPSPEC_PROFILE``: load one of the registered Hypothesis
  profiles ``swapspec-dev``, ``swapspec-ci``, ``swapspec-thorough``, ``swapspec-mutation``
  (no shrinking, for ``.mutation/run``). Without it no profile
  is loaded, so the host project's own choice stands.
- ``--swapspec-report`` / ``SWAPSPEC_REPORT``: write the conformance table as JSON there.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

import reference
from properties import deviations
from properties.targets import Target, TargetError, load_targets

PROFILES = {
    "swapspec-dev": settings(max_examples=25, deadline=None),
    "swapspec-ci": settings(max_examples=40, deadline=None, derandomize=True, database=None,
                            print_blob=True, suppress_health_check=[HealthCheck.too_slow]),
    "swapspec-thorough": settings(max_examples=400, deadline=None,
                                  phases=list(Phase)),
    # Mutation testing asks only "does any example fail?": no shrinking, no replay of
    # examples a previous mutant saved, the same examples for every mutant.
    "swapspec-mutation": settings(max_examples=25, deadline=None, derandomize=True,
                                  database=None, phases=[Phase.explicit, Phase.generate],
                                  suppress_health_check=[HealthCheck.too_slow]),
}
for _name, _profile in PROFILES.items():
    settings.register_profile(_name, _profile)

REPORT_KEY = "swapspec"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("swapspec")
    group.addoption("--swapspec-target", default=None,
                    help="target(s) under test: reference, torch, torch-stateless or pkg.mod:attr")
    group.addoption("--swapspec-profile", default=None,
                    help="Hypothesis profile to load: " + ", ".join(PROFILES))
    group.addoption("--swapspec-report", default=None, help="write the conformance table as JSON")


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    return config.getoption(name) or os.environ.get(env) or None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "swapspec_property(id): the property a test checks")
    profile = _option(config, "--swapspec-profile", "SWAPSPEC_PROFILE")
    if profile is not None:
        if profile not in PROFILES:
            raise pytest.UsageError(f"swapspec: unknown profile {profile!r}; "
                                    f"choose one of {', '.join(PROFILES)}")
        settings.load_profile(profile)
    try:
        config.swapspec_targets = load_targets(
            _option(config, "--swapspec-target", "SWAPSPEC_TARGET"))
    except TargetError as e:
        raise pytest.UsageError(f"swapspec: {e}") from None
    config.swapspec_results = []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        targets = metafunc.config.swapspec_targets
        metafunc.parametrize("target", targets, ids=[t.name for t in targets])


def property_id(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("swapspec_property")
    return marker.args[0] if marker else None


def _target_of(item: pytest.Item) -> Target | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("target") if callspec else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    target, pid = _target_of(item), property_id(item)
    if target is not None and pid in target.skips:
        pytest.skip(f"{target.name} declares a skip for {pid}: {target.skips[pid]}")


@pytest.fixture(autouse=True)
def swapspec_isolation() -> Iterator[None]:
    """Restore torch's and the reference's global state after every test, even on failure.

    Covers ``torch.__future__``'s two flags, the reference's flags, the default dtype,
    grad mode and the CPU RNG (torch's and Python's). A test that leaves them changed
    fails in teardown, after they are restored.
    """
    saved = _global_state()
    rng = torch.get_rng_state()
    py_rng = random.getstate()
    yield
    leaked = {k: v for k, v in _global_state().items() if saved[k] != v}
    _restore(saved)
    torch.set_rng_state(rng)
    random.setstate(py_rng)
    if leaked:
        pytest.fail(f"test leaked global state (now restored): {sorted(leaked)}")


def _global_state() -> dict[str, object]:
    future = torch.__future__
    return {
        "torch overwrite flag": future.get_overwrite_module_params_on_conversion(),
        "torch swap flag": future.get_swap_module_params_on_conversion(),
        "reference overwrite flag": reference.get_overwrite_module_params_on_conversion(),
        "reference swap flag": reference.get_swap_module_params_on_conversion(),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
    }


def _restore(state: dict[str, object]) -> None:
    future = torch.__future__
    future.set_overwrite_module_params_on_conversion(state["torch overwrite flag"])
    future.set_swap_module_params_on_conversion(state["torch swap flag"])
    reference.set_overwrite_module_params_on_conversion(state["reference overwrite flag"])
    reference.set_swap_module_params_on_conversion(state["reference swap flag"])
    torch.set_default_dtype(state["default dtype"])
    torch.set_grad_enabled(state["grad mode"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    before = Counter(deviations.OBSERVED)
    region, shown = Counter(deviations.IN_REGION), Counter(deviations.SHOWN)
    try:
        return (yield)
    finally:
        item.swapspec_deviations = dict(Counter(deviations.OBSERVED) - before)
        hits = Counter(deviations.IN_REGION) - region
        seen = Counter(deviations.SHOWN) - shown
        item.swapspec_stale = [key for key, n in hits.items()
                               if n >= deviations.SOMETIMES_MIN_REGION and not seen[key]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    stale = getattr(item, "swapspec_stale", None)
    if report.when == "call" and report.passed and stale:
        report.outcome = "failed"
        report.longrepr = "\n".join(
            f"stale deviation: {key[2]!r} of {key[0]} on {key[1]}: its region was hit "
            f"{deviations.IN_REGION[key]} time(s) in this process and never showed the behaviour"
            for key in stale)
    pid, target = property_id(item), _target_of(item)
    if pid is not None and target is not None:
        counts = getattr(item, "swapspec_deviations", {}) if report.when == "call" else {}
        entry = {"property": pid, "target": target.name,
                 "deviations": {clause: n for (_, _, clause), n in counts.items()}}
        report.user_properties.append((REPORT_KEY, entry))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = dict(report.user_properties).get(REPORT_KEY)
    if entry is None or (report.when != "call" and report.passed):
        return
    status = _status(report, entry)
    results = _config_results(report)
    if results is not None:
        results.append({**entry, "status": status, "nodeid": report.nodeid,
                        "reason": _skip_reason(report) if report.skipped else ""})


_CONFIG: list[pytest.Config] = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG[:] = [session.config]


def _config_results(report) -> list | None:
    return _CONFIG[0].swapspec_results if _CONFIG else None


def _status(report: pytest.TestReport, entry: dict) -> str:
    if report.skipped:
        return "skipped"
    if report.failed:
        return "fail"
    return "deviation" if entry["deviations"] else "pass"


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)


def conformance_table(results: list[dict]) -> dict[str, dict[str, dict]]:
    """``{property: {target: cell}}``; a cell merges every test of that pair.

    The worst status wins (pass < skipped < deviation < fail) and brings its own reason;
    ``tests`` counts distinct test ids, however many reports (setup, call, teardown) each sent.
    """
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    rank = {"pass": 0, "skipped": 1, "deviation": 2, "fail": 3}
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in results:
        cell = table[r["property"]].setdefault(
            r["target"], {"status": "pass", "deviations": {}, "reason": "", "tests": 0})
        ids = seen[(r["property"], r["target"])]
        ids.add(r.get("nodeid", str(len(ids))))
        cell["tests"] = len(ids)
        if rank[r["status"]] > rank[cell["status"]]:
            cell["status"] = r["status"]
            cell["reason"] = r["reason"]
        for clause, n in r["deviations"].items():
            cell["deviations"][clause] = cell["deviations"].get(clause, 0) + n
    return {pid: dict(sorted(row.items())) for pid, row in sorted(table.items())}


def render_cell(cell: dict) -> str:
    """One table cell: pass / fail / deviation (count and clauses) / skipped (reason)."""
    if cell["status"] == "deviation":
        clauses = ", ".join(f"{c}x{n}" for c, n in sorted(cell["deviations"].items()))
        return f"deviation ({clauses})"
    if cell["status"] == "skipped":
        return f"skipped ({cell['reason']})"
    return cell["status"]


def render_table(table: dict[str, dict[str, dict]]) -> list[str]:
    targets = sorted({t for row in table.values() for t in row})
    header = ["property", *targets]
    rows = [[pid, *(render_cell(row[t]) if t in row else "-" for t in targets)]
            for pid, row in table.items()]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), "-+-".join("-" * w for w in widths),
            *(fmt.format(*r) for r in rows)]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    results = getattr(config, "swapspec_results", None)
    if not results or hasattr(config, "workerinput"):
        return
    table = conformance_table(results)
    terminalreporter.write_sep("=", "swapspec conformance report")
    terminalreporter.write_line(f"torch {torch.__version__}")
    for line in render_table(table):
        terminalreporter.write_line(line)
    path = _option(config, "--swapspec-report", "SWAPSPEC_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"torch": torch.__version__, "table": table}, f, indent=2, sort_keys=True)
        terminalreporter.write_line(f"swapspec: wrote JSON report to {path}")
