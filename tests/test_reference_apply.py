"""Unit tests for ``reference.apply``: paths, ties, attributes, grads, buffers and atomicity."""

from __future__ import annotations

import weakref
from collections import Counter

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.two_tensor import TwoTensor

from swapspec import reference
from swapspec.reference.apply import put_grad
from tests.helpers_modules import (
    Nested,
    Shared,
    Tagged,
    TaggedParameter,
    Tied,
    WithNones,
    assert_unchanged,
    fill_grads,
    flag_settings,
    linear,
    snapshot,
)


@pytest.fixture(autouse=True)
def _restore_flags():
    """Leave the reference's and torch's conversion flags as each test found them."""
    saved = (
        reference.get_overwrite_module_params_on_conversion(),
        reference.get_swap_module_params_on_conversion(),
        torch.__future__.get_overwrite_module_params_on_conversion(),
        torch.__future__.get_swap_module_params_on_conversion(),
    )
    try:
        yield
    finally:
        reference.set_overwrite_module_params_on_conversion(saved[0])
        reference.set_swap_module_params_on_conversion(saved[1])
        torch.__future__.set_overwrite_module_params_on_conversion(saved[2])
        torch.__future__.set_swap_module_params_on_conversion(saved[3])


@pytest.fixture
def data_setter_calls(monkeypatch):
    """Record every ``tensor.data = ...`` (on ``Tensor`` and its Python subclasses)."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    base = torch._C.TensorBase.data

    def set_data(self, value):
        calls.append((self, value))
        base.__set__(self, value)

    monkeypatch.setattr(torch.Tensor, "data", property(base.__get__, set_data))
    return calls


def double(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def half(t: torch.Tensor) -> torch.Tensor:
    return t.half() if t.is_floating_point() else t


def path_taken(before: torch.Tensor, cdata: int, after: torch.Tensor) -> str:
    if after is not before:
        return "overwrite"
    return "set_data" if after._cdata == cdata else "swap"


EXPECTED_PATH = {
    (False, False): "set_data",
    (True, False): "overwrite",
    (False, True): "swap",
    (True, True): "swap",
}


# ---------------------------------------------------------------------------
# Rule 5: the path


@flag_settings
def test_dtype_change_path_follows_flags(overwrite, swap):
    """Rule 5: a compatible change takes swap (swap flag), set_data (no overwrite) or overwrite."""
    lin = linear()
    w, cdata = lin.weight, lin.weight._cdata
    value = w.detach().clone()
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    assert path_taken(w, cdata, lin.weight) == EXPECTED_PATH[overwrite, swap]
    assert lin.weight.dtype == torch.float64
    assert torch.equal(lin.weight.detach(), value.double())
    assert type(lin.weight) is nn.Parameter


@flag_settings
def test_traceable_wrapper_subclass_result_takes_swap(overwrite, swap):
    """Rule 5: ``fn(p)`` a traceable wrapper subclass (TwoTensor) means swap, whatever the flags."""
    lin = linear()
    w, cdata = lin.weight, lin.weight._cdata
    reference.apply(lin, lambda t: TwoTensor(t.clone(), t.clone()), overwrite=overwrite, swap=swap)
    assert lin.weight is w
    assert lin.weight._cdata != cdata
    assert type(lin.weight) is TwoTensor
    assert isinstance(lin.weight, nn.Parameter)


@flag_settings
@pytest.mark.parametrize(
    "fn", [lambda t: t.to("meta"), lambda t: t.to_sparse()], ids=["meta", "sparse"]
)
def test_tensorimpl_change_never_uses_set_data(overwrite, swap, fn, data_setter_calls):
    """Rule 5: a TensorImpl change never goes through ``.data =`` and succeeds on every setting."""
    lin = linear()
    lin.weight.grad = torch.ones(3, 3)
    w, cdata = lin.weight, lin.weight._cdata
    expected = fn(w.detach())
    reference.apply(lin, fn, overwrite=overwrite, swap=swap)
    assert data_setter_calls == []
    assert path_taken(w, cdata, lin.weight) == ("swap" if swap else "overwrite")
    assert lin.weight.device == expected.device
    assert lin.weight.layout == expected.layout
    assert lin.weight.grad.device == expected.device
    assert lin.weight.grad.layout == expected.layout


def test_set_data_detector_sees_compatible_change(data_setter_calls):
    """Rule 5: under default flags a dtype change goes through ``.data =`` (detector check)."""
    lin = linear()
    w = lin.weight
    reference.apply(lin, double, overwrite=False, swap=False)
    assert any(target is w for target, _ in data_setter_calls)


@pytest.mark.parametrize(
    ("applied", "overwrite", "swap", "path"),
    [
        (lambda t: t.double(), False, False, "set_data"),
        (lambda t: t.double(), True, False, "overwrite"),
        (lambda t: t.double(), True, True, "swap"),
        (lambda t: t.to("meta"), False, False, "overwrite"),
        (lambda t: t.to("meta"), False, True, "swap"),
        (lambda t: TwoTensor(t, t), False, False, "swap"),
        (lambda t: t.detach(), False, False, "set_data"),
        (lambda t: FakeTensorMode().from_tensor(t), False, False, "overwrite"),  # compatible type
    ],
)
def test_choose_path(applied, overwrite, swap, path):
    """Rule 5: ``choose_path`` on one parameter and its converted value."""
    p = nn.Parameter(torch.ones(2))
    assert reference.choose_path(p, applied(p.detach()), overwrite=overwrite, swap=swap) == path


def test_apply_returns_module():
    """apply returns the module it was given."""
    lin = linear()
    assert reference.apply(lin, double) is lin


# ---------------------------------------------------------------------------
# Rule 3: fn once per distinct tensor, ties kept


def _counting(fn):
    calls: Counter[int] = Counter()
    seen: list[torch.Tensor] = []

    def wrapped(t):
        calls[id(t)] += 1
        seen.append(t)
        return fn(t)

    return wrapped, calls, seen


@flag_settings
def test_fn_runs_once_per_distinct_tensor(overwrite, swap):
    """Rule 3: tied parameters, tied buffers, shared submodules and grads: one ``fn`` call each."""
    root = nn.Module()
    root.tied = Tied()
    root.shared = Shared()
    fill_grads(root)
    distinct = {id(t): t for t in [*root.parameters(), *root.buffers()]}
    distinct.update({id(p.grad): p.grad for p in root.parameters()})
    fn, calls, seen = _counting(double)
    reference.apply(root, fn, overwrite=overwrite, swap=swap)
    assert len(seen) == len(distinct) == 12
    assert set(calls) == set(distinct)
    assert set(calls.values()) == {1}


@flag_settings
def test_tied_parameters_and_buffers_stay_tied(overwrite, swap):
    """Rule 3: every slot that held one object holds one (converted) result."""
    m = Tied()
    fill_grads(m)
    reference.apply(m, double, overwrite=overwrite, swap=swap)
    assert m.enc.weight is m.dec.weight
    assert m.enc.scale is m.dec.scale
    assert m.enc.weight.dtype == m.enc.scale.dtype == torch.float64
    assert m.enc.weight.grad.dtype == torch.float64
    assert m.enc.bias is not m.dec.bias


@flag_settings
def test_shared_submodule_stays_shared(overwrite, swap):
    """Rules 2 and 3: a shared submodule is converted once and stays one object."""
    m = Shared()
    fn, calls, _ = _counting(double)
    reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert m.a is m.b
    assert m._modules["a"] is m._modules["b"]
    assert m.a.weight.dtype == m.b.bias.dtype == m.offset.dtype == torch.float64
    assert set(calls.values()) == {1}
    assert len(calls) == 3


def test_fn_runs_under_no_grad():
    """Rule 3: ``fn`` runs under ``torch.no_grad()``."""
    modes = []

    def fn(t):
        modes.append(torch.is_grad_enabled())
        return t * 2

    lin = linear()
    with torch.enable_grad():
        reference.apply(lin, fn)
    assert modes == [False, False]
    assert lin.weight.is_leaf


# ---------------------------------------------------------------------------
# Rule 6: class, attributes and requires_grad


@flag_settings
@pytest.mark.parametrize("fn", [double, lambda t: t.to("meta")], ids=["double", "meta"])
def test_parameter_subclass_and_attributes_survive(overwrite, swap, fn):
    """Rule 6: a ``Parameter`` subclass, its ``tag`` and ``requires_grad`` survive every path."""
    m = Tagged()
    reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert type(m.p) is TaggedParameter
    assert type(m.q) is TaggedParameter
    assert (m.p.tag, m.q.tag) == ("x", "y")
    assert m.p.requires_grad is True
    assert m.q.requires_grad is False
    assert m.p.dtype == fn(torch.ones(1)).dtype
    assert m.p.device == fn(torch.ones(1)).device


@flag_settings
def test_tensor_subclass_result_class_wins_but_attributes_survive(overwrite, swap):
    """Rule 6: if ``fn(p)`` is a tensor subclass its class wins; attributes and requires_grad stay."""
    m = Tagged()
    reference.apply(m, lambda t: TwoTensor(t.clone(), t.clone()), overwrite=overwrite, swap=swap)
    assert type(m.p) is TwoTensor
    assert m.p.tag == "x"
    assert m.p.requires_grad is True
    assert m.q.requires_grad is False


@flag_settings
def test_uninitialized_parameter_survives_half(overwrite, swap):
    """Rule 6: ``LazyLinear``'s ``UninitializedParameter`` keeps its class under a half()-style fn."""
    m = nn.LazyLinear(3)
    reference.apply(m, half, overwrite=overwrite, swap=swap)
    for p in (m.weight, m.bias):
        assert type(p) is nn.UninitializedParameter
        assert p.dtype == torch.float16
        assert p.requires_grad
    with torch.random.fork_rng():  # materializing draws from the global RNG
        m(torch.ones(2, 4, dtype=torch.float16))
    assert type(m.weight) is nn.Parameter
    assert m.weight.shape == (3, 4)
    assert m.weight.dtype == torch.float16


