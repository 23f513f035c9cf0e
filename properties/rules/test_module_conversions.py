"""Properties of a host's module conversions (``Target.module_conversions``: a
``strategies.ModuleConversion`` that changes a whole module in place, as ``quantize_(model)``),
held to ``_apply``'s rules where they apply: one rule per test.

A target without module conversions skips the family (``vocabulary.NEEDS``). Modules are
module trees, with the target's own modules among their leaves; each conversion is the
target's, a fresh function per example. Repros are standalone scripts with the host's imports at
the head, that run the conversion and exit 1 (a failed assert) on the violation.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.plugged import CURRENT
from swapspec.properties.harness.repro import asserting_repro
from swapspec.properties.models.apply_state import slot_code
from swapspec.properties.models.examples import (
    Example,
    alias_groups,
    holds_values,
    named_tensors,
    same_values,
    value_copy,
)
from swapspec.properties.models.invariants import input_for
from swapspec.properties.models.outcomes import attempt
from swapspec.properties.rules.contract_checks import before_copies, check_contract
from swapspec.strategies import host_trees, module_trees
from swapspec.strategies.contracts import raising_allowed
from swapspec.strategies.trees import WRAPPERS

trees = module_trees(wrappers=WRAPPERS, lazy=False)
tied = module_trees(wrappers=WRAPPERS, lazy=False, tie_chance=100, needs=("alias",))
trainable = module_trees(wrappers=WRAPPERS, lazy=False, needs=("leaf-grads",))

CONVERT_BODY = ["try:", "    convert(module)", "    error = None", "except Exception as e:",
                "    error = e", "    print('raised', type(e).__name__, e)",
                "after = named(module)"]


@st.composite
def _conversion(draw: Any) -> Any:
    return draw(CURRENT.get().module_conversions)


def _draw(data: st.DataObject, modules: st.SearchStrategy = trees,
          wanted: Any = None) -> tuple[nn.Module, Any]:
    """``(module, conversion)``: the conversion, then a module; with ``wanted``
    (``(module, conversion) -> bool``), a module that lacks it is redrawn among the target's
    own modules (a few tries), which hold what its conversions convert more often than drawn
    trees do, so few examples are filtered."""
    conversion = data.draw(_conversion(), label="module conversion")
    module = data.draw(modules, label="module")
    own = getattr(CURRENT.get(), "modules", None)
    for _ in range(HOST_TRIES if wanted is not None and own is not None else 0):
        if wanted(module, conversion):
            break
        module = data.draw(host_trees(own), label="host module")
    return module, conversion


HOST_TRIES = 4


def _checker(property_id: str, target: Any, module: nn.Module, conversion: Any
             ) -> tuple[Example, Checker]:
    example = Example(module, conversion=conversion)
    return example, Checker(property_id, target, example)


def _verdict(check: Checker, example: Example, target: Any, setup: list[str] = ()) -> None:
    """The verdict, with a repro that sets up, converts and asserts each broken rule's code."""
    def repro(violations: list) -> str:
        asserts = [(v.code, v.message) for v in violations if v.code]
        body = [*setup, "before = named(module)", *example.conversion.source(), *CONVERT_BODY]
        return asserting_repro(example, target, body, asserts)

    check.verdict(repro)


def _converted(module: nn.Module, conversion: Any):
    """The conversion run on ``module``: its ``Outcome`` (the error, if it raised)."""
    fn = conversion.make_fn()
    return attempt(lambda: fn(module))


def _check_raised(check: Checker, conversion: Any, before: dict, error: BaseException) -> None:
    check.that(raising_allowed(conversion.contract, list(before.values())), "raised",
               f"{conversion.name} raised {type(error).__name__}: {error} where its contract "
               f"({conversion.contract.text}) accepts every tensor of the module",
               code="error is None")


@spec_property("MODCONV-CONTRACT")
@given(data=st.data())
def test_module_conversion_meets_its_contract(target, data):
    """Every tensor a module conversion converts meets its contract, and it raises only where its contract lets it.

    Each tensor after the conversion is checked against the tensor before (dtype, device,
    class, values within the tolerance through the library's own dequantization); one the
    contract does not convert is left as it was. Origin: swapspec issue 34 (``quantize_``-style
    conversions had no slot in the suite).
    """
    module, conversion = _draw(data)
    example, check = _checker("MODCONV-CONTRACT", target, module, conversion)
    before = before_copies(module)
    converted = conversion.converted_names(module, named_tensors(module))
    outcome = _converted(module, conversion)
    if outcome.error is not None:
        _check_raised(check, conversion, before, outcome.error)
    else:
        check_contract(check, conversion.contract, before, named_tensors(module), converted)
    _verdict(check, example, target)


