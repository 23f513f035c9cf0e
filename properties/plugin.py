"""swapspec's pytest plugin: target selection, Hypothesis profiles, isolation, the report.

Installed, it is registered through the ``pytest11`` entry point ``swapspec.properties.plugin``;
vendored, load it with ``-p swapspec.properties.plugin``. In a host's own tests it is inert:
it adds its options and touches only tests marked ``swapspec_property`` (swapspec's
properties, or a host's own tests that opt in with the marker).

Options (each also read from an environment variable, then from the ini file):

- ``--swapspec-target`` / ``SWAPSPEC_TARGET`` / ini ``swapspec_target``: a built-in target
  name, ``all`` (every built-in), ``package.module`` or ``package.module:attribute``
  (comma-separated for several). Collecting swapspec's properties without one is an error,
  so a host's run never silently tests the built-ins instead of the host's code.
- ``--swapspec-profile`` / ``SWAPSPEC_PROFILE``: load one of the registered Hypothesis
  profiles ``swapspec-dev``, ``swapspec-ci``, ``swapspec-thorough``, ``swapspec-mutation``
  (no shrinking, for ``.mutation/run``). Without it no profile
  is loaded, so the host project's own choice stands.
- ``--swapspec-report`` / ``SWAPSPEC_REPORT``: write the conformance table as JSON there:
  ``{"torch": version, "table": {property: {target: cell}}}``; a cell holds ``status``,
  ``reason`` (a skip's reason, a failure's first line), ``tests``, ``deviations`` (declared
  clause -> examples), ``declarations`` (declaration key -> ``[examples it applied to,
  examples that showed it]``), ``undeclared`` (survey mode: clause -> examples) and
  ``undeclared_messages`` (clause -> its first example's message); beside
  the table, ``declared`` lists every declaration of the targets run.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

from swapspec import reference
from swapspec.properties import crashes, deviations
from swapspec.properties import ids as property_ids
from swapspec.properties.targets import Target, TargetError, load_targets
from swapspec.reference import overrides as reference_overrides

PROPERTIES_DIR = Path(__file__).resolve().parent

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
REPRO_START = "----- standalone repro (python) -----"
REPRO_END = "----- end of repro -----"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("swapspec")
    group.addoption("--swapspec-target", default=None,
                    help="target(s) under test: reference, torch, torch-stateless or pkg.mod:attr")
    group.addoption("--swapspec-profile", default=None,
                    help="Hypothesis profile to load: " + ", ".join(PROFILES))
    group.addoption("--swapspec-report", default=None, help="write the conformance table as JSON")
    group.addoption("--swapspec-property", default=None,
                    help="run only these property IDs (comma-separated, e.g. FC-TIES,APPLY-TIES)")
    parser.addini("swapspec_target", "default target(s) when neither --swapspec-target nor "
                  "SWAPSPEC_TARGET is given", default="")


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    return config.getoption(name) or os.environ.get(env) or None


def _target_spec(config: pytest.Config) -> str | None:
    return _option(config, "--swapspec-target", "SWAPSPEC_TARGET") or config.getini(
        "swapspec_target") or None


NO_TARGET = ("swapspec: no target chosen. Name the implementation under test with "
             "--swapspec-target=pkg.mod[:attr] (or SWAPSPEC_TARGET, or swapspec_target in the "
             "ini file); --swapspec-target=all runs the built-in targets")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "swapspec_property(id): the property a test checks")
    profile = _option(config, "--swapspec-profile", "SWAPSPEC_PROFILE")
    if profile is not None:
        if profile not in PROFILES:
            raise pytest.UsageError(f"swapspec: unknown profile {profile!r}; "
                                    f"choose one of {', '.join(PROFILES)}")
        settings.load_profile(profile)
    spec = _target_spec(config)
    if spec is None and _collects_properties(config):
        raise pytest.UsageError(NO_TARGET)
    try:
        config.swapspec_targets = load_targets(spec) if spec else None
    except TargetError as e:
        raise pytest.UsageError(f"swapspec: {e}") from None
    config.swapspec_results = []
    if not hasattr(config, "workerinput"):
        crashes.make_directory()


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        crashes.remove_directory()


def _collects_properties(config: pytest.Config) -> bool:
    """Whether the run's paths reach swapspec's properties (the folder, a file in it, or a
    folder above it)."""
    for arg in config.args:
        path = _arg_path(arg.split("::", 1)[0], pyargs=config.option.pyargs)
        if path is not None and (path == PROPERTIES_DIR or path in PROPERTIES_DIR.parents
                                 or PROPERTIES_DIR in path.parents):
            return True
    return False


def _arg_path(arg: str, *, pyargs: bool) -> Path | None:
    if pyargs:
        with contextlib.suppress(ImportError, ValueError, AttributeError):
            spec = importlib.util.find_spec(arg)
            if spec is not None and spec.origin:
                return Path(spec.origin).resolve().parent
    path = Path(arg)
    return path.resolve() if path.exists() else None


def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """swapspec's properties folder is a plain directory to pytest: no ``__init__`` import,
    so nothing is put on ``sys.path`` (see ``pytest_pycollect_makemodule``)."""
    if path.resolve() == PROPERTIES_DIR:
        return pytest.Dir.from_parent(parent, path=path)
    return None


class PropertyModule(pytest.Module):
    """A test file of swapspec's properties, imported by its package name
    (``swapspec.properties.test_apply``) however it was reached: installed, vendored or from
    the checkout. Its folder never goes on ``sys.path``, so its file names cannot clash with a
    host's (``test_apply.py``, ``strategies.py``)."""

    def _getobj(self):
        return importlib.import_module(f"swapspec.properties.{self.path.stem}")


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.resolve().parent == PROPERTIES_DIR:
        return PropertyModule.from_parent(parent, path=module_path)
    return None


