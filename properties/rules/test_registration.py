"""Properties of module registration (``register_parameter``, ``register_buffer``,
``add_module``, ``register_module``, ``setattr``, ``delattr``; ``reference.registration``) and of
the ``swap_tensors`` the swap paths use: one rule per test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn.modules import module as torch_module

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import is_torch, registration_repro
from swapspec.properties.harness.target_calls import call_target
from swapspec.properties.models import invariants
from swapspec.properties.models.call_state import (
    put_back_registrations,
    registration_state,
    registrations_kept,
)
from swapspec.properties.models.examples import Example, same_values, slots
from swapspec.properties.models.outcomes import Outcome, attempt
from swapspec.properties.rules.clauses import no_error
from swapspec.strategies import FlagSetting, module_trees
from swapspec.strategies.registrations import (
    REGISTRATION_METHODS,
    GoodSwapPair,
    RegistrationCall,
    SwapPair,
    good_swap_pairs,
    registration_calls,
    registration_forms,
    swap_pairs,
)

trees = module_trees(max_depth=1, max_leaves=2, wrapper_chance=0)
# The methods drawn together: one test item each, so every method gets the profile's examples.
METHOD_GROUPS = {"parameter": ("register_parameter",), "buffer": ("register_buffer",),
                 "module": ("add_module", "register_module", "set_submodule"), "setattr": ("setattr", "delattr")}
by_method = pytest.mark.parametrize("methods", list(METHOD_GROUPS.values()), ids=list(METHOD_GROUPS))
by_form = pytest.mark.parametrize("methods", [REGISTRATION_METHODS[:5], ("setattr", "delattr")],
                                  ids=["register", "setattr"])
NO_FLAGS = FlagSetting(overwrite=False, swap=False)  # registration converts nothing
KINDS = ("parameter", "buffer", "module")
REGISTRIES = {"parameter": "_parameters", "buffer": "_buffers", "module": "_modules"}


def _register(target: Any, owner: nn.Module, call: RegistrationCall, args: tuple,
              kwargs: dict) -> Outcome:
    """The target's registration method ``call.method`` on ``owner``."""
    method = target.method(call.method)
    return attempt(lambda: method(owner, *args, overwrite=False, swap=False, **kwargs))


def _setup(property_id: str, target: Any, module: nn.Module, call: RegistrationCall):
    """The example, its checker and the module the call is made on (``call.owner_code``)."""
    example = Example(module, method=call, flags=NO_FLAGS)
    owner = eval(call.owner_code, {"torch": torch, "module": module})
    return example, Checker(property_id, target, example), owner


@contextmanager
def _owner_class(owner: nn.Module, setup: list[str]) -> Iterator[None]:
    """``owner`` with the class a call's ``setup`` gives it (a ``register_buffer`` override)
    inside the block, its own class put back after it, even on failure."""
    own = type(owner)
    try:
        exec("\n".join(setup), {"torch": torch, "owner": owner})
        yield
    finally:
        owner.__class__ = own


def _verdict(check: Checker, example: Example, target: Any, setup: list[str] = ()) -> None:
    lines = [*example.method.setup, *setup]
    check.verdict(partial(registration_repro, example, target, setup=lines))


def _check_refused(target: Any, module: nn.Module, call: RegistrationCall,
                   world: invariants.World) -> None:
    """REGISTER-REFUSED's clauses for one refused form, judged on its own; ``world``: the
    module as drawn (every refused form before this one left it so, or was put back)."""
    example, check, owner = _setup("REGISTER-REFUSED", target, module, call)
    before = registration_state(module)
    args, kwargs = call.args()
    error = _register(target, owner, call, args, kwargs).error
    if check.that(error is not None, "accepted", f"{call.label} ({call.defect}) was accepted"):
        check.that(isinstance(error, call.error), "wrong-error",
                   f"{call.label} ({call.defect}) raised {type(error).__name__}, not "
                   f"{call.error.__name__}")
        check.that(call.mention in str(error), "unclear-message",
                   f"{call.label} ({call.defect}) raised {str(error)!r}, which does not name "
                   f"{call.mention!r}")
        for v in invariants.unchanged(world, "changed-on-error"):
            check.that(False, v.clause, f"{call.label} raised, yet {v.message}")
        check.that(registration_state(module) == before, "changed-on-error",
                   f"{call.label} raised, yet a registry, __dict__ or the non-persistent set "
                   "changed")
    _verdict(check, example, target)


