"""Unit tests for rules 9 and 10 of ``reference.apply``: the ``_apply`` overrides it honours.

The built-in description is ``torch.nn.RNNBase``'s (drop ``_flat_weight_refs`` before, rebuild
``_flat_weights`` after); ``torch.nn.cpp.ModuleWrapper`` is refused; every other overriding class
must be registered with ``reference.register_apply_override``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
import weakref
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn
from torch.nn.cpp import ModuleWrapper

from swapspec import reference
from swapspec.properties.harness.isolation import isolated_global_state
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


# ---------------------------------------------------------------------------
# The modules: every RNN flavour, nested, and tied to another module's parameter


def seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``build()`` with torch's global RNG seeded for the call and restored after it."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


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


def rnns(module: nn.Module) -> list[nn.RNNBase]:
    return [m for m in module.modules() if isinstance(m, nn.RNNBase)]


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


def assert_flat_weights_current(module: nn.Module) -> None:
    """Every RNN's ``_flat_weights`` (and their weakrefs) are its parameters, in names order."""
    found = rnns(module)
    assert found
    for rnn in found:
        current = [rnn._parameters[name] for name in rnn._flat_weights_names]
        assert len(rnn._flat_weights) == len(current) > 0
        assert all(w is p for w, p in zip(rnn._flat_weights, current, strict=True))
        assert all(r() is p for r, p in zip(rnn._flat_weight_refs, current, strict=True))


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


def counting(fn: Callable) -> tuple[Callable, list[torch.Tensor]]:
    seen: list[torch.Tensor] = []

    def wrapped(t: torch.Tensor) -> torch.Tensor:
        seen.append(t)
        return fn(t)

    return wrapped, seen


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


# ---------------------------------------------------------------------------
# Conversion of every RNN flavour under every flag setting


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


# ---------------------------------------------------------------------------
# Atomicity: the after steps rebuild derived state from the restored tensors


class Refused(Exception):
    pass


def raising_on(k: int, fn: Callable) -> tuple[Callable, Refused]:
    error = Refused(f"tensor {k}")
    count = 0

    def wrapped(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        if count == k:
            raise error
        count += 1
        return fn(t)

    return wrapped, error


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


# ---------------------------------------------------------------------------
# Unknown and refused overrides


class OwnApply(nn.Module):
    """A user class that overrides ``_apply`` (unknown to the reference until registered)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.log: list[str] = []

    def _apply(self, fn, recurse=True):
        self.log.append("before")
        out = super()._apply(fn, recurse)
        self.log.append("after")
        return out


class InheritsOwnApply(OwnApply):
    """A subclass that does not override ``_apply`` again: its base's override still counts."""


class OverridingLSTM(nn.LSTM):
    """A subclass of ``nn.LSTM`` with an ``_apply`` of its own."""

    def _apply(self, fn, recurse=True):
        return super()._apply(fn, recurse)


class ApplyMixin:
    """Not a module: an ``_apply`` that takes effect only ahead of ``nn.Module`` in the MRO."""

    def _apply(self, fn, recurse=True):
        return super()._apply(fn, recurse)


class MixinFirst(ApplyMixin, nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))


