"""Unit tests for the reference on decorated and trained modules.

* ``reference.apply`` rule 11: a parameter's tensor hooks (``register_hook``,
  ``register_post_accumulate_grad_hook``) fire after a conversion on every path, exactly once
  per backward; hooks registered after it fire too; their handles still remove them.
* ``reference.apply`` rule 12: a grad that carries an autograd graph keeps ``requires_grad``;
  when its graph holds the parameter the swap is refused, rolled back, and the error notes it.
* ``reference.overrides`` rule 5: old-style reparametrizations (``torch.nn.utils.weight_norm``,
  ``spectral_norm``, ``prune``) have their computed attribute computed again after a conversion.
* ``reference.functional_call`` rule 6: a parametrized attribute given under its own name reads
  the given value itself; ``parametrizations.<name>.original`` is the parametrization's input.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections import Counter
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize, prune
from torch.nn.utils.spectral_norm import SpectralNorm

from swapspec import reference
from tests.helpers_modules import (
    Boom,
    assert_unchanged,
    fill_grads,
    flag_settings,
    linear,
    randn,
    snapshot,
    torch_swap_flag_set,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Using backward\\(\\) with create_graph=True:UserWarning"
)
X = randn(2, 3, seed=40)  # an input for every Linear(3, n) below


def double(t: torch.Tensor) -> torch.Tensor:
    return t.double()


def seeded(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` under a forked, seeded global RNG: torch's own RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()


class Refused(Exception):
    pass


def raising_on(k: int, fn: Callable[[torch.Tensor], torch.Tensor]):
    """``fn`` that raises ``Refused`` on its k-th call (0-based); ``calls`` counts the others."""
    calls = []

    def wrapped(t):
        if len(calls) == k:
            raise Refused(f"tensor {k}")
        calls.append(t)
        return fn(t)

    return wrapped, calls


def test_seeded_leaves_the_global_rng_alone():
    """(setup) building under ``seeded`` neither reads nor advances the global RNG."""
    state = torch.get_rng_state()
    seeded(lambda: torch.nn.utils.spectral_norm(nn.Linear(3, 4)))
    assert torch.equal(torch.get_rng_state(), state)


# ---------------------------------------------------------------------------
# apply rule 11: tensor hooks


HOOKS = ("hook:weight", "post:weight", "hook:bias", "post:bias")


def counting(counts: Counter, key: str) -> Callable[[torch.Tensor], None]:
    """A hook that counts its firings under ``key`` and changes nothing (returns None)."""

    def hook(_: torch.Tensor) -> None:
        counts[key] += 1

    return hook


def hooked_linear():
    """A Linear whose weight and bias both have a counting ``register_hook`` and
    ``register_post_accumulate_grad_hook`` hook; also returns the counts and the handles."""
    lin = linear(3, 4, seed=41)
    counts: Counter = Counter()
    handles = {}
    for name, p in lin.named_parameters():
        handles[f"hook:{name}"] = p.register_hook(counting(counts, f"hook:{name}"))
        handles[f"post:{name}"] = p.register_post_accumulate_grad_hook(
            counting(counts, f"post:{name}"))
    return lin, counts, handles


def backward(module: nn.Module, dtype: torch.dtype) -> None:
    module(X.to(dtype)).sum().backward()


@flag_settings
def test_tensor_hooks_fire_once_per_backward_after_conversion(overwrite, swap):
    """Rule 11: both kinds of hooks fire after the conversion, on every path, once per backward."""
    lin, counts, _ = hooked_linear()
    weight = lin.weight
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    assert (lin.weight is weight) == (swap or not overwrite)  # overwrite path: a new parameter
    assert lin.weight.dtype == torch.float64
    assert counts == {}
    backward(lin, torch.float64)
    assert counts == dict.fromkeys(HOOKS, 1)
    backward(lin, torch.float64)
    assert counts == dict.fromkeys(HOOKS, 2)


@flag_settings
def test_tensor_hooks_fire_once_after_two_conversions(overwrite, swap):
    """Rule 11: converting twice neither loses nor doubles the hooks."""
    lin, counts, _ = hooked_linear()
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    reference.apply(lin, lambda t: t.float(), overwrite=overwrite, swap=swap)
    backward(lin, torch.float32)
    assert counts == dict.fromkeys(HOOKS, 1)


@flag_settings
@pytest.mark.parametrize("hooked_before", [True, False], ids=["had-hooks", "no-hooks"])
def test_hook_registered_after_conversion_fires_once(overwrite, swap, hooked_before):
    """Rule 11: a hook registered after the conversion fires (after a swap too), next to any
    registered before it."""
    lin = linear(3, 4, seed=41)
    counts: Counter = Counter()
    if hooked_before:
        lin.weight.register_hook(counting(counts, "hook:before"))
        lin.weight.register_post_accumulate_grad_hook(counting(counts, "post:before"))
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    lin.weight.register_hook(counting(counts, "hook:after"))
    lin.weight.register_post_accumulate_grad_hook(counting(counts, "post:after"))
    backward(lin, torch.float64)
    expected = {"hook:after": 1, "post:after": 1}
    if hooked_before:
        expected |= {"hook:before": 1, "post:before": 1}
    assert counts == expected


@flag_settings
@pytest.mark.parametrize("removed", HOOKS)
def test_hook_removed_through_its_handle_after_conversion_stops_firing(overwrite, swap, removed):
    """Rule 11: the handle ``register_hook`` returned before the conversion still removes it."""
    lin, counts, handles = hooked_linear()
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    handles[removed].remove()
    backward(lin, torch.float64)
    assert counts == {key: 1 for key in HOOKS if key != removed}


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("with_grads", [False, True], ids=["no-grads", "grads"])
def test_tensor_hooks_fire_once_after_refused_swap(overwrite, with_grads):
    """Rules 4 and 11: after a swap refused mid-way (a weakref on the bias) and rolled back,
    the hooks of the restored parameters fire exactly once."""
    lin, counts, _ = hooked_linear()
    if with_grads:
        fill_grads(lin)
    bias = lin.bias
    before = snapshot(lin)
    held = weakref.ref(bias)
    with pytest.raises(RuntimeError, match=r"^_apply\(\): Couldn't swap Linear\.bias$"):
        reference.apply(lin, double, overwrite=overwrite, swap=True)
    assert_unchanged(before, lin)
    assert held() is lin.bias
    backward(lin, torch.float32)
    assert counts == dict.fromkeys(HOOKS, 1)


# ---------------------------------------------------------------------------
# apply rule 12: grads that carry an autograd graph


GRAPH_NOTE = ("weight's grad carries an autograd graph (backward(create_graph=True)) that can "
              "hold the parameter; clear or detach the grads first")


def conv_with_graph_grads() -> nn.Conv1d:
    """A Conv1d after ``backward(create_graph=True)``: its weight grad's graph holds the weight."""
    conv = seeded(lambda: nn.Conv1d(2, 3, 2))
    conv(randn(1, 2, 5, seed=42)).pow(2).sum().backward(create_graph=True)
    return conv


