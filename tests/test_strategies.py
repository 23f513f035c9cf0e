"""Tests of the strategies package: determinism, rebuild/repro, forward contract, RNG hygiene, conversions."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from torch import nn
from torch.nn.utils import parametrize

from swapspec.properties.models.examples import same_values
from swapspec.properties.models.load_examples import key_model
from swapspec.properties.models.outcomes import attempt
from swapspec.properties.rules.load_clauses import load_succeeds, slot_ties
from swapspec.strategies import (
    BATCH,
    FEATURES,
    CallInput,
    ConversionError,
    FlagSetting,
    ForwardError,
    build_tree,
    call_inputs,
    conversions,
    flag_settings,
    module_trees,
    tree_info,
    tree_specs,
)
from swapspec.strategies.calls import valid_names
from swapspec.strategies.conversions import (
    ADD_ONE,
    ADD_ONE_WRAPPING_MATRICES,
    CONVERSIONS,
    raising_conversion,
)
from swapspec.strategies.decorations import PARAMETRIZATIONS
from swapspec.strategies.state_dicts import state_dicts, swap_refused
from swapspec.strategies.torch_modules import CatalogueLeaf
from swapspec.strategies.tree_needs import with_none_slot
from swapspec.strategies.tree_parts import compatible, draw_trained, draw_training
from swapspec.strategies.trees import (
    BLOCK_NAMES,
    ContainerSpec,
    LeafSpec,
    TensorSpec,
    TieSpec,
    TreeSpec,
    slot_values,
    tensor_values,
)

SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
X = torch.linspace(-1, 1, BATCH * FEATURES).reshape(BATCH, FEATURES)
UNINIT = nn.parameter.UninitializedTensorMixin


def tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


def assert_same_tree(a: nn.Module, b: nn.Module) -> None:
    """Equal names, types, values, grads, tags and the same aliasing pattern; no object in common."""
    ta, tb = tensors(a), tensors(b)
    assert [n for n, _ in ta] == [n for n, _ in tb]
    ids_a, ids_b = {}, {}
    for (name, x), (_, y) in zip(ta, tb, strict=True):
        assert type(x) is type(y) and x is not y, name
        assert ids_a.setdefault(id(x), name) == ids_b.setdefault(id(y), name), name
        if isinstance(x, UNINIT):
            continue
        assert same_values(x, y), name  # NaNs equal: a tree trained through NaNs builds them again
        assert x.requires_grad == y.requires_grad and getattr(x, "tag", None) == getattr(y, "tag", None)
        assert (x.grad is None) == (y.grad is None) and (x.grad is None or same_values(x.grad, y.grad))
    assert [p for p, _ in a.named_modules(remove_duplicate=False)] == [p for p, _ in b.named_modules(remove_duplicate=False)]
    assert a.state_dict().keys() == b.state_dict().keys()


def test_same_tree_counts_nan_values_and_grads_as_equal():
    def nan_linear() -> nn.Module:
        m = nn.Linear(2, 2)
        with torch.no_grad():
            m.weight.fill_(float("nan"))
            m.bias.fill_(0.5)
        m(torch.ones(1, 2)).sum().backward()  # NaN grads, as a BatchNorm with tied stats trains
        return m

    assert_same_tree(nan_linear(), nan_linear())
    other = nan_linear()
    other.weight.grad.zero_()
    with pytest.raises(AssertionError):
        assert_same_tree(nan_linear(), other)


@SETTINGS
@given(tree_specs())
def test_build_is_deterministic(spec: TreeSpec) -> None:
    assert_same_tree(build_tree(spec), build_tree(spec))


@SETTINGS
@given(module_trees())
def test_info_build_and_source_rebuild_equal_independent_modules(module: nn.Module) -> None:
    info = tree_info(module)
    assert_same_tree(module, info.build())
    namespace: dict = {}
    exec(info.source("rebuilt"), namespace)
    assert_same_tree(module, namespace["rebuilt"])
    assert eval(repr(info.spec), {**namespace}) == info.spec
    assert info.n_modules == len(list(module.modules()))


def _catalogue_tensor_ids(module: nn.Module) -> set[int]:
    return {id(t) for m in module.modules() if isinstance(m, CatalogueLeaf) for t in (*m.parameters(), *m.buffers())}


@SETTINGS
@given(module_trees(), st.data())
def test_forward_contract_and_dependence_on_every_tensor(module: nn.Module, data: st.DataObject) -> None:
    """Every tensor outside catalogue leaves changes the output (a real module's forward need not read all of
    its tensors: tests/test_strategies_catalogue.py checks those)."""
    spec = tree_info(module).spec
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # A reparametrized slot's own tensors need not all reach the output: spectral norm of a
        # 1-D weight ignores its power-iteration vector, weight norm over dim 0 of a vector keeps
        # only the signs of ``v``. The plain tensors of the tree must.
        decorated = [f"{d.key}_" for d in spec.decorations]
        parametrization_state = {n for n, _ in tensors(module)
                                 if "parametrizations." in n or any(n.startswith(k) for k in decorated)}
        real = _catalogue_tensor_ids(module)
        names = [n for n, t in tensors(module) if not isinstance(t, UNINIT)
                 and (t.is_floating_point() or t.is_complex()) and n not in parametrization_state
                 and id(t) not in real]
        y0 = module(X)
        assert y0.shape == (BATCH, FEATURES) and y0.dtype == X.dtype
        if not names:
            return
        name = data.draw(st.sampled_from(names))
        other = build_tree(spec)
        with torch.no_grad():
            dict(tensors(other))[name].view(-1)[0] += 1
        assert not torch.equal(other(X), y0), f"output ignores {name}"


@SETTINGS
@given(st.data())
def test_drawing_building_and_running_leave_global_rng_alone(data: st.DataObject) -> None:
    state = torch.get_rng_state()
    module = data.draw(module_trees())
    data.draw(call_inputs(module, invalid=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module(X)
    assert torch.equal(state, torch.get_rng_state())


def test_raising_leaf_and_reporting_leaf() -> None:
    spec = TreeSpec(root=LeafSpec(tensors=(TensorSpec("p0"),), behaviours=("raise", "report", "rebind")))
    module, report = build_tree(spec), []
    module(X, report=report)
    assert report[0].module is module and report[0].parameters[0][1] is module.p0
    assert int(module.count) == 1
    with pytest.raises(ForwardError):
        module(X, fail=True)


def test_minimal_tree_is_one_generic_leaf_with_one_float32_parameter() -> None:
    found = find(module_trees(), lambda m: len(list(m.parameters())) >= 1, settings=settings(database=None, max_examples=500))
    assert tree_info(found).spec == TreeSpec(root=LeafSpec(tensors=(TensorSpec("p0"),)))


def _generic_leaves(spec: TreeSpec) -> list[LeafSpec]:
    found, stack = [], [spec.root]
    while stack:
        node = stack.pop()
        if isinstance(node, LeafSpec):
            found += [node] if node.kind == "generic" else []
        else:
            stack.extend(node.children)
    return found


@SETTINGS
@given(st.data())
def test_behaviours_option_limits_and_weights_leaf_behaviours(data: st.DataObject) -> None:
    always = data.draw(tree_specs(behaviours=("rebind",), behaviour_chance=100))
    never = data.draw(tree_specs(behaviour_chance=0))
    assert all(leaf.behaviours == ("rebind",) for leaf in _generic_leaves(always))
    assert all(leaf.behaviours == () for leaf in _generic_leaves(never))


@pytest.mark.parametrize("options", [{"behaviours": ("explode",)}, {"behaviour_chance": 101}])
def test_behaviours_option_rejects_bad_values(options: dict) -> None:
    with pytest.raises(ValueError, match="behaviour"):
        find(module_trees(**options), lambda m: True, settings=settings(database=None))


@SETTINGS
@given(st.data())
def test_call_inputs_buffers_all_gives_every_buffer_name(data: st.DataObject) -> None:
    module = data.draw(module_trees())
    call = data.draw(call_inputs(module, buffers="all", unknown_names=False, forms=("dict",)))
    buffer_names = {n for n, _ in module.named_buffers(remove_duplicate=False)}
    assert buffer_names <= set(call.tensors)


def test_call_inputs_rejects_unknown_buffers_option() -> None:
    with pytest.raises(ValueError, match="buffers"):
        call_inputs(nn.Linear(2, 2), buffers="none")


def test_value_changing_conversions_change_every_value() -> None:
    t, matrix = torch.linspace(0, 1, 4), torch.zeros(2, 3)
    for conversion in (ADD_ONE, ADD_ONE_WRAPPING_MATRICES):
        fn = conversion.make_fn()
        assert torch.equal(fn(t), t + 1) and fn(t) is not t
        assert torch.equal(fn(matrix).detach() if conversion is ADD_ONE else fn(matrix).a, matrix + 1)
    assert type(ADD_ONE_WRAPPING_MATRICES.make_fn()(matrix)).__name__ == "TwoTensor"


def test_flag_settings_shrink_to_default() -> None:
    assert find(flag_settings(), lambda f: True, settings=settings(database=None)) == FlagSetting(False, False)


def test_importing_strategies_does_not_import_torch_xla() -> None:
    assert "torch_xla" not in sys.modules


# ---------------------------------------------------------------- conversions

MODULE_METHODS = {
    "float()": lambda m: m.float(),
    "half()": lambda m: m.half(),
    "double()": lambda m: m.double(),
    "bfloat16()": lambda m: m.bfloat16(),
    "to(torch.float64)": lambda m: m.to(torch.float64),
    "to(torch.complex64)": lambda m: m.to(torch.complex64),
    "cpu()": lambda m: m.cpu(),
    "share_memory()": lambda m: m.share_memory(),
    "to(memory_format=torch.channels_last)": lambda m: m.to(memory_format=torch.channels_last),
    "to('meta')": lambda m: m.to("meta"),
    "to_empty(device='cpu')": lambda m: m.to_empty(device="cpu"),
    "to_empty(device='meta')": lambda m: m.to_empty(device="meta"),
}


@pytest.mark.parametrize("name", sorted(MODULE_METHODS))
@settings(max_examples=20, deadline=None, database=None)
@given(spec=tree_specs(lazy=False, training_chance=0))  # torch asserts on create_graph grads
def test_conversion_mirrors_module_method(name: str, spec: TreeSpec) -> None:
    conversion = next(c for c in CONVERSIONS if c.name == name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        method = attempt(lambda: MODULE_METHODS[name](build_tree(spec)))
        applied = attempt(lambda: build_tree(spec)._apply(conversion.make_fn()))
    # both raise alike (channels_last on a 5-D tensor: RuntimeError), or both return
    assert type(method.error) is type(applied.error), (method.error, applied.error)
    if method.error is not None:
        return
    a, b = method.result, applied.result
    for (n, x), (_, y) in zip(tensors(a), tensors(b), strict=True):
        assert (x.dtype, x.device, x.shape, x.stride()) == (y.dtype, y.device, y.shape, y.stride()), n
        if conversion.preserves_values and x.device.type != "meta":
            assert torch.equal(x, y), n


@pytest.mark.parametrize("conversion", [c for c in CONVERSIONS if c.device in ("cpu", "meta")], ids=lambda c: c.name)
def test_conversion_flags_match_torch(conversion) -> None:
    t = torch.linspace(0, 1, 4)
    out = conversion.make_fn()(t)
    assert conversion.changes_impl == (not torch._has_compatible_shallow_copy_type(t, out))
    if conversion.preserves_values and out.device.type != "meta":
        dense = out.to_dense() if out.layout != torch.strided else out
        shift = 1 if conversion.name == "add(1)" else 0
        assert torch.allclose(dense.real.double(), (t + shift).double(), atol=1e-2)


def test_raise_on_counts_per_fresh_fn() -> None:
    conversion = raising_conversion(2)
    fn = conversion.make_fn()
    t = torch.zeros(1)
    assert torch.equal(fn(t), t + 1)  # out of place: t + 1
    with pytest.raises(ConversionError):
        fn(t)
    assert torch.equal(conversion.make_fn()(t), t + 1)  # a fresh fn has a fresh counter


@settings(max_examples=30, deadline=None, database=None)
@given(conversions(lazy_safe=True))
def test_lazy_safe_conversions_keep_lazy_parameters_uninitialized(conversion) -> None:
    module = build_tree(TreeSpec(root=LeafSpec("LazyLinear")))
    try:
        module._apply(conversion.make_fn())
    except ConversionError:
        assert conversion.raises_on is not None
    assert isinstance(module.weight, UNINIT)


# ---------------------------------------------------------------- call inputs


@SETTINGS
@given(st.data())
def test_call_inputs_shape(data: st.DataObject) -> None:
    module = data.draw(module_trees())
    call: CallInput = data.draw(call_inputs(module))
    names = valid_names(module)
    merged = call.merged()
    if call.form == "dict":
        assert isinstance(call.tensors, dict)
    elif call.form == "tuple-overlap":
        first, second = call.tensors
        assert set(first) & set(second)
    elif call.form == "tuple-disjoint":
        first, second = call.tensors
        assert not set(first) & set(second)
    assert call.args[0].shape == (BATCH, FEATURES) and call.args[0].dtype == torch.float32
    for key, value in merged.items():
        if key in names and value is not None and value is not names[key]:
            assert value.shape == names[key].shape
            assert value.untyped_storage().data_ptr() != names[key].untyped_storage().data_ptr()
        elif key not in names:
            assert key.endswith("extra") or key == "nosuch.weight"


@SETTINGS
@given(st.data())
def test_simple_call_inputs_run_through_functional_call(data: st.DataObject) -> None:
    module = data.draw(module_trees(lazy=False))
    call: CallInput = data.draw(call_inputs(module, unknown_names=False))
    assume_ok = (
        call.form != "tuple-overlap" and not call.strict and "fail" not in call.kwargs
        and "tie-one-alias" not in call.features and "tie-several-same" not in call.features
        and "tie-several-different" not in call.features and all(v is not None for v in call.merged().values())
        and "value: other-dtype" not in call.features
    )
    if not assume_ok:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.func.functional_call(module, call.tensors, call.args, call.kwargs, tie_weights=call.tie_weights)
    assert out.shape == (BATCH, FEATURES)


class CumulativeNorm(nn.Module):
    """A ``BatchNorm1d`` with ``momentum=None``, whose training forward divides by
    ``num_batches_tracked + 1``, with its count and variance also held under other names."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(FEATURES, momentum=None)
        self.alias = nn.Module()
        self.alias.register_buffer("steps", self.norm.num_batches_tracked)
        self.alias.register_buffer("spread", self.norm.running_var)

    def forward(self, x: torch.Tensor, **kwargs: object) -> torch.Tensor:  # the calls' ``report``
        return self.norm(x)


