"""Properties of ``functional_call``: one rule per test.

Origin of the design: pytorch PR #92536 (swap tensors straight into ``_parameters`` /
``_buffers``; ``tie_weights``; ``strict``), replacing class swapping (#92295) and
``delattr``/``setattr`` tricks.
"""

from __future__ import annotations

import dataclasses
import warnings
from copy import deepcopy
from functools import partial
from typing import Any

import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.utils import parametrize

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import call_repro, keyword_code
from swapspec.properties.harness.target_calls import (
    call_target,
    fixed_keywords,
    target_call_inputs,
)
from swapspec.properties.models.apply_state import WORLD_CHANCE, is_uninitialized
from swapspec.properties.models.call_state import (
    WATCH_FORMS,
    cloned_inputs,
    copy_outcome,
    fresh_kwargs,
    loaded_copy,
    module_state,
    replaced_originals,
    runs_in_its_world,
    watch_forward,
)
from swapspec.properties.models.examples import (
    Example,
    clone_value,
    holds_values,
    named_tensors,
    same_values,
    slots,
    value_copy,
)
from swapspec.properties.models.oracle import (
    ExpectedError,
    expected_outcome,
    expected_view,
    merge_inputs,
    owner_of,
    slot_of,
    tie_groups,
)
from swapspec.properties.models.outcomes import Outcome, attempt, same_output
from swapspec.properties.rules.clauses import (
    check_untouched,
    got_rebound_object,
    slot_order_changes,
    slot_orders,
)
from swapspec.strategies import (
    CallInput,
    ForwardError,
    forward_inputs,
    meta_built,
    module_trees,
    tree_info,
)
from swapspec.strategies.calls import GRAD_MODES
from swapspec.strategies.decorations import PARAMETRIZATIONS

trees = module_trees(world_chance=WORLD_CHANCE)
# FC-WRITE-BACK needs forwards that update or rebind given buffers: half the leaves do.
# Plain tensors only: a write-back is a rebind of a buffer's object, the same in every world.
updating_trees = module_trees(behaviours=("inplace", "rebind"), behaviour_chance=50,
                              needs=("updating-leaf",))
# FC-TIES needs aliases: trees get ties wherever two compatible slots exist (and no lazy leaves,
# whose uninitialized parameters cannot be given), so few examples are filtered.
# FC-GRADIENTS: a parameter that requires grad, so a valid call always has a leaf to reach
trainable_trees = module_trees(world_chance=WORLD_CHANCE, needs=("trainable",))
tied_trees = module_trees(tie_chance=100, lazy=False, needs=("alias",), world_chance=WORLD_CHANCE)


def _draw(data, property_id: str, target, *, module_strategy=trees, **options):
    """Draw a module and a call (``options`` go to ``call_inputs``: ``valid=True`` draws only
    calls the spec accepts, so a property about valid calls filters none out; the call runs
    under any autograd mode of ``GRAD_MODES`` unless ``grad_modes`` says otherwise)."""
    options.setdefault("grad_modes", GRAD_MODES)
    module = data.draw(module_strategy, label="module")
    call = data.draw(target_call_inputs(target, module, **options), label="call")
    example = Example(module, call=call)
    return module, call, example, Checker(property_id, target, example)


def _expected(module, call, tensors=None) -> dict[str, Any] | ExpectedError:
    """The oracle's outcome of ``call``, by the rules of the target it was drawn for (its
    keywords and ``designs``)."""
    return expected_outcome(module, call.tensors if tensors is None else tensors,
                            tie_weights=call.tie_weights, strict=call.strict,
                            registered_only="registered-names-only" in call.designs)


def _call(target, module, call, tensors=None, args=None, kwargs=None) -> Outcome:
    return attempt(lambda: call_target(
        target, module, call.tensors if tensors is None else tensors,
        call.args if args is None else args, call.kwargs if kwargs is None else kwargs,
        tie_weights=call.tie_weights, strict=call.strict, grad_mode=call.grad_mode))


def _call_watched(target, module, call, owners, form: str = "module pre-hook",
                  **given) -> tuple[Any, Outcome]:
    """Run the call (``given`` overrides as for ``_call``) with a pre-hook (``form``: one of
    ``WATCH_FORMS``) recording what forward sees; the hook is always removed."""
    view, handle = watch_forward(module, owners, form)
    try:
        return view, _call(target, module, call, **given)
    finally:
        handle.remove()


def _verdict(check: Checker, example: Example, target) -> None:
    check.verdict(partial(call_repro, example, target))


