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
  the table, ``declared`` lists every declaration of the targets run, ``filter_rates``, and
  ``times`` (property -> target -> seconds of the call phase, summed over its tests); a
  failing cell also lists its
  failures (property, clause, message, repro), and a cell may hold the filter-rate ``cases``.
- ``--swapspec-repro-dir`` / ``SWAPSPEC_REPRO_DIR``: also write each failure's standalone repro
  to a file there, named after the test id.
- ``--swapspec-database`` / ``SWAPSPEC_DATABASE``: a directory (or ``redis://host:port/db``);
  swapspec's properties (only they) save and replay their examples in a
  ``DirectoryBasedExampleDatabase`` there (a ``RedisExampleDatabase``), so a failure found by
  one run (a fuzzing campaign, another machine on a shared folder) replays in the next.
- ``--swapspec-filter-rates``: print, for every property x target, the share of the test cases
  Hypothesis generated that were invalid (filtered by ``assume``/``filter``), and why: each
  rejected case's ``gave up because`` reason, counted (also in the JSON report's
  ``filter_rates``).
- ``--swapspec-reproduce`` (no variable: a blob never lingers in an environment): the
  ``@reproduce_failure(...)`` line a failure printed, replayed on the one property test selected.

A failure's repro is printed as its own section of the failure report, between two separator
lines and without pytest's ``E`` prefixes, ready to paste.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import random
import re
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, reproduce_failure, settings

from swapspec import reference
from swapspec.properties import crashes, deviations, plugged
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
REPRO_END = "----- end of repro -----"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("swapspec")
    group.addoption("--swapspec-target", default=None,
                    help="target(s) under test: reference, torch, torch-stateless or pkg.mod:attr")
    group.addoption("--swapspec-profile", default=None,
                    help="Hypothesis profile to load: " + ", ".join(PROFILES))
    group.addoption("--swapspec-report", default=None, help="write the conformance table as JSON")
    group.addoption("--swapspec-repro-dir", default=None,
                    help="write each failure's standalone repro to a file in this directory")
    group.addoption("--swapspec-database", default=None,
                    help="directory (or redis://host:port/db) of a Hypothesis example database "
                         "for swapspec's properties, shared by runs, processes and machines")
    group.addoption("--swapspec-filter-rates", action="store_true", default=False,
                    help="print each property x target's share of invalid generated test cases")
    group.addoption("--swapspec-property", default=None,
                    help="run only these property IDs (comma-separated, e.g. FC-TIES,APPLY-TIES)")
    group.addoption("--swapspec-reproduce", default=None, metavar="DECORATOR",
                    help="replay one failure exactly: the @reproduce_failure('V', b'...') line a "
                         "failure printed, applied to the one property test selected")
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


REPRODUCE = re.compile(r"@?reproduce_failure\(\s*(['\"])([^'\"]+)\1\s*,\s*b(['\"])([^'\"]+)\3\s*\)")


def reproduce_arguments(text: str) -> tuple[str, bytes]:
    """``(version, blob)`` of the ``@reproduce_failure('6.170.17', b'AXic...')`` line Hypothesis
    prints for a failure (a usage error for anything else)."""
    match = REPRODUCE.fullmatch(text.strip())
    if match is None:
        raise pytest.UsageError("swapspec: --swapspec-reproduce wants the line a failure printed, "
                                f"@reproduce_failure('VERSION', b'BLOB'); got {text!r}")
    return match[2], match[4].encode()