COUNTS = ("norm.num_batches_tracked", "alias.steps")
VARIANCES = ("norm.running_var", "alias.spread")


def _assert_in_slot_domain(given: dict, names: tuple[str, ...], valid: Callable) -> None:
    for name in names:
        value = given.get(name)
        if isinstance(value, torch.Tensor) and not value.is_meta:
            assert valid(value), f"{name} was given {value}, which no batch norm can run with"


def test_slot_values_hold_what_their_slots_need_and_leave_other_names_alone() -> None:
    def values(names: tuple[str, ...], shape: tuple[int, ...], dtype: str) -> torch.Tensor:
        return slot_values(names, shape, dtype, torch.Generator().manual_seed(3))

    assert bool((values(("a.running_var",), (64,), "float32") > 0).all())
    assert bool((values(("steps", "b.num_batches_tracked"), (64,), "int64") >= 0).all())
    plain = tensor_values((64,), "int64", torch.Generator().manual_seed(3))
    assert bool((plain < 0).any())  # else the count check above proves nothing
    assert torch.equal(values(("a.steps",), (64,), "int64"), plain)
    assert values(("running_var",), (4,), "complex64").dtype == torch.complex64


@SETTINGS
@given(st.data())
def test_call_values_are_ones_every_alias_can_run_with(data: st.DataObject) -> None:
    module = CumulativeNorm().train(data.draw(st.booleans(), label="training"))
    call: CallInput = data.draw(call_inputs(module, valid=True, unknown_names=False,
                                            failing=False, forward_safe=True), label="call")
    given = call.merged()
    _assert_in_slot_domain(given, COUNTS, lambda v: bool((v >= 0).all()))
    _assert_in_slot_domain(given, VARIANCES, lambda v: bool((v > 0).all()))
    out = torch.func.functional_call(module, call.tensors, call.args, call.kwargs,
                                     tie_weights=call.tie_weights, strict=call.strict)
    assert bool(torch.isfinite(out).all()), "a valid call's forward gave non-finite values"