def _raised_as_expected(check: Checker, outcome: Outcome, expected: ExpectedError,
                        clause: str) -> None:
    """Clause ``clause``: the call raised ``expected``, by type and the keys its message names
    (by exact type and message for a target with ``exact_messages``)."""
    error, exact = outcome.error, check.target.exact_messages
    check.that(error is not None and expected.matches(error, exact=exact), clause,
               f"want {expected.wanted(exact=exact)}; got "
               + (f"{type(error).__name__}: {error}" if error else "no error"),
               code=f"isinstance(out, {expected.type.__name__})")


def _no_call_error(check: Checker, outcome: Outcome, module, filled, call) -> None:
    """Clause ``raised``: a valid call raises only what forward raises on a loaded copy (of the
    module as it was before the call: a target that did not restore it must not move the copy)."""
    error = outcome.error
    if error is None:
        return
    want = copy_outcome(module, filled, call, own=check.example.names_before).error
    check.that(type(error) is type(want), "raised",
               f"a valid call raised {type(error).__name__}: {error}")


def _owners(module, names) -> dict[str, tuple]:
    found = {n: owner_of(module, n) for n in names}
    return {n: o for n, o in found.items() if not isinstance(o, ExpectedError)}


@spec_property("FC-RESTORE")
@given(data=st.data())
def test_fc_restores_module(target, data):
    """After the call, returned or raised, every slot holds its original object and no attribute remains.

    Values of replaced originals are untouched. Half the examples raise inside forward (a
    pre-hook raises ``ForwardError``), half draw bad input sometimes. Origin: PR #92536
    restores in ``finally``; the old implementations leaked on exceptions.
    """
    raise_in_forward = data.draw(st.booleans(), label="raise in forward")
    module, call, example, check = _draw(data, "FC-RESTORE", target,
                                         invalid=data.draw(st.booleans(), label="invalid"))
    before = module_state(module)
    filled = _expected(module, call)
    replaced = _replaced(module, filled)  # before forward writes back into the call's mapping
    handle = module.register_forward_pre_hook(_raise_forward_error) if raise_in_forward else None
    try:
        _call(target, module, call)
    finally:
        if handle is not None:
            handle.remove()
    check_untouched(check, before, module, "not-restored", values_of=replaced,
                    names=_filled_slot_names(module, filled))
    _verdict(check, example, target)


def _raise_forward_error(module, args):
    raise ForwardError("raised by FC-RESTORE's pre-hook")


def _filled_slot_names(module, filled) -> set[str] | None:
    """Names of every slot a valid call fills (None for an invalid call: every slot).

    Forward may rebind a slot it was not given (``self.count = self.count + 1``); that is
    forward's own effect on the module, so restore is judged on the filled slots only.
    """
    if isinstance(filled, ExpectedError):
        return None
    reached = {slot_of(module, n) for n in filled}
    return {n for n in slots(module) if slot_of(module, n) in reached}


def _given_values(call) -> list[Any]:
    merged = merge_inputs(call.tensors)
    return [] if isinstance(merged, ExpectedError) else list(merged.values())


def _replaced(module, filled) -> set[int] | None:
    """Ids of the original tensors a valid call, filling ``filled`` (``_expected`` before the
    call: forward's write-back rebinds the call's own mapping), takes out of forward's reach
    (None: the call is invalid, and touches nothing). Forward may update what it can still reach
    (BatchNorm running stats, an unfilled alias of a replaced tensor); see ``replaced_originals``."""
    if isinstance(filled, ExpectedError):
        return None
    return replaced_originals(module, filled)


@spec_property("FC-VISIBLE")
@given(data=st.data())
def test_fc_given_tensors_visible_in_forward(target, data):
    """Inside forward, attribute access, ``named_*``, ``parameters()``, ``buffers()``,
    ``state_dict()``, ``get_parameter``/``get_buffer`` and ``get_submodule`` all show the given
    objects (``get_parameter`` refuses with ``AttributeError`` where the given object is not a
    ``Parameter``, as it refuses any non-``Parameter`` attribute), to a forward pre-hook on the
    module and to a global one (``register_module_forward_pre_hook``) alike.

    Origin: pytorch #92295 (class swapping left ``parameters()`` showing the originals).
    """
    module, call, example, check = _draw(data, "FC-VISIBLE", target, valid=True)
    filled = _expected(module, call)
    assume(not isinstance(filled, ExpectedError))
    given = merge_inputs(call.tensors)
    registered = named_tensors(module)
    form = data.draw(st.sampled_from(WATCH_FORMS), label="watched by")
    event(f"watched by: {form}")
    view, outcome = _call_watched(target, module, call, _owners(module, given), form)
    _no_call_error(check, outcome, module, filled, call)
    if view.seen:
        for name, value in given.items():
            _check_visible(check, view, name, value, name in registered)
    check.verdict(partial(call_repro, example, target, watch_form=form))


