"""Reach: a fixed-seed sample reaches every feature at least as often as its floor.

Samples are derandomized and drawn in a fresh process that has loaded every swapspec module
(``tests/fresh_sample.py``), so they are the same every run for a given Hypothesis version; the floors
sit below the measured frequencies (see ``python -m strategies.reach``), so a failure means a strategy
lost reach.
"""

from __future__ import annotations

import warnings

import pytest

from swapspec.strategies import torch_modules
from swapspec.strategies.conversions import CONVERSIONS
from swapspec.strategies.decorations import KINDS as DECORATION_KINDS
from swapspec.strategies.reach import (
    CATALOGUE_REACH_CHANCE,
    LIFE_OPTIONS,
    LOAD_OUTCOME_OPTIONS,
    WORLD_OPTIONS,
    frequencies,
    table,
)
from swapspec.strategies.trees import TRAININGS
from tests.fresh_sample import sample_in_fresh_process

TREE_FLOORS = {
    "ties": 0.20,
    "shared-submodule": 0.15,
    "parameter-subclass": 0.10,
    **dict.fromkeys(
        [
            *(f"depth={d}" for d in range(5)),
            *(f"container: {k}" for k in ("Sequential", "ModuleList", "ModuleDict", "custom")),
            *(f"param-dtype: {d}" for d in ("float32", "float16", "float64", "bfloat16", "complex64")),
            *(f"buffer-dtype: {d}" for d in ("float32", "int64", "bool")),
            "param-0d", "buffer-0d", "tensor-4d",
            "none-parameter", "none-buffer", "non-persistent-buffer", "frozen-parameter", "parameter-grad",
            "tied-parameters", "tied-buffers", "tie-across-depths", "tie-within-module",
            "shared-3plus-paths", "shared-across-depths",
            "forward-inplace-buffer", "forward-rebind-buffer", "eval-mode",
            "leaf: catalogue",
        ],
        0.05,
    ),
    # Each leaf kind (measured minimum 3.6% on this sample, Linear; derandomized draws are lumpy).
    **{f"leaf: {k}": 0.025 for k in ("generic", "Linear", "Conv1d", "Conv2d", "BatchNorm1d",
                                     "LayerNorm", "Embedding", "SparseEmbedding")},
    # Rarer since sparse embeddings, catalogue leaves, decorations, training and wrappers joined
    # the draws (measured 1.2-4.8% on this sample).
    **dict.fromkeys(["leaf: LazyLinear-uninitialized", "tie-3plus-aliases", "forward-raises",
                     "forward-reports"], 0.02),
    "leaf: LazyLinear-initialized": 0.01,
}

# Decorations and training state, on trees that always get them (measured minimum 3.6%, orthogonal apart).
LIFE_FLOORS = {
    **{f"decoration: {k}": 0.025 for k in DECORATION_KINDS},
    "decoration: orthogonal": 0.01,  # matrices only (measured 1.2%)
    "decoration: old-weight-norm": 0.015,  # measured 2.2% once 13 kinds share the draws
    # measured 1.8% and 2.2% once a parameter may be tied into a buffer slot (the draws shift)
    "decoration: spectral_norm": 0.01,
    "decoration: custom": 0.015,
    **{f"trained: {t}": 0.25 for t in TRAININGS},
    "sparse-grad": 0.025,
    "wrapper: compiled": 0.10,
    "wrapper: data-parallel": 0.10,
}
# On default trees (decorations in 30%, training in 20% of them).
DEFAULT_LIFE_FLOORS = {"trained: backward": 0.05, "trained: backward-create-graph": 0.03,
                       "wrapper: compiled": 0.02}
# On catalogue_reach's sample (catalogue_chance=CATALOGUE_REACH_CHANCE); measured minima on 500 trees:
# families 2.8%, catalogue-root 7.6%, tie-catalogue 9.0%, shared-catalogue 11.6%.
CATALOGUE_FLOORS = {
    "leaf: catalogue": 0.30,
    "catalogue-root": 0.04,
    "tie-catalogue": 0.05,
    "shared-catalogue": 0.05,
    **{f"catalogue: {f}": 0.015 for f in dict.fromkeys(e.family for e in torch_modules.catalogue().values())},
}

CALL_FLOORS = dict.fromkeys(
    [
        "form=dict", "form=tuple-single", "form=tuple-disjoint", "form=tuple-overlap",
        "no-names", "some-names", "all-names",
        "value: fresh", "value: own", "value: none", "value: other-dtype",
        "unknown-leaf", "unknown-leaf-parameter", "unknown-submodule",
        "tie-one-alias", "tie-several-same", "tie-several-different", "shared-path",
        "strict", "tie_weights=False", "kwarg: fail", "kwarg: report",
        "invalid: non-tensor-value", "invalid: empty-leaf-name", "invalid: non-mapping", "invalid: non-dict-element",
    ],
    0.05,
)

