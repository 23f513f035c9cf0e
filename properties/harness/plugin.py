"""swapspec's pytest plugin: target selection, Hypothesis profiles, isolation, the report.

Installed, it is registered through the ``pytest11`` entry point ``swapspec.properties.harness.plugin``;
vendored, load it with ``-p swapspec.properties.harness.plugin``. In a host's own tests it is inert:
it adds its options and touches only tests marked ``swapspec_property`` (swapspec's
properties, or a host's own tests that opt in with the marker).

Options (each also read from an environment variable, then from the ini file):

- ``--swapspec-target`` / ``SWAPSPEC_TARGET`` / ini ``swapspec_target``: a built-in target
  name, ``all`` (every built-in), ``module``, ``package.module`` or either with ``:attribute``
  (comma-separated for several); a module not importable otherwise is looked for in the folder
  pytest was started in, then in the rootdir. Collecting swapspec's properties without one is an error,
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
  failures (property, clause, message, repro), and a cell may hold the filter-rate ``cases``;
  for a target with host material (its own ``modules`` or ``conversions``), ``host_reach``
  (property -> target -> the valid examples, how many drew a host module, how many a host
  conversion, and each host name's count; also printed after the table).
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
- ``--swapspec-coverage``: measure, with coverage.py, which statements of each target's code
  the run executed, per function (``properties.harness.coverage``: the scopes, xdist, the
  exclusions); printed after the table, and the JSON report's ``coverage``.
- ``--swapspec-reproduce`` (no variable: a blob never lingers in an environment): the
  ``@reproduce_failure(...)`` line a failure printed, replayed on the one property test selected.

A failure's repro is printed as its own section of the failure report, between two separator
lines and without pytest's ``E`` prefixes, ready to paste; a ``swapspec replay`` section gives
the command line that replays the failure (``replay_command``).

With the example database off (the profile's ``database`` None, no ``--swapspec-database``) and
no ``HYPOTHESIS_STORAGE_DIRECTORY``, Hypothesis' other files go to a temporary folder removed
after the run: nothing is written to the host's working directory.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import tempfile
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import reproduce_failure, settings

from swapspec.properties import vocabulary
from swapspec.properties.harness import checker, crashes, pairs, plugged
from swapspec.properties.harness.database import _key_per_target, _use_shared_database
from swapspec.properties.harness.isolation import isolated_global_state
from swapspec.properties.harness.marking import is_property_test, property_id
from swapspec.properties.harness.report import (
    call_times,
    conformance_table,
    declared_deviations,
    filter_rates,
    host_case_reach,
    host_reach,
    invalid_reason,
    render_host_reach,
    render_rates,
    render_reasons,
    render_table,
)
from swapspec.properties.harness.settings import NO_TARGET, PROFILES, _option, _target_spec
from swapspec.properties.harness.targets import Target, TargetError, load_targets
from swapspec.properties.models.examples import comparing
from swapspec.properties.models.outcomes import raised_by_target

PROPERTIES_DIR = Path(__file__).resolve().parent.parent  # the properties folder
RULES_DIR = PROPERTIES_DIR / "rules"  # its rule files: the tests pytest collects


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
    group.addoption("--swapspec-coverage", action="store_true", default=False,
                    help="measure which statements of the targets' code the run executed, per "
                         "function (coverage.py; console and JSON report)")
    group.addoption("--swapspec-reproduce", default=None, metavar="DECORATOR",
                    help="replay one failure exactly: the @reproduce_failure('V', b'...') line a "
                         "failure printed, applied to the one property test selected")
    parser.addini("swapspec_target", "default target(s) when neither --swapspec-target nor "
                  "SWAPSPEC_TARGET is given", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "swapspec_property(id): the property a test checks")
    config.addinivalue_line("markers", "swapspec_per_target(argname, cases_of): cases per target "
                            "(properties.harness.marking.per_target_cases)")
    # A drawn real-dtype conversion of a complex tensor drops its imaginary part on purpose
    # (strategies.conversions); torch's warning about it is the conversion's, not a finding.
    config.addinivalue_line(
        "filterwarnings", "ignore:Casting complex values to real discards:UserWarning")
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
        search = (config.invocation_params.dir, config.rootpath)
        config.swapspec_targets = load_targets(spec, search) if spec else None
    except TargetError as e:
        raise pytest.UsageError(f"swapspec: {e}") from None
    config.swapspec_results = []
    _storage_outside_the_tree(config)
    if not hasattr(config, "workerinput"):
        crashes.make_directory()
    if config.getoption("--swapspec-coverage"):
        from swapspec.properties.harness import coverage
        coverage.configure(config, config.swapspec_targets)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        crashes.remove_directory()
    _restore_storage(config)


STORAGE_ENV = "HYPOTHESIS_STORAGE_DIRECTORY"


def _storage_outside_the_tree(config: pytest.Config) -> None:
    """With the example database off (the loaded profile's ``database`` is None and no
    ``--swapspec-database``) and no storage directory chosen (``HYPOTHESIS_STORAGE_DIRECTORY``),
    Hypothesis' other files (its unicode table cache, the explain phase's patches) go to a
    temporary folder removed after the run, not to ``.hypothesis/`` in the working directory:
    nothing is written to the host's tree."""
    from hypothesis import configuration

    if (settings().database is not None or os.environ.get(STORAGE_ENV)
            or _option(config, "--swapspec-database", "SWAPSPEC_DATABASE")):
        return
    saved = vars(configuration).get("__hypothesis_home_directory")
    folder = tempfile.mkdtemp(prefix="swapspec-hypothesis-")
    configuration.set_hypothesis_home_dir(folder)
    config.stash[STORAGE] = (folder, saved)