def _check_visible(check: Checker, view, name: str, value: Any, registered: bool) -> None:
    seen = view.attributes.get(name)
    check.that(seen is value, "attribute", f"attribute access for {name!r} did not give the "
               "given object", code=None)
    if not registered:
        return
    _check_accessors(check, view, name, value)
    if value is None:
        check.that(name not in view.named, "named-tensors",
                   f"{name!r} was given None but still listed by named_parameters/buffers")
        return
    check.that(view.named.get(name) is value, "named-tensors",
               f"named_parameters/named_buffers showed another object for {name!r}")
    ids = view.parameter_ids | view.buffer_ids
    check.that(id(value) in ids, "parameters-buffers",
               f"parameters()/buffers() did not include the object given for {name!r}")
    if name in view.state_dict:
        check.that(view.state_dict[name] is value, "state-dict",
                   f"state_dict(keep_vars=True) showed another object for {name!r}")


def _check_accessors(check: Checker, view, name: str, value: Any) -> None:
    """Clause ``accessors``: ``get_parameter``/``get_buffer`` give the given object (a
    parameter slot given a non-``Parameter`` refuses with ``AttributeError``), and
    ``get_submodule`` gives the slot's owner."""
    if name not in view.accessed:
        return
    kind, got = view.accessed[name]
    owner_path = name.rpartition(".")[0] or "''"
    check.that(view.submodule_found[name], "accessors",
               f"get_submodule({owner_path!r}) did not give the module owning {name!r}")
    if kind == "parameter" and not isinstance(value, nn.Parameter):
        check.that(isinstance(got, AttributeError), "accessors",
                   f"get_parameter({name!r}) gave {_described(got)} where {name!r} was given "
                   f"{_described(value)}, not a Parameter (want AttributeError)")
        return
    check.that(got is value, "accessors",
               f"get_{kind}({name!r}) gave {_described(got)}, not the given object")


def _described(value: Any) -> str:
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    return "None" if value is None else f"a {type(value).__name__}"


@spec_property("FC-ORACLE")
@given(data=st.data())
def test_fc_matchesloaded_copy(target, data):
    """The output equals a copy of the module with the same tensors loaded into it.

    An empty dict, or the module's own tensors, gives ``module(x)``. Origin: the
    ``functional_call`` contract (torch.func docs).
    """
    module, call, example, check = _draw(data, "FC-ORACLE", target, valid=True)
    filled = _expected(module, call)
    assume(not isinstance(filled, ExpectedError))
    copy, copy_kwargs = loaded_copy(module, filled, call)
    with call.grad_context():
        want = attempt(lambda: copy(*[clone_value(a) for a in call.args], **copy_kwargs))
    orders = {"before": slot_orders(module)}
    handle = module.register_forward_pre_hook(
        lambda m, a: None if "in forward" in orders else orders.update({"in forward": slot_orders(m)}))
    try:
        got = _call(target, module, call)
    finally:
        handle.remove()
    orders["after the call"] = slot_orders(module)
    reordered = [f"{when}, {change}" for when in ("in forward", "after the call") if when in orders
                 for change in slot_order_changes(orders["before"], orders[when])]
    check.that(same_output(got, want), "output",
               (f"the slot order changed ({'; '.join(reordered)}), and " if reordered else "")
               + f"output differs from the loaded copy's (got {_show(got)}, want {_show(want)})")
    _verdict(check, example, target)


def _show(outcome: Outcome) -> str:
    """The outcome in a message: the error, a plain tensor's first values, or another tensor's
    class and metadata (meta tensors hold no values; subclasses such as ``TwoTensor`` refuse
    ``tolist``)."""
    if outcome.error is not None:
        return f"{type(outcome.error).__name__}: {outcome.error}"
    r = outcome.result
    if not isinstance(r, Tensor):
        return repr(r)
    if type(r) in (Tensor, nn.Parameter) and holds_values(r):
        return f"tensor {r.detach().flatten()[:4].tolist()}..."
    return f"{type(r).__name__}({r.dtype}, {r.device}, shape={tuple(r.shape)})"