@SETTINGS
@given(st.data())
def test_load_values_are_ones_every_alias_can_run_with(data: st.DataObject) -> None:
    module = CumulativeNorm()
    load = data.draw(state_dicts(module, outcome="succeeds", invalid=False,
                                   kinds=("own", "fresh", "other-dtype")))
    _assert_in_slot_domain(load.state_dict, COUNTS, lambda v: bool((v >= 0).all()))
    _assert_in_slot_domain(load.state_dict, VARIANCES, lambda v: bool((v > 0).all()))


def _aliased(module: nn.Module) -> bool:
    objects = [id(t) for _, t in tensors(module)]
    return len(objects) != len(set(objects))


def _has_none_slot(module: nn.Module) -> bool:
    return any(t is None for m in module.modules() for t in (*m._parameters.values(), *m._buffers.values()))


# need -> what every built module then has, checked on the module itself (not on its spec)
NEED_CHECKS = {
    "trainable": lambda m: any(p.requires_grad for p in m.parameters()),
    "tensor": lambda m: bool(tensors(m)),
    "grad": lambda m: any(p.grad is not None for p in m.parameters()),
    "none-slot": _has_none_slot,
    "container-root": lambda m: bool(list(m.children())),
    "alias": _aliased,
    "leaf-grads": lambda m: all(p.grad is None or p.grad.grad_fn is None for p in m.parameters()),
    "parameter": lambda m: any(True for _ in m.parameters()),
    "tie": lambda m: bool(slot_ties(m)),
    "swappable": lambda m: not swap_refused(m),
    "parametrizable": lambda m: any(parametrize.is_parametrized(x) for x in m.modules()),
}


