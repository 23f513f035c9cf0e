"""``--swapspec-coverage``: which statements of the implementation under test the run executed,
per function.

The scope of a target (``scope_of``): for ``torch`` and ``torch-stateless``, torch's functions
of the family (``coverage_scope.TORCH_SCOPE``); for ``reference``, every function of
``swapspec/reference/``; for a host target, every function of the modules its
``coverage_modules`` names (default: the module it was loaded from; a package stands for every
``.py`` file under it).

Measurement is coverage.py's, with pytest-cov's conventions for xdist: each process that runs
tests measures (a worker, or the one process without ``-n``) into a data file of its own with a
random suffix (``data_suffix=True``) in one folder the controller made and named in each node's
``workerinput``; the controller combines them (``Coverage.combine``) once the workers are down. A
worker on another host sends its data through ``workeroutput`` instead. A worker saves after every
test, so one that dies mid-run (a crash of the target) loses only its last test's lines.

Each test's lines are recorded under a dynamic context, the name of the target it tests, and a
scope counts only its own targets' contexts: with several targets in one run, torch's scope does
not count the lines the ``reference`` target's tests happened to run in torch. Lines run outside
any property test (collection, imports) count for no target.

Statements listed in ``coverage_exclusions.txt`` (each with its reason: code that cannot run on
this machine) are reported apart and left out of the percentage.

Nothing here runs unless the option is given; ``coverage`` is imported only then; the tracer
found before (a debugger's, say) is put back when measurement stops.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from swapspec import reference
from swapspec.properties.harness.coverage_scope import TORCH_SCOPE
from swapspec.properties.harness.marking import is_property_test
from swapspec.properties.harness.targets import BUILTIN_NAMES, Target

EXCLUSIONS_FILE = Path(__file__).with_name("coverage_exclusions.txt")
TORCH_TARGETS = ("torch", "torch-stateless")
WORKER_INPUT = "swapspec_coverage"  # workerinput: {"directory", "host"}
WORKER_OUTPUT = "swapspec_coverage"  # workeroutput: {"node", "data" (another host only)}
SHOWN_FUNCTIONS = 20  # console rows per scope; the JSON report lists every function

DISABLED_WARNINGS = ["no-data-collected", "module-not-measured", "module-not-imported",
                     "couldnt-parse", "no-ctracer"]


class CoverageUsageError(Exception):
    """A scope or exclusion that names nothing, or coverage.py missing."""


# ----- scopes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """Code to measure: ``entries`` of ``(file relative to root, qualified function or *)``,
    counted for the tests of ``targets`` (target names)."""

    name: str
    root: Path
    entries: tuple[tuple[str, str], ...]
    targets: tuple[str, ...]

    def paths(self) -> list[Path]:
        return sorted({(self.root / file).resolve() for file, _ in self.entries})


def torch_scope(targets: Sequence[str] = TORCH_TARGETS) -> Scope:
    return Scope("torch", Path(torch.__file__).resolve().parent, TORCH_SCOPE, tuple(targets))


def reference_scope(targets: Sequence[str] = ("reference",)) -> Scope:
    root = Path(reference.__file__).resolve().parent
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    return Scope("reference", root, tuple((f, "*") for f in files), tuple(targets))


def module_scope(name: str, modules: Iterable[str], targets: Sequence[str]) -> Scope:
    """Every function of ``modules`` (importable names; a package: every file under it)."""
    paths: list[Path] = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise CoverageUsageError(f"coverage module {module_name!r} of target {name!r} cannot "
                                     f"be imported: {e}") from e
        file = getattr(module, "__file__", None)
        if not file:
            raise CoverageUsageError(f"coverage module {module_name!r} has no source file")
        path = Path(file).resolve()
        paths += sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    root = Path(os.path.commonpath([p.parent for p in paths])) if paths else Path.cwd()
    entries = tuple(dict.fromkeys((p.relative_to(root).as_posix(), "*") for p in paths))
    return Scope(name, root, entries, tuple(targets))


def scope_of(target: Target) -> Scope:
    """The code ``target``'s coverage is measured on (see the module's docstring)."""
    builtin = target.selector in BUILTIN_NAMES
    if target.coverage_modules:
        return module_scope(target.name, target.coverage_modules, (target.name,))
    if builtin and target.name in TORCH_TARGETS:
        return torch_scope((target.name,))
    if builtin and target.name == "reference":
        return reference_scope()
    return module_scope(target.name, (target.selector.partition(":")[0],), (target.name,))


def scopes_for(targets: Iterable[Target]) -> list[Scope]:
    """One scope per distinct code measured; targets sharing one (torch, torch-stateless) share
    its counts."""
    merged: dict[tuple, Scope] = {}
    for target in targets:
        scope = scope_of(target)
        key = (scope.name if target.selector in BUILTIN_NAMES else target.name, scope.entries)
        if key in merged:
            old = merged[key]
            scope = Scope(old.name, old.root, old.entries, old.targets + scope.targets)
        merged[key] = scope
    return list(merged.values())


# ----- functions and their lines ------------------------------------------------------------


@dataclass(frozen=True)
class Function:
    file: str  # relative to the scope's root
    name: str  # qualified: Class.method
    first: int  # first and last line of its body (def line and decorators left out)
    last: int
    node: Any = field(compare=False, repr=False)


def _is_overload(node: ast.AST) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in getattr(node, "decorator_list", ()))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def outer_functions(path: Path, file: str) -> list[Function]:
    """Every function of the file not inside another function (methods of classes included,
    overload stubs left out), by qualified name."""
    found: list[Function] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if not _is_overload(node):
                    found.append(Function(file, prefix + node.name, node.body[0].lineno,
                                          node.end_lineno or node.body[-1].lineno, node))
            elif isinstance(node, ast.If | ast.Try):  # functions defined under `if`/`try`
                for part in (node.body, node.orelse, *(h.body for h in getattr(
                        node, "handlers", ())), getattr(node, "finalbody", [])):
                    walk(part, prefix)

    walk(_tree(path).body, "")
    return found


def scope_functions(scope: Scope) -> list[tuple[Path, Function]]:
    """``(absolute path, function)`` for every function of the scope, in entry order; an entry
    naming no function is an error (torch renamed or moved it)."""
    chosen: dict[tuple[str, str], tuple[Path, Function]] = {}
    for file, wanted in scope.entries:
        path = (scope.root / file).resolve()
        if not path.exists():
            raise CoverageUsageError(f"coverage scope {scope.name!r}: no file {file}")
        functions = outer_functions(path, file)
        matched = functions if wanted == "*" else [f for f in functions if f.name == wanted]
        if not matched and wanted != "*":
            raise CoverageUsageError(f"coverage scope {scope.name!r}: no function {wanted} in "
                                     f"{file}")
        for function in matched:  # a name defined twice (under if/else) keeps both bodies
            key = (file, function.name)
            if key in chosen:
                old = chosen[key][1]
                function = Function(file, function.name, min(old.first, function.first),
                                    max(old.last, function.last), old.node)
            chosen[key] = (path, function)
    return list(chosen.values())


# ----- exclusions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Exclusion:
    """Statements left out of a scope's percentage: in ``function`` of ``file``, the statement on
    each line containing ``statement`` (and the statements inside it; for an ``if``/``elif``,
    the branch under it only); ``rest: TEXT``: that statement and every one after it in its
    block; ``*``: the whole body."""

    scope: str
    file: str
    function: str
    statement: str
    reason: str


def parse_exclusions(text: str, source: str = "coverage_exclusions.txt") -> list[Exclusion]:
    """One exclusion a line, ``scope | file | function | statement | reason``; blank lines and
    ``#`` comments skipped. Every field is required: an exclusion without a reason is an error."""
    found = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split(" | ", 4)]
        if len(parts) != 5 or not all(parts):
            raise CoverageUsageError(f"{source}:{number}: want 'scope | file | function | "
                                     f"statement | reason', every field filled; got {raw!r}")
        found.append(Exclusion(*parts))
    return found


