"""Design switches (``Target.designs``): a target that follows a design passes with it declared
and fails without it; the draws and the oracle follow the design with no predicate."""

from __future__ import annotations

import json

import pytest
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample
from torch import nn

from swapspec.properties.harness.target_calls import design_options, target_call_inputs
from swapspec.properties.harness.targets import DESIGNS, Target, TargetError, load_target
from swapspec.properties.models.oracle import ExpectedError, expected_outcome
from swapspec.reference import functional_call
from tests.test_plugin import run_pytest

PLANTED = "tests.planted.designs"


def test_an_unknown_design_is_refused_with_the_known_ones():
    with pytest.raises(TargetError, match=r"unknown design.*no-write-back"):
        Target("x", functional_call=functional_call, designs={"no-writeback"})
    target = Target("x", functional_call=functional_call, designs=["no-write-back"])
    assert target.follows("no-write-back") and not target.follows("registered-names-only")
    with pytest.raises(KeyError):
        target.follows("nonsense")
    assert load_target(f"{PLANTED}:registered").designs == {"registered-names-only"}


def test_every_design_is_documented_and_no_input_checks_skips_the_refusals():
    assert set(DESIGNS) == {"registered-names-only", "no-write-back", "no-input-checks"}
    unchecked = load_target(f"{PLANTED}:unchecked")
    assert "no-input-checks" in unchecked.design_skip("FC-BAD-INPUT")
    assert unchecked.design_skip("FC-ORACLE") is None
    assert load_target(f"{PLANTED}:unchecked_unswitched").design_skip("FC-BAD-INPUT") is None


# No deadline: a draw builds modules, which a loaded machine slows past Hypothesis' 200 ms.
UNTIMED = settings(deadline=None, database=None)


def test_designs_shape_the_draws():
    registered = frozenset({"registered-names-only"})
    assert design_options(registered, {"valid": True}) == {"unknown_names": False}
    assert design_options(registered, {"valid": True, "invalid": True}) == {}
    assert design_options(frozenset({"no-input-checks"}), {"invalid": True}) == {
        "valid": True, "invalid": False, "conflicts": False}
    module = nn.Sequential(nn.Linear(4, 4))
    switched = target_call_inputs(load_target(f"{PLANTED}:registered"), module, valid=True)
    with pytest.raises(NoSuchExample):
        find(switched, lambda c: any(k.endswith("extra") for k in c.merged()), settings=UNTIMED)
    plain = target_call_inputs(load_target(f"{PLANTED}:registered_unswitched"), module, valid=True)
    assert find(plain, lambda c: any(k.endswith("extra") for k in c.merged()), settings=UNTIMED)
    call = find(switched, lambda c: True, settings=UNTIMED)
    assert call.designs == registered and "designs" not in repr(call)


def test_the_oracle_wants_a_key_error_for_an_unregistered_name_under_the_design():
    module = nn.Sequential(nn.Linear(4, 4))
    given = {"0.extra": module[0].weight, "0.weight": module[0].weight}
    assert not isinstance(expected_outcome(module, given, tie_weights=True, strict=False),
                          ExpectedError)
    error = expected_outcome(module, given, tie_weights=True, strict=False, registered_only=True)
    assert isinstance(error, ExpectedError) and error.type is KeyError
    assert error.matches(KeyError("'0.extra' is unknown")) and not error.matches(KeyError("x"))
    bad_path = expected_outcome(module, {"nosuch.weight": module[0].weight}, tie_weights=True,
                                strict=False, registered_only=True)
    assert bad_path.matches(AttributeError("Sequential has no attribute `nosuch`"))  # torch's too


@pytest.mark.slow  # a pytest run in a subprocess: CI-only (see pyproject's markers)
def test_each_design_passes_switched_and_fails_unswitched(tmp_path):
    """One run: each planted target passes with its design declared; the same target without
    it fails the property the design is about. The mutation profile (25 derandomized examples,
    no shrinking) asks only whether an example fails: 15 examples drew no unknown name for
    FC-ORACLE once the calls drew their autograd mode too."""
    report = tmp_path / "r.json"
    names = ["registered", "no_write_back", "unchecked"]
    targets = ",".join(f"{PLANTED}:{n}{s}" for n in names for s in ("", "_unswitched"))
    run = run_pytest(tmp_path, "properties/rules/test_functional_call.py",
                     f"--swapspec-target={targets}", "--swapspec-profile=swapspec-mutation",
                     "--swapspec-property=FC-ORACLE,FC-WRITE-BACK,FC-BAD-INPUT,FC-RESTORE",
                     f"--swapspec-report={report}", "-p", "no:xdist", timeout=600)
    table = json.loads(report.read_text())["table"]
    status = {(pid, t): c["status"] for pid, row in table.items() for t, c in row.items()}
    want = {("FC-ORACLE", "registered"): "pass", ("FC-BAD-INPUT", "registered"): "pass",
            ("FC-RESTORE", "registered"): "pass",
            ("FC-ORACLE", "registered-unswitched"): "fail",
            ("FC-WRITE-BACK", "no-write-back"): "pass",
            ("FC-WRITE-BACK", "no-write-back-unswitched"): "fail",
            ("FC-BAD-INPUT", "unchecked"): "skipped", ("FC-RESTORE", "unchecked"): "pass",
            ("FC-ORACLE", "unchecked"): "pass",
            ("FC-BAD-INPUT", "unchecked-unswitched"): "fail"}
    assert {k: status.get(k) for k in want} == want, run.output[-3000:]
    assert run.returncode == 1