class ModuleFirst(nn.Module, ApplyMixin):
    """``nn.Module._apply`` comes first in the MRO: the mixin's is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@pytest.mark.parametrize(
    ("build_unknown", "named"),
    [
        (OwnApply, qualname(OwnApply)),
        (InheritsOwnApply, f"{qualname(OwnApply)} (a base of {qualname(InheritsOwnApply)})"),
        (lambda: seeded(lambda: OverridingLSTM(3, 4), seed=2), qualname(OverridingLSTM)),
        (MixinFirst, f"{qualname(ApplyMixin)} (a base of {qualname(MixinFirst)})"),
    ],
    ids=["own", "inherited", "lstm-subclass", "mixin"],
)
def test_unknown_override_refused_before_anything_changes(build_unknown, named):
    """Rule 9: an unknown override raises ``ApplyOverrideError`` (a TypeError) naming the class
    and the way to register it; nothing in the tree changed and ``fn`` never ran."""
    inner = build_unknown()
    root = nn.Sequential(linear(2, 2), inner)
    refs = getattr(inner, "_flat_weight_refs", None)
    state = snapshot(root)
    counted, seen = counting(lambda t: t.double())
    with pytest.raises(reference.ApplyOverrideError) as info:
        reference.apply(root, counted, overwrite=False, swap=True)
    assert isinstance(info.value, TypeError)
    expected = (
        f"reference.apply does not know the _apply override of {named}; describe the work it "
        "does before and after super()._apply with swapspec.reference.register_apply_override("
    )
    assert str(info.value).startswith(expected)
    assert str(info.value).endswith(", before=..., after=...)")
    assert seen == []
    assert_unchanged(state, root)
    assert getattr(inner, "_flat_weight_refs", None) is refs


def test_unknown_override_named_in_the_register_hint():
    """Rule 9: the hint names the overriding class by its own name."""
    with pytest.raises(reference.ApplyOverrideError, match=r"register_apply_override\(OwnApply, "):
        reference.apply(InheritsOwnApply(), lambda t: t)


def test_apply_override_behind_nn_module_in_the_mro_is_ignored():
    """Rule 9: only classes ahead of ``nn.Module`` in the MRO count (the rest are shadowed)."""
    m = ModuleFirst()
    reference.apply(m, lambda t: t.double())
    assert m.w.dtype == torch.float64


class FakeCppModule:
    """Just enough of a C++ frontend module for ``ModuleWrapper.__init__``."""

    def __init__(self) -> None:
        self.training = True
        self._parameters = {"w": nn.Parameter(torch.ones(2))}
        self._buffers: dict[str, torch.Tensor] = {}
        self._modules: dict[str, nn.Module] = {}

    def train(self, mode: bool = True) -> None:
        self.training = mode


@pytest.mark.parametrize("wrapper", ["itself", "registered-subclass"])
def test_module_wrapper_refused_with_reason(wrapper):
    """Rule 9: ``nn.cpp.ModuleWrapper`` (and a subclass, even one whose own override is
    registered) is refused with the stated reason; nothing changes."""

    class Subclass(ModuleWrapper):
        def _apply(self, fn, recurse=True):
            return super()._apply(fn, recurse)

    if wrapper == "itself":
        m = ModuleWrapper(FakeCppModule())
    else:
        reference.register_apply_override(Subclass, before=lambda m: None, after=lambda m: None)
        m = Subclass(FakeCppModule())
    w = m._parameters["w"]
    counted, seen = counting(lambda t: t.double())
    with pytest.raises(reference.ApplyOverrideError) as info:
        reference.apply(m, counted)
    assert str(info.value) == (
        f"reference.apply refuses the _apply override of torch.nn.cpp.ModuleWrapper"
        f"{'' if wrapper == 'itself' else f' (a base of {qualname(Subclass)})'}, because "
        f"{overrides.REFUSED[ModuleWrapper]}"
    )
    assert "C++ frontend module" in str(info.value)
    assert seen == []
    assert m._parameters["w"] is w and w.dtype == torch.float32


# ---------------------------------------------------------------------------
# register_apply_override


def recorder(log: list[str], label: str) -> tuple[Callable, Callable]:
    def before(m: nn.Module) -> None:
        log.append(f"before {label} {m.name}")

    def after(m: nn.Module) -> None:
        log.append(f"after {label} {m.name}")

    return before, after


def named_own_apply(name: str, **children: nn.Module) -> OwnApply:
    m = OwnApply()
    m.name = name
    for key, child in children.items():
        setattr(m, key, child)
    return m


def test_registered_override_runs_around_the_conversion():
    """Rule 10: ``before`` sees the original tensors before any ``fn`` call, ``after`` sees the
    committed ones; the override's own ``_apply`` is never called."""
    log: list[str] = []
    m = named_own_apply("m")
    w = m.w

    def before(module):
        log.append(f"before {module.w.dtype}")

    def after(module):
        log.append(f"after {module.w.dtype}")

    def fn(t):
        log.append("fn")
        return t.double()

    reference.register_apply_override(OwnApply, before=before, after=after)
    reference.apply(m, fn, overwrite=False, swap=True)
    assert log == ["before torch.float32", "fn", "after torch.float64"]
    assert m.w is w and m.log == []