@flag_settings
def test_requires_grad_false_parameter_kept(overwrite, swap):
    """Rule 6: ``requires_grad=False`` survives every path."""
    lin = linear()
    lin.bias.requires_grad_(False)
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    assert lin.weight.requires_grad is True
    assert lin.bias.requires_grad is False


# ---------------------------------------------------------------------------
# Rule 7: grads


@flag_settings
@pytest.mark.parametrize("fn", [double, lambda t: t.to("meta")], ids=["double", "meta"])
def test_grads_converted_and_stay_leaves(overwrite, swap, fn):
    """Rule 7: grads are converted by ``fn``, stay leaves and keep their own requires_grad."""
    lin = linear()
    lin.weight.grad = torch.full((3, 3), 2.0, requires_grad=True)
    lin.bias.grad = torch.full((3,), 3.0)
    fn_counted, calls, _ = _counting(fn)
    grads = (lin.weight.grad, lin.bias.grad)
    reference.apply(lin, fn_counted, overwrite=overwrite, swap=swap)
    assert calls[id(grads[0])] == calls[id(grads[1])] == 1
    wg, bg = lin.weight.grad, lin.bias.grad
    expected = fn(torch.ones(1))
    for g in (wg, bg):
        assert g.is_leaf
        assert g.dtype == expected.dtype
        assert g.device == expected.device
    assert wg.requires_grad is True
    assert bg.requires_grad is False
    if expected.device.type != "meta":
        assert torch.equal(wg.detach(), torch.full((3, 3), 2.0, dtype=torch.float64))
        assert torch.equal(bg, torch.full((3,), 3.0, dtype=torch.float64))


