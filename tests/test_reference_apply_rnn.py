"""Unit tests for rule 9 of ``reference.apply`` with its built-in override, ``torch.nn.RNNBase``'s
(drop ``_flat_weight_refs`` before, rebuild ``_flat_weights`` after): every RNN flavour, nested
and tied to another module's parameter, under every flag setting, against torch, and on a
conversion that fails.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from swapspec import reference
from swapspec.properties.harness.targets import torch_apply
from swapspec.reference import overrides
from tests.helpers_modules import (
    assert_unchanged,
    fill_grads,
    flag_settings,
    linear,
    randn,
    snapshot,
)
from tests.helpers_overrides import (
    Refused,
    assert_flat_weights_current,
    counting,
    raising_on,
    rnns,
    seeded,
)

# torch's CPU LSTM with proj_size warns that oneDNN falls back to its default implementation.
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")


@pytest.fixture(autouse=True)
def _restore_global_state() -> Iterator[None]:
    """Leave both sets of conversion flags and the override registrations as each test found them."""
    saved = (
        reference.get_overwrite_module_params_on_conversion(),
        reference.get_swap_module_params_on_conversion(),
        torch.__future__.get_overwrite_module_params_on_conversion(),
        torch.__future__.get_swap_module_params_on_conversion(),
    )
    registrations = overrides.registered_apply_overrides()
    try:
        yield
    finally:
        reference.set_overwrite_module_params_on_conversion(saved[0])
        reference.set_swap_module_params_on_conversion(saved[1])
        torch.__future__.set_overwrite_module_params_on_conversion(saved[2])
        torch.__future__.set_swap_module_params_on_conversion(saved[3])
        overrides.restore_registered_apply_overrides(registrations)


class TiedToLinear(nn.Module):
    """``rnn.weight_ih_l0 is lin.weight``: one parameter shared by an RNN and a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = linear(3, 4, seed=30)
        self.rnn = nn.RNN(3, 4)
        self.rnn.weight_ih_l0 = self.lin.weight

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), self.rnn(x)[0]


class TwoRNNs(nn.Module):
    """An LSTM and a GRU side by side, below a Linear (children before parents)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(linear(3, 3, seed=31), nn.LSTM(3, 4))
        self.second = nn.GRU(3, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.first(x)[0], self.second(x)[0]


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "rnn": lambda: nn.RNN(3, 4),
    "lstm": lambda: nn.LSTM(3, 4),
    "gru": lambda: nn.GRU(3, 4),
    "lstm-proj": lambda: nn.LSTM(3, 4, proj_size=2),
    "gru-bidirectional-2-layers": lambda: nn.GRU(3, 4, num_layers=2, bidirectional=True),
    "sequential-lstm": lambda: nn.Sequential(nn.LSTM(3, 4)),
    "two-rnns": TwoRNNs,
    "tied": TiedToLinear,
}


UNTIED = [name for name in BUILDERS if name != "tied"]


def build(name: str) -> nn.Module:
    return seeded(BUILDERS[name], seed=sorted(BUILDERS).index(name))


def outputs(module: nn.Module, like: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor the module's forward returns, for an input of ``like``'s dtype and device.

    Runs under ``no_grad``: a graph would hold the parameters and block later swaps.
    """
    x = randn(5, 3, seed=40).to(dtype=like.dtype, device=like.device)
    with torch.no_grad():
        out = module(x)
    found: list[torch.Tensor] = []

    def walk(value: object) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, tuple | list):
            for item in value:
                walk(item)

    walk(out)
    return found


def first_parameter(module: nn.Module) -> torch.Tensor:
    return next(module.parameters())


def assert_same_outputs(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected, strict=True):
        assert (g.shape, g.dtype, g.device) == (e.shape, e.dtype, e.device)
        if g.device.type != "meta":
            assert torch.equal(g, e)


def assert_flat_weights_are(module: nn.Module, expected: dict[int, list[torch.Tensor]]) -> None:
    for rnn in rnns(module):
        assert all(w is p for w, p in zip(rnn._flat_weights, expected[id(rnn)], strict=True))


def flat_weights_of(module: nn.Module) -> dict[int, list[torch.Tensor]]:
    return {id(rnn): list(rnn._flat_weights) for rnn in rnns(module)}