def load_exclusions(path: Path = EXCLUSIONS_FILE) -> list[Exclusion]:
    return parse_exclusions(path.read_text(encoding="utf-8"), path.name)


def _lines(nodes: Sequence[ast.stmt]) -> set[int]:
    return {line for n in nodes for line in range(n.lineno, (n.end_lineno or n.lineno) + 1)}


def excluded_lines(path: Path, function: Function, exclusion: Exclusion) -> set[int]:
    """The lines ``exclusion`` takes out of ``function`` (empty: it matches nothing)."""
    if exclusion.statement == "*":
        return set(range(function.first, function.last + 1))
    source = path.read_text(encoding="utf-8").splitlines()
    text, rest = exclusion.statement, exclusion.statement.startswith(REST)
    text = text.removeprefix(REST).strip()
    lines: set[int] = set()
    for block in _blocks(function.node):
        for i, node in enumerate(block):
            if text not in source[node.lineno - 1]:
                continue
            if rest:
                lines |= _lines(block[i:])
            else:
                lines |= _lines(node.body) if isinstance(node, ast.If) else _lines([node])
    return lines


REST = "rest:"


def _blocks(function: ast.AST) -> list[list[ast.stmt]]:
    """Every block of statements in ``function``: its body, each branch, loop and handler."""
    blocks = []
    for node in ast.walk(function):
        for name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                blocks.append(block)
    return blocks