@pytest.mark.parametrize("overwrite", [False, True])
def test_swap_refused_by_a_grad_graph_notes_it_and_rolls_back(overwrite):
    """Rules 4 and 12: the weight's swap is refused; the error notes the graph; nothing changed."""
    conv = conv_with_graph_grads()
    assert conv.weight.grad.grad_fn is not None  # (setup) the grad carries a graph
    before = snapshot(conv)
    with pytest.raises(RuntimeError) as info:
        reference.apply(conv, double, overwrite=overwrite, swap=True)
    assert str(info.value) == "_apply(): Couldn't swap Conv1d.weight"
    assert info.value.__notes__ == [GRAPH_NOTE]
    assert_unchanged(before, conv)
    assert conv.weight.grad.grad_fn is not None


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("grads", ["none", "leaf"])
def test_refused_swap_without_a_grad_graph_has_no_note(overwrite, grads):
    """Rule 12: a refused parameter without a grad, or with a leaf grad, gets no note."""
    lin = linear()
    if grads == "leaf":
        fill_grads(lin)
    held = weakref.ref(lin.weight)
    with pytest.raises(RuntimeError) as info:
        reference.apply(lin, double, overwrite=overwrite, swap=True)
    assert str(info.value) == "_apply(): Couldn't swap Linear.weight"
    assert not hasattr(info.value, "__notes__")
    assert held() is lin.weight