@flag_settings
def test_grads_from_backward_follow_parameters(overwrite, swap):
    """Rule 7: grads accumulated by backward follow their parameters; a later backward still works."""
    lin = linear(2, 2)
    lin(torch.ones(1, 2)).sum().backward()
    expected = lin.weight.grad.double()
    reference.apply(lin, double, overwrite=overwrite, swap=swap)
    assert lin.weight.grad.dtype == torch.float64
    assert torch.equal(lin.weight.grad, expected)
    lin.zero_grad()
    lin(torch.ones(1, 2, dtype=torch.float64)).sum().backward()
    assert lin.weight.grad.dtype == torch.float64


# ---------------------------------------------------------------------------
# Rule 8 and rule 2: buffers, None slots, recurse


@flag_settings
def test_buffers_rebound_and_none_slots_stay_none(overwrite, swap):
    """Rule 8: buffers are rebound to ``fn(buf)``; None parameter and buffer slots stay None."""
    m = WithNones()
    results = {}

    def fn(t):
        results[id(t)] = out = double(t)
        return out

    buf, steps = m.buf, m.steps
    reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert m._buffers["buf"] is results[id(buf)]
    assert m.buf is not buf
    assert m.buf.dtype == torch.float64
    assert m._buffers["steps"] is steps  # fn returned its argument
    assert m._parameters["missing"] is None
    assert m._buffers["nobuf"] is None
    assert list(m._parameters) == ["weight", "missing"]
    assert list(m._buffers) == ["buf", "nobuf", "steps"]