@spec_property("REGISTER-REFUSED")
@by_method
@given(data=st.data())
def test_refused_registration_leaves_module_as_it_was(target, methods, data):
    """A refused registration (a name that is not a string, dotted, empty or another attribute's;
    a value of the wrong kind; a non-leaf ``Parameter``; ``delattr`` of a missing name; a module
    whose ``__init__`` never ran; a non-persistent buffer set on a module whose
    ``register_buffer`` override takes no ``persistent``) raises
    torch's error type with a message that names the cause, and leaves the module exactly as it
    was (every slot's object and value, every class, ``__dict__``, hook table and
    non-persistent set).

    Every refused form of the drawn owner is made, one after another, each judged on its own;
    where a declared deviation changed the module, its registrations are put back before the
    next form.

    Origin: ``nn.Module.register_parameter``'s and ``register_buffer``'s documented refusals;
    ``m.buf = p`` with a non-leaf ``p`` drops the buffer in torch 2.13 before it raises;
    ``Module.__setattr__``'s refusal of a non-persistent buffer on a subclass whose
    ``register_buffer`` predates the argument.
    """
    module = data.draw(trees, label="module")
    forms = data.draw(registration_forms(module, kinds=("bad",), methods=methods), label="forms")
    owner = module.get_submodule(forms[0].owner)  # every form's but the uninitialized module's
    with _owner_class(owner, next((f.setup for f in forms if f.setup), [])):
        kept, world = registrations_kept(module), invariants.world([module])
        for call in forms:
            before = registration_state(module)
            _check_refused(target, module, call, world)
            if registration_state(module) != before:  # declared: put back for the next form
                put_back_registrations(kept)


def _paths_of(module: nn.Module, owner: nn.Module) -> list[str]:
    return [p for p, m in module.named_modules(remove_duplicate=False) if m is owner]


def _key(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _check_ends(check: Checker, owner: nn.Module, call: RegistrationCall, value: Any) -> None:
    """Clause ``slot``: the name is in the registry ``call.ends`` holding ``value`` (an
    attribute: in ``__dict__``; removed: nowhere), in no other, and a buffer's persistence is
    the call's."""
    name = call.name
    held = {kind: getattr(owner, REGISTRIES[kind]) for kind in KINDS}
    held["attribute"] = owner.__dict__
    for where, table in held.items():
        wanted = where == call.ends
        check.that((name in table) == wanted, "slot",
                   f"after {call.label} {name!r} is {'not ' if wanted else ''}in the "
                   f"{where} table")
        if wanted and name in table:
            check.that(table[name] is value, "slot",
                       f"after {call.label} the {where} {name!r} is not the given value")
    if call.ends == "buffer":
        check.that((name in owner._non_persistent_buffers_set) == (not call.persistent), "slot",
                   f"after {call.label} the buffer {name!r} is not "
                   f"{'persistent' if call.persistent else 'non-persistent'}")
    if call.ends != "buffer":
        check.that(name not in owner._non_persistent_buffers_set, "slot",
                   f"after {call.label} {name!r} is still in the non-persistent set")


def _check_others_kept(check: Checker, module: nn.Module, before: dict[str, Any],
                       keys: set[str]) -> None:
    """Clause ``other-slot-changed``: every slot not under the registered name holds its object."""
    now = slots(module)
    for key, obj in before.items():
        if any(key == k or key.startswith(k + ".") for k in keys):
            continue
        check.that(key in now and now[key] is obj, "other-slot-changed",
                   f"slot {key!r} holds another object (or is gone) after the registration")


def _tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, nn.Module):
        return [t for t in (*value.parameters(), *value.buffers())]
    return [value] if isinstance(value, torch.Tensor) else []


def _check_apply_sees(check: Checker, target: Any, module: nn.Module, value: Any,
                      label: str) -> None:
    """Clause ``not-visible``: ``apply`` (an identity ``fn``) reaches every registered tensor."""
    if target.apply is None:
        return
    seen: set[int] = set()
    outcome = attempt(lambda: target.apply(module, lambda t: seen.add(id(t)) or t,
                                           overwrite=False, swap=False))
    if no_error(check, outcome, f"apply after {label}"):
        check.that(all(id(t) in seen for t in _tensors_of(value)), "not-visible",
                   f"apply's fn never saw the tensor registered by {label}")