@pytest.mark.parametrize("overwrite", [False, True])
def test_swaps_are_checked_before_any_so_a_refusal_leaves_backward_usable(overwrite):
    """Rule 13: after ``backward(create_graph=True)`` through two layers, ``1.weight`` is held by
    ``0.weight``'s grad graph and is refused, while ``0.weight`` alone could be swapped. Nothing
    is swapped, so while the error (and through its traceback the old grads' graphs) is still
    held, the next backward runs and fills every grad."""
    module = seeded(lambda: nn.Sequential(linear(), linear()))
    module(X).pow(2).sum().backward(create_graph=True)
    impls = {name: p._cdata for name, p in module.named_parameters()}
    before = snapshot(module)
    with pytest.raises(RuntimeError) as info:
        reference.apply(module, double, overwrite=overwrite, swap=True)
    assert str(info.value) == "_apply(): Couldn't swap Linear.weight"
    assert "references" in str(info.value.__cause__)
    assert {name: p._cdata for name, p in module.named_parameters()} == impls
    assert_unchanged(before, module)
    module.zero_grad(set_to_none=True)
    module(X).sum().backward()  # raises if a swap marked an AccumulateGrad node unusable
    assert all(p.grad is not None for p in module.parameters())
    assert info.value is not None  # the error was held until here


def _held(count: int) -> str:
    return (f"the TensorImpl has {count} references, more than its object and its "
            "AccumulateGrad node; something else holds it (a view, a saved tensor)")


def _viewed_under_no_grad(p: nn.Parameter) -> list[object]:
    with torch.no_grad():
        return [p[:1]]  # the view holds p's TensorImpl as its base; no AccumulateGrad node yet


# Ways a parameter's TensorImpl can be held, each returning what holds it; the reason the
# reference gives for refusing the swap (None: no refusal), counting the object's own reference.
HOLDERS = {
    "nothing": (lambda p: [], None),
    "a weakref": (lambda p: [weakref.ref(p)], "the tensor has a weakref associated with it"),
    "its AccumulateGrad node": (lambda p: [p * 2], None),
    "a view": (lambda p: [p[:1]], _held(3)),  # the view's base, and the node its graph holds
    "a saved tensor": (lambda p: [p * p], _held(4)),  # saved twice, beside the node
    "a view under no_grad": (_viewed_under_no_grad, _held(2)),
    "a view of a frozen parameter": (lambda p: [p.requires_grad_(False)[:1]], _held(2)),
}


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_swap_check_agrees_with_torchs_swap(holder):
    """Rule 13: the check before the swaps refuses exactly the parameters whose swap torch's
    ``_apply`` refuses, and its cause says what holds the TensorImpl."""
    hold, reason = HOLDERS[holder]
    results = {}
    for name, run in (("reference", lambda m: reference.apply(m, double, swap=True)),
                      ("torch", lambda m: m._apply(double))):
        module = nn.Module()
        module.p = nn.Parameter(randn(3, seed=44))
        held = hold(module.p)
        try:
            with torch_swap_flag_set():
                run(module)
            results[name] = None
        except RuntimeError as error:
            assert str(error) == "_apply(): Couldn't swap Module.p", f"{name}: {error}"
            results[name] = str(error.__cause__) if name == "reference" else "refused"
        del held
    assert results["reference"] == reason, f"the reference's cause for {holder}"
    assert (results["torch"] is None) == (reason is None), f"torch's outcome for {holder}"



