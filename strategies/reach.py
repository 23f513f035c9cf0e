"""Measure the reach of the strategies: how often each feature tag shows up in a fixed-seed sample.

``python -m strategies.reach [N]`` prints Markdown tables (feature, frequency) for N trees (default 1000),
N catalogue-rich trees (:data:`CATALOGUE_REACH_CHANCE`), N conversions, N call inputs and N load_state_dict
inputs, and the time taken
to draw and build the N trees.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from swapspec.strategies.calls import GRAD_MODES, call_inputs, flag_settings
from swapspec.strategies.conversions import conversions
from swapspec.strategies.state_dicts import state_dicts
from swapspec.strategies.tree_draws import module_trees, tree_specs
from swapspec.strategies.trees import spec_features, tree_info

# Catalogue leaves are one leaf in ~14 by default, too few to measure their families, ties and shares on a
# sample of hundreds; catalogue_reach draws trees with this catalogue_chance instead.
CATALOGUE_REACH_CHANCE = 40


def sample(strategy: st.SearchStrategy[Any], n: int, features: Callable[[Any], Iterable[str]]) -> list[frozenset[str]]:
    """Feature sets of ``n`` examples drawn deterministically (derandomized, generate phase only, no database)."""
    seen: list[frozenset[str]] = []

    @settings(
        database=None, derandomize=True, max_examples=n, deadline=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example: Any) -> None:
        seen.append(frozenset(features(example)))

    collect()
    return seen


def frequencies(seen: list[frozenset[str]]) -> dict[str, float]:
    """Fraction of examples that have each feature, sorted by feature name."""
    counts = Counter(tag for tags in seen for tag in tags)
    return {tag: counts[tag] / len(seen) for tag in sorted(counts)}


def tree_reach(n: int, **options: Any) -> list[frozenset[str]]:
    """Feature sets of ``n`` drawn trees (``options`` go to ``module_trees``)."""
    return sample(module_trees(**options), n, lambda m: tree_info(m).features)


# The decorations, training state and wrappers, drawn in every (wrappers: every other) tree, so
# every kind shows in a sample.
LIFE_OPTIONS = {"decoration_chance": 100, "training_chance": 100,
                "wrappers": ("compiled", "data-parallel"), "wrapper_chance": 50}


# The tensor worlds as the conversion, FC-* and TOGETHER-* properties draw them
# (``properties.models.apply_state.WORLD_CHANCE``).
WORLD_OPTIONS = {"world_chance": 10}


def catalogue_reach(n: int) -> list[frozenset[str]]:
    """Feature sets of ``n`` drawn tree specs with ``catalogue_chance=CATALOGUE_REACH_CHANCE``."""
    return sample(tree_specs(catalogue_chance=CATALOGUE_REACH_CHANCE), n, spec_features)


def conversion_reach(n: int) -> list[frozenset[str]]:
    """``{conversion.tag}`` of ``n`` drawn conversions (default devices).

    Each conversion is drawn together with a flag setting and a filler integer, as a property would draw it
    beside other data: drawn alone, the few distinct conversions are simply enumerated once each.
    """
    drawn = st.tuples(conversions(), flag_settings(), st.integers(0, 2**32 - 1))
    return sample(drawn, n, lambda c: {c[0].tag})


def method_reach(n: int) -> list[frozenset[str]]:
    """Feature sets of ``n`` (tree, public method call) pairs as APPLY-METHOD-ARGS draws them
    (:data:`WORLD_OPTIONS`): the call's name, ``method: <method>`` and ``kind: <kind>``."""
    from swapspec.strategies.method_calls import modules_with_method_calls

    pairs = modules_with_method_calls(module_trees(**WORLD_OPTIONS))
    return sample(pairs, n, lambda p: {p[1].name, f"method: {p[1].method}", f"kind: {p[1].kind}"})


