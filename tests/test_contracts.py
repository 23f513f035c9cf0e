"""Contracts (``strategies.contracts``) and module conversions: what a contract accepts and
refuses, the public methods' contracts, the MODCONV family's skip without module conversions,
and the example host's quantized library (``examples/host/mylib/qweight.py``): it conforms, and
each of its planted bugs is caught in the CI profile with a repro that exits 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from swapspec.properties.harness.targets import builtin_target
from swapspec.strategies import Contract
from swapspec.strategies.contracts import close, is_floating, plain_values, tensor_class
from swapspec.strategies.method_calls import METHOD_CONVERSIONS
from tests.repro_scripts import run_script

REPO = Path(__file__).resolve().parent.parent
HOST = REPO / "examples" / "host"
sys.path.insert(0, str(HOST))

from mylib.qweight import QWeight, dequantize, quantize  # noqa: E402
from mylib.swapspec_quant import QUANTIZE_, QUANTIZED  # noqa: E402

HALF = next(c for c in METHOD_CONVERSIONS if c.name == "module.half()").contract
TO_META = next(c for c in METHOD_CONVERSIONS if c.name == "module.to(device='meta')").contract


def test_every_public_conversion_method_states_a_contract():
    assert all(c.contract is not None for c in METHOD_CONVERSIONS)


def test_half_s_contract_holds_for_half_and_not_for_a_wrong_dtype_or_values():
    t = torch.linspace(-3, 3, 12).reshape(3, 4)
    assert HALF.problems(t, t.half()) == []
    assert HALF.problems(t, t.bfloat16()) == ["dtype torch.bfloat16, want torch.float16"]
    assert HALF.problems(t, (t + 0.01).half())[0].startswith("values off by")
    ints = torch.arange(4)
    assert HALF.problems(ints, ints) == []  # another kind: its dtype kept
    assert HALF.problems(ints, ints.double()) == ["dtype torch.float64, want torch.int64"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_value_below_the_dtype_s_smallest_normal_may_round_to_its_subnormal_grid(dtype):
    info = torch.finfo(dtype)
    step = info.smallest_normal * info.eps  # the spacing of dtype's subnormals
    t = torch.tensor([0.5, 2.3 * step, 1000.7 * step], dtype=torch.float64)
    contract = Contract("dtype", dtype=dtype)
    assert contract.problems(t, t.to(dtype)) == []
    off = t.to(dtype) + torch.tensor([0.0, step, 0.0], dtype=torch.float64).to(dtype)
    problem, = contract.problems(t, off)
    assert "at flat index 1" in problem, problem


def test_to_meta_s_contract_asks_for_meta_and_no_values():
    t = torch.ones(2, 2)
    assert TO_META.problems(t, t.to("meta")) == []
    assert TO_META.problems(t, t) == ["device cpu, want meta"]


def test_a_contract_reads_values_through_the_host_s_dequantization():
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    q = quantize(w)
    assert isinstance(q, QWeight) and QUANTIZED.problems(w, q) == []
    off = QWeight(q.qdata, q.scale * 1.5)
    assert QUANTIZED.problems(w, off)[0].startswith("values off by")
    assert QUANTIZED.problems(w, w) == ["class Tensor, want QWeight"]
    assert plain_values(q) is None  # a subclass: only its own dequantization reads it
    assert close(dequantize(q), w, atol=float(w.abs().max()) / 254 * 1.001, rtol=0.0)


def test_a_contract_refuses_only_what_it_says():
    assert not QUANTIZED.raises(torch.ones(2, 2))
    assert QUANTIZED.raises(torch.full((2, 2), float("nan")))
    assert not Contract("any", converts=is_floating).raises(torch.ones(1))


def test_tensor_class_is_the_class_that_holds_the_values():
    assert tensor_class(nn.Parameter(torch.ones(1))) is torch.Tensor
    assert tensor_class(quantize(torch.ones(2, 2))) is QWeight


def test_the_module_conversion_keeps_ties_and_is_atomic():
    mlp = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    mlp[1].weight = mlp[0].weight
    QUANTIZE_.make_fn()(mlp)
    assert mlp[0].weight is mlp[1].weight and isinstance(mlp[0].weight, QWeight)
    other = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    before = dict(other.named_parameters())
    with torch.no_grad():
        QUANTIZE_.make_refuse()(other[1].weight)
    with pytest.raises(ValueError, match="non-finite"):
        QUANTIZE_.make_fn()(other)
    assert dict(other.named_parameters()) == before


def test_the_built_in_targets_skip_the_module_conversion_family():
    for name in ("reference", "torch", "torch-stateless"):
        assert builtin_target(name).missing(["module_conversions"]) == ["module_conversions"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SWAPSPEC_", "HYPOTHESIS_", "PYTEST_", "MYLIB_"))}
    return {**env, "PYTHONPATH": str(HOST), **extra}


def _ci_run(tmp_path: Path, properties: str | None, **env: str) -> tuple[int, dict]:
    """A CI-profile run against the quantized library of ``properties`` (None: every one)."""
    report = tmp_path / "report.json"
    chosen = [] if properties is None else [f"--swapspec-property={properties}"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "--pyargs", "swapspec.properties", "--swapspec-profile=swapspec-ci",
         "--swapspec-target=mylib.swapspec_quant:target", *chosen,
         f"--swapspec-report={report}"],
        cwd=HOST, env=_env(**env), capture_output=True, text=True, timeout=600)
    return run.returncode, json.loads(report.read_text())["table"]


@pytest.mark.slow
@pytest.mark.parametrize(("bug", "property_id", "clause"), [
    ("untie", "MODCONV-TIES", "tie-split"),
    ("not-atomic", "MODCONV-ATOMIC", "changed"),
    ("scale-dtype", "APPLY-CONTRACT", "contract"),
])
def test_each_planted_bug_is_caught_with_a_repro_that_exits_1(tmp_path, monkeypatch, bug,
                                                              property_id, clause):
    code, table = _ci_run(tmp_path, property_id, MYLIB_PLANTED_BUG=bug)
    cell = table[property_id]["mylib-quant"]
    assert code == 1 and cell["status"] == "fail", cell
    failure = next(f for f in cell["failures"] if f["clause"] == clause)
    assert failure["repro"].splitlines()[0].startswith("from __future__")
    assert "from mylib.qweight import" in failure["repro"]
    monkeypatch.setenv("MYLIB_PLANTED_BUG", bug)
    caught = run_script(failure["repro"], tmp_path / "with", pythonpath=HOST)
    assert caught.returncode == 1, caught.stderr[-2000:]
    monkeypatch.delenv("MYLIB_PLANTED_BUG")
    fixed = run_script(failure["repro"], tmp_path / "without", pythonpath=HOST)
    assert fixed.returncode == 0, fixed.stderr[-2000:]


@pytest.mark.slow
def test_the_quantized_library_gets_no_false_verdict_on_any_property(tmp_path):
    """Every property (CI profile) passes on the quantized library or shows only torch's
    declared deviations; only the XLA properties are skipped (no XLA device here)."""
    code, table = _ci_run(tmp_path, None)
    statuses = {pid: row["mylib-quant"]["status"] for pid, row in table.items()}
    wrong = {pid: s for pid, s in statuses.items()
             if s not in ("pass", "deviation") and not (s == "skipped" and pid.startswith("XLA-"))}
    assert code == 0 and not wrong, wrong
    assert {pid for pid, s in statuses.items() if s == "pass"} >= {
        "MODCONV-CONTRACT", "MODCONV-TIES", "MODCONV-ATOMIC"}