# ----- measuring ----------------------------------------------------------------------------


def _coverage_module():
    try:
        import coverage
    except ImportError:
        raise CoverageUsageError("--swapspec-coverage needs coverage.py: pip install "
                                 "'swapspec[coverage]' (or coverage)") from None
    return coverage


class Measurement:
    """coverage.py measuring the scopes' files in this process, into ``directory``."""

    def __init__(self, directory: Path, files: Iterable[Path]) -> None:
        coverage = _coverage_module()
        self.cov = coverage.Coverage(data_file=str(directory / ".coverage"), data_suffix=True,
                                     config_file=False, include=[str(f) for f in files],
                                     branch=False)
        self.cov.set_option("run:disable_warnings", DISABLED_WARNINGS)
        self.saved_trace = (sys.gettrace(), threading.gettrace())
        self.running = False

    def start(self) -> None:
        self.saved_trace = (sys.gettrace(), threading.gettrace())
        self.cov.start()
        self.running = True

    def switch(self, context: str) -> None:
        if self.running:
            self.cov.switch_context(context)

    def save(self) -> None:
        if self.running:
            self.cov.save()

    def stop(self) -> None:
        """Stop, save, and put back the tracers found at start."""
        if not self.running:
            return
        self.running = False
        try:
            self.cov.stop()
            self.cov.save()
        finally:
            _drop_local_tracers()
            if sys.gettrace() is not self.saved_trace[0]:
                sys.settrace(self.saved_trace[0])
            threading.settrace(self.saved_trace[1])  # type: ignore[arg-type]

    def dumps(self) -> bytes:
        return self.cov.get_data().dumps()


def _drop_local_tracers() -> None:
    """Forget coverage.py's tracer on the frames of the stack that started while it ran: each
    would hand the tracer restored after it to ``None`` when it returns."""
    frame = sys._getframe(1)
    while frame is not None:
        if type(frame.f_trace).__module__.partition(".")[0] == "coverage":
            frame.f_trace = None
        frame = frame.f_back


def new_directory() -> Path:
    return Path(tempfile.mkdtemp(prefix="swapspec-coverage-"))


def store_remote_data(directory: Path, node: str, data: bytes) -> None:
    """A worker on another host sent its data: write it as one more data file to combine."""
    coverage = _coverage_module()
    stored = coverage.CoverageData(basename=str(directory / ".coverage"),
                                   suffix=f"{socket.gethostname()}.{node}")
    stored.loads(data)
    stored.write()


def combined_data(directory: Path):
    """Every data file in ``directory`` combined: coverage.py's ``CoverageData`` and the
    ``Coverage`` that reads statements."""
    coverage = _coverage_module()
    cov = coverage.Coverage(data_file=str(directory / ".coverage"), config_file=False)
    cov.set_option("run:disable_warnings", DISABLED_WARNINGS)
    if any(directory.glob(".coverage.*")):
        cov.combine(data_paths=[str(directory)], keep=False)
    cov.load()
    return cov, cov.get_data()


# ----- the report ---------------------------------------------------------------------------


def _percent(executed: int, counted: int) -> float:
    return round(100.0 * executed / counted, 1) if counted else 100.0


def _statements(cov: Any, path: Path) -> set[int]:
    return set(cov.analysis2(str(path))[1])


def _executed(cov: Any, data: Any, path: Path, contexts: set[str]) -> set[int]:
    """The statements of ``path`` that ran in ``contexts``, each by its first line as coverage.py
    numbers statements: a statement over several lines whose first line runs no code of its own
    (``if (`` with its test on the next line) is recorded under a later line, and
    ``translate_lines`` maps it back, as coverage.py's own report does."""
    by_line = data.contexts_by_lineno(str(path)) or {}
    lines = {line for line, names in by_line.items() if contexts & set(names)}
    reporter = _coverage_module().python.PythonFileReporter(str(path), coverage=cov)
    return set(reporter.translate_lines(lines))


