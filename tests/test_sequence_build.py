"""What a sequence draws at its build besides the module: the global module hooks its life runs
under (``GLOBAL_HOOKS``, put back by the teardown) and the default dtype of its conversions and
loads (``DEFAULT_DTYPES``, set around those steps only and shown in the repro)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swapspec.properties.harness.isolation import global_module_hooks
from swapspec.properties.harness.targets import builtin_target
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.rules.sequence_machine import GLOBAL_HOOKS, STATE, SequenceMachine
from swapspec.strategies import FlagSetting, build_tree
from tests.test_module_model_ties import FLAT, X, _Scripted

DOUBLE = conversion_named("double()")


def _machine(**build) -> SequenceMachine:
    machine = SequenceMachine.for_target(builtin_target("reference"), STATE)()
    machine.build(build_tree(FLAT), (X,), [DOUBLE], **build)
    return machine


@settings(max_examples=1, database=None, deadline=None)
@given(st.none())  # a machine's steps record Hypothesis events: they run inside a test
def test_each_kind_of_global_hooks_is_registered_for_the_life_and_put_back(_: None) -> None:
    """Rule: a life drawn with global hooks has torch's global tables filled while it runs;
    its teardown leaves them, and the backward hooks' kind torch never resets, as they were, so
    a later life can draw the other backward kind."""
    before = global_module_hooks()
    for kind in ("backward", "full backward", "forward"):
        machine = _machine(global_hooks=kind)
        try:
            filled = {name for (name, entries), (_, was) in zip(global_module_hooks(), before,
                                                                  strict=True) if entries != was}
            assert len(filled) >= len(GLOBAL_HOOKS[kind]), (kind, filled)
            machine.backward(create_graph=False)
            assert machine.judged
        finally:
            machine.teardown()
        assert global_module_hooks() == before, kind


@settings(max_examples=1, database=None, deadline=None)
@given(st.none())
def test_a_conversion_under_a_float64_default_runs_under_it_and_puts_it_back(_: None) -> None:
    """Rule: a life drawn with float64 runs its conversion steps under it (judged, passing on
    the reference), leaves torch's default after each, and its repro sets and resets it."""
    machine = _machine(dtype=torch.float64)
    seen = []
    original = torch.Tensor.double

    def recording(t):
        seen.append(torch.get_default_dtype())
        return original(t)

    torch.Tensor.double = recording
    try:
        machine.convert(_Scripted(DOUBLE), FlagSetting(overwrite=False, swap=False))
    finally:
        torch.Tensor.double = original
    assert seen and set(seen) == {torch.float64}
    assert torch.get_default_dtype() == torch.float32 and machine.judged
    last = machine.steps[-1]
    assert "torch.set_default_dtype(torch.float64)" in last
    assert last[-1] == "torch.set_default_dtype(torch.float32)"
    machine.teardown()


@settings(max_examples=1, database=None, deadline=None)
@given(st.none())
def test_a_conversion_under_a_drawn_mode_runs_under_it_and_its_repro_enters_it(_: None) -> None:
    """Rule: a life drawn with a mode runs its conversion steps under that mode (the mode sees
    the conversion's ops; judged, passing on the reference), leaves no mode active after the
    step, and its repro imports the mode and wraps the step in it."""
    from swapspec.strategies import modes

    for kind, cls in modes.MODE_CLASSES.items():
        machine = _machine(mode=kind)
        seen = []
        original = cls.__torch_function__ if kind == "function" else cls.__torch_dispatch__

        def recording(self, func, *args, _original=original, _seen=seen, **kwargs):
            _seen.append(func)
            return _original(self, func, *args, **kwargs)

        setattr(cls, original.__name__, recording)
        try:
            machine.convert(_Scripted(DOUBLE), FlagSetting(overwrite=False, swap=False))
        finally:
            setattr(cls, original.__name__, original)
        assert seen and machine.judged, kind
        assert not torch.overrides._get_current_function_mode_stack()
        assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()
        last = machine.steps[-1]
        start = last.index(f"with {cls.__name__}():")
        assert last[start - 1] == f"from swapspec.strategies.modes import {cls.__name__}"
        assert last[start + 1].startswith("    ") and "double" in "\n".join(last[start:])
        namespace = {"torch": torch}
        exec("\n".join([last[start - 1], last[start], "    y = torch.ones(2).double()"]), namespace)
        assert namespace["y"].dtype == torch.float64
        machine.teardown()
