"""Summarize ``mutmut results --all true`` output against ``.mutation/equivalent.md``.

Rules: each results line is ``<mutant>: <status>``; a survivor listed (by mutant name, in
backticks) in ``equivalent.md`` counts as equivalent, not survived. The score is
killed / (total - equivalent); timeouts count as killed in the score but are shown apart.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path


def parse_results(text: str) -> dict[str, str]:
    """``{mutant name: status}`` from mutmut's results listing."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\w.]+__mutmut_\d+):\s*(.+?)\s*$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def equivalent_names(path: Path) -> set[str]:
    """Mutant names mentioned in backticks in the equivalent-mutants file."""
    if not path.exists():
        return set()
    return set(re.findall(r"`([\w.]+__mutmut_\d+)`", path.read_text()))


def summarize(results: dict[str, str], equivalent: set[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name, status in results.items():
        if status == "survived" and name in equivalent:
            status = "equivalent"
        counts[status] += 1
    return counts


def main(results_file: str, equivalent_file: str) -> None:
    results = parse_results(Path(results_file).read_text())
    counts = summarize(results, equivalent_names(Path(equivalent_file)))
    total = sum(counts.values())
    killed = counts["killed"] + counts["timeout"]
    scored = total - counts["equivalent"]
    print(f"mutants: {total}")
    for status in sorted(set(counts) | {"killed", "survived", "timeout", "equivalent"}):
        print(f"  {status}: {counts[status]}")
    if scored:
        print(f"mutation score: {killed}/{scored} = {100 * killed / scored:.1f}% "
              "(killed + timeout over non-equivalent)")
    for name, status in sorted(results.items()):
        if status == "survived" and name not in equivalent_names(Path(equivalent_file)):
            print(f"SURVIVED {name}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
