"""Host material reaches every property family: a CI-profile run against the planted quantized
target (``tests.planted.quantized:target``: QLinear host modules, the quantize and fake_quantize conversions)
draws host modules and host conversions in at least one property of each family, above the
floors below (from the JSON report's ``host_reach``, which the plugin collects from the
Hypothesis events ``tree: host: <name>`` and ``host conversion: <name>``).

One or two properties per family are run (``--swapspec-property``), those whose strategies
reach host material best; the families (and properties) that draw no host conversion, and the
properties that draw no host material, are named below with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# family -> the property that shows its host modules, and the one that shows its host
# conversions (None: no property of the family draws a conversion; see NO_CONVERSION)
CHOSEN = {
    "APPLY": ("APPLY-FORWARD", "APPLY-FORWARD"),
    "FC": ("FC-RESTORE", None),
    "LOAD": ("LOAD-ROUND-TRIP", None),
    "TOGETHER": ("TOGETHER-CONVERTED-CALL", "TOGETHER-CONVERTED-CALL"),
    "CHECKPOINT": ("CHECKPOINT-LOAD-HOOKS", "CHECKPOINT-PICKLE"),
    "REGISTER": ("REGISTER-SLOT", None),
    "PARAMETRIZE": ("PARAMETRIZE-ASSIGN", "PARAMETRIZE-ASSIGN"),
    "OLD": ("OLD-STYLE-REMOVE", "OLD-STYLE-REMOVE"),
    "ACCESSOR": ("ACCESSOR-GET", "ACCESSOR-GET"),
    "SEQ": ("SEQ-STATE", "SEQ-STATE"),
}
# the apply properties about what a conversion does to training and to a failed conversion:
# each draws host conversions (the planted target's ``fake_quantize`` is ``trainable``; the
# atomicity properties wrap the target's own conversion in a raising fn or refuse its swap)
APPLY_CONVERSIONS = ("APPLY-TIES", "APPLY-GRADS", "APPLY-ATOMIC", "APPLY-REFUSED-SWAP",
                     "APPLY-OPTIMIZER", "APPLY-TENSOR-HOOKS", "APPLY-FN-ONCE")
# share of a property's valid examples that drew a host module / a host conversion
MODULE_FLOOR = 0.05
CONVERSION_FLOOR = 0.05
# families whose operation takes no conversion: none of their properties draws one
NO_CONVERSION = {
    "FC": "functional_call takes tensors and inputs, no conversion",
    "LOAD": "load_state_dict takes a state dict, no conversion",
    "REGISTER": "registration takes a tensor or module, no conversion",
}
# properties that draw no host material, and why (their strategies' own needs)
EXCLUDED = {
    "CHECKPOINT-RNN-FLAT-WEIGHTS": "modules: an RNN catalogue module only",
    "CHECKPOINT-RNN-LEGACY": "modules: an RNN catalogue module only",
    "XLA-*": "an XLA device only",
}


PROPERTIES = {pid for pair in CHOSEN.values() for pid in pair if pid is not None
              } | set(APPLY_CONVERSIONS)


# families left out of the run, and why
LEFT_OUT = {
    "MODCONV": "the planted target has no module conversion (the family is skipped on it); the "
               "example host's quantized target runs it (tests/test_contracts.py)",
    "STACK": "the planted target has no stack_module_state of its own (the family is skipped on "
             "it); the ensembles FC-STACKED-ENSEMBLE runs on its functional_call are stacked by "
             "torch's",
}


@pytest.fixture(scope="module")
def reach(tmp_path_factory) -> dict[str, dict]:
    report = tmp_path_factory.mktemp("reach") / "report.json"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    for name in ("SWAPSPEC_TARGET", "SWAPSPEC_PROFILE", "SWAPSPEC_REPORT", "SWAPSPEC_PROPERTY"):
        env.pop(name, None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
         "--swapspec-profile=swapspec-ci", "--swapspec-target=tests.planted.quantized:target",
         f"--swapspec-property={','.join(sorted(PROPERTIES))}", f"--swapspec-report={report}",
         "-k", "not sequence_pair_state",  # the pair schedule: 196 cases, SEQ-STATE's free run suffices
         "properties/rules"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(report.read_text())
    statuses = {pid: cell["status"] for pid, row in data["table"].items()
                for cell in row.values()}
    assert set(statuses.values()) <= {"pass", "deviation"}, statuses  # no false verdict
    assert "swapspec host reach" in run.stdout
    return {pid: row["quantized"] for pid, row in data["host_reach"].items()}


def test_every_family_is_run_or_left_out_with_a_reason():
    from swapspec.properties.vocabulary import FAMILIES

    prefixes = {pid.split("-")[0] for ids in FAMILIES.values() for pid in ids} - {"XLA"}
    assert prefixes == set(CHOSEN) | set(LEFT_OUT)


@pytest.mark.parametrize("family", list(CHOSEN))
def test_every_family_draws_host_modules(reach, family):
    cell = reach[CHOSEN[family][0]]
    assert cell["cases"] and cell["modules"] / cell["cases"] >= MODULE_FLOOR, cell
    assert any(name.startswith("tree: host: planted.QLinear") for name in cell["names"]), cell


@pytest.mark.parametrize("family", [f for f in CHOSEN if CHOSEN[f][1] is not None])
def test_every_family_that_converts_draws_host_conversions(reach, family):
    cell = reach[CHOSEN[family][1]]
    assert cell["conversions"] / cell["cases"] >= CONVERSION_FLOOR, cell
    assert any(name.startswith("host conversion: planted.") for name in cell["names"]), cell


@pytest.mark.parametrize("pid", APPLY_CONVERSIONS)
def test_the_apply_properties_about_training_and_failure_draw_host_conversions(reach, pid):
    cell = reach[pid]
    assert cell["conversions"] / cell["cases"] >= CONVERSION_FLOOR, cell


@pytest.mark.parametrize("family", list(NO_CONVERSION))
def test_a_family_without_conversions_draws_none(reach, family):
    assert CHOSEN[family][1] is None and reach[CHOSEN[family][0]]["conversions"] == 0
