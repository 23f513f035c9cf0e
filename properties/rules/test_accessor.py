"""Properties of torch's ``NamedMemberAccessor`` (``torch.nn.utils._named_member_accessor``), the
engine of torch's functional call, on modules the target converted: one rule per test.

Each property draws a tree, converts it with the target's ``apply`` (or public method) and then
reads, sets, swaps or deletes its tensors and children by dotted name through a fresh accessor,
as ``torch.func.functional_call`` and ``torch.func.stack_module_state`` users do. The accessor is
torch's for every target: the target decides only the state the module is left in.

Origin: the docstrings of ``NamedMemberAccessor``'s methods (``get_tensor``, ``set_tensor``,
``swap_tensor``, ``del_tensor``, their batched forms and ``swap_submodule``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import apply_repro, is_torch
from swapspec.properties.harness.target_calls import run_converted
from swapspec.properties.models import invariants
from swapspec.properties.models.call_state import registration_state
from swapspec.properties.models.examples import Example, slots, value_copy
from swapspec.properties.models.outcomes import Outcome, attempt, same_output
from swapspec.properties.models.parametrize_state import forward
from swapspec.properties.rules.clauses import no_error
from swapspec.strategies import flag_settings, module_trees
from swapspec.strategies.conversions import modules_with_conversions

# No forward behaviour (in place, rebind...): a forward in eval mode then changes no state, so
# the forward outputs before a swap and after the swap back compare.
TREE_OPTIONS = {"max_depth": 2, "max_leaves": 3, "lazy": False, "wrappers": (),
                "catalogue": False, "behaviours": ()}
converted = modules_with_conversions(module_trees(**TREE_OPTIONS), ["cpu"])
# Each example builds and converts a tree, then makes a handful of accessor calls.
EXAMPLES_DIVISOR = 2
ACCESSOR = "from torch.nn.utils._named_member_accessor import NamedMemberAccessor"
REGISTRIES = ("_parameters", "_buffers")


def _prepared(target: Any, data: st.DataObject, property_id: str):
    """``(example, check)``: a drawn tree the target converted (a conversion the target
    refuses is not drawn: ``APPLY-`` properties judge those)."""
    module, conversion = data.draw(converted, label="module and conversion")
    example = Example(module, conversion=conversion,
                      flags=data.draw(flag_settings(), label="flags"))
    check = Checker(property_id, target, example)
    assume(run_converted(target, example).error is None)
    return example, check


def accessor_lines(target: Any) -> list[str]:
    """Repro lines that make ``accessor`` on ``module``: torch's for the torch targets, else the
    target's own (loaded by its selector)."""
    if is_torch(target):
        return [ACCESSOR, "accessor = NamedMemberAccessor(module)"]
    return ["from swapspec.properties.harness.targets import load_target",
            f"accessor = load_target({target.selector!r}).accessor(module)"]


def _repro(example: Example, target: Any, lines: list[str]):
    return partial(apply_repro, example, target, extra=[*accessor_lines(target), *lines])


def _split(name: str) -> tuple[str, str]:
    prefix, _, attr = name.rpartition(".")
    return prefix, attr


def registry_of(module: nn.Module, name: str) -> str | None:
    """Which registry (``_parameters``/``_buffers``) holds the dotted ``name``, else None."""
    prefix, attr = _split(name)
    owner = module.get_submodule(prefix)
    return next((r for r in REGISTRIES if attr in getattr(owner, r)), None)


def distinct_slots(module: nn.Module) -> list[str]:
    """One dotted name per registered slot (a shared child's slot has one name per path: only
    its first), ``None`` slots included."""
    seen: set[tuple[int, str]] = set()
    names = []
    for name in slots(module):
        prefix, attr = _split(name)
        key = (id(module.get_submodule(prefix)), attr)
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


def fresh(module: nn.Module, name: str) -> Any:
    """A new object for the slot ``name``: a ``Parameter`` for a parameter slot, a plain tensor
    for a buffer slot, of the slot's value (zeros for a ``None`` slot)."""
    old = module.get_submodule(_split(name)[0]).__getattr__(_split(name)[1])
    value = torch.zeros(2) if old is None else value_copy(old)
    if registry_of(module, name) == "_parameters":
        return nn.Parameter(value, requires_grad=old is None or old.requires_grad)
    return value


