"""End-to-end tests of swapspec's pytest plugin: targets, deviations, report, profiles, isolation.

Each test runs pytest in a subprocess. The expensive runs (real properties) are shared
by module-scoped fixtures: one run with planted targets, once serially and once under
``-n 2``, selects single test ids so it stays a few seconds long.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from swapspec.properties.harness import plugin, targets
from swapspec.properties.harness.report import STATUS_WORDS, cell_note
from swapspec.properties.harness.repro import retargeted
from swapspec.properties.harness.targets import builtin_target
from tests.repro_scripts import run_script

REPO = Path(__file__).resolve().parents[1]
PLANTED = "tests.planted.broken_reference"
TIES = "properties/rules/test_apply.py::test_apply_keeps_ties"
FORMS = "properties/rules/test_functional_call.py::test_fc_input_forms"
TARGETS = ",".join(["reference", "torch-stateless", f"{PLANTED}:tie_split",
                    f"{PLANTED}:tie_split_declared", f"{PLANTED}:stale"])
MIXED = [f"{TIES}[reference]", f"{TIES}[broken-tie-split]", f"{TIES}[declared-tie-split]",
         f"{TIES}[stale-declaration]", f"{FORMS}[torch-stateless]"]
STATELESS_REASON = ("torch-stateless declares a skip for FC-INPUT-FORMS: "
                    "torch.nn.utils.stateless.functional_call takes a single dict only")


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    report: dict | None = None
    outcomes: dict[str, tuple[str, str]] | None = None  # junit name -> (outcome, text)
    repro_dir: Path | None = None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """The child's environment: no swapspec/pytest/Hypothesis settings, and not "in CI"
    (Hypothesis loads its own ``ci`` profile when ``CI`` is set, which would hide the
    host-profile behaviour these tests pin)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SWAPSPEC_", "PYTEST_", "HYPOTHESIS_")) and k not in ("CI", "TF_BUILD")}
    env.update(PYTHONPATH=str(REPO), HYPOTHESIS_STORAGE_DIRECTORY=str(tmp / "hypothesis"),
               COLUMNS="200", **extra)
    return env


def run_pytest(tmp: Path, *args: str, cwd: Path = REPO, timeout: int = 600,
               **env: str) -> Run:
    """``python -m pytest -p no:cacheprovider *args`` in ``cwd``, SWAPSPEC_* unset but ``env``.
    ``timeout`` only stops a hung run: a loaded machine may take minutes for a short one."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd, env=_env(tmp, **env), capture_output=True, text=True, timeout=timeout,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def _junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, text = child.tag, (child.get("message") or "") + (child.text or "")
                break
        outcomes[case.get("name")] = (outcome, text)
    return outcomes


def _planted_run(tmp: Path, *extra: str) -> Run:
    report, junit, repros = tmp / "r.json", tmp / "junit.xml", tmp / "repros"
    run = run_pytest(tmp, *MIXED, f"--swapspec-target={TARGETS}", "-p", "tests.planted.fast_profile",
                     f"--swapspec-report={report}", f"--junitxml={junit}", "-rA",
                     f"--swapspec-repro-dir={repros}", *extra)
    run.repro_dir = repros
    if report.exists():
        run.report = json.loads(report.read_text())
    if junit.exists():
        run.outcomes = _junit_outcomes(junit)
    return run


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Run:
    return _planted_run(tmp_path_factory.mktemp("planted"))


@pytest.fixture(scope="module")
def planted_xdist(tmp_path_factory) -> Run:
    return _planted_run(tmp_path_factory.mktemp("planted-xdist"), "-n", "2")


def parse_table(output: str) -> tuple[str, dict[str, dict[str, tuple[str, str]]]]:
    """The torch version line and ``{property: {target: (status word, note text)}}`` of the
    printed table (its blocks joined, abbreviated names and note numbers resolved); every line
    of the report fits 100 columns."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if "swapspec conformance report" in line]
    assert len(starts) == 1, f"want the report printed once, found {len(starts)}"
    i = starts[0] + 1
    version, i = lines[i], i + 1
    cells: dict[str, dict[str, str]] = {}
    heads: list[str] = []
    while lines[i].startswith("property "):
        header = [c.strip() for c in lines[i].split(" | ")]
        heads += header[1:]
        assert set(lines[i + 1]) <= {"-", "+"}
        i += 2
        while lines[i].strip():
            row = [c.strip() for c in lines[i].split(" | ")]
            assert len(row) == len(header), lines[i]
            cells.setdefault(row[0], {}).update(zip(header[1:], row[1:], strict=True))
            i += 1
        i += 1
    report = []
    while i < len(lines) and not lines[i].startswith(("=", "swapspec: wrote")):
        report.append(lines[i])
        i += 1
    assert all(len(line) <= 100 for line in lines[starts[0] + 1:i]), "the report is wider than 100"
    _add_collapsed_skips(report, cells, heads)
    legend = dict(re.findall(r"^(T\d+) = (.+)$", "\n".join(report), re.M))
    notes = {n: " ".join(t.split()) for n, t in re.findall(
        r"^\[(\d+)\] (.*?)(?=^\[\d+\] |\Z)", "\n".join(report), re.M | re.S)}
    table = {}
    for pid, row in cells.items():
        table[pid] = {}
        for head, cell in row.items():
            word, _, number = cell.partition(" [")
            table[pid][legend.get(head, head)] = (word, notes[number.rstrip("]")] if number else "")
    return version, table


