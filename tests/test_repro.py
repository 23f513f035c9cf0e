"""Repros stand alone: each kind runs in a fresh interpreter, from a directory outside the
checkout, fails (AssertionError) on the target that broke the rule and passes on the reference.

Each case runs one property's body (``.hypothesis.inner_test``) on a fixed example, so the
repro is the one a run would print for that example. Torch-target repros run without
``PYTHONPATH``; the planted and zoo targets are imported from the checkout.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from swapspec.properties.harness.checker import ConformanceError
from swapspec.properties.harness.repro import retargeted
from swapspec.properties.harness.targets import builtin_target, load_target
from swapspec.properties.models import standalone
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.models.examples import alias_groups, named_tensors, same_values
from swapspec.properties.rules import test_apply, test_apply_training, test_functional_call
from swapspec.reference import overrides
from swapspec.strategies import CallInput, FlagSetting, build_tree, module_trees, tree_info
from swapspec.strategies.trees import (
    WORLDS,
    WRAPPERS,
    ContainerSpec,
    LeafSpec,
    ShareSpec,
    TensorSpec,
    TieSpec,
    TreeSpec,
)
from tests.repro_scripts import run_script

REPO = Path(__file__).resolve().parents[1]
PLANTED = "tests.planted.broken_reference"
ONE = LeafSpec(tensors=(TensorSpec("p0"),))
TWO = LeafSpec(tensors=(TensorSpec("p0"), TensorSpec("p1")))
TIED = TreeSpec(root=ContainerSpec(children=(ONE, ONE)), ties=(TieSpec(slots=(("0", "p0"), ("1", "p0"))),))
SHARED = TreeSpec(root=ContainerSpec(children=(ONE,)), shares=(ShareSpec(source="0", parent="", name="1"),))
REBINDING = TreeSpec(root=LeafSpec(tensors=(TensorSpec("p0"),), behaviours=("rebind",)))


class Draws:
    """Stands in for Hypothesis' ``data``: each ``draw`` gives the value preset for its label."""

    def __init__(self, **values: Any) -> None:
        self.values = values

    def draw(self, strategy: Any, label: str) -> Any:
        return self.values[label]


def x() -> torch.Tensor:
    return torch.linspace(-1, 1, 8).reshape(2, 4)


def undeclared(name: str):
    """A built-in target without its declared deviations, so its known bugs fail."""
    return dataclasses.replace(builtin_target(name), deviations=())


def apply_case(spec, conversion="add(1)", overwrite=False, swap=False):
    """Arguments of an apply property drawn as a ``(module, conversion)`` case."""
    return {"case": (build_tree(spec), conversion_named(conversion)),
            "flags": FlagSetting(overwrite, swap)}


def training_case(spec, conversion="add(1)", overwrite=False, swap=False):
    """Arguments of a training property, which draws the module and the conversion apart."""
    return {"module": build_tree(spec), "conversion": conversion_named(conversion),
            "flags": FlagSetting(overwrite, swap)}


def call_case(spec, tensors, **draws):
    module = build_tree(spec)
    call = CallInput(tensors, (x(),), {})
    return {"data": Draws(module=module, call=call, **draws)}


