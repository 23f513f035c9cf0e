"""Tests of the catalogue leaves: torch's ``module_db`` modules wrapped in the swapspec forward contract."""

from __future__ import annotations

import random
import time
import warnings
import weakref
from collections.abc import Iterator

import hypothesis
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, settings
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from swapspec.strategies import BATCH, FEATURES, build_tree, module_trees, tree_info
from swapspec.strategies import catalogue_snapshot as snapshot
from swapspec.strategies import torch_modules as TM
from swapspec.strategies.trees import LeafSpec, TreeSpec, leaf_slots, tree_slots

X = torch.linspace(-1, 1, BATCH * FEATURES).reshape(BATCH, FEATURES)
PAIRS = TM.pairs()
PAIR_IDS = [f"{e}-{v}" for e, v in PAIRS]
UNINIT = nn.parameter.UninitializedTensorMixin
FIND = settings(database=None, max_examples=3000, phases=[Phase.generate], deadline=None,
                suppress_health_check=list(HealthCheck))
BUDGET_S = 0.050  # CPU seconds per build+forward with fresh inputs (ENTRY_EXCLUSIONS in torch_modules)
# (entry, variant) -> parameters whose change leaves the output alone at seed 0, with the reason.
NOT_READ = {
    ("nn.LayerNorm", 5): (None, "the input is empty: no parameter reaches the output"),
    ("nn.RMSNorm", 5): (None, "the input is empty: no parameter reaches the output"),
    ("nn.RNN", 0): ({"inner.weight_hh_l1"}, "relu RNN: layer 1's hidden state stays 0 on this input (seed 0)"),
    **dict.fromkeys(
        [("nn.LinearCrossEntropyLoss", v) for v in (122, 245, 734)],
        (None, "every target equals ignore_index: the loss is 0 whatever the weight"),
    ),
}


