"""Compare two ``--swapspec-report`` files: what appeared, what disappeared, what changed counts.

Usage: ``python -m swapspec.properties.harness.compare A.json B.json [--presence] [--table TARGET]``

``A`` is the baseline (the last release, the main branch), ``B`` the candidate (a new
release, your branch). For every property x target cell it lists, under B's view of A:

- **appeared**: a cell, a status, a declared clause, a declaration shown, an undeclared
  failure or a skip that B has and A had not;
- **disappeared**: the same, the other way round (a declaration no longer shown is how a
  fix shows up; an undeclared failure gone is a regression fixed);
- **changed counts**: the same item in both, with different example counts (``--presence``
  leaves these out: counts move whenever the draws differ, presence is what bisects).

``--table TARGET`` prints, instead, TARGET's cells of both reports side by side as a Markdown
table (the conformance report's cell text), one row per property.

Exit status, so that it can drive ``git bisect run``: 0 when the reports agree (on presence
only, with ``--presence``), 1 when they differ, 2 when a file cannot be read or is not a
swapspec report.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAME, DIFFERENT, UNREADABLE = 0, 1, 2


class ReportError(ValueError):
    """A file that is not a readable swapspec report."""


@dataclass(frozen=True)
class Change:
    """One difference: ``kind`` is appeared / disappeared / changed; counts are A's and B's."""

    kind: str
    property_id: str
    target: str
    what: str
    before: int | None = None
    after: int | None = None

    def line(self) -> str:
        where = f"{self.property_id} [{self.target}]"
        if self.kind == "changed":
            return f"  {where} {self.what}: {self.before} -> {self.after}"
        count = self.after if self.kind == "appeared" else self.before
        return f"  {where} {self.what}" + (f" (x{count})" if count else "")


def load_report(path: str | Path) -> dict[str, Any]:
    """The report's ``{"torch": ..., "table": ...}``; ``ReportError`` when it is not one."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: cannot read a JSON report ({e})") from None
    if not isinstance(report, dict) or not isinstance(report.get("table"), dict):
        raise ReportError(f"{path}: not a swapspec report (no 'table'; write one with "
                          "pytest --swapspec-report=PATH)")
    return report


def cell_items(cell: dict[str, Any]) -> dict[str, int]:
    """What a cell shows, as ``{item: examples}``: its status, clauses, declarations, skips."""
    items: dict[str, int] = {f"status {cell['status']}": 0}
    if cell["status"] == "skipped":
        items[f"skipped ({cell.get('reason', '')})"] = 0
    if cell["status"] in ("fail", "error") and cell.get("reason"):
        items[f"failure: {cell['reason']}"] = 0
    for clause, n in cell.get("deviations", {}).items():
        items[f"declared clause {clause}"] = n
    for key, (_, shown) in cell.get("declarations", {}).items():
        if shown:
            items[f"declaration shown: {key}"] = shown
    for clause, n in cell.get("undeclared", {}).items():
        items[f"undeclared failure {clause}"] = n
    return items


def compare_cells(pid: str, target: str, a: dict[str, int], b: dict[str, int]) -> list[Change]:
    """The changes from cell items ``a`` to ``b`` of one property x target."""
    changes = [Change("appeared", pid, target, item, after=b[item]) for item in b if item not in a]
    changes += [Change("disappeared", pid, target, item, before=a[item])
                for item in a if item not in b]
    changes += [Change("changed", pid, target, item, a[item], b[item])
                for item in a if item in b and a[item] != b[item]]
    return changes


def compare_reports(a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    """Every change from report ``a`` to report ``b``, sorted by property and target."""
    changes: list[Change] = []
    pairs = {(pid, t) for report in (a, b) for pid, row in report["table"].items() for t in row}
    for pid, target in sorted(pairs):
        cell_a = a["table"].get(pid, {}).get(target)
        cell_b = b["table"].get(pid, {}).get(target)
        if cell_a is None or cell_b is None:
            kind = "appeared" if cell_a is None else "disappeared"
            changes.append(Change(kind, pid, target, "cell (property x target run)"))
        changes += compare_cells(pid, target, cell_items(cell_a) if cell_a else {},
                                 cell_items(cell_b) if cell_b else {})
    return changes


def render(a: dict[str, Any], b: dict[str, Any], changes: list[Change], *, presence: bool) -> str:
    """The human-readable diff: a header with both torch versions, then one section per kind."""
    lines = [f"A: torch {a.get('torch', '?')}    B: torch {b.get('torch', '?')}"]
    kinds = ("appeared", "disappeared") if presence else ("appeared", "disappeared", "changed")
    titles = {"appeared": "appeared in B", "disappeared": "disappeared from B",
              "changed": "changed counts (examples, A -> B)"}
    shown = [c for c in changes if c.kind in kinds]
    if not shown:
        lines.append("no differences" + (" in presence" if presence else ""))
    for kind in kinds:
        section = [c.line() for c in shown if c.kind == kind]
        if section:
            lines += [f"{titles[kind]}:", *section]
    return "\n".join(lines)


def side_by_side(a: dict[str, Any], b: dict[str, Any], target: str) -> str:
    """``target``'s cells of both reports as a Markdown table, one row per property."""
    lines = [f"| property | torch {a.get('torch', '?')} | torch {b.get('torch', '?')} |",
             "|---|---|---|"]
    for pid in sorted(set(a["table"]) | set(b["table"])):
        cells = [report["table"].get(pid, {}).get(target) for report in (a, b)]
        text = [_cell_text(c).replace("|", "\\|") if c else "-" for c in cells]
        lines.append(f"| `{pid}` | {text[0]} | {text[1]} |")
    return "\n".join(lines)


def _cell_text(cell: dict[str, Any]) -> str:
    """A cell in full: its status word, then its note (deviations seen, skip reason, broken rules)."""
    from swapspec.properties.harness.report import STATUS_WORDS, cell_note

    note = cell_note(cell)
    return f"{STATUS_WORDS[cell['status']]} ({note})" if note else STATUS_WORDS[cell["status"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swapspec.properties.harness.compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="baseline report (JSON from --swapspec-report)")
    parser.add_argument("b", help="candidate report")
    parser.add_argument("--presence", action="store_true",
                        help="ignore count changes: only what appeared or disappeared")
    parser.add_argument("--table", metavar="TARGET",
                        help="print TARGET's cells of both reports side by side (Markdown)")
    args = parser.parse_args(argv)
    try:
        a, b = load_report(args.a), load_report(args.b)
    except ReportError as e:
        print(f"compare: {e}", file=sys.stderr)
        return UNREADABLE
    changes = compare_reports(a, b)
    if args.presence:
        changes = [c for c in changes if c.kind != "changed"]
    if args.table:
        print(side_by_side(a, b, args.table))
    else:
        print(render(a, b, changes, presence=args.presence))
    return DIFFERENT if changes else SAME


if __name__ == "__main__":
    sys.exit(main())