CASES = {
    # apply on torch: plain nn.Module._apply, the overwrite flag splits a tie
    "apply-torch": (test_apply.test_apply_keeps_ties, lambda: undeclared("torch"),
                    lambda: apply_case(TIED, overwrite=True), None),
    # a third-party target named torch*: imported by its selector, never module._apply
    "apply-torch-named": (test_apply.test_apply_keeps_ties, lambda: load_target(f"{PLANTED}:torch_named"),
                          lambda: apply_case(TIED), REPO),
    # training repros: hooks registered before and after, then backward
    "apply-hooks-torch": (test_apply_training.test_apply_keeps_tensor_hooks, lambda: undeclared("torch"),
                          lambda: {**training_case(TreeSpec(root=ONE), "float()", overwrite=True),
                                   "earlier": [], "inputs": (x(),)}, None),
    # functional_call on torch: a shared submodule's slot restored in the wrong order
    "call-restore-torch": (test_functional_call.test_fc_restores_module, lambda: undeclared("torch"),
                           lambda: call_case(SHARED, {"0.p0": torch.zeros(4)},
                                             **{"raise in forward": False, "invalid": False}), None),
    # FC-RESTORE not-restored: the original parameter is not put back
    "call-not-restored": (test_functional_call.test_fc_restores_module,
                          lambda: load_target(f"{PLANTED}:no_restore"),
                          lambda: call_case(TreeSpec(root=ONE), {"p0": torch.zeros(4)},
                                            **{"raise in forward": False, "invalid": False}), REPO),
    # FC-RESTORE: the root's _parameters come back in another order
    "call-reordered": (test_functional_call.test_fc_restores_module,
                       lambda: load_target(f"{PLANTED}:reordered"),
                       lambda: call_case(TreeSpec(root=TWO), {"p0": torch.zeros(4)},
                                         **{"raise in forward": False, "invalid": False}), REPO),
    # FC-GRADIENTS: the repro gives the grad leaf the property added to the drawn call
    "call-gradients": (test_functional_call.test_fc_gradients_flow_to_given_tensors_only,
                       lambda: load_target(f"{PLANTED}:detaching"),
                       lambda: call_case(TreeSpec(root=TWO), {"p0": torch.zeros(4)}), REPO),
    # FC-INPUT-FORMS: the overlapping split itself is what the repro passes
    "call-overlap-accepted": (test_functional_call.test_fc_input_forms,
                              lambda: load_target(f"{PLANTED}:overlap_accepted"),
                              lambda: call_case(TreeSpec(root=TWO), {"p0": torch.zeros(4), "p1": torch.ones(4)},
                                                **{"split at": 1}), REPO),
    # FC-WRITE-BACK: a rebound buffer given in a tuple of dicts does not reach the caller's dict
    "call-write-back": (test_functional_call.test_fc_write_back,
                        lambda: load_target("tests.zoo.tuple_write_back_lost:target"),
                        lambda: call_case(REBINDING, {"p0": torch.zeros(4), "count": torch.tensor(5)},
                                          split=True, **{"split at": 1}), REPO),
}


def repro_of(test: Any, target: Any, make_example: Any) -> str:
    """The repro a run prints when ``test`` fails on ``make_example()`` (a fresh one per run:
    Hypothesis runs the failing example again to report it)."""

    @settings(max_examples=1, database=None, deadline=None, phases=[Phase.generate])
    @given(example=st.builds(make_example))
    def run(example):
        test.hypothesis.inner_test(target=target, **example)

    with pytest.raises(ConformanceError) as e:
        run()
    return e.value.repro


@pytest.mark.slow  # a pytest run in a subprocess per case: CI-only (see pyproject's markers)
@pytest.mark.parametrize("case", list(CASES))
def test_repro_fails_on_the_target_and_passes_on_the_reference(case, tmp_path):
    test, make_target, make_example, pythonpath = CASES[case]
    target = make_target()
    script = repro_of(test, target, make_example)
    assert "from swapspec" not in script.replace("from swapspec import reference as target", "")
    assert "import swapspec" not in script
    assert [line for line in script.splitlines() if line.strip()][-1].startswith("assert")
    if pythonpath is not None:  # a third-party target: its own code, by its selector
        assert "importlib.import_module(" in script and "module._apply" not in script
    broken = run_script(script, tmp_path / "target", pythonpath=pythonpath)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert any(line.startswith("AssertionError") for line in broken.stderr.splitlines()), broken.stderr[-2000:]
    reference = run_script(retargeted(script, builtin_target("reference")), tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]


def test_overlap_repro_passes_the_overlapping_split():
    test, make_target, make_example, _ = CASES["call-overlap-accepted"]
    script = repro_of(test, make_target(), make_example)
    assert "overlap = (dict(items[:cut + 1]), dict(items[max(cut, 1) - 1:]))" in script
    assert "target_functional_call(module, overlap," in script
    assert "assert isinstance(out, ValueError)" in script


def test_write_back_repro_asserts_on_names_it_defines():
    test, make_target, make_example, _ = CASES["call-write-back"]
    script = repro_of(test, make_target(), make_example)
    assert "assert entries(tensors)['count'] is not given['count']" in script
    assert "given = entries(tensors)" in script.split("assert entries", 1)[0]


# ---- the plain-torch builder ------------------------------------------------------------


