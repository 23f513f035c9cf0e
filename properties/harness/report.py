"""The conformance report: results merged into a property x target table, rendered as text,
with the filter rates, call times and declared deviations the JSON report holds beside it."""

from __future__ import annotations

import re
import textwrap
from collections import Counter, defaultdict

from swapspec.properties.harness.targets import Target


def conformance_table(results: list[dict]) -> dict[str, dict[str, dict]]:
    """``{property: {target: cell}}``; a cell merges every test of that pair.

    The worst status wins (pass < skipped < deviation < error < fail) and brings its own
    reason (``error``: a harness error, the suite's own code raised, no verdict on the target);
    ``tests`` counts distinct test ids, however many reports (setup, call, teardown) each sent;
    ``failures`` lists every failure of the pair (property, clause, message, repro).
    """
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    rank = {"pass": 0, "skipped": 1, "deviation": 2, "error": 3, "fail": 4}
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in results:
        cell = table[r["property"]].setdefault(
            r["target"], {"status": "pass", "deviations": {}, "reason": "", "tests": 0,
                          "failures": []})
        ids = seen[(r["property"], r["target"])]
        ids.add(r.get("nodeid", str(len(ids))))
        cell["tests"] = len(ids)
        if rank[r["status"]] > rank[cell["status"]]:
            cell["status"] = r["status"]
            cell["reason"] = r["reason"]
        for clause, n in r["deviations"].items():
            cell["deviations"][clause] = cell["deviations"].get(clause, 0) + n
        cell["failures"] += r.get("failures", [])
        _merge_counts(cell, r)
    return {pid: dict(sorted(row.items())) for pid, row in sorted(table.items())}


def _merge_counts(cell: dict, result: dict) -> None:
    """Add a result's declaration counts ``[applied, shown]`` and undeclared clause counts."""
    declarations = cell.setdefault("declarations", {})
    for key, (applied, shown) in result.get("declarations", {}).items():
        total = declarations.setdefault(key, [0, 0])
        total[0] += applied
        total[1] += shown
    not_run = cell.setdefault("not_run", {})
    for key, n in result.get("not_run", {}).items():
        not_run[key] = not_run.get(key, 0) + n
    undeclared = cell.setdefault("undeclared", {})
    for clause, n in result.get("undeclared", {}).items():
        undeclared[clause] = undeclared.get(clause, 0) + n
    messages = cell.setdefault("undeclared_messages", {})
    for clause, message in result.get("undeclared_messages", {}).items():
        messages.setdefault(clause, message)


TABLE_WIDTH = 100


STATUS_WORDS = {"pass": "pass", "fail": "FAIL", "deviation": "dev", "skipped": "skip",
                "error": "ERROR"}


LONG_NAME = 20  # longer target names are shown as T1, T2... with a legend under the table


_SKIP_PREFIX = re.compile(r"^(?P<target>.+) declares a skip for \S+: (?P<reason>.*)$", re.S)


def cell_note(cell: dict) -> str:
    """The long text of a cell, shown once as a numbered note under the table: the declared
    deviations seen and their counts with the IDs of the declarations that matched, and the
    examples a declared crash kept from running; the skip reason; or the broken rules."""
    if cell["status"] == "deviation":
        return "; ".join(part for part in (
            "deviations seen: " + ", ".join(f"{c} x{n}" for c, n in sorted(cell["deviations"].items())),
            _counted("matched", _matched(cell)),
            _counted("not run (declared crash)", cell.get("not_run", {}))) if part)
    if cell["status"] == "skipped":
        match = _SKIP_PREFIX.match(cell["reason"])
        return (f"{match['target']} declares a skip: {match['reason']}" if match
                else f"skipped: {cell['reason']}")
    if cell["status"] == "error":
        errors = dict.fromkeys(f["message"] for f in cell.get("failures", []) if not f["clause"])
        return "no verdict: " + "; ".join(_shortened(e, 300) for e in errors)
    if cell["status"] == "fail":
        rules = dict.fromkeys(f"[{f['clause']}] {f['message']}" if f["clause"] else f["message"]
                              for f in cell.get("failures", []))
        return ("broken: " + "; ".join(_shortened(r) for r in rules)) if rules else ""
    return ""


