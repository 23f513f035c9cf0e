"""``--swapspec-coverage``: the scopes, the exclusion file, per-function counts, the option with and
without xdist, and that nothing of it runs without the option."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from swapspec.properties.harness import coverage
from swapspec.properties.harness.coverage import (
    CoverageUsageError,
    Exclusion,
    Measurement,
    Scope,
    coverage_report,
    excluded_lines,
    load_exclusions,
    outer_functions,
    parse_exclusions,
    scope_functions,
    scope_of,
    torch_scope,
)
from swapspec.properties.harness.targets import builtin_target, load_target

REPO = Path(__file__).resolve().parents[1]

HOST = '''\
"""A host target for tests/test_coverage.py: apply is the reference's; never_called is not."""
import sys

from swapspec import reference

name = "covhost"


def apply(module, fn, *, overwrite, swap, recurse=True):
    return reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)


def never_called(x):
    y = x + 1
    return y


target = sys.modules[__name__]
'''


def test_every_exclusion_has_a_reason_and_matches_a_statement_of_its_function():
    exclusions = load_exclusions()
    scopes = {"torch": torch_scope(), "reference": scope_of(builtin_target("reference"))}
    for exclusion in exclusions:
        assert exclusion.reason.strip(), exclusion
        scope = scopes[exclusion.scope]
        found = [(p, f) for p, f in scope_functions(scope)
                 if (f.file, f.name) == (exclusion.file, exclusion.function)]
        assert found, f"exclusion names no function of scope {exclusion.scope}: {exclusion}"
        path, function = found[0]
        assert excluded_lines(path, function, exclusion), f"exclusion matches nothing: {exclusion}"


@pytest.mark.parametrize("line", [
    "torch | nn/modules/module.py | Module._apply | if x:",  # four fields: no reason
    "torch | nn/modules/module.py | Module._apply | if x: |  ",  # an empty reason
])
def test_an_exclusion_without_a_reason_is_an_error(line):
    with pytest.raises(CoverageUsageError, match=r"exclusions.txt:2"):
        parse_exclusions(f"# comment\n{line}\n", "exclusions.txt")


def test_an_exclusion_line_is_parsed_field_by_field():
    parsed = parse_exclusions("torch | a.py | F.g | if t.is_cuda: | CUDA only | really\n")
    assert parsed == [Exclusion("torch", "a.py", "F.g", "if t.is_cuda:", "CUDA only | really")]


def test_an_if_exclusion_takes_its_branch_and_not_the_test(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent("""\
        def f(t):
            if t.is_cuda:
                a = 1
                b = 2
            else:
                a = 3
            return a
        """))
    (function,) = outer_functions(path, "m.py")
    assert (function.first, function.last) == (2, 7)
    branch = excluded_lines(path, function, Exclusion("s", "m.py", "f", "if t.is_cuda:", "r"))
    assert branch == {3, 4}
    whole = excluded_lines(path, function, Exclusion("s", "m.py", "f", "*", "r"))
    assert whole == set(range(2, 8))
    rest = excluded_lines(path, function, Exclusion("s", "m.py", "f", "rest: a = 1", "r"))
    assert rest == {3, 4}
    nothing = excluded_lines(path, function, Exclusion("s", "m.py", "f", "t.is_xla", "r"))
    assert nothing == set()


def test_the_torch_scope_names_only_functions_torch_has():
    functions = {(f.file, f.name) for _, f in scope_functions(torch_scope())}
    assert ("nn/modules/module.py", "Module._apply") in functions
    assert ("nn/modules/module.py", "Module.to") in functions  # its overload stubs left out
    assert ("nn/utils/stateless.py", "functional_call") in functions  # a whole file's
    missing = Scope("torch", torch_scope().root, (("nn/modules/module.py", "Module.nope"),), ())
    with pytest.raises(CoverageUsageError, match=r"Module\.nope"):
        scope_functions(missing)


def test_a_host_target_defaults_to_its_own_module_and_may_name_others(tmp_path, monkeypatch):
    (tmp_path / "covhost.py").write_text(HOST)
    monkeypatch.syspath_prepend(str(tmp_path))
    target = load_target("covhost:target")
    assert [f for f, _ in scope_of(target).entries] == ["covhost.py"]
    named = scope_of(dataclasses.replace(target, coverage_modules="covhost"))
    assert named.entries == (("covhost.py", "*"),)


def test_a_function_never_called_shows_zero_executed_and_the_tracer_is_restored(tmp_path,
                                                                             monkeypatch):
    (tmp_path / "covplant.py").write_text(HOST)
    monkeypatch.syspath_prepend(str(tmp_path))
    import covplant

    scope = Scope("covhost", tmp_path, (("covplant.py", "*"),), ("covhost",))
    data = tmp_path / "data"
    data.mkdir()

    def tracer(frame, event, arg):  # someone else's tracer, put back after
        return None

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        measurement = Measurement(data, scope.paths())
        measurement.start()
        measurement.switch("covhost")
        covplant.apply(__import__("torch").nn.Linear(2, 2), lambda t: t, overwrite=False,
                       swap=False)
        measurement.switch("")
        covplant.never_called(1)  # outside the target's context: not counted
        measurement.stop()
        restored = sys.gettrace()
    finally:
        sys.settrace(before)
    assert restored is tracer
    report = coverage_report([scope], data, exclusions=[])["scopes"]["covhost"]
    by_name = {f["function"]: f for f in report["functions"]}
    assert by_name["apply"]["executed"] == by_name["apply"]["statements"] == 1
    assert by_name["never_called"]["statements"] == 2
    assert by_name["never_called"]["executed"] == 0
    assert by_name["never_called"]["missed_lines"] == [14, 15]
    assert report["percent"] == pytest.approx(100 / 3, abs=0.1)


MULTILINE = '''\
def check(x):
    if (
        x > 0
    ):
        return 1
    return 0
