"""docs/state-space.md stays true to the installed torch and to the suite.

- every public ``nn.Module`` method, and every public function of ``torch.nn.utils``,
  ``parametrize``, ``parametrizations``, ``prune`` and ``stateless``, has a row in an
  "Operations" table;
- every row has the fixed columns, a status from :data:`STATUSES`, and a reason where it is
  ``not drawn`` or ``excused``; a ``drawn`` row gives a reach figure or says in its note why not;
- every property ID on the page is in docs/catalogue.md;
- every reach figure meets its floor on a fresh fixed-seed recomputation
  (``tests/state_space_reach.py``, 200 draws);
- no ``not drawn`` row goes stale: a row naming a public method the strategies call
  (``strategies.method_calls``), or a state whose torch-level tag a sample meets
  (:data:`NOT_DRAWN_TAGS`), must say ``drawn``.

Each checker takes the page's text, so the unit tests at the end feed it broken pages.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch import nn

from tests.fresh_sample import sample_in_fresh_process

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "state-space.md"
CATALOGUE = ROOT / "docs" / "catalogue.md"
COLUMNS = ("operation or state", "status", "strategy", "reach", "properties", "note")
STATUSES = ("drawn", "not drawn", "excused")
EMPTY = {"", "—", "-"}
# Words allowed in the properties column besides IDs.
PROPERTY_WORDS = {"—", "every property"}
ID_TOKEN = re.compile(r"(?<![A-Z0-9-])(?:APPLY|FC|LOAD|SEQ|TOGETHER|XLA|CHECKPOINT|REGISTER|"
                      r"PARAMETRIZE|ACCESSOR)-[A-Z0-9-]*[A-Z0-9]\b")
N = 200


def _reach_module():
    spec = importlib.util.spec_from_file_location("state_space_reach", ROOT / "tests" / "state_space_reach.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


reach = _reach_module()


# ---- reading the page ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    section: str
    line: int
    cells: tuple[str, ...]

    def __getitem__(self, column: str) -> str:
        return self.cells[COLUMNS.index(column)]


def _split(line: str) -> list[str]:
    # cells are separated by pipes outside code spans
    cells, cell, code = [], "", False
    for ch in line.strip()[1:-1] if line.strip().endswith("|") else line.strip()[1:]:
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    cells.append(cell.strip())
    return cells


def parse(text: str) -> tuple[list[Row], list[str]]:
    """The table rows of every ``## `` section, and the problems met reading them (a table with
    other columns, a row with another number of cells)."""
    rows, problems, section, header = [], [], "", None
    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith("## "):
            section, header = line[3:].strip(), None
            continue
        if not line.startswith("|") or not section:
            header = None if not line.startswith("|") else header
            continue
        cells = _split(line)
        if header is None:
            header = tuple(cells)
            if header != COLUMNS:
                problems.append(f"line {number}: table columns {header} are not {COLUMNS}")
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        if len(cells) != len(COLUMNS):
            problems.append(f"line {number}: {len(cells)} cells, not {len(COLUMNS)}")
            continue
        rows.append(Row(section, number, tuple(cells)))
    return rows, problems


def operation_rows(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.section.startswith("Operations")]


# ---- what torch has -----------------------------------------------------------------------------

def module_methods() -> list[str]:
    """Every public method of ``nn.Module``, as ``Module.<name>``."""
    return [f"Module.{n}" for n in dir(nn.Module)
            if not n.startswith("_") and callable(getattr(nn.Module, n))]


def utils_functions() -> list[str]:
    """Every public function of ``torch.nn.utils`` (``nn.utils.<name>``) and of its submodules
    ``parametrize``, ``parametrizations``, ``stateless`` (their ``__all__``) and ``prune`` (no
    ``__all__``: the public callables it defines), as ``<submodule>.<name>``."""
    import torch.nn.utils as utils
    from torch.nn.utils import parametrizations, parametrize, prune, stateless

    names = [f"nn.utils.{n}" for n in utils.__all__ if not inspect.ismodule(getattr(utils, n))]
    for module in (parametrize, parametrizations, stateless):
        names += [f"{module.__name__.rsplit('.', 1)[1]}.{n}" for n in module.__all__]
    names += [f"prune.{n}" for n, obj in vars(prune).items()
              if not n.startswith("_") and callable(obj)
              and getattr(obj, "__module__", None) == prune.__name__]
    return names


def missing_operations(text: str, names: list[str]) -> list[str]:
    """The qualified names (``Module.to``, ``prune.remove``) no Operations row names."""
    rows, _ = parse(text)
    cells = [r["operation or state"] for r in operation_rows(rows)]
    return [name for name in names if not any(_names(c, name) for c in cells)]


def _names(cell: str, name: str) -> bool:
    """Whether ``cell`` names ``name`` as a whole (``Module.to`` is not in ``Module.to_empty``)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", cell) is not None