# the documented exceptions ("a tree with no leaf that can take the feature is drawn as it is"),
# kept out: a tree with no tensor cannot alias, nor one whose training forward rebinds a tied
# buffer; a parameter tied or decorated keeps no grad
NEED_OPTIONS = {"alias": {"needs": ("tensor", "alias"), "behaviours": ("inplace", "raise", "report")},
                "tie": {"needs": ("tie",), "behaviours": ("inplace", "raise", "report")},
                "grad": {"needs": ("grad",), "decoration_chance": 0, "ties": False},
                # catalogue leaves and training often enough to meet the RNNs and create_graph
                "swappable": {"needs": ("swappable",), "catalogue_chance": 40,
                              "training_chance": 60},
                # checked where every tree is decorated with parametrizations (FC-PARAMETRIZED)
                "parametrizable": {"needs": ("parametrizable",), "decoration_chance": 100,
                                   "decoration_kinds": PARAMETRIZATIONS, "behaviours": ()}}


@pytest.mark.parametrize("need", sorted(NEED_CHECKS))
@SETTINGS
@given(data=st.data())
def test_needs_give_every_tree_the_feature(need: str, data: st.DataObject) -> None:
    options = NEED_OPTIONS.get(need, {"needs": (need,)})
    module = data.draw(module_trees(lazy=False, **options))
    assert NEED_CHECKS[need](module), f"a tree drawn with {options} lacks {need!r}"