@pytest.mark.parametrize("viewed", [False, True], ids=["alone", "viewed"])
def test_swap_check_agrees_with_torch_on_a_grad_carrying_a_graph(viewed):
    """Rule 13: a grad that carries a graph (not a leaf, so no AccumulateGrad node of its own) is
    swapped while its object alone holds it, and refused, as torch refuses it, once a view does."""
    outcomes = {}
    for name, run in (("reference", lambda m: reference.apply(m, double, swap=True)),
                      ("torch", lambda m: m._apply(double))):
        module = nn.Module()
        module.p = nn.Parameter(randn(3, seed=45))
        module.p.grad = randn(3, seed=46).requires_grad_() * 2  # its graph does not hold p
        with torch.no_grad():
            held = [module.p.grad[:1]] if viewed else []
        try:
            with torch_swap_flag_set():
                run(module)
            outcomes[name] = "swapped"
        except RuntimeError as error:
            assert str(error) == "_apply(): Couldn't swap Module.p.grad", f"{name}: {error}"
            outcomes[name] = str(error.__cause__) if name == "reference" else "refused"
        del held
    assert outcomes["torch"] == ("refused" if viewed else "swapped")
    assert outcomes["reference"] == (_held(2) if viewed else "swapped")

@pytest.mark.parametrize("overwrite", [False, True], ids=["set_data", "overwrite"])
def test_grad_carrying_a_graph_keeps_requires_grad(overwrite):
    """Rule 12: off the swap path, a graph-carrying grad is converted and keeps requires_grad."""
    conv = conv_with_graph_grads()
    reference.apply(conv, double, overwrite=overwrite, swap=False)
    for p in conv.parameters():
        assert p.dtype == p.grad.dtype == torch.float64
        assert p.grad.requires_grad


# ---------------------------------------------------------------------------
# overrides rule 5: old-style reparametrizations


def old_weight_norm() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated for the parametrization
        return torch.nn.utils.weight_norm(linear(3, 4, seed=43))


def old_spectral_norm() -> nn.Module:
    return seeded(lambda: torch.nn.utils.spectral_norm(linear(3, 4, seed=44)))


def pruned() -> nn.Module:
    return prune.l1_unstructured(linear(3, 4, seed=45), "weight", amount=0.5)


def pruned_twice() -> nn.Module:
    """Two prunings of one tensor: a ``PruningContainer`` hook."""
    m = prune.l1_unstructured(pruned(), "weight", amount=0.25)
    assert isinstance(next(iter(m._forward_pre_hooks.values())), prune.PruningContainer)
    return m


OLD_STYLE = {
    "weight_norm": old_weight_norm,
    "spectral_norm": old_spectral_norm,
    "prune": pruned,
    "prune-twice": pruned_twice,
}
N_OLD_STYLE_TENSORS = {"weight_norm": 3, "spectral_norm": 4, "prune": 3, "prune-twice": 3}


def computed_weight(m: nn.Module) -> torch.Tensor:
    """What the module's forward pre-hook computes (without a power iteration), from scratch."""
    if "weight_g" in m._parameters:
        return torch._weight_norm(m.weight_v, m.weight_g, 0)
    if "weight_u" in m._buffers:
        return m.weight_orig / torch.dot(m.weight_u, torch.mv(m.weight_orig, m.weight_v))
    return m.weight_mask * m.weight_orig


@pytest.mark.parametrize("kind", OLD_STYLE)
def test_old_style_modules_hold_their_tensor_count(kind):
    """(setup) the distinct parameters and buffers, which the failure test below ranges over."""
    m = OLD_STYLE[kind]()
    assert len({id(t) for t in [*m.parameters(), *m.buffers()]}) == N_OLD_STYLE_TENSORS[kind]