COLLAPSED = re.compile(r"^(?P<word>skip \[\d+\].*?) \(\d+\): (?P<pids>.*?)\n(?=\S|\Z)",
                       re.M | re.S)


def _add_collapsed_skips(report: list[str], cells: dict[str, dict[str, str]],
                         heads: list[str]) -> None:
    """The properties skipped on every target, one line per reason under the table
    (``skip [3] (2): A, B``, or ``skip [3] on t | skip [4] on u (2): ...``), back as cells."""
    for found in COLLAPSED.finditer("\n".join(report) + "\n"):
        parts = found["word"].split(" | ")
        for pid in " ".join(found["pids"].split()).split(", "):
            for part in parts:
                word, _, head = part.partition(" on ")
                for h in [head] if head else heads:  # one target: its column's name
                    cells.setdefault(pid, {})[h] = word


def shown(cell: dict) -> tuple[str, str]:
    """What the terminal table shows for a JSON cell: its status word and note text."""
    return STATUS_WORDS[cell["status"]], " ".join(cell_note(cell).split())


# ---- 1. a planted bug fails the run with a runnable repro ------------------------------


def _failure_text(run: Run, target: str) -> str:
    assert run.outcomes is not None
    outcome, text = run.outcomes[f"test_apply_keeps_ties[{target}]"]
    assert outcome == "failure", (outcome, run.output[-3000:])
    return text


REPRO_HEADER = re.compile(r"^-+ swapspec standalone repro -+$")
REPRO_END = "----- end of repro -----"


