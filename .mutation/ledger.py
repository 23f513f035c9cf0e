"""The mutation ledger: which functions of reference/ a mutation run must cover, and the score of all.

Rules:
- mutmut mutates each top-level function and each method of a top-level class on its own, and
  names its mutants ``swapspec.reference.<module>.x_<function>__mutmut_<n>`` or
  ``...xǁ<Class>ǁ<method>__mutmut_<n>``. A nested function belongs to the function around it.
- A function's fingerprint is a hash of its AST (``ast.dump``, no line numbers). The ledger
  (``.mutation/ledger.json``) holds, for each function, the fingerprint it had when a mutation run
  last measured it and that run's counts: mutants, killed (timeouts included), survived,
  equivalent.
- A function whose fingerprint differs from its ledger entry, or that has no entry, is *stale*:
  only stale functions need a run, since a mutant of an unchanged function meets the same code.
  (A test removed can also let a mutant survive: ``.mutation/run`` with no argument remeasures all.)
- The score of reference/ is killed over non-equivalent mutants, summed over the ledger with each
  stale function's entry replaced by the fresh results.

Commands (from the checkout's root):
  python .mutation/ledger.py stale [changed|unmeasured]
                                             one mutmut glob per stale function (empty: none):
                                             changed ones first, then unmeasured ones
  python .mutation/ledger.py record RESULTS  merge a run's ``mutmut results --all true`` output into
                                             the ledger for the functions it covers
  python .mutation/ledger.py score [RESULTS] [--partial]
                                             the score of reference/ (fresh results override the
                                             ledger); exit 1 below MUTATION_MIN_SCORE (default 95)
                                             or, unless --partial (a run with a time budget), when
                                             a function is stale and not in RESULTS
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / ".mutation" / "ledger.json"
EQUIVALENT = ROOT / ".mutation" / "equivalent.md"
PACKAGE = "swapspec.reference"
SEPARATOR = "ǁ"  # mutmut's CLASS_NAME_SEPARATOR
KILLED = ("killed", "timeout", "segfault")  # the tests stopped the mutant (as .mutation/summary.py)
SURVIVED = ("survived",)  # the tests that cover the function ran and none failed
UNTESTED = ("no tests",)  # no test covers the function on this machine (``Methods.cuda`` without
# CUDA): a coverage gap, counted apart and left out of the score, like docs/coverage.md's exclusions


def mutmut_names(source: str) -> Iterator[tuple[str, ast.AST]]:
    """``(mangled name, node)`` for each function mutmut mutates on its own in one module."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"x_{node.name}", node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"x{SEPARATOR}{node.name}{SEPARATOR}{item.name}", item


def fingerprints() -> dict[str, str]:
    """``{'<module>.<mangled name>': AST hash}`` for every mutated function of reference/."""
    out = {}
    for path in sorted((ROOT / "reference").glob("*.py")):
        for name, node in mutmut_names(path.read_text()):
            digest = hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]
            out[f"{PACKAGE}.{path.stem}.{name}"] = digest
    return out


def load_ledger() -> dict[str, dict]:
    return json.loads(LEDGER.read_text()) if LEDGER.exists() else {}


def stale_functions(ledger: dict[str, dict], current: dict[str, str]) -> list[str]:
    """Functions whose code differs from what the ledger measured (first), then those it never
    measured: a run with a time budget covers the changed code before the backlog."""
    changed = [name for name, digest in current.items()
               if name in ledger and ledger[name].get("fingerprint") != digest]
    return changed + [name for name in current if name not in ledger]


def parse_results(text: str) -> dict[str, str]:
    """``{mutant: status}`` from ``mutmut results --all true``."""
    found = re.findall(r"^\s*([\w.ǁ]+__mutmut_\d+):\s*(.+?)\s*$", text, flags=re.M)
    return dict(found)


def equivalent_names() -> set[str]:
    text = EQUIVALENT.read_text() if EQUIVALENT.exists() else ""
    return set(re.findall(r"`([\w.ǁ]+__mutmut_\d+)`", text))