FRESH_CODE = ("def fresh(module, name):\n"
              "    prefix, _, attr = name.rpartition('.')\n"
              "    owner = module.get_submodule(prefix)\n"
              "    old = getattr(owner, attr)\n"
              "    if old is None:\n"
              "        value = torch.zeros(2)\n"
              "    elif hasattr(old, '__tensor_flatten__'):  # a wrapper subclass: by its parts\n"
              "        names, ctx = old.__tensor_flatten__()\n"
              "        value = type(old).__tensor_unflatten__(\n"
              "            {n: getattr(old, n).detach().clone() for n in names}, ctx, old.size(),\n"
              "            old.stride())\n"
              "    else:\n"
              "        value = old.detach().clone()\n"
              "    if attr in owner._parameters:\n"
              "        return torch.nn.Parameter(value, requires_grad=old is None or "
              "old.requires_grad)\n"
              "    return value")


def _names(data: st.DataObject, module: nn.Module, label: str) -> list[str]:
    names = distinct_slots(module)
    assume(names)
    return data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True),
                     label=label)


def _seeded_forward(module: nn.Module) -> Outcome:
    """The forward in eval mode (a training forward updates running stats) on the suite's fixed
    input with the RNG seeded, each module's mode and the global RNG put back after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(0)
            return forward(module)
    finally:
        for m, mode in modes:
            m.training = mode


@spec_property("ACCESSOR-GET", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_get_by_dotted_name(target, data):
    """``get_tensor``/``get_tensors`` give, for every registered dotted name (a shared child's
    under each path, ``None`` slots included), exactly the object in the slot;
    ``get_submodule`` gives every child at each of its paths (the root for ``""``), the same from
    its cache; the accessor's ``named_parameters``, ``named_buffers`` and ``named_modules`` are
    the module's, for both ``remove_duplicate``.

    Origin: ``NamedMemberAccessor.get_tensor``'s and ``get_submodule``'s docstrings (what
    ``mod.layer1.conv1.weight`` is).
    """
    example, check = _prepared(target, data, "ACCESSOR-GET")
    module = example.module
    table = slots(module)
    accessor = target.accessor(module)
    names = list(table)
    got = attempt(lambda: accessor.get_tensors(names))
    if no_error(check, got, "get_tensors of every slot name"):
        for name, obj in zip(names, got.result, strict=True):
            check.that(obj is table[name], "object",
                       f"get_tensors gave another object than the slot {name!r} holds")
    for name in names[:3]:
        one = attempt(lambda name=name: accessor.get_tensor(name))
        if no_error(check, one, f"get_tensor({name!r})"):
            check.that(one.result is table[name], "object",
                       f"get_tensor({name!r}) gave another object than the slot holds")
    for path, child in module.named_modules(remove_duplicate=False):
        for turn in ("first", "cached"):
            sub = attempt(lambda path=path: accessor.get_submodule(path))
            if no_error(check, sub, f"get_submodule({path!r}), {turn}"):
                check.that(sub.result is child, "submodule",
                           f"get_submodule({path!r}) ({turn}) gave another module")
    registered = [n for n, _ in module.named_parameters(remove_duplicate=False)]
    registered += [n for n, _ in module.named_buffers(remove_duplicate=False)]
    keys = attempt(lambda: accessor.check_keys([*registered[1:], "acc_unknown"]))
    if no_error(check, keys, "check_keys"):
        check.that(keys.result == (sorted(registered[:1]), ["acc_unknown"]), "check-keys",
                   f"check_keys without {registered[:1]} and with 'acc_unknown' gave "
                   f"{keys.result}")
    for dup in (True, False):
        for what in ("named_parameters", "named_buffers", "named_tensors", "named_modules"):
            mine = [(n, id(t)) for n, t in getattr(accessor, what)(remove_duplicate=dup)]
            theirs = [(n, id(t)) for n, t in _module_listing(module, what, dup)]
            check.that(mine == theirs, "listing",
                       f"accessor.{what}(remove_duplicate={dup}) differs from the module's")
    check.verdict(_repro(example, target, [f"got = accessor.get_tensors({names!r})"]))


def _module_listing(module: nn.Module, what: str, dup: bool) -> list[tuple[str, Any]]:
    """The module's own listing ``what`` (``named_tensors``: its parameters, then buffers)."""
    if what == "named_tensors":
        return [*module.named_parameters(remove_duplicate=dup),
                *module.named_buffers(remove_duplicate=dup)]
    return list(getattr(module, what)(remove_duplicate=dup))