def extract_repro(output: str) -> str:
    """The first repro section of a failure report: the lines between its separator lines."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if REPRO_HEADER.match(line))
    end = lines.index(REPRO_END, start)
    return "\n".join(lines[start + 1:end]) + "\n"


@pytest.mark.slow  # a pytest run in a subprocess per case: CI-only (see pyproject's markers)
def test_planted_bug_fails_the_run_with_broken_rule_and_repro(planted):
    assert planted.returncode == 1, planted.output[-3000:]
    text = _failure_text(planted, "broken-tie-split")
    assert "APPLY-TIES on target 'broken-tie-split'" in text
    assert "broken rule [parameter-tie-split]" in text
    assert "standalone repro: printed below as 'swapspec standalone repro'" in text
    section = planted.stdout.split("test_apply_keeps_ties[broken-tie-split]", 1)[1]
    assert "broken rule [parameter-tie-split]" in section
    repro = extract_repro(section)
    assert "importlib.import_module('tests.planted.broken_reference'), 'tie_split'" in repro
    assert not any(line.startswith("E ") for line in repro.splitlines())
    compile(repro, "repro", "exec")  # nothing of Hypothesis' text is inside it


@pytest.mark.slow  # a pytest run in a subprocess per case: CI-only (see pyproject's markers)
def test_the_printed_blob_replays_the_failure_on_its_one_test(planted, tmp_path):
    """``--swapspec-reproduce`` with the ``@reproduce_failure`` line a failure printed replays that
    example in a fresh process; it wants exactly one property test and the line as printed."""
    blob = re.search(r"@reproduce_failure\([^)]*\)", _failure_text(planted, "broken-tie-split"))
    assert blob is not None, "a property failure prints its blob"
    test = f"{TIES}[broken-tie-split]"
    target = f"--swapspec-target={PLANTED}:tie_split"
    replay = run_pytest(tmp_path, test, target, f"--swapspec-reproduce={blob[0]}")
    assert replay.returncode == 1, replay.output[-3000:]
    assert "broken rule [parameter-tie-split]" in replay.output
    both = run_pytest(tmp_path, test, f"{TIES}[reference]",
                      f"--swapspec-target=reference,{PLANTED}:tie_split",
                      f"--swapspec-reproduce={blob[0]}")
    assert both.returncode == pytest.ExitCode.USAGE_ERROR, both.output[-2000:]
    assert "replays one property test; 2 are selected" in both.stderr
    bad = run_pytest(tmp_path, test, target, "--swapspec-reproduce=AXic")
    assert bad.returncode == pytest.ExitCode.USAGE_ERROR, bad.output[-2000:]
    assert "wants the line a failure printed" in bad.stderr


def test_the_replay_command_is_swapspecs_own_command_line():
    text = ("E  You can reproduce this test case by temporarily adding "
            "@reproduce_failure('6.170.27', b'AXicY2BgAAAABAAB') as a decorator on your test")
    command = plugin.replay_command(text, "/site/swapspec/properties/rules/test_apply.py::t[x]",
                                    builtin_target("torch"), ["-p", "host.profile"])
    assert shlex.split(command) == [
        "pytest", "-p", "host.profile", "/site/swapspec/properties/rules/test_apply.py::t[x]",
        "--swapspec-target=torch",
        "--swapspec-reproduce=@reproduce_failure('6.170.27', b'AXicY2BgAAAABAAB')"]
    assert plugin.replay_command("no blob here", "t", builtin_target("torch"), []) is None


@pytest.mark.slow  # a pytest run in a subprocess per case: CI-only (see pyproject's markers)
def test_the_printed_replay_command_replays_the_failure(planted, tmp_path):
    text = planted.output
    assert f" {plugin.REPLAY_SECTION} " in text
    command = next(line for line in text.splitlines()
                   if line.startswith("pytest ") and "[broken-tie-split]" in line
                   and "test_apply_keeps_ties" in line)
    args = shlex.split(command)[1:]
    replay = run_pytest(tmp_path, *args)
    assert replay.returncode == 1, replay.output[-3000:]
    assert "broken rule [parameter-tie-split]" in replay.output
    failures = planted.report["table"]["APPLY-TIES"]["broken-tie-split"]["failures"]
    assert {f["replay"] for f in failures} == {command}


SEQUENCE = "properties/rules/test_sequences.py::test_sequence_state[broken-no-restore]"
BROKEN_RULE = re.compile(r"SEQ-STATE on target 'broken-no-restore', at step .*?\n\s*E\s*\n", re.S)


@pytest.mark.slow  # a pytest run in a subprocess per case: CI-only (see pyproject's markers)
def test_a_sequence_failure_prints_a_blob_that_replays_it(tmp_path):
    """A failing sequence prints its ``@reproduce_failure`` line even under a host profile that
    does not ask for blobs; ``--swapspec-reproduce`` with it replays that sequence in a fresh
    process under the default profile: the same step breaks the same rules."""
    target = f"--swapspec-target={PLANTED}:no_restore"
    found = run_pytest(tmp_path, SEQUENCE, target, "-p", "tests.planted.fast_profile")
    blob = re.search(r"@reproduce_failure\([^)]*\)", found.output)
    assert found.returncode == 1 and blob is not None, found.output[-3000:]
    replay = run_pytest(tmp_path, SEQUENCE, target, f"--swapspec-reproduce={blob[0]}")
    assert replay.returncode == 1, replay.output[-3000:]
    first, again = BROKEN_RULE.search(found.output), BROKEN_RULE.search(replay.output)
    assert first is not None and again is not None, replay.output[-3000:]
    assert again[0] == first[0], f"the replay broke other rules:\n{again[0]}\nnot\n{first[0]}"


def test_printed_repro_is_the_file_written_to_the_repro_dir(planted):
    section = planted.stdout.split("_ test_apply_keeps_ties[broken-tie-split] _", 1)[1]
    written = planted.repro_dir / "test_apply_keeps_ties-broken-tie-split.py"
    assert written.read_text() == extract_repro(section)
    assert sorted(p.name for p in planted.repro_dir.iterdir()) == [
        "test_apply_keeps_ties-broken-tie-split.py"]  # a stale declaration has no repro


def test_printed_repro_runs_and_shows_the_bug_only_on_the_planted_target(planted, tmp_path):
    section = planted.stdout.split("_ test_apply_keeps_ties[broken-tie-split] _", 1)[1]
    repro = extract_repro(section)
    assert repro.rstrip().splitlines()[-1].startswith("assert")
    planted_run = run_script(repro, tmp_path, pythonpath=REPO)
    assert planted_run.returncode == 1
    # the rule's own assert, or (where the script's build cannot tell it apart) assert_same's
    # report of the tie groups the reference keeps
    assert re.search(r"AssertionError: tied parameter names \[.+\] now hold [2-9] objects"
                     r"|AssertionError: differs from the reference:\n  one object under several names",
                     planted_run.stderr), planted_run.stderr[-2000:]
    reference_run = run_script(retargeted(repro, builtin_target("reference")), tmp_path)
    assert reference_run.returncode == 0, reference_run.stderr[-2000:]


# ---- 2. and 3. stale and covered deviations --------------------------------------------


def test_stale_deviation_fails(planted):
    text = _failure_text(planted, "stale-declaration")
    assert "stale deviation [parameter-tie-split]" in text
    assert "planted: the reference never splits ties" in text
    assert "broken rule" not in text


def test_observed_declared_deviation_passes_and_is_counted(planted):
    assert planted.outcomes["test_apply_keeps_ties[declared-tie-split]"][0] == "passed"
    assert planted.outcomes["test_apply_keeps_ties[reference]"][0] == "passed"
    _, table = parse_table(planted.stdout)
    word, note = table["APPLY-TIES"]["declared-tie-split"]
    assert word == "dev" and re.fullmatch(r"deviations seen: parameter-tie-split x([1-9]\d*); "
                                          r"matched: planted.apply.tie-split x\1", note), note
    json_cell = planted.report["table"]["APPLY-TIES"]["declared-tie-split"]
    assert json_cell["status"] == "deviation"
    assert json_cell["deviations"]["parameter-tie-split"] >= 1
    assert table["APPLY-TIES"]["reference"] == ("pass", "")
    assert table["APPLY-TIES"]["broken-tie-split"][0] == "FAIL"
    assert table["APPLY-TIES"]["broken-tie-split"][1].startswith("broken: [parameter-tie-split] tied")
    assert table["APPLY-TIES"]["stale-declaration"][0] == "FAIL"


# ---- 4. the JSON report matches the table, serially and under xdist --------------------


def _check_report_matches_table(run: Run) -> None:
    assert run.report is not None, run.output[-3000:]
    version, table = parse_table(run.stdout)
    assert version == f"torch {run.report['torch']}"
    want = run.report["table"]
    assert set(table) == set(want) == {"APPLY-TIES", "FC-INPUT-FORMS"}
    targets = {t for row in want.values() for t in row}
    assert targets == {"reference", "torch-stateless", "broken-tie-split",
                       "declared-tie-split", "stale-declaration"}
    for pid, row in table.items():
        assert set(row) == targets
        for target, shown_cell in row.items():
            assert shown_cell == (shown(want[pid][target]) if target in want[pid] else ("-", "")), (
                pid, target)
    assert table["FC-INPUT-FORMS"]["reference"] == ("-", "")
    assert all(cell["tests"] == 1 for row in want.values() for cell in row.values())
    times = run.report["times"]
    assert {(p, t) for p, row in times.items() for t in row} == {
        (p, t) for p, row in want.items() for t, cell in row.items()
        if cell["status"] != "skipped"}, "every cell that ran has its call time"
    assert all(seconds >= 0 for row in times.values() for seconds in row.values())


def test_json_report_matches_terminal_table(planted):
    _check_report_matches_table(planted)


def test_json_report_gives_each_failure_its_property_clause_message_and_repro(planted):
    failures = planted.report["table"]["APPLY-TIES"]["broken-tie-split"]["failures"]
    assert [(f["property"], f["clause"]) for f in failures] == [("APPLY-TIES", "parameter-tie-split")]
    assert re.fullmatch(r"tied parameter names \[.+\] now hold [2-9] objects", failures[0]["message"])
    written = planted.repro_dir / "test_apply_keeps_ties-broken-tie-split.py"
    assert failures[0]["repro"] == written.read_text()
    stale = planted.report["table"]["APPLY-TIES"]["stale-declaration"]["failures"]
    assert [(f["clause"], f["repro"]) for f in stale] == [("", "")]
    assert stale[0]["message"].startswith(
        "APPLY-TIES on target 'stale-declaration': stale deviation [parameter-tie-split]")
    assert planted.report["table"]["APPLY-TIES"]["reference"]["failures"] == []


def test_json_report_matches_terminal_table_under_xdist(planted_xdist, planted):
    assert planted_xdist.returncode == 1, planted_xdist.output[-3000:]
    assert re.search(r"\b2 workers\b|created: 2/2 workers", planted_xdist.output)
    _check_report_matches_table(planted_xdist)
    assert planted_xdist.report["table"] == planted.report["table"]


# ---- 5. a bad target string is a usage error -------------------------------------------


@pytest.mark.parametrize(("spec", "message"), [
    ("nosuch", "ERROR: swapspec: cannot load target 'nosuch': not a built-in name (reference, "
               "torch, torch-stateless) and ModuleNotFoundError: No module named 'nosuch'"
               + targets._IMPORT_HINT),
    ("nosuch.module:x", "ERROR: swapspec: cannot load target 'nosuch.module:x': "
                        "ModuleNotFoundError: No module named 'nosuch'" + targets._IMPORT_HINT),
])
def test_bad_target_is_one_line_usage_error(tmp_path, spec, message):
    run = run_pytest(tmp_path, TIES, f"--swapspec-target={spec}")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.output
    assert "Traceback" not in run.output
    assert [line for line in run.stderr.splitlines() if line.strip()] == [message]
    assert "collected" not in run.stdout


# ---- 6. skips are data ---------------------------------------------------------------------


def test_declared_skip_shows_in_table_with_reason(planted):
    assert planted.outcomes["test_fc_input_forms[torch-stateless]"][0] == "skipped"
    _, table = parse_table(planted.stdout)
    assert table["FC-INPUT-FORMS"]["torch-stateless"] == (
        "skip", "torch-stateless declares a skip: " + STATELESS_REASON.split(": ", 1)[1])
    cell = planted.report["table"]["FC-INPUT-FORMS"]["torch-stateless"]
    assert (cell["status"], cell["reason"]) == ("skipped", STATELESS_REASON)


# ---- 7. profiles -------------------------------------------------------------------------


HOST_CONFTEST = """
from hypothesis import settings