def scope_report(scope: Scope, cov: Any, data: Any, exclusions: Sequence[Exclusion]) -> dict:
    """``{name, targets, statements, executed, excluded, percent, files, functions,
    exclusions}`` for one scope; ``functions`` lists every function with its counts and missed
    lines; an exclusion matching nothing is listed in ``stale_exclusions``."""
    contexts = set(scope.targets)
    functions, files = [], {}
    used: set[Exclusion] = set()
    mine = [e for e in exclusions if e.scope == scope.name]
    statements_of, executed_of = {}, {}
    for path, function in scope_functions(scope):
        if path not in statements_of:
            statements_of[path] = _statements(cov, path)
            executed_of[path] = _executed(cov, data, path, contexts)
        body = set(range(function.first, function.last + 1))
        statements = statements_of[path] & body
        excluded: set[int] = set()
        reasons = []
        for exclusion in mine:
            if (exclusion.file, exclusion.function) != (function.file, function.name):
                continue
            lines = excluded_lines(path, function, exclusion) & statements
            if lines:
                used.add(exclusion)
                excluded |= lines
                reasons.append({"statement": exclusion.statement, "reason": exclusion.reason,
                                "lines": sorted(lines)})
        ran = executed_of[path] & statements
        counted = statements - excluded
        entry = {"file": function.file, "function": function.name, "first_line": function.first,
                 "last_line": function.last, "statements": len(counted),
                 "executed": len(ran & counted), "excluded": len(excluded),
                 "excluded_executed": sorted(ran & excluded),
                 "missed_lines": sorted(counted - ran), "exclusions": reasons}
        entry["percent"] = _percent(entry["executed"], entry["statements"])
        functions.append(entry)
        total = files.setdefault(function.file, {"statements": 0, "executed": 0, "excluded": 0,
                                                 "functions": 0})
        for key in ("statements", "executed", "excluded"):
            total[key] += entry[key]
        total["functions"] += 1
    for total in files.values():
        total["percent"] = _percent(total["executed"], total["statements"])
    counts = {key: sum(f[key] for f in functions) for key in ("statements", "executed",
                                                              "excluded")}
    stale = [e.__dict__ for e in mine if e not in used]
    return {"name": scope.name, "targets": list(scope.targets), "root": str(scope.root),
            **counts, "percent": _percent(counts["executed"], counts["statements"]),
            "files": dict(sorted(files.items())), "functions": functions,
            "stale_exclusions": stale}


def coverage_report(scopes: Sequence[Scope], directory: Path,
                    exclusions: Sequence[Exclusion] | None = None,
                    missing_workers: Sequence[str] = ()) -> dict:
    """The JSON report's ``coverage``: ``{"scopes": {name: scope_report}, "missing_workers"}``."""
    cov, data = combined_data(directory)
    exclusions = load_exclusions() if exclusions is None else exclusions
    return {"scopes": {s.name: scope_report(s, cov, data, exclusions) for s in scopes},
            "missing_workers": list(missing_workers)}


def render_coverage(report: dict, shown: int = SHOWN_FUNCTIONS) -> list[str]:
    """Per scope: its functions with statements missed, most missed first (at most ``shown``),
    the total, then one line per file."""
    lines: list[str] = []
    for scope in report["scopes"].values():
        functions = sorted(scope["functions"], key=lambda f: (
            -(f["statements"] - f["executed"]), f["file"], f["function"]))
        missed = [f for f in functions if f["statements"] > f["executed"]]
        width = max([len(f"{f['file']}  {f['function']}") for f in missed[:shown]] + [30])
        lines.append(f"{scope['name']} (tests of {', '.join(scope['targets'])}): "
                     f"{len(functions)} functions, {len(missed)} with statements not run")
        lines.append(f"{'file  function':<{width}}  {'stmts':>5}  {'run':>5}  {'%':>6}")
        for f in missed[:shown]:
            lines.append(f"{f['file'] + '  ' + f['function']:<{width}}  {f['statements']:>5}  "
                         f"{f['executed']:>5}  {f['percent']:>5.1f}%")
        if len(missed) > shown:
            lines.append(f"... {len(missed) - shown} more with statements not run "
                         "(every function is in the JSON report)")
        lines.append(f"{'TOTAL':<{width}}  {scope['statements']:>5}  {scope['executed']:>5}  "
                     f"{scope['percent']:>5.1f}%   ({scope['excluded']} statements excluded, "
                     "see coverage_exclusions.txt)")
        for file, total in scope["files"].items():
            lines.append(f"  {file:<{width - 2}}  {total['statements']:>5}  "
                         f"{total['executed']:>5}  {total['percent']:>5.1f}%")
        ran_excluded = [f"{f['file']} {f['function']} line(s) {f['excluded_executed']}"
                        for f in functions if f["excluded_executed"]]
        for text in ran_excluded:
            lines.append(f"  excluded but executed (wrong exclusion?): {text}")
        for e in scope["stale_exclusions"]:
            lines.append(f"  stale exclusion (matches no statement): {e['file']} "
                         f"{e['function']} {e['statement']!r}")
    if report.get("missing_workers"):
        lines.append("workers that sent no coverage data (died?): "
                     + ", ".join(report["missing_workers"]))
    return lines