@spec_property("MODCONV-TIES")
@given(data=st.data())
def test_module_conversion_keeps_ties(target, data):
    """A module conversion keeps every tie: names that shared one tensor share one after it.

    Origin: ``_apply`` converts a tied tensor once and every slot sees the result (APPLY-TIES);
    a quantizer that converts each slot on its own unties weights (swapspec issue 34).
    """
    module, conversion = _draw(data, tied, _ties_converted)
    example, check = _checker("MODCONV-TIES", target, module, conversion)
    groups = alias_groups(module)
    outcome = _converted(module, conversion)
    if outcome.error is None:
        after = named_tensors(module)
        for group in groups:
            first = group[0]
            for other in group[1:]:
                check.that(after[other] is after[first], "tie-split",
                           f"{first!r} and {other!r} were tied and are not after "
                           f"{conversion.name}", code=f"after[{other!r}] is after[{first!r}]")
    _verdict(check, example, target)


@spec_property("MODCONV-IDENTITY")
@given(data=st.data())
def test_module_conversion_keeps_parameters_for_the_optimizer(target, data):
    """A module conversion keeps every parameter object, so an optimizer built before still holds the module's parameters; one documented to rebind (``rebinds=True``) puts an ``nn.Parameter`` in each slot it converts and keeps the rest.

    Origin: ``_apply`` keeps parameter objects on its default and swap paths (APPLY-PATH),
    which optimizers rely on (swapspec issue 34).
    """
    module, conversion = _draw(data)
    example, check = _checker("MODCONV-IDENTITY", target, module, conversion)
    params = dict(module.named_parameters(remove_duplicate=False))
    distinct = list({id(p): p for p in params.values()}.values())
    optimizer = torch.optim.SGD(distinct, lr=0.1) if distinct else None
    converted = conversion.converted_names(module, named_tensors(module))
    outcome = _converted(module, conversion)
    if outcome.error is None:
        now = dict(module.named_parameters(remove_duplicate=False))
        held = {id(p) for group in getattr(optimizer, "param_groups", ())
                for p in group["params"]}
        for name, p in params.items():
            if conversion.rebinds and name in converted:
                check.that(isinstance(now.get(name), nn.Parameter), "rebinding",
                           f"{name!r} is no nn.Parameter after {conversion.name} (it rebinds)",
                           code=f"isinstance(after.get({name!r}), nn.Parameter)")
                continue
            check.that(now.get(name) is p, "identity",
                       f"{name!r} is another object after {conversion.name}, so the "
                       "optimizer built before no longer steps it",
                       code=f"after.get({name!r}) is before[{name!r}]")
            check.that(id(now.get(name)) in held or name not in now, "optimizer",
                       f"the optimizer built before does not hold {name!r}")
    _verdict(check, example, target)


def _hook(*args: Any, **kwargs: Any) -> None:
    return None


HOOK_SETUP = ["def _hook(*args, **kwargs):", "    return None",
              "pre = module.register_forward_pre_hook(_hook)",
              "post = module.register_forward_hook(_hook)",
              "tensor_hooks = {n: p.register_hook(_hook) for n, p in named(module).items()"
              " if isinstance(p, nn.Parameter) and p.requires_grad}"]


@spec_property("MODCONV-HOOKS")
@given(data=st.data())
def test_module_conversion_keeps_hooks(target, data):
    """A module conversion keeps the module's forward hooks, and the tensor hooks of every parameter it does not rebind.

    Origin: ``_apply`` never touches hooks and keeps parameter objects (so their hooks); a
    quantizer that rebuilds modules or parameters drops them (swapspec issue 34).
    """
    module, conversion = _draw(data, trainable)
    example, check = _checker("MODCONV-HOOKS", target, module, conversion)
    pre, post = module.register_forward_pre_hook(_hook), module.register_forward_hook(_hook)
    params = {n: p for n, p in named_tensors(module).items()
              if isinstance(p, nn.Parameter) and p.requires_grad}
    tensor_hooks = {n: p.register_hook(_hook) for n, p in params.items()}
    converted = conversion.converted_names(module, named_tensors(module))
    outcome = _converted(module, conversion)
    if outcome.error is None:
        for kind, handle, hooks in (("pre", pre, module._forward_pre_hooks),
                                    ("post", post, module._forward_hooks)):
            check.that(handle.id in hooks, "module-hook",
                       f"the module's forward {kind}-hook is gone after {conversion.name}",
                       code=f"{kind}.id in module.{hooks_name(kind)}")
        after = named_tensors(module)
        for name, handle in tensor_hooks.items():
            if conversion.rebinds and name in converted:
                continue  # a documented rebinding: the new parameter has no hooks
            kept = after.get(name) is not None and handle.id in (after[name]._backward_hooks
                                                                 or {})
            check.that(kept, "tensor-hook",
                       f"{name!r}'s tensor hook is gone after {conversion.name}",
                       code=f"tensor_hooks[{name!r}].id in (after[{name!r}]._backward_hooks "
                            "or {})")
    _verdict(check, example, target, HOOK_SETUP)