'''


def test_a_statement_over_several_lines_counts_where_a_later_line_ran(tmp_path, monkeypatch):
    """An ``if (`` whose test stands on the next line runs no code on its first line; it counts
    as run, as in coverage.py's own report, when the test ran."""
    (tmp_path / "covlines.py").write_text(MULTILINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import covlines

    scope = Scope("covlines", tmp_path, (("covlines.py", "*"),), ("covlines",))
    data = tmp_path / "data"
    data.mkdir()
    measurement = Measurement(data, scope.paths())
    measurement.start()
    measurement.switch("covlines")
    covlines.check(1)
    measurement.switch("")
    measurement.stop()
    (check,) = coverage_report([scope], data, exclusions=[])["scopes"]["covlines"]["functions"]
    assert (check["statements"], check["executed"], check["missed_lines"]) == (3, 2, [6])


def test_the_plugin_does_not_import_coverage_without_the_option():
    code = ("import sys, swapspec.properties.harness.plugin; "
            "print('coverage' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True)
    assert out.stdout.strip() == "False"
    assert "coverage" not in [name.split(".")[0] for name in _top_imports(Path(
        coverage.__file__))]


def _top_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [alias.name for node in tree.body if isinstance(node, ast.Import)
            for alias in node.names]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "covhost.py").write_text(HOST)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SWAPSPEC_", "PYTEST_", "HYPOTHESIS_", "COVERAGE_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]), PYTHONHASHSEED="0",
               HYPOTHESIS_STORAGE_DIRECTORY=str(tmp_path / "hypothesis"), TMPDIR=str(tmp_path))
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "properties",
         "--swapspec-profile=swapspec-dev", "--hypothesis-seed=0",  # one fixed sample
         "--swapspec-property=APPLY-VALUES",
         f"--swapspec-report={report}", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    broken = [line for line in proc.stdout.splitlines() if "broken rule" in line]
    assert proc.returncode == 0, "\n".join(broken[:20]) + proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(report.read_text())


def _check_host_run(proc: subprocess.CompletedProcess, report: dict, tmp_path: Path) -> None:
    scope = report["coverage"]["scopes"]["covhost"]
    by_name = {f["function"]: f for f in scope["functions"]}
    assert set(by_name) == {"apply", "never_called"}
    assert by_name["apply"]["executed"] == 1
    assert by_name["never_called"]["executed"] == 0
    assert report["coverage"]["missing_workers"] == []
    assert "swapspec coverage" in proc.stdout and "covhost.py  never_called" in proc.stdout
    output = proc.stdout + proc.stderr  # torch may warn; swapspec's coverage never does
    assert "CoverageWarning" not in output and "harness/coverage.py" not in output
    assert not list(tmp_path.glob("swapspec-coverage-*")), "the data folder was left behind"


def test_the_option_reports_per_function_without_xdist(tmp_path):
    proc, report = _run(tmp_path, "-p", "no:xdist", "--swapspec-target=covhost:target",
                        "--swapspec-coverage")
    _check_host_run(proc, report, tmp_path)


@pytest.mark.slow  # two worker processes, each importing torch and collecting the properties
def test_the_option_reports_per_function_with_xdist_workers(tmp_path):
    proc, report = _run(tmp_path, "-n", "2", "--swapspec-target=covhost:target", "--swapspec-coverage")
    _check_host_run(proc, report, tmp_path)


def test_the_torch_target_counts_its_own_tests_only(tmp_path):
    """Run with reference and torch: torch's scope counts the torch tests' lines, not the
    reference's; the reference's scope is measured too."""
    _, report = _run(tmp_path, "-p", "no:xdist", "--swapspec-target=torch,reference",
                        "--swapspec-coverage")
    scopes = report["coverage"]["scopes"]
    assert set(scopes) == {"torch", "reference"}
    functions = {(f["file"], f["function"]): f for f in scopes["torch"]["functions"]}
    assert functions["nn/modules/module.py", "Module._apply"]["executed"] > 0
    assert functions["nn/modules/module.py", "Module.load_state_dict"]["executed"] == 0
    reference_functions = {(f["file"], f["function"]): f
                           for f in scopes["reference"]["functions"]}
    assert reference_functions["apply.py", "apply"]["executed"] > 0
    assert 0 < scopes["torch"]["percent"] < 100


def test_without_the_option_the_report_has_no_coverage(tmp_path):
    _, report = _run(tmp_path, "-p", "no:xdist", "--swapspec-target=covhost:target")
    assert "coverage" not in report
