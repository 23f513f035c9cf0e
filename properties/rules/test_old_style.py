"""Properties of the old-style (forward-pre-hook) reparametrizations on modules the target
converted: ``torch.nn.utils.prune`` (every pruning method, one or two of them on a tensor) and the
old ``torch.nn.utils.weight_norm``, made permanent after the conversion. One rule per test.

Each property draws a tree with a plain matrix parameter (``module_trees(needs=
('parametrizable',))``), reparametrizes it (``strategies.old_style``), converts the tree with the
target, runs forward and makes the reparametrization permanent (``prune.remove``,
``remove_weight_norm``): what users do to ship a pruned or weight-normed model after
``model.half()`` or ``model.to(device)``.

Origins: the documentation of ``torch.nn.utils.prune`` (its tutorial: prune, train, then
``prune.remove`` to make the pruning permanent) and of ``weight_norm``/``remove_weight_norm``.
"""

from __future__ import annotations

from functools import partial

from hypothesis import assume, event, given
from hypothesis import strategies as st
from torch import nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import apply_repro
from swapspec.properties.harness.target_calls import run_converted
from swapspec.properties.models.examples import Example, same_values
from swapspec.properties.models.invariants import input_for
from swapspec.properties.models.load_examples import changes, snapshot_for_load
from swapspec.properties.models.module_model import parameter_class
from swapspec.properties.models.old_style_state import (
    hook_keys,
    kept_slots,
    reparametrized_value,
)
from swapspec.properties.models.outcomes import attempt, seeded_forward
from swapspec.properties.models.parametrize_state import matrix_slot, owner_at
from swapspec.strategies import Conversion, flag_settings, module_trees
from swapspec.strategies.conversions import modules_with_conversions
from swapspec.strategies.old_style import OldStyle, old_styles

# Hooks that count and change nothing; the reparametrizations are this file's own.
TREE_OPTIONS = {"lazy": False, "needs": ("parametrizable",), "wrappers": (),
                "decoration_kinds": ("tensor-hooks", "module-hooks"), "catalogue": False,
                "behaviours": ()}


def _values_defined(conversion: Conversion) -> bool:
    """Not ``to_empty``: its values are uninitialized memory, which the rules compare."""
    return not conversion.name.startswith("to_empty")


converted = modules_with_conversions(module_trees(**TREE_OPTIONS), ["cpu"], where=_values_defined)

# An example builds, reparametrizes, converts and runs a tree three times: a quarter of the
# profile's examples keeps the property within the suite's time budget.
EXAMPLES_DIVISOR = 4


@spec_property("OLD-STYLE-REMOVE", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_remove_after_apply(target, data):
    """After the target converts a module whose matrix is pruned (any method, once or twice) or
    weight-normed the old way, forward makes the tensor read its reparametrization of the
    converted slots (``mask * orig``; ``g * v / ||v||``); making it permanent (``prune.remove``,
    ``remove_weight_norm``) then leaves a parameter holding that value (a pruning: in
    ``<name>_orig``'s object), drops the kept slots from the module and its state dict, leaves
    none of its hooks, and forward still runs. A removal raises only where that value does not
    compute, and then leaves the module as it was.

    Origin: ``torch.nn.utils.prune``'s documentation (``prune.remove`` makes the pruning
    permanent) and ``remove_weight_norm``'s; swapspec spec (a removal raises only where the
    reparametrized value does not compute, and then leaves the module as it was; the removal is the target's ``prune_remove``/``remove_weight_norm``, torch's for
    ``torch``).
    """
    module, conversion = data.draw(converted, label="module and conversion")
    path, name = matrix_slot(module)
    owner = owner_at(module, path)
    hooks = hook_keys(owner)
    old_style = data.draw(old_styles(getattr(owner, name).dim()), label="old style")
    old_style.apply(owner, name)
    for feature in sorted(old_style.features):
        event(f"old style: {feature}")
    example = Example(module, conversion=conversion, flags=data.draw(flag_settings(), label="flags"),
                      method=old_style)
    check = Checker("OLD-STYLE-REMOVE", target, example)
    assume(run_converted(target, example).error is None)
    x = input_for(module)
    output = seeded_forward(module, x)
    expected = attempt(lambda: reparametrized_value(owner, name, old_style))
    if output.error is None and expected.error is None:
        check.that(same_values(getattr(owner, name).detach(), expected.result), "hook",
                   f"after forward {name!r} does not read the reparametrization of the converted "
                   f"{' and '.join(kept_slots(old_style, name))}")
    kept = {s: getattr(owner, s) for s in kept_slots(old_style, name)}
    before, decorated = snapshot_for_load(module), hook_keys(owner)
    remove = target.method(old_style.removal)
    removal = attempt(lambda: remove(owner, name, overwrite=False, swap=False))
    event(f"removal: {'raised' if removal.error else 'returned'}")
    if removal.error is not None:
        check.that(expected.error is not None, "raised",
                   f"the removal raised {removal.error!r} where the reparametrized value "
                   f"computes")
        check.that(not changes(before, module) and hook_keys(owner) == decorated, "changed",
                   f"the removal raised {removal.error!r} and changed the module: "
                   f"{changes(before, module)[:4]}")
    else:
        _check_removed(check, module, path, name, old_style, kept, expected.result, hooks)
        after = seeded_forward(module, x)
        check.that(after.error is None or output.error is not None, "forward",
                   f"forward raises after the removal: {after.error!r}")
    check.verdict(_repro(example, target, path, name, old_style, x))


def _check_removed(check: Checker, module: nn.Module, path: str, name: str, old_style: OldStyle,
                   kept: dict, value: object, hooks: dict) -> None:
    """The clauses of a removal that returned: slot, value, leftovers, state dict, hooks."""
    owner = owner_at(module, path)
    slot = owner._parameters.get(name)
    check.that(slot is not None and type(slot) is parameter_class(slot), "slot",
               f"{name!r} is not a parameter after the removal: {type(slot).__name__}")
    if old_style.first is not None:
        orig = kept[name + "_orig"]
        check.that(slot is orig, "object", f"{name!r} does not hold {name}_orig's object")
    if value is not None and slot is not None:
        check.that(same_values(slot.detach(), value), "value",
                   f"{name!r} does not hold the reparametrized value")
    left = [s for s in kept if s in owner._parameters or s in owner._buffers or hasattr(owner, s)]
    check.that(not left, "leftovers", f"the removal left {left} on the module")
    prefix = f"{path}." if path else ""
    keys = set(module.state_dict())
    check.that(prefix + name in keys and not {prefix + s for s in kept} & keys, "state-dict",
               f"the state dict's keys for {name!r}: "
               f"{sorted(k for k in keys if k.startswith(prefix + name))}")
    check.that(hook_keys(owner) == hooks, "hooks",
               f"the module's hooks are not those it had before the reparametrization: "
               f"{hook_keys(owner)} (before: {hooks})")


def _repro(example: Example, target, path: str, name: str, old_style: OldStyle, x):
    owner = f"module.get_submodule({path!r})"
    return partial(apply_repro, example, target, setup=old_style.source(owner, name), extra=[
        f"x = torch.linspace(-2, 2, {x.numel()}).reshape{tuple(x.shape)}",
        "with torch.no_grad(): module(x)",
        f"target_method({owner}, {old_style.removal!r}, False, False, {name!r})"])