@spec_property("FC-TIES")
@given(data=st.data())
def test_fc_tie_rules(target, data):
    """With ``tie_weights=True`` giving one alias fills every alias; conflicting aliases raise.

    With ``tie_weights=False`` aliases are independent, except names that reach one slot of
    a shared submodule, which always share it (and conflict if given different objects).
    Origin: pytorch #86708 (ties ignored), PR #92536 (``tie_weights``).
    """
    module, call, example, check = _draw(data, "FC-TIES", target, valid=True,
                                         conflicts=True, module_strategy=tied_trees)
    groups = tie_groups(module)
    assume(groups)
    filled = _expected(module, call)
    if isinstance(filled, ExpectedError):
        assume(filled.rule in ("tie", "slot"))
        before = module_state(module)
        _raised_as_expected(check, _call(target, module, call), filled, f"{filled.rule}-conflict")
        check_untouched(check, before, module, "touched-on-error")
        return _verdict(check, example, target)
    want = expected_view(module, filled)
    view, outcome = _call_watched(target, module, call, {})
    _no_call_error(check, outcome, module, filled, call)
    if view.seen:
        for name in groups:
            check.that(view.named.get(name) is want[name] or (want[name] is None
                                                              and name not in view.named),
                       "alias-view", f"alias {name!r} did not show its expected object during forward")
    return _verdict(check, example, target)


@spec_property("FC-STRICT")
@given(data=st.data())
def test_fc_strict(target, data):
    """``strict=True`` raises a RuntimeError naming every missing and unexpected key iff there
    are any, before touching anything (torch's exact wording for targets with ``exact_messages``).

    Origin: pytorch #92153 (strict mode), PR #92536.
    """
    module, call, example, check = _draw(data, "FC-STRICT", target, valid=True, strict=True)
    expected = _expected(module, call)
    assume(not isinstance(expected, ExpectedError) or expected.rule == "strict")
    before = module_state(module)
    outcome = _call(target, module, call)
    if isinstance(expected, ExpectedError):
        _raised_as_expected(check, outcome, expected, "strict-error")
        check_untouched(check, before, module, "touched-on-error")
    else:
        _no_call_error(check, outcome, module, expected, call)
    _verdict(check, example, target)


@spec_property("FC-INPUT-FORMS")
@given(data=st.data())
def test_fc_input_forms(target, data):
    """A dict, a one-element tuple and a disjoint split give the same result; an overlapping split raises.

    Origin: ``torch.func.functional_call`` accepts a tuple of dicts (PR #92536).
    """
    # The forms' repro runs each form in the default autograd mode.
    module, call, example, check = _draw(data, "FC-INPUT-FORMS", target, valid=True,
                                         grad_modes=("enabled",))
    merged = call.merged()
    assume(not isinstance(_expected(module, call, merged), ExpectedError))
    cut = data.draw(st.integers(0, len(merged)), label="split at")
    items = list(merged.items())
    forms = {"dict": dict(items), "tuple": (dict(items),),
             "split": (dict(items[:cut]), dict(items[cut:]))}
    info = tree_info(module)
    outputs = {label: _call(target, info.build(), call, tensors=cloned_inputs(t), kwargs=fresh_kwargs(call))
               for label, t in forms.items()}
    for label, outcome in outputs.items():
        check.that(same_output(outcome, outputs["dict"]), "form-differs",
                   f"the {label} form gave {_show(outcome)}, the dict gave {_show(outputs['dict'])}")
    if items and not target.follows("no-input-checks"):  # the overlap refusal is an input check
        overlap = (dict(items[:cut + 1]), dict(items[max(cut, 1) - 1:]))
        expected = merge_inputs(overlap)
        before = module_state(module)
        view, outcome = _call_watched(target, module, call, {}, tensors=overlap,
                                      kwargs=fresh_kwargs(call))
        _raised_as_expected(check, outcome, expected, "overlap-accepted")
        if outcome.error is not None and not view.seen:  # a call that ran is FC-RESTORE's
            check_untouched(check, before, module, "touched-on-error")
    check.verdict(partial(call_repro, example, target, calls=_forms_lines(target, call, cut),
                          observe={"form outputs": "observed_forms"}))


def _forms_lines(target, call, cut: int) -> list[str]:
    """Repro lines for FC-INPUT-FORMS: each form on a fresh build, then the overlapping split
    on the module (``out``)."""
    run = f"args, dict(kwargs, report=[]) if 'report' in kwargs else kwargs{keyword_code(target, call)})"
    return [
        f"items, cut = list(entries(tensors).items()), {cut}",
        "forms = {'dict': dict(items), 'tuple': (dict(items),),",
        "         'split': (dict(items[:cut]), dict(items[cut:]))}",
        "form_outputs = {}",
        "for label, form in forms.items():  # each form on a fresh build, given fresh clones",
        "    clones = {}",
        "    form = tuple({k: clones.setdefault(id(v), v.detach().clone().requires_grad_(v.requires_grad)"
        " if isinstance(v, torch.Tensor) else v) for k, v in d.items()} for d in (form if isinstance(form, tuple) else (form,)))",
        "    form = form if isinstance(forms[label], tuple) else form[0]",
        f"    form_outputs[label] = describe(outcome(lambda: target_functional_call(build_module(), form, {run}))",
        "overlap = (dict(items[:cut + 1]), dict(items[max(cut, 1) - 1:]))  # names given twice",
        f"out = outcome(lambda: target_functional_call(module, overlap, {run}) if items else None",
        "if isinstance(out, Exception):",
        "    print('raised', type(out).__name__, out)",
        "observed_forms = {f'the {label} form gives': o for label, o in form_outputs.items()}",
    ]