# Measured on 300 draws: rarest 6.7% (invalid: non-tensor).
LOAD_FLOORS = dict.fromkeys(
    [
        *(f"value: {k}" for k in ("own", "fresh", "other-dtype", "meta", "two-tensor", "own-tensor")),
        *(f"alias: {k}" for k in ("same-object", "equal-values", "different-values")),
        *(f"invalid: {k}" for k in ("missing", "unexpected", "wrong-shape", "non-tensor")),
        "strict", "assign", "swap",
    ],
    0.04,
) | {"invalid: non-tensor": 0.02}  # measured 2.7% once a parameter may be tied into a buffer slot

# state_dicts(outcome=...): every value kind, alias and flag still drawn where the load must succeed
# (measured on 300 draws: rarest 17.3%, alias: same-object), every reason where it must fail
# (rarest 5.3%, fails: conflict: a tie group is needed).
LOAD_SUCCEEDS_FLOORS = dict.fromkeys(
    [*(f"value: {k}" for k in ("own", "fresh", "other-dtype", "meta", "two-tensor", "own-tensor")),
     "alias: same-object", "alias: equal-values", "strict", "assign", "swap"],
    0.10,
)
LOAD_FAILS_FLOORS = {
    **dict.fromkeys([f"fails: {r}" for r in ("missing", "unexpected", "wrong-shape", "non-tensor")],
                    0.08),
    "fails: conflict": 0.03,
    **dict.fromkeys([*(f"alias: {k}" for k in ("same-object", "equal-values", "different-values")),
                     "strict", "assign", "swap"], 0.10),
}

# 16 equally likely choices (6.25% each); derandomized Hypothesis draws are lumpy, measured minimum 4.5%.
CONVERSION_FLOOR = 0.04


def _fresh(function: str, *args: object, **kwargs: object) -> list[list[str]]:
    """The feature sets ``strategies.reach.<function>(*args, **kwargs)`` draws in a fresh process
    (``tests/fresh_sample.py``: a derandomized sample depends on the local modules loaded)."""
    return sample_in_fresh_process(f"swapspec.strategies.reach:{function}", *args, **kwargs)


def check(title: str, freqs: dict[str, float], floors: dict[str, float]) -> None:
    print("\n" + table(title, freqs))
    low = {tag: (freqs.get(tag, 0.0), floor) for tag, floor in floors.items() if freqs.get(tag, 0.0) < floor}
    assert not low, f"features below their floor (measured, floor): {low}"


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_tree_reach() -> None:
    check("tree feature (500 trees)", frequencies(_fresh("tree_reach", 500)),
          {**TREE_FLOORS, **DEFAULT_LIFE_FLOORS})


def test_decoration_and_training_reach() -> None:
    check(f"decoration and training feature (500 trees, {LIFE_OPTIONS})",
          frequencies(_fresh("tree_reach", 500, **LIFE_OPTIONS)), LIFE_FLOORS)


# The conversion properties' tensor worlds: 10% of the untrained trees, split over meta and TwoTensor
# (500-tree sample: two-tensor 1.4%).
WORLD_FLOORS = {"world: meta": 0.01, "world: two-tensor": 0.01}  # measured on 1,500: 4.0% and 3.2%


def test_world_reach() -> None:
    check(f"tensor world (500 trees, {WORLD_OPTIONS})", frequencies(_fresh("tree_reach", 500, **WORLD_OPTIONS)),
          WORLD_FLOORS)


# The FC-* properties' calls: a meta-built tree's forward input goes to meta (1,000 draws: meta-input
# 1.4%, world: two-tensor 5.7%).
WORLD_CALL_FLOORS = {"world: meta": 0.005, "world: two-tensor": 0.02, "meta-input": 0.005}


def test_world_call_reach() -> None:
    check(f"tensor world of a call (1000 draws, {WORLD_OPTIONS})", frequencies(_fresh("world_call_reach", 1000)),
          WORLD_CALL_FLOORS)


@pytest.mark.parametrize("strategy", ["test_functional_call:trees", "test_functional_call:tied_trees",
                                      "test_together:trees"])
def test_call_properties_draw_the_worlds(strategy: str) -> None:
    """The FC-* and TOGETHER-* trees are drawn with the conversion properties' world chance
    (FC-WRITE-BACK's ``updating_trees`` stay plain: a rebind is the same in every world)."""
    seen = frequencies(sample_in_fresh_process("tests.fresh_sample:strategy_tree_features",
                                               f"swapspec.properties.rules.{strategy}", 200))
    worlds = {k: v for k, v in seen.items() if k.startswith("world: ")}
    assert sum(worlds.values()) >= 0.01, f"{strategy} drew {worlds or 'no tensor world'} in 200 trees"


