"""Properties of ``load_state_dict`` under the swap flag: one rule per test.

Origins: pytorch #113000 (the swap flag reaches ``load_state_dict`` through ``module_load`` and
``swap_tensors``), ``assign=True`` for ``meta`` models, the ``Tensor.module_load``
extension point (tensor subclasses).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import load_repro
from swapspec.properties.models.apply_state import slot_code
from swapspec.properties.models.examples import Example, named_tensors
from swapspec.properties.models.load_examples import (
    changes,
    conflicting_groups,
    key_model,
    loaded_values,
    snapshot_for_load,
)
from swapspec.properties.rules.clauses import no_error
from swapspec.properties.rules.load_clauses import (
    check_load_path,
    expected_paths,
    holds_value,
    run_load,
    slot_ties,
)
from swapspec.strategies import module_trees
from swapspec.strategies.state_dicts import LoadInput, state_dicts, swap_flags

# Each property draws the inputs it judges by construction: loads the spec accepts
# (``outcome='succeeds'``) or refuses (``'fails'``), the swap flag only where swap_tensors accepts
# the module's tensors (``refusable=False``), trees with a tie, or with a parameter to swap.
trees = module_trees(lazy=False)
swappable_trees = module_trees(lazy=False, needs=("swappable", "parameter"))
tied_trees = module_trees(lazy=False, tie_chance=100, needs=("tie",))
SAFE_KINDS = ("own", "fresh", "other-dtype", "own-tensor", "one-element")  # no path refuses them


def require_load_state_dict(target: Any) -> None:
    """A target without ``load_state_dict`` skips every LOAD- property, with this reason."""
    if getattr(target, "load_state_dict", None) is None:
        pytest.skip(f"{target.name} has no load_state_dict")


@pytest.fixture(autouse=True)
def _needs_load_state_dict(request: pytest.FixtureRequest) -> None:
    callspec = getattr(request.node, "callspec", None)
    target = callspec.params.get("target") if callspec else None
    if target is not None:
        require_load_state_dict(target)


def _setup(target, property_id: str, module: nn.Module, load: LoadInput):
    example = Example(module, load=load)
    return example, Checker(property_id, target, example)


def _verdict(check: Checker, example: Example, target: Any) -> None:
    check.verdict(partial(load_repro, example, target))


def loads(modules: st.SearchStrategy[nn.Module] = trees, safe: bool = False, **options: Any):
    """A tree and an input whose load the spec accepts (``safe``: only kinds no path refuses)."""
    kinds = SAFE_KINDS if safe else ("own", "fresh", "other-dtype", "meta", "two-tensor",
                                     "own-tensor", "one-element")
    return modules.flatmap(lambda m: st.tuples(st.just(m), state_dicts(
        m, kinds=kinds, invalid=False, outcome="succeeds", **options)))


@spec_property("LOAD-PATH")
@given(drawn=loads())
def test_load_path(target, drawn):
    """Each tensor takes the path the swap flag and ``assign`` choose: copy keeps the object
    and its TensorImpl, assign puts the value in the slot, swap keeps the object with a new
    TensorImpl; with ``assign``, a value that is the slot's own data leaves it as it is.

    Origin: pytorch #113000 (``module_load`` and ``swap_tensors`` under the swap flag), and
    ``load_state_dict``'s ``assign`` argument (loading into ``meta`` models).
    """
    module, load = drawn
    example, check = _setup(target, "LOAD-PATH", module, load)
    before = named_tensors(module)
    cdata = {id(t): t._cdata for t in before.values()}
    expected = expected_paths(before, load)
    outcome = run_load(target, example)
    if no_error(check, outcome, "load_state_dict"):
        after = named_tensors(module)
        for key, path in expected.items():
            check_load_path(check, key, before[key], after[key], cdata[id(before[key])], path)
    _verdict(check, example, target)


@spec_property("LOAD-VALUES")
@given(drawn=loads())
def test_load_values(target, drawn):
    """After a load every slot holds the value its tensor object is loaded from (its key's, or
    for tied names given the object's own data and another value, the other one): cast to the
    slot's dtype and device on the copy and swap paths, the value's own with ``assign``.

    Origin: the contract of ``nn.Module.load_state_dict`` (its documentation: ``assign=True``
    keeps the state dict's tensor properties, ``requires_grad`` apart).
    """
    module, load = drawn
    example, check = _setup(target, "LOAD-VALUES", module, load)
    before = named_tensors(module)
    kinds = {id(t): (t.dtype, t.device) for t in before.values()}
    loaded = loaded_values(before, load.state_dict)
    outcome = run_load(target, example)
    if no_error(check, outcome, "load_state_dict"):
        after = named_tensors(module)
        for key, value in loaded.items():
            dtype, device = (value.dtype, value.device) if load.assign else kinds[id(before[key])]
            check.that(holds_value(after[key], value, dtype, device), "value",
                       f"{key!r} does not hold its value as {dtype} on {device}: "
                       f"got {after[key].dtype} on {after[key].device}")
    _verdict(check, example, target)


@spec_property("LOAD-KEYS")
@given(module=trees, data=st.data())
def test_load_keys(target, module, data):
    """The result is torch's ``(missing_keys, unexpected_keys)``; a load raises torch's
    ``RuntimeError("Error(s) in loading state_dict for <Class>: ...")`` exactly when a value
    is not a tensor or has another shape, tied names get different values, or (with
    ``strict``) keys are missing or unexpected; each reason is named in the message.

    Origin: ``nn.Module.load_state_dict``'s documented return value and errors (``strict``,
    missing and unexpected keys, size mismatches).
    """
    load = data.draw(state_dicts(module, kinds=SAFE_KINDS, refusable=False), label="load")
    example, check = _setup(target, "LOAD-KEYS", module, load)
    model = key_model(module, load.state_dict)
    outcome = run_load(target, example)
    error = outcome.error
    if model.fails(load.strict):
        message = str(error) if error is not None else ""
        if check.that(isinstance(error, RuntimeError), "raised-none" if error is None else "error",
                      f"expected torch's RuntimeError, got {type(error).__name__}: {error}"):
            for key in _named_in_message(model, load.strict):
                check.that(f'"{key}"' in message or f"for {key}:" in message, "message",
                           f"the message does not name {key!r}: {message[:300]}")
            _check_conflict_named(check, model, message)
    elif no_error(check, outcome, "load_state_dict"):
        result = outcome.result
        check.that(sorted(result.missing_keys) == sorted(model.missing)
                   and sorted(result.unexpected_keys) == sorted(model.unexpected), "keys",
                   f"returned {result!r}, expected missing {model.missing}, "
                   f"unexpected {model.unexpected}")
    _verdict(check, example, target)


def _named_in_message(model, strict: bool) -> list[str]:
    keys = list(model.bad_values)
    if strict:
        keys += model.missing + model.unexpected
    return keys


def _check_conflict_named(check: Checker, model, message: str) -> None:
    for group in model.conflicts:
        check.that("tied names" in message and any(f'"{k}"' in message for k in group[1:]),
                   "message",
                   f"the message does not name the tied keys {group}: {message[:300]}")


@spec_property("LOAD-ATOMIC")
@given(module=trees, data=st.data())
def test_load_atomic(target, module, data):
    """A load that fails (a bad value, conflicting tied values, or with ``strict`` a missing or
    unexpected key) raises torch's ``RuntimeError`` and leaves the module exactly as it was:
    the same objects in every slot, with the same class, TensorImpl, attributes,
    ``requires_grad``, grad and values.

    Origin: swapspec spec (torch loads key by key and collects the errors, so every key
    before and after the bad one is loaded; a typo in one checkpoint key leaves a model
    half-loaded).
    """
    load = data.draw(state_dicts(module, kinds=("own", "fresh"), outcome="fails"), label="load")
    # a drawn conflict where the other tied value is the slot's own data is none (rule 6)
    assume(key_model(module, load.state_dict).fails(load.strict))
    example, check = _setup(target, "LOAD-ATOMIC", module, load)
    before = snapshot_for_load(module)
    outcome = run_load(target, example)
    check.that(isinstance(outcome.error, RuntimeError), "raised-none",
               f"expected torch's RuntimeError, got {outcome.error!r}")
    changed = changes(before, module)
    check.that(not changed, "changed", f"the failed load changed the module: {changed[:4]}")
    _verdict(check, example, target)


@spec_property("LOAD-TIES")
@given(module=tied_trees, data=st.data())
def test_load_ties(target, module, data):
    """Names that held one tensor before a load hold one tensor after, on every path, with the
    value it is loaded from: a value that is the object's own data yields to a tied name's
    other value, in either order; tied names given different values (neither own data) raise
    torch's ``RuntimeError`` and change nothing.

    Origin: weight tying (tied embeddings of language models; pytorch #86708 for
    ``functional_call``); with ``assign=True`` torch puts a new Parameter into each slot.
    """
    load = data.draw(state_dicts(module, kinds=SAFE_KINDS, invalid=False, refusable=False),
                     label="load")
    groups = slot_ties(module)
    assume(groups)  # a tie the tree's training forward split (rebinding a tied buffer)
    example, check = _setup(target, "LOAD-TIES", module, load)
    before = snapshot_for_load(module)
    names = named_tensors(module)
    loaded = loaded_values(names, load.state_dict)
    conflicts = conflicting_groups(module, load.state_dict)
    outcome = run_load(target, example)
    if conflicts:
        check.that(isinstance(outcome.error, RuntimeError), "conflict-accepted",
                   f"tied keys {conflicts[0]} got different values and the load did not raise")
        if outcome.error is not None:
            changed = changes(before, module)
            check.that(not changed, "changed", f"the refused load changed the module: "
                                               f"{changed[:4]}")
    elif no_error(check, outcome, "load_state_dict"):
        after = named_tensors(module)
        for group in groups:
            check.that(len({id(after[n]) for n in group}) == 1, "tie-split",
                       f"{group} held one tensor and now hold "
                       f"{len({id(after[n]) for n in group})}",
                       code=" is ".join(slot_code(n) for n in group[:2]))
            _check_tie_values(check, group, names, after, loaded, load.assign)
    _verdict(check, example, target)


def _check_tie_values(check: Checker, group: list[str], names: dict[str, Tensor],
                      after: dict[str, Tensor], loaded: dict[str, Any], assign: bool) -> None:
    """Clause ``tie-value``: each name of a tie holds the value its object is loaded from."""
    value = next((loaded[n] for n in group if n in loaded), None)
    if not isinstance(value, Tensor):
        return  # no key of the object given
    for name in group:
        slot = names[name]
        dtype, device = (value.dtype, value.device) if assign else (slot.dtype, slot.device)
        check.that(holds_value(after[name], value, dtype, device), "tie-value",
                   f"{name!r} (tied with {[n for n in group if n != name]}) does not hold the "
                   "value its tensor is loaded from")


@spec_property("LOAD-IDENTITY")
@given(drawn=loads(swappable_trees, safe=True, swap=True))
def test_load_identity_on_swap_path(target, drawn):
    """On the swap path every parameter object stays in its slot with its class (the value's
    with ``assign``), instance attributes, ``requires_grad``, grad and tensor hooks, a hook
    registered after the load fires, and an optimizer built before the load still holds it.

    Origin: pytorch #113000 (the swap path exists to keep parameter identity, so optimizers
    and hooks built before ``load_state_dict`` keep working).
    """
    module, load = drawn
    example, check = _setup(target, "LOAD-IDENTITY", module, load)
    params = list({id(p): p for p in module.parameters()}.values())
    assume(params)  # a safety net: needs=("parameter",) gives every tree one
    records = {id(p): (type(p), dict(p.__dict__), p.requires_grad, p.grad) for p in params}
    optimizer = torch.optim.SGD(params, lr=0.0)
    fired: list[int] = []
    hooked = [p for p in params if _hookable(p)]
    handles = [p.register_hook(_recorder(fired, id(p))) for p in hooked]
    outcome = run_load(target, example)
    if no_error(check, outcome, "load_state_dict"):
        _check_identity(check, module, params, records, optimizer, load)
        _check_hooks(check, hooked, fired)
    for handle in handles:
        handle.remove()
    _verdict(check, example, target)


def _recorder(fired: list[int], ident: int):
    def hook(grad: Tensor) -> None:
        fired.append(ident)

    return hook


def _hookable(p: nn.Parameter) -> bool:
    return (p.requires_grad and p.is_floating_point() and not p.is_meta
            and not is_traceable_wrapper_subclass(p))


def _check_identity(check: Checker, module, params, records, optimizer, load) -> None:
    now = {id(p) for p in module.parameters()}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for p in params:
        cls, attributes, requires_grad, grad = records[id(p)]
        name = next((n for n, q in module.named_parameters() if q is p), "?")
        check.that(id(p) in now and id(p) in held, "object",
                   f"parameter {name!r} left its slot or the optimizer")
        check.that(load.assign or type(p) is cls, "class",
                   f"{name!r} changed class {cls.__name__} -> {type(p).__name__}")
        check.that(all(k in p.__dict__ for k in attributes), "attributes",
                   f"{name!r} lost instance attributes {sorted(set(attributes) - set(p.__dict__))}")
        check.that(p.requires_grad == requires_grad, "requires-grad", f"{name!r} requires_grad")
        check.that(grad is None or p.grad is not None, "grad", f"{name!r} lost its grad")


def _check_hooks(check: Checker, hooked: list[nn.Parameter], fired: list[int]) -> None:
    """Clauses ``tensor-hooks`` (each hook registered before the load fires on a backward
    after it) and ``after-hook-lost`` (so does a hook registered on the parameter after the
    load); the backward leaves each grad as it was."""
    live = [p for p in hooked if p.requires_grad and not p.is_meta
            and not is_traceable_wrapper_subclass(p)]
    if not live:
        return
    fired_after: list[int] = []
    handles = [p.register_hook(_recorder(fired_after, id(p))) for p in live]
    grads = {id(p): p.grad for p in live}
    try:
        torch.autograd.backward([(p.real if p.is_complex() else p).sum() for p in live])
    finally:
        for p in live:
            p.grad = grads[id(p)]
        for handle in handles:
            handle.remove()
    check.that(all(id(p) in fired for p in live), "tensor-hooks",
               f"{sum(id(p) not in fired for p in live)} of {len(live)} register_hook hooks "
               "stopped firing after the load")
    check.that(all(id(p) in fired_after for p in live), "after-hook-lost",
               f"{sum(id(p) not in fired_after for p in live)} of {len(live)} register_hook "
               "hooks registered after the load never fired")


@spec_property("LOAD-ROUND-TRIP")
@given(module=module_trees(), strict=st.booleans(), assign=st.booleans(), data=st.data())
def test_load_round_trip(target, module, strict, assign, data):
    """Loading ``module.state_dict()`` back into the module changes nothing, whatever the swap
    flag, ``assign`` and ``strict``: the same objects in every slot, with the same class,
    attributes, ``requires_grad``, grad, values and ties.

    Origin: checkpoint round trips (``model.load_state_dict(model.state_dict())`` in training
    loops and tests); ``assign=True`` and the swap path each replace something.
    """
    swap = data.draw(swap_flags(module), label="swap")
    load = LoadInput(module.state_dict(), strict, assign, swap)
    example, check = _setup(target, "LOAD-ROUND-TRIP", module, load)
    before = snapshot_for_load(module)
    outcome = run_load(target, example)
    if no_error(check, outcome, "load_state_dict"):
        changed = [c for c in changes(before, module) if not c.endswith("TensorImpl replaced")]
        check.that(not changed, "changed", f"the round trip changed the module: {changed[:4]}")
    _verdict(check, example, target)
