"""A changed slot order is said in those words (FC-RESTORE's layout clause, FC-ORACLE's output)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.models.call_state import module_state
from swapspec.properties.rules.clauses import check_untouched, slot_order_changes, slot_orders


def reorder(module: nn.Module) -> None:
    """Pop the first parameter and register it again: same objects, another order."""
    name = next(iter(module._parameters))
    module._parameters[name] = module._parameters.pop(name)


def test_slot_order_changes_name_the_module_and_both_orders():
    model = nn.Sequential(nn.Linear(2, 2))
    before = slot_orders(model)
    reorder(model[0])
    assert slot_order_changes(before, slot_orders(model)) == [
        "module '0': slot order changed: _parameters ('weight', 'bias') -> ('bias', 'weight')"]
    assert slot_order_changes(before, before) == []


def test_a_renamed_slot_is_not_called_a_reorder():
    model = nn.Linear(2, 2)
    before = slot_orders(model)
    model.register_parameter("extra", nn.Parameter(torch.ones(1)))
    assert slot_order_changes(before, slot_orders(model)) == []


def test_the_restore_clause_says_the_slot_order_changed():
    model = nn.Linear(2, 2)
    target = SimpleNamespace(name="planted", deviations=[], invariants=False)
    check = Checker("FC-RESTORE", target, SimpleNamespace(module=model, call=None,
                                                          conversion=None))
    before = module_state(model)
    reorder(model)
    check_untouched(check, before, model, "not-restored")
    messages = [v.message for v in check.violations]
    assert messages == ["module '<root>' changed class or attributes: slot order changed: "
                        "_parameters ('weight', 'bias') -> ('bias', 'weight')"]



@pytest.mark.slow  # a pytest run in a subprocess: CI-only (see pyproject's markers)
def test_fc_oracle_says_the_slot_order_changed(tmp_path):
    from tests.test_plugin import run_pytest

    run = run_pytest(tmp_path, "properties/rules/test_functional_call.py::test_fc_matchesloaded_copy",
                     "--swapspec-target=tests.planted.reordering", "-p",
                     "tests.planted.fast_profile", "-p", "no:xdist", timeout=300)
    assert run.returncode == 1, run.output[-3000:]
    text = " ".join(run.output.split())
    assert re.search(r"broken rule \[output\]: the slot order changed \(in forward, module "
                     r"'[^']+': slot order changed: _parameters \(", text), run.output[-3000:]
