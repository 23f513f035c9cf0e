"""Unit tests of the oracle matrix (``properties/harness/matrix.py``) on small hand-made reports."""

from __future__ import annotations

import json

import pytest

from swapspec.properties.harness.matrix import (
    NO_EXAMPLE,
    NOT_APPLICABLE,
    NOT_OBSERVED,
    OBSERVED,
    build_matrix,
    main,
    propose_range,
)

KEY = "tie-split: planted"
DECLARED = [{"key": KEY, "properties": ["APPLY-TIES"], "clauses": ["tie-split"],
             "torch_versions": [None, None], "always": True, "targets": ["torch", "torch-stateless"]}]


def _report(version: str, applied: int, shown: int, *, status: str = "deviation",
            undeclared: dict | None = None, reason: str = "") -> dict:
    cell = {"status": status, "reason": reason, "tests": 1, "deviations": {},
            "declarations": {KEY: [applied, shown]} if applied else {},
            "undeclared": undeclared or {},
            "undeclared_messages": {clause: f"{clause} on {version}" for clause in undeclared or {}}}
    return {"torch": version, "table": {"APPLY-TIES": {"torch": cell}}, "declared": DECLARED}


@pytest.mark.parametrize(("states", "proposed"), [
    ([OBSERVED, OBSERVED, OBSERVED], {"torch_versions": [None, None], "gaps": False}),
    ([NOT_OBSERVED, OBSERVED, OBSERVED], {"torch_versions": ["2.8", None], "gaps": False}),
    ([OBSERVED, OBSERVED, NOT_OBSERVED], {"torch_versions": [None, "2.14.1"], "gaps": False}),
    ([NOT_APPLICABLE, OBSERVED, NO_EXAMPLE], {"torch_versions": [None, None], "gaps": False}),
    ([OBSERVED, NOT_OBSERVED, OBSERVED], {"torch_versions": [None, None], "gaps": True}),
    ([NOT_OBSERVED, NO_EXAMPLE, NOT_APPLICABLE], None),
])
def test_proposed_range_follows_the_evidence(states, proposed):
    assert propose_range(list(zip(["2.3.0", "2.8.0", "2.14.1"], states, strict=True))) == proposed


def test_declaration_cells_and_proposal_from_reports_in_any_order():
    reports = [_report("2.8.0+cu128", 5, 5), _report("2.3.0+cu121", 4, 0),
               _report("2.14.1+cu128", 0, 0)]
    matrix = build_matrix(sorted(reports, key=lambda r: r["torch"] != "2.3.0+cu121"))
    assert matrix["versions"] == ["2.3.0+cu121", "2.8.0+cu128", "2.14.1+cu128"]
    [row] = matrix["declarations"]
    assert [row["cells"][v]["state"] for v in matrix["versions"]] == [NOT_OBSERVED, OBSERVED, NO_EXAMPLE]
    assert row["proposal"] == {"torch_versions": ["2.8", None], "gaps": False}
    assert matrix["observed_on_no_version"] == []


def test_a_skipped_property_is_not_applicable_and_a_declaration_never_seen_is_listed():
    matrix = build_matrix([_report("2.3.0", 0, 0, status="skipped"), _report("2.4.0", 3, 0)])
    [row] = matrix["declarations"]
    assert [c["state"] for c in row["cells"].values()] == [NOT_APPLICABLE, NOT_OBSERVED]
    assert matrix["observed_on_no_version"] == [KEY]


def test_undeclared_violations_and_raised_properties_get_rows():
    matrix = build_matrix([
        _report("2.3.0", 2, 2, status="fail", undeclared={"raised": 3}),
        _report("2.4.0", 2, 2, status="fail", reason="swapspec.x.ConformanceError: boom"),
        _report("2.5.0", 2, 2)])
    rows = {(u["property"], u["what"]): u["cells"] for u in matrix["undeclared"]}
    assert set(rows) == {("APPLY-TIES", "undeclared raised"), ("APPLY-TIES", "raised ConformanceError")}
    assert [c["state"] for c in rows[("APPLY-TIES", "undeclared raised")].values()] == [
        OBSERVED, NOT_OBSERVED, NOT_OBSERVED]
    assert rows[("APPLY-TIES", "undeclared raised")]["2.3.0"]["examples"] == 3
    [raised] = [u for u in matrix["undeclared"] if u["what"] == "undeclared raised"]
    assert raised["message"] == "2.3.0, torch: raised on 2.3.0"


def test_main_writes_markdown_and_json(tmp_path):
    paths = []
    for version, shown in (("2.3.0", 0), ("2.4.0", 2)):
        path = tmp_path / f"{version}.json"
        path.write_text(json.dumps(_report(version, 2, shown)))
        paths.append(str(path))
    main([*paths, "--markdown", str(tmp_path / "m.md"), "--json", str(tmp_path / "m.json")])
    text = (tmp_path / "m.md").read_text()
    assert f"| APPLY-TIES | `{KEY}` | all | 2.4.. | not observed (0/2) | observed (2/2) |" in text
    assert json.loads((tmp_path / "m.json").read_text())["versions"] == ["2.3.0", "2.4.0"]