@flag_settings
def test_recurse_false_touches_only_own_tensors(overwrite, swap):
    """Rule 2: ``recurse=False`` converts the module's own tensors only."""
    m = Nested()
    fill_grads(m)
    child_state = snapshot(m.child)
    fn, calls, _ = _counting(double)
    reference.apply(m, fn, overwrite=overwrite, swap=swap, recurse=False)
    assert_unchanged(child_state, m.child)
    assert m.own.dtype == m.own_buf.dtype == m.own.grad.dtype == torch.float64
    assert len(calls) == 3
    assert all(calls[id(t)] == 0 for t in [*m.child.parameters(), *m.child.buffers()])


@flag_settings
def test_recurse_true_touches_every_module(overwrite, swap):
    """Rule 2: the default converts every module of the tree."""
    m = Nested()
    reference.apply(m, double, overwrite=overwrite, swap=swap)
    assert {t.dtype for t in [*m.parameters(), *m.buffers()]} == {torch.float64}


# ---------------------------------------------------------------------------
# Rule 4: atomicity


class Refused(Exception):
    pass


def _module_for_atomicity() -> nn.Module:
    root = nn.Module()
    root.tied = Tied()
    root.shared = Shared()
    root.tagged = Tagged()
    fill_grads(root)
    root.tied.enc.weight.grad.requires_grad_(True)
    return root


N_TENSORS = 15  # distinct parameters, grads and buffers of ``_module_for_atomicity``


def test_atomicity_module_has_expected_tensor_count():
    """Rule 4: (setup) the atomicity module holds N_TENSORS distinct tensors."""
    fn, calls, _ = _counting(double)
    reference.apply(_module_for_atomicity(), fn)
    assert len(calls) == N_TENSORS


@flag_settings
@pytest.mark.parametrize("k", range(N_TENSORS))
def test_fn_raising_on_kth_tensor_leaves_module_untouched(overwrite, swap, k):
    """Rule 4: ``fn`` raising on the k-th tensor leaves every slot as it was; the error propagates."""
    m = _module_for_atomicity()
    before = snapshot(m)
    error = Refused(f"tensor {k}")
    count = 0

    def fn(t):
        nonlocal count
        if count == k:
            raise error
        count += 1
        return double(t)

    with pytest.raises(Refused) as info:
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert info.value is error
    assert count == k
    assert_unchanged(before, m)
    assert m.tied.enc.weight is m.tied.dec.weight
    assert m.shared.a is m.shared.b


@pytest.mark.parametrize("overwrite", [False, True])
def test_refused_swap_is_rolled_back(overwrite):
    """Rule 4: a swap refused while committing undoes the swaps already made (grads included)."""
    lin = linear()
    fill_grads(lin)
    before = snapshot(lin)
    ref = weakref.ref(lin.bias)  # a weakref makes swap_tensors refuse the bias
    with pytest.raises(RuntimeError, match=r"^_apply\(\): Couldn't swap Linear\.bias$") as info:
        reference.apply(lin, double, overwrite=overwrite, swap=True)
    assert "weakref" in str(info.value.__cause__)
    assert_unchanged(before, lin)
    assert ref() is lin.bias


@pytest.mark.parametrize("overwrite", [False, True])
def test_refused_grad_swap_is_rolled_back_with_torchs_message(overwrite):
    """Rules 4 and 7: a refused grad swap undoes its parameter's swap and names the grad as torch does."""
    lin, twin = linear(), linear()
    fill_grads(lin)
    fill_grads(twin)
    before = snapshot(lin)
    ref = weakref.ref(lin.weight.grad)
    twin_ref = weakref.ref(twin.weight.grad)
    with pytest.raises(RuntimeError) as info:
        reference.apply(lin, double, overwrite=overwrite, swap=True)
    torch.__future__.set_swap_module_params_on_conversion(True)
    with pytest.raises(RuntimeError) as torch_info:
        twin._apply(double)
    assert str(info.value) == str(torch_info.value) == "_apply(): Couldn't swap Linear.weight.grad"
    assert str(info.value.__cause__) == "the tensor has a weakref associated with it"  # rule 13
    assert_unchanged(before, lin)
    assert ref() is lin.weight.grad and twin_ref() is not None