def counts_by_function(results: dict[str, str], equivalent: set[str]) -> dict[str, dict]:
    """Per function: mutants, killed (``KILLED``), survived (``SURVIVED``), untested
    (``UNTESTED``), equivalent (a survivor listed in equivalent.md), other (not checked,
    skipped...: the function is not measured)."""
    out: dict[str, dict] = {}
    for mutant, status in results.items():
        entry = out.setdefault(mutant.rsplit("__mutmut_", 1)[0],
                               {"mutants": 0, "killed": 0, "survived": 0, "equivalent": 0,
                                "other": 0})
        entry["mutants"] += 1
        if status == "survived" and mutant in equivalent:
            entry["equivalent"] += 1
        elif status in KILLED:
            entry["killed"] += 1
        elif status in SURVIVED:
            entry["survived"] += 1
        elif status in UNTESTED:
            entry["untested"] = entry.get("untested", 0) + 1
        else:
            entry["other"] += 1
    return out


def record(results_text: str) -> dict[str, dict]:
    """The ledger with every fully measured function of ``results_text`` at its current code,
    and every function mutmut made no mutant of in a module the results cover (mutmut lists
    every mutant of each file it mutated; it does not mutate a decorated function, or one with
    nothing to change) with zero counts."""
    ledger, current = load_ledger(), fingerprints()
    measured = counts_by_function(parse_results(results_text), equivalent_names())
    for name, counts in measured.items():
        if name in current and counts["other"] == 0:
            ledger[name] = {"fingerprint": current[name], **counts}
    covered = {_module_of(name) for name in measured}
    for name in current:
        if name not in measured and _module_of(name) in covered:
            ledger[name] = {"fingerprint": current[name], "mutants": 0, "killed": 0,
                            "survived": 0, "equivalent": 0, "other": 0}
    return {name: ledger[name] for name in sorted(ledger) if name in current}


def _module_of(function: str) -> str:
    """``swapspec.reference.<module>`` of a mangled function name."""
    return function.rsplit(".", 1)[0]


def score(results_text: str = "") -> tuple[float | None, list[str]]:
    """The score of reference/ with fresh results over the ledger, and the functions left stale."""
    ledger, current = load_ledger(), fingerprints()
    fresh = counts_by_function(parse_results(results_text), equivalent_names())
    killed = scored = 0
    unmeasured = []
    for name, digest in current.items():
        entry = fresh.get(name)
        if entry is None or entry["other"]:
            entry = ledger.get(name) if ledger.get(name, {}).get("fingerprint") == digest else None
        if entry is None:
            unmeasured.append(name)
            continue
        killed += entry["killed"]
        scored += entry["mutants"] - entry["equivalent"] - entry.get("untested", 0)
    return (100 * killed / scored if scored else None), unmeasured


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "stale"
    if command == "stale":
        ledger = load_ledger()
        kind = argv[1] if len(argv) > 1 else "all"
        for name in stale_functions(ledger, fingerprints()):
            if kind == "all" or (kind == "changed") == (name in ledger):
                print(f"{name}__mutmut_*")
        return 0
    partial = "--partial" in argv
    argv = [a for a in argv if a != "--partial"]
    results = Path(argv[1]).read_text() if len(argv) > 1 else ""
    if command == "record":
        LEDGER.write_text(json.dumps(record(results), indent=1, ensure_ascii=False) + "\n")
        print(f"ledger: {LEDGER.relative_to(ROOT)} updated")
        return 0
    if command == "score":
        percent, unmeasured = score(results)
        minimum = float(os.environ.get("MUTATION_MIN_SCORE", "95"))
        for name in unmeasured:
            print(f"UNMEASURED {name}")
        shown = "none" if percent is None else f"{percent:.1f}%"
        print(f"mutation score of reference/ (ledger + this run): {shown} over the measured "
              f"functions, {len(unmeasured)} unmeasured; required {minimum:g}%")
        scored = percent is not None and percent >= minimum
        return 0 if scored and (partial or not unmeasured) else 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