def is_property_test(node: pytest.Item | pytest.Metafunc) -> bool:
    """Tests the plugin acts on: those marked ``swapspec_property``."""
    definition = getattr(node, "definition", node)
    return definition.get_closest_marker("swapspec_property") is not None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames and is_property_test(metafunc):
        targets = metafunc.config.swapspec_targets
        if targets is None:
            pytest.fail(NO_TARGET, pytrace=False)
        metafunc.parametrize("target", targets, ids=[t.name for t in targets])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each property test answers ``-k`` by its property ID; ``--swapspec-property`` keeps
    only the named ones among them, and leaves other tests alone (an unknown ID is a usage error,
    so a typo never selects nothing)."""
    for item in items:
        pid = property_id(item)
        if pid is not None:
            item.extra_keyword_matches.add(pid)
    wanted = _option(config, "--swapspec-property", "SWAPSPEC_PROPERTY")
    if not wanted:
        return
    ids = {w.strip() for w in wanted.split(",") if w.strip()}
    unknown = sorted(ids - set(property_ids.ALL))
    if unknown:
        raise pytest.UsageError(f"swapspec: unknown property ID(s) {', '.join(unknown)}; "
                                f"known: {', '.join(property_ids.ALL)}")
    keep = [item for item in items if property_id(item) in ids or property_id(item) is None]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def property_id(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("swapspec_property")
    return marker.args[0] if marker else None


def _target_of(item: pytest.Item) -> Target | None:
    callspec = getattr(item, "callspec", None)
    target = callspec.params.get("target") if callspec else None
    return target if isinstance(target, Target) and is_property_test(item) else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    target, pid = _target_of(item), property_id(item)
    if target is not None and pid in target.skips:
        pytest.skip(f"{target.name} declares a skip for {pid}: {target.skips[pid]}")


@pytest.fixture(autouse=True)
def swapspec_isolation(request: pytest.FixtureRequest) -> Iterator[None]:
    """Restore global state after every swapspec property test (see ``isolated_global_state``).

    Other tests of the host are left alone.
    """
    if not is_property_test(request.node):
        yield
        return
    with isolated_global_state():
        yield


@contextlib.contextmanager
def isolated_global_state() -> Iterator[None]:
    """Restore torch's and the reference's global state on exit, even on failure.

    Covers ``torch.__future__``'s two flags, the reference's flags and ``_apply`` override
    registrations, the default dtype, grad mode and the CPU RNG (torch's and Python's). A body
    that leaves them changed fails (``pytest.fail``) after they are restored.
    """
    saved = _global_state()
    rng = torch.get_rng_state()
    py_rng = random.getstate()
    try:
        yield
    finally:
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
        "reference apply overrides": reference_overrides.registered_apply_overrides(),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
    }


def _restore(state: dict[str, object]) -> None:
    future = torch.__future__
    future.set_overwrite_module_params_on_conversion(state["torch overwrite flag"])
    future.set_swap_module_params_on_conversion(state["torch swap flag"])
    reference.set_overwrite_module_params_on_conversion(state["reference overwrite flag"])
    reference.set_swap_module_params_on_conversion(state["reference swap flag"])
    reference_overrides.restore_registered_apply_overrides(state["reference apply overrides"])
    torch.set_default_dtype(state["default dtype"])
    torch.set_grad_enabled(state["grad mode"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Name the running test for the crash recorder; forget its in-flight example after."""
    crashes.CURRENT["nodeid"] = item.nodeid
    try:
        return (yield)
    finally:
        crashes.clear()
        crashes.CURRENT.clear()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """xdist lost a worker while it ran ``crashitem``: attach the in-flight repro and put the
    failure in the conformance table."""
    entry = crashes.find(crashitem)
    if entry is None:
        return
    report.longrepr = (f"{report.longrepr}\n{entry['property']} on target {entry['target']!r}: "
                       "the interpreter died while the target ran this example.\n\n"
                       f"{REPRO_START}\n{entry['repro']}\n{REPRO_END}")
    report.user_properties.append((REPORT_KEY, {"property": entry["property"],
                                                "target": entry["target"], "deviations": {}}))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    before = Counter(deviations.OBSERVED)
    region, shown = Counter(deviations.IN_REGION), Counter(deviations.SHOWN)
    declared = Counter(deviations.DECLARED), Counter(deviations.DECLARED_SHOWN)
    undeclared = Counter(deviations.UNDECLARED)
    try:
        return (yield)
    finally:
        item.swapspec_deviations = dict(Counter(deviations.OBSERVED) - before)
        applied = Counter(deviations.DECLARED) - declared[0]
        showed = Counter(deviations.DECLARED_SHOWN) - declared[1]
        item.swapspec_declarations = {key[2]: [n, showed[key]] for key, n in applied.items()}
        new_undeclared = Counter(deviations.UNDECLARED) - undeclared
        item.swapspec_undeclared = {clause: n for (_, _, clause), n in new_undeclared.items()}
        item.swapspec_undeclared_messages = {key[2]: deviations.UNDECLARED_MESSAGES.get(key, "")
                                             for key in new_undeclared}
        hits = Counter(deviations.IN_REGION) - region
        seen = Counter(deviations.SHOWN) - shown
        item.swapspec_stale = [key for key, n in hits.items()
                               if n >= deviations.SOMETIMES_MIN_REGION and not seen[key]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    stale = getattr(item, "swapspec_stale", None)
    if report.when == "call" and report.passed and stale and not deviations.surveying():
        report.outcome = "failed"
        report.longrepr = "\n".join(
            f"stale deviation: {key[2]!r} of {key[0]} on {key[1]}: its region was hit "
            f"{deviations.IN_REGION[key]} time(s) in this process and never showed the behaviour"
            for key in stale)
    pid, target = property_id(item), _target_of(item)
    if pid is not None and target is not None:
        call = report.when == "call"
        counts = getattr(item, "swapspec_deviations", {}) if call else {}
        entry = {"property": pid, "target": target.name,
                 "deviations": {clause: n for (_, _, clause), n in counts.items()},
                 "declarations": getattr(item, "swapspec_declarations", {}) if call else {},
                 "undeclared": getattr(item, "swapspec_undeclared", {}) if call else {},
                 "undeclared_messages":
                     getattr(item, "swapspec_undeclared_messages", {}) if call else {}}
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
                        "reason": _reason(report)})