@pytest.mark.parametrize("bias_result", ["refused", "integer"])
def test_failure_after_set_data_and_replaced_grad_restores_both(bias_result):
    """Rules 4 and 13: with paths mixed (the weight takes set_data, its sparse grad is replaced, the
    bias is swapped), a bias the check refuses changes nothing, and a bias that fails in its commit
    undoes the weight's set_data and its replaced grad."""
    lin = linear()
    lin.weight.grad = torch.ones(3, 3).to_sparse()  # its dense result is incompatible: replaced
    before = snapshot(lin)
    ref = weakref.ref(lin.bias) if bias_result == "refused" else None

    def fn(t):  # matrices and their grads: + 1, dense (set_data, replaced); vectors: TwoTensor (swap)
        if t.dim() == 1:
            value = t + 1 if bias_result == "refused" else (t + 1).long()  # no Parameter takes it
            return TwoTensor(value, value)
        return (t.to_dense() if t.is_sparse else t) + 1

    with pytest.raises(RuntimeError) as info:
        reference.apply(lin, fn, overwrite=False, swap=False)
    if bias_result == "refused":
        assert str(info.value) == "_apply(): Couldn't swap Linear.bias"
        assert str(info.value.__cause__) == "the tensor has a weakref associated with it"
        assert ref() is lin.bias
    else:
        assert "floating point dtype" in str(info.value)
    assert_unchanged(before, lin)
    assert lin.weight.grad.is_sparse


# The tensors of ``_module_for_atomicity`` that require grad, in commit order; an integer result
# for one of them fails its commit (neither ``Parameter``, ``.data =`` nor ``requires_grad_`` takes
# an integer tensor that requires grad).
REQUIRING_GRAD = ["tied.enc.weight", "tied.enc.weight.grad", "shared.a.bias", "tagged.p"]


def _tensor_named(module: nn.Module, name: str) -> torch.Tensor:
    if name.endswith(".grad"):
        return module.get_parameter(name.removesuffix(".grad")).grad
    return module.get_parameter(name)


@flag_settings
@pytest.mark.parametrize("failing", REQUIRING_GRAD)
def test_commit_failing_midway_is_rolled_back(overwrite, swap, failing):
    """Rule 4: a commit that fails at one tensor undoes every change made before it, on every
    path: swapped, ``.data =`` and rebound parameters, their grads and tied slots, and the tensor
    hooks carried by a swap; the error propagates unchanged."""
    m = _module_for_atomicity()
    fired = []
    m.tied.enc.weight.register_hook(lambda g: fired.append(g.dtype))
    target = _tensor_named(m, failing)
    before = snapshot(m)

    def fn(t):
        return t.long() if t is target else double(t)

    with pytest.raises(RuntimeError, match=r"(floating point|complex) dtype"):
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert_unchanged(before, m)
    assert m.tied.enc.weight is m.tied.dec.weight and m.shared.a is m.shared.b
    assert m.tied.enc.scale is m.tied.dec.scale
    m.tied(torch.ones(1, 3)).sum().backward()
    assert fired == [torch.float32], "the parameter's hook does not fire once after the rollback"


def _swap_tensors_refusing_call(k: int, monkeypatch) -> list[int]:
    """Make ``torch.utils.swap_tensors`` raise on its ``k``-th call (0-based), as for a refusal
    ``_check_swappable`` cannot foresee; return the list of calls made so far."""
    real = torch.utils.swap_tensors
    calls: list[int] = []

    def swap_tensors(t1, t2):
        calls.append(len(calls))
        if len(calls) - 1 == k:
            raise RuntimeError("refused by the test")
        real(t1, t2)

    monkeypatch.setattr(torch.utils, "swap_tensors", swap_tensors)
    return calls


SWAPS_OF_ATOMICITY_MODULE = 13  # 7 distinct parameters and the 6 grads of ``_module_for_atomicity``


