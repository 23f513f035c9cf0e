"""A changed slot order is said in those words (FC-RESTORE's layout clause, FC-ORACLE's output)."""

from __future__ import annotations

from types import SimpleNamespace

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