def _matched(cell: dict) -> dict[str, int]:
    """The declarations (by key: the ID) that showed on some example of the cell, and on how
    many, declared crashes left out (they are counted as not run)."""
    not_run = cell.get("not_run", {})
    return {key: shown for key, (_, shown) in cell.get("declarations", {}).items()
            if shown and key not in not_run}


def _counted(title: str, counts: dict[str, int]) -> str:
    return f"{title}: " + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) if counts else ""


def _shortened(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def render_cell(cell: dict, note: int | None = None) -> str:
    """One table cell: ``pass``, ``FAIL``, ``dev``, ``skip`` or ``ERROR``, and its note's number."""
    word = STATUS_WORDS[cell["status"]]
    return f"{word} [{note}]" if note is not None else word


def render_table(table: dict[str, dict[str, dict]], width: int = TABLE_WIDTH) -> list[str]:
    """The table in lines of at most ``width`` characters: as many target columns side by side
    as fit (more in further blocks), each cell's long text as a numbered note under it (the
    same text once), and a legend for the status words and abbreviated target names."""
    targets = sorted({t for row in table.values() for t in row})
    notes: dict[str, int] = {}
    cells: dict[tuple[str, str], str] = {}
    for pid, row in table.items():
        for target in targets:
            cell = row.get(target)
            text = cell_note(cell) if cell else ""
            number = notes.setdefault(text, len(notes) + 1) if text else None
            cells[(pid, target)] = render_cell(cell, number) if cell else "-"
    headers = {t: t if len(t) <= LONG_NAME else f"T{i}" for i, t in enumerate(targets, 1)}
    collapsed = _skipped_everywhere(table, targets, headers, cells)
    shown = {pid: row for pid, row in table.items() if not any(pid in p for p in collapsed.values())}
    lines: list[str] = []
    for block in _column_blocks(shown, targets, headers, cells, width) if shown else []:
        rows = [["property", *(headers[t] for t in block)],
                *([pid, *(cells[(pid, t)] for t in block)] for pid in shown)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        fmt = " | ".join(f"{{:<{w}}}" for w in widths)
        lines += [fmt.format(*rows[0]).rstrip(), "-+-".join("-" * w for w in widths),
                  *(fmt.format(*r).rstrip() for r in rows[1:]), ""]
    for word, pids in collapsed.items():
        lines += textwrap.wrap(f"{word} ({len(pids)}): {', '.join(pids)}", width,
                               subsequent_indent="    ", break_on_hyphens=False)
    if collapsed:
        lines.append("")
    lines += textwrap.wrap("pass: follows the spec; FAIL: breaks it; dev: passes with declared "
                           "deviations; skip: declared not to apply; ERROR: swapspec's own code raised (a "
                           "harness error: no verdict on the target); -: not run", width)
    lines += [f"{h} = {t}" for t, h in headers.items() if h != t]
    for text, number in notes.items():
        lines += textwrap.wrap(text, width, initial_indent=f"[{number}] ", break_on_hyphens=False,
                               subsequent_indent=" " * (len(str(number)) + 3))
    return lines


def _skipped_everywhere(table, targets, headers, cells) -> dict[str, list[str]]:
    """The properties skipped on every target of the table, grouped by what their cells show
    (``skip [3]``, or ``skip [3] | skip [4]`` across targets): one line each under the table
    instead of one row per property. None when no row would be left."""
    groups: dict[str, list[str]] = {}
    for pid, row in table.items():
        if len(row) == len(targets) and all(c["status"] == "skipped" for c in row.values()):
            word = " | ".join(f"{cells[(pid, t)]}" + (f" on {headers[t]}" if len(targets) > 1 else "")
                              for t in targets if t in row)
            groups.setdefault(word, []).append(pid)
    if sum(map(len, groups.values())) == len(table):
        return {}
    return groups


def _column_blocks(table, targets, headers, cells, width) -> list[list[str]]:
    """Targets in groups whose table rows fit ``width`` (at least one target per group)."""
    first = max([len("property"), *map(len, table)])
    blocks: list[list[str]] = [[]]
    used = first
    for t in targets:
        column = max([len(headers[t]), *(len(cells[(pid, t)]) for pid in table)]) + 3
        if blocks[-1] and used + column > width:
            blocks.append([])
            used = first
        blocks[-1].append(t)
        used += column
    return blocks


GAVE_UP = "gave up because: "


REASON_LENGTH = 160


def invalid_reason(case: dict) -> str:
    """Why Hypothesis rejected one test case, from its ``gave up because:`` event, shortened:
    an unsatisfied ``filter`` is named by its predicate (``...filter(predicate)``, not the
    whole strategy's repr), and any reason is cut to ``REASON_LENGTH`` characters."""
    events = [e for e in case.get("events", []) if isinstance(e, str) and e.startswith(GAVE_UP)]
    if not events:
        return "unknown"
    reason = events[0][len(GAVE_UP):]
    unsatisfied = re.match(r"(.*unable to satisfy ).*(\.filter\(.*\))$", reason, re.DOTALL)
    if unsatisfied:
        reason = unsatisfied[1] + "..." + unsatisfied[2]
    return reason if len(reason) <= REASON_LENGTH else reason[:REASON_LENGTH - 3] + "..."


def filter_rates(results: list[dict]) -> dict[str, dict[str, dict]]:
    """``{property: {target: {"cases": n, "invalid": k, "reasons": {reason: count}}}}``: the
    generate phase's test cases of every test of that pair, summed, how many of them were
    invalid, and why (``invalid_reason``)."""
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in results:
        if "cases" not in r:
            continue
        cell = table[r["property"]].setdefault(r["target"],
                                               {"cases": 0, "invalid": 0, "reasons": {}})
        cell["cases"] += r["cases"]["cases"]
        cell["invalid"] += r["cases"]["invalid"]
        for reason, count in r["cases"].get("reasons", {}).items():
            cell["reasons"][reason] = cell["reasons"].get(reason, 0) + count
    return {pid: dict(sorted(row.items())) for pid, row in sorted(table.items())}


def render_reasons(rates: dict[str, dict[str, dict]]) -> list[str]:
    """One line per property x target with invalid cases: each reason and its count, most
    common first."""
    lines = []
    for pid, row in rates.items():
        for target, cell in row.items():
            reasons = sorted(cell.get("reasons", {}).items(), key=lambda kv: (-kv[1], kv[0]))
            lines += [f"{pid} [{target}] {count}x: {reason}" for reason, count in reasons]
    return lines


def render_rate(cell: dict) -> str:
    """``12.5% (5/40)``: the invalid share of the generate phase's test cases."""
    share = 100 * cell["invalid"] / cell["cases"] if cell["cases"] else 0.0
    return f"{share:.1f}% ({cell['invalid']}/{cell['cases']})"


def render_rates(rates: dict[str, dict[str, dict]]) -> list[str]:
    """The filter-rate table as Markdown rows, property x target."""
    targets = sorted({t for row in rates.values() for t in row})
    lines = ["| property | " + " | ".join(targets) + " |",
             "|---|" + "---:|" * len(targets)]
    lines += [f"| `{pid}` | " + " | ".join(render_rate(row[t]) if t in row else "-"
                                           for t in targets) + " |"
              for pid, row in rates.items()]
    return lines


def call_times(results: list[dict]) -> dict[str, dict[str, float]]:
    """``{property: {target: seconds}}``: the call phase's wall time of every test of that pair,
    summed (setup and teardown left out, as in pytest's ``--durations``)."""
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for r in results:
        if "seconds" in r:
            row = table[r["property"]]
            row[r["target"]] = row.get(r["target"], 0.0) + r["seconds"]
    return {pid: dict(sorted(row.items())) for pid, row in sorted(table.items())}


def render_times(times: dict[str, dict[str, float]]) -> list[str]:
    """The per-property time table as Markdown rows, property x target, in seconds."""
    targets = sorted({t for row in times.values() for t in row})
    lines = ["| property | " + " | ".join(targets) + " |",
             "|---|" + "---:|" * len(targets)]
    lines += [f"| `{pid}` | " + " | ".join(f"{row[t]:.1f}" if t in row else "-" for t in targets)
              + " |" for pid, row in times.items()]
    return lines


def declared_deviations(targets: list[Target]) -> list[dict]:
    """Every deviation the targets declare: key, properties, clauses, ``torch_versions``, targets."""
    found: dict[tuple, dict] = {}
    for target in targets:
        for d in target.deviations:
            entry = found.setdefault((d.key, d.property_ids), {
                "key": d.key, "properties": list(d.property_ids), "clauses": list(d.clauses),
                "torch_versions": list(d.torch_versions), "always": d.always, "targets": []})
            if target.name not in entry["targets"]:
                entry["targets"].append(target.name)
    return list(found.values())


HOST_MODULE_EVENT = "tree: host: "  # strategies.tree_features: a drawn tree's host leaf
HOST_CONVERSION_EVENT = "host conversion: "  # strategies.conversions: a drawn host conversion


def host_case_reach(cases: list[dict]) -> dict:
    """Of the generate phase's valid test cases (Hypothesis statistics' ``test-cases``), how many
    drew a host module and how many a host conversion (their events), and each host name's
    count: ``{"cases": n, "modules": k, "conversions": j, "names": {event: count}}``."""
    valid = [c for c in cases if c.get("status") not in ("overrun", "invalid")]
    names: Counter[str] = Counter()
    modules = conversions = 0
    for case in valid:
        events = [e for e in case.get("events", []) if isinstance(e, str)]
        ours = [e for e in events if e.startswith((HOST_MODULE_EVENT, HOST_CONVERSION_EVENT))]
        names.update(ours)
        modules += any(e.startswith(HOST_MODULE_EVENT) for e in ours)
        conversions += any(e.startswith(HOST_CONVERSION_EVENT) for e in ours)
    return {"cases": len(valid), "modules": modules, "conversions": conversions,
            "names": dict(sorted(names.items()))}


def host_reach(results: list[dict]) -> dict[str, dict[str, dict]]:
    """``{property: {target: cell}}``: :func:`host_case_reach`'s counts of every test of that
    pair, summed, for the targets that have host material (a result with ``host_reach``)."""
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in results:
        reach = r.get("host_reach")
        if reach is None:
            continue
        cell = table[r["property"]].setdefault(
            r["target"], {"cases": 0, "modules": 0, "conversions": 0, "names": {}})
        for key in ("cases", "modules", "conversions"):
            cell[key] += reach[key]
        for name, count in reach["names"].items():
            cell["names"][name] = cell["names"].get(name, 0) + count
    return {pid: dict(sorted(row.items())) for pid, row in sorted(table.items())}


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def render_host_reach(reach: dict[str, dict[str, dict]]) -> list[str]:
    """The host reach table as Markdown rows: per property x target, the share of valid
    examples that drew a host module / a host conversion (``modules / conversions of n``)."""
    targets = sorted({t for row in reach.values() for t in row})
    lines = ["| property | " + " | ".join(targets) + " |", "|---|" + "---:|" * len(targets)]
    for pid, row in reach.items():
        cells = [f"{_share(c['modules'], c['cases'])} / {_share(c['conversions'], c['cases'])}"
                 f" of {c['cases']}" if (c := row.get(t)) else "-" for t in targets]
        lines.append(f"| `{pid}` | " + " | ".join(cells) + " |")
    return lines
