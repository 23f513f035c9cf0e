"""Properties of ``torch.nn.utils.parametrize`` on modules the target converted: one rule per test.

Each property draws a tree with a plain matrix parameter (``module_trees(needs=
('parametrizable',))``), parametrizes it (first, or stacked on a drawn parametrization), converts
the tree with the target's ``apply`` and then removes, stacks, refuses, transfers, caches or
deep-copies the parametrization: what users do after ``model.double()`` or a quantizing
``_apply`` (weight_norm removed after training, parametrizations moved to a converted copy).

Origins: the documentation of ``register_parametrization``, ``remove_parametrizations``,
``transfer_parametrizations_and_params``, ``cached`` and ``type_before_parametrizations``.
"""

from __future__ import annotations

import copy
import pickle
from functools import partial
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn.utils import parametrize

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import apply_repro
from swapspec.properties.harness.target_calls import (
    call_target,
    run_converted,
    target_call_inputs,
)
from swapspec.properties.models.call_state import module_state
from swapspec.properties.models.examples import Example, clone_value, is_wrapper, same_values
from swapspec.properties.models.load_examples import changes, snapshot_for_load
from swapspec.properties.models.outcomes import attempt, same_output
from swapspec.properties.models.parametrize_state import (
    forward,
    layout,
    matrix_slot,
    originals,
    owner_at,
    read,
    registered_value,
    undecorated_build,
)
from swapspec.properties.rules.clauses import check_untouched, no_error
from swapspec.strategies import flag_settings, module_trees
from swapspec.strategies.conversions import modules_with_conversions, trainable_on_cpu
from swapspec.strategies.parametrizations import (
    BAD_WORDS,
    MISSING_NAME,
    REPRO_IMPORT,
    Registration,
    bad_registrations,
    good_parametrizations,
    make_parametrization,
)

# Decorations that leave the matrix a parameter, or parametrize it (spectral norm's reads run a
# power iteration that writes its vectors, so no read is free of side effects: not drawn).
DECORATIONS = ("tensor-hooks", "module-hooks", "weight_norm", "orthogonal", "custom",
               "custom-inverse")
# Conversions that keep values on the CPU and leave floating tensors floating (half and bfloat16
# have no CPU kernels for orthogonal's matrix exponential; complex values have no order), and
# the target's own that say so (``Conversion.trainable``: same dtype, dense, on the CPU).
CONVERSIONS = ("float()", "double()", "to(torch.float64)", "cpu()", "share_memory()",
               "to(memory_format=torch.channels_last)", "add(1)", "TwoTensor")


def _parametrizable(conversion) -> bool:
    return conversion.name in CONVERSIONS or trainable_on_cpu(conversion)


TREE_OPTIONS = {"lazy": False, "needs": ("parametrizable", "leaf-grads"), "wrappers": (),
                "decoration_kinds": DECORATIONS, "catalogue": False, "behaviours": ()}
converted = modules_with_conversions(module_trees(**TREE_OPTIONS), ["cpu"],
                                     where=_parametrizable)
# No shared submodule: a call naming one slot twice is FC-RESTORE's subject (SHARED_SLOT).
converted_unshared = modules_with_conversions(module_trees(**TREE_OPTIONS, sharing=False), ["cpu"],
                                              where=_parametrizable)


# The share of the profile's max_examples each property runs (at least one): an example builds,
# parametrizes and converts a tree, then checks the invariants, so a full share would cost
# several times the suite's time budget for these properties. PARAMETRIZE-REFUSED, whose kinds
# each reach their own refusal, gets twice the share.
EXAMPLES_DIVISOR = 4


def _registration_line(path: str, name: str, kind: str) -> str:
    return (f"torch.nn.utils.parametrize.register_parametrization(module.get_submodule({path!r}), "
            f"{name!r}, make_parametrization({kind!r}))")


