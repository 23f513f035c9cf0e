"""Ordered pairs of sequence rules: which ones a run's sequences contain.

A sequence property (``properties/rules/sequence_machine.py``) records, at the end of every
sequence, each ordered pair of its rules ``(a, b)``: rule ``a`` at some step and rule ``b`` at a
later step of the same sequence, and separately the pairs whose later step raised, with the
rules the target offers (its ``universe``). The plugin takes what a test added (``taken``) into
the report, where ``coverage`` merges them per target over every sequence property: the floor
is every ordered pair of the universe at least once. The console line says whether a target
meets it; the floor does not fail a run (docs/sequences.md, "Ordered pairs", gives the figures).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

# (target, "a>b") -> sequences holding the pair; RAISED: the same where b raised
PAIRS: Counter[tuple[str, str]] = Counter()
RAISED: Counter[tuple[str, str]] = Counter()
UNIVERSE: dict[str, tuple[str, ...]] = {}
SEQUENCES: Counter[str] = Counter()
SHOWN_MISSING = 12  # missing pairs printed per target in the console


def record(target: str, universe: Iterable[str], trail: list[tuple[str, bool]]) -> None:
    """One sequence's steps ``(rule, raised)`` in order, on ``target``."""
    UNIVERSE[target] = tuple(universe)
    SEQUENCES[target] += 1
    pairs, raised = set(), set()
    for i, (a, _) in enumerate(trail):
        for b, error in trail[i + 1:]:
            pairs.add(f"{a}>{b}")
            if error:
                raised.add(f"{a}>{b}")
    PAIRS.update((target, p) for p in pairs)
    RAISED.update((target, p) for p in raised)


def snapshot() -> tuple[Counter, Counter, Counter]:
    return Counter(PAIRS), Counter(RAISED), Counter(SEQUENCES)


def taken(before: tuple[Counter, Counter, Counter]) -> dict | None:
    """What was recorded since ``before`` (one test's sequences), or None: no sequence ran."""
    pairs, raised, sequences = (Counter(PAIRS) - before[0], Counter(RAISED) - before[1],
                                Counter(SEQUENCES) - before[2])
    if not sequences:
        return None
    target = next(iter(sequences))
    return {"universe": list(UNIVERSE[target]), "sequences": sequences[target],
            "pairs": {p: n for (_, p), n in pairs.items()},
            "raised": {p: n for (_, p), n in raised.items()}}


def coverage(results: list[dict]) -> dict[str, dict]:
    """``{target: {"universe", "sequences", "pairs", "raised", "covered", "total", "missing",
    "raised_covered", "raised_missing"}}`` over every test that recorded pairs."""
    merged: dict[str, dict] = {}
    for r in results:
        got = r.get("pairs")
        if not got:
            continue
        cell = merged.setdefault(r["target"], {"universe": got["universe"], "sequences": 0,
                                               "pairs": Counter(), "raised": Counter()})
        cell["sequences"] += got["sequences"]
        cell["pairs"].update(got["pairs"])
        cell["raised"].update(got["raised"])
    out = {}
    for target, cell in sorted(merged.items()):
        every = [f"{a}>{b}" for a in cell["universe"] for b in cell["universe"]]
        missing = [p for p in every if not cell["pairs"][p]]
        raised_missing = [p for p in every if not cell["raised"][p]]
        out[target] = {"universe": cell["universe"], "sequences": cell["sequences"],
                       "pairs": dict(sorted(cell["pairs"].items())),
                       "raised": dict(sorted(cell["raised"].items())),
                       "total": len(every), "covered": len(every) - len(missing),
                       "missing": missing, "raised_covered": len(every) - len(raised_missing),
                       "raised_missing": raised_missing,
                       "floor_met": not missing}
    return out


def render(cover: dict[str, dict]) -> list[str]:
    """One line per target: ``pairs: 225/225 covered (floor: every pair once)``, the rarest
    pair's count, the pairs whose later step raised, and the missing pairs."""
    lines = []
    for target, cell in cover.items():
        counts = [cell["pairs"].get(f"{a}>{b}", 0) for a in cell["universe"] for b in cell["universe"]]
        verdict = "floor met" if cell["floor_met"] else "BELOW FLOOR (every pair once)"
        lines.append(f"{target}: pairs: {cell['covered']}/{cell['total']} covered, {verdict}; "
                     f"rarest pair in {min(counts, default=0)} of {cell['sequences']} sequences; "
                     f"later step raised: {cell['raised_covered']}/{cell['total']}")
        missing = cell["missing"]
        if missing:
            more = f" and {len(missing) - SHOWN_MISSING} more (the JSON report lists them all)" \
                if len(missing) > SHOWN_MISSING else ""
            lines.append(f"  missing: {', '.join(missing[:SHOWN_MISSING])}{more}")
    return lines