STORAGE = pytest.StashKey[tuple[str, object]]()


def _restore_storage(config: pytest.Config) -> None:
    """Undo ``_storage_outside_the_tree``: Hypothesis' home folder back, the temporary one gone."""
    from hypothesis import configuration

    made = config.stash.get(STORAGE, None)
    if made is None:
        return
    folder, saved = made
    configuration.set_hypothesis_home_dir(saved)
    shutil.rmtree(folder, ignore_errors=True)
    del config.stash[STORAGE]


def _collects_properties(config: pytest.Config) -> bool:
    """Whether the run's paths reach swapspec's rule files (``properties/rules``, a file in it,
    or a folder above it)."""
    for arg in config.args:
        path = _arg_path(arg.split("::", 1)[0], pyargs=config.option.pyargs)
        if path is not None and (path == RULES_DIR or path in RULES_DIR.parents
                                 or RULES_DIR in path.parents):
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
    """swapspec's properties folder and the folders in it are plain directories to pytest: no
    ``__init__`` import, so nothing is put on ``sys.path`` (see ``pytest_pycollect_makemodule``)."""
    resolved = path.resolve()
    if resolved == PROPERTIES_DIR or PROPERTIES_DIR in resolved.parents:
        return pytest.Dir.from_parent(parent, path=path)
    return None


class PropertyModule(pytest.Module):
    """A test file of swapspec's properties, imported by its package name
    (``swapspec.properties.rules.test_apply``) however it was reached: installed, vendored or from
    the checkout. Its folder never goes on ``sys.path``, so its file names cannot clash with a
    host's (``test_apply.py``, ``strategies.py``)."""

    def _getobj(self):
        return importlib.import_module(f"swapspec.properties.rules.{self.path.stem}")


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.resolve().parent == RULES_DIR:
        return PropertyModule.from_parent(parent, path=module_path)
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames and is_property_test(metafunc):
        targets = metafunc.config.swapspec_targets
        if targets is None:
            pytest.fail(NO_TARGET, pytrace=False)
        cases = metafunc.definition.get_closest_marker("swapspec_per_target")
        if cases is None:
            metafunc.parametrize("target", targets, ids=[t.name for t in targets])
            return
        argname, cases_of = cases.args
        combos = [(t, value, f"{t.name}-{case}") for t in targets for case, value in cases_of(t)]
        metafunc.parametrize(("target", argname), [c[:2] for c in combos],
                             ids=[c[2] for c in combos])


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
    unknown = sorted(ids - set(vocabulary.ALL))
    if unknown:
        raise pytest.UsageError(f"swapspec: unknown property ID(s) {', '.join(unknown)}; "
                                f"known: {', '.join(vocabulary.ALL)}")
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
    from swapspec.properties.harness.sequence_replay import replaying
    with replaying(replay[1], replay[2]):
        yield


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
    by_design = target.design_skip(pid)
    if by_design is not None:
        pytest.skip(f"{target.name} skips {pid}: {by_design}")
    missing = target.missing(vocabulary.NEEDS.get(pid, ()))
    if missing:
        pytest.skip(f"{target.name} does not implement {' or '.join(missing)}")