def _prepared(target: Any, data: st.DataObject, property_id: str, *, good: bool = True,
              bad: bool = False, drawn: st.SearchStrategy = converted):
    """``(example, check, path, name, setup)``: a drawn tree whose matrix got a drawn good
    parametrization (unless not ``good``), converted by the target (an example whose conversion
    the target refuses is not drawn: ``APPLY-`` properties judge those). With ``bad``, a
    registration ``unsafe=False`` refuses is drawn too, as the example's ``method``."""
    module, conversion = data.draw(drawn, label="module and conversion")
    path, name = matrix_slot(module)
    owner = owner_at(module, path)
    setup = [REPRO_IMPORT]
    if good:
        kind = data.draw(good_parametrizations(stacked=parametrize.is_parametrized(owner, name)),
                         label="parametrization")
        parametrize.register_parametrization(owner, name, make_parametrization(kind))
        setup.append(_registration_line(path, name, kind))
    registration = data.draw(bad_registrations(stacked=parametrize.is_parametrized(owner, name)),
                             label="registration") if bad else None
    example = Example(module, conversion=conversion, flags=data.draw(flag_settings(), label="flags"),
                      method=registration)
    check = Checker(property_id, target, example)
    outcome = run_converted(target, example)
    assume(outcome.error is None)
    return example, check, path, name, setup


def _repro(example: Example, target: Any, setup: list[str], extra: list[str]):
    return partial(apply_repro, example, target, setup=setup, extra=extra)


# What unsafe=False refuses and unsafe=True takes: a dtype or shape the parametrization changes, a
# shape its right_inverse changes (a right_inverse that changes the dtype is refused either way).
UNSAFE_KINDS = ("forward-dtype", "forward-shape", "inverse-shape")


