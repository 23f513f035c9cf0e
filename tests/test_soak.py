"""Unit tests of the soak runner's parts and of the plugin's filter-rate counts (no pytest runs)."""

from __future__ import annotations

import subprocess

from swapspec.properties.harness import soak
from swapspec.properties.harness.report import (
    call_times,
    filter_rates,
    invalid_reason,
    render_rate,
    render_reasons,
    render_times,
)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="properties.rules.test_apply" name="test_apply_keeps_ties[reference]" time="1.0"/>
<testcase classname="properties.rules.test_apply" name="test_apply_path[reference]" time="1.0">
<failure message="ConformanceError: APPLY-PATH on target 'reference':">Falsifying example
You can reproduce this test case by temporarily adding @reproduce_failure('6.170.17', b'AXic') as a decorator</failure>
</testcase>
<testcase classname="properties.rules.test_functional_call" name="test_fc_tie_rules[reference]" time="1.0">
<error message="FailedHealthCheck: filter_too_much">no blob here</error>
</testcase>
</testsuite></testsuites>
"""


def test_runs_alternate_the_dev_profile_and_hypothesis_default():
    assert [soak.profile_of(i) for i in range(4)] == ["swapspec-dev", None, "swapspec-dev", None]


def test_the_dev_run_asks_for_its_profile_and_the_default_run_for_none():
    dev = soak.pytest_command(7, "swapspec-dev", "reference", "j.xml", ["-n", "2"])
    default = soak.pytest_command(7, None, "reference", "j.xml", [])
    assert "--swapspec-profile=swapspec-dev" in dev and dev[-2:] == ["-n", "2"]
    assert not any(a.startswith("--swapspec-profile") or a.startswith("--hypothesis-profile")
                   for a in default)
    assert "--hypothesis-seed=7" in default and "--swapspec-target=reference" in default


def test_failures_are_read_with_their_blob_from_junit(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    tests, failures = soak.failures_in(path, 42, None)
    assert tests == 3
    assert [f.test for f in failures] == [
        "properties/rules/test_apply.py::test_apply_path[reference]",
        "properties/rules/test_functional_call.py::test_fc_tie_rules[reference]"]
    assert failures[0].blob == "@reproduce_failure('6.170.17', b'AXic')"
    assert failures[1].blob is None and "filter_too_much" in failures[1].message
    assert all(f.seed == 42 for f in failures)


def test_a_missing_report_is_no_tests_and_no_failures(tmp_path):
    assert soak.failures_in(tmp_path / "absent.xml", 1, None) == (0, [])


def test_the_replay_command_without_a_blob_reruns_every_property_file_with_the_seed():
    failure = soak.Failure("properties/rules/test_apply.py::t[reference]", 9, "swapspec-dev", None, "x")
    command = soak.replay_command(failure, "reference")
    assert command == soak.seed_command(failure, "reference")
    assert "pytest properties -k 't[reference]'" in command
    assert "--hypothesis-seed=9" in command and "--swapspec-profile=swapspec-dev" in command
    assert "--swapspec-target=reference" in command


def test_the_replay_command_with_a_blob_replays_the_one_test_exactly():
    blob = "@reproduce_failure('6.170.17', b'AXic')"
    failure = soak.Failure("properties/rules/test_apply.py::t[reference]", 9, None, blob, "x")
    command = soak.replay_command(failure, "reference")
    assert command == ("PYTHONHASHSEED=0 pytest 'properties/rules/test_apply.py::t[reference]' "
                       f'--swapspec-target=reference --swapspec-reproduce="{blob}"')
    lines = soak.summary([soak.Run(0, 9, None, 1, 1.0, 3, [failure])], "reference")
    assert f"  replay: {command}" in lines
    assert f"  replay by seed: {soak.seed_command(failure, 'reference')}" in lines


def test_the_summary_counts_failed_runs_and_lists_each_failure():
    bad = soak.Failure("p::t", 5, None, "@reproduce_failure('v', b'x')", "boom")
    runs = [soak.Run(0, 1, "swapspec-dev", 0, 1.0, 3, []), soak.Run(1, 5, None, 1, 2.0, 3, [bad])]
    lines = soak.summary(runs, "reference")
    assert lines[0] == "soak: 2 runs against reference, 1 failed, 1 failures; code unknown"
    assert any("FAILURE p::t seed=5 profile=default" in line for line in lines)
    assert any("@reproduce_failure('v', b'x')" in line for line in lines)


def test_the_summary_names_every_state_of_the_code_its_runs_tested():
    runs = [soak.Run(0, 1, None, 0, 1.0, 3, [], "abc"), soak.Run(1, 2, None, 0, 1.0, 3, [], "abc+dirty")]
    assert soak.summary(runs, "reference")[0].endswith("; code abc, abc+dirty")


def _git(repo, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_code_state_is_the_last_commit_of_code_and_unknown_outside_git(tmp_path):
    assert soak.code_state(tmp_path) == "unknown"
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "."), _git(tmp_path, "commit", "-qm", "code")
    code_commit = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "README.md").write_text("docs\n")
    _git(tmp_path, "add", "."), _git(tmp_path, "commit", "-qm", "docs")
    assert soak.code_state(tmp_path) == code_commit, "a docs commit must not change the state"
    (tmp_path / "README.md").write_text("more docs\n")
    assert soak.code_state(tmp_path) == code_commit, "an edited document is not a dirty state"
    (tmp_path / "code.py").write_text("x = 2\n")
    assert soak.code_state(tmp_path) == code_commit + "+dirty"


def test_the_code_state_of_a_builtin_target_ignores_what_its_runs_never_load(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "."), _git(tmp_path, "commit", "-qm", "code")
    code_commit = _git(tmp_path, "rev-parse", "HEAD")
    for folder in ("tests", "examples", ".ci", ".mutation", "docs"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "helper.py").write_text("y = 1\n")
    _git(tmp_path, "add", "."), _git(tmp_path, "commit", "-qm", "own tests and tooling")
    tooling_commit = _git(tmp_path, "rev-parse", "HEAD")
    assert soak.code_state(tmp_path, "reference,torch") == code_commit, \
        "a built-in target's run never loads tests/, examples/, .ci/, .mutation/ or docs/"
    assert soak.code_state(tmp_path, "tests.zoo.old_set_data:target") == tooling_commit, \
        "a host target may live in tests/ or examples/: their commits change its state"
    (tmp_path / "tests" / "helper.py").write_text("y = 2\n")
    assert soak.code_state(tmp_path, "torch") == code_commit
    assert soak.code_state(tmp_path, "mylib.swapspec_targets:target") == tooling_commit + "+dirty"


def test_filter_rates_sum_every_test_of_a_pair_and_skip_reports_without_counts():
    results = [
        {"property": "P", "target": "t",
         "cases": {"cases": 30, "invalid": 5, "reasons": {"a": 4, "b": 1}}},
        {"property": "P", "target": "t", "cases": {"cases": 10, "invalid": 1, "reasons": {"a": 1}}},
        {"property": "P", "target": "v", "cases": {"cases": 10, "invalid": 0}},  # an older report
        {"property": "P", "target": "u"},
    ]
    assert filter_rates(results) == {"P": {
        "t": {"cases": 40, "invalid": 6, "reasons": {"a": 5, "b": 1}},
        "v": {"cases": 10, "invalid": 0, "reasons": {}}}}
    assert render_rate({"cases": 40, "invalid": 6}) == "15.0% (6/40)"
    assert render_rate({"cases": 0, "invalid": 0}) == "0.0% (0/0)"


def test_call_times_sum_every_test_of_a_pair_and_render_in_seconds():
    results = [
        {"property": "P", "target": "t", "seconds": 1.25},
        {"property": "P", "target": "t", "seconds": 0.5},
        {"property": "P", "target": "u", "seconds": 2.0},
        {"property": "Q", "target": "u"},  # a report without a duration (an old report)
    ]
    assert call_times(results) == {"P": {"t": 1.75, "u": 2.0}}
    assert render_times({"P": {"t": 1.75}, "Q": {"u": 2.0}}) == [
        "| property | t | u |", "|---|---:|---:|", "| `P` | 1.8 | - |", "| `Q` | - | 2.0 |"]


def test_invalid_reason_names_an_unsatisfied_filter_by_its_predicate():
    unsatisfied = ("gave up because: Aborted test because unable to satisfy "
                   "sampled_from([Rule(function=tie, arguments={'data': data()})])"
                   ".filter(RuleStrategy(machine=M({...}))._rule_is_enabled)")
    case = {"status": "invalid", "events": ["Retried draw to satisfy filter", unsatisfied]}
    assert invalid_reason(case) == ("Aborted test because unable to satisfy "
                                    "....filter(RuleStrategy(machine=M({...}))._rule_is_enabled)")
    assume = "gave up because: failed to satisfy assume() in f (line 3)"
    assert invalid_reason({"events": [assume]}) == "failed to satisfy assume() in f (line 3)"
    assert invalid_reason({"events": ["tree: depth=1"]}) == "unknown"
    long = invalid_reason({"events": ["gave up because: " + "x" * 500]})
    assert len(long) == 160 and long.endswith("...")


def test_render_reasons_lists_each_cell_most_common_reason_first():
    rates = {"P": {"t": {"cases": 40, "invalid": 6, "reasons": {"a": 1, "b": 5}},
                   "u": {"cases": 40, "invalid": 0, "reasons": {}}}}
    assert render_reasons(rates) == ["P [t] 5x: b", "P [t] 1x: a"]