@spec_property("FC-WRITE-BACK")
@given(data=st.data())
def test_fc_write_back(target, data):
    """A slot rebound in forward is written into the caller's mapping; in-place updates land on the caller's tensor.

    A target that follows the design ``no-write-back`` is held to the opposite for a rebind:
    the caller's mapping keeps the object it gave. Origin: ``torch.func.functional_call`` docs (in-place updates are reflected in the
    dict); the tuple-of-dicts rule is swapspec's: the dict the key came from.
    """
    module, call, example, check = _draw(data, "FC-WRITE-BACK", target, valid=True,
                                         module_strategy=updating_trees, buffers="all")
    if "tuple-disjoint" in target.call_forms and data.draw(st.booleans(), label="split"):
        call = _split(call, data.draw(st.integers(0, len(call.merged())), label="split at"))
        example = Example(module, call=call)
        check = Checker("FC-WRITE-BACK", target, example)
    filled = _expected(module, call)
    assume(not isinstance(filled, ExpectedError))
    given = merge_inputs(call.tensors)
    buffers = {n for n, _ in module.named_buffers(remove_duplicate=False)}
    keys = [n for n, v in given.items() if n in buffers and isinstance(v, Tensor)]
    assume(keys)
    copy, copy_kwargs = loaded_copy(module, filled, call)
    loaded = {n: owner_of(copy, n) for n in keys}
    loaded_objects = {n: getattr(o, k) for n, (o, k) in loaded.items()}
    held_by_copy = {id(t) for t in named_tensors(copy).values()}
    held_before = {id(t) for t in named_tensors(module).values()} | {id(v) for v in given.values()}
    with call.grad_context():
        copy_out = attempt(lambda: copy(*[clone_value(a) for a in call.args], **copy_kwargs))
    outcome = _call(target, module, call)
    same_outcome = check.that(type(outcome.error) is type(copy_out.error), "forward-outcome",
                              f"forward outcome differs from the loaded copy's: {_show(outcome)}")
    sources = _sources(call.tensors)
    for name in keys if same_outcome else ():
        owner, key = loaded[name]
        now = getattr(owner, key)
        caller = sources[name][name]
        if now is loaded_objects[name]:
            check.that(caller is given[name] and same_values(caller, now), "in-place-lost",
                       f"the in-place update of {name!r} did not land on the caller's tensor",
                       code=f"entries(tensors)[{name!r}] is given[{name!r}]")
        elif target.follows("no-write-back"):
            check.that(caller is given[name], "written-back",
                       f"forward rebound {name!r} and the caller's mapping got the new object, "
                       "but the target follows the design no-write-back",
                       code=f"entries(tensors)[{name!r}] is given[{name!r}]")
        else:
            check.that(got_rebound_object(caller, given[name], now, held_by_copy, held_before),
                       "rebind-lost",
                       f"forward rebound {name!r} but the caller's mapping did not get the new "
                       "object" + (": it holds a tensor the module or the caller held before the "
                                   "call" if id(caller) in held_before else ""),
                       code=f"entries(tensors)[{name!r}] is not given[{name!r}]")
    _verdict(check, example, target)


def _split(call, cut: int):
    """The call with its tensors as two disjoint dicts, cut at ``cut``."""
    items = list(call.merged().items())
    return dataclasses.replace(call, tensors=(dict(items[:cut]), dict(items[cut:])),
                               form="tuple-disjoint")


def _sources(tensors) -> dict[str, dict]:
    if isinstance(tensors, dict):
        return dict.fromkeys(tensors, tensors)
    return {k: d for d in tensors for k in d}


@spec_property("FC-BAD-INPUT")
@given(data=st.data())
def test_fc_bad_input(target, data):
    """Bad input gets torch's error type, with a message naming the keys involved, and the
    module is unchanged (torch's exact wording for targets with ``exact_messages``).

    Covers non-tensor values, unknown submodules, non-tensor attributes, empty names,
    non-mapping input and a value for a lazy module's uninitialized tensor. Origin: ``NamedMemberAccessor`` (PR #92536).
    """
    module, call, example, check = _draw(data, "FC-BAD-INPUT", target, valid=True,
                                         invalid=True, invalid_chance=100)
    expected = _expected(module, call)
    assume(isinstance(expected, ExpectedError) and expected.rule in ("form", "name"))
    before = module_state(module)
    _raised_as_expected(check, _call(target, module, call), expected, "wrong-error")
    check_untouched(check, before, module, "touched-on-error")
    _verdict(check, example, target)


