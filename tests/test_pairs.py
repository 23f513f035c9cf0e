"""The ordered pairs of sequence rules (``properties.harness.pairs``): a sequence's steps give
every (earlier rule, later rule) once, the pairs whose later step raised apart, and the report
says which pairs of the target's rules no sequence held."""

from __future__ import annotations

from swapspec.properties.harness import pairs


def _recorded(trail: list[tuple[str, bool]], universe=("a", "b", "c")) -> dict:
    before = pairs.snapshot()
    pairs.record("t", universe, trail)
    got = pairs.taken(before)
    return {"target": "t", "pairs": got}


def test_a_sequence_holds_each_ordered_pair_of_its_steps_once():
    """Rule: steps a, b, a give a>b, a>a, b>a (each once), and b raised: a>b raised."""
    result = _recorded([("a", False), ("b", True), ("a", False)])
    assert result["pairs"]["pairs"] == {"a>b": 1, "a>a": 1, "b>a": 1}
    assert result["pairs"]["raised"] == {"a>b": 1}
    assert result["pairs"]["sequences"] == 1


def test_coverage_merges_sequences_and_lists_the_missing_pairs():
    """Rule: over two sequences, the covered pairs are the union; every other pair of the
    universe is missing, and the floor (every pair once) is not met."""
    cover = pairs.coverage([_recorded([("a", False), ("b", False)]),
                            _recorded([("b", False), ("c", False)])])["t"]
    assert (cover["covered"], cover["total"], cover["sequences"]) == (2, 9, 2)
    assert "a>b" not in cover["missing"] and "c>a" in cover["missing"]
    assert cover["floor_met"] is False


def test_the_floor_is_met_when_every_pair_shows():
    """Rule: a sequence running every rule twice holds every ordered pair."""
    cover = pairs.coverage([_recorded([(r, False) for r in "abcabc"])])["t"]
    assert cover["floor_met"] and cover["covered"] == 9
    assert "floor met" in pairs.render({"t": cover})[0]


def test_the_console_lists_a_bounded_number_of_missing_pairs():
    """Rule: at most ``SHOWN_MISSING`` missing pairs are printed, and the rest are counted."""
    universe = tuple(f"r{i}" for i in range(6))
    cover = pairs.coverage([_recorded([("r0", False)], universe)])["t"]
    lines = pairs.render({"t": cover})
    assert "BELOW FLOOR" in lines[0]
    assert f"and {36 - pairs.SHOWN_MISSING} more" in lines[1]