def test_a_full_block_root_gets_the_needed_leaf_beside_it() -> None:
    """A custom block root whose children are all taken, none of which can take a None slot,
    goes into a Sequential beside the added leaf (a random run once drew such a tree without
    it)."""
    full = ContainerSpec("Block", (LeafSpec(kind="BatchNorm1d"),) * len(BLOCK_NAMES))
    root = with_none_slot(full)
    assert isinstance(root, ContainerSpec) and root.kind == "Sequential"
    assert root.children[0] == full
    assert _has_none_slot(build_tree(TreeSpec(root=root)))


# trees that often meet swap refusals (RNN catalogue leaves, create_graph training)
REFUSING_TREES = {"catalogue_chance": 40, "training_chance": 60}


@pytest.mark.parametrize("outcome", ["succeeds", "fails"])
@SETTINGS
@given(data=st.data())
def test_state_dicts_outcome_holds_by_construction(outcome: str, data: st.DataObject) -> None:
    """``outcome='succeeds'`` draws loads the spec accepts, ``'fails'`` loads it refuses (by
    ``key_model``, the LOAD- properties' own model)."""
    module = data.draw(module_trees(**REFUSING_TREES))
    load = data.draw(state_dicts(module, invalid=outcome == "fails", outcome=outcome))
    if outcome == "succeeds":
        assert load_succeeds(module, load), load
    else:
        assert key_model(module, load.state_dict).fails(load.strict), load


@SETTINGS
@given(data=st.data())
def test_state_dicts_not_refusable_never_swaps_a_refused_module(data: st.DataObject) -> None:
    module = data.draw(module_trees(**REFUSING_TREES))
    load = data.draw(state_dicts(module, refusable=False))
    assert not (load.swap and swap_refused(module))