def _built_from_source(module: torch.nn.Module) -> torch.nn.Module:
    build = standalone.build_source(module)
    catalogue = "catalogue_leaf(" in "\n".join(build)
    names = standalone.names_used(build) | ({"seeded", "CatalogueLeaf"} if catalogue else set())
    lines = [*standalone.IMPORTS, *standalone.definitions(names),
             *(standalone.CATALOGUE_LEAF if catalogue else []), *build, "module = build_module()"]
    namespace: dict[str, Any] = {}
    described = overrides.registered_apply_overrides()  # the script describes its own classes
    try:
        with torch.random.fork_rng(devices=[]):
            exec(compile("\n".join(lines), "<built>", "exec"), namespace)
    finally:
        overrides.restore_registered_apply_overrides(described)
    return namespace["module"]


def _storage_layout(module: torch.nn.Module) -> tuple[set[frozenset[str]], set[str]]:
    """Which names share one storage, and which names are views."""
    by_storage: dict[int, set[str]] = {}
    for name, t in named_tensors(module).items():
        if type(t) in (torch.Tensor, torch.nn.Parameter) and not t.is_meta and t.layout == torch.strided:
            by_storage.setdefault(t.untyped_storage().data_ptr(), set()).add(name)
    views = {n for n, t in named_tensors(module).items() if isinstance(t, torch.Tensor)
             and not isinstance(t, torch.nn.parameter.UninitializedTensorMixin) and t._is_view()}
    return {frozenset(names) for names in by_storage.values()}, views


def _same_tree(got: torch.nn.Module, want: torch.nn.Module) -> None:
    a, b = named_tensors(got), named_tensors(want)
    assert list(a) == list(b)
    for name, t in b.items():
        assert (type(a[name]).__name__, a[name].requires_grad) == (type(t).__name__, t.requires_grad), name
        if not isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
            assert same_values(a[name].detach(), t.detach()), name
        grads = getattr(a[name], "grad", None), getattr(t, "grad", None)
        assert (grads[0] is None) == (grads[1] is None), name
        if grads[1] is not None:
            assert same_values(grads[0].detach(), grads[1].detach()), name
    assert alias_groups(got) == alias_groups(want)
    assert _storage_layout(got) == _storage_layout(want)
    assert [(p, type(m).__name__) for p, m in got.named_modules(remove_duplicate=False)] == [
        (p, type(m).__name__) for p, m in want.named_modules(remove_duplicate=False)]
    outputs = []
    for module in (got, want):
        try:
            outputs.append(module(x()))
        except Exception as e:  # both must raise alike
            outputs.append(type(e).__name__)
    if isinstance(outputs[1], str):
        assert outputs[0] == outputs[1]
    else:
        assert same_values(outputs[0].detach(), outputs[1].detach())


@settings(max_examples=20, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# ``dtensor`` would start a process group here; tests/test_tensor_worlds.py rebuilds that world.
@given(module=module_trees(wrappers=WRAPPERS, worlds=[w for w in WORLDS if w != "dtensor"],
                           world_chance=25))
def test_plain_torch_builder_rebuilds_the_drawn_tree(module):
    """``build_source`` builds, without swapspec, the tree ``build_tree`` builds: the same names,
    classes, values, grads, ties, modules and forward."""
    _same_tree(_built_from_source(module), tree_info(module).build())


def test_repro_helpers_describe_a_lazy_leaf_before_and_after_its_forward():
    """A repro's helpers describe an uninitialized tensor without reading its shape (which
    raises), in the module's state and in forward's first view, and its shape once
    materialized."""
    from swapspec.properties.harness.repro import HELPERS

    helpers: dict[str, Any] = {}
    exec(compile("\n".join([*standalone.IMPORTS, HELPERS]), "<helpers>", "exec"), helpers)
    module = torch.nn.Sequential(torch.nn.LazyLinear(2))
    seen = helpers["watch"](module, {}, {})
    before = helpers["state"](module, helpers["snapshot"](module))
    assert "uninitialized" in before["0.weight"]
    module(torch.ones(1, 3))
    assert seen["forward ran"] and "uninitialized" in seen["0.weight"]
    assert "(2, 3)" in helpers["describe"](module[0].weight)


def test_a_message_that_spans_lines_stays_a_comment_in_the_repro() -> None:
    """An error's text can print a tensor over several lines; each becomes a comment line, so
    the repro still compiles."""
    from swapspec.properties.harness.repro import comment_lines

    lines = comment_lines("broken rule [raised]: got RuntimeError: bad\nTensor:\n 0.94\n")
    assert lines == ["# broken rule [raised]: got RuntimeError: bad", "# Tensor:", "#  0.94"]
    compile("\n".join(["x = 1", *lines]), "<repro>", "exec")