def pytest_collection_finish(session: pytest.Session) -> None:
    """``--swapspec-reproduce``: replay the given failure on the one selected property test
    (a ``@given`` property, or a sequence test through ``swapspec_sequence_replay``).

    A blob replays the failing example's choices exactly; a ``--hypothesis-seed`` replays it
    only where Hypothesis draws from the same pool of constants, which it collects from the
    local modules loaded (so selecting other test files changes the examples)."""
    text = session.config.getoption("--swapspec-reproduce")
    if not text:
        return
    version, blob = reproduce_arguments(text)
    chosen = [item for item in session.items if is_property_test(item)]
    if len(chosen) != 1:
        raise pytest.UsageError("swapspec: --swapspec-reproduce replays one property test; "
                                f"{len(chosen)} are selected (give the failed test's id)")
    test = getattr(chosen[0].obj, "__func__", chosen[0].obj)
    if getattr(test, "hypothesis", None) is None:  # a sequence test: see swapspec_sequence_replay
        session.config.stash[SEQUENCE_REPLAY] = (chosen[0].nodeid, version, blob)
        return
    reproduce_failure(version, blob)(test)


SEQUENCE_REPLAY = pytest.StashKey[tuple[str, str, bytes]]()


@pytest.fixture(autouse=True)
def swapspec_sequence_replay(request: pytest.FixtureRequest) -> Iterator[None]:
    """``--swapspec-reproduce`` on a sequence (SEQ-) test: its run replays the blob's sequence."""
    replay = request.config.stash.get(SEQUENCE_REPLAY, None)
    if replay is None or replay[0] != request.node.nodeid:
        yield
        return
    from swapspec.properties.sequences import replaying  # imported only to replay a sequence
    with replaying(replay[1], replay[2]):
        yield


def property_id(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("swapspec_property")
    return marker.args[0] if marker else None


def _target_of(item: pytest.Item) -> Target | None:
    callspec = getattr(item, "callspec", None)
    target = callspec.params.get("target") if callspec else None
    return target if isinstance(target, Target) and is_property_test(item) else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a property the target cannot run: it declares a skip, or it lacks a feature the
    property needs (``ids.NEEDS``)."""
    target, pid = _target_of(item), property_id(item)
    if target is None:
        return
    if pid in target.skips:
        pytest.skip(f"{target.name} declares a skip for {pid}: {target.skips[pid]}")
    missing = target.missing(property_ids.NEEDS.get(pid, ()))
    if missing:
        pytest.skip(f"{target.name} does not implement {' or '.join(missing)}")


@pytest.fixture(autouse=True)
def swapspec_current_target(request: pytest.FixtureRequest) -> Iterator[None]:
    """Let the properties' strategies read the running target (``plugged.CURRENT``)."""
    target = _target_of(request.node)
    if target is None:
        yield
        return
    token = plugged.CURRENT.set(target)
    try:
        yield
    finally:
        plugged.CURRENT.reset(token)


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
    message = (f"{entry['property']} on target {entry['target']!r}: the interpreter died while "
               "the target ran this example")
    report.longrepr = f"{report.longrepr}\n{message}."
    report.sections.append((deviations.REPRO_SECTION, f"{entry['repro']}{REPRO_END}"))
    failure = {"property": entry["property"], "clause": "crash", "message": message,
               "repro": entry["repro"]}
    report.user_properties.append((REPORT_KEY, {"property": entry["property"],
                                                "target": entry["target"], "deviations": {},
                                                "failures": [failure]}))


@pytest.hookimpl(wrapper=True, trylast=True)  # inside Hypothesis' own wrapper: see _count_cases
def pytest_runtest_call(item: pytest.Item):
    before = Counter(deviations.OBSERVED)
    region, shown = Counter(deviations.IN_REGION), Counter(deviations.SHOWN)
    declared = Counter(deviations.DECLARED), Counter(deviations.DECLARED_SHOWN)
    undeclared = Counter(deviations.UNDECLARED)
    try:
        with _count_cases(item):
            _key_per_target(item)
            _use_shared_database(item)
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


def _shared_database(config: pytest.Config):
    """The example database ``--swapspec-database`` / ``SWAPSPEC_DATABASE`` names (one per
    run), or None."""
    path = _option(config, "--swapspec-database", "SWAPSPEC_DATABASE")
    if path is None:
        return None
    if not hasattr(config, "swapspec_database"):
        config.swapspec_database = example_database(path)
    return config.swapspec_database


def example_database(location: str):
    """``DirectoryBasedExampleDatabase(location)``, or for ``redis://host:port/db`` a
    ``RedisExampleDatabase`` on that server (needs ``hypothesis[redis]``)."""
    if location.startswith(("redis://", "rediss://")):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(location))
    from hypothesis.database import DirectoryBasedExampleDatabase

    return DirectoryBasedExampleDatabase(location)


