"""The host material mechanism (``strategies.host_material``): a target's own modules and
conversions reach every strategy that draws trees or conversions, respect each draw's filters,
and change nothing for a run without them."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from swapspec.properties.harness import plugged
from swapspec.strategies import Conversion, HostModule, conversions, module_trees, tree_info
from swapspec.strategies.conversions import (
    ADD_ONE,
    CONVERSIONS,
    among,
    modules_with_conversions,
    raising_bases,
    raising_conversion,
    trainable_on_cpu,
    value_changing_conversions,
)
from swapspec.strategies.host_material import HostMaterial, host_material, hosting
from swapspec.strategies.tree_draws import tree_specs
from swapspec.strategies.tree_spec import has_host_leaf
from tests.planted.quantized import FAKE_QUANTIZE, QUANTIZE, QLinear

Q_LINEAR = HostModule("test.QLinear", partial(QLinear, seed=0))
RAISING = Conversion("test.raising", "lambda t: t", raises_on=1)
ON_META = Conversion("test.on-meta", "lambda t: t.to('meta')", changes_impl=True, device="meta",
                     preserves_values=False)
FOUND = settings(max_examples=500, database=None, phases=[Phase.generate],
                 suppress_health_check=list(HealthCheck))


def _drawn(strategy: st.SearchStrategy, n: int = 60) -> list:
    """``n`` derandomized draws of ``strategy`` (the same ones every run)."""
    out: list = []

    @settings(max_examples=n, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value):
        out.append(value)

    collect()
    return out


def test_hosting_sets_the_material_and_restores_it_even_on_error():
    modules = st.just(Q_LINEAR)
    assert not host_material()
    with pytest.raises(RuntimeError), hosting(modules, None):
        assert host_material() == HostMaterial(modules, None) and host_material()
        raise RuntimeError
    assert host_material() == HostMaterial() and not host_material()


def test_without_host_material_the_draws_are_unchanged():
    """Inside an empty ``hosting`` (a target without host material) every strategy draws what it
    draws outside: not one extra choice."""
    specs = tree_specs()
    outside = _drawn(specs)
    with hosting(None, None):
        inside = _drawn(specs)
    assert outside == inside and not any(has_host_leaf(s.root) for s in outside)
    names = [c.name for c in _drawn(conversions())]
    with hosting(None, None):
        assert [c.name for c in _drawn(conversions())] == names


def test_host_modules_are_leaves_inside_drawn_trees():
    with hosting(st.just(Q_LINEAR), None):
        module = find(module_trees(), lambda m: has_host_leaf(tree_info(m).spec.root)
                      and tree_info(m).spec.root.__class__.__name__ == "ContainerSpec",
                      settings=FOUND)
    assert any(type(m) is QLinear for m in module.modules())
    assert f"host: {Q_LINEAR.name}" in tree_info(module).features
    # the spec rebuilds it, with the host module's tensors
    copy = tree_info(module).build()
    assert sum(type(m) is QLinear for m in copy.modules()) == sum(
        type(m) is QLinear for m in module.modules())


def test_host_chance_zero_draws_no_host_leaf():
    with hosting(st.just(Q_LINEAR), None):
        assert not any(has_host_leaf(s.root) for s in _drawn(tree_specs(host_chance=0)))
        assert any(has_host_leaf(s.root) for s in _drawn(tree_specs()))


def test_host_conversions_are_drawn_and_respect_the_filters():
    with hosting(None, st.sampled_from([QUANTIZE, RAISING, ON_META])):
        drawn = {c.name for c in _drawn(conversions(), 150)}
        assert {QUANTIZE.name, RAISING.name, ON_META.name} <= drawn
        no_raise = {c.name for c in _drawn(conversions(raising=False), 150)}
        assert QUANTIZE.name in no_raise and RAISING.name not in no_raise
        cpu_only = {c.name for c in _drawn(conversions(devices=[], raising=False), 150)}
        assert ON_META.name not in cpu_only and QUANTIZE.name in cpu_only
        impl = {c.name for c in _drawn(conversions(where=lambda c: c.changes_impl), 150)}
        assert ON_META.name in impl and QUANTIZE.name not in impl
        lazy = {c.name for c in _drawn(conversions(lazy_safe=True), 150)}
        assert not lazy & {QUANTIZE.name, RAISING.name, ON_META.name}


def test_modules_with_conversions_draws_host_conversions_that_change_the_impl():
    with hosting(st.just(Q_LINEAR), st.just(ON_META)):
        cases = _drawn(modules_with_conversions(module_trees(), where=lambda c: c.changes_impl),
                       100)
    assert any(c.name == ON_META.name for _, c in cases)
    assert any(has_host_leaf(tree_info(m).spec.root) for m, _ in cases)


def test_the_training_properties_draw_only_trainable_host_conversions():
    """``among(..., host=trainable_on_cpu)``: the target's ``trainable`` conversions, never the
    others; with only untrainable ones, the built-ins alone; without host material, exactly
    ``sampled_from``'s draws."""
    plain = [c for c in CONVERSIONS if c.name in ("float()", "double()")]
    with hosting(None, st.sampled_from([QUANTIZE, FAKE_QUANTIZE])):
        drawn = {c.name for c in _drawn(among(plain, host=trainable_on_cpu), 150)}
    assert FAKE_QUANTIZE.name in drawn and QUANTIZE.name not in drawn
    with hosting(None, st.just(QUANTIZE)):
        assert {c.name for c in _drawn(among(plain, host=trainable_on_cpu), 150)} <= {
            c.name for c in plain}
    assert [c.name for c in _drawn(among(plain, host=trainable_on_cpu))] == [
        c.name for c in _drawn(st.sampled_from(plain))]