# FC-DATA-PARALLEL: every tree in nn.DataParallel (on CPU it runs its module in place)
data_parallel_trees = module_trees(wrappers=("data-parallel",), wrapper_chance=100)
DATA_PARALLEL_REFUSED = ExpectedError(
    RuntimeError, "The stateless API can't be used with nn.DataParallel module", rule="form")


@spec_property("FC-DATA-PARALLEL")
@given(data=st.data())
def test_fc_refuses_data_parallel(target, data):
    """A functional call on an ``nn.DataParallel`` raises ``RuntimeError`` (torch's message for
    targets with ``exact_messages``), whatever the call gives, and leaves the module as it was:
    the replicas ``DataParallel`` makes on each forward would not see the given tensors.

    Origin: ``torch.nn.utils.stateless._functional_call`` (it refuses ``DataParallel``);
    swapspec spec (bad input leaves the module as it was).
    """
    module, call, example, check = _draw(data, "FC-DATA-PARALLEL", target,
                                         module_strategy=data_parallel_trees, valid=True)
    before = module_state(module)
    _raised_as_expected(check, _call(target, module, call), DATA_PARALLEL_REFUSED, "wrong-error")
    check_untouched(check, before, module, "touched-on-error")
    _verdict(check, example, target)


# FC-JIT-REFUSED: trees torch.jit.trace takes (no ties or shares: a traced module refuses them;
# no forward behaviours, which rebind or report through Python state tracing does not keep)
jit_trees = module_trees(behaviours=(), lazy=False, wrappers=(), ties=False, sharing=False)
JIT_REFUSED = ExpectedError(RuntimeError, "The stateless API can't be used with Jitted modules",
                            rule="form")
JIT_FORMS = ("traced module", "inside torch.jit.trace")