settings.register_profile("host", max_examples=7)
settings.load_profile("host")
"""

PROBE = """
from hypothesis import settings


def test_probe():
    s = settings.default
    print(f"PROFILE max_examples={s.max_examples} derandomize={s.derandomize}")
"""


@pytest.fixture
def host_project(tmp_path: Path) -> Path:
    """A project with its own ini and its own loaded Hypothesis profile (max_examples=7)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(HOST_CONFTEST)
    (tmp_path / "test_probe.py").write_text(PROBE)
    return tmp_path


def _profile_line(run: Run) -> str:
    lines = [line for line in run.stdout.splitlines() if "PROFILE " in line]
    assert len(lines) == 1, run.output[-3000:]
    return lines[0].split("PROFILE ", 1)[1]


@pytest.mark.parametrize(("args", "env", "want"), [
    ((), {}, "max_examples=7 derandomize=False"),
    (("--swapspec-profile=swapspec-ci",), {}, "max_examples=40 derandomize=True"),
    ((), {"SWAPSPEC_PROFILE": "swapspec-thorough"}, "max_examples=400 derandomize=False"),
], ids=["none", "option", "env"])
def test_profile_selection(host_project, args, env, want):
    run = run_pytest(host_project, "-p", "swapspec.properties.harness.plugin", "-s", "test_probe.py", *args,
                     cwd=host_project, **env)
    assert run.returncode == 0, run.output[-3000:]
    assert _profile_line(run) == want