# ---- the checkers -------------------------------------------------------------------------------

def row_problems(text: str) -> list[str]:
    """Rows with an unknown status, a ``not drawn``/``excused`` row without a reason, a ``drawn``
    row with neither a figure nor a note, a reach cell that is neither ``—`` nor figures, and the
    problems of :func:`parse`."""
    rows, problems = parse(text)
    if not rows:
        problems.append("no table rows")
    for r in rows:
        where = f"line {r.line} ({r['operation or state'][:50]})"
        status, reach_cell, note = r["status"], r["reach"], r["note"]
        if status not in STATUSES:
            problems.append(f"{where}: status {status!r} is not one of {STATUSES}")
        if status in ("not drawn", "excused") and note in EMPTY:
            problems.append(f"{where}: {status} without a reason in the note")
        if reach_cell not in EMPTY:
            parts = [p.strip() for p in reach_cell.split(";")]
            bad = [p for p in parts if not reach.FIGURE.fullmatch(p)]
            if bad:
                problems.append(f"{where}: reach {bad} is not `sample/tag` share% (>= floor%)")
            if status != "drawn":
                problems.append(f"{where}: a reach figure on a {status} row")
        elif status == "drawn" and note in EMPTY:
            problems.append(f"{where}: drawn, with no reach figure and no note saying why")
    return problems


def known_ids() -> set[str]:
    return set(re.findall(r"^\| `([A-Z][A-Z0-9-]+)` \|", CATALOGUE.read_text(), re.M))


def unknown_ids(text: str, known: set[str]) -> list[str]:
    """Property IDs the page names (in the properties column, or anywhere as an ID-shaped token)
    that the catalogue does not have, and properties-column entries that are not IDs."""
    rows, _ = parse(text)
    bad = []
    for r in rows:
        for item in (i.strip() for i in r["properties"].split(",")):
            if item not in known and item not in PROPERTY_WORDS:
                bad.append(f"line {r.line}: {item!r}")
    bad += [f"token {t!r}" for t in sorted(set(ID_TOKEN.findall(text))) if t not in known]
    return bad


def called_methods() -> list[str]:
    """``Module.<method>`` for every public method ``strategies.method_calls`` draws a call of."""
    from swapspec.strategies import method_calls as mc

    calls = [form[0] for form in (*mc.CONVERSION_FORMS, *mc.RECURSE_FALSE_FORMS)]
    calls += [*mc.GRAD_CALLS, *mc.BAD_CALLS]
    return sorted({f"Module.{c.method}" for c in calls})


def stale_rows(text: str, drawn_names: list[str]) -> list[str]:
    """The ``not drawn`` rows whose first cell names one of ``drawn_names`` (qualified names
    the strategies are known to draw)."""
    rows, _ = parse(text)
    stale = []
    for r in rows:
        cell = r["operation or state"]
        named = [n for n in drawn_names if _names(cell, n)]
        if r["status"] == "not drawn" and named:
            stale.append(f"line {r.line} ({cell[:50]}): not drawn, but {', '.join(named)} is drawn")
    return stale


