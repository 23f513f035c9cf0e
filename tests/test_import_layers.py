"""The project's modules form layers, and every import points down them.

Layer order, lowest first: ``reference`` (the spec), ``strategies`` (what is drawn),
``properties.vocabulary`` (property IDs, ``Deviation``), ``properties.models`` (what the spec
predicts for a drawn example), ``properties.declarations`` (each target family's deviations),
``properties.harness`` (targets, the checker, crash isolation, repros, the report, the pytest
plugin and the command-line tools), ``properties.rules`` (the property tests). A module may
import its own layer and the layers below it, never one above; and no two modules import each
other, directly or through others (no cycle). Every import counts, inside functions too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("reference", "strategies", "properties")
LAYERS = (
    "swapspec.reference",
    "swapspec.strategies",
    "swapspec.properties.vocabulary",
    "swapspec.properties.models",
    "swapspec.properties.declarations",
    "swapspec.properties.harness",
    "swapspec.properties.rules",
)


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's folders, by its installed name (``swapspec.<folder>...``)."""
    found: dict[str, Path] = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(["swapspec", *parts])] = path
    return found


def imported_modules(name: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The project modules ``name`` (at ``path``) imports anywhere in its body.

    ``from pkg import sub`` names the module ``pkg.sub`` when there is one, else ``pkg``; an
    import of something inside a module (``pkg.mod.attr``) names that module.
    """
    known = set(modules)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                      for a in node.names]
        else:
            continue
        for target in wanted:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = project_modules(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int | None:
    """The module's place in ``LAYERS`` (None for a module outside them: a package's own
    ``__init__`` such as ``swapspec.properties``, which no layer needs)."""
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points up the layer order, as ``importer -> imported``."""
    bad = []
    for importer, imported in sorted(graph.items()):
        low = layer_of(importer)
        for target in sorted(imported):
            high = layer_of(target)
            if low is None or high is None:
                if target == "swapspec.properties" or low is None:
                    continue
            elif high <= low:
                continue
            bad.append(f"{importer} -> {target}")
    return bad


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_every_import_points_down_the_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_every_module_has_a_layer() -> None:
    outside = [m for m in project_modules() if layer_of(m) is None]
    assert outside == ["swapspec.properties"]


def test_the_checks_see_a_planted_cycle_and_an_upward_import() -> None:
    graph = {
        "swapspec.properties.harness.a": {"swapspec.properties.harness.b"},
        "swapspec.properties.harness.b": {"swapspec.properties.harness.c"},
        "swapspec.properties.harness.c": {"swapspec.properties.harness.a",
                                          "swapspec.properties.vocabulary"},
        "swapspec.properties.vocabulary": set(),
        "swapspec.properties.declarations.torch": {"swapspec.properties.harness.a"},
        "swapspec.strategies.trees": {"swapspec.properties.models.examples"},
        "swapspec.properties.models.examples": set(),
    }
    assert cycles(graph) == [["swapspec.properties.harness.a", "swapspec.properties.harness.b",
                              "swapspec.properties.harness.c"]]
    assert upward_imports(graph) == [
        "swapspec.properties.declarations.torch -> swapspec.properties.harness.a",
        "swapspec.strategies.trees -> swapspec.properties.models.examples",
    ]


def test_the_graph_reads_function_level_and_package_imports(tmp_path: Path) -> None:
    (tmp_path / "strategies").mkdir()
    (tmp_path / "strategies" / "__init__.py").write_text("from swapspec.strategies import trees\n")
    (tmp_path / "strategies" / "trees.py").write_text(
        "def f():\n    from swapspec.strategies.leaves import build\n")
    (tmp_path / "strategies" / "leaves.py").write_text("from . import trees\n")
    graph = import_graph(tmp_path)
    assert graph["swapspec.strategies.trees"] == {"swapspec.strategies.leaves"}
    assert graph["swapspec.strategies.leaves"] == {"swapspec.strategies.trees"}
    assert cycles(graph) == [["swapspec.strategies.leaves", "swapspec.strategies.trees"]]