def _plain_loader(owner: nn.Module) -> bool:
    """Whether ``owner`` loads by ``nn.Module``'s own rules: no ``_load_from_state_dict`` of its
    own (``InstanceNorm1d`` refuses running stats it does not track) and no load hooks."""
    return (type(owner)._load_from_state_dict is nn.Module._load_from_state_dict
            and not owner._load_state_dict_pre_hooks and not owner._load_state_dict_post_hooks)


def _check_load_sees(check: Checker, target: Any, module: nn.Module, owner: nn.Module,
                     call: RegistrationCall, value: Any) -> None:
    """Clause ``not-visible``: ``load_state_dict`` loads the name where a persistent tensor is
    registered, and reports it unexpected where ``None`` (or nothing) is (on an owner that
    loads by ``nn.Module``'s own rules)."""
    if (target.load_state_dict is None or call.ends not in ("parameter", "buffer", "removed")
            or not _plain_loader(owner)):
        return
    key = _key(_paths_of(module, owner)[0], call.name)
    loads = isinstance(value, torch.Tensor) and call.ends != "removed" and call.persistent
    given = torch.ones_like(value) if isinstance(value, torch.Tensor) else torch.ones(2)
    outcome = attempt(lambda: target.load_state_dict(module, {key: given}, strict=False,
                                                     assign=False, swap=False))
    if not no_error(check, outcome, f"load_state_dict after {call.label}"):
        return
    unexpected = key in outcome.result.unexpected_keys
    check.that(unexpected != loads, "not-visible",
               f"load_state_dict reported {key!r} as {'un' if unexpected else ''}expected after "
               f"{call.label}")
    if loads and not unexpected:
        check.that(same_values(getattr(owner, call.name), given), "not-visible",
                   f"load_state_dict did not load {key!r} after {call.label}")


def _check_call_sees(check: Checker, target: Any, module: nn.Module, owner: nn.Module,
                     call: RegistrationCall, value: Any) -> None:
    """Clause ``not-visible``: a functional call given a new tensor under the registered name
    shows the owner's forward that tensor (where the owner's forward runs and returns, and the
    owner has one path)."""
    x = invariants.input_for(module)
    paths = _paths_of(module, owner)
    if (not target.has("functional_call") or call.ends not in ("parameter", "buffer")
            or not isinstance(value, torch.Tensor) or x is None or len(paths) > 1):
        return  # a shared owner's slot has a name per path: FC-RESTORE's and FC-TIES' rules
    key = _key(paths[0], call.name)
    given = torch.ones_like(value)
    seen: list[Any] = []
    handle = owner.register_forward_pre_hook(lambda m, args: seen.append(getattr(m, call.name)))
    try:
        outcome = attempt(lambda: call_target(target, module, {key: given}, (x,), {}))
    finally:
        handle.remove()
    if outcome.error is None and seen:
        check.that(seen[0] is given, "not-visible",
                   f"forward saw another tensor than the one given under {key!r} after "
                   f"{call.label}")


@spec_property("REGISTER-SLOT")
@by_form
@given(data=st.data())
def test_registration_fills_exactly_its_slot(target, methods, data):
    """A valid registration (each form, ``None`` values included) puts the given object under
    the name in the registry of its kind and in no other (a buffer with its persistence), changes
    no other slot, and the new slot is what the target's ``apply``, ``load_state_dict`` and
    ``functional_call`` see: a tensor is converted, loaded and replaced for the call, a ``None``
    slot stays registered and is skipped (its key unexpected), a removed name is gone.

    Origin: ``nn.Module.__setattr__``'s rules (a ``Parameter`` over a buffer, ``None`` over a
    parameter keeps it registered) and ``register_parameter``'s and ``register_buffer``'s
    documented ``None`` slot (left out of ``state_dict``, skipped by ``cuda``); its buffer
    path through a subclass's own ``register_buffer``, with or without ``persistent``.
    """
    module = data.draw(trees, label="module")
    call = data.draw(registration_calls(module, kinds=("good",), methods=methods), label="call")
    example, check, owner = _setup("REGISTER-SLOT", target, module, call)
    keys = {_key(p, call.name) for p in _paths_of(module, owner)}
    before = slots(module)
    args, kwargs = call.args()
    value = args[1] if len(args) > 1 else None
    with _owner_class(owner, call.setup):
        outcome = _register(target, owner, call, args, kwargs)
        if no_error(check, outcome, call.label):
            _check_ends(check, owner, call, value)
            _check_others_kept(check, module, before, keys)
            _check_apply_sees(check, target, module, value, call.label)
            _check_load_sees(check, target, module, owner, call, value)
            _check_call_sees(check, target, module, owner, call, value)
    _verdict(check, example, target)