def test_atomicity_module_makes_expected_swap_count(monkeypatch):
    """Rule 4: (setup) the swap path makes SWAPS_OF_ATOMICITY_MODULE calls to ``swap_tensors``."""
    calls = _swap_tensors_refusing_call(-1, monkeypatch)
    reference.apply(_module_for_atomicity(), double, swap=True)
    assert len(calls) == SWAPS_OF_ATOMICITY_MODULE


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("k", range(SWAPS_OF_ATOMICITY_MODULE))
def test_swap_refused_at_kth_call_is_rolled_back(overwrite, k, monkeypatch):
    """Rules 4 and 7: a swap that ``swap_tensors`` refuses only when it is made (the check before
    found nothing) undoes the swaps before it, puts the refused parameter's grad back, and names
    the parameter, or its grad, as torch does, with the refusal as the cause."""
    m = _module_for_atomicity()
    before = snapshot(m)
    calls = _swap_tensors_refusing_call(k, monkeypatch)
    with pytest.raises(RuntimeError, match=r"^_apply\(\): Couldn't swap \w+\.\w+(\.grad)?$") as info:
        reference.apply(m, double, overwrite=overwrite, swap=True)
    assert str(info.value.__cause__) == "refused by the test"
    assert len(calls) > k
    monkeypatch.undo()
    assert_unchanged(before, m)
    assert m.tied.enc.weight is m.tied.dec.weight and m.shared.a is m.shared.b



def test_swap_refused_when_made_notes_a_grad_graph(monkeypatch):
    """Rules 4 and 12: a parameter swap refused when it is made, whose grad carries an autograd
    graph, is rolled back (the grad put back) and its error notes the graph."""
    lin = linear()
    lin.weight.grad = torch.ones(3, 3, requires_grad=True) * 2  # a graph that does not hold weight
    before = snapshot(lin)
    _swap_tensors_refusing_call(0, monkeypatch)
    with pytest.raises(RuntimeError) as info:
        reference.apply(lin, double, swap=True)
    assert str(info.value) == "_apply(): Couldn't swap Linear.weight"
    assert any("carries an autograd graph" in note for note in info.value.__notes__)
    monkeypatch.undo()
    assert_unchanged(before, lin)

def test_grad_that_fn_returns_unchanged_is_not_swapped():
    """Rule 7: on the swap path a grad ``fn`` returns as it is stays, so a weakref to it is no obstacle."""
    lin = linear()
    fill_grads(lin)
    grad, cdata = lin.weight.grad, lin.weight.grad._cdata
    ref = weakref.ref(grad)
    reference.apply(lin, lambda t: t, swap=True)
    assert lin.weight.grad is grad and grad._cdata == cdata
    assert ref() is grad


@flag_settings
@pytest.mark.parametrize(("device", "dtype"), [("meta", torch.float32), ("cpu", torch.float64)])
def test_uninitialized_parameter_fn_returns_unchanged_keeps_device_and_dtype(overwrite, swap, device,
                                                                             dtype):
    """Rule 6: an ``UninitializedParameter`` that ``fn`` returns as it is keeps class, device and dtype."""
    m = nn.LazyLinear(3, device=device, dtype=dtype)
    reference.apply(m, lambda t: t, overwrite=overwrite, swap=swap)
    for p in (m.weight, m.bias):
        assert type(p) is nn.UninitializedParameter
        assert (p.device.type, p.dtype) == (device, dtype)


# ---------------------------------------------------------------------------
# fn returning its argument or a Parameter


@flag_settings
def test_identity_fn_keeps_everything(overwrite, swap):
    """Rules 3, 6 and 7: ``fn`` returning its argument (``cpu()`` on CPU) keeps values, classes, ties, grads."""
    root = nn.Module()
    root.tied = Tied()
    root.tagged = Tagged()
    fill_grads(root)
    values = {name: t.detach().clone() for name, t in root.named_parameters()}
    grads = {name: t.grad.clone() for name, t in root.named_parameters() if t.grad is not None}
    buffers = dict(root.named_buffers())
    reference.apply(root, lambda t: t, overwrite=overwrite, swap=swap)
    assert root.tied.enc.weight is root.tied.dec.weight
    assert type(root.tagged.p) is TaggedParameter and root.tagged.p.tag == "x"
    assert root.tagged.q.requires_grad is False
    for name, t in root.named_parameters():
        assert torch.equal(t.detach(), values[name]), name
        if name in grads:
            assert torch.equal(t.grad, grads[name]), name
            assert t.grad.is_leaf
    assert {k: id(v) for k, v in root.named_buffers()} == {k: id(v) for k, v in buffers.items()}