_CONFIG: list[pytest.Config] = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG[:] = [session.config]


def _config_results(report) -> list | None:
    return _CONFIG[0].swapspec_results if _CONFIG else None


def _status(report: pytest.TestReport, entry: dict) -> str:
    if report.skipped:
        return "skipped"
    if report.failed or entry.get("undeclared"):
        return "fail"
    return "deviation" if entry["deviations"] else "pass"


def _reason(report: pytest.TestReport) -> str:
    """A skip's reason, a failure's first line (exception type and message), else empty."""
    longrepr = report.longrepr
    if report.skipped:
        return longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)
    if report.failed:
        crash = getattr(longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(longrepr)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " ".join(lines[:2])[:200]
    return ""


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
        _merge_counts(cell, r)
    return {pid: dict(sorted(row.items())) for pid, row in sorted(table.items())}


def _merge_counts(cell: dict, result: dict) -> None:
    """Add a result's declaration counts ``[applied, shown]`` and undeclared clause counts."""
    declarations = cell.setdefault("declarations", {})
    for key, (applied, shown) in result.get("declarations", {}).items():
        total = declarations.setdefault(key, [0, 0])
        total[0] += applied
        total[1] += shown
    undeclared = cell.setdefault("undeclared", {})
    for clause, n in result.get("undeclared", {}).items():
        undeclared[clause] = undeclared.get(clause, 0) + n
    messages = cell.setdefault("undeclared_messages", {})
    for clause, message in result.get("undeclared_messages", {}).items():
        messages.setdefault(clause, message)


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


def declared_deviations(targets: list[Target]) -> list[dict]:
    """Every deviation the targets declare: key, properties, clauses, ``torch_versions``, targets."""
    found: dict[tuple, dict] = {}
    for target in targets:
        for d in target.deviations:
            entry = found.setdefault((d.key, d.property_ids), {
                "key": d.key, "properties": list(d.property_ids), "clauses": list(d.clauses),
                "torch_versions": list(d.torch_versions), "always": d.always, "targets": []})
            if target.name not in entry["targets"]:
                entry["targets"].append(target.name)
    return list(found.values())


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
            json.dump({"torch": torch.__version__, "table": table,
                       "declared": declared_deviations(config.swapspec_targets or [])},
                      f, indent=2, sort_keys=True)
        terminalreporter.write_line(f"swapspec: wrote JSON report to {path}")