# ---- the global registration hooks ----------------------------------------------------------
HOOK_REGISTRARS = {
    "parameter": torch_module.register_module_parameter_registration_hook,
    "buffer": torch_module.register_module_buffer_registration_hook,
    "module": torch_module.register_module_module_registration_hook,
}


def _global_hook_keys() -> dict[str, tuple]:
    return {kind: tuple(getattr(torch_module, f"_global_{kind}_registration_hooks"))
            for kind in KINDS}


def _replacement(kind: str, value: Any) -> Any:
    """A new object of ``kind`` a hook returns in place of ``value``."""
    if kind == "module":
        return nn.Linear(2, 2)
    if value is None:
        return None
    fresh = value.detach().clone()
    return nn.Parameter(fresh) if kind == "parameter" else fresh


def _fires(call: RegistrationCall, value: Any) -> bool:
    """Whether a registration fires its kind's hooks: a ``None`` parameter does not."""
    return call.ends in KINDS and not (call.ends == "parameter" and value is None)


@spec_property("REGISTER-HOOKS")
@by_form
@given(data=st.data())
def test_global_registration_hooks(target, methods, data):
    """Each registration of a parameter, buffer or child fires the global registration hooks of
    its kind (``torch.nn.modules.module.register_module_*_registration_hook``) exactly once with
    ``(module, name, value)`` and no hook of another kind; a hook's non-None return is what the
    slot holds; removing the hooks' handles leaves the global hook tables as they were.

    Origin: the documentation of ``register_module_parameter_registration_hook`` and its
    buffer and module counterparts (a hook may return a new value to register instead).
    """
    module = data.draw(trees, label="module")
    call = data.draw(registration_calls(module, kinds=("good",),
                                        methods=tuple(m for m in methods if m != "delattr")),
                     label="call")
    replace = data.draw(st.booleans(), label="hook replaces the value")
    example, check, owner = _setup("REGISTER-HOOKS", target, module, call)
    args, kwargs = call.args()
    value = args[1]
    swapped = _replacement(call.ends, value) if replace and call.ends in KINDS else None
    calls: list[tuple] = []

    def hook(kind: str):
        def record(m, name, v):
            calls.append((kind, m, name, v))
            return swapped if kind == call.ends else None
        return record

    tables = _global_hook_keys()
    handles = [HOOK_REGISTRARS[kind](hook(kind)) for kind in KINDS]
    try:
        with _owner_class(owner, call.setup):
            outcome = _register(target, owner, call, args, kwargs)
    finally:
        for handle in handles:
            handle.remove()
    check.that(_global_hook_keys() == tables, "hook-left",
               "the global registration hook tables differ after the handles were removed")
    if no_error(check, outcome, call.label):
        wanted = [(call.ends, owner, call.name, value)] if _fires(call, value) else []
        check.that(len(calls) == len(wanted) and all(
            a[0] == b[0] and a[1] is b[1] and a[2] == b[2] and a[3] is b[3]
            for a, b in zip(calls, wanted, strict=False)), "hook-calls",
            f"{call.label} fired {[(k, n, type(v).__name__) for k, _, n, v in calls]}, not "
            f"{[(k, n, type(v).__name__) for k, _, n, v in wanted]}")
        if swapped is not None and _fires(call, value):
            held = getattr(owner, REGISTRIES[call.ends]).get(call.name)
            check.that(held is swapped, "hook-return-ignored",
                       f"after {call.label} the slot does not hold the hook's return")
    _verdict(check, example, target,
             setup=[f"# global registration hooks of kind {call.ends!r} return "
                    f"{'a replacement' if replace else 'None'}"])


# ---- swap_tensors ------------------------------------------------------------------------------
SLOTTED = ["class Slotted(torch.Tensor):", "    __slots__ = ('tag',)", ""]
_NAMESPACE: dict[str, Any] = {}