# torch-level tag of ``tests/state_space_reach.py`` -> the start of the row it would measure.
NOT_DRAWN_TAGS = {
    "hook: module backward pre": "module backward pre / backward hooks",
    "hook: module backward": "module backward pre / backward hooks",
    "hook: module forward with kwargs": "forward hook with kwargs",
    "hook: module forward always_called": "forward hook with kwargs",
    "tensor: view": "a view (`t._base is not None`) in a slot",
    "tensor: quantized": "a quantized tensor",
    "tensor: storage shared by two slot objects": "two slot objects sharing one storage",
    "tie: parameter and buffer": "one tensor as a parameter in one slot and a buffer",
}


def tag_rows_not_drawn(text: str, measured: dict[str, dict[str, float]],
                       tags: dict[str, str]) -> list[str]:
    """The rows of ``tags`` still ``not drawn`` (or missing) although a sample met their tag."""
    rows, _ = parse(text)
    problems = []
    for tag, start in tags.items():
        met = [f"{sample}/{tag} {100 * shares[tag]:.1f}%"
               for sample, shares in measured.items() if shares.get(tag, 0) > 0]
        row = next((r for r in rows if r["operation or state"].startswith(start)), None)
        if row is None:
            problems.append(f"no row starts with {start!r} (tag {tag!r})")
        elif met and row["status"] != "drawn":
            problems.append(f"line {row.line} ({start}): {row['status']}, but {', '.join(met)}")
    return problems