@flag_settings
@pytest.mark.parametrize("requires_grad", [True, False])
def test_fn_returning_parameter_keeps_param_requires_grad(overwrite, swap, requires_grad):
    """Rule 6: ``requires_grad`` is the parameter's own, whatever ``fn`` returns."""
    m = Tagged()
    reference.apply(
        m,
        lambda t: nn.Parameter(t.detach().double(), requires_grad=requires_grad),
        overwrite=overwrite,
        swap=swap,
    )
    assert (m.p.requires_grad, m.q.requires_grad) == (True, False)
    assert type(m.p) is TaggedParameter
    assert m.p.dtype == torch.float64


@flag_settings
def test_parameter_also_registered_as_buffer_stays_one_object(overwrite, swap):
    """Rule 3: a tensor held by a parameter slot and a buffer slot ends up as one result in both."""
    m = nn.Module()
    m.w = nn.Parameter(torch.tensor([1.0, 2.0]))
    m.register_buffer("w_buf", m.w)
    fn, calls, _ = _counting(double)
    reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert list(calls.values()) == [1]
    assert m._parameters["w"] is m._buffers["w_buf"]
    assert m.w.dtype == torch.float64


def _grad_of_another_dtype() -> nn.Sequential:
    """Two linears after a backward; the second's weight made float64 by ``.data =``, its grad
    left float32 (the state torch's ``.data`` setter allows)."""
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    m(torch.ones(1, 2)).sum().backward()
    m[1].weight.data = m[1].weight.data.double()
    return m


@pytest.mark.parametrize("overwrite, swap", [(False, False), (True, False), (False, True)])
def test_a_grad_of_another_dtype_converts_where_the_results_agree(overwrite, swap):
    m = _grad_of_another_dtype()
    reference.apply(m, lambda t: t.half(), overwrite=overwrite, swap=swap)
    assert m[1].weight.dtype == m[1].weight.grad.dtype == torch.float16


@pytest.mark.parametrize("overwrite, swap", [(True, False), (False, True)])
def test_a_grad_the_setter_refuses_is_refused_and_changes_nothing(overwrite, swap):
    m = _grad_of_another_dtype()
    objects = [(p, p.grad, p.dtype, p.grad.dtype) for p in m.parameters()]
    with pytest.raises(RuntimeError, match="gradient with dtype"):
        reference.apply(m, lambda t: t.clone(), overwrite=overwrite, swap=swap)
    assert [(p, p.grad, p.dtype, p.grad.dtype) for p in m.parameters()] == objects


def test_the_set_data_path_keeps_a_grad_of_another_dtype():
    m = _grad_of_another_dtype()
    reference.apply(m, lambda t: t.clone(), overwrite=False, swap=False)
    assert (m[1].weight.dtype, m[1].weight.grad.dtype) == (torch.float64, torch.float32)


def test_put_grad_sets_a_grad_the_setter_refuses_and_keeps_the_data():
    p = nn.Parameter(torch.ones(2, dtype=torch.float64))
    data = p.data
    grad = torch.full((2,), 3.0)
    put_grad(p, grad)
    assert p.grad is grad and p.dtype == torch.float64 and p.data.data_ptr() == data.data_ptr()
    put_grad(p, None)
    assert p.grad is None


@flag_settings
@pytest.mark.parametrize("make", [linear, lambda: nn.BatchNorm1d(3)], ids=["linear", "batchnorm"])
def test_a_conversion_under_inference_mode_leaves_a_module_that_trains(overwrite, swap, make):
    """Rule 14: under ``torch.inference_mode()`` the conversion makes no inference tensor, so
    outside it every parameter accumulates a grad and a training forward updates buffers."""
    module = make()
    with torch.inference_mode():
        reference.apply(module, double, overwrite=overwrite, swap=swap)
    tensors = [*module.parameters(), *module.buffers()]
    assert not any(t.is_inference() for t in tensors), [t.is_inference() for t in tensors]
    module.train()
    module(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    assert all(p.grad is not None for p in module.parameters())