def _key_per_target(item: pytest.Item) -> None:
    """Give each property x target its own example-database key, derived from the test id (as
    Hypothesis does for ``@pytest.mark.parametrize`` and HypoFuzz for every test it fuzzes), so
    a target's saved examples replay on that target only, and a failure a HypoFuzz campaign
    saved replays in pytest. Under a derandomized profile every target still gets the same
    examples: the seed stays the property's own (its digest without the test id)."""
    wrapped = getattr(item.obj, "__func__", item.obj)
    inner = getattr(getattr(wrapped, "hypothesis", None), "inner_test", None)
    if inner is None or not is_property_test(item):
        return
    from hypothesis.internal.compat import int_from_bytes
    from hypothesis.internal.reflection import function_digest

    inner.__dict__.pop("_hypothesis_internal_add_digest", None)
    shared = int_from_bytes(function_digest(inner))
    inner._hypothesis_internal_add_digest = item.nodeid.encode()
    current = getattr(wrapped, "_hypothesis_internal_use_settings", None)
    wrapped._hypothesis_internal_use_seed = shared if current is not None and current.derandomize \
        else None


def _use_shared_database(item: pytest.Item) -> None:
    """Point a property's Hypothesis settings at the shared example database, if one is named.

    Only swapspec's property tests are touched, and only their ``database``: the host's
    profile (examples, phases, deadline) and its other tests stay as they are.
    """
    database = _shared_database(item.config)
    if database is None or not is_property_test(item):
        return
    test = getattr(item.obj, "__func__", item.obj)
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if current is not None and current.database is not database:
        test._hypothesis_internal_use_settings = settings(current, database=database)


@contextlib.contextmanager
def _count_cases(item: pytest.Item) -> Iterator[None]:
    """Record how many test cases Hypothesis' generate phase ran and how many of them were
    invalid (rejected by ``assume`` or a ``filter``) as ``item.swapspec_cases``.

    Overruns are left out of both counts: they are Hypothesis' own probes past its buffer
    (even ``st.lists(st.integers())`` has some), not examples a property filtered.

    Hypothesis hands its statistics to ``hypothesis.statistics.collector``; its pytest plugin
    sets that callback around the test, and this one is chained inside it, so
    ``--hypothesis-show-statistics`` keeps working.
    """
    from hypothesis.statistics import collector

    outer = collector.value

    def note(stats: dict) -> None:
        cases = stats.get("generate-phase", {}).get("test-cases", [])
        statuses = Counter(case["status"] for case in cases)
        reasons = Counter(invalid_reason(case) for case in cases if case["status"] == "invalid")
        item.swapspec_cases = {"cases": len(cases) - statuses["overrun"],
                               "invalid": statuses["invalid"], "reasons": dict(reasons)}
        if outer is not None:
            outer(stats)

    if not is_property_test(item):
        yield
        return
    with collector.with_value(note):
        yield


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
        in_call = report.when == "call"
        counts = getattr(item, "swapspec_deviations", {}) if in_call else {}
        entry = {"property": pid, "target": target.name,
                 "deviations": {clause: n for (_, _, clause), n in counts.items()},
                 "declarations": getattr(item, "swapspec_declarations", {}) if in_call else {},
                 "undeclared": getattr(item, "swapspec_undeclared", {}) if in_call else {},
                 "undeclared_messages":
                     getattr(item, "swapspec_undeclared_messages", {}) if in_call else {}}
        if report.failed:
            entry["failures"] = _failures(pid, call, report)
            _show_repros(item, report, entry["failures"])
        if report.when == "call" and hasattr(item, "swapspec_cases"):
            entry["cases"] = item.swapspec_cases
        report.user_properties.append((REPORT_KEY, entry))
    return report