@functools.lru_cache(maxsize=1)
def _measured(samples: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """The shares the documented command measures, drawn in a fresh process
    (``tests/fresh_sample.py``), so they do not depend on what this session has loaded."""
    return sample_in_fresh_process("tests.state_space_reach:measure", N, list(samples))


# ---- the page -----------------------------------------------------------------------------------

def test_every_public_module_method_has_an_operations_row():
    assert missing_operations(DOC.read_text(), module_methods()) == []


def test_every_public_nn_utils_function_has_an_operations_row():
    assert missing_operations(DOC.read_text(), utils_functions()) == []


def test_every_row_has_a_status_and_a_reason():
    assert row_problems(DOC.read_text()) == []


def test_every_property_id_exists():
    known = known_ids()
    assert len(known) > 30
    assert unknown_ids(DOC.read_text(), known) == []


def test_every_reach_figure_meets_its_floor():
    figures = reach.doc_figures(DOC.read_text())
    assert len(figures) > 50
    assert reach.check_figures(figures, _measured(_figure_samples())) == []


def _figure_samples() -> tuple[str, ...]:
    figures = reach.doc_figures(DOC.read_text())
    return tuple(sorted({f.sample for f in figures if f.sample in reach.SAMPLES}))


def test_no_row_naming_a_drawn_method_says_not_drawn():
    names = called_methods()
    assert {"Module.to", "Module.type", "Module.zero_grad"} <= set(names)
    assert stale_rows(DOC.read_text(), names) == []


def test_no_row_whose_tag_a_sample_meets_says_not_drawn():
    measured = _measured(_figure_samples())
    assert {"tree", "life", "world"} <= set(measured)
    assert tag_rows_not_drawn(DOC.read_text(), measured, NOT_DRAWN_TAGS) == []


# ---- the checkers can fail ----------------------------------------------------------------------

HEADER = "| " + " | ".join(COLUMNS) + " |\n|---|---|---|---|---|---|\n"
PAGE = ("## Operations: a few\n\n" + HEADER
        + "| `Module.to(dtype)` | drawn | `conversions()` | `conversion/half()` 10.0% (>= 5%) | APPLY-VALUES | |\n"
        + "| `Module.to_empty(device=)` | not drawn | — | — | — | a reason |\n"
        + "| `prune.remove(module, name)` | excused | — | — | — | read-only |\n")


def test_missing_operations_reports_a_method_without_a_row():
    assert missing_operations(PAGE, ["Module.to", "Module.to_empty", "prune.remove"]) == []
    # `Module.to_empty` does not count as a row for `Module.to`, nor a States row for anything
    page = PAGE.replace("`Module.to(dtype)`", "`Module.type(t)`")
    page += "\n## States: slots\n\n" + HEADER + "| `Module.half()` | drawn | x | — | — | a note |\n"
    assert missing_operations(page, ["Module.to", "Module.to_empty", "Module.half"]) == [
        "Module.to", "Module.half"]


def test_the_torch_name_lists_are_complete():
    methods = module_methods()
    assert {"Module.to", "Module.load_state_dict", "Module.set_submodule", "Module.zero_grad"} <= set(methods)
    funcs = utils_functions()
    assert {"nn.utils.vector_to_parameters", "parametrize.register_parametrization",
            "stateless.functional_call", "prune.l1_unstructured", "prune.remove",
            "parametrizations.orthogonal"} <= set(funcs)
    assert "nn.utils.parametrize" not in funcs  # submodules are not functions


def test_row_problems_reports_bad_status_missing_reason_and_bad_reach():
    assert row_problems(PAGE) == []
    bad = PAGE.replace("| not drawn | — | — | — | a reason |", "| not drawn | — | — | — | — |")
    assert any("without a reason" in p for p in row_problems(bad))
    bad = PAGE.replace("| excused |", "| maybe |")
    assert any("status 'maybe'" in p for p in row_problems(bad))
    bad = PAGE.replace("10.0% (>= 5%)", "10.0%")
    assert any("is not `sample/tag`" in p for p in row_problems(bad))
    bad = PAGE.replace("`conversion/half()` 10.0% (>= 5%)", "—")
    assert any("no reach figure and no note" in p for p in row_problems(bad))
    bad = PAGE.replace("| operation or state |", "| operation |")
    assert any("table columns" in p for p in row_problems(bad))
    bad = PAGE.replace("| read-only |", "| read-only | extra |")
    assert any("cells, not 6" in p for p in row_problems(bad))


def test_unknown_ids_reports_an_id_not_in_the_catalogue():
    known = {"APPLY-VALUES"}
    assert unknown_ids(PAGE, known) == []
    assert unknown_ids(PAGE.replace("| APPLY-VALUES |", "| APPLY-VALUES, APPLY-NOPE |"), known) == [
        "line 5: 'APPLY-NOPE'", "token 'APPLY-NOPE'"]
    assert unknown_ids(PAGE + "\nsee LOAD-GONE\n", known) == ["token 'LOAD-GONE'"]


def test_check_figures_reports_a_figure_under_its_floor():
    figures = reach.doc_figures(PAGE)
    assert figures == [reach.Figure("conversion", "half()", 10.0, 5.0)]
    assert reach.check_figures(figures, {"conversion": {"half()": 0.06}}) == []
    assert reach.check_figures(figures, {"conversion": {"half()": 0.04}}) != []
    assert reach.check_figures(figures, {"conversion": {}}) != []  # a tag no draw has
    assert reach.check_figures([reach.Figure("nosuch", "x", 1, 1)], {}) != []


@pytest.mark.parametrize("name", ["Module.to", "nn.utils.vector_to_parameters"])
def test_the_real_page_fails_without_a_row(name):
    text = DOC.read_text()
    kept = "\n".join(line for line in text.split("\n")
                     if not re.search(rf"`{re.escape(name)}(?![A-Za-z0-9_])", line))
    assert missing_operations(kept, [name]) == [name]


def test_stale_rows_reports_a_not_drawn_row_of_a_drawn_method():
    assert stale_rows(PAGE, ["Module.to"]) == []  # `Module.to_empty` is another method
    assert stale_rows(PAGE, ["Module.to_empty"]) == [
        "line 6 (`Module.to_empty(device=)`): not drawn, but Module.to_empty is drawn"]


def test_tag_rows_not_drawn_reports_a_met_tag_of_a_not_drawn_row():
    tags = {"tensor: view": "`Module.to_empty", "tensor: meta": "`Module.to(dtype)`"}
    unmet = {"tree": {"tensor: view": 0.0, "tensor: meta": 0.5}}
    assert tag_rows_not_drawn(PAGE, unmet, tags) == []
    met = {"tree": {"tensor: view": 0.02}}
    assert tag_rows_not_drawn(PAGE, met, tags) == [
        "line 6 (`Module.to_empty): not drawn, but tree/tensor: view 2.0%"]
    assert tag_rows_not_drawn(PAGE, unmet, {"tensor: view": "`Module.nothing"}) == [
        "no row starts with '`Module.nothing' (tag 'tensor: view')"]