def test_state_dicts_rejects_contradicting_options() -> None:
    module = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="invalid=False"):
        state_dicts(module, outcome="succeeds")
    with pytest.raises(ValueError, match="outcome"):
        state_dicts(module, outcome="sometimes")


def test_data_parallel_is_drawn_only_without_an_accelerator(monkeypatch) -> None:
    """Rule: ``nn.DataParallel`` moves its module to the first accelerator at construction, so the
    ``data-parallel`` wrapper is drawn only where torch's own check finds none."""
    import importlib

    from swapspec.strategies.trees import WRAPPERS, usable_wrappers

    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")
    monkeypatch.setattr(data_parallel, "_get_available_device_type", lambda: None)
    assert usable_wrappers() == WRAPPERS
    monkeypatch.setattr(data_parallel, "_get_available_device_type", lambda: "cuda")
    assert usable_wrappers() == ("compiled",)


def test_bad_calls_give_a_lazy_modules_uninitialized_tensor_a_value_where_there_is_one() -> None:
    module = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2))
    call = find(call_inputs(module, invalid=True, invalid_chance=100, valid=True),
                lambda c: c.invalid == "uninitialized-value", settings=settings(database=None))
    given = call.tensors if isinstance(call.tensors, dict) else call.tensors[0]
    assert {"1.weight", "1.bias"} & set(given), given
    module(torch.ones(1, 2))  # initialized: no name is left to draw for that kind
    with pytest.raises(NoSuchExample):
        find(call_inputs(module, invalid=True, invalid_chance=100),
             lambda c: c.invalid == "uninitialized-value", settings=settings(database=None, max_examples=200))


@given(data=st.data())
def test_a_tree_that_ties_a_running_statistic_is_never_trained(data):
    root = LeafSpec(kind="catalogue", entry="nn.BatchNorm2d")
    stat = data.draw(st.sampled_from(["running_mean", "running_var"]))
    tie = TieSpec(slots=(("0.inner", stat), ("1.inner", stat)))
    assert draw_trained(data.draw, root, 100, ties=(tie,)) == ""
    other = TieSpec(slots=(("0.inner", "weight"), ("0.inner", "bias")))
    assert draw_trained(data.draw, root, 100, ties=(other,)) != ""


@given(data=st.data())
def test_a_tree_whose_forward_must_allow_a_backward_and_ties_a_running_statistic_is_in_eval_mode(data):
    stat = data.draw(st.sampled_from(["running_mean", "running_var"]))
    tie = TieSpec(slots=(("0.inner", stat), ("1.inner", "running_mean")))
    assert draw_training(data.draw, (tie,), backward=True) is False
    other = TieSpec(slots=(("0.inner", "weight"), ("0.inner", "bias")))
    assert any(draw_training(data.draw, (other,), backward=True) for _ in range(40))
    assert any(draw_training(data.draw, (tie,), backward=False) for _ in range(40))


def test_a_batch_norm_and_an_instance_norm_sharing_running_mean_cannot_train():
    """Why the ties above are never trained, nor drawn in training mode where a backward must
    run: torch's backward refuses them."""
    bn = nn.BatchNorm1d(3)
    norm = nn.InstanceNorm1d(3, track_running_stats=True)
    norm.running_mean = bn.running_mean
    x = torch.ones(4, 3, requires_grad=True) * torch.arange(4.0).reshape(4, 1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        norm(bn(x).unsqueeze(-1).expand(4, 3, 5)).sum().backward()


def test_a_parameter_may_be_tied_into_a_generic_buffer_slot_only():
    """Rule: a tie joins slots of one kind, but a parameter may join a generic leaf's buffer
    slot (one tensor registered as a parameter and as a buffer); a buffer never joins a
    parameter slot, and a rigid buffer slot (BatchNorm's running stats) takes only a buffer of
    its shape and dtype."""
    from swapspec.strategies.tree_spec import Slot

    param = Slot("a", "p0", False, (4,), "float32", True)
    generic_buffer = Slot("b", "b0", True, (4,), "float32", True)
    running_mean = Slot("c", "running_mean", True, (4,), "float32", False)
    assert compatible(param, generic_buffer)
    assert not compatible(generic_buffer, param)
    assert not compatible(param, running_mean)
    assert compatible(generic_buffer, running_mean) and compatible(running_mean, generic_buffer)