def test_atomicity_and_refused_swaps_draw_host_conversions_only_with_host_material():
    """A raising fn wraps a host conversion half the time (its repro and imports wrapped too);
    ``value_changing_conversions(hosted=True)`` draws host ones; neither without material."""
    assert set(_drawn(raising_bases())) == {None}
    assert {c.name for c in _drawn(value_changing_conversions(hosted=True))} <= {
        ADD_ONE.name, "add(1), TwoTensor for matrices"}
    with hosting(None, st.sampled_from([QUANTIZE, RAISING])):
        bases = {b.name if b else None for b in _drawn(raising_bases(), 150)}
        assert bases == {None, QUANTIZE.name}  # never a host conversion that raises itself
        hosted = {c.name for c in _drawn(value_changing_conversions(hosted=True), 150)}
        assert QUANTIZE.name in hosted and RAISING.name not in hosted
    wrapped = raising_conversion(2, QUANTIZE)
    assert wrapped.imports == QUANTIZE.imports and "quantize(t)" in wrapped.source()
    fn, matrix = wrapped.make_fn(), torch.randn(3, 3)
    assert type(fn(matrix)).__name__ == "QTensor"
    with pytest.raises(RuntimeError, match="raise_on"):
        fn(matrix)


def test_a_host_conversions_strategy_must_draw_conversions():
    with hosting(None, st.just("not a conversion")), pytest.raises(TypeError, match="Conversion"):
        _drawn(conversions(), 60)


def test_the_plugin_runs_a_target_with_its_material():
    from swapspec.properties.harness.targets import builtin_target

    target = dataclasses.replace(builtin_target("torch"), modules=st.just(Q_LINEAR),
                                 conversions=st.just(QUANTIZE))
    with plugged.running(target):
        assert plugged.CURRENT.get() is target
        assert host_material().conversions is target.conversions
    assert plugged.CURRENT.get() is None and not host_material()
    assert all(c.name != QUANTIZE.name for c in CONVERSIONS)


def test_a_host_module_drawing_from_the_global_rng_builds_alike_and_leaks_nothing():
    """A host constructor that draws from torch's global RNG (``nn.Linear``'s initialization)
    builds the same values every time, and building it leaves the RNG as it was."""
    import random

    from torch import nn

    from swapspec.strategies.host_leaves import build_leaf, register

    entry = register(HostModule("test.GlobalRngLinear", partial(nn.Linear, 3, 2)))
    torch.manual_seed(1234)
    random.seed(5)
    state, py_state = torch.get_rng_state(), random.getstate()
    first, second = build_leaf(entry), build_leaf(entry)
    assert torch.equal(torch.get_rng_state(), state) and random.getstate() == py_state
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters(),
                                                   strict=True))
