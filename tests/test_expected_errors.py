"""Errors are checked by type and by the keys their message names; torch's exact wording only
for targets with ``exact_messages`` (the built-ins)."""

from __future__ import annotations

import json

import pytest
from torch import nn

from swapspec.properties.harness.targets import load_target
from swapspec.properties.models.oracle import expected_outcome, merge_inputs
from tests.test_plugin import run_pytest

PLANTED = "tests.planted.reworded"


def _strict_error():
    import torch

    return expected_outcome(nn.Linear(2, 2), {"weight": torch.zeros(2, 2), "extra": torch.zeros(1)},
                            tie_weights=True, strict=True)


def test_strict_error_names_every_missing_and_unexpected_key():
    expected = _strict_error()
    assert expected.keys == ("extra", "bias")
    assert expected.matches(RuntimeError("unexpected 'extra', missing 'bias'"))
    assert not expected.matches(RuntimeError("unexpected 'extra'"))  # bias not named
    assert not expected.matches(ValueError("'extra' 'bias'"))  # wrong type


def test_exact_matching_wants_torchs_type_and_message():
    expected = _strict_error()
    assert expected.matches(RuntimeError(expected.message), exact=True)
    assert not expected.matches(RuntimeError("unexpected 'extra', missing 'bias'"), exact=True)

    class Sub(RuntimeError):
        pass

    assert expected.matches(Sub("extra bias")) and not expected.matches(Sub(expected.message),
                                                                         exact=True)


def test_overlap_error_names_the_repeated_keys():
    expected = merge_inputs(({"a": 1, "b": 2}, {"b": 3}))
    assert expected.keys == ("b",)
    assert expected.wanted() == "ValueError naming 'b'"
    assert expected.wanted(exact=True).startswith("ValueError: \"['b'] appeared")


def test_builtin_targets_are_held_to_exact_wording_hosts_are_not():
    assert all(load_target(n).exact_messages for n in ("reference", "torch", "torch-stateless"))
    assert not load_target(f"{PLANTED}:reworded").exact_messages


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reworded")
    report = tmp / "r.json"
    run = run_pytest(tmp, "properties/rules/test_functional_call.py::test_fc_bad_input",
                     "properties/rules/test_functional_call.py::test_fc_strict",
                     f"--swapspec-target={PLANTED}:reworded,{PLANTED}:keyless",
                     "-p", "tests.planted.fast_profile", f"--swapspec-report={report}",
                     timeout=300)
    return run, json.loads(report.read_text())["table"]


def test_reworded_errors_of_the_right_type_and_keys_pass(runs):
    run, table = runs
    assert table["FC-BAD-INPUT"]["reworded"]["status"] == "pass", run.output[-3000:]
    assert table["FC-STRICT"]["reworded"]["status"] == "pass", run.output[-3000:]


def test_errors_that_do_not_name_the_keys_fail(runs):
    run, table = runs
    assert table["FC-STRICT"]["keyless"]["status"] == "fail"
    assert "broken rule [strict-error]: want RuntimeError naming" in run.output
