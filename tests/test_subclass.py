"""A library's own tensor subclass gets no false verdict from the suite's own machinery.

``tests.planted.quantized`` has ``QTensor``, a wrapper subclass that implements only the ops its
Linear forward needs (no ``equal``, ``clone``, ``isnan``, ``tolist``). The suite's comparisons
(``same_values``, ``same_output``), snapshots (``value_copy``, ``snapshot_values``,
``clone_value``, the invariants' world) and repro values (``standalone.tensor_code``) work on it;
a host can give its own comparison; and an error raised in the suite's own code is a harness
error (status ``error``, with its traceback), never the target's ``fail``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from swapspec.properties.harness import checker
from swapspec.properties.harness.plugin import _status, harness_error, harness_failure
from swapspec.properties.harness.report import STATUS_WORDS, cell_note, conformance_table
from swapspec.properties.models import invariants, standalone
from swapspec.properties.models.examples import (
    clone_value,
    comparing,
    same_values,
    snapshot_values,
    value_copy,
)
from swapspec.properties.models.outcomes import Outcome, mark_target_error, same_output
from tests.planted.quantized import OpaqueQLinear, QLinear, QTensor
from tests.test_plugin import run_pytest


def _weight(seed: int = 0) -> QTensor:
    return QLinear(seed).weight


def test_the_subclass_implements_only_a_forward():
    w = _weight()
    assert torch.allclose(QLinear()(torch.ones(1, 4)), torch.ones(1, 4) @ w.dequantize().T
                          + QLinear().bias)
    for op in (lambda: torch.equal(w, w), lambda: w.clone(), lambda: w.isnan()):
        with pytest.raises(NotImplementedError):
            op()
    with pytest.raises(RuntimeError, match="not supported for tensor subclasses"):
        w.tolist()


def test_same_values_compares_the_subclass_by_its_parts():
    w = _weight()
    assert same_values(w, w) and same_values(w, value_copy(w))
    assert not same_values(w, _weight(1))
    scaled = value_copy(w)
    scaled.scale.mul_(2)
    assert not same_values(w, scaled)
    shifted = value_copy(w)
    shifted.qdata.add_(1)
    assert not same_values(w, shifted)
    # another class, and the subclass cannot compare itself: a class change is a change
    assert not same_values(w, w.dequantize()) and not same_values(w.dequantize(), w)


def test_a_class_without_parts_the_suite_cannot_read_raises():
    opaque = OpaqueQLinear().weight
    with pytest.raises(NotImplementedError, match="equal"):
        same_values(opaque, opaque)


def test_snapshots_copy_the_subclass_without_its_clone():
    module = QLinear()
    snap = snapshot_values(module)
    assert type(snap["weight"]) is QTensor and snap["weight"].qdata is not module.weight.qdata
    module.weight.qdata.zero_()
    assert not same_values(module.weight, snap["weight"])  # the copy kept the old values
    param = clone_value(QLinear().weight)
    assert isinstance(param, nn.Parameter) and isinstance(param, QTensor)
    assert same_values(param, QLinear().weight)


def test_the_invariants_world_sees_a_change_of_the_subclass():
    module = QLinear()
    before = invariants.world([module])
    assert invariants.unchanged(before) == []
    module.weight.scale.mul_(3)
    assert [v.clause for v in invariants.unchanged(before)] == [invariants.RAISE_UNCHANGED]


def test_outcomes_compare_the_subclass():
    w = _weight()
    assert same_output(Outcome(result=w), Outcome(result=value_copy(w)))
    assert not same_output(Outcome(result=w), Outcome(result=_weight(1)))


def test_a_host_comparison_decides_for_its_classes_and_only_inside_its_block():
    w = _weight()
    regrid = value_copy(w)  # nearly the same values: what a host may call equal
    regrid.scale.mul_(1 + 1e-6)
    assert not same_values(w, regrid)
    close = {QTensor: lambda a, b: torch.allclose(a.dequantize(), b.dequantize())}
    with comparing(close):
        assert same_values(w, regrid)
        assert not same_values(w, _weight(1))
    assert not same_values(w, regrid)


def test_a_repro_writes_the_subclass_from_its_parts():
    w = _weight()
    code = standalone.tensor_code(w)
    assert "QTensor.__tensor_unflatten__(" in code and ".tolist" not in code
    rebuilt = eval(code, {"torch": torch, "nn": nn, "importlib": __import__("importlib")})
    assert isinstance(rebuilt, nn.Parameter) and type(rebuilt) is QTensor
    assert same_values(rebuilt, w) and rebuilt.requires_grad is False


def _call(error: BaseException) -> SimpleNamespace:
    return SimpleNamespace(excinfo=SimpleNamespace(value=error))


def test_an_error_of_the_suite_is_a_harness_error_and_a_broken_rule_is_not():
    own = NotImplementedError("QTensor does not implement aten.equal.default")
    assert harness_error(_call(own)) is own
    assert harness_error(_call(checker.ConformanceError("broken"))) is None
    assert harness_error(_call(mark_target_error(ValueError("the target's")))) is None
    grouped = ExceptionGroup("two", [KeyError("x"), checker.ConformanceError("broken")])
    assert harness_error(_call(grouped)) is None
    assert harness_error(SimpleNamespace(excinfo=None)) is None  # a stale region: no exception


def test_a_harness_error_has_its_own_status_and_traceback():
    try:
        same_values(OpaqueQLinear().weight, OpaqueQLinear().weight)
    except NotImplementedError as e:
        failure = harness_failure("FC-RESTORE", e)
    assert failure["clause"] == "" and failure["message"].startswith("harness error: ")
    assert "examples.py" in failure["message"] and "same_values" in failure["traceback"]
    report = SimpleNamespace(skipped=False, failed=True)
    assert _status(report, {"deviations": {}, "harness_error": True}) == "error"
    assert _status(report, {"deviations": {}}) == "fail"
    results = [{"property": "P", "target": "t", "status": s, "reason": s, "deviations": {},
                "failures": [failure] if s == "error" else []} for s in ("pass", "error")]
    cell = conformance_table(results)["P"]["t"]
    assert (cell["status"], STATUS_WORDS["error"]) == ("error", "ERROR")
    assert cell_note(cell).startswith("no verdict: harness error: NotImplementedError")
    worse = conformance_table([*results, {**results[0], "status": "fail"}])["P"]["t"]
    assert worse["status"] == "fail"  # a verdict outranks a harness error of another test


FIVE = "APPLY-ROUND-TRIP,FC-BAD-INPUT,FC-INPUT-FORMS,FC-RESTORE,FC-STRICT"


def test_no_false_verdict_on_the_subclass_and_harness_errors_on_a_class_without_parts(tmp_path):
    """The five properties that the suite's own ``torch.equal`` failed on a subclass pass on
    ``quantized`` (torch's built-in target drawing ``QLinear`` and ``quantize``); on ``opaque``,
    whose weight the suite cannot copy, they are harness errors with a traceback, not FAIL."""
    report = tmp_path / "r.json"
    run = run_pytest(tmp_path, "properties/rules/test_apply.py",
                     "properties/rules/test_functional_call.py",
                     "--swapspec-target=tests.planted.quantized:target,"
                     "tests.planted.quantized:opaque", f"--swapspec-property={FIVE}",
                     "-p", "tests.planted.fast_profile", "-p", "no:xdist",
                     f"--swapspec-report={report}", timeout=300)
    table = json.loads(report.read_text())["table"]
    for pid in FIVE.split(","):
        assert table[pid]["quantized"]["status"] in ("pass", "deviation"), table[pid]["quantized"]
        cell = table[pid]["opaque"]
        assert cell["status"] == "error", (pid, cell)
        assert all(f["message"].startswith("harness error: NotImplementedError: OpaqueQTensor")
                   and "examples.py" in f["traceback"]
                   for f in cell["failures"]), cell["failures"]
    assert run.returncode == 1 and "ERROR [" in run.output, run.output[-3000:]
