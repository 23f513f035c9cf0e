"""Summarize ``mutmut results --all true`` output against ``.mutation/equivalent.md``.

Rules: each results line is ``<mutant>: <status>``; a survivor listed (by mutant name, in
backticks) in ``equivalent.md`` counts as equivalent, not survived. The score is
killed / (total - equivalent); timeouts count as killed in the score but are shown apart. The exit
status is 1 when the score is below the minimum (third argument, default 95) or nothing ran.
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


def score(counts: Counter[str]) -> float | None:
    """Percent of non-equivalent mutants killed (timeouts count as killed); None if none ran."""
    scored = sum(counts.values()) - counts["equivalent"]
    return 100 * (counts["killed"] + counts["timeout"]) / scored if scored else None


def main(results_file: str, equivalent_file: str, min_score: float) -> int:
    """Print the summary; exit status 1 when no mutant ran or the score is below ``min_score``."""
    results = parse_results(Path(results_file).read_text())
    equivalent = equivalent_names(Path(equivalent_file))
    counts = summarize(results, equivalent)
    print(f"mutants: {sum(counts.values())}")
    for status in sorted(set(counts) | {"killed", "survived", "timeout", "equivalent"}):
        print(f"  {status}: {counts[status]}")
    percent = score(counts)
    if percent is not None:
        print(f"mutation score: {percent:.1f}% (killed + timeout over non-equivalent; "
              f"required: {min_score:g}%)")
    for name, status in sorted(results.items()):
        if status == "survived" and name not in equivalent:
            print(f"SURVIVED {name}")
    return 0 if percent is not None and percent >= min_score else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 95.0))
