"""The regression oracle's matrix: declarations and undeclared failures x torch version.

Usage: ``python -m swapspec.properties.harness.matrix [--markdown M.md] [--json M.json] REPORT...``,
one survey-mode report (``SWAPSPEC_SURVEY=1``, what ``.ci/oracle-matrix`` runs) per torch
version. Each declaration's cell on a version, over the ``torch`` and ``torch-stateless``
cells of its properties:

- ``observed``: some example showed it (``shown/applied`` examples);
- ``not observed``: examples fell in its region and none showed it;
- ``no example``: its properties ran but no example fell in its region (no evidence);
- ``not applicable``: its properties did not run there (skipped: an API that release lacks).

Each undeclared failure (a violated clause no declaration covers, or a property that raised)
gets a row too. From the observed / not-observed cells the matrix proposes each
declaration's ``torch_versions``: from the first version that showed it (no lower bound when
every earlier version was without evidence) to the first later version that did not (no
upper bound when none did); a declaration observed, then not, then observed again is marked
``gaps``. Declarations observed on no version are listed apart.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from swapspec.properties.vocabulary import _release

TARGETS = ("torch", "torch-stateless")
OBSERVED, NOT_OBSERVED, NO_EXAMPLE, NOT_APPLICABLE = (
    "observed", "not observed", "no example", "not applicable")


def load_reports(paths: list[str]) -> list[dict[str, Any]]:
    """The reports, oldest torch first."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    return sorted(reports, key=lambda r: _release(r["torch"]))


def _cells(report: dict, properties: list[str], targets: list[str]) -> list[dict]:
    return [report["table"][pid][t] for pid in properties for t in targets
            if t in report["table"].get(pid, {})]


def declaration_cell(report: dict, declaration: dict) -> dict[str, Any]:
    """One declaration on one version: its state and ``[applied, shown]`` example counts."""
    targets = [t for t in declaration["targets"] if t in TARGETS]
    ran = [c for c in _cells(report, declaration["properties"], targets) if c["status"] != "skipped"]
    if not ran:
        return {"state": NOT_APPLICABLE, "applied": 0, "shown": 0}
    counts = [c.get("declarations", {}).get(declaration["key"], [0, 0]) for c in ran]
    applied, shown = sum(n for n, _ in counts), sum(s for _, s in counts)
    state = OBSERVED if shown else NOT_OBSERVED if applied else NO_EXAMPLE
    return {"state": state, "applied": applied, "shown": shown}


def _failure_kind(reason: str) -> str:
    """A raised property's exception type, the part of its reason stable across versions."""
    match = re.match(r"\s*([\w.]+(?:Error|Exception|Exit|Interrupt|Warning))\b", reason)
    return match.group(1).rsplit(".", 1)[-1] if match else (reason[:60] or "failed")