@pytest.fixture(autouse=True)
def _quiet_single_thread() -> Iterator[None]:
    """No warnings; one intra-op thread (tiny tensors: on a busy machine a thread pool only adds waiting)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.set_num_threads(threads)


def leaf_tree(entry: str, variant: int, seed: int = 0, **flags: bool) -> TreeSpec:
    return TreeSpec(seed=seed, root=LeafSpec("catalogue", entry=entry, variant=variant, **flags))


def named(module: nn.Module) -> list[tuple[str, Tensor]]:
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


def assert_same_tensors(a: nn.Module, b: nn.Module) -> None:
    """Equal names, classes, dtypes and bytes; no tensor object in common."""
    ta, tb = named(a), named(b)
    assert [n for n, _ in ta] == [n for n, _ in tb]
    for (name, x), (_, y) in zip(ta, tb, strict=True):
        assert type(x) is type(y) and x is not y and x.dtype == y.dtype, name
        if not isinstance(x, UNINIT):
            assert x.shape == y.shape and torch.equal(x, y), name


def assert_same_inputs(a: TM.CatalogueLeaf, b: TM.CatalogueLeaf) -> None:
    flat_a, flat_b = [], []
    TM.map_tensors((a.inputs_args, a.inputs_kwargs), flat_a.append)
    TM.map_tensors((b.inputs_args, b.inputs_kwargs), flat_b.append)
    assert len(flat_a) == len(flat_b)
    for x, y in zip(flat_a, flat_b, strict=True):
        assert x is not y and x.dtype == y.dtype and torch.equal(x, y)


# ---------------------------------------------------------------- the catalogue itself


def test_every_module_db_entry_is_kept_or_excluded_with_a_reason() -> None:
    names = [i.name for i in TM.module_db()]
    kept, left_out = TM.CATALOGUE, TM.EXCLUDED
    assert sorted(names) == sorted([*kept, *left_out]) and not set(kept) & set(left_out)
    assert all(reason for reason in left_out.values())
    assert all(e.variants and e.family == TM.family(e.name) and e.lazy == e.info.is_lazy for e in kept.values())
    assert TM.entry_names() == list(kept)


def test_snapshot_is_what_the_survey_computes() -> None:
    if TM.torch_release() != snapshot.TORCH_RELEASE:
        pytest.skip(f"the snapshot is for torch {snapshot.TORCH_RELEASE}; this torch surveys at run time")
    kept, left_out = TM.survey()
    assert kept == snapshot.KEPT and left_out == snapshot.EXCLUDED, (
        "catalogue_snapshot.py is stale: regenerate it with python -m swapspec.strategies.torch_modules --snapshot")


def test_entries_come_in_family_order_simplest_first() -> None:
    families = [e.family for e in TM.CATALOGUE.values()]
    assert families == sorted(families, key=TM.FAMILY_ORDER.index)
    assert next(iter(TM.CATALOGUE)) == "nn.Linear"


@pytest.mark.parametrize(("entry", "family"), [
    ("nn.Linear", "Linear"), ("nn.Bilinear", "Linear"), ("nn.LinearCrossEntropyLoss", "Loss"),
    ("nn.LSTM", "RNN"), ("nn.GRUCell", "RNN"), ("nn.MultiheadAttention", "Attention"),
    ("nn.TransformerDecoderLayer", "Transformer"), ("nn.LazyConvTranspose2d", "Conv"),
    ("nn.GroupNorm", "Norm"), ("nn.FractionalMaxPool2d", "Pooling"), ("nn.Embedding", "Embedding"),
    ("nn.PReLU", "Activation"), ("nn.Tanhshrink", "Activation"), ("nn.ZeroPad2d", "Other"),
])
def test_family_mapping(entry: str, family: str) -> None:
    assert TM.family(entry) == family


def test_importing_module_db_keeps_hypothesis_profiles_and_backend_flags() -> None:
    TM.module_db()
    assert not torch.backends.flags_frozen()
    for name in ("dev", "pytorch_ci", "debug"):
        with pytest.raises(hypothesis.errors.InvalidArgument):
            settings.get_profile(name)


def test_candidate_variants_spread_over_the_inputs() -> None:
    assert TM.candidate_variants(3) == [0, 1, 2]
    spread = TM.candidate_variants(64)
    assert len(spread) == TM.MAX_VARIANTS and spread[0] == 0 and spread[-1] == 63


# ---------------------------------------------------------------- every kept pair


@pytest.mark.parametrize(("entry", "variant"), PAIRS, ids=PAIR_IDS)
def test_pair_builds_deterministically_without_touching_global_rng(entry: str, variant: int) -> None:
    state, py_state = torch.get_rng_state(), random.getstate()
    a, b = build_tree(leaf_tree(entry, variant, seed=3)), build_tree(leaf_tree(entry, variant, seed=3))
    assert_same_tensors(a, b)
    assert_same_inputs(a, b)
    for training in (True, False):
        assert torch.equal(a.train(training)(X), b.train(training)(X))
    assert torch.equal(state, torch.get_rng_state()) and py_state == random.getstate()


@pytest.mark.parametrize(("entry", "variant"), PAIRS, ids=PAIR_IDS)
def test_pair_slots_match_prediction(entry: str, variant: int) -> None:
    spec = leaf_tree(entry, variant, seed=11)
    module = build_tree(spec)
    built = [(path, name, buffer, tuple(t.shape), str(t.dtype).removeprefix("torch."))
             for path, m in module.named_modules()
             for buffer, table in ((False, m._parameters), (True, m._buffers))
             for name, t in table.items() if t is not None and not isinstance(t, UNINIT)]
    predicted = [(s.path, s.name, s.buffer, s.shape, s.dtype) for s in leaf_slots("", spec.root)]
    assert built == predicted and predicted == [s[:5] for s in tree_slots(spec.root)]
    assert all(path.startswith("inner") for path, *_ in predicted)


@pytest.mark.parametrize(("entry", "variant"), PAIRS, ids=PAIR_IDS)
def test_adapter_keeps_shape_and_dtype_also_after_double(entry: str, variant: int) -> None:
    module = build_tree(leaf_tree(entry, variant))
    for training in (True, False):
        y = module.train(training)(X)
        assert y.shape == (BATCH, FEATURES) and y.dtype == torch.float32 and torch.isfinite(y).all()
    module.double()
    assert all(t.dtype == torch.float64 for _, t in named(module) if t.is_floating_point())
    assert module(X).dtype == torch.float32 and module(X.double()).dtype == torch.float64


@pytest.mark.parametrize(("entry", "variant"), PAIRS, ids=PAIR_IDS)
def test_adapter_output_depends_on_each_parameter(entry: str, variant: int) -> None:
    """Changing any parameter changes the output, except the ones :data:`NOT_READ` lists."""
    base = TM.build_leaf(entry, variant, 0)
    names = [n for n, p in base.named_parameters()]
    base(X)  # materializes lazy parameters, advances running stats: each changed copy does the same
    want = base(X)
    unread, _ = NOT_READ.get((entry, variant), (set(), ""))
    for name in names:
        changed = TM.build_leaf(entry, variant, 0)
        changed(X)
        with torch.no_grad():
            p = dict(changed.named_parameters())[name]
            p.add_(torch.linspace(0.1, 0.9, p.numel()).reshape(p.shape))
        differs = not torch.equal(want, changed(X))
        assert differs == (unread is not None and name not in unread), name


@pytest.mark.parametrize("entry", list(TM.catalogue()))
def test_entry_builds_and_runs_within_budget(entry: str) -> None:
    """Generating fresh inputs (a new seed) plus building plus one forward stays under the budget, best of 3.

    Measured in CPU time of this process (one intra-op thread), so other processes' load does not count.
    """
    worst = 0.0
    for variant in TM.catalogue()[entry].variants:
        best = float("inf")
        for trial in range(3):
            seed = 10**9 + 1000 * variant + trial
            start = time.process_time()
            TM.build_leaf(entry, variant, seed)(X)
            best = min(best, time.process_time() - start)
        worst = max(worst, best)
    assert worst < BUDGET_S, f"{entry}: {worst * 1000:.1f} ms"


# ---------------------------------------------------------------- the adapter's pieces


def test_cast_inputs_changes_floating_tensors_only_and_copies() -> None:
    like = torch.zeros(1, dtype=torch.float64)
    floats, ints = torch.ones(2), torch.arange(3)
    packed = pack_padded_sequence(torch.ones(2, 2, 1), torch.tensor([2, 1]))
    args, kwargs = TM.cast_inputs(((floats, [ints]), {"p": packed, "n": None}), like)
    assert args[0].dtype == torch.float64 and args[0] is not floats
    assert args[1][0].dtype == torch.int64 and args[1][0] is not ints and isinstance(args[1], list)
    assert kwargs["p"].data.dtype == torch.float64 and kwargs["p"].batch_sizes.dtype == torch.int64
    assert kwargs["n"] is None


def test_fold_weights_floating_outputs_and_skips_integers() -> None:
    out = (torch.ones(2), {"i": torch.arange(4), "c": torch.complex(torch.ones(1), torch.ones(1))}, None)
    w = TM.fold_weights(2, torch.device("cpu"))
    assert TM.fold(out, torch.device("cpu")).item() == pytest.approx(w.sum().item() + 1.0)
    assert TM.fold((), torch.device("cpu")).item() == 0.0


def test_adapter_runs_dropout_deterministically() -> None:
    entry = next(e for e, v in PAIRS if e == "nn.TransformerEncoderLayer")
    module = build_tree(leaf_tree(entry, TM.catalogue()[entry].variants[0])).train()
    state = torch.get_rng_state()
    assert torch.equal(module(X), module(X)) and torch.equal(state, torch.get_rng_state())


def test_adapter_output_is_finite_when_the_module_overflows() -> None:
    module = build_tree(leaf_tree("nn.Linear", 0))
    with torch.no_grad():
        module.inner.weight.fill_(float("inf"))
    assert torch.isfinite(module(X)).all()


def test_catalogue_leaf_flags_apply_to_every_parameter() -> None:
    module = build_tree(leaf_tree("nn.LSTM", 0, frozen=True, grad=True))
    params = list(module.parameters())
    assert params and all(not p.requires_grad and p.grad is not None and p.grad.shape == p.shape for p in params)
    assert {"frozen-parameter", "parameter-grad"} <= tree_info(module).features


# ---------------------------------------------------------------- drawing


def test_module_trees_draw_catalogue_roots() -> None:
    found = find(module_trees(catalogue_chance=60, wrapper_chance=0),  # the root itself, unwrapped
                 lambda m: "catalogue-root" in tree_info(m).features, settings=FIND)
    assert isinstance(found, TM.CatalogueLeaf) and tree_info(found).spec.root.kind == "catalogue"


def test_module_trees_tie_a_catalogue_tensor_to_another_leaf() -> None:
    found = find(module_trees(catalogue_chance=60), lambda m: "tie-catalogue" in tree_info(m).features,
                 settings=FIND)
    leaf_of = {id(sub): id(leaf) for leaf in found.modules() if isinstance(leaf, TM.CatalogueLeaf)
               for sub in leaf.modules()}
    owners: dict[int, set[tuple[int, bool]]] = {}  # tensor -> {(owning leaf, is a catalogue leaf)}
    for m in found.modules():
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None:
                owners.setdefault(id(t), set()).add((leaf_of.get(id(m), id(m)), id(m) in leaf_of))
    assert any(len(o) >= 2 and any(c for _, c in o) for o in owners.values()), (
        "one object in a catalogue leaf and in another leaf")
    assert found(X).shape == (BATCH, FEATURES)


def test_module_trees_share_a_catalogue_leaf() -> None:
    found = find(module_trees(catalogue_chance=60), lambda m: "shared-catalogue" in tree_info(m).features,
                 settings=FIND)
    paths: dict[int, list[str]] = {}
    for path, m in found.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), []).append(path)
    assert any(len(paths[id(m)]) >= 2 for m in found.modules() if isinstance(m, TM.CatalogueLeaf))
    assert found(X).shape == (BATCH, FEATURES)


def test_catalogue_trees_shrink_to_the_first_entry() -> None:
    """The entry shrinks to the first one (the variant usually does too, but the number of slots steers
    the later tie draws, so Hypothesis can stop at another variant)."""
    found = find(module_trees(), lambda m: "leaf: catalogue" in tree_info(m).features,
                 settings=settings(database=None, max_examples=3000, deadline=None,
                                   suppress_health_check=list(HealthCheck)))
    leaves = [m for m in found.modules() if isinstance(m, TM.CatalogueLeaf)]
    assert [m.entry for m in leaves] == [TM.entry_names()[0]]


def test_catalogue_option_off_and_lazy_off() -> None:
    with pytest.raises(hypothesis.errors.NoSuchExample):
        find(module_trees(catalogue=False), lambda m: "leaf: catalogue" in tree_info(m).features,
             settings=settings(FIND, max_examples=300))
    with pytest.raises(hypothesis.errors.NoSuchExample):
        find(module_trees(lazy=False, catalogue_chance=100),
             lambda m: any(isinstance(x, TM.CatalogueLeaf) and TM.is_lazy(x.entry) for x in m.modules()),
             settings=settings(FIND, max_examples=300))


def test_catalogue_chance_is_checked() -> None:
    with pytest.raises(ValueError, match="catalogue_chance"):
        find(module_trees(catalogue_chance=101), lambda m: True, settings=settings(database=None))


def test_catalogue_tree_source_rebuilds_it() -> None:
    module = build_tree(leaf_tree("nn.GRU", TM.catalogue()["nn.GRU"].variants[-1], seed=5))
    namespace: dict = {}
    exec(tree_info(module).source("rebuilt"), namespace)
    assert_same_tensors(module, namespace["rebuilt"])
    assert torch.equal(module(X), namespace["rebuilt"](X))


def test_keeps_weak_references_matches_every_built_variant() -> None:
    """``keeps_weak_references`` (what the ``swappable`` need leaves out) says of each entry what
    its built variants show: weak references to their tensors, which ``swap_tensors`` refuses."""
    for name, entry in TM.catalogue().items():
        for variant in entry.variants:
            leaf = TM.build_leaf(name, variant, 0)
            probed = any(weakref.getweakrefs(t) for t in (*leaf.parameters(), *leaf.buffers()))
            assert probed == TM.keeps_weak_references(name), (name, variant)