# ----- the pytest side ----------------------------------------------------------------------


class CoveragePlugin:
    """Registered by the swapspec plugin when ``--swapspec-coverage`` is given. ``role`` is
    ``worker`` (an xdist worker), ``controller`` (xdist's controller: it measures nothing, it
    combines) or ``single`` (a run without workers)."""

    def __init__(self, config: pytest.Config, scopes: list[Scope], role: str) -> None:
        self.config, self.scopes, self.role = config, scopes, role
        self.missing_workers: list[str] = []
        self.remote = False
        self.report: dict | None = None
        files = sorted({path for scope in scopes for path in scope.paths()})
        if role == "worker":
            given = config.workerinput[WORKER_INPUT]  # type: ignore[attr-defined]
            self.remote = given["host"] != socket.gethostname()
            self.directory = new_directory() if self.remote else Path(given["directory"])
        else:
            self.directory = new_directory()
        self.measurement = None if role == "controller" else Measurement(self.directory, files)

    def start(self) -> None:
        if self.measurement is not None:
            self.measurement.start()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[WORKER_INPUT] = {"directory": str(self.directory),
                                          "host": socket.gethostname()}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT)
        name = str(getattr(getattr(node, "gateway", None), "id", node))
        if output is None:
            self.missing_workers.append(name)
        elif "data" in output:
            store_remote_data(self.directory, output["node"], output["data"])

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        """Record a property test's lines under its target's name."""
        callspec = getattr(item, "callspec", None)
        target = callspec.params.get("target") if callspec else None
        measuring = (self.measurement is not None and isinstance(target, Target)
                     and is_property_test(item))
        if measuring:
            self.measurement.switch(target.name)
        try:
            return (yield)
        finally:
            if measuring:
                self.measurement.switch("")
                if self.role == "worker":
                    self.measurement.save()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.measurement is not None:
            self.measurement.stop()
        if self.role == "worker":
            output = {"node": self.config.workerinput["workerid"]}  # type: ignore[attr-defined]
            if self.remote:
                output["data"] = self.measurement.dumps()
            self.config.workeroutput[WORKER_OUTPUT] = output  # type: ignore[attr-defined]
            return
        self.report = coverage_report(self.scopes, self.directory,
                                      missing_workers=self.missing_workers)
        self.config.swapspec_coverage = self.report  # type: ignore[attr-defined]

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.measurement is not None:
            self.measurement.stop()
        if self.role != "worker" or self.remote:
            shutil.rmtree(self.directory, ignore_errors=True)


def configure(config: pytest.Config, targets: Sequence[Target] | None) -> None:
    """Start ``--swapspec-coverage`` for this process (see ``CoveragePlugin``); a bad scope or
    a missing coverage.py is a usage error."""
    if not targets:
        return
    try:
        scopes = scopes_for(targets)
        for scope in scopes:
            scope_functions(scope)  # a scope naming nothing fails now, not after the run
        _coverage_module()
        if hasattr(config, "workerinput"):
            role = "worker"
        elif config.getoption("dist", "no") != "no" and config.getoption("tx", None):
            role = "controller"
        else:
            role = "single"
        plugin = CoveragePlugin(config, scopes, role)
    except CoverageUsageError as e:
        raise pytest.UsageError(f"swapspec: {e}") from None
    config.pluginmanager.register(plugin, "swapspec-coverage")
    plugin.start()