def _traced(module: nn.Module, x: Tensor) -> Outcome:
    """``torch.jit.trace(module, x)`` (its trace check and warnings off); a module tracing
    refuses (a backward hook) gives the error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attempt(lambda: torch.jit.trace(module, x, check_trace=False))


def _jit_call(target, module, call, form: str) -> Outcome:
    """The call on the traced module, or made inside a function ``torch.jit.trace`` is tracing;
    straight to the target, without the per-call invariants (their reads of the module's
    tensors would be traced too, and a ``ScriptModule``'s registries are not dicts)."""
    keywords = target.call_keywords(tie_weights=call.tie_weights, strict=call.strict)

    def direct(*args: Tensor) -> Any:
        return target.functional_call(module, call.tensors, args, call.kwargs, **keywords)

    if form == "traced module":
        return attempt(lambda: direct(*call.args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return attempt(lambda: torch.jit.trace(direct, tuple(call.args), check_trace=False))


@spec_property("FC-JIT-REFUSED")
@given(data=st.data())
def test_fc_refuses_jit(target, data):
    """A functional call on a jitted module (``torch.jit.trace``'s ``ScriptModule``), or made
    while ``torch.jit.trace`` is tracing, raises ``RuntimeError`` (torch's message for targets
    with ``exact_messages``) and leaves the module as it was: tracing would record the given
    tensors as constants of the traced graph, and a jitted module runs its own graph.

    Origin: ``torch.nn.utils.stateless._functional_call`` (it refuses ``torch.jit.is_tracing()``,
    ``torch.jit.is_scripting()`` and jitted modules); swapspec spec (bad input leaves the
    module as it was).
    """
    form = data.draw(st.sampled_from(JIT_FORMS), label="form")
    module, call, example, check = _draw(data, "FC-JIT-REFUSED", target, module_strategy=jit_trees,
                                         valid=True, grad_modes=("enabled",))
    x, = call.args
    if form == "traced module":
        traced = _traced(module, x)
        assume(traced.error is None)  # a backward hook: tracing refuses the module
        module = traced.result
    before = module_state(module)
    outcome = _jit_call(target, module, call, form)
    _raised_as_expected(check, outcome, JIT_REFUSED, "wrong-error")
    check_untouched(check, before, module, "touched-on-error")
    check.verdict(partial(call_repro, example, target, **_jit_repro(form, target, call)))


def _jit_repro(form: str, target, call) -> dict[str, list[str]]:
    """The repro's extra lines: the module traced, or the call made inside a trace."""
    if form == "traced module":
        return {"setup": ["module = torch.jit.trace(module, args[0], check_trace=False)",
                          "before = named(module)"]}
    run = f"lambda *a: target_functional_call(module, tensors, a, kwargs{keyword_code(target, call)})"
    return {"calls": [f"out = outcome(lambda: torch.jit.trace({run}, tuple(args), "
                      "check_trace=False))"]}


@spec_property("FC-GRADIENTS")
@given(data=st.data())
def test_fc_gradients_flow_to_given_tensors_only(target, data):
    """Backward through the output reaches the given tensors and not the module's replaced parameters.

    Every floating parameter value given is a fresh leaf that requires grad (one leaf per given
    object, so aliases given one object still share one); a call that gives none gets one for
    the first parameter it can take without a conflict. Origin: the purpose of
    ``functional_call`` (``torch.func.grad`` over parameters).
    """
    module = data.draw(trainable_trees, label="module")
    drawn = data.draw(target_call_inputs(target, module, valid=True, failing=False,
                                         forward_safe=True), label="call")
    params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    given = _with_grad_leaves(module, drawn, params)
    call = _received(drawn, given)
    tensors = call.tensors
    example = Example(module, call=call)  # what the target receives: declarations and repro
    check = Checker("FC-GRADIENTS", target, example)
    filled = _expected(module, call, tensors)
    assume(not isinstance(filled, ExpectedError))  # a safety net: _with_grad_leaves keeps it valid
    registered = named_tensors(module)
    out_of_reach = replaced_originals(module, filled)
    replaced = {n: registered[n] for n in filled
                if n in registered and id(registered[n]) in out_of_reach}
    grads_before = {n: p.grad for n, p in replaced.items()}
    given_before = dict(given)  # the call may write back into ``given``
    outcome = _call(target, module, call, tensors=tensors)
    assume(outcome.error is None and isinstance(outcome.result, Tensor)
           and outcome.result.requires_grad)
    ran = attempt(lambda: outcome.result.real.float().sum().backward())
    # A kernel missing for the world's tensors (sparse grads on meta: "aten::_coalesce" for
    # SparseMeta) is not about where gradients flow.
    assume(not isinstance(ran.error, NotImplementedError))
    if ran.error is not None:
        raise ran.error
    for name, p in replaced.items():
        check.that(p.grad is grads_before[name], "grad-to-original",
                   f"backward reached the module's own {name!r}, which was replaced")
    for name, v in given_before.items():
        if name in params and isinstance(v, Tensor) and v.requires_grad:
            check.that(v.grad is not None, "no-grad-to-given",
                       f"backward did not reach the given tensor for {name!r}")
    _verdict(check, example, target)


def _received(drawn: Any, given: dict[str, Any]) -> Any:
    """The call the target receives: ``drawn`` with ``given`` as its tensors, in one dict, or
    in a 1-tuple where a tuple was drawn."""
    if isinstance(drawn.tensors, dict):
        return dataclasses.replace(drawn, tensors=given, form="dict")
    return dataclasses.replace(drawn, tensors=(given,), form="tuple-single")


def _with_grad_leaves(module, call, params: set[str]) -> dict[str, Any]:
    """The call's tensors with each floating parameter value a leaf that requires grad, one leaf
    per given object; if none is given, a leaf for the first parameter that can take one
    without making the call invalid."""
    leaves: dict[int, Any] = {}
    given = {n: leaves.setdefault(id(v), _leaf(v)) if n in params else v
             for n, v in call.merged().items()}
    if any(n in params and isinstance(v, Tensor) and v.requires_grad for n, v in given.items()):
        return given
    registered = named_tensors(module)
    for name in sorted(params - set(given)):
        if is_uninitialized(registered[name]):
            continue
        leaf = _leaf(registered[name])
        if leaf is registered[name]:  # not a floating CPU tensor (or uninitialized)
            continue
        extended = {**given, name: leaf}
        if not isinstance(_expected(module, call, extended), ExpectedError):
            return extended
    return given


def _leaf(value: Any) -> Any:
    """A fresh leaf that requires grad, for a given floating or complex parameter value."""
    if (isinstance(value, Tensor) and (value.is_floating_point() or value.is_complex())
            and value.device.type == "cpu"):
        return value_copy(value).requires_grad_()
    return value


parametrized_trees = module_trees(decoration_chance=100, decoration_kinds=PARAMETRIZATIONS,
                                  behaviours=(), needs=("parametrizable",),
                                  world_chance=WORLD_CHANCE)


@spec_property("FC-PARAMETRIZED")
@given(data=st.data())
def test_fc_parametrized_names(target, data):
    """On a parametrized module, a value given under the attribute's own name disables the
    parametrization for the call (forward reads that very tensor); a value given under
    ``<path>.parametrizations.<name>.original`` is the parametrization's input. Either way
    the module is left as it was.

    Origin: the notes of ``torch.func.functional_call``'s documentation, held to their word.
    """
    module = data.draw(parametrized_trees, label="module")
    attributes = parametrized_attributes(module)
    assume(attributes)
    path, name = data.draw(st.sampled_from(attributes), label="attribute")
    owner = module.get_submodule(path) if path else module
    # a target with registered-names-only refuses the attribute's own name: not a registered slot
    disable = (not target.follows("registered-names-only")
               and data.draw(st.booleans(), label="under its own name"))
    key, value, expected = _parametrized_input(owner, path, name, disable, data)
    (x,) = data.draw(forward_inputs(), label="x")
    x = x.to("meta") if meta_built(module) else x
    call = CallInput({key: value}, (x,), {}, features=frozenset({"parametrized"}),
                     **fixed_keywords(target))
    # a tree that cannot run in its world tells nothing about what forward reads
    assume(runs_in_its_world(module, call.args))
    example = Example(module, call=call)
    check = Checker("FC-PARAMETRIZED", target, example)
    if check.skips_declared_crash():
        return
    before = module_state(module)
    seen: dict[str, Any] = {}
    handle = owner.register_forward_pre_hook(  # the first read only: a shared module runs twice
        lambda m, a: None if "value" in seen else seen.update(value=getattr(m, name)))
    try:
        outcome = _call(target, module, call)
    finally:
        handle.remove()
    if check.that(outcome.error is None, "raised",
            f"functional_call raised {type(outcome.error).__name__}: {outcome.error}"):
        got = seen.get("value")
        if disable:
            check.that(got is value, "not-disabled",
                       f"forward read {name!r} of {path or '<root>'!r} as another tensor than "
                       f"the one given under {key!r}: the parametrization was not disabled",
                       code=f"seen['value'] is tensors[{key!r}]")
        else:
            check.that(got is not None and same_values(got.detach(), expected), "not-applied",
                       f"forward read {name!r} as something other than the parametrization of "
                       f"the tensor given under {key!r}")
    originals = {id(t) for t in plist_tensors(owner, name)}
    check_untouched(check, before, module, "not-restored", values_of=originals)
    check.verdict(partial(call_repro, example, target, setup=[
        "seen = {}",
        f"owner = module.get_submodule({path!r}) if {path!r} else module",
        "owner.register_forward_pre_hook(lambda m, a: None if 'value' in seen else "
        f"seen.update(value=getattr(m, {name!r})))"]))


def parametrized_attributes(module) -> list[tuple[str, str]]:
    """``(module path, attribute)`` of every parametrized attribute, each module once."""
    seen, out = set(), []
    for path, m in module.named_modules():
        if id(m) not in seen and parametrize.is_parametrized(m):
            seen.add(id(m))
            out += [(path, name) for name in m.parametrizations]
    return out


def plist_tensors(owner, name: str) -> list[Tensor]:
    """The tensors a parametrized attribute is computed from (its ``original`` ones)."""
    return list(owner.parametrizations[name]._parameters.values())


def _parametrized_input(owner, path, name, disable, data):
    """``(key, value, what forward should read)`` for one parametrized attribute."""
    prefix = f"{path}." if path else ""
    plist = owner.parametrizations[name]
    if disable:
        current = getattr(owner, name)
        value = _fresh_like(current, data)
        return f"{prefix}{name}", value, value
    originals = [k for k in plist._parameters if k.startswith("original")]
    key = data.draw(st.sampled_from(sorted(originals)), label="original")
    value = _fresh_like(plist._parameters[key], data)
    expected = _parametrization_of(plist, key, value)
    return f"{prefix}parametrizations.{name}.{key}", value, expected


def _fresh_like(t: Tensor, data) -> Tensor:
    """New values of ``t``'s shape, dtype and device (on ``meta``: none), ``requires_grad`` as ``t``."""
    seed = data.draw(st.integers(0, 2**16), label="value seed")
    gen = torch.Generator().manual_seed(seed)
    values = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1
    return values.to(t.dtype).to(t.device).requires_grad_(t.requires_grad)


def _parametrization_of(plist, key: str, value: Tensor) -> Tensor:
    """What the parametrization list reads with ``value`` as its ``key`` (computed on a copy)."""
    copy = deepcopy(plist)
    copy._parameters[key] = value
    with torch.no_grad():
        return copy().detach()