@flag_settings
@pytest.mark.parametrize("kind", OLD_STYLE)
def test_old_style_attribute_is_computed_again_after_conversion(kind, overwrite, swap):
    """Rule 5: the computed attribute has the converted dtype, is what the hook computes from
    the converted tensors, and no power iteration ran; forward works."""
    m = OLD_STYLE[kind]()
    buffers = {name: b.clone() for name, b in m.named_buffers()}
    reference.apply(m, double, overwrite=overwrite, swap=swap)
    assert "weight" in m.__dict__
    assert m.weight.dtype == torch.float64
    assert m.weight.requires_grad
    assert torch.equal(m.weight, computed_weight(m))
    for name, b in buffers.items():  # the power-iteration vectors were not advanced
        assert torch.equal(m.get_buffer(name), b.double())
    out = m(X.double())
    assert torch.equal(out, F.linear(X.double(), m.weight, m.bias))
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("kind", OLD_STYLE)
def test_old_style_attribute_after_conversion_matches_the_hooks_own_computation(kind):
    """Rule 5: the attribute equals what the module's forward pre-hook itself computes."""
    m = OLD_STYLE[kind]()
    reference.apply(m, double)
    hook = next(iter(m._forward_pre_hooks.values()))
    if isinstance(hook, SpectralNorm):
        expected = hook.compute_weight(m, do_power_iteration=False)
    elif isinstance(hook, prune.BasePruningMethod):
        expected = hook.apply_mask(m)
    else:
        expected = hook.compute_weight(m)
    assert torch.equal(m.weight, expected)


@pytest.mark.parametrize("overwrite", [False, True])
def test_torch_refuses_old_weight_norm_on_the_swap_path(overwrite):
    """(torch) ``_apply`` with the swap flag raises on the old weight_norm; the reference converts it."""
    saved = (torch.__future__.get_overwrite_module_params_on_conversion(),
             torch.__future__.get_swap_module_params_on_conversion())
    m = old_weight_norm()
    try:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
        torch.__future__.set_swap_module_params_on_conversion(True)
        with pytest.raises(RuntimeError, match=r"^_apply\(\): Couldn't swap Linear\.weight_g$"):
            m.double()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(saved[0])
        torch.__future__.set_swap_module_params_on_conversion(saved[1])
    twin = old_weight_norm()
    reference.apply(twin, double, overwrite=overwrite, swap=True)
    assert torch.equal(twin.weight, computed_weight(twin))


@flag_settings
def test_old_style_attribute_left_absent_when_it_cannot_be_computed(overwrite, swap):
    """Rule 5: a conversion to sparse tensors succeeds; the weight-norm attribute stays absent."""
    m = old_weight_norm()
    reference.apply(m, lambda t: t.to_sparse(), overwrite=overwrite, swap=swap)
    assert "weight" not in m.__dict__
    assert m.weight_g.layout == m.weight_v.layout == torch.sparse_coo


@flag_settings
def test_old_style_attribute_computed_again_after_it_was_left_absent(overwrite, swap):
    """Rule 5: an absent attribute is no obstacle: the next conversion computes it again."""
    m = old_weight_norm()
    reference.apply(m, lambda t: t.to_sparse(), overwrite=overwrite, swap=swap)
    reference.apply(m, lambda t: t.to_dense(), overwrite=overwrite, swap=swap)
    assert "weight" in m.__dict__
    assert torch.equal(m.weight, computed_weight(m))


@flag_settings
@pytest.mark.parametrize("forwarded", [False, True], ids=["fresh", "forwarded"])
@pytest.mark.parametrize(("kind", "k"), [(kind, k) for kind, n in N_OLD_STYLE_TENSORS.items()
                                         for k in range(n)])
def test_fn_raising_leaves_old_style_module_and_attribute_untouched(kind, k, forwarded, overwrite,
                                                                    swap):
    """Rules 4 and 5: ``fn`` raising on the k-th tensor leaves every slot as it was, and the
    computed attribute present with its value (fresh or computed by a forward)."""
    m = OLD_STYLE[kind]()
    if forwarded:
        m(X)
    value = m.weight.detach().clone()
    before = snapshot(m)
    fn, calls = raising_on(k, double)
    with pytest.raises(Refused):
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert len(calls) == k
    assert_unchanged(before, m)
    assert "weight" in m.__dict__
    assert m.weight.dtype == torch.float32
    assert torch.equal(m.weight, value)