@pytest.fixture(autouse=True)
def swapspec_current_target(request: pytest.FixtureRequest) -> Iterator[None]:
    """Let the properties' strategies read the running target and draw its host material
    (``plugged.running``), and compare values of its own tensor classes its way
    (``Target.comparisons``)."""
    target = _target_of(request.node)
    if target is None:
        yield
        return
    with plugged.running(target), comparing(target.comparisons):
        yield


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
    report.sections.append((checker.REPRO_SECTION, f"{entry['repro']}{REPRO_END}"))
    failure = {"property": entry["property"], "clause": "crash", "message": message,
               "repro": entry["repro"]}
    report.user_properties.append((REPORT_KEY, {"property": entry["property"],
                                                "target": entry["target"], "deviations": {},
                                                "failures": [failure]}))


@pytest.hookimpl(wrapper=True, trylast=True)  # inside Hypothesis' own wrapper: see _count_cases
def pytest_runtest_call(item: pytest.Item):
    before = Counter(checker.OBSERVED)
    region, shown = Counter(checker.IN_REGION), Counter(checker.SHOWN)
    declared = Counter(checker.DECLARED), Counter(checker.DECLARED_SHOWN)
    undeclared = Counter(checker.UNDECLARED)
    not_run = Counter(checker.NOT_RUN)
    pairs_before = pairs.snapshot()
    try:
        with _count_cases(item):
            _key_per_target(item)
            _use_shared_database(item)
            return (yield)
    finally:
        item.swapspec_pairs = pairs.taken(pairs_before)
        item.swapspec_deviations = dict(Counter(checker.OBSERVED) - before)
        applied = Counter(checker.DECLARED) - declared[0]
        showed = Counter(checker.DECLARED_SHOWN) - declared[1]
        item.swapspec_declarations = {key[2]: [n, showed[key]] for key, n in applied.items()}
        item.swapspec_not_run = {key[2]: n for key, n in (Counter(checker.NOT_RUN) - not_run).items()}
        new_undeclared = Counter(checker.UNDECLARED) - undeclared
        item.swapspec_undeclared = {clause: n for (_, _, clause), n in new_undeclared.items()}
        item.swapspec_undeclared_messages = {key[2]: checker.UNDECLARED_MESSAGES.get(key, "")
                                             for key in new_undeclared}
        hits = Counter(checker.IN_REGION) - region
        seen = Counter(checker.SHOWN) - shown
        item.swapspec_stale = checker.stale_sometimes(hits, seen)


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
        if _has_host_material(_target_of(item)):
            item.swapspec_host_reach = host_case_reach(cases)
        if outer is not None:
            outer(stats)

    if not is_property_test(item):
        yield
        return
    with collector.with_value(note):
        yield


