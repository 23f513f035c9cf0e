"""Properties of ``apply`` (``nn.Module._apply``): one rule per test.

Origins: pytorch #17072 (``.data =`` broke ``model.to(xla)``), #21613 (the overwrite
flag), #109269 / #113000 (``swap_tensors`` and the swap flag).
"""

from __future__ import annotations

import weakref
from collections import Counter
from functools import partial

import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import apply_repro, method_repro
from swapspec.properties.harness.target_calls import run_apply, run_converted, run_method
from swapspec.properties.models.apply_state import (
    WORLD_CHANCE,
    conversion_named,
    converted_like,
    distinct,
    expected_path,
    is_uninitialized,
    refused_by_swap,
    slot_code,
    snapshot_for_apply,
)
from swapspec.properties.models.examples import (
    Example,
    alias_groups,
    holds_values,
    named_tensors,
    same_values,
    slots,
    value_copy,
)
from swapspec.properties.rules.clauses import check_path, no_error
from swapspec.strategies import FlagSetting, flag_settings, module_trees, value_changing_conversions
from swapspec.strategies.conversions import (
    modules_with_conversions,
    raising_bases,
    raising_conversion,
)
from swapspec.strategies.method_calls import (
    METHOD_CONVERSIONS,
    modules_with_method_calls,
    modules_with_method_conversions,
)
from swapspec.strategies.modules import OwnApplyLeaf
from swapspec.strategies.trees import WRAPPERS

# Each property draws the trees it needs by construction (see module_trees' ``needs``), and a
# conversion that runs on the drawn tree (modules_with_conversions), so few examples are filtered.
# A target's own modules and conversions come through the same strategies (module_trees draws
# host leaves, the conversion draws host conversions: strategies.host_material).
#
# Each property that judges a conversion's effect draws it in either form, one chance in two
# (``either_form``): ``_apply(fn)`` with a modelled fn (what a host's own conversion needs), or
# the public method call users make (``module.to(torch.float64)``, ``module.half()``,
# ``module.to_empty(device='meta')``...), judged by the per-tensor function torch's method
# applies (``strategies.method_calls``). APPLY-FN-ONCE, APPLY-ATOMIC and APPLY-REFUSED-SWAP
# need their own fn, so they call ``_apply(fn)`` only.


def either_form(modules, **options):
    """``(module, conversion)``: ``modules_with_conversions`` or, one chance in two,
    ``modules_with_method_conversions`` (a conversion whose ``call`` is the public method call);
    shrinks towards the ``_apply(fn)`` form."""
    return st.one_of(modules_with_conversions(modules, **options),
                     modules_with_method_conversions(modules, **options))


trees = module_trees(wrappers=WRAPPERS, world_chance=WORLD_CHANCE)  # functional_call refuses DataParallel
converted = modules_with_conversions(trees)
converted_either = either_form(trees)
converted_with_grads = either_form(module_trees(wrappers=WRAPPERS, needs=("grad",)))
converted_with_none_slots = either_form(module_trees(
    wrappers=WRAPPERS, needs=("none-slot",), world_chance=WORLD_CHANCE))
converted_with_ties = either_form(module_trees(
    wrappers=WRAPPERS, tie_chance=100, needs=("alias",), world_chance=WORLD_CHANCE))
container_trees = module_trees(wrappers=WRAPPERS, needs=("container-root",),
                               world_chance=WORLD_CHANCE)
converted_containers = st.one_of(
    modules_with_conversions(container_trees),
    modules_with_method_conversions(container_trees, recurse=False))
converted_across_impls = either_form(trees, where=lambda c: c.changes_impl)
converted_with_overrides = either_form(module_trees(wrappers=WRAPPERS, needs=("own-apply",),
                                                    world_chance=WORLD_CHANCE))


def _setup(target, property_id, module, conversion, flags, recurse=True, fn_may_raise=False):
    """The example, its snapshot and a checker; ``fn`` must not raise unless allowed."""
    recurse = recurse and conversion.recurse  # to_empty(..., recurse=False) as a method call
    example = Example(module, conversion=conversion, flags=flags, recurse=recurse)
    snap = snapshot_for_apply(module, conversion.make_fn, recurse, flags)
    assume(fn_may_raise or snap.expected_error is None)
    assume(not snap.swap_refused)  # a refused swap is APPLY-REFUSED-SWAP's business
    check = Checker(property_id, target, example)
    return example, check, snap