SET_FORMS = ("set_tensor", "set_tensors", "set_tensors_dict")


def _set(accessor: Any, form: str, values: dict[str, Any]) -> None:
    if form == "set_tensor":
        for name, value in values.items():
            accessor.set_tensor(name, value)
    elif form == "set_tensors":
        accessor.set_tensors(values.keys(), values.values())  # iterables, not lists
    else:
        accessor.set_tensors_dict(values)


def _set_code(form: str, names: list[str]) -> str:
    if form == "set_tensor":
        return f"for n in {names!r}:\n    accessor.set_tensor(n, values[n])"
    if form == "set_tensors":
        return "accessor.set_tensors(values.keys(), values.values())"
    return "accessor.set_tensors_dict(values)"


@spec_property("ACCESSOR-SET", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_set_round_trip(target, data):
    """``set_tensor``, ``set_tensors`` and ``set_tensors_dict`` put each given object in the
    slot of its dotted name, in the registry that held the name (a parameter slot stays a
    parameter, a buffer slot a buffer), and ``get_tensors`` gives them back; a new name given a
    ``Parameter`` is registered as a parameter; every other slot keeps its object.

    Origin: ``NamedMemberAccessor.set_tensor``'s docstring and its module-level
    ``set_tensor`` (a registered name is written into its registry, a new one by ``setattr``).
    """
    example, check = _prepared(target, data, "ACCESSOR-SET")
    module = example.module
    names = _names(data, module, "names")
    form = data.draw(st.sampled_from(SET_FORMS), label="form")
    new_name = data.draw(st.sampled_from([p for p, _ in module.named_modules()]),
                         label="owner of a new name")
    new_name = f"{new_name}.acc_new" if new_name else "acc_new"
    values = {n: fresh(module, n) for n in names}
    values[new_name] = nn.Parameter(torch.ones(2))
    kinds = {n: registry_of(module, n) for n in names}
    before = slots(module)
    accessor = target.accessor(module)
    outcome = attempt(lambda: _set(accessor, form, values))
    if no_error(check, outcome, form):
        got = attempt(lambda: accessor.get_tensors(list(values)))
        if no_error(check, got, "get_tensors after the set"):
            for (name, value), obj in zip(values.items(), got.result, strict=True):
                check.that(obj is value, "round-trip",
                           f"after {form}, get_tensor({name!r}) is not the object set")
        kinds[new_name] = "_parameters"
        for name, kind in kinds.items():
            check.that(registry_of(module, name) == kind, "registry",
                       f"after {form}, {name!r} is in {registry_of(module, name)}, not {kind}")
        now = slots(module)
        for name, obj in before.items():
            if name not in values:
                check.that(now.get(name) is obj or _aliases(module, name, values), "other-slot",
                           f"{form} changed the slot {name!r}, which it was not given")
    check.verdict(_repro(example, target, [
        FRESH_CODE, f"values = {{n: fresh(module, n) for n in {names!r}}}",
        f"values[{new_name!r}] = torch.nn.Parameter(torch.ones(2))", _set_code(form, list(values)),
        "got = accessor.get_tensors(list(values))"]))


def _aliases(module: nn.Module, name: str, given: dict[str, Any]) -> bool:
    """Whether ``name`` reaches the slot of a given name through a shared child."""
    prefix, attr = _split(name)
    owner = module.get_submodule(prefix)
    return any(_split(n)[1] == attr and module.get_submodule(_split(n)[0]) is owner
               for n in given if registry_of(module, n) is not None)


SWAP_FORMS = ("swap_tensor", "swap_tensors", "swap_tensors_dict")


def _swap(accessor: Any, form: str, values: dict[str, Any]) -> list[Any]:
    """The objects the swap returns, in the order of ``values``."""
    if form == "swap_tensor":
        return [accessor.swap_tensor(n, v) for n, v in values.items()]
    if form == "swap_tensors":
        return accessor.swap_tensors(values.keys(), values.values())  # iterables, not lists
    old, missing = accessor.swap_tensors_dict(values)
    assert not missing, f"swap_tensors_dict reported registered names missing: {missing}"
    return [old[n] for n in values]


@spec_property("ACCESSOR-SWAP", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_swap_and_swap_back(target, data):
    """``swap_tensor``, ``swap_tensors`` and ``swap_tensors_dict`` put each given object in its
    slot and return the objects the slots held; swapping those back restores every slot's object
    and the module's forward output; ``swap_submodule(path, new)`` returns the child at ``path``
    and swapping it back restores the child.

    Origin: ``NamedMemberAccessor.swap_tensor``'s and ``swap_submodule``'s docstrings, the
    round trip ``torch.func.functional_call`` makes (``_reparametrize_module``).
    """
    example, check = _prepared(target, data, "ACCESSOR-SWAP")
    module = example.module
    names = _names(data, module, "names")
    form = data.draw(st.sampled_from(SWAP_FORMS), label="form")
    children = [p for p, _ in module.named_modules() if p]
    path = data.draw(st.sampled_from(children), label="child") if children else None
    values = {n: fresh(module, n) for n in names}
    before, output = slots(module), _seeded_forward(module)
    accessor = target.accessor(module)
    swapped = attempt(lambda: _swap(accessor, form, values))
    if no_error(check, swapped, form):
        for name, old in zip(names, swapped.result, strict=True):
            check.that(old is before[name], "returned",
                       f"{form} returned another object than {name!r} held")
        now = slots(module)
        check.that(all(now[n] is v for n, v in values.items()), "swapped",
                   f"after {form} a slot does not hold the object given")
        back = attempt(lambda: _swap(accessor, form, dict(zip(names, swapped.result,
                                                              strict=True))))
        if no_error(check, back, f"{form} back"):
            now = slots(module)
            check.that(now.keys() == before.keys() and all(now[n] is o for n, o in before.items()),
                       "restored", f"after {form} and back, a slot holds another object")
            check.that(same_output(_seeded_forward(module), output), "forward",
                       f"forward's output changed after {form} and back")
    if path is not None:
        _check_swap_submodule(check, module, accessor, path)
    check.verdict(_repro(example, target, [
        FRESH_CODE, f"values = {{n: fresh(module, n) for n in {names!r}}}",
        f"old = [accessor.swap_tensor(n, v) for n, v in values.items()]  # {form}"]))


def _check_swap_submodule(check: Checker, module: nn.Module, accessor: Any,
                          path: str) -> None:
    """Clauses ``submodule-returned`` and ``submodule-restored``."""
    child, other = module.get_submodule(path), nn.Identity()
    out = attempt(lambda: accessor.swap_submodule(path, other))
    if no_error(check, out, f"swap_submodule({path!r})"):
        check.that(out.result is child, "submodule-returned",
                   f"swap_submodule({path!r}) returned another module than the child")
        prefix, attr = _split(path)
        check.that(module.get_submodule(prefix)._modules[attr] is other, "submodule-swapped",
                   f"after swap_submodule({path!r}) the slot does not hold the new module")
        back = attempt(lambda: accessor.swap_submodule(path, child))
        if no_error(check, back, f"swap_submodule({path!r}) back"):
            check.that(back.result is other and module.get_submodule(path) is child,
                       "submodule-restored",
                       f"swapping {path!r} back did not restore the child")


@spec_property("ACCESSOR-DEL", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_del_removes_exactly_its_names(target, data):
    """``del_tensor``/``del_tensors`` remove exactly the given dotted names from their registry
    (every path to a shared child's slot with them) and no other slot.

    Origin: ``NamedMemberAccessor.del_tensor``'s docstring.
    """
    example, check = _prepared(target, data, "ACCESSOR-DEL")
    module = example.module
    names = _names(data, module, "names")
    batched = data.draw(st.booleans(), label="del_tensors")
    before = slots(module)
    accessor = target.accessor(module)
    outcome = attempt(lambda: accessor.del_tensors(names) if batched
                      else [accessor.del_tensor(n) for n in names])
    if no_error(check, outcome, "del_tensors" if batched else "del_tensor"):
        now = slots(module)
        for name, obj in before.items():
            gone = name in names or _aliases_of_deleted(module, name, names)
            check.that((name not in now) if gone else (now.get(name) is obj), "deleted",
                       f"after deleting {names}, the slot {name!r} is "
                       f"{'still there' if gone else 'gone or changed'}")
    check.verdict(_repro(example, target, [f"accessor.del_tensors({names!r})"]))


def _aliases_of_deleted(module: nn.Module, name: str, deleted: list[str]) -> bool:
    prefix, attr = _split(name)
    owner = module.get_submodule(prefix)
    return any(_split(n)[1] == attr and module.get_submodule(_split(n)[0]) is owner
               for n in deleted)


# ---- refusals ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BadCall:
    """A refused accessor call: ``code`` (run with ``accessor``, ``module`` and ``torch``), the
    error type torch raises and a word its message holds."""

    defect: str
    code: str
    error: type
    mention: str
    clause: str = "changed-on-error"  # the clause of a refused call that changed the module


def bad_calls(module: nn.Module, name: str | None) -> list[BadCall]:
    """The refused calls on ``module``, about its slot ``name`` where it has one."""
    owner = next((p for p, m in module.named_modules() if p), "")
    dot = f"{owner}." if owner else ""
    calls = [
        BadCall("missing", f"accessor.get_tensor({dot + 'nope'!r})", AttributeError, "nope"),
        BadCall("missing", f"accessor.swap_tensor({dot + 'nope'!r}, torch.ones(2))",
                AttributeError, "nope"),
        BadCall("missing", f"accessor.del_tensor({dot + 'nope'!r})", AttributeError, "nope"),
        BadCall("missing-child", "accessor.get_tensor('nope.weight')", AttributeError, "nope"),
        BadCall("not-a-tensor", f"accessor.get_tensor({dot + 'training'!r})", TypeError,
                "Tensor"),
        BadCall("not-a-tensor", f"accessor.swap_tensor({dot + 'training'!r}, torch.ones(2))",
                TypeError, "Tensor"),
        BadCall("through-non-module", "accessor.set_tensor('training.x', torch.ones(2))",
                TypeError, "Module"),
        BadCall("missing-key", f"accessor.swap_tensors_dict({{{dot + 'nope'!r}: torch.ones(2)}})",
                RuntimeError, "nope"),
        BadCall("not-a-child", "accessor.swap_submodule('nope', torch.nn.Identity())", KeyError,
                "nope"),
        BadCall("not-a-module", f"accessor.swap_submodule({owner or 'x'!r}, 3)", TypeError,
                "Module"),
        BadCall("empty-name", f"accessor.swap_tensor({dot!r}, torch.ones(2))", KeyError, "empty"),
        BadCall("empty-name", f"accessor.set_tensor({dot!r}, torch.ones(2))", KeyError, "empty"),
        BadCall("empty-name", f"accessor.swap_submodule({dot!r}, torch.nn.Identity())", KeyError,
                "empty"),
        BadCall("missing-key", f"accessor.swap_tensors_dict({{{dot + 'nope'!r}: "
                "torch.nn.Parameter(torch.ones(2))})", RuntimeError, "nope"),
    ]
    if name is not None:
        calls += [
            BadCall("value-not-a-tensor", f"accessor.set_tensor({name!r}, 3)", TypeError, "3"),
            BadCall("value-not-a-tensor", f"accessor.swap_tensor({name!r}, 'x')", TypeError,
                    "x"),
            BadCall("through-tensor", f"accessor.get_tensor({name + '.x'!r})", TypeError,
                    "Module"),
            BadCall("missing-key", f"accessor.swap_tensors_dict({{{name!r}: torch.ones(2), "
                    f"'nope': torch.ones(2)}})", RuntimeError, "nope"),
            BadCall("lengths", f"accessor.set_tensors([{name!r}], [])", AssertionError, "length"),
            BadCall("lengths", f"accessor.swap_tensors([{name!r}], [])", AssertionError,
                    "length"),
            BadCall("not-a-tensor-in-dict", f"accessor.swap_tensors_dict({{{name!r}: "
                    f"torch.ones(2), 'training': torch.ones(2)}}, allow_missing=True)",
                    TypeError, "Tensor"),
            *batched_calls(module, name),
        ]
    return calls


BATCHED = "batch-changed-on-error"  # a batched write refused after it wrote a first name
SHARED = "shared-rollback"  # swap_tensors_dict's swap-back on error through a shared child


def batched_calls(module: nn.Module, name: str) -> list[BadCall]:
    """Refused batched writes (``set_tensors``, ``set_tensors_dict``, ``swap_tensors``,
    ``del_tensors``) whose first name (``name``) is good and a later one bad; with a
    child shared under two paths that holds a slot, a ``swap_tensors_dict`` that swaps it under
    both paths and then meets a non-tensor attribute."""
    calls = [
        BadCall("batch", f"accessor.set_tensors([{name!r}, 'training.x'], [torch.ones(2), "
                "torch.ones(2)])", TypeError, "Module", BATCHED),
        BadCall("batch", f"accessor.set_tensors_dict({{{name!r}: torch.ones(2), "
                "'training.x': torch.ones(2)})", TypeError, "Module", BATCHED),
        BadCall("batch", f"accessor.swap_tensors([{name!r}, 'nope'], [torch.ones(2), "
                "torch.ones(2)])", AttributeError, "nope", BATCHED),
        BadCall("batch", f"accessor.del_tensors([{name!r}, 'nope'])", AttributeError, "nope",
                BATCHED),
    ]
    shared = shared_slot_paths(module)
    if shared:
        first, second = shared
        calls.insert(0, BadCall("shared", f"accessor.swap_tensors_dict({{{first!r}: torch.ones(2), "
                             f"{second!r}: torch.zeros(2), 'training': torch.ones(2)}}, "
                             "allow_missing=True)", TypeError, "Tensor", SHARED))
    return calls


def shared_slot_paths(module: nn.Module) -> tuple[str, str] | None:
    """Two dotted names of one registered slot through a child shared under two paths, or
    None."""
    by_slot: dict[tuple[int, str], list[str]] = {}
    for name in slots(module):
        prefix, attr = _split(name)
        by_slot.setdefault((id(module.get_submodule(prefix)), attr), []).append(name)
    return next(((n[0], n[1]) for n in by_slot.values() if len(n) > 1), None)


@spec_property("ACCESSOR-REFUSED", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_refused_call_leaves_module_as_it_was(target, data):
    """A bad name or value (a missing attribute or child, a dotted path through a tensor or a
    non-module, a non-tensor attribute or value, a missing key of ``swap_tensors_dict`` without
    ``allow_missing``, a ``swap_submodule`` of a non-child or to a non-module) raises torch's
    error type (``AttributeError``, ``TypeError``, ``KeyError``, ``RuntimeError``) with a message
    that names the cause, and leaves the module exactly as it was (every slot's object and value,
    registry, ``__dict__``).

    Origin: ``NamedMemberAccessor``'s checks and ``swap_tensors_dict``'s swap-back on error.
    """
    example, check = _prepared(target, data, "ACCESSOR-REFUSED")
    module = example.module
    names = distinct_slots(module)
    name = data.draw(st.sampled_from(names), label="slot") if names else None
    calls = bad_calls(module, name)
    for call in calls:  # each on a fresh accessor: a few microseconds each
        _check_refused(check, target, module, call)
    check.verdict(_repro(example, target, [
        line for call in calls for line in
        ("try:", f"    {call.code}", "except Exception as e:", "    print('refused:', e)")]))


def _check_refused(check: Checker, target: Any, module: nn.Module, call: BadCall) -> None:
    """Clauses ``accepted``, ``wrong-error``, ``unclear-message`` and the call's own
    (``changed-on-error``, ``batch-changed-on-error``, ``shared-rollback``)."""
    world, before = invariants.world([module]), registration_state(module)
    accessor = target.accessor(module)
    error = attempt(lambda: eval(call.code, {"torch": torch, "accessor": accessor})).error
    if check.that(error is not None, "accepted", f"{call.code} ({call.defect}) was accepted"):
        check.that(isinstance(error, call.error), "wrong-error",
                   f"{call.code} ({call.defect}) raised {type(error).__name__}, not "
                   f"{call.error.__name__}")
        check.that(call.mention in str(error), "unclear-message",
                   f"{call.code} raised {str(error)[:200]!r}, which does not name "
                   f"{call.mention!r}")
    for v in invariants.unchanged(world, call.clause):
        check.that(False, v.clause, f"{call.code} raised, yet {v.message}")
    check.that(registration_state(module) == before, call.clause,
               f"{call.code} raised, yet a registry or __dict__ changed")
