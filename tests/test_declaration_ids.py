"""Every declaration has a stable, unique ID, and a host selects torch's by ID, property, clause."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections import defaultdict

import pytest

from swapspec.properties import declarations
from swapspec.properties.declarations import select
from swapspec.properties.harness.targets import BUILTIN_NAMES, builtin_target, torch_declarations
from swapspec.properties.vocabulary import CRASH, Deviation

ID_FORM = re.compile(r"[a-z0-9][a-z0-9-]*(\.[a-z0-9][a-z0-9-]*)+")


def all_declarations() -> dict[int, tuple[str, Deviation]]:
    """Every ``Deviation`` a declarations module holds at its top level (alone or in a tuple),
    and every declaration of the built-in targets: ``id(object) -> (where, declaration)``."""
    found: dict[int, tuple[str, Deviation]] = {}
    for info in pkgutil.iter_modules(declarations.__path__):
        module = importlib.import_module(f"{declarations.__name__}.{info.name}")
        for name, value in vars(module).items():
            values = value if isinstance(value, tuple) else (value,)
            for d in values:
                if isinstance(d, Deviation):
                    found.setdefault(id(d), (f"{info.name}.py {name}", d))
    for target in BUILTIN_NAMES:
        for d in builtin_target(target).deviations:
            found.setdefault(id(d), (f"built-in target {target}", d))
    return found


def test_every_declaration_has_an_id_of_the_documented_form():
    missing = [f"{where}: {'|'.join(d.property_ids)} [{'|'.join(d.clauses)}] {d.reason[:70]!r}"
               for where, d in all_declarations().values() if not d.id]
    assert not missing, ("declarations without an id= (give each a unique "
                         "'owner.area.what' ID):\n  " + "\n  ".join(missing))
    malformed = sorted(d.id for _, d in all_declarations().values() if not ID_FORM.fullmatch(d.id))
    assert not malformed, f"IDs not of the form 'owner.area.what' (lowercase, dots): {malformed}"


def test_declaration_ids_are_unique():
    holders: dict[str, list[str]] = defaultdict(list)
    for where, d in all_declarations().values():
        if d.id:
            holders[d.id].append(where)
    repeated = {i: places for i, places in holders.items() if len(places) > 1}
    assert not repeated, f"IDs given to more than one declaration: {repeated}"


def test_the_scan_finds_the_declarations_of_each_module():
    ids = {d.id for _, d in all_declarations().values()}
    assert {"torch.fc.shared-slot-not-restored", "torch.load.swapped-twice",
            "torch.xla.buffer-tie-split", "torch-stateless.fc.input-form-unchecked"} <= ids


def test_the_id_is_the_declarations_key_in_counts_and_reports():
    (d,) = torch_declarations(ids=["torch.fc.tuple-rebind-lost"])
    assert d.key == "torch.fc.tuple-rebind-lost"
    anonymous = Deviation("FC-TIES", lambda e: True, "tie-conflict", "no id here")
    assert anonymous.key == "tie-conflict: no id here"


def test_torch_declarations_by_id_and_pattern():
    (one,) = torch_declarations(ids=["torch.fc.partial-tie-group-output"])
    assert one.property_ids == ("FC-ORACLE",) and one.clauses == ("output",)
    group = torch_declarations(ids=["torch.fc.partial-tie-group-*"])
    assert {d.id for d in group} == {
        "torch.fc.partial-tie-group-key-error", "torch.fc.partial-tie-group-strict",
        "torch.fc.partial-tie-group-wrong-error", "torch.fc.partial-tie-group-output",
        "torch.fc.partial-tie-group-write-back"}


def test_torch_declarations_by_property_are_narrowed_to_it():
    chosen = torch_declarations(properties=["FC-TIES"])
    assert chosen and all(d.property_ids == ("FC-TIES",) for d in chosen)
    ids = {d.id for d in chosen}
    assert "torch.fc.partial-tie-group-key-error" in ids  # declared on FC-VISIBLE and FC-TIES
    assert "torch.fc.tuple-rebind-lost" not in ids


def test_torch_declarations_by_clause_and_property_together():
    crashes = torch_declarations(properties=["FC-PARAMETRIZED"], clauses=[CRASH])
    assert [d.id for d in crashes] == ["torch.fc.restore-sets-wrapper-into-plain"]
    reused = torch_declarations(properties=["FC-PARAMETRIZED"], clauses=["not-restored", "raised"])
    assert reused and CRASH not in {c for d in reused for c in d.clauses}


def test_torch_declarations_include_torch_stateless_ones_once():
    ids = [d.id for d in torch_declarations()]
    assert len(ids) == len(set(ids))
    assert "torch-stateless.fc.input-form-unchecked" in ids


@pytest.mark.parametrize("criteria", [{"ids": ["torch.fc.no-such-thing"]},
                                      {"ids": ["mylib.*"]}, {"properties": ["FC-NOPE"]}])
def test_a_selection_that_names_nothing_raises(criteria):
    with pytest.raises(LookupError):
        torch_declarations(**criteria)


def test_select_works_on_any_declarations():
    own = (Deviation("FC-TIES", lambda e: True, "tie-conflict", "r", id="host.fc.a"),
           Deviation(("FC-TIES", "FC-ORACLE"), lambda e: True, "output", "r", id="host.fc.b"))
    assert select(own, properties=["FC-ORACLE"]) == (
        Deviation(("FC-ORACLE",), own[1].applies, "output", "r", id="host.fc.b"),)
    assert select(own, clauses=["tie-conflict"]) == own[:1]
    assert select(own) == own