def _slotted() -> type:
    if "Slotted" not in _NAMESPACE:
        exec("\n".join(["import torch", *SLOTTED]), _NAMESPACE)
    return _NAMESPACE["Slotted"]


def _make_pair(pair: SwapPair) -> dict[str, Any]:
    import weakref

    namespace = {"torch": torch, "weakref": weakref, "Slotted": _slotted()}
    exec(pair.setup(), namespace)
    return namespace


def _tensor_state(t: torch.Tensor) -> tuple:
    return (type(t), id(t.__dict__), tuple(t.__dict__), t._cdata, t.detach().clone(),
            t.requires_grad)


def _same_state(a: tuple, b: tuple) -> bool:
    return a[:4] == b[:4] and a[5] == b[5] and same_values(a[4], b[4])


def swap_repro(pair: SwapPair, target: Any, violations: list) -> str:
    """A standalone script of the pair's swap: ``torch.utils.swap_tensors`` for the torch
    targets, else the target's own ``swap_tensors`` (loaded by its selector)."""
    swap, load = "torch.utils.swap_tensors", []
    if not is_torch(target):
        swap = "swap_tensors"
        load = ["from swapspec.properties.harness.targets import load_target", "",
                f"swap_tensors = load_target({target.selector!r}).swap_tensors"]
    return "\n".join(["import weakref", "", "import torch", *load, "", *SLOTTED, pair.setup(),
                      *(f"# broken rule [{v.clause}]: {v.message}" for v in violations),
                      "cdata = (t1._cdata, t2._cdata)",
                      "try:", f"    {swap}(t1, t2)", "    error = None",
                      "except Exception as e:", "    error = e",
                      f"assert isinstance(error, RuntimeError) and {pair.mention!r} in str(error), "
                      "repr(error)",
                      "assert (t1._cdata, t2._cdata) == cdata, 'the refused swap swapped'"]) + "\n"


@spec_property("REGISTER-SWAP-REFUSED")
@given(pair=swap_pairs())
def test_swap_tensors_refuses_bad_pairs(target, pair):
    """The target's ``swap_tensors`` refuses each bad pair (a weak reference to either tensor,
    different ``__slots__``, a TensorImpl held by a saved tensor or a view) with a
    ``RuntimeError`` that names the cause, and leaves both tensors as they were (class,
    ``__dict__``, TensorImpl, values, ``requires_grad``).

    Origin: ``torch.utils.swap_tensors``' documented refusals, which the swap paths of ``_apply``
    and ``load_state_dict`` (``torch.__future__.set_swap_module_params_on_conversion``) meet.
    """
    made = _make_pair(pair)
    t1, t2 = made["t1"], made["t2"]
    example = Example(nn.Module(), method=pair)
    check = Checker("REGISTER-SWAP-REFUSED", target, example)
    before = (_tensor_state(t1), _tensor_state(t2))
    error = attempt(lambda: target.swap_tensors(t1, t2)).error
    if check.that(isinstance(error, RuntimeError), "accepted",
                  f"swap_tensors on a pair with {pair.defect} gave "
                  f"{type(error).__name__ if error else 'no error'}, not RuntimeError"):
        check.that(pair.mention in str(error), "unclear-message",
                   f"swap_tensors refused a pair with {pair.defect} with {str(error)!r}, which "
                   f"does not name {pair.mention!r}")
    check.that(all(_same_state(a, b) for a, b in zip(before, (_tensor_state(t1),
                                                               _tensor_state(t2)), strict=True)),
               "changed-on-error", f"swap_tensors changed a tensor of a pair with {pair.defect}")
    del made
    check.verdict(partial(swap_repro, pair, target))


_NO_SLOT = object()


def _side_state(t: torch.Tensor) -> tuple:
    """What a swap exchanges: class, the ``__dict__`` object, the slot, values, ``requires_grad``."""
    return (type(t), t.__dict__, getattr(t, "tag", _NO_SLOT), t.detach().clone(),
            t.requires_grad)


def _swapped(now: tuple, was: tuple) -> list[str]:
    """The parts of ``now`` that are not ``was``'s (the other tensor's before the swap)."""
    parts = ("class", "__dict__", "slot", "values", "requires_grad")
    same = (now[0] is was[0], now[1] is was[1], now[2] is was[2] or now[2] == was[2],
            now[3].dtype == was[3].dtype and same_values(now[3], was[3]), now[4] == was[4])
    return [p for p, ok in zip(parts, same, strict=True) if not ok]