@flag_settings
def test_fn_raising_puts_back_a_graphless_attribute_itself(overwrite, swap):
    """Rule 5: before its first forward, a spectral norm's attribute is the raw weight (no graph,
    not what the hook computes); a failed conversion puts back that very object."""
    m = old_spectral_norm()
    weight = m.weight
    assert weight.grad_fn is None  # (setup)
    assert not torch.equal(weight, computed_weight(m))  # (setup)
    fn, _ = raising_on(N_OLD_STYLE_TENSORS["spectral_norm"] - 1, double)
    with pytest.raises(Refused):
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert m.weight is weight


@flag_settings
def test_fn_raising_computes_a_graph_carrying_attribute_again(overwrite, swap):
    """Rule 5: an attribute that carries a graph (weight norm's) is not kept through a failed
    conversion (its graph would block the swap): it is computed again from the restored tensors."""
    m = old_weight_norm()
    weight = m.weight
    assert weight.grad_fn is not None  # (setup)
    fn, _ = raising_on(N_OLD_STYLE_TENSORS["weight_norm"] - 1, double)
    with pytest.raises(Refused):
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert m.weight is not weight
    assert torch.equal(m.weight, weight)
    assert m.weight.grad_fn is not None


# ---------------------------------------------------------------------------
# functional_call rule 6: parametrized attributes


class Double(nn.Module):
    """A parametrization without ``right_inverse``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


class Negate(nn.Module):
    """A parametrization with ``right_inverse``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -x

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        return -x


PARAMETRIZE = {
    "custom": lambda m: parametrize.register_parametrization(m, "weight", Double()),
    "custom-inverse": lambda m: parametrize.register_parametrization(m, "weight", Negate()),
    "weight_norm": parametrizations.weight_norm,
    "spectral_norm": parametrizations.spectral_norm,
    "orthogonal": parametrizations.orthogonal,
}
ORIGINAL = "parametrizations.weight.original"


def parametrized(kind: str) -> nn.Linear:
    lin = linear(3, 3, seed=46)
    seeded(lambda: PARAMETRIZE[kind](lin))
    return lin


def record_reads(module: nn.Module) -> dict[str, object]:
    """A forward pre-hook (returning None) that records ``weight`` and ``named_parameters()``."""
    seen: dict[str, object] = {}

    def hook(mod: nn.Module, args: tuple) -> None:
        seen["weight"] = mod.weight
        seen["parameters"] = dict(mod.named_parameters())
        seen["extra"] = getattr(mod, "extra", None)

    module.register_forward_pre_hook(hook)
    return seen


def assert_read_given(seen: dict[str, object], v: torch.Tensor, bias: torch.Tensor) -> None:
    assert seen["weight"] is v
    assert list(seen["parameters"]) == ["bias", ORIGINAL]
    assert seen["parameters"]["bias"] is bias
    assert seen["parameters"][ORIGINAL] is v


parametrization_kinds = pytest.mark.parametrize("kind", PARAMETRIZE)


@parametrization_kinds
def test_parametrized_attribute_given_by_its_name_is_read_as_given(kind):
    """Rule 6: forward reads the given tensor itself, shown as ``parametrizations.weight.original``;
    rule 7: afterwards the same ParametrizationList, originals and buffers, unchanged."""
    m = parametrized(kind)
    plist = m.parametrizations.weight
    seen = record_reads(m)
    before = snapshot(m)
    v = randn(3, 3, seed=47)
    given = {"weight": v}
    out = reference.functional_call(m, given, (X,))
    assert_read_given(seen, v, m.bias)
    assert torch.equal(out, F.linear(X, v, m.bias))
    assert m.parametrizations.weight is plist
    assert_unchanged(before, m)
    assert list(given) == ["weight"]
    assert given["weight"] is v