def test_override_steps_follow_torchs_order_over_the_tree():
    """Rule 10: befores parents first (pre-order), afters children first (post-order)."""
    log: list[str] = []
    before, after = recorder(log, "own")
    root = named_own_apply(
        "root", a=named_own_apply("a", c=named_own_apply("c")), b=named_own_apply("b")
    )
    reference.register_apply_override(OwnApply, before=before, after=after)
    reference.apply(root, lambda t: t)
    assert log == [
        "before own root", "before own a", "before own c", "before own b",
        "after own c", "after own a", "after own b", "after own root",
    ]


def test_shared_submodule_steps_run_once():
    """Rule 10 with rule 2: a shared submodule is converted once, so its steps run once."""
    log: list[str] = []
    before, after = recorder(log, "own")
    shared = named_own_apply("shared")
    root = named_own_apply("root", x=shared, y=shared)
    reference.register_apply_override(OwnApply, before=before, after=after)
    reference.apply(root, lambda t: t)
    assert log == ["before own root", "before own shared", "after own shared", "after own root"]


def test_recurse_false_runs_only_the_modules_own_steps():
    log: list[str] = []
    before, after = recorder(log, "own")
    root = named_own_apply("root", a=named_own_apply("a"))
    reference.register_apply_override(OwnApply, before=before, after=after)
    reference.apply(root, lambda t: t, recurse=False)
    assert log == ["before own root", "after own root"]


class Outer(OwnApply):
    """Overrides ``_apply`` again on top of ``OwnApply``'s."""

    def _apply(self, fn, recurse=True):
        return super()._apply(fn, recurse)


def test_chained_overrides_nest_like_super_calls():
    """Rule 10: the outer class's before runs first and its after last."""
    log: list[str] = []
    m = Outer()
    m.name = "m"
    inner_before, inner_after = recorder(log, "inner")
    outer_before, outer_after = recorder(log, "outer")
    reference.register_apply_override(OwnApply, before=inner_before, after=inner_after)
    with pytest.raises(reference.ApplyOverrideError) as info:
        reference.apply(m, lambda t: t)  # Outer's own override is not described yet
    assert f"override of {qualname(Outer)};" in str(info.value)
    assert log == []
    reference.register_apply_override(Outer, before=outer_before, after=outer_after)
    reference.apply(m, lambda t: t)
    assert log == ["before outer m", "before inner m", "after inner m", "after outer m"]


def test_registered_subclass_of_lstm_adds_to_rnnbase_steps():
    """Rule 10: a registered ``nn.LSTM`` subclass's own steps wrap the built-in RNN steps."""
    log: list[str] = []
    m = seeded(lambda: OverridingLSTM(3, 4), seed=3)

    def before(module):
        log.append(f"before refs={len(module._flat_weight_refs)}")

    def after(module):
        log.append(f"after current={module._flat_weights[0] is module.weight_ih_l0}")

    reference.register_apply_override(OverridingLSTM, before=before, after=after)
    reference.apply(m, lambda t: t.double(), overwrite=True, swap=False)
    assert log == ["before refs=4", "after current=True"]
    assert_flat_weights_current(m)


class StepFailed(Exception):
    pass


def failing(log: list[str], label: str, error: Exception | None = None) -> Callable:
    def step(m: nn.Module) -> None:
        log.append(f"{label} {m.name}")
        if error is not None:
            raise error

    return step


def test_before_raising_runs_the_afters_of_the_befores_that_ran():
    """Rule 10: a failing ``before`` stops the apply before any ``fn`` call; the steps whose
    ``before`` ran get their ``after``; the error propagates unchanged."""
    log: list[str] = []
    error = StepFailed("before")
    calls = []

    def before(m):
        log.append(f"before {m.name}")
        if m.name == "b":
            raise error

    root = named_own_apply("root", a=named_own_apply("a"), b=named_own_apply("b"),
                           c=named_own_apply("c"))
    state = snapshot(root)
    reference.register_apply_override(OwnApply, before=before, after=failing(log, "after"))
    with pytest.raises(StepFailed) as info:
        reference.apply(root, lambda t: calls.append(t) or t.double())
    assert info.value is error
    assert not hasattr(error, "__notes__")
    assert calls == []
    assert log == ["before root", "before a", "before b", "after a", "after root"]
    assert_unchanged(state, root)