def test_unknown_profile_is_usage_error(host_project):
    run = run_pytest(host_project, "-p", "swapspec.properties.harness.plugin", "test_probe.py",
                     "--swapspec-profile=nosuch", cwd=host_project)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.output
    assert "Traceback" not in run.output
    assert "swapspec: unknown profile 'nosuch'; choose one of swapspec-dev, swapspec-ci, " \
           "swapspec-thorough" in run.stderr


# ---- 8. isolation ----------------------------------------------------------------------------


ISOLATION = """
import random

import pytest
import torch

from swapspec import reference

pytestmark = pytest.mark.swapspec_property("HOST-ISOLATED")  # opts these tests in
torch.manual_seed(1234)
random.seed(99)
TORCH_RNG = torch.get_rng_state()
PY_RNG = random.getstate()


def test_a_leaks_everything_and_fails():
    torch.__future__.set_swap_module_params_on_conversion(True)
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    reference.set_swap_module_params_on_conversion(True)
    reference.set_overwrite_module_params_on_conversion(True)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.nn.modules.module.register_module_forward_pre_hook(lambda m, args: None)
    torch.nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: None)
    torch.manual_seed(0)
    random.seed(0)
    raise AssertionError("planted failure")


def test_b_sees_everything_restored():
    assert not torch.__future__.get_swap_module_params_on_conversion()
    assert not torch.__future__.get_overwrite_module_params_on_conversion()
    assert not reference.get_swap_module_params_on_conversion()
    assert not reference.get_overwrite_module_params_on_conversion()
    assert torch.get_default_dtype() == torch.float32
    assert torch.is_grad_enabled()
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not torch.nn.modules.module._global_backward_hooks
    assert torch.equal(torch.get_rng_state(), TORCH_RNG)
    assert random.getstate() == PY_RNG


def test_c_leaks_only_dtype():
    torch.set_default_dtype(torch.float64)


def test_d_changes_only_rng():
    torch.rand(3)
    random.random()
"""