def distinct_tensors(module: nn.Module) -> dict[int, torch.Tensor]:
    """Every distinct parameter, grad and buffer object of the tree."""
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [p.grad for p in module.parameters() if p.grad is not None]
    return {id(t): t for t in tensors}


def loaded_with_converted(original: nn.Module, fn: Callable) -> nn.Module:
    """A copy of ``original`` with ``fn`` of each state entry assigned by ``load_state_dict``."""
    fresh = copy.deepcopy(original)
    fresh.load_state_dict({k: fn(v) for k, v in original.state_dict().items()}, assign=True)
    return fresh


FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "double": lambda t: t.double(),
    "half-then-float": lambda t: t.half().float(),
    "meta": lambda t: t.to("meta"),
    "add-one": lambda t: t + 1,
}


fns = pytest.mark.parametrize("fn_name", list(FNS))


def keeps_objects(fn_name: str, overwrite: bool, swap: bool) -> bool:
    """Rule 5: swap, or set_data (no overwrite flag, no TensorImpl change), keeps the objects."""
    return swap or (not overwrite and fn_name != "meta")


@flag_settings
@fns
@pytest.mark.parametrize("case", list(BUILDERS))
def test_rnn_conversion_keeps_flat_weights_current(case, fn_name, overwrite, swap):
    """Rules 9 and 10: after apply every RNN's ``_flat_weights`` are its current parameters, forward
    equals a fresh copy loaded with the converted values, and ``fn`` ran once per tensor."""
    fn = FNS[fn_name]
    m = build(case)
    original = copy.deepcopy(m)
    fill_grads(m)
    before = dict(m.named_parameters(remove_duplicate=False))
    distinct = distinct_tensors(m)
    counted, seen = counting(fn)
    reference.apply(m, counted, overwrite=overwrite, swap=swap)
    assert sorted(map(id, seen)) == sorted(distinct)
    assert_flat_weights_current(m)
    for name, p in m.named_parameters(remove_duplicate=False):
        assert (p is before[name]) is keeps_objects(fn_name, overwrite, swap), name
        assert p.grad is not None and p.grad.dtype == p.dtype, name
    expected = loaded_with_converted(original, fn)
    like = first_parameter(m)
    assert_same_outputs(outputs(m, like), outputs(expected, like))


@flag_settings
@fns
@pytest.mark.parametrize("case", UNTIED)
def test_rnn_conversion_matches_torch(case, fn_name, overwrite, swap):
    """Rules 9 and 10 against torch: on modules without ties (where torch, which keeps no memo, converts
    a tied tensor twice) the reference and ``nn.Module._apply`` give the same objects, values,
    ``_flat_weights`` and forward."""
    fn = FNS[fn_name]
    ours, theirs = build(case), build(case)
    fill_grads(ours)
    fill_grads(theirs)
    ours_before = dict(ours.named_parameters())
    theirs_before = dict(theirs.named_parameters())
    reference.apply(ours, fn, overwrite=overwrite, swap=swap)
    torch_apply(theirs, fn, overwrite=overwrite, swap=swap)
    assert not torch.__future__.get_swap_module_params_on_conversion()
    assert not torch.__future__.get_overwrite_module_params_on_conversion()
    assert_flat_weights_current(ours)
    assert_flat_weights_current(theirs)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert (p is ours_before[name]) is (q is theirs_before[name]), name
        assert (p.dtype, p.device, type(p)) == (q.dtype, q.device, type(q)), name
        assert (p.grad.dtype, p.grad.device) == (q.grad.dtype, q.grad.device), name
        if p.device.type != "meta":
            assert torch.equal(p.detach(), q.detach()), name
            assert torch.equal(p.grad, q.grad), name
    like = first_parameter(ours)
    assert_same_outputs(outputs(ours, like), outputs(theirs, like))


def test_lstm_in_sequential_swaps_like_torch():
    """The reported failure: a nested LSTM converts on the swap path, its parameters stay."""
    m = build("sequential-lstm")
    weight = m[0].weight_ih_l0
    reference.apply(m, lambda t: t.double(), overwrite=False, swap=True)
    assert m[0].weight_ih_l0 is weight
    assert weight.dtype == torch.float64
    assert_flat_weights_current(m)


