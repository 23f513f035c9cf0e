"""Unit tests for rules 9 and 10 of ``reference.apply``: the ``_apply`` overrides it knows.

An unknown override is refused before anything changes; ``torch.nn.cpp.ModuleWrapper`` is refused
with its reason; ``reference.register_apply_override`` describes another class's steps, which run
around the conversion; and every overriding class torch ships is described or refused. The
built-in ``torch.nn.RNNBase`` steps on every RNN flavour: ``test_reference_apply_rnn.py``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn
from torch.nn.cpp import ModuleWrapper

from swapspec import reference
from swapspec.properties.harness.isolation import isolated_global_state
from swapspec.reference import overrides
from swapspec.strategies.modules import OwnApplyLeaf
from tests.helpers_modules import (
    assert_unchanged,
    linear,
    snapshot,
)
from tests.helpers_overrides import (
    Refused,
    assert_flat_weights_current,
    counting,
    raising_on,
    seeded,
)


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


# The registrations every process of the suite starts with: the suite's own overriding module
# (``strategies.modules.OwnApplyLeaf``) registers itself when imported.
SUITE_OWN = {OwnApplyLeaf: overrides.registered_apply_overrides()[OwnApplyLeaf]}


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
    assert overrides.registered_apply_overrides() == SUITE_OWN
    with pytest.raises(reference.ApplyOverrideError):
        reference.apply(OwnApply(), lambda t: t)


def test_registered_apply_overrides_is_a_copy_and_restorable():
    """``registered_apply_overrides`` returns a copy; ``restore_...`` makes the table exactly it."""
    reference.register_apply_override(OwnApply, before=print, after=print)
    saved = overrides.registered_apply_overrides()
    assert saved == {**SUITE_OWN, OwnApply: overrides.ApplyOverride(before=print, after=print)}
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
    assert overrides.registered_apply_overrides() == SUITE_OWN


def test_register_twice_rejected_and_first_kept():
    first = overrides.ApplyOverride(before=print, after=print)
    reference.register_apply_override(OwnApply, before=print, after=print)
    with pytest.raises(ValueError, match=r"OwnApply is already described$"):
        reference.register_apply_override(OwnApply, before=repr, after=repr)
    assert overrides.registered_apply_overrides() == {**SUITE_OWN, OwnApply: first}


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


def test_overrides_of_plain_and_rnn_modules():
    assert overrides.overrides_of(linear()) == []
    assert overrides.overrides_of(nn.Sequential(nn.LSTM(3, 4))) == []
    assert overrides.overrides_of(nn.GRU(3, 4)) == [overrides.BUILTIN[nn.RNNBase]]


def test_isolation_restores_and_names_a_leaked_registration():
    """The suite's global-state isolation covers the registrations like the flags."""
    leaked = r"^test leaked global state \(now restored\): \['reference apply overrides'\]$"
    with pytest.raises(pytest.fail.Exception, match=leaked), isolated_global_state():
        reference.register_apply_override(OwnApply, before=print, after=print)
    assert overrides.registered_apply_overrides() == SUITE_OWN