def test_isolation_restores_and_names_leaks(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_iso.py").write_text(textwrap.dedent(ISOLATION))
    junit = tmp_path / "junit.xml"
    run = run_pytest(tmp_path, "-p", "swapspec.properties.harness.plugin", "test_iso.py", f"--junitxml={junit}", cwd=tmp_path)
    assert run.returncode == 1, run.output[-3000:]
    summary = run.stdout.splitlines()[-1]
    assert "1 failed, 3 passed, 2 errors" in summary, summary
    leaked_all = ("test leaked global state (now restored): ['default dtype', "
                  "'global module hooks', 'grad mode', 'reference overwrite flag', "
                  "'reference swap flag', 'torch overwrite flag', 'torch swap flag']")
    assert leaked_all in run.stdout
    assert "test leaked global state (now restored): ['default dtype']" in run.stdout
    errors = re.findall(r"ERROR at teardown of (\w+)", run.stdout)
    assert errors == ["test_a_leaks_everything_and_fails", "test_c_leaks_only_dtype"]
    cases = ET.parse(junit).getroot().iter("testcase")
    # test_b passing shows that everything, the RNGs included, was put back after a failure
    passed = [c.get("name") for c in cases
              if not any(x.tag in ("failure", "error", "skipped") for x in c)]
    assert passed == ["test_b_sees_everything_restored", "test_d_changes_only_rng"]


HOST_TESTS = """
import pytest
import torch


@pytest.fixture(params=["a", "b"])
def target(request):
    return request.param


def test_host_target_fixture_is_the_hosts(target):
    assert target in ("a", "b")


def test_host_leak_is_the_hosts_business():
    torch.set_default_dtype(torch.float64)


def test_host_sees_its_own_leak():
    assert torch.get_default_dtype() == torch.float64
    torch.set_default_dtype(torch.float32)
"""


def test_plugin_is_inert_in_a_hosts_own_tests(tmp_path):
    """Installed, the plugin loads in every run of the host; it must not parametrize, isolate
    or fail the host's own tests, nor ask for a target when no property is collected."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_host.py").write_text(textwrap.dedent(HOST_TESTS))
    run = run_pytest(tmp_path, "-p", "no:randomly", "test_host.py", "-v", cwd=tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    assert "4 passed" in run.stdout.splitlines()[-1], run.output[-3000:]
    assert "swapspec conformance report" not in run.output
    assert "--swapspec-target" in run_pytest(tmp_path, "--help", cwd=tmp_path).stdout


def test_exported_property_ids_are_exactly_the_catalogue():
    from swapspec.properties import vocabulary
    from swapspec.properties.harness.catalogue import properties

    defined = [pid for pid, _, _ in properties()]
    assert sorted(defined) == sorted(vocabulary.ALL)
    assert len(set(vocabulary.ALL)) == len(vocabulary.ALL)
    for family, members in vocabulary.FAMILIES.items():
        prefix = {"apply": "APPLY-", "functional_call": "FC-", "together": "TOGETHER-", "xla": "XLA-",
                  "sequences": "SEQ-", "load_state_dict": "LOAD-", "checkpoint": "CHECKPOINT-",
                  "registration": "REGISTER-",
                  "parametrize": "PARAMETRIZE-", "old_style": "OLD-STYLE-", "accessor": "ACCESSOR-",
                  "stacking": "STACK-", "module_conversions": "MODCONV-"}
        assert all(m.startswith(prefix[family]) for m in members), family


def test_select_by_property_id(tmp_path):
    run = run_pytest(tmp_path, "--co", "-q", "properties", "--swapspec-target=reference",
                     "--swapspec-property", "FC-TIES,APPLY-TIES")
    assert run.returncode == 0, run.output[-2000:]
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert collected == ["properties/rules/test_apply.py::test_apply_keeps_ties[reference]",
                         "properties/rules/test_functional_call.py::test_fc_tie_rules[reference]"]
    by_k = run_pytest(tmp_path, "--co", "-q", "properties", "--swapspec-target=reference",
                      "-k", "FC-TIES")
    assert [line for line in by_k.stdout.splitlines() if "::" in line] == collected[1:]
    typo = run_pytest(tmp_path, "--co", "properties", "--swapspec-property", "FC-TIE")
    assert typo.returncode == pytest.ExitCode.USAGE_ERROR
    assert "unknown property ID(s) FC-TIE" in typo.stderr


def test_collecting_properties_without_a_target_outside_the_checkout_is_a_usage_error(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = run_pytest(tmp_path, "--pyargs", "swapspec.properties", cwd=tmp_path)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.output[-2000:]
    assert "swapspec: no target chosen" in run.stderr
    assert "Traceback" not in run.output


def test_a_crashing_target_fails_one_property_with_its_repro(tmp_path):
    """A segfault inside the target fails that test for that target only, with the in-flight
    example's repro; xdist replaces the worker and the run goes on."""
    report = tmp_path / "r.json"
    run = run_pytest(tmp_path, "-n", "2", f"{TIES}[crashing]", f"{TIES}[reference]",
                     f"{FORMS}[reference]", "--swapspec-target=reference,tests.planted.crashing",
                     "-p", "tests.planted.fast_profile", f"--swapspec-report={report}",
                     timeout=300)
    assert run.returncode == 1, run.output[-3000:]
    assert "1 failed, 2 passed" in run.stdout.splitlines()[-1], run.output[-3000:]
    assert "crashed while running" in run.output
    assert "APPLY-TIES on target 'crashing': the interpreter died" in run.output
    assert "importlib.import_module('tests.planted.crashing')" in run.output
    table = json.loads(report.read_text())["table"]
    assert table["APPLY-TIES"]["crashing"]["status"] == "fail"
    assert table["APPLY-TIES"]["reference"]["status"] == "pass"
    assert table["FC-INPUT-FORMS"]["reference"]["status"] == "pass"