@flag_settings
def test_tie_between_rnn_and_linear_survives(overwrite, swap):
    """Rules 3 and 9: the RNN's flat weight stays the very parameter the Linear holds."""
    m = build("tied")
    reference.apply(m, lambda t: t + 1, overwrite=overwrite, swap=swap)
    assert m.rnn.weight_ih_l0 is m.lin.weight
    assert m.rnn._flat_weights[0] is m.lin.weight


@flag_settings
def test_recurse_false_on_rnn_runs_its_own_steps(overwrite, swap):
    """Rule 9 with ``recurse=False``: the module's own override steps run."""
    m = build("lstm")
    reference.apply(m, lambda t: t.double(), overwrite=overwrite, swap=swap, recurse=False)
    assert_flat_weights_current(m)
    assert first_parameter(m).dtype == torch.float64


@flag_settings
def test_recurse_false_on_parent_leaves_rnn_child_alone(overwrite, swap):
    """Rule 9 with ``recurse=False``: a child's steps do not run (its weakrefs stay the same)."""
    m = build("sequential-lstm")
    refs = m[0]._flat_weight_refs
    state = snapshot(m)
    reference.apply(m, lambda t: t.double(), overwrite=overwrite, swap=swap, recurse=False)
    assert m[0]._flat_weight_refs is refs
    assert_unchanged(state, m)


def test_user_subclass_of_lstm_without_own_override_is_covered():
    """Rule 9 (lookup by MRO): a subclass of ``nn.LSTM`` that does not override ``_apply``."""

    class MyLSTM(nn.LSTM):
        pass

    m = seeded(lambda: MyLSTM(3, 4), seed=1)
    reference.apply(m, lambda t: t.double(), overwrite=True, swap=False)
    assert_flat_weights_current(m)


@flag_settings
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("case", list(BUILDERS))
def test_fn_raising_leaves_rnn_untouched(case, where, overwrite, swap):
    """Rules 4 and 10: ``fn`` raising on one tensor leaves the module, its ``_flat_weights`` and
    its forward as they were, and the error propagates unchanged."""
    m = build(case)
    fill_grads(m)
    n = len(distinct_tensors(m))
    k = {"first": 0, "middle": n // 2, "last": n - 1}[where]
    like = first_parameter(m)
    forward_before = outputs(m, like)
    flat = flat_weights_of(m)
    state = snapshot(m)
    fn, error = raising_on(k, lambda t: t.double())
    with pytest.raises(Refused) as info:
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert info.value is error
    assert not hasattr(info.value, "__notes__")
    assert_unchanged(state, m)
    assert_flat_weights_are(m, flat)
    assert_flat_weights_current(m)
    assert_same_outputs(outputs(m, like), forward_before)


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("case", ["lstm", "sequential-lstm", "gru-bidirectional-2-layers"])
def test_refused_swap_rolls_back_and_rebuilds_flat_weights(case, overwrite):
    """Rules 4 and 10: a swap refused mid-way (a weakref on the last flat weight) is rolled back;
    the after step points ``_flat_weights`` at the restored parameters; torch's message."""
    m = build(case)
    rnn = rnns(m)[-1]
    last = rnn._flat_weights_names[-1]
    held = weakref.ref(getattr(rnn, last))
    like = first_parameter(m)
    forward_before = outputs(m, like)
    flat = flat_weights_of(m)
    state = snapshot(m)
    with pytest.raises(RuntimeError) as info:
        reference.apply(m, lambda t: t.double(), overwrite=overwrite, swap=True)
    assert str(info.value) == f"_apply(): Couldn't swap {rnn._get_name()}.{last}"
    assert "weakref" in str(info.value.__cause__)
    assert_unchanged(state, m)
    assert_flat_weights_are(m, flat)
    assert_flat_weights_current(m)
    assert held() is getattr(rnn, last)
    assert_same_outputs(outputs(m, like), forward_before)


def test_builtin_rnn_steps():
    """The built-in ``RNNBase`` description: before empties the weakrefs, after rebuilds both."""
    m = build("lstm")
    step = overrides.BUILTIN[nn.RNNBase]
    step.before(m)
    assert m._flat_weight_refs == []
    m._flat_weights = []
    step.after(m)
    assert_flat_weights_current(m)