def test_after_raising_runs_every_other_after_and_propagates_the_first():
    """Rule 10: with the conversion done, every ``after`` runs and the first error propagates."""
    log: list[str] = []
    first, second = StepFailed("a"), StepFailed("b")
    errors = {"a": first, "b": second}

    def after(m):
        log.append(f"after {m.name}")
        if m.name in errors:
            raise errors[m.name]

    root = named_own_apply("root", a=named_own_apply("a"), b=named_own_apply("b"))
    reference.register_apply_override(OwnApply, before=lambda m: None, after=after)
    with pytest.raises(StepFailed) as info:
        reference.apply(root, lambda t: t.double())
    assert info.value is first
    assert log == ["after a", "after b", "after root"]
    assert root.w.dtype == root.a.w.dtype == torch.float64


def test_after_raising_during_a_failed_conversion_is_noted_on_the_conversion_error():
    """Rule 10: when the conversion failed, its error propagates; an ``after`` error is a note."""
    log: list[str] = []
    root = named_own_apply("root", a=named_own_apply("a"))
    state = snapshot(root)
    reference.register_apply_override(
        OwnApply, before=lambda m: None, after=failing(log, "after", StepFailed("rebuild"))
    )
    fn, error = raising_on(1, lambda t: t.double())
    with pytest.raises(Refused) as info:
        reference.apply(root, fn)
    assert info.value is error
    assert log == ["after a", "after root"]
    assert error.__notes__ == [
        "then the after step on OwnApply raised StepFailed('rebuild')",
        "then the after step on OwnApply raised StepFailed('rebuild')",
    ]
    assert_unchanged(state, root)


def test_unregister_makes_the_override_unknown_again():
    reference.register_apply_override(OwnApply, before=lambda m: None, after=lambda m: None)
    reference.apply(OwnApply(), lambda t: t)
    reference.unregister_apply_override(OwnApply)
    assert overrides.registered_apply_overrides() == {}
    with pytest.raises(reference.ApplyOverrideError):
        reference.apply(OwnApply(), lambda t: t)


def test_registered_apply_overrides_is_a_copy_and_restorable():
    """``registered_apply_overrides`` returns a copy; ``restore_...`` makes the table exactly it."""
    reference.register_apply_override(OwnApply, before=print, after=print)
    saved = overrides.registered_apply_overrides()
    assert saved == {OwnApply: overrides.ApplyOverride(before=print, after=print)}
    saved.clear()
    assert OwnApply in overrides.registered_apply_overrides()
    overrides.restore_registered_apply_overrides({Outer: overrides.ApplyOverride(print, print)})
    assert list(overrides.registered_apply_overrides()) == [Outer]


@pytest.mark.parametrize(
    ("cls", "before", "after", "error", "message"),
    [
        (OwnApply(), print, print, TypeError,
         r"^register_apply_override: expected a class, got OwnApply\(\)$"),
        (OwnApply, None, print, TypeError,
         r"^register_apply_override: before must be callable, got None$"),
        (OwnApply, print, 3, TypeError,
         r"^register_apply_override: after must be callable, got 3$"),
        (nn.LSTM, print, print, ValueError,
         r"^register_apply_override: torch\.nn\.modules\.rnn\.LSTM does not override _apply "
         r"itself; there is nothing to describe$"),
        (nn.Module, print, print, ValueError,
         r"^register_apply_override: torch\.nn\.modules\.module\.Module does not override"),
        (nn.RNNBase, print, print, ValueError,
         r"^register_apply_override: torch\.nn\.modules\.rnn\.RNNBase is already described$"),
        (ModuleWrapper, print, print, ValueError,
         r"^register_apply_override: torch\.nn\.cpp\.ModuleWrapper is already described$"),
    ],
    ids=["instance", "before", "after", "no-own-apply", "module", "builtin", "refused"],
)
def test_register_rejects_bad_input_and_registers_nothing(cls, before, after, error, message):
    with pytest.raises(error, match=message):
        reference.register_apply_override(cls, before=before, after=after)
    assert overrides.registered_apply_overrides() == {}