def _conformance_errors(call: pytest.CallInfo) -> list[deviations.ConformanceError]:
    """The ConformanceErrors a failed test raised (Hypothesis groups distinct failures)."""
    if call.excinfo is None:
        return []
    pending, found = [call.excinfo.value], []
    while pending:
        error = pending.pop(0)
        if isinstance(error, deviations.ConformanceError):
            found.append(error)
        pending += list(getattr(error, "exceptions", ()))
    return found


def _failures(pid: str, call: pytest.CallInfo, report: pytest.TestReport) -> list[dict]:
    """One ``{property, clause, message, repro}`` per broken rule; any other failure (a stale
    declaration, an error of the suite) as one entry of clause ``""`` with its message."""
    errors = _conformance_errors(call)
    failures = [{"property": pid, "clause": v.clause, "message": v.message, "repro": e.repro}
                for e in errors for v in e.violations]
    if not failures:
        text = str(call.excinfo.value) if call.excinfo is not None else str(report.longrepr)
        failures.append({"property": pid, "clause": "", "message": " ".join(text.split())[:500],
                         "repro": ""})
    return failures


def _show_repros(item: pytest.Item, report: pytest.TestReport, failures: list[dict]) -> None:
    """Add each distinct repro as a section of the report; write it to the repro directory."""
    repros = list(dict.fromkeys(f["repro"] for f in failures if f["repro"]))
    directory = _option(item.config, "--swapspec-repro-dir", "SWAPSPEC_REPRO_DIR")
    for i, script in enumerate(repros):
        report.sections.append((deviations.REPRO_SECTION, script + REPRO_END))
        if directory:
            path = Path(directory) / (_file_name(report.nodeid) + (f"-{i}" if i else "") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(script)


def _file_name(nodeid: str) -> str:
    """A file name from a test id: ``test_apply_keeps_ties[torch]`` -> ``test_apply_keeps_ties-torch``."""
    name = nodeid.rpartition("::")[2]
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = dict(report.user_properties).get(REPORT_KEY)
    if entry is None or (report.when != "call" and report.passed):
        return
    status = _status(report, entry)
    results = _config_results(report)
    if results is not None:
        timed = {"seconds": report.duration} if report.when == "call" else {}
        results.append({**entry, "status": status, "nodeid": report.nodeid,
                        "reason": _reason(report), **timed})


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
    ``tests`` counts distinct test ids, however many reports (setup, call, teardown) each sent;
    ``failures`` lists every failure of the pair (property, clause, message, repro).
    """
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    rank = {"pass": 0, "skipped": 1, "deviation": 2, "fail": 3}
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in results:
        cell = table[r["property"]].setdefault(
            r["target"], {"status": "pass", "deviations": {}, "reason": "", "tests": 0,
                          "failures": []})
        ids = seen[(r["property"], r["target"])]
        ids.add(r.get("nodeid", str(len(ids))))
        cell["tests"] = len(ids)
        if rank[r["status"]] > rank[cell["status"]]:
            cell["status"] = r["status"]
            cell["reason"] = r["reason"]
        for clause, n in r["deviations"].items():
            cell["deviations"][clause] = cell["deviations"].get(clause, 0) + n
        cell["failures"] += r.get("failures", [])
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


TABLE_WIDTH = 100
STATUS_WORDS = {"pass": "pass", "fail": "FAIL", "deviation": "dev", "skipped": "skip"}
LONG_NAME = 20  # longer target names are shown as T1, T2... with a legend under the table
_SKIP_PREFIX = re.compile(r"^(?P<target>.+) declares a skip for \S+: (?P<reason>.*)$", re.S)


def cell_note(cell: dict) -> str:
    """The long text of a cell, shown once as a numbered note under the table: the declared
    deviations seen and their counts, the skip reason, or the broken rules."""
    if cell["status"] == "deviation":
        return "deviations seen: " + ", ".join(f"{c} x{n}" for c, n in sorted(cell["deviations"].items()))
    if cell["status"] == "skipped":
        match = _SKIP_PREFIX.match(cell["reason"])
        return (f"{match['target']} declares a skip: {match['reason']}" if match
                else f"skipped: {cell['reason']}")
    if cell["status"] == "fail":
        rules = dict.fromkeys(f"[{f['clause']}] {f['message']}" if f["clause"] else f["message"]
                              for f in cell.get("failures", []))
        return ("broken: " + "; ".join(_shortened(r) for r in rules)) if rules else ""
    return ""


def _shortened(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def render_cell(cell: dict, note: int | None = None) -> str:
    """One table cell: ``pass``, ``FAIL``, ``dev`` or ``skip``, and its note's number."""
    word = STATUS_WORDS[cell["status"]]
    return f"{word} [{note}]" if note is not None else word


def render_table(table: dict[str, dict[str, dict]], width: int = TABLE_WIDTH) -> list[str]:
    """The table in lines of at most ``width`` characters: as many target columns side by side
    as fit (more in further blocks), each cell's long text as a numbered note under it (the
    same text once), and a legend for the status words and abbreviated target names."""
    targets = sorted({t for row in table.values() for t in row})
    notes: dict[str, int] = {}
    cells: dict[tuple[str, str], str] = {}
    for pid, row in table.items():
        for target in targets:
            cell = row.get(target)
            text = cell_note(cell) if cell else ""
            number = notes.setdefault(text, len(notes) + 1) if text else None
            cells[(pid, target)] = render_cell(cell, number) if cell else "-"
    headers = {t: t if len(t) <= LONG_NAME else f"T{i}" for i, t in enumerate(targets, 1)}
    lines: list[str] = []
    for block in _column_blocks(table, targets, headers, cells, width):
        rows = [["property", *(headers[t] for t in block)],
                *([pid, *(cells[(pid, t)] for t in block)] for pid in table)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        fmt = " | ".join(f"{{:<{w}}}" for w in widths)
        lines += [fmt.format(*rows[0]).rstrip(), "-+-".join("-" * w for w in widths),
                  *(fmt.format(*r).rstrip() for r in rows[1:]), ""]
    lines += textwrap.wrap("pass: follows the spec; FAIL: breaks it; dev: passes with declared "
                           "deviations; skip: declared not to apply; -: not run", width)
    lines += [f"{h} = {t}" for t, h in headers.items() if h != t]
    for text, number in notes.items():
        lines += textwrap.wrap(text, width, initial_indent=f"[{number}] ",
                               subsequent_indent=" " * (len(str(number)) + 3))
    return lines


def _column_blocks(table, targets, headers, cells, width) -> list[list[str]]:
    """Targets in groups whose table rows fit ``width`` (at least one target per group)."""
    first = max([len("property"), *map(len, table)])
    blocks: list[list[str]] = [[]]
    used = first
    for t in targets:
        column = max([len(headers[t]), *(len(cells[(pid, t)]) for pid in table)]) + 3
        if blocks[-1] and used + column > width:
            blocks.append([])
            used = first
        blocks[-1].append(t)
        used += column
    return blocks


GAVE_UP = "gave up because: "
REASON_LENGTH = 160


def invalid_reason(case: dict) -> str:
    """Why Hypothesis rejected one test case, from its ``gave up because:`` event, shortened:
    an unsatisfied ``filter`` is named by its predicate (``...filter(predicate)``, not the
    whole strategy's repr), and any reason is cut to ``REASON_LENGTH`` characters."""
    events = [e for e in case.get("events", []) if isinstance(e, str) and e.startswith(GAVE_UP)]
    if not events:
        return "unknown"
    reason = events[0][len(GAVE_UP):]
    unsatisfied = re.match(r"(.*unable to satisfy ).*(\.filter\(.*\))$", reason, re.DOTALL)
    if unsatisfied:
        reason = unsatisfied[1] + "..." + unsatisfied[2]
    return reason if len(reason) <= REASON_LENGTH else reason[:REASON_LENGTH - 3] + "..."


def filter_rates(results: list[dict]) -> dict[str, dict[str, dict]]:
    """``{property: {target: {"cases": n, "invalid": k, "reasons": {reason: count}}}}``: the
    generate phase's test cases of every test of that pair, summed, how many of them were
    invalid, and why (``invalid_reason``)."""
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in results:
        if "cases" not in r:
            continue
        cell = table[r["property"]].setdefault(r["target"],
                                               {"cases": 0, "invalid": 0, "reasons": {}})
        cell["cases"] += r["cases"]["cases"]
        cell["invalid"] += r["cases"]["invalid"]
        for reason, count in r["cases"].get("reasons", {}).items():
            cell["reasons"][reason] = cell["reasons"].get(reason, 0) + count
    return {pid: dict(sorted(row.items())) for pid, row in sorted(table.items())}


def render_reasons(rates: dict[str, dict[str, dict]]) -> list[str]:
    """One line per property x target with invalid cases: each reason and its count, most
    common first."""
    lines = []
    for pid, row in rates.items():
        for target, cell in row.items():
            reasons = sorted(cell.get("reasons", {}).items(), key=lambda kv: (-kv[1], kv[0]))
            lines += [f"{pid} [{target}] {count}x: {reason}" for reason, count in reasons]
    return lines


def render_rate(cell: dict) -> str:
    """``12.5% (5/40)``: the invalid share of the generate phase's test cases."""
    share = 100 * cell["invalid"] / cell["cases"] if cell["cases"] else 0.0
    return f"{share:.1f}% ({cell['invalid']}/{cell['cases']})"


def render_rates(rates: dict[str, dict[str, dict]]) -> list[str]:
    """The filter-rate table as Markdown rows, property x target."""
    targets = sorted({t for row in rates.values() for t in row})
    lines = ["| property | " + " | ".join(targets) + " |",
             "|---|" + "---:|" * len(targets)]
    lines += [f"| `{pid}` | " + " | ".join(render_rate(row[t]) if t in row else "-"
                                           for t in targets) + " |"
              for pid, row in rates.items()]
    return lines


def call_times(results: list[dict]) -> dict[str, dict[str, float]]:
    """``{property: {target: seconds}}``: the call phase's wall time of every test of that pair,
    summed (setup and teardown left out, as in pytest's ``--durations``)."""
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for r in results:
        if "seconds" in r:
            row = table[r["property"]]
            row[r["target"]] = row.get(r["target"], 0.0) + r["seconds"]
    return {pid: dict(sorted(row.items())) for pid, row in sorted(table.items())}


def render_times(times: dict[str, dict[str, float]]) -> list[str]:
    """The per-property time table as Markdown rows, property x target, in seconds."""
    targets = sorted({t for row in times.values() for t in row})
    lines = ["| property | " + " | ".join(targets) + " |",
             "|---|" + "---:|" * len(targets)]
    lines += [f"| `{pid}` | " + " | ".join(f"{row[t]:.1f}" if t in row else "-" for t in targets)
              + " |" for pid, row in times.items()]
    return lines


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
    rates = filter_rates(results)
    if config.getoption("--swapspec-filter-rates"):
        terminalreporter.write_sep("=", "swapspec filter rates (invalid share of generated cases)")
        for line in render_rates(rates):
            terminalreporter.write_line(line)
        reasons = render_reasons(rates)
        if reasons:
            terminalreporter.write_line("why invalid:")
            for line in reasons:
                terminalreporter.write_line(line)
    path = _option(config, "--swapspec-report", "SWAPSPEC_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"torch": torch.__version__, "table": table, "filter_rates": rates,
                       "times": call_times(results),
                       "declared": declared_deviations(config.swapspec_targets or [])},
                      f, indent=2, sort_keys=True)
        terminalreporter.write_line(f"swapspec: wrote JSON report to {path}")