def good_swap_repro(pair: GoodSwapPair, target: Any, violations: list) -> str:
    """A standalone script of the good pair's swap, checked as REGISTER-SWAP checks it:
    ``torch.utils.swap_tensors`` for the torch targets, else the target's own."""
    swap, load = "torch.utils.swap_tensors", []
    if not is_torch(target):
        swap = "swap_tensors"
        load = ["from swapspec.properties.harness.targets import load_target", "",
                f"swap_tensors = load_target({target.selector!r}).swap_tensors"]
    state = "(type(t), t.__dict__, getattr(t, 'tag', None), t.detach().clone(), t.requires_grad)"
    graphs = [f"y_{n}" for n, side in (("t1", pair.t1), ("t2", pair.t2)) if side.graph]
    lines = ["import torch", *load, "", *SLOTTED, pair.setup(),
             *(f"# broken rule [{v.clause}]: {v.message}" for v in violations),
             f"was = [{state} for t in (t1, t2)]", f"{swap}(t1, t2)",
             f"now = [{state} for t in (t1, t2)]",
             "for a, b in zip(now, reversed(was)):",
             "    assert a[0] is b[0] and a[1] is b[1] and a[2] == b[2] and a[4] == b[4], (a, b)",
             "    assert a[3].dtype == b[3].dtype and torch.equal(a[3], b[3])"]
    for y in graphs:
        lines += ["try:", f"    {y}.backward()", "    raised = False",
                  "except RuntimeError:", "    raised = True",
                  f"assert raised, 'backward through {y}, built before the swap, ran'"]
    return "\n".join(lines) + "\n"


def _check_stale_graphs(check: Checker, made: dict[str, Any], pair: GoodSwapPair) -> None:
    """Clause ``stale-graph``: a backward through a graph built before the swap raises a
    ``RuntimeError`` and writes no grad."""
    for name, side in (("t1", pair.t1), ("t2", pair.t2)):
        if not side.graph:
            continue
        error = attempt(made[f"y_{name}"].backward).error
        check.that(isinstance(error, RuntimeError), "stale-graph",
                   f"backward through a graph built on {name} before the swap gave "
                   f"{type(error).__name__ if error else 'no error'}, not RuntimeError")
        check.that(made["t1"].grad is None and made["t2"].grad is None, "stale-graph",
                   f"backward through a graph built on {name} before the swap wrote a grad")


@spec_property("REGISTER-SWAP")
@given(pair=good_swap_pairs())
def test_swap_tensors_swaps_good_pairs(target, pair):
    """The target's ``swap_tensors`` swaps each pair it accepts (plain tensors, ``Parameter``s or
    both of a class with ``__slots__``, set or not; ``__dict__`` attributes; a leaf's
    TensorImpl held by its own AccumulateGrad node): afterwards ``t1`` has ``t2``'s class,
    ``__dict__`` (the same object), slot values, values, dtype and ``requires_grad``, and ``t2``
    has ``t1``'s; and a backward through a graph built on either tensor before the swap raises a
    ``RuntimeError`` instead of accumulating a grad into either.

    Origin: ``torch.utils.swap_tensors``' docstring (``t1`` gets ``t2``'s content and keeps its
    identity) and its AccumulateGrad pre-hook for tensors swapped between forward and backward
    (``torch.__future__.set_swap_module_params_on_conversion``'s note).
    """
    made = _make_pair(pair)
    t1, t2 = made["t1"], made["t2"]
    check = Checker("REGISTER-SWAP", target, Example(nn.Module(), method=pair))
    before = (_side_state(t1), _side_state(t2))
    outcome = attempt(lambda: target.swap_tensors(t1, t2))
    if no_error(check, outcome, "swap_tensors"):
        for name, now, was in (("t1", _side_state(t1), before[1]),
                               ("t2", _side_state(t2), before[0])):
            wrong = _swapped(now, was)
            check.that(not wrong, "not-swapped",
                       f"after swap_tensors {name} does not hold the other tensor's "
                       f"{', '.join(wrong)}")
        _check_stale_graphs(check, made, pair)
    del made
    check.verdict(partial(good_swap_repro, pair, target))