def _verdict(check: Checker, example: Example, target) -> None:
    check.verdict(partial(apply_repro, example, target))


@spec_property("APPLY-PATH")
@given(flags=flag_settings(), case=converted_either)
def test_apply_path(target, flags, case):
    """Each parameter takes the path its flags and TensorImpl compatibility choose.

    set_data keeps the object and its ``_cdata``; swap keeps the object with new
    ``_cdata``; overwrite puts a new object in the slot. Origin: pytorch #21613, #113000.
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-PATH", module, conversion, flags)
    assume(snap.expected_error is None)
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        after = named_tensors(module)
        for name, before in snap.names.items():
            if id(before) not in snap.classes:
                continue  # a buffer: always rebound
            path = expected_path(before, snap.expected[id(before)], flags.overwrite, flags.swap)
            check_path(check, name, before, after[name], snap.cdata[id(before)], path)
    _verdict(check, example, target)


@spec_property("APPLY-NO-SET-DATA-ACROSS-IMPL")
@given(case=converted_across_impls, flags=flag_settings())
def test_apply_never_set_data_across_impl(target, case, flags):
    """A conversion that changes the TensorImpl type succeeds and never goes through ``.data =``.

    Origin: pytorch #17072: ``param.data = fn(param.data)`` broke ``model.to(xla)``.
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-NO-SET-DATA-ACROSS-IMPL", module, conversion,
                                  flags)
    assume(snap.expected_error is None)
    outcome = run_converted(target, example)
    if no_error(check, outcome, f"apply({conversion.name})"):
        after = named_tensors(module)
        for name, before in snap.names.items():
            now = after[name]
            kept_cdata = now is before and now._cdata == snap.cdata[id(before)]
            changed = not converted_like(before, snap.expected[id(before)], values=False)
            check.that(not (kept_cdata and changed and id(before) in snap.classes), "set-data",
                       f"{name!r} kept its object and _cdata across a TensorImpl change")
    _verdict(check, example, target)