@spec_property("PARAMETRIZE-REMOVE", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_remove_after_apply(target, data):
    """After the target converts a parametrized module, ``remove_parametrizations`` leaves a
    plain slot holding the parametrized value (``leave_parametrized=True``, in the original's
    object where there is one original) or the original object as converted (``False``), and forward
    still runs; ``False`` with several originals raises
    ``ValueError`` and leaves the module as it was.

    Origin: ``torch.nn.utils.parametrize.remove_parametrizations``' documentation (weight_norm
    removed after training a converted model).
    """
    example, check, path, name, setup = _prepared(target, data, "PARAMETRIZE-REMOVE")
    module, owner = example.module, owner_at(example.module, path)
    leave = data.draw(st.booleans(), label="leave_parametrized")
    value, held = read(owner, name), originals(owner, name)
    kept = [o.detach().clone() for o in held]
    base = parametrize.type_before_parametrizations(owner)
    others = set(owner.parametrizations) - {name}
    output = forward(module)  # before the snapshot: a training forward updates running stats
    before = snapshot_for_load(module)
    outcome = attempt(lambda: parametrize.remove_parametrizations(owner, name, leave))
    if not leave and len(held) > 1:
        check.that(isinstance(outcome.error, ValueError), "raised-none",
                   f"leave_parametrized=False with {len(held)} originals: expected ValueError, "
                   f"got {outcome.error!r}")
        check.that(not changes(before, module), "changed",
                   f"the refused removal changed the module: {changes(before, module)[:4]}")
    elif no_error(check, outcome, "remove_parametrizations"):
        slot = owner._parameters.get(name, owner._buffers.get(name))
        check.that(not parametrize.is_parametrized(owner, name) and slot is not None, "slot",
                   f"{name!r} is not a plain slot after the removal")
        if leave and len(held) == 1:
            check.that(slot is held[0], "object", "the slot does not hold the original's object")
        if not leave:
            check.that(slot is held[0] and same_values(slot, kept[0]), "original",
                       "the slot does not hold the converted original with its values")
        else:
            check.that(slot is not None and same_values(slot.detach(), value), "value",
                       "the slot does not hold the parametrized value")
            check.that(forward(module).error is None or output.error is not None, "forward",
                       f"forward raises after the removal: {forward(module).error!r}")
        check.that(others or type(owner) is base, "class",
                   f"{type(owner).__name__} is not back to {base.__name__}")
    check.verdict(_repro(example, target, setup, [
        f"torch.nn.utils.parametrize.remove_parametrizations(module.get_submodule({path!r}), "
        f"{name!r}, {leave})"]))


@spec_property("PARAMETRIZE-STACK", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_register_after_apply(target, data):
    """Registering a parametrization on a tensor of a module the target converted (the first, or
    stacked on the ones it has) makes it read the parametrization of its value (stacked) or of
    its ``right_inverse`` (first), in the converted dtype and device, last in its list; forward
    reads it.

    Origin: ``register_parametrization``'s documentation (parametrizations stack; the first
    one's ``right_inverse`` initializes the original).
    """
    example, check, path, name, setup = _prepared(target, data, "PARAMETRIZE-STACK", good=False)
    owner = owner_at(example.module, path)
    stacked = parametrize.is_parametrized(owner, name)
    kind = data.draw(good_parametrizations(stacked=stacked), label="registered")
    parametrization = make_parametrization(kind)
    value = read(owner, name)
    expected = registered_value(make_parametrization(kind), value, stacked=stacked)
    outcome = attempt(lambda: parametrize.register_parametrization(owner, name, parametrization))
    if no_error(check, outcome, "register_parametrization"):
        now = read(owner, name)
        check.that(same_values(now, expected), "value",
                   f"{name!r} reads {now.dtype} {tuple(now.shape)} values other than the "
                   f"{'stacked' if stacked else 'first'} {kind} of its value")
        check.that(owner.parametrizations[name][-1] is parametrization, "order",
                   "the registered parametrization is not last in its list")
        check.that(forward(example.module).error is None, "forward",
                   "forward raises after the registration")
    check.verdict(_repro(example, target, setup, [_registration_line(path, name, kind)]))


@spec_property("PARAMETRIZE-REFUSED", examples_divisor=EXAMPLES_DIVISOR // 2)
@given(data=st.data())
def test_refused_registration_after_apply(target, data):
    """A registration ``unsafe=False`` refuses, through the target's ``register_parametrization``
    (a parametrization or ``right_inverse`` that
    changes the dtype or shape or returns no tensor, a ``right_inverse`` that moves the tensor
    or returns a bad sequence, a name the module lacks), on a module the target converted,
    raises ``ValueError`` naming the problem and leaves the module exactly as it was: classes,
    slots, tensors, values and parametrizations.

    Origin: ``register_parametrization``'s documentation (``unsafe=False`` checks consistency
    at registration); swapspec spec (bad input leaves the module as it was).
    """
    example, check, path, name, setup = _prepared(target, data, "PARAMETRIZE-REFUSED", good=False,
                                                  bad=True)
    module, owner = example.module, owner_at(example.module, path)
    registration: Registration = example.method
    target_name = MISSING_NAME if registration.kind == "missing-name" else name
    before, state, shape = snapshot_for_load(module), module_state(module), layout(module)
    register = target.method("register_parametrization")
    outcome = attempt(lambda: register(owner, target_name, make_parametrization(registration.kind),
                                       overwrite=False, swap=False))
    word = BAD_WORDS[registration.kind]
    check.that(isinstance(outcome.error, ValueError) and word in str(outcome.error).lower(),
               "error", f"expected a ValueError naming {word!r}, got {outcome.error!r}")
    check.that(not changes(before, module), "changed",
               f"the refused registration changed tensors: {changes(before, module)[:4]}")
    check.that(layout(module) == shape, "changed",
               f"the refused registration changed classes or parametrizations: {layout(module)}")
    check_untouched(check, state, module, "changed")
    check.verdict(_repro(example, target, setup, [
        f"target_method(module.get_submodule({path!r}), 'register_parametrization', False, False, "
        f"{target_name!r}, make_parametrization({registration.kind!r}))"]))


@spec_property("PARAMETRIZE-ASSIGN", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_assign_after_apply(target, data):
    """Assigning a parametrized tensor of a module the target converted its own value stores it
    through the ``right_inverse`` of every parametrization, last first, keeping the originals'
    objects; where one has none (or its ``right_inverse`` raises), the assignment raises and
    leaves the module exactly as it was.

    Origin: ``register_parametrization``'s documentation (assigning a parametrized tensor calls
    ``right_inverse``).
    """
    example, check, path, name, setup = _prepared(target, data, "PARAMETRIZE-ASSIGN")
    module, owner = example.module, owner_at(example.module, path)
    held, value = originals(owner, name), read(owner, name)
    before = snapshot_for_load(module)
    outcome = attempt(lambda: setattr(owner, name, value))
    if outcome.error is None:
        check.that(all(a is b for a, b in zip(originals(owner, name), held, strict=True)),
                   "originals", "the assignment replaced an original object")
    else:
        check.that(not changes(before, module), "changed",
                   f"the refused assignment changed the module: {changes(before, module)[:4]}")
    check.verdict(_repro(example, target, setup, [
        f"setattr(module.get_submodule({path!r}), {name!r}, "
        f"getattr(module.get_submodule({path!r}), {name!r}).detach().clone())"]))


@spec_property("PARAMETRIZE-UNSAFE", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_unsafe_registration_after_apply(target, data):
    """With ``unsafe=True``, a first registration whose parametrization changes the dtype or the
    shape, or whose ``right_inverse`` changes the shape (what ``unsafe=False`` refuses), through
    the target's ``register_parametrization`` on a module the target converted, is accepted: a
    first one leaves the original holding ``right_inverse`` of the tensor's value, in its dtype
    and shape, and the tensor reading the parametrization of the original; one stacked on a
    parametrized tensor leaves the originals as they were (objects and values) and the tensor
    reading the parametrization of what it read before. A first one whose ``right_inverse``
    returns a view, on a traceable wrapper subclass (whose original is written by
    ``swap_tensors``, which refuses a view), raises ``RuntimeError`` and leaves the module as it
    was.

    Origin: ``register_parametrization``'s documentation (``unsafe=True`` skips the consistency
    checks, for parametrizations that change the dtype or shape).
    """
    example, check, path, name, setup = _prepared(target, data, "PARAMETRIZE-UNSAFE", good=False)
    kind = data.draw(st.sampled_from(UNSAFE_KINDS), label="unsafe parametrization")
    owner = owner_at(example.module, path)
    value, parametrization = clone_value(read(owner, name).detach()), make_parametrization(kind)
    stacked = parametrize.is_parametrized(owner, name)
    held = [(o, clone_value(o.detach())) for o in originals(owner, name)] if stacked else []
    # A view right_inverse returns cannot be swapped into a wrapper subclass's original.
    refused = not stacked and kind == "inverse-shape" and is_wrapper(read(owner, name))
    before = snapshot_for_load(example.module)
    register = target.method("register_parametrization")
    outcome = attempt(lambda: register(owner, name, parametrization, unsafe=True,
                                       overwrite=False, swap=False))
    if refused:
        check.that(isinstance(outcome.error, RuntimeError), "refused",
                   f"a view written into a wrapper subclass's original: got {outcome.error!r}")
        check.that(not changes(before, example.module), "changed",
                   f"the refused registration changed the module: {changes(before, example.module)[:4]}")
    else:
        check.that(outcome.error is None, "accepted",
                   f"the unsafe registration raised {outcome.error!r}")
    if outcome.error is None and stacked:
        check.that(all(a is o and _same(a.detach(), v) for a, (o, v) in
                       zip(originals(owner, name), held, strict=True)), "original",
                   "a stacked unsafe registration changed the originals")
        _check_read(check, owner, name, parametrization(value))
    elif outcome.error is None:
        _check_unsafe_state(check, owner, name, parametrization.right_inverse(value),
                            parametrization)
    check.verdict(_repro(example, target, setup, [
        f"target_method(module.get_submodule({path!r}), 'register_parametrization', False, False, "
        f"{name!r}, make_parametrization({kind!r}), unsafe=True)"]))


def _check_unsafe_state(check: Checker, owner: nn.Module, name: str, original: Tensor,
                        parametrization: nn.Module) -> None:
    """Clauses ``original`` and ``reads``: the original and the read, by dtype, shape and value."""
    held = originals(owner, name)[0].detach()
    check.that(_same(held, original), "original",
               f"the original is {held.dtype} {tuple(held.shape)}, not right_inverse's "
               f"{original.dtype} {tuple(original.shape)} of the tensor's value")
    _check_read(check, owner, name, parametrization(original))


def _check_read(check: Checker, owner: nn.Module, name: str, wanted: Tensor) -> None:
    """Clause ``reads``: the tensor reads ``wanted``, by dtype, shape and value."""
    got = read(owner, name).detach()
    check.that(_same(got, wanted), "reads",
               f"{name!r} reads {got.dtype} {tuple(got.shape)}, not the new parametrization of "
               f"what it read ({wanted.dtype} {tuple(wanted.shape)})")


def _same(a: Tensor, b: Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and same_values(a, b)


@spec_property("PARAMETRIZE-TRANSFER", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_transfer_after_apply(target, data):
    """``transfer_parametrizations_and_params`` from a parametrized module the target converted
    gives the receiver (a plain copy converted the same way, or an empty module) the same
    parametrization modules in order over the same originals, so it reads the same value.

    Origin: ``transfer_parametrizations_and_params``' documentation (parametrizations moved to a
    converted or quantized copy).
    """
    example, check, path, name, setup = _prepared(target, data, "PARAMETRIZE-TRANSFER")
    owner = owner_at(example.module, path)
    receiver = _receiver(target, example, path, data.draw(st.booleans(), label="empty receiver"))
    assume(receiver is not None)
    outcome = attempt(lambda: parametrize.transfer_parametrizations_and_params(owner, receiver,
                                                                               name))
    if no_error(check, outcome, "transfer_parametrizations_and_params"):
        check.that(parametrize.is_parametrized(receiver, name)
                   and list(receiver.parametrizations[name]) == list(owner.parametrizations[name]),
                   "parametrizations", "the receiver does not hold the same parametrizations")
        check.that(parametrize.is_parametrized(receiver, name)
                   and all(a is b for a, b in zip(originals(receiver, name), originals(owner, name),
                                                  strict=True)),
                   "originals", "the receiver does not hold the same originals")
        check.that(same_values(read(receiver, name), read(owner, name)), "value",
                   f"the receiver's {name!r} reads another value")
    check.verdict(_repro(example, target, setup, []))


def _receiver(target: Any, example: Example, path: str, empty: bool) -> nn.Module | None:
    """An empty module, or the owner in a plain build of the tree converted as the example was
    (None where the target refuses that conversion)."""
    if empty:
        return nn.Module()
    plain = undecorated_build(example.module)
    copied = Example(plain, conversion=example.conversion, flags=example.flags)
    return None if run_converted(target, copied).error else owner_at(plain, path)


@spec_property("PARAMETRIZE-CACHED", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_cached_call(target, data):
    """A target functional call on a parametrized module inside ``parametrize.cached()`` returns
    what the same call returns outside it, on an identical module; after the block the module's
    parametrized tensor reads its value afresh.

    Origin: ``torch.nn.utils.parametrize.cached``' documentation (caching is a speed-up that
    changes no result).
    """
    example, check, path, name, setup = _prepared(target, data, "PARAMETRIZE-CACHED",
                                                   drawn=converted_unshared)
    module = example.module
    copied = attempt(lambda: copy.deepcopy(module))  # the twin the call outside cached() runs on
    if not no_error(check, copied, "copy.deepcopy"):
        check.verdict(_repro(example, target, setup, []))
        return
    twin = copied.result
    call = data.draw(target_call_inputs(target, module, valid=True), label="call")

    def run(m: nn.Module, tensors: Any) -> Any:
        return attempt(lambda: call_target(target, m, tensors, call.args, call.kwargs,
                                           tie_weights=call.tie_weights, strict=call.strict))

    tensors = _retargeted(call.tensors, module, module)  # a value None deletes: none given
    plain = run(twin, _retargeted(tensors, module, twin))
    with parametrize.cached():
        cached = run(module, tensors)
    check.that(same_output(cached, plain), "output",
               f"inside cached() the call gives {_shown(cached)}, outside {_shown(plain)}")
    owner = owner_at(module, path)
    with parametrize.cached():
        read(owner, name)
        originals(owner, name)[0].detach().add_(1)
    now = read(owner, name)
    check.that(same_values(now, owner.parametrizations[name]().detach()), "stale",
               "after cached() the parametrized tensor still reads the value cached inside it")
    check.verdict(_repro(example, target, setup, []))


def _retargeted(tensors: Any, module: nn.Module, twin: nn.Module) -> Any:
    """``tensors`` without ``None`` values, each of ``module``'s own tensors replaced by the
    twin's counterpart and every other tensor by a clone (one per object: forward may write to a
    given buffer)."""
    mine = {id(t): n for n, t in [*module.named_parameters(remove_duplicate=False),
                                  *module.named_buffers(remove_duplicate=False)]}
    theirs = dict([*twin.named_parameters(remove_duplicate=False),
                   *twin.named_buffers(remove_duplicate=False)])

    clones: dict[int, Any] = {}

    def swap(value: Any) -> Any:
        if not isinstance(value, Tensor):
            return value
        if id(value) in mine:
            return theirs[mine[id(value)]]
        return clones.setdefault(id(value), clone_value(value))

    if isinstance(tensors, dict):
        return {k: swap(v) for k, v in tensors.items() if v is not None}
    return tuple({k: swap(v) for k, v in d.items() if v is not None} for d in tensors)


def _shown(outcome: Any) -> str:
    if outcome.error is not None:
        return f"{type(outcome.error).__name__}: {outcome.error}"
    return f"a {type(outcome.result).__name__}"


@spec_property("PARAMETRIZE-DEEPCOPY", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_deepcopy_after_apply(target, data):
    """``copy.deepcopy`` of a parametrized module the target converted keeps every module's class
    (and ``type_before_parametrizations``), parametrizations and parametrized values, sharing no
    tensor with the original; pickling a parametrized module raises ``RuntimeError`` pointing to
    ``state_dict()``.

    Origin: ``torch.nn.utils.parametrize``'s injected ``__deepcopy__`` and ``__getstate__``.
    """
    example, check, path, name, setup = _prepared(target, data, "PARAMETRIZE-DEEPCOPY")
    module, owner = example.module, owner_at(example.module, path)
    outcome = attempt(lambda: copy.deepcopy(module))
    if no_error(check, outcome, "copy.deepcopy"):
        twin = outcome.result
        check.that(layout(twin) == layout(module), "layout",
                   f"the copy's classes or parametrizations differ: {layout(twin)}")
        check.that(same_values(read(owner_at(twin, path), name), read(owner, name)), "value",
                   f"the copy's {name!r} reads another value")
        mine = {id(t) for t in [*module.parameters(), *module.buffers()]}
        check.that(not any(id(t) in mine for t in [*twin.parameters(), *twin.buffers()]),
                   "shared", "the copy shares a tensor with the original")
    pickled = attempt(lambda: pickle.dumps(owner))
    check.that(isinstance(pickled.error, RuntimeError) and "state_dict" in str(pickled.error),
               "pickle", f"pickling a parametrized module: expected RuntimeError naming "
               f"state_dict(), got {pickled.error!r}")
    check.verdict(_repro(example, target, setup, []))