def test_register_twice_rejected_and_first_kept():
    first = overrides.ApplyOverride(before=print, after=print)
    reference.register_apply_override(OwnApply, before=print, after=print)
    with pytest.raises(ValueError, match=r"OwnApply is already described$"):
        reference.register_apply_override(OwnApply, before=repr, after=repr)
    assert overrides.registered_apply_overrides() == {OwnApply: first}


@pytest.mark.parametrize("cls", [OwnApply, nn.RNNBase], ids=["never-registered", "builtin"])
def test_unregister_rejects_what_is_not_registered(cls):
    with pytest.raises(ValueError, match=rf"^unregister_apply_override: {qualname(cls)} is not "
                                         r"registered$"):
        reference.unregister_apply_override(cls)
    assert nn.RNNBase in overrides.BUILTIN


def test_registration_can_cover_a_mixin_that_is_not_a_module():
    reference.register_apply_override(ApplyMixin, before=lambda m: None, after=lambda m: None)
    m = MixinFirst()
    reference.apply(m, lambda t: t.double())
    assert m.w.dtype == torch.float64


# ---------------------------------------------------------------------------
# The scan: every class in torch.nn and torch.ao.nn that overrides _apply is described


def overriding_classes() -> set[type]:
    """Every ``nn.Module`` subclass defined in a submodule of torch.nn or torch.ao.nn that has
    ``_apply`` in its own ``__dict__`` (``nn.Module`` itself excluded); unimportable submodules
    are skipped."""
    found: set[type] = set()
    for package in (torch.nn, torch.ao.nn):
        names = [package.__name__]
        names += [info.name for info in pkgutil.walk_packages(
            package.__path__, package.__name__ + ".", onerror=lambda name: None)]
        for name in names:
            try:
                module = importlib.import_module(name)
            except Exception:
                continue
            for value in vars(module).values():
                if (inspect.isclass(value) and issubclass(value, nn.Module)
                        and value is not nn.Module and "_apply" in vars(value)):
                    found.add(value)
    return found


def test_scan_finds_every_override_described_or_refused():
    """Every overriding class torch ships is built in or refused with a reason, so a torch
    release with a new override fails here until the reference learns it."""
    found = overriding_classes()
    assert nn.RNNBase in found  # the scan sees at least the known one
    undescribed = {qualname(c) for c in found} - {
        qualname(c) for c in (*overrides.BUILTIN, *overrides.REFUSED)
    }
    assert undescribed == set(), f"classes overriding _apply that the reference does not know: " \
                                 f"{sorted(undescribed)}"
    for cls in overrides.REFUSED:
        assert len(overrides.REFUSED[cls]) > 20, f"{qualname(cls)}: no stated reason"


def test_described_classes_override_apply_themselves():
    """A built-in or refused entry is a class whose own ``_apply`` it describes (no stale ones)."""
    for cls in (*overrides.BUILTIN, *overrides.REFUSED):
        assert "_apply" in vars(cls), qualname(cls)


def test_builtin_rnn_steps():
    """The built-in ``RNNBase`` description: before empties the weakrefs, after rebuilds both."""
    m = build("lstm")
    step = overrides.BUILTIN[nn.RNNBase]
    step.before(m)
    assert m._flat_weight_refs == []
    m._flat_weights = []
    step.after(m)
    assert_flat_weights_current(m)


def test_overrides_of_plain_and_rnn_modules():
    assert overrides.overrides_of(linear()) == []
    assert overrides.overrides_of(nn.Sequential(nn.LSTM(3, 4))) == []
    assert overrides.overrides_of(nn.GRU(3, 4)) == [overrides.BUILTIN[nn.RNNBase]]


def test_isolation_restores_and_names_a_leaked_registration():
    """The suite's global-state isolation covers the registrations like the flags."""
    leaked = r"^test leaked global state \(now restored\): \['reference apply overrides'\]$"
    with pytest.raises(pytest.fail.Exception, match=leaked), isolated_global_state():
        reference.register_apply_override(OwnApply, before=print, after=print)
    assert overrides.registered_apply_overrides() == {}
