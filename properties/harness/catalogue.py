"""Print the property catalogue and the declared deviations as Markdown tables.

Usage: ``python -m properties.harness.catalogue`` (from the checkout). The README's tables come
from this command, so they always match the code.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Iterator

PROPERTY_MODULES = ("swapspec.properties.rules.test_apply", "swapspec.properties.rules.test_apply_training",
                    "swapspec.properties.rules.test_apply_memory_format",
                    "swapspec.properties.rules.test_construction",
                    "swapspec.properties.rules.test_functional_call",
                    "swapspec.properties.rules.test_functional_call_transforms",
                    "swapspec.properties.rules.test_together", "swapspec.properties.rules.test_xla",
                    "swapspec.properties.rules.test_sequences",
                    "swapspec.properties.rules.test_load_state_dict",
                    "swapspec.properties.rules.test_checkpoint",
                    "swapspec.properties.rules.test_registration",
                    "swapspec.properties.rules.test_parametrize",
                    "swapspec.properties.rules.test_old_style",
                    "swapspec.properties.rules.test_accessor",
                    "swapspec.properties.rules.test_contracts",
                    "swapspec.properties.rules.test_module_conversions")


def properties() -> Iterator[tuple[str, str, str]]:
    """(ID, rule, origin) of every property, in file order; a property several tests check
    (``SEQ-STATE``: free sequences and the pair schedule) is given by its first test."""
    seen = set()
    for module_name in PROPERTY_MODULES:
        module = importlib.import_module(module_name)
        tests = sorted((t for _, t in inspect.getmembers(module, inspect.isfunction)),
                       key=lambda t: inspect.unwrap(t).__code__.co_firstlineno)
        for test in tests:
            marks = getattr(test, "pytestmark", [])
            ids = [m.args[0] for m in marks if m.name == "swapspec_property"]
            if ids and ids[0] not in seen:
                seen.add(ids[0])
                doc = inspect.getdoc(test) or ""
                yield ids[0], _first_sentence(doc), _origin(doc)


def _first_sentence(doc: str) -> str:
    return " ".join(doc.split("\n\n")[0].split())


def _origin(doc: str) -> str:
    match = re.search(r"Origin:\s*(.+?)(?:\n\n|$)", doc, re.S)
    return " ".join(match.group(1).split()) if match else ""


def deviations() -> Iterator[tuple[str, str, str, str]]:
    """(properties, clauses, torch versions, reason) of every torch declaration."""
    from swapspec.properties.harness.targets import builtin_target

    for d in builtin_target("torch").deviations:
        low, below = d.torch_versions
        versions = f"{low or ''}..{below or ''}" if (low or below) else "all"
        yield ", ".join(d.property_ids), " / ".join(d.clauses), versions, d.reason


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> None:
    print("| ID | rule | origin |\n|---|---|---|")
    for pid, rule, origin in sorted(properties()):
        print(f"| `{pid}` | {_cell(rule)} | {_cell(origin)} |")
    from swapspec.properties.models.invariants import INVARIANTS

    print("\nChecked after every operation of every property and every sequence step (a clause of the "
          "property where it broke), on the built-in targets and on any target with "
          "`SWAPSPEC_INVARIANTS=1` or `Target(invariants=True)`:\n\n| invariant | rule |\n|---|---|")
    for iid, rule in INVARIANTS:
        print(f"| `{iid}` | {_cell(rule)} |")
    if "--deviations" in sys.argv:
        print("\n| properties | clause(s) | torch | reason and repro |\n|---|---|---|---|")
        for pids, clauses, versions, reason in deviations():
            print(f"| {pids} | `{clauses}` | {versions} | {_cell(reason)} |")


if __name__ == "__main__":
    main()
