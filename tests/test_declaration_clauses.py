"""Every clause a built-in declaration names is one a check writes.

A declaration matches a violation by its clause code; one naming a code no check writes (a typo,
a renamed clause) never matches, and with ``always=False`` nothing reports it stale, so the
deviation it meant to declare stays undeclared unnoticed. The checks write most codes as string
literals; the few they build from a variable are listed in ``GENERATED`` with the template that
builds them, and each template must still be in the source.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from swapspec.properties.declarations.xla import XLA_DEVIATIONS
from swapspec.properties.harness.targets import torch_declarations

ROOT = Path(__file__).resolve().parent.parent
CLAUSE = re.compile(r"[A-Za-z0-9_\-]+")

# Clause codes built from a variable: {code: the template in the checking code that builds it}.
GENERATED = {
    **{f"path-{p}": 'f"path-{path}"' for p in ("set_data", "swap", "overwrite", "assign", "kept")},
    **{f"{k}-tie-split": 'f"{kind}-tie-split"' for k in ("parameter", "buffer")},
    **{f"{r}-conflict": 'f"{filled.rule}-conflict"' for r in ("slot", "tie")},
}


def _checking_sources() -> list[str]:
    """The source of every module that checks (properties/, declarations left out)."""
    return [p.read_text() for p in sorted((ROOT / "properties").rglob("*.py"))
            if "declarations" not in p.parts]


def _literals(sources: list[str]) -> set[str]:
    """Every string literal of those sources shaped like a clause code."""
    return {node.value for source in sources for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and CLAUSE.fullmatch(node.value)}


def _declared_clauses() -> dict[str, set[str]]:
    """``{clause: ids of the declarations naming it}`` over torch's and XLA's declarations."""
    found: dict[str, set[str]] = {}
    for d in (*torch_declarations(), *XLA_DEVIATIONS):
        for clause in d.observed if isinstance(d.observed, tuple) else (d.observed,):
            found.setdefault(clause, set()).add(d.id)
    return found


def _unknown(declared: dict[str, set[str]], written: set[str]) -> dict[str, list[str]]:
    """The declared clauses no check writes, each with the declarations naming it."""
    return {c: sorted(ids) for c, ids in declared.items() if c not in written and c not in GENERATED}


def test_every_declared_clause_is_written_by_a_check() -> None:
    unknown = _unknown(_declared_clauses(), _literals(_checking_sources()))
    assert not unknown, f"declared clauses no check writes: {unknown}"


def test_every_generated_clause_template_is_still_in_the_checks() -> None:
    joined = "\n".join(_checking_sources())
    missing = sorted({t for t in GENERATED.values() if t not in joined})
    assert not missing, f"clause templates no check uses any more: {missing}"


def test_a_misspelt_clause_is_caught() -> None:
    """The typo a random run once found (``path-set-data`` for ``path-set_data``) is reported,
    beside the spelling the check writes."""
    declared = {"path-set-data": {"torch.apply.example"}, "path-set_data": {"torch.apply.example"},
                "raised": {"torch.apply.example"}}
    assert _unknown(declared, _literals(_checking_sources())) == {
        "path-set-data": ["torch.apply.example"]}