def _ties_converted(module: nn.Module, conversion: Any) -> bool:
    """Whether a tie of ``module`` joins tensors the conversion converts."""
    converted = conversion.converted_names(module, named_tensors(module))
    return any(len(set(group) & converted) > 1 for group in alias_groups(module))


def hooks_name(kind: str) -> str:
    return "_forward_pre_hooks" if kind == "pre" else "_forward_hooks"


def _refusable(module: nn.Module, conversion: Any) -> list[str]:
    """Names of the tensors the conversion converts that ``refuse`` can spoil: initialized
    plain floating tensors, one name per object."""
    tensors = named_tensors(module)
    converted = conversion.converted_names(module, tensors)
    seen, names = set(), []
    for name, t in tensors.items():
        if id(t) in seen or name not in converted or not holds_values(t) \
                or not t.is_floating_point() \
                or type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
            continue
        seen.add(id(t))
        names.append(name)
    return names


@spec_property("MODCONV-ATOMIC")
@given(data=st.data())
def test_module_conversion_is_atomic(target, data):
    """A module conversion that refuses one tensor raises and leaves the module exactly as it was: the same objects, classes and values in every slot.

    The tensor is one it would convert, made one it refuses (``ModuleConversion.refuse``);
    the others come before and after it. Origin: swapspec's core promise, bad input leaves the
    module as it was (APPLY-ATOMIC for ``_apply``).
    """
    module, conversion = _draw(data, wanted=lambda m, c: bool(_refusable(m, c)))
    assume(conversion.refuse is not None)
    names = _refusable(module, conversion)
    assume(names)
    spoiled = data.draw(st.sampled_from(names), label="refused tensor")
    with torch.no_grad():
        conversion.make_refuse()(named_tensors(module)[spoiled])
    example, check = _checker("MODCONV-ATOMIC", target, module, conversion)
    before = named_tensors(module)
    values = {n: value_copy(t) for n, t in before.items() if holds_values(t)}
    outcome = _converted(module, conversion)
    check.that(outcome.error is not None, "no-error",
               f"{conversion.name} converted a module with {spoiled!r} spoiled by "
               f"{conversion.refuse} without raising", code="error is not None")
    after = named_tensors(module)
    for name, t in before.items():
        now = after.get(name)
        same = now is t and type(now) is type(t) and (
            name not in values or same_values(now, values[name]))
        check.that(same, "changed",
                   f"{name!r} changed though {conversion.name} raised",
                   code=f"after.get({name!r}) is before[{name!r}] and type(after[{name!r}]) is "
                        f"classes[{name!r}]")
    setup = ["with torch.no_grad():", f"    ({conversion.refuse})({slot_code(spoiled)})",
             "classes = {n: type(t) for n, t in named(module).items()}"]
    _verdict(check, example, target, setup)


@spec_property("MODCONV-WORKING")
@given(data=st.data())
def test_module_works_after_conversion(target, data):
    """After a module conversion the module works: forward runs, backward runs where a parameter is trainable, and its state_dict loads back into it.

    Origin: ``_apply``'s ``INV-WORKING``; a quantized model must still run, train what is
    trainable and checkpoint (swapspec issue 34).
    """
    module, conversion = _draw(data)
    x = input_for(module)
    assume(x is not None)
    example, check = _checker("MODCONV-WORKING", target, module, conversion)
    outcome = _converted(module, conversion)
    if outcome.error is None:
        _check_works(check, module, x)
    setup = [f"x = torch.linspace(-2, 2, {x.numel()}).reshape{tuple(x.shape)}"]
    _verdict(check, example, target, setup)


def _check_works(check: Checker, module: nn.Module, x: torch.Tensor) -> None:
    ran = attempt(lambda: module(x))
    if not check.that(ran.error is None, "forward",
                      f"forward raised {type(ran.error).__name__}: {ran.error}",
                      code="module(x) is not None"):
        return
    out = ran.result
    if isinstance(out, torch.Tensor) and out.requires_grad:
        back = attempt(lambda: out.sum().backward())
        check.that(back.error is None, "backward",
                   f"backward raised {type(back.error).__name__}: {back.error}",
                   code="module(x).sum().backward() is None")
    loaded = attempt(lambda: module.load_state_dict(module.state_dict()))
    check.that(loaded.error is None, "state-dict",
               f"load_state_dict(state_dict()) raised {type(loaded.error).__name__}: "
               f"{loaded.error}", code="module.load_state_dict(module.state_dict()) is not None")