@parametrization_kinds
def test_parametrized_attribute_given_none_is_read_as_none(kind):
    """Rule 6: ``None`` under the attribute's name: forward reads None (Linear then raises)."""
    m = parametrized(kind)
    plist = m.parametrizations.weight
    seen = record_reads(m)
    before = snapshot(m)
    given = {"weight": None}
    with pytest.raises(TypeError, match="must be Tensor, not NoneType"):
        reference.functional_call(m, given, (X,))
    assert seen["weight"] is None
    assert list(seen["parameters"]) == ["bias"]
    assert m.parametrizations.weight is plist
    assert_unchanged(before, m)
    assert given == {"weight": None}


@parametrization_kinds
def test_parametrization_original_given_is_the_parametrizations_input(kind):
    """Rule 6: values under ``parametrizations.weight.original*`` go through the parametrization."""
    m = parametrized(kind)
    twin = copy.deepcopy(m)
    plist = m.parametrizations.weight
    originals = dict(plist.named_parameters())
    values = {name: o.detach().clone() for name, o in originals.items()}
    given = {f"parametrizations.weight.{name}": randn(*o.shape, seed=48 + i)
             for i, (name, o) in enumerate(originals.items())}
    with torch.no_grad():
        for name, o in twin.parametrizations.weight.named_parameters():
            o.copy_(given[f"parametrizations.weight.{name}"])
    expected = twin.weight
    seen = record_reads(m)
    reference.functional_call(m, given, (X,))
    assert torch.equal(seen["weight"], expected)
    assert not torch.equal(seen["weight"], m.weight)
    assert m.parametrizations.weight is plist
    assert dict(plist.named_parameters()) == originals
    for name, o in plist.named_parameters():
        assert torch.equal(o, values[name])


@parametrization_kinds
def test_parametrized_attribute_of_a_nested_module_given_by_dotted_name(kind):
    """Rules 6 and 7 through a dotted name: ``0.weight`` of an ``nn.Sequential``."""
    inner = parametrized(kind)
    outer = nn.Sequential(inner)
    seen = record_reads(inner)
    before = snapshot(outer)
    v = randn(3, 3, seed=49)
    out = reference.functional_call(outer, {"0.weight": v}, (X,))
    assert_read_given(seen, v, inner.bias)
    assert torch.equal(out, F.linear(X, v, inner.bias))
    assert_unchanged(before, outer)


@parametrization_kinds
def test_parametrized_attribute_restored_when_forward_raises(kind):
    """Rule 7: forward raising still puts the ParametrizationList back."""
    m = parametrized(kind)
    plist = m.parametrizations.weight
    seen = record_reads(m)

    def boom(mod, args):
        raise Boom("forward failed")

    m.register_forward_pre_hook(boom)
    before = snapshot(m)
    v = randn(3, 3, seed=50)
    with pytest.raises(Boom):
        reference.functional_call(m, {"weight": v}, (X,))
    assert_read_given(seen, v, m.bias)
    assert m.parametrizations.weight is plist
    assert_unchanged(before, m)


def test_unknown_name_on_a_parametrized_module_is_a_temporary_attribute():
    """Rule 6: a name that is neither a slot nor parametrized stays a plain attribute for the
    call; the parametrization keeps working."""
    m = parametrized("custom")
    seen = record_reads(m)
    before = snapshot(m)
    extra = torch.ones(1)
    reference.functional_call(m, {"extra": extra}, (X,))
    assert seen["extra"] is extra
    assert torch.equal(seen["weight"], 2 * m.parametrizations.weight.original)
    assert "extra" not in m.__dict__
    assert_unchanged(before, m)


def test_non_tensor_attribute_of_a_parametrized_module_is_refused():
    """Rule 5: a parametrized module's non-tensor attribute cannot be given (torch's TypeError)."""
    m = parametrized("custom")
    m.foo = 1.5
    before = snapshot(m)
    with pytest.raises(TypeError, match=r"^attribute `foo`: 1\.5 is not an instance of torch\.Tensor$"):
        reference.functional_call(m, {"foo": torch.ones(1)}, (X,))
    assert_unchanged(before, m)