def test_world_chance_matches_the_properties() -> None:
    from swapspec.properties.models.apply_state import WORLD_CHANCE

    assert WORLD_OPTIONS["world_chance"] == WORLD_CHANCE, "the reach sample must draw as the properties do"


def test_catalogue_reach() -> None:
    check(f"catalogue feature (500 trees, catalogue_chance={CATALOGUE_REACH_CHANCE})",
          frequencies(_fresh("catalogue_reach", 500)), CATALOGUE_FLOORS)


def test_catalogue_floors_name_every_family() -> None:
    families = {e.family for e in torch_modules.catalogue().values()}
    assert {f"catalogue: {f}" for f in families} <= set(CATALOGUE_FLOORS) and len(families) >= 9


def test_conversion_reach() -> None:
    floors = {c.name: CONVERSION_FLOOR for c in CONVERSIONS if c.device in ("cpu", "meta")}
    check("conversion (2000 draws)", frequencies(_fresh("conversion_reach", 2000)), {**floors, "raise_on": CONVERSION_FLOOR})


def test_call_reach() -> None:
    check("call feature (500 draws, invalid=True)", frequencies(_fresh("call_reach", 500)), CALL_FLOORS)


def test_load_reach() -> None:
    check("load feature (300 draws)", frequencies(_fresh("load_reach", 300)), LOAD_FLOORS)


@pytest.mark.parametrize("outcome", sorted(LOAD_OUTCOME_OPTIONS))
def test_load_outcome_reach(outcome: str) -> None:
    floors = {"succeeds": LOAD_SUCCEEDS_FLOORS, "fails": LOAD_FAILS_FLOORS}[outcome]
    check(f"load feature, outcome={outcome} (300 draws)",
          frequencies(_fresh("load_reach", 300, **LOAD_OUTCOME_OPTIONS[outcome])), floors)


# Sequences on the reference: the share of sequences that ran each step at least once, measured
# on the 66 derandomized sequences below (drawn in a fresh process): optimizer_step,
# optimizer_reload and clip_grads 2.6% (the rarest), tie 3.9%, untie 6.5%, module_apply 9.1%,
# every other step 11.7-61.0%. Hypothesis' swarm testing turns a random subset of the rules off
# per sequence, and it draws the rules it sorts first (fewest arguments, then by name) more
# often, so shares are lumpy: every floor sits below its measured share, and the rarest steps'
# floors ask for one sequence in a hundred.
SEQUENCES = 66
SEQUENCE_FLOORS = {
    **dict.fromkeys(("convert", "functional_call", "load_state_dict", "state_dict_round_trip",
                     "deepcopy", "backward", "register_hooks", "build_optimizer", "zero_grad",
                     "requires_grad_", "vmap", "keep_graph", "release_graph"), 0.05),
    **dict.fromkeys(("optimizer_step", "optimizer_reload", "clip_grads", "tie"), 0.01),
    "untie": 0.025, "module_apply": 0.04,
}
SEQUENCE_MEAN_LENGTH_FLOOR = 5


def test_sequence_reach() -> None:
    """Rule: every rule of the sequence machine runs in at least its floor's share of the
    sequences, and sequences run most of their steps."""
    steps, lengths = sample_in_fresh_process(
        "swapspec.properties.rules.sequence_reach:sequence_reach", SEQUENCES)
    check(f"sequence step ({SEQUENCES} sequences)", frequencies(steps), SEQUENCE_FLOORS)
    assert sum(lengths) / len(lengths) >= SEQUENCE_MEAN_LENGTH_FLOOR, lengths


def test_method_calls_reach_every_form():
    """500 fixed-seed (tree, public method call) pairs as APPLY-METHOD-ARGS draws them reach
    each kind (conversion, grad, bad) in at least 20% of draws, 9 of the 10 methods drawn
    (``cuda`` is not) and 40 of the 45 forms (all 45 in 1,000 draws: docs/strategies.md)."""
    from swapspec.reference.methods import METHODS
    from swapspec.strategies.method_calls import BAD_CALLS, GRAD_CALLS, METHOD_CONVERSIONS
    freq = frequencies(_fresh("method_reach", 500))
    assert all(freq.get(f"kind: {k}", 0) >= 0.20 for k in ("conversion", "grad", "bad")), freq
    forms = [c.call.name for c in METHOD_CONVERSIONS] + [c.name for c in (*GRAD_CALLS, *BAD_CALLS)]
    assert len([f for f in forms if f in freq]) >= 40, sorted(set(forms) - set(freq))
    assert len([m for m in METHODS if f"method: {m}" in freq]) >= 9, freq