def _has_host_material(target: Target | None) -> bool:
    """Whether ``target`` plugs in modules or conversions of its own."""
    return target is not None and (target.modules is not None or target.conversions is not None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    stale = getattr(item, "swapspec_stale", None)
    if report.when == "call" and report.passed and stale and not vocabulary.surveying():
        report.outcome = "failed"
        report.longrepr = "\n".join(
            f"stale deviation: {key[2]!r} of {key[0]} on {key[1]}: its region was hit "
            f"{checker.IN_REGION[key]} time(s) in this process and never showed the behaviour"
            for key in stale)
    pid, target = property_id(item), _target_of(item)
    if pid is not None and target is not None:
        in_call = report.when == "call"
        counts = getattr(item, "swapspec_deviations", {}) if in_call else {}
        entry = {"property": pid, "target": target.name,
                 "deviations": {clause: n for (_, _, clause), n in counts.items()},
                 "declarations": getattr(item, "swapspec_declarations", {}) if in_call else {},
                 "not_run": getattr(item, "swapspec_not_run", {}) if in_call else {},
                 "undeclared": getattr(item, "swapspec_undeclared", {}) if in_call else {},
                 "undeclared_messages":
                     getattr(item, "swapspec_undeclared_messages", {}) if in_call else {}}
        if report.failed:
            error = harness_error(call)
            entry["failures"] = (_failures(pid, call, report) if error is None
                                 else [harness_failure(pid, error)])
            entry["harness_error"] = error is not None
            _show_repros(item, report, entry["failures"])
            _show_replay(item, report, target, entry["failures"])
        if report.when == "call" and hasattr(item, "swapspec_cases"):
            entry["cases"] = item.swapspec_cases
        if report.when == "call" and hasattr(item, "swapspec_host_reach"):
            entry["host_reach"] = item.swapspec_host_reach
        if report.when == "call" and getattr(item, "swapspec_pairs", None):
            entry["pairs"] = item.swapspec_pairs
        report.user_properties.append((REPORT_KEY, entry))
    return report


def _raised(call: pytest.CallInfo) -> list[BaseException]:
    """The exception a failed test raised and every exception grouped in it (Hypothesis groups
    distinct failures)."""
    if call.excinfo is None:
        return []
    pending, found = [call.excinfo.value], []
    while pending:
        error = pending.pop(0)
        found.append(error)
        pending += list(getattr(error, "exceptions", ()))
    return found


def harness_error(call: pytest.CallInfo) -> BaseException | None:
    """The exception of a test that failed in the suite's own code, else None.

    A failure is the target's when it raised a ``ConformanceError`` (a broken rule, a stale
    declaration) or let out an error a target call raised (``outcomes.raised_by_target``). Any
    other exception (a comparison, snapshot or strategy of the suite that raised, a
    Hypothesis health check) is a harness error: no verdict on the target."""
    raised = _raised(call)
    if not raised or any(isinstance(e, checker.ConformanceError) or raised_by_target(e)
                         for e in raised):
        return None
    return raised[0]


TRACEBACK_CHARS = 6000  # a harness error's traceback in the JSON report: its last characters


def harness_failure(pid: str, error: BaseException) -> dict:
    """The failure entry of a harness error: clause ``""``, its message with where swapspec's
    code raised it, and its traceback (``traceback``)."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if "/swapspec/" in f.filename or "/properties/" in f.filename
            or "/strategies/" in f.filename]
    where = f" (in swapspec's {_short(ours[-1])})" if ours else ""
    text = " ".join(f"{type(error).__name__}: {error}".split())[:400]
    shown = _from_the_test(frames)
    trace = "".join([*traceback.format_list(shown), f"{type(error).__name__}: {error}"])
    return {"property": pid, "clause": "", "message": f"harness error: {text}{where}",
            "repro": "", "traceback": trace[-TRACEBACK_CHARS:]}


def _from_the_test(frames: traceback.StackSummary) -> list[traceback.FrameSummary]:
    """The frames below the last one of pytest and pluggy: the test's own, down to the raise."""
    runner = [i for i, f in enumerate(frames) if "/_pytest/" in f.filename
              or "/pluggy/" in f.filename]
    return list(frames[runner[-1] + 1:] if runner else frames)


def _short(frame: traceback.FrameSummary) -> str:
    path = Path(frame.filename)
    parts = path.parts
    for root in ("properties", "strategies", "reference"):
        if root in parts:
            path = Path(*parts[len(parts) - 1 - parts[::-1].index(root):])
            break
    return f"{path}:{frame.lineno} {frame.name}"


def _conformance_errors(call: pytest.CallInfo) -> list[checker.ConformanceError]:
    """The ConformanceErrors a failed test raised (Hypothesis groups distinct failures)."""
    if call.excinfo is None:
        return []
    pending, found = [call.excinfo.value], []
    while pending:
        error = pending.pop(0)
        if isinstance(error, checker.ConformanceError):
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
        report.sections.append((checker.REPRO_SECTION, script + REPRO_END))
        if directory:
            path = Path(directory) / (_file_name(report.nodeid) + (f"-{i}" if i else "") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(script)


REPLAY_SECTION = "swapspec replay"


def replay_command(text: str, test: str, target: Target, plugin_args: list[str]) -> str | None:
    """The command line that replays the failure whose report ``text`` holds Hypothesis'
    ``@reproduce_failure`` line: ``pytest TEST --swapspec-target=... --swapspec-reproduce=...``
    (with the run's own ``-p`` plugins), run from the folder the failing run was started in.
    None when the text holds no such line."""
    found = REPRODUCE.search(text)
    if found is None:
        return None
    # the blob is base64 and the version digits: double quotes keep its single quotes readable
    return (shlex.join(["pytest", *plugin_args, test, f"--swapspec-target={target.selector}"])
            + f' --swapspec-reproduce="@{found[0].lstrip("@")}"')


def _plugin_args(config: pytest.Config) -> list[str]:
    """The ``-p NAME`` pairs the run was started with (a vendored plugin, a host profile)."""
    args, out = list(config.invocation_params.args), []
    for i, arg in enumerate(args):
        if arg == "-p" and i + 1 < len(args):
            out += ["-p", args[i + 1]]
        elif arg.startswith("-p") and len(arg) > 2:
            out += ["-p", arg[2:]]
    return out


def _show_replay(item: pytest.Item, report: pytest.TestReport, target: Target,
                 failures: list[dict]) -> None:
    """Add the replay command as a section of the report (and to each failure's entry), in
    place of Hypothesis' advice to decorate a test function inside swapspec."""
    if report.when != "call":
        return
    command = replay_command(str(report.longrepr), f"{item.path}::{item.name}", target,
                             _plugin_args(item.config))
    if command is None:
        return
    report.sections.append((REPLAY_SECTION, f"from {item.config.invocation_params.dir}:\n"
                            f"{command}\n"))
    for failure in failures:
        failure["replay"] = command


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
    if report.failed and entry.get("harness_error"):
        return "error"
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
    reach = host_reach(results)
    if reach:
        terminalreporter.write_sep("=", "swapspec host reach (share of valid examples that drew "
                                   "a host module / a host conversion)")
        for line in render_host_reach(reach):
            terminalreporter.write_line(line)
    sequence_pairs = pairs.coverage(results)
    if sequence_pairs:
        terminalreporter.write_sep("=", "swapspec ordered pairs of sequence rules (a, then b later)")
        for line in pairs.render(sequence_pairs):
            terminalreporter.write_line(line)
    measured = getattr(config, "swapspec_coverage", None)
    if measured is not None:
        from swapspec.properties.harness.coverage import render_coverage
        terminalreporter.write_sep("=", "swapspec coverage (statements of the targets' code run)")
        for line in render_coverage(measured):
            terminalreporter.write_line(line)
    path = _option(config, "--swapspec-report", "SWAPSPEC_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"torch": torch.__version__, "table": table, "filter_rates": rates,
                       "times": call_times(results),
                       "declared": declared_deviations(config.swapspec_targets or []),
                       "sequence_pairs": sequence_pairs,
                       **({"host_reach": reach} if reach else {}),
                       **({"coverage": measured} if measured is not None else {})},
                      f, indent=2, sort_keys=True)
        terminalreporter.write_line(f"swapspec: wrote JSON report to {path}")