def call_reach(n: int, invalid: bool = True) -> list[frozenset[str]]:
    """Feature sets of ``n`` call inputs, each for a freshly drawn tree, under the autograd modes
    the FC-* properties draw (``GRAD_MODES``)."""
    pairs = module_trees().flatmap(lambda m: call_inputs(m, invalid=invalid, grad_modes=GRAD_MODES))
    return sample(pairs, n, lambda c: c.features)


def world_call_reach(n: int) -> list[frozenset[str]]:
    """Feature sets of ``n`` (tree, call) pairs drawn as the ``FC-*`` properties draw them
    (:data:`WORLD_OPTIONS`, ``invalid=True``): the tree's ``world: ...`` tags and the call's tags."""
    pairs = module_trees(**WORLD_OPTIONS).flatmap(
        lambda m: st.tuples(st.just(m), call_inputs(m, invalid=True)))
    return sample(pairs, n, lambda p: {t for t in tree_info(p[0]).features if t.startswith("world: ")}
                  | p[1].features)


def load_reach(n: int, **options: Any) -> list[frozenset[str]]:
    """Feature sets of ``n`` load_state_dict inputs, each for a freshly drawn tree (``options`` go
    to ``state_dicts``)."""
    return sample(module_trees().flatmap(lambda m: state_dicts(m, **options)), n,
                  lambda c: c.features)


# The load outcomes the LOAD- properties draw by construction (``state_dicts(outcome=...)``).
LOAD_OUTCOME_OPTIONS = {"succeeds": {"outcome": "succeeds", "invalid": False},
                        "fails": {"outcome": "fails"}}


LIFE_TAGS = ("decoration: ", "trained: ", "sparse-grad", "leaf: SparseEmbedding", "wrapper: ", "world: ")


def table(title: str, freqs: dict[str, float]) -> str:
    """A Markdown table of the frequencies."""
    lines = [f"| {title} | frequency |", "| --- | ---: |"]
    lines += [f"| `{tag}` | {f:.1%} |" for tag, f in freqs.items()]
    return "\n".join(lines)


def timed_trees(n: int) -> tuple[list[frozenset[str]], float]:
    """Draw and build ``n`` trees; return their features and the seconds taken."""
    start = time.perf_counter()
    seen = tree_reach(n)
    return seen, time.perf_counter() - start


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 1000
    trees, seconds = timed_trees(n)
    print(f"Drawing and building {n} trees took {seconds:.2f} s.\n")
    print(table(f"tree feature ({n} trees)", frequencies(trees)), "\n")
    life = frequencies(tree_reach(n, **LIFE_OPTIONS))
    print(table(f"decoration and training feature ({n} trees, {LIFE_OPTIONS})",
                {k: v for k, v in life.items() if k.startswith(LIFE_TAGS)}), "\n")
    worlds = frequencies(tree_reach(n, **WORLD_OPTIONS))
    print(table(f"tensor world ({n} trees, {WORLD_OPTIONS})",
                {k: v for k, v in worlds.items() if k.startswith("world: ")}), "\n")
    world_calls = frequencies(world_call_reach(n))
    print(table(f"tensor world of a call ({n} draws, invalid=True, {WORLD_OPTIONS})",
                {k: v for k, v in world_calls.items() if k.startswith("world: ") or k == "meta-input"}),
          "\n")
    catalogue = {k: v for k, v in frequencies(catalogue_reach(n)).items() if "catalogue" in k}
    print(table(f"catalogue feature ({n} trees, catalogue_chance={CATALOGUE_REACH_CHANCE})", catalogue), "\n")
    print(table(f"conversion ({n} draws)", frequencies(conversion_reach(n))), "\n")
    print(table(f"call feature ({n} draws, invalid=True)", frequencies(call_reach(n))), "\n")
    print(table(f"load feature ({n} draws)", frequencies(load_reach(n))))
    for name, options in LOAD_OUTCOME_OPTIONS.items():
        print(table(f"load feature, outcome={name} ({n} draws)", frequencies(load_reach(n, **options))))


if __name__ == "__main__":
    main(sys.argv[1:])