def undeclared_rows(reports: list[dict]) -> list[dict[str, Any]]:
    """Every undeclared violation and every raised property, with its cell on each version."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for report in reports:
        for pid, row in report["table"].items():
            for target, cell in row.items():
                if target not in TARGETS:
                    continue
                found = {f"undeclared {clause}": n for clause, n in cell.get("undeclared", {}).items()}
                if cell["status"] in ("fail", "error") and not cell.get("undeclared"):
                    found[f"raised {_failure_kind(cell.get('reason', ''))}"] = 1
                for what, n in found.items():
                    entry = rows.setdefault((pid, what), {"property": pid, "what": what, "cells": {}})
                    cell_out = entry["cells"].setdefault(report["torch"], {"examples": 0, "targets": []})
                    cell_out["examples"] += n
                    cell_out["targets"].append(target)
                    message = cell.get("undeclared_messages", {}).get(what.removeprefix("undeclared "))
                    if message and not entry.get("message"):
                        entry["message"] = f"{report['torch']}, {target}: {message}"
    for entry in rows.values():
        for report in reports:
            if report["torch"] not in entry["cells"]:
                ran = any(c["status"] != "skipped" for c in _cells(report, [entry["property"]], list(TARGETS)))
                entry["cells"][report["torch"]] = {"state": NOT_OBSERVED if ran else NOT_APPLICABLE}
            else:
                entry["cells"][report["torch"]]["state"] = OBSERVED
    return sorted(rows.values(), key=lambda e: (e["property"], e["what"]))


def _bound(version: str) -> str:
    """``X.Y`` for an ``X.Y.0`` release, else ``X.Y.Z``: the bound a declaration names."""
    major, minor, patch = _release(version)
    return f"{major}.{minor}" if patch == 0 else f"{major}.{minor}.{patch}"


def propose_range(cells: list[tuple[str, str]]) -> dict[str, Any] | None:
    """The ``torch_versions`` the evidence ``[(version, state), ...]`` (oldest first) proposes.

    None when no version observed it; ``gaps`` when a version between two that observed it
    did not.
    """
    evidence = [(v, s == OBSERVED) for v, s in cells if s in (OBSERVED, NOT_OBSERVED)]
    seen = [i for i, (_, shown) in enumerate(evidence) if shown]
    if not seen:
        return None
    first, last = seen[0], seen[-1]
    lowest = None if not any(not s for _, s in evidence[:first]) else _bound(evidence[first][0])
    after = [v for v, s in evidence[last + 1:] if not s]
    below = _bound(after[0]) if after else None
    gaps = any(not s for _, s in evidence[first:last + 1])
    return {"torch_versions": [lowest, below], "gaps": gaps}


def build_matrix(reports: list[dict]) -> dict[str, Any]:
    """The matrix as data: versions, declaration rows with proposals, undeclared rows."""
    versions = [r["torch"] for r in reports]
    declared: dict[tuple[str, tuple[str, ...]], dict] = {}
    for report in reports:  # newest last, so its metadata wins
        for d in report.get("declared", []):
            if set(d["targets"]) & set(TARGETS):
                declared[(d["key"], tuple(d["properties"]))] = d
    rows = []
    for d in declared.values():
        cells = {r["torch"]: declaration_cell(r, d) for r in reports}
        proposal = propose_range([(v, cells[v]["state"]) for v in versions])
        rows.append({"key": d["key"], "properties": d["properties"], "clauses": d["clauses"],
                     "torch_versions": d["torch_versions"], "cells": cells, "proposal": proposal})
    rows.sort(key=lambda r: (r["properties"], r["key"]))
    return {"versions": versions, "declarations": rows, "undeclared": undeclared_rows(reports),
            "observed_on_no_version": [r["key"] for r in rows if r["proposal"] is None]}


def _range(bounds: list[str | None] | None) -> str:
    if bounds is None:
        return "none observed"
    low, below = bounds
    return f"{low or ''}..{below or ''}" if (low or below) else "all"


def _render_cell(cell: dict) -> str:
    state = cell["state"]
    if state in (OBSERVED, NOT_OBSERVED) and "applied" in cell:
        return f"{state} ({cell['shown']}/{cell['applied']})"
    if state == OBSERVED:
        return f"observed (x{cell['examples']}: {', '.join(cell['targets'])})"
    return state


def _properties(ids: list[str]) -> str:
    """Up to three property IDs, else the first and how many more."""
    return ", ".join(ids) if len(ids) <= 3 else f"{ids[0]} and {len(ids) - 1} more"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(matrix: dict[str, Any]) -> str:
    """The matrix as Markdown: declarations, proposals, undeclared failures."""
    versions = matrix["versions"]
    head = "| " + " | ".join(versions) + " |"
    sep = "|---" * len(versions) + "|"
    lines = ["Declarations (cells: examples that showed it / examples in its region):", "",
             "| properties | declaration | declared | proposed " + head,
             "|---|---|---|---" + sep]
    for r in matrix["declarations"]:
        proposal = r["proposal"]
        proposed = _range(proposal and proposal["torch_versions"])
        if proposal and proposal["gaps"]:
            proposed += " (gaps)"
        cells = " | ".join(_render_cell(r["cells"][v]) for v in versions)
        lines.append(f"| {_properties(r['properties'])} | `{_md(r['key'])}` | "
                     f"{_range(r['torch_versions'])} | {proposed} | {cells} |")
    lines += ["", "Undeclared failures (violations no declaration covers, properties that raised):", ""]
    if matrix["undeclared"]:
        lines += ["| property | what " + head, "|---|---" + sep]
        for u in matrix["undeclared"]:
            cells = " | ".join(_render_cell(u["cells"][v]) for v in versions)
            what = u["what"] + (f" (first: {u['message']})" if u.get("message") else "")
            lines.append(f"| {u['property']} | {_md(what)} | {cells} |")
    else:
        lines.append("none")
    lines += ["", "Declarations observed on no version: "
              + (", ".join(f"`{_md(k)}`" for k in matrix["observed_on_no_version"]) or "none")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swapspec.properties.harness.matrix",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="survey-mode reports, one per torch version")
    parser.add_argument("--markdown", help="write the Markdown matrix here (default: print it)")
    parser.add_argument("--json", help="write the matrix as JSON here")
    args = parser.parse_args(argv)
    matrix = build_matrix(load_reports(args.reports))
    text = render_markdown(matrix)
    if args.markdown:
        Path(args.markdown).write_text(text)
    else:
        print(text, end="")
    if args.json:
        Path(args.json).write_text(json.dumps(matrix, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
