"""Targets say what they implement, and plug in their own conversions and modules.

Unit tests of ``properties.harness.targets.Target`` and ``properties.harness.plugged``, and one run of real
properties on ``tests.planted.functional_only`` (a functional call without keywords).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import find
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from swapspec import reference
from swapspec.properties import vocabulary
from swapspec.properties.harness import plugged
from swapspec.properties.harness.targets import (
    FEATURES,
    Target,
    TargetError,
    from_object,
    load_target,
)
from swapspec.strategies import HostModule, tree_info
from swapspec.strategies.host_leaves import HostLeaf
from tests.planted import functional_only
from tests.test_plugin import run_pytest

ONLY = "tests.planted.functional_only"


def test_a_module_without_apply_is_a_functional_call_only_target():
    target = load_target(ONLY)
    assert target.selector == ONLY
    assert not target.has("apply") and target.has("functional_call")
    assert not target.has("tie_weights") and not target.has("strict")
    assert target.missing(vocabulary.NEEDS["APPLY-TIES"]) == ["apply"]
    assert target.missing(vocabulary.NEEDS["FC-STRICT"]) == ["strict"]
    assert target.missing(vocabulary.NEEDS["FC-TIES"]) == []
    assert target.missing(vocabulary.NEEDS["FC-INPUT-FORMS"]) == ["tuple_inputs"]  # call_forms: a dict
    assert target.call_keywords(tie_weights=False, strict=True) == {}


def test_builtin_targets_have_every_feature_they_define():
    target = from_object(reference)
    assert all(target.has(f) for f in ("apply", "functional_call", "tie_weights", "strict"))
    assert target.call_keywords(tie_weights=False, strict=True) == {"tie_weights": False,
                                                                    "strict": True}


def test_keyword_features_need_functional_call():
    apply_only = Target("apply-only", apply=reference.apply)
    assert not apply_only.has("functional_call") and not apply_only.has("strict")


@pytest.mark.parametrize(("obj", "message"), [
    (SimpleNamespace(name="x"), "has none of apply, functional_call"),
    (SimpleNamespace(apply=reference.apply), "has no name"),
    (SimpleNamespace(name="x", apply=reference.apply, lacks={"tie-weights"}),
     "lacks unknown feature(s) tie-weights"),
])
def test_a_target_that_cannot_be_is_refused(obj, message):
    with pytest.raises(TargetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_object(obj)


def test_every_property_states_what_it_needs():
    assert set(vocabulary.NEEDS) == set(vocabulary.ALL)
    assert all(set(needs) <= set(FEATURES) for needs in vocabulary.NEEDS.values())


def _draw_with(target, strategy, condition):
    with plugged.running(target):
        return find(strategy, condition)


def test_a_targets_modules_are_drawn_and_rebuilt():
    from swapspec.properties.rules.test_functional_call import trees

    target = load_target(ONLY)
    module = _draw_with(target, trees, lambda m: isinstance(m, HostLeaf))
    copy = tree_info(module).build()
    assert isinstance(copy.inner, functional_only.Scale) and copy.inner is not module.inner
    assert list(dict(copy.named_parameters())) == ["inner.weight"]
    assert "leaf: host" in tree_info(module).features


@pytest.mark.slow  # a pytest run in a subprocess per case: CI-only (see pyproject's markers)
def test_without_a_target_only_the_builtins_are_drawn():
    from swapspec.properties.rules.test_apply import converted

    with pytest.raises(NoSuchExample):
        find(converted, lambda case: case[1].name == "planted.double_it")


def test_a_targets_conversions_are_drawn_and_run_with_their_imports():
    import torch

    from swapspec.properties.rules.test_apply import converted

    _, conversion = _draw_with(load_target(ONLY), converted,
                               lambda case: case[1].name == "planted.double_it")
    assert torch.equal(conversion.make_fn()(torch.ones(2)), torch.full((2,), 2.0))
    source = conversion.source()
    assert "double_it = lambda t: t * 2" in source
    namespace: dict = {}
    exec(source, namespace)
    assert torch.equal(namespace["fn"](torch.ones(1)), torch.full((1,), 2.0))


def test_host_module_strategy_must_draw_host_modules():
    from swapspec.strategies import host_trees

    with pytest.raises(TypeError, match="must draw HostModule"):
        find(host_trees(st.just(functional_only.Scale)), lambda m: True)
    assert HostModule("x", functional_only.Scale).inputs(1) == (1,)


def test_functional_call_only_target_runs_without_keywords_and_skips_once(tmp_path):
    """Keywords passed to the keyword-less call would raise TypeError and fail FC-ORACLE."""
    report = tmp_path / "r.json"
    run = run_pytest(tmp_path, "properties/rules/test_functional_call.py::test_fc_matchesloaded_copy",
                     "properties/rules/test_functional_call.py::test_fc_strict",
                     "properties/rules/test_apply.py::test_apply_values",
                     f"--swapspec-target={ONLY}", "-p", "tests.planted.fast_profile",
                     f"--swapspec-report={report}", timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    table = json.loads(report.read_text())["table"]
    cells = {pid: row["functional-only"] for pid, row in table.items()}
    assert cells["FC-ORACLE"]["status"] == "pass"
    assert cells["FC-STRICT"] == {**cells["FC-STRICT"], "status": "skipped",
                                  "reason": "functional-only does not implement strict"}
    assert cells["APPLY-VALUES"]["reason"] == "functional-only does not implement apply"


def test_a_call_without_tie_weights_is_drawn_as_tie_weights_false():
    from swapspec.properties.harness.target_calls import fixed_keywords, target_call_inputs
    from swapspec.strategies import build_tree
    from swapspec.strategies.trees import TreeSpec

    module = build_tree(TreeSpec())
    keyless, full = load_target(ONLY), load_target("reference")
    assert find(target_call_inputs(keyless, module), lambda c: True).tie_weights is False
    with pytest.raises(NoSuchExample):
        find(target_call_inputs(keyless, module), lambda c: c.tie_weights)
    assert find(target_call_inputs(full, module), lambda c: True).tie_weights is True
    assert find(target_call_inputs(full, module), lambda c: not c.tie_weights).tie_weights is False
    # a call a property builds itself (FC-PARAMETRIZED) takes the same fixed keywords
    assert fixed_keywords(keyless) == {"tie_weights": False, "strict": False,
                                       "lacking": frozenset({"tie_weights", "strict"})}
    assert fixed_keywords(full) == {}


@pytest.mark.slow  # a pytest run in a subprocess: CI-only (see pyproject's markers)
def test_a_target_without_tie_weights_is_held_to_the_tie_weights_false_rules(tmp_path):
    """The target that writes each name on its own passes the tie rules, the oracle and the
    gradient rule with no declaration; the same target filling ties fails FC-TIES."""
    report = tmp_path / "r.json"
    rules = "properties/rules/test_functional_call.py"
    run = run_pytest(tmp_path, f"{rules}::test_fc_tie_rules", f"{rules}::test_fc_matchesloaded_copy",
                     f"{rules}::test_fc_gradients_flow_to_given_tensors_only",
                     f"--swapspec-target={ONLY},{ONLY}:tying", "-p", "tests.planted.fast_profile",
                     f"--swapspec-report={report}", "-p", "no:xdist", timeout=300)
    table = json.loads(report.read_text())["table"]
    assert {pid: row["functional-only"]["status"] for pid, row in table.items()} == {
        "FC-TIES": "pass", "FC-ORACLE": "pass", "FC-GRADIENTS": "pass"}, run.output[-3000:]
    assert table["FC-TIES"]["functional-only-tying"]["status"] == "fail"
    assert run.returncode == 1


def test_a_falsifying_example_does_not_show_options_the_target_lacks():
    from hypothesis.vendor.pretty import pretty

    from swapspec.properties.harness.target_calls import target_call_inputs
    from swapspec.strategies import build_tree
    from swapspec.strategies.trees import TreeSpec

    module = build_tree(TreeSpec())
    keyless = find(target_call_inputs(load_target(ONLY), module), lambda c: True)
    full = find(target_call_inputs(load_target("reference"), module), lambda c: True)
    for shown in (repr(keyless), pretty(keyless)):
        assert "tie_weights" not in shown and "strict" not in shown and "tensors=" in shown
    for shown in (repr(full), pretty(full)):
        assert "tie_weights=True" in shown and "strict=False" in shown


def test_a_host_modules_source_rebuilds_it_when_it_can():
    from functools import partial

    from torch import nn

    namespace: dict = {}
    exec(HostModule("lin", partial(nn.Linear, 4, out_features=2)).source(), namespace)
    assert isinstance(namespace["inner"], nn.Linear) and namespace["inner"].out_features == 2
    assert HostModule("s", functional_only.Scale).source() == (
        "from tests.planted.functional_only import Scale\ninner = Scale()\n")
    assert HostModule("anon", lambda: nn.Linear(4, 4)).source() is None
    assert HostModule("obj", partial(nn.Linear, object())).source() is None


def test_a_repro_passes_only_the_keywords_the_target_takes():
    import torch

    from swapspec.properties.harness.repro import call_repro
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import CallInput, build_tree
    from swapspec.strategies.trees import TreeSpec

    module = build_tree(TreeSpec())
    call = CallInput({}, (torch.zeros(2, 4),), {}, tie_weights=True, strict=False)
    example = Example(module, call=call)
    keyless = call_repro(example, load_target(ONLY), [])
    assert "target_functional_call(module, tensors, args, kwargs))" in keyless
    full = call_repro(example, load_target("reference"), [])
    assert "target_functional_call(module, tensors, args, kwargs, tie_weights=True, strict=False))" in full