@spec_property("APPLY-VALUES")
@given(case=converted_either, flags=flag_settings())
def test_apply_values(target, case, flags):
    """Every parameter and buffer ends with ``fn``'s result: dtype, device, layout and values.

    Values are compared unless the conversion does not preserve them (``to_empty``, meta).
    Origin: the contract of ``nn.Module.to``/``half``/``cpu``.
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-VALUES", module, conversion, flags)
    assume(snap.expected_error is None)
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        after = named_tensors(module)
        for name, before in snap.names.items():
            check.that(converted_like(after[name], snap.expected[id(before)],
                                      conversion.preserves_values), "value",
                       f"{name!r} is not fn's result: got {_describe(after[name])}, "
                       f"want {_describe(snap.expected[id(before)])}")
    _verdict(check, example, target)


def _describe(t) -> str:
    if is_uninitialized(t):
        return f"uninitialized {t.dtype}"
    return f"{type(t).__name__}({t.dtype}, {t.device}, {t.layout}, shape={tuple(t.shape)})"


@spec_property("APPLY-PARAMETER-IDENTITY")
@given(case=converted_either, flags=flag_settings())
def test_apply_keeps_parameter_class_and_attributes(target, case, flags):
    """Every parameter keeps its class, instance attributes and ``requires_grad`` on every path.

    Origin: ``Parameter`` subclasses and lazy modules' ``UninitializedParameter`` broke under
    the overwrite and swap paths (pytorch #113000 discussion).
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-PARAMETER-IDENTITY", module, conversion, flags)
    assume(snap.expected_error is None)
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        after = named_tensors(module)
        for name, before in snap.names.items():
            key = id(before)
            if key not in snap.classes:
                continue
            now = after[name]
            subclass_result = type(snap.expected[key]).__name__ not in (
                "Tensor", "Parameter", snap.classes[key].__name__)
            check.that(subclass_result or type(now) is snap.classes[key], "class",
                       f"{name!r} became {type(now).__name__}, was {snap.classes[key].__name__}",
                       code=f"type({slot_code(name)}) is type(before[{name!r}])")
            kept = _own_attributes(snap.attributes[key], snap.expected[key])
            check.that(all(_same_attribute(getattr(now, a, _MISSING), v) for a, v in kept.items()),
                       "attributes", f"{name!r} lost attributes {sorted(kept)}")
            check.that(now.requires_grad == snap.requires_grad[key], "requires-grad",
                       f"{name!r} requires_grad changed")
    _verdict(check, example, target)


_MISSING = object()


@spec_property("APPLY-GRADS")
@given(case=converted_with_grads, flags=flag_settings())
def test_apply_converts_grads(target, case, flags):
    """A parameter's grad is converted by ``fn`` and keeps its ``requires_grad``; a leaf grad
    stays a leaf (one from ``backward(create_graph=True)`` carries a graph and need not).

    Origin: ``_apply``'s grad handling (pytorch #17072, #113000).
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-GRADS", module, conversion, flags)
    assume(snap.expected_error is None)
    assume(any(g is not None for g in snap.grads.values()))
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        after = named_tensors(module)
        for name, before in snap.names.items():
            grad = snap.grads.get(id(before))
            if grad is None:
                continue
            now = after[name].grad
            if not check.that(now is not None, "grad-lost", f"{name!r} lost its grad",
                              code=f"{slot_code(name)}.grad is not None"):
                continue
            check.that(converted_like(now, snap.expected[id(grad)], conversion.preserves_values),
                       "grad-value", f"{name!r}.grad is not fn(grad): got {_describe(now)}")
            check.that((now.is_leaf or not grad.is_leaf) and now.requires_grad == grad.requires_grad,
                       "grad-leaf", f"{name!r}.grad is not a leaf with its own requires_grad")
            path = expected_path(before, snap.expected[id(before)], flags.overwrite, flags.swap)
            _check_grad_path(check, name, path, grad, now, snap)
    _verdict(check, example, target)


def _check_grad_path(check: Checker, name: str, path: str, grad, now, snap) -> None:
    """Clause ``grad-path``: the grad object stays on the swap path, and on the set_data
    path (with its TensorImpl) when ``fn(grad)`` is compatible; otherwise it is replaced."""
    if path == "swap":
        stays = now is grad
    elif path == "set_data" and torch._has_compatible_shallow_copy_type(grad, snap.expected[id(grad)]):
        stays = now is grad and now._cdata == snap.cdata[id(grad)]
    else:
        return
    check.that(stays, "grad-path", f"{name!r}.grad: on the {path} path the grad object stays",
               code=f"{slot_code(name)}.grad is before[{name!r}].grad")


def _own_attributes(attributes: dict, applied) -> dict:
    """The parameter's instance attributes the spec keeps: those ``fn``'s result (a tensor
    subclass, such as ``TwoTensor``'s ``a`` and ``b``) does not set itself (rule 6)."""
    return {a: v for a, v in attributes.items() if a not in getattr(applied, "__dict__", {})}


def _same_attribute(now, before) -> bool:
    return now is before or (not isinstance(before, torch.Tensor) and now == before)


@spec_property("APPLY-NONE-SLOTS")
@given(case=converted_with_none_slots, flags=flag_settings())
def test_apply_keeps_none_slots(target, case, flags):
    """A ``None``-registered parameter or buffer stays ``None`` and registered.

    Origin: ``_apply`` skips ``None`` entries (``nn.Module`` contract).
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-NONE-SLOTS", module, conversion, flags)
    assume(snap.expected_error is None)
    none_slots = [name for name, v in snap.slots.items() if v is None]
    assume(none_slots)
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        now = slots(module)
        for name in none_slots:
            check.that(name in now and now[name] is None, "none-slot",
                       f"None slot {name!r} became {type(now.get(name)).__name__}")
    _verdict(check, example, target)


@spec_property("APPLY-TIES")
@given(case=converted_with_ties, flags=flag_settings())
def test_apply_keeps_ties(target, case, flags):
    """Names that held one tensor (tied parameters, tied buffers, shared submodules) hold one after.

    Origin: weight tying under ``model.to(xla)`` split ties (pytorch/xla #3718 and
    the torch_xla docs on re-tying weights after ``to``).
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-TIES", module, conversion, flags)
    assume(snap.expected_error is None)
    groups = alias_groups(module)
    assume(groups)
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        after = named_tensors(module)
        for names in groups:
            kind = "parameter" if id(snap.names[names[0]]) in snap.classes else "buffer"
            check.that(len({id(after[n]) for n in names}) == 1, f"{kind}-tie-split",
                       f"tied {kind} names {names} now hold {len({id(after[n]) for n in names})} "
                       "objects", code=f"{slot_code(names[0])} is {slot_code(names[-1])}")
    _verdict(check, example, target)


@spec_property("APPLY-FN-ONCE")
@given(case=converted, flags=flag_settings())
def test_apply_calls_fn_once_per_tensor(target, case, flags):
    """``fn`` runs exactly once for each distinct parameter, grad and buffer object.

    Origin: tied weights were converted twice (``t + 1`` became ``t + 2``) on the
    set_data and swap paths.
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-FN-ONCE", module, conversion, flags)
    assume(snap.expected_error is None)
    fn = conversion.make_fn()
    calls: Counter[int] = Counter()

    def counting(t):
        calls[id(t)] += 1
        return fn(t)

    keep_alive = [*snap.names.values(), *(g for g in snap.grads.values() if g is not None)]
    outcome = run_apply(target, example, counting)
    if no_error(check, outcome, "apply"):
        wanted = {id(t) for t in distinct(keep_alive)}
        repeated = {k: n for k, n in calls.items() if n > 1}
        check.that(not repeated, "fn-repeated", f"fn ran {max(repeated.values(), default=0)} "
                   "times on one tensor object")
        check.that(wanted <= set(calls), "fn-skipped",
                   f"fn never ran on {len(wanted - set(calls))} tensor(s)")
        check.that(set(calls) <= wanted, "fn-on-result",
                   f"fn ran on {len(set(calls) - wanted)} object(s) the module did not hold "
                   "(a result converted again)")
    _verdict(check, example, target)


@spec_property("APPLY-RECURSE-FALSE")
@given(case=converted_containers, flags=flag_settings())
def test_apply_recurse_false_touches_own_tensors_only(target, case, flags):
    """With ``recurse=False`` only the module's own slots change; descendants' tensors do not.

    Origin: ``nn.Module._apply(fn, recurse)`` (pytorch #91795).
    """
    module, conversion = case
    example, check, snap = _setup(target, "APPLY-RECURSE-FALSE", module, conversion, flags,
                                  recurse=False)
    assume(snap.expected_error is None)
    own = {id(t) for t in [*module._parameters.values(), *module._buffers.values()]
           if t is not None}
    others = {n: t for n, t in snap.names.items() if id(t) not in own}
    assume(others)
    values = {n: value_copy(t) for n, t in others.items() if not is_uninitialized(t)}
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        after = named_tensors(module)
        for name, before in others.items():
            check.that(after[name] is before and (name not in values
                                                  or same_values(after[name], values[name])),
                       "descendant-touched", f"{name!r} is not the module's own but changed",
                       code=f"{slot_code(name)} is before[{name!r}]")
    _verdict(check, example, target)


@spec_property("APPLY-OVERRIDE")
@given(case=converted_with_overrides, flags=flag_settings())
def test_apply_runs_each_override_once(target, case, flags):
    """A class's own ``_apply`` work runs once per conversion on each module the conversion
    reaches (every module of the tree, each once; with ``recurse=False`` the module itself),
    after that module's tensors are converted: what it records of them is their converted
    dtype and device. A module out of reach runs none.

    The overriding class is ``strategies.modules.OwnApplyLeaf`` (its work counts and records).
    Origin: ``RNNBase._apply`` rebuilds ``_flat_weights`` after ``super()._apply``, and user
    modules override ``_apply`` the same way to keep state derived from their tensors in step
    (``reference.apply`` rules 9 and 10).
    """
    module, conversion = case
    example, check, _ = _setup(target, "APPLY-OVERRIDE", module, conversion, flags)
    reached = {id(m) for m in (module.modules() if example.recurse else [module])}
    overriding = {name: m for name, m in module.named_modules() if isinstance(m, OwnApplyLeaf)}
    counts = {name: m.conversions for name, m in overriding.items()}
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        for name, leaf in overriding.items():
            _check_override(check, name, leaf, counts[name], id(leaf) in reached)
    _verdict(check, example, target)


def _check_override(check: Checker, name: str, leaf: OwnApplyLeaf, before: int,
                    reached: bool) -> None:
    """Clauses ``override-runs`` (how often the work ran) and, where it ran, ``override-record``
    (what it saw)."""
    code = f"module.get_submodule({name!r})"
    want = before + reached
    check.that(leaf.conversions == want, "override-runs",
               f"the _apply override of {name!r} ran {leaf.conversions - before} times, where "
               f"{int(reached)} run reaches it", code=f"{code}.conversions == {want}")
    if reached and leaf.conversions > before:
        check.that(leaf.record == leaf.own_tensors(), "override-record",
                   f"the _apply override of {name!r} recorded {leaf.record}, not its converted "
                   f"tensors {leaf.own_tensors()}", code=f"{code}.record == {code}.own_tensors()")


@spec_property("APPLY-ATOMIC")
@given(module=module_trees(wrappers=WRAPPERS, needs=("leaf-grads", "tensor"),
                           world_chance=WORLD_CHANCE), flags=flag_settings(),
       data=st.data())
def test_apply_is_atomic(target, module, flags, data):
    """If ``fn`` raises on any tensor, the module is left exactly as it was and the error propagates.

    The error that comes out is the very object ``fn`` raised (which tensor fails first
    depends on the conversion order, which the spec leaves open).

    ``fn`` is ``t + 1`` (or one of the target's own conversions) raising on its k-th call, k
    drawn up to the number of distinct tensors. Origin: swapspec spec (torch converts tensors one by one; a failure halfway leaves a
    half-converted module, e.g. an out-of-memory error during ``model.to('cuda')``).
    """
    n_tensors = len(distinct([*named_tensors(module).values(), *_all_grads(module)]))
    assume(n_tensors > 0)
    # Grads carrying a graph (create_graph=True) make torch assert before fn can raise; they
    # are APPLY-GRADS' business, and this rule is about fn's own error.
    assume(all(g.is_leaf for g in _all_grads(module)))
    k = data.draw(st.integers(1, n_tensors), label="k")
    # A host conversion may return a Parameter subclass (an uninitialized or tagged one) as it
    # is, which the swap and overwrite paths refuse with their own error before fn's:
    # ``swap-refuses-subclass``, the other APPLY properties' business. Such trees raise at t + 1.
    base = None if _holds_parameter_subclass(module) else data.draw(raising_bases(), label="base")
    conversion = raising_conversion(k, base)
    example, check, snap = _setup(target, "APPLY-ATOMIC", module, conversion, flags,
                                  fn_may_raise=True)
    assume(snap.expected_error is not None)
    values, grad_values = _values(snap)
    fn, raised = conversion.make_fn(), []

    def recording(t):
        try:
            return fn(t)
        except Exception as e:
            raised.append(e)
            raise

    outcome = run_apply(target, example, recording)
    check.that(any(outcome.error is e for e in raised), "no-error",
               f"fn raised {[type(e).__name__ for e in raised]} but apply gave "
               f"{type(outcome.error).__name__ if outcome.error else 'no error'}, not fn's error")
    _check_untouched(check, module, snap, values, grad_values)
    _verdict(check, example, target)


def _holds_parameter_subclass(module) -> bool:
    return any(type(p) is not nn.Parameter and issubclass(type(p), nn.Parameter)
               for p in module.parameters())


def _all_grads(module):
    return [p.grad for p in module.parameters() if p.grad is not None]


def _values(snap) -> tuple[dict, dict]:
    """Copies of every tensor's and every grad's values, to compare after a failed apply."""
    values = {n: value_copy(t) for n, t in snap.names.items() if not is_uninitialized(t)}
    grad_values = {k: value_copy(g) for k, g in snap.grads.items() if g is not None}
    return values, grad_values


def _check_untouched(check: Checker, module, snap, values: dict, grad_values: dict) -> None:
    """Clauses ``slot-changed``, ``value-changed``, ``grad-changed``: the module is as it was."""
    now_slots, after = slots(module), named_tensors(module)
    for name, before in snap.slots.items():
        check.that(now_slots.get(name, _MISSING) is before, "slot-changed",
                   f"slot {name!r} holds another object after a failed apply",
                   code=f"{slot_code(name)} is before[{name!r}]")
    for name, value in values.items():
        check.that(same_values(after[name], value), "value-changed",
                   f"{name!r} changed value/dtype after a failed apply",
                   code=_same_value_code(name, value))
    params = {id(t): t for t in snap.names.values()}
    for key, grad in snap.grads.items():
        now = params[key].grad
        check.that(now is grad and (grad is None or same_values(grad, grad_values[key])),
                   "grad-changed", "a grad changed after a failed apply")


def _same_value_code(name: str, value) -> str:
    """Repro code, true while slot ``name`` holds ``value``'s dtype and values (``before``
    holds the same objects, which an in-place conversion changes too)."""
    now = slot_code(name)
    if not holds_values(value) or is_traceable_wrapper_subclass(value):
        return f"{now}.dtype == {value.dtype}"
    return (f"{now}.dtype == {value.dtype} and "
            f"torch.equal({now}.detach(), torch.tensor({value.tolist()!r}, dtype={value.dtype}))")


@spec_property("APPLY-REFUSED-SWAP")
@given(module=module_trees(wrappers=WRAPPERS, lazy=False, needs=("leaf-grads",),
                            world_chance=WORLD_CHANCE),
       conversion=value_changing_conversions(hosted=True), flags=flag_settings(), data=st.data())
def test_apply_refused_swap_changes_nothing(target, module, conversion, flags, data):
    """If a parameter or grad on the swap path cannot be swapped, apply raises ``RuntimeError``
    and the module is left exactly as it was: same objects, values and TensorImpls.

    A weak reference makes ``torch.utils.swap_tensors`` refuse a tensor (``torch.compile``'s
    guards hold such references); the refused tensor is drawn among those the swap path
    replaces. ``fn`` is ``add(1)``, optionally wrapping matrices in ``TwoTensor`` so one call
    mixes paths, or one of the target's own conversions. Origin: swapspec spec (pytorch #113000 added the swap path; torch commits
    tensor by tensor, so those before the refused one stay converted).
    """
    snap = snapshot_for_apply(module, conversion.make_fn)
    assume(snap.expected_error is None)
    # Grads carrying a graph (create_graph=True) can make swap_tensors refuse other tensors
    # first; this rule is about the one refused tensor drawn here.
    assume(all(g.is_leaf for g in _all_grads(module)))
    candidates = _swapped_tensors(snap, flags)
    if not candidates:  # nothing takes the swap path under these flags: the swap flag sends all
        flags = FlagSetting(flags.overwrite, swap=True)
        candidates = _swapped_tensors(snap, flags)
    assume(candidates)  # a tree without parameters
    refused = data.draw(st.sampled_from(sorted(candidates)), label="refused")
    example = Example(module, conversion=conversion, flags=flags, refused=refused)
    check = Checker("APPLY-REFUSED-SWAP", target, example)
    values, grad_values = _values(snap)
    held = weakref.ref(candidates[refused])
    outcome = run_apply(target, example, conversion.make_fn())
    check.that(isinstance(outcome.error, RuntimeError), "no-error",
               f"apply gave {type(outcome.error).__name__ if outcome.error else 'no error'}, "
               f"not RuntimeError, with {refused!r} refusing to swap")
    del held  # the refusal held for the whole call
    _check_untouched(check, module, snap, values, grad_values)
    grads = [g for g in snap.grads.values() if g is not None]
    for tensor in distinct([*snap.names.values(), *grads]):
        check.that(tensor._cdata == snap.cdata[id(tensor)], "cdata-changed",
                   "a tensor holds another TensorImpl after a failed apply")
    _verdict(check, example, target)


def _swapped_tensors(snap, flags) -> dict[str, object]:
    """``{name: tensor}`` for each parameter the swap path takes, and its grad (``name.grad``)."""
    found: dict[str, object] = {}
    for name, param in snap.names.items():
        key = id(param)
        if key not in snap.classes or any(t is param for t in found.values()):
            continue  # a buffer, or another name of a parameter already listed
        if expected_path(param, snap.expected[key], flags.overwrite, flags.swap) == "swap":
            found[name] = param
            if snap.grads[key] is not None:
                found[f"{name}.grad"] = snap.grads[key]
    return found


@spec_property("APPLY-ROUND-TRIP")
@given(module=trees, flags=flag_settings(), public=st.booleans())
def test_apply_double_then_float_restores_values(target, module, flags, public):
    """``double()`` then ``float()`` gives back every float32 tensor's values exactly.

    Drawn as ``_apply(fn)`` with the modelled fns, or as the public calls ``module.double()``
    then ``module.float()``. Origin: the ``nn.Module.double``/``float`` contract; float64 holds
    every float32.
    """
    names = ("module.double()", "module.float()") if public else ("double()", "float()")
    there, back = (_method_conversion(n) if public else conversion_named(n) for n in names)
    assume(not (flags.swap and refused_by_swap(module)))  # APPLY-REFUSED-SWAP's business
    example = Example(module, conversion=there, flags=flags)
    check = Checker("APPLY-ROUND-TRIP", target, example)
    before = {n: value_copy(t) for n, t in named_tensors(module).items()
              if not is_uninitialized(t)}
    outcome = run_converted(target, example)
    if no_error(check, outcome, "double()"):
        example.conversion = back
        outcome = run_converted(target, example)
        example.conversion = there
    if no_error(check, outcome, "float()"):
        after = named_tensors(module)
        for name, value in before.items():
            want = value.float() if value.is_floating_point() else value
            check.that(same_values(after[name], want), "round-trip",
                       f"{name!r} changed over double() then float()")
    _verdict(check, example, target)



method_trees = module_trees(wrappers=WRAPPERS, world_chance=WORLD_CHANCE)


def _method_setup(target, property_id, module, call, flags):
    """The example of a public method call, its snapshot (no conversion: ``fn`` is the
    identity, so only slots, grads and values are read) and a checker. A conversion form's
    example also carries its ``Conversion``, so declarations that read the conversion (torch's
    breaks of the invariants, ``INV-*``) can describe it."""
    conversion = next((c for c in METHOD_CONVERSIONS if c.call == call), None)
    example = Example(module, flags=flags, method=call, conversion=conversion)
    snap = snapshot_for_apply(module, lambda: (lambda t: t))
    return example, Checker(property_id, target, example), snap


def _method_verdict(check: Checker, example: Example, target) -> None:
    check.verdict(partial(method_repro, example, target))


@spec_property("APPLY-METHOD-ARGS")
@given(case=modules_with_method_calls(method_trees), flags=flag_settings())
def test_apply_methods_take_torchs_argument_forms(target, case, flags):
    """Each public method (``to``, ``to_empty``, ``half``, ``float``, ``double``, ``bfloat16``,
    ``type``, ``cpu``, ``share_memory``, ``requires_grad_``, ``zero_grad``) accepts exactly
    torch's argument forms: a good form returns the module (``zero_grad``: None); a bad form
    (an integral dtype for ``to``, a bad argument type or count, an unknown device or type
    string) raises torch's error type, whatever the module holds, and leaves the module
    exactly as it was. (Whether a good conversion form runs, and what it does, the other APPLY
    properties judge: they draw the same calls.)

    Origin: ``nn.Module.to``'s documented forms and its ``TypeError`` "nn.Module.to only accepts
    floating point or complex dtypes" (raised before ``_apply``, so the module is untouched).
    """
    module, call = case
    if call.kind == "conversion":  # a good form that must run: its fn runs on every tensor
        conversion = next(c for c in METHOD_CONVERSIONS if c.call == call)
        snap = snapshot_for_apply(module, conversion.make_fn, flags=flags)
        assume(snap.expected_error is None and not snap.swap_refused)
    example, check, snap = _method_setup(target, "APPLY-METHOD-ARGS", module, call, flags)
    values, grad_values = _values(snap)
    requires_grad = {n: t.requires_grad for n, t in snap.names.items()}
    outcome = run_method(target, example, call)
    if call.kind != "bad":
        # A good conversion form that raises is the APPLY properties' business (they draw the
        # same forms, with torch's declared raising cases); a grad form must not raise.
        if outcome.error is None or (call.kind == "grad" and no_error(check, outcome, call.name)):
            want = None if call.method == "zero_grad" else module
            check.that(outcome.result is want, "returned",
                       f"{call.name} returned {type(outcome.result).__name__}, not "
                       f"{'None' if want is None else 'the module'}")
    else:
        error = outcome.error
        check.that(isinstance(error, call.error), "bad-form-accepted",
                   f"{call.name} gave {type(error).__name__ if error else 'no error'}, not "
                   f"{call.error.__name__}")
        if error is not None and getattr(target, "exact_messages", False):
            check.that(str(error).startswith(call.message), "message",
                       f"{call.name} raised {str(error)!r}, not {call.message!r}...")
        _check_untouched(check, module, snap, values, grad_values)
        now = named_tensors(module)
        check.that(all(now[n].requires_grad == r for n, r in requires_grad.items()),
                   "requires-grad-changed", f"{call.name} changed a requires_grad")
    _method_verdict(check, example, target)


@spec_property("APPLY-METHOD-GRADS")
@given(case=modules_with_method_calls(method_trees, kinds=("grad",)), flags=flag_settings())
def test_apply_grad_methods(target, case, flags):
    """``requires_grad_(b)`` sets every parameter's ``requires_grad`` to ``b``;
    ``zero_grad(set_to_none=True)`` sets every grad to None, ``set_to_none=False`` keeps each
    grad object, detached, with ``requires_grad=False`` and every value zero. Neither puts
    another object in any slot, changes a buffer or a parameter's value, or touches the other
    one's state.

    Origin: ``nn.Module.requires_grad_`` (freezing for fine-tuning) and ``zero_grad``
    (pytorch #92656 made ``set_to_none=True`` the default).
    """
    module, call = case
    example, check, snap = _method_setup(target, "APPLY-METHOD-GRADS", module, call, flags)
    values, _ = _values(snap)
    args, kwargs = call.args()
    outcome = run_method(target, example, call)
    if no_error(check, outcome, call.name):
        now_slots, now = slots(module), named_tensors(module)
        for name, before in snap.slots.items():
            check.that(now_slots.get(name, _MISSING) is before, "slot-changed",
                       f"slot {name!r} holds another object after {call.name}",
                       code=f"{slot_code(name)} is before[{name!r}]")
        for name, value in values.items():
            check.that(same_values(now[name], value), "value-changed",
                       f"{name!r} changed value after {call.name}")
        params = {n: t for n, t in snap.names.items() if id(t) in snap.classes}
        if call.method == "requires_grad_":
            wanted = (args or (kwargs.get("requires_grad", True),))[0]
            for name, p in params.items():
                check.that(p.requires_grad == wanted, "requires-grad",
                           f"{name!r}.requires_grad is {p.requires_grad}, not {wanted}")
                check.that(p.grad is snap.grads[id(p)], "grad-changed",
                           f"{name!r}.grad changed under requires_grad_")
        else:
            to_none = (args or (kwargs.get("set_to_none", True),))[0]
            for name, p in params.items():
                check.that(p.requires_grad == snap.requires_grad[id(p)], "requires-grad",
                           f"{name!r}.requires_grad changed under zero_grad")
                _check_zeroed(check, name, snap.grads[id(p)], p.grad, to_none)
    _method_verdict(check, example, target)


def _check_zeroed(check: Checker, name: str, grad, now, to_none: bool) -> None:
    """Clause ``grad-not-zeroed``: None with ``set_to_none``, else the same grad object,
    detached, not requiring grad, all zeros (a grad that was None stays None)."""
    if grad is None or to_none:
        check.that(now is None, "grad-not-zeroed", f"{name!r}.grad is not None after zero_grad",
                   code=f"{slot_code(name)}.grad is None")
        return
    zeroed = now is grad and now.grad_fn is None and not now.requires_grad and (
        not holds_values(now) or not bool(now.detach().to_dense().any()))
    check.that(zeroed, "grad-not-zeroed", f"{name!r}.grad is not the same grad zeroed and "
               "detached after zero_grad(set_to_none=False)")


def _method_conversion(name: str):
    """The public method call ``name`` (``"module.double()"``) as its implied conversion."""
    return next(c for c in METHOD_CONVERSIONS if c.name == name)
