"""Facts about ``torch.func.functional_call``, as predicates over a drawn ``Example``: which names
it swaps into one slot and in what order, what its restore and write-back leave behind. The
torch declarations (``declarations.torch``) read them."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.declarations.torch_apply import (
    _params,
    _results,
    old_norm_refusals,
    torch_path,
)
from swapspec.properties.models.apply_state import is_uninitialized
from swapspec.properties.models.call_state import cloned_inputs, copy_outcome, loaded_copy
from swapspec.properties.models.examples import (
    Example,
    alias_groups,
    clone_value,
    holds_values,
    named_tensors,
    same_values,
)
from swapspec.properties.models.oracle import (
    ExpectedError,
    expand,
    expected_outcome,
    lazy_value_error,
    merge_inputs,
    name_error,
    owner_of,
    slot_conflict,
    slot_of,
    strict_error,
    tie_groups,
)
from swapspec.properties.models.outcomes import attempt


# ---- facts about torch's functional_call ------------------------------------------------
def _filled(example: Example) -> dict[str, Any] | None:
    """The names torch swaps in, with their values; None when torch refuses the call.

    torch runs the spec's checks except one: it does not notice two names of one shared
    slot carrying different objects, and swaps both.
    """
    call, module = example.call, example.module
    given = merge_inputs(call.tensors)
    if isinstance(given, ExpectedError):
        return None
    filled = expand(module, given, call.tie_weights)
    if isinstance(filled, ExpectedError) or (call.strict and strict_error(module, filled)):
        return None
    if any(name_error(module, n, v) for n, v in filled.items()):
        return None
    return filled


def _tie_group_shapes(example: Example) -> tuple[bool, bool] | None:
    """(some group is partly given, some fully given group conflicts), or None."""
    call = example.call
    given = merge_inputs(call.tensors)
    if not call.tie_weights or isinstance(given, ExpectedError):
        return None
    groups = {frozenset(g) for g in tie_groups(example.module).values()}
    partial = any(len(g) >= 3 and 2 <= len(g & set(given)) < len(g) for g in groups)
    conflict = any(g <= set(given) and len({id(given[n]) for n in g}) > 1 for g in groups)
    return partial, conflict


def partial_tie_group_key_error(example: Example) -> bool:
    """``tie_weights=True`` and a tie group of 3+ names has 2+ but not all names given.

    torch's ``_untie_named_tensors_map`` then reads a name that was not given: KeyError.
    Excludes the case below, where torch may report a conflict first.
    """
    shapes = _tie_group_shapes(example)
    return shapes is not None and shapes[0] and not shapes[1]


def partial_ties_beside_conflict(example: Example) -> bool:
    """As ``partial_tie_group_key_error``, and a fully given tie group also conflicts.

    torch checks the groups in the iteration order of a set of names, so it raises either
    the KeyError or the (correct) ValueError for the conflicting group.
    """
    shapes = _tie_group_shapes(example)
    return shapes is not None and shapes[0] and shapes[1]


_MISSING = object()


def _torch_swap_order(example: Example) -> list[tuple[str, Any]] | None:
    """The (name, value) pairs torch swaps in, in its order; None if it raises first.

    torch untie-expands (caller's keys first, then the other aliases), checks strict keys,
    then swaps name by name and stops at the first name it cannot resolve.
    """
    call, module = example.call, example.module
    given = merge_inputs(call.tensors)
    if isinstance(given, ExpectedError):
        return None
    shapes = _tie_group_shapes(example)
    if shapes is not None and shapes[0]:
        return None  # the partial-tie KeyError comes first
    filled = expand(module, given, call.tie_weights) if call.tie_weights else dict(given)
    if isinstance(filled, ExpectedError) or (call.strict and strict_error(module, filled)):
        return None
    order = []
    for name, value in filled.items():
        if name_error(module, name, value):
            break
        order.append((name, value))
    return order


def swaps_one_slot_twice(example: Example) -> bool:
    """torch leaves some slot holding another object than before the call
    (``_left_in_slots``)."""
    return any(left is not original for original, left in _left_in_slots(example))


def _left_in_slots(example: Example) -> list[tuple[Any, Any]]:
    """(original, what torch leaves) for each slot the call swaps.

    Modelled on torch's own steps: it records each slot's content as it swaps name by
    name, then puts the records back in the same order (after forward, or at once when a
    later name fails). A slot reached by two names (a shared submodule) gets the first
    name's value back last unless that value is the slot's own tensor.
    """
    order = _torch_swap_order(example)
    if not order:
        return []
    module = example.module
    slots = {n: slot_of(module, n) for n, _ in order}
    original = {slots[n]: _current(module, n) for n, _ in order}
    content = dict(original)
    records = []
    for name, value in order:
        records.append((slots[name], content[slots[name]]))
        content[slots[name]] = value
    for slot, old in records:
        content[slot] = old
    return [(original[slot], content[slot]) for slot in original]


def forms_swap_one_slot_twice(example: Example) -> bool:
    """FC-INPUT-FORMS runs each form on a fresh build with fresh clones of the given tensors
    (no given value is a slot's own tensor): where the call returns, torch leaves a clone in a
    parameter slot (``_left_in_slots``) whose kind differs from the original's as
    ``INV-KINDS`` reads it: not a ``Parameter``, another class, fewer instance attributes or
    another ``requires_grad``."""
    call = dataclasses.replace(example.call, tensors=cloned_inputs(example.call.tensors))
    left = _left_in_slots(dataclasses.replace(example, call=call))
    changed = any(isinstance(original, nn.Parameter) and _kind_changed(original, value)
                  for original, value in left if value is not original)
    return changed and _returns(example)


def _returns(example: Example) -> bool:
    """The call returns (``INV-KINDS`` judges a call that returned): torch fills the names the
    spec does, and forward on the spec's loaded copy does not raise."""
    filled = _filled_for_forward(example)
    return filled is not None and copy_outcome(example.module, filled, example.call).error is None


def _filled_for_forward(example: Example) -> dict[str, Any] | None:
    """``_filled``, or None where the spec's loaded copy cannot run forward (nothing filled,
    or a lazy module's uninitialized tensor given)."""
    filled = _filled(example)
    if filled is None or any(is_uninitialized(v) for v in filled.values()):
        return None
    return filled


def _kind_changed(original: nn.Parameter, value: Any) -> bool:
    if isinstance(original, UninitializedTensorMixin):
        return False  # INV-KINDS leaves a lazy parameter's kind to its first forward
    return (type(value) is not type(original)
            or not set(vars(original)) <= set(getattr(value, "__dict__", {}))
            or value.requires_grad != original.requires_grad)


def _current(module: nn.Module, name: str) -> Any:
    owner, key = owner_of(module, name)
    for table in (owner._parameters, owner._buffers):
        if key in table:
            return table[key]
    return getattr(owner, key, _MISSING)


def tuple_rebind_lost(example: Example) -> bool:
    """A tuple of dicts gives a buffer that forward rebinds: torch merges the dicts into a
    new one and writes the rebound tensor back there, so the caller never sees it.

    Whether forward rebinds a given buffer is read off the spec's model of the call: a
    fresh copy of the module with the given tensors loaded, run once.
    """
    call = example.call
    if isinstance(call.tensors, dict) or partial_tie_group_key_error(example):
        return False
    given = merge_inputs(call.tensors)
    filled = expected_outcome(example.module, call.tensors, tie_weights=call.tie_weights,
                              strict=call.strict)
    if isinstance(given, ExpectedError) or isinstance(filled, ExpectedError):
        return False
    return bool(_rebound_by_forward(example, given, filled))


def _rebound_by_forward(example: Example, given: dict[str, Any], filled: dict[str, Any]) -> set[str]:
    """Given names whose slot forward rebinds, read off a fresh copy of the module with the
    given tensors loaded, run once (the spec's model of the call)."""
    if any(is_uninitialized(v) for v in filled.values()):
        return set()
    call = example.call
    copy, kwargs = loaded_copy(example.module, filled, call)
    loaded = {n: owner_of(copy, n) for n, v in given.items() if isinstance(v, Tensor)}
    before = {n: getattr(o, k, None) for n, (o, k) in loaded.items()}
    attempt(lambda: copy(*[clone_value(a) for a in call.args], **kwargs))
    return {n for n, (o, k) in loaded.items() if getattr(o, k, None) is not before[n]}


def rnn_ignores_a_none_weight(example: Example) -> bool:
    """The call gives ``None`` to an RNN's flat weight and no flat weight of that RNN reads as
    changed: ``RNNBase._weights_have_changed`` skips a ``None``, so forward keeps its old
    ``_flat_weights`` and runs with the weight the call took out, where the loaded copy (which
    holds ``None``) cannot run. The weights it compares with are the module's own: anything
    that reads the RNN's state before the call (a forward, a ``deepcopy``: ``__getstate__``)
    brings its references up to date."""
    filled = _filled(example)
    return bool(filled) and bool(_ignored_none_weights(example.module, filled))


def _ignored_none_weights(module: nn.Module, filled: dict[str, Any]) -> set[str]:
    """The names of ``filled`` that give ``None`` to a flat weight of an RNN none of whose
    flat weights ``filled`` changes otherwise (``rnn_ignores_a_none_weight``)."""
    ignored: set[str] = set()
    for path, rnn in module.named_modules(remove_duplicate=False):
        if not isinstance(rnn, nn.RNNBase):
            continue
        names = [(f"{path}.{n}" if path else n, n) for n in rnn._flat_weights_names]
        given = {key: filled[key] for key, _ in names if key in filled}
        changed = any(given[key] is not None and given[key] is not getattr(rnn, n, None)
                      for key, n in names if key in given)
        if not changed:
            ignored |= {key for key, value in given.items() if value is None}
    return ignored


def rnn_none_weight_hides_forward_error(example: Example) -> bool:
    """``rnn_ignores_a_none_weight``, and forward as torch runs it raises another error than
    the loaded copy does: torch's RNN runs on the weight the call took out, so the error of a
    later layer (or none) comes out where the spec's module raises ``TypeError`` at the RNN.

    torch's forward is modelled by a loaded copy without the ignored ``None`` values."""
    filled = _filled(example)
    ignored = _ignored_none_weights(example.module, filled) if filled else set()
    if not ignored:
        return False
    kept = {n: v for n, v in filled.items() if n not in ignored}
    torch_error = copy_outcome(example.module, kept, example.call).error
    spec_error = copy_outcome(example.module, filled, example.call).error
    return torch_error is not None and type(torch_error) is not type(spec_error)


def gives_a_lazy_tensor(example: Example) -> bool:
    """The call gives a value (``None`` included) to an uninitialized tensor of a lazy module
    not yet initialized (``oracle.lazy_value_error``), and passes torch's own checks
    (``_filled``): torch swaps the value in, and in forward the module's initialize pre-hook
    runs around it. The hook materializes the module's other uninitialized tensors in place,
    in its own order, and raises ``AttributeError`` at a given one (no ``materialize``); where
    it meets none (``None`` for a tensor it skips, or every one given) it finishes: the module
    takes its final class and drops its lazy hooks, and the restore then puts the uninitialized
    tensor back into it (its ``state_dict`` and forward raise ``ValueError`` after)."""
    filled = _filled(example)
    return bool(filled) and any(lazy_value_error(example.module, n, v) for n, v in filled.items())


def slot_conflict_ignored(example: Example) -> bool:
    """``tie_weights=False`` and two names of one shared slot carry different objects."""
    call = example.call
    given = merge_inputs(call.tensors)
    if call.tie_weights or isinstance(given, ExpectedError):
        return False
    return slot_conflict(example.module, given) is not None


def forward_writes_beside_a_conflict(example: Example) -> bool:
    """torch runs a call whose names of one shared slot carry different objects
    (``slot_conflict_ignored``) where the spec refuses it, and forward writes a slot the call
    does not fill (rebinds it, or changes it in place): that write stays.

    Read off the spec's model of torch's call: a fresh copy with torch's filled tensors loaded
    (the last name of a conflict wins), run once.
    """
    filled = _filled_for_forward(example)
    if filled is None or not slot_conflict_ignored(example):
        return False
    call = example.call
    copy, kwargs = loaded_copy(example.module, filled, call)
    reached = {slot_of(copy, n) for n in filled}
    unfilled = {n: (t, t.detach().clone()) for n, t in named_tensors(copy).items()
                if slot_of(copy, n) not in reached}
    attempt(lambda: copy(*[clone_value(a) for a in call.args], **kwargs))
    now = named_tensors(copy)
    return any(now.get(n) is not t or not same_values(t, value)
               for n, (t, value) in unfilled.items())


def shared_slot_write_back_wrong(example: Example) -> bool:
    """Two caller keys reach one shared buffer slot, and the second carries a value that is
    not the slot's own, or the slot's own that forward rebinds: torch's restore returns the
    original for the second key and writes it into the caller's dict, so the caller loses its
    tensor or the rebound one (see SHARED_SLOT)."""
    filled = _filled(example)
    if filled is None or not isinstance(example.call.tensors, dict):
        return False  # a tuple of dicts: torch writes back into its merged copy instead
    shapes = _tie_group_shapes(example)
    if shapes is not None and shapes[0]:
        return False  # torch raises the partial-tie KeyError before swapping anything
    given = merge_inputs(example.call.tensors)
    module = example.module
    buffers = {n for n, _ in module.named_buffers(remove_duplicate=False)}
    registered = named_tensors(module)
    keys_by_slot: dict[Any, list[str]] = {}
    for name in given:
        keys_by_slot.setdefault(slot_of(module, name), []).append(name)
    second = [keys[1] for keys in keys_by_slot.values()
              if len(keys) > 1 and keys[1] in buffers and isinstance(given[keys[1]], Tensor)]
    if any(given[key] is not registered.get(key) for key in second):
        return True
    return bool(second) and bool(set(second) & _rebound_by_forward(example, given, filled))


def _given_parametrized_attribute(example: Example) -> nn.Module | None:
    """The ``ParametrizationList`` whose attribute the call names directly (``weight`` of a
    parametrized module), or None."""
    (name,) = example.call.merged() or {"": None}
    prefix, _, key = name.rpartition(".")
    try:
        owner = example.module.get_submodule(prefix) if prefix else example.module
    except AttributeError:
        return None
    if not nn.utils.parametrize.is_parametrized(owner, key):
        return None
    return owner.parametrizations[key]


def _has_right_inverse(plist: nn.Module) -> bool:
    return all(hasattr(type(p), "right_inverse") for p in plist)


def parametrized_name_without_right_inverse(example: Example) -> bool:
    plist = _given_parametrized_attribute(example)
    return plist is not None and not _has_right_inverse(plist)


def parametrized_name_with_right_inverse(example: Example) -> bool:
    plist = _given_parametrized_attribute(example)
    return (plist is not None and _has_right_inverse(plist)
            and not parametrized_name_swap_refused(example))


def parametrized_name_swap_refused(example: Example) -> bool:
    """The call names a weight-normed or spectral-normed attribute directly while its originals
    take ``parametrize._maybe_set``'s swap path (a traceable wrapper subclass such as
    ``TwoTensor``, or the swap flag): ``swap_tensors`` refuses them, because the parametrized
    value ``functional_call`` read just before (to restore it later) was computed with grad
    enabled and its autograd graph saved the originals. Orthogonal and custom parametrizations
    save no original; frozen originals are saved by no graph."""
    plist = _given_parametrized_attribute(example)
    if plist is None or not _has_right_inverse(plist):
        return False
    originals = list(plist._parameters.values())
    swapped = (torch.__future__.get_swap_module_params_on_conversion()
               or any(is_traceable_wrapper_subclass(t) for t in originals))
    return (swapped and torch.is_grad_enabled()
            and type(plist[0]).__name__ in ("_WeightNorm", "_SpectralNorm")
            and any(t.requires_grad for t in originals))


def spectral_norm_iterates_before_refused_swap(example: Example) -> bool:
    """The refused swap of ``parametrized_name_swap_refused`` comes after ``functional_call``
    read the attribute, and where the parametrization is a ``spectral_norm`` in training mode
    on a weight of two or more dimensions that read ran a power iteration, which updates its
    ``_u`` and ``_v`` buffers in place: they keep the new values after the call raises (unless
    the iteration has converged to the values they hold, which a trial run on a copy tells)."""
    plist = _given_parametrized_attribute(example)
    return (parametrized_name_swap_refused(example)
            and type(plist[0]).__name__ == "_SpectralNorm" and plist[0].training
            and plist.original.dim() > 1 and _power_iteration_moves(plist[0], plist.original))


def _power_iteration_moves(norm: nn.Module, original: Tensor) -> bool:
    """Whether one read of a spectral norm of ``original`` changes the norm's ``_u`` or
    ``_v``, tried on a copy of the norm."""
    trial = copy.deepcopy(norm)
    with torch.no_grad():
        trial(original.detach())
    return not all(torch.equal(getattr(trial, name), getattr(norm, name)) for name in ("_u", "_v"))


def restore_sets_wrapper_into_plain(example: Example) -> bool:
    """The call names a parametrized attribute directly, with a plain value, while some
    original is a traceable wrapper subclass (``TwoTensor``) and the swap flag is off: the
    assignment swaps the value's ``right_inverse`` into the original (``parametrize._maybe_set``
    swaps where the destination is a wrapper), so the original is a plain tensor when the
    restore assigns the old, wrapper-valued ``right_inverse`` through ``set_``, which leaves it
    without storage; reading the module then raises or crashes the interpreter. Where the first
    swap is refused (``parametrized_name_swap_refused``) nothing is swapped."""
    plist = _given_parametrized_attribute(example)
    if plist is None or not _has_right_inverse(plist):
        return False
    (value,) = example.call.merged().values()
    originals = list(plist._parameters.values()) + list(plist._buffers.values())
    return (not torch.__future__.get_swap_module_params_on_conversion()
            and not is_traceable_wrapper_subclass(value)
            and any(is_traceable_wrapper_subclass(t) for t in originals)
            and not parametrized_name_swap_refused(example))


def weight_norm_restore_rounds(example: Example) -> bool:
    """The call names a weight-normed attribute directly (and torch does not refuse it), and
    the restore's ``right_inverse`` of the weight read before the call, ``(norm(w), w)``, gives
    other values than the originals hold: torch writes those back."""
    plist = _given_parametrized_attribute(example)
    if (plist is None or type(plist[0]).__name__ != "_WeightNorm"
            or parametrized_name_swap_refused(example)
            or restore_sets_wrapper_into_plain(example)):
        return False
    originals = [plist.original0, plist.original1]
    if not all(holds_values(t) for t in originals):
        return False
    with torch.no_grad():
        restored = plist[0].right_inverse(plist())
    return any(not torch.equal(new, old) for new, old in zip(restored, originals, strict=True))


def reparametrizing_name_given(example: Example) -> bool:
    """The call names a spectral-normed or orthogonal attribute directly: torch's restore goes
    through right_inverse, which stores other values (spectral norm: seen only where the
    original holds values, not on ``meta``) or rebinds the parametrization's own ``base`` buffer
    (orthogonal)."""
    plist = _given_parametrized_attribute(example)
    if plist is None:
        return False
    kind = type(plist[0]).__name__
    if parametrized_name_swap_refused(example):
        return False
    return kind == "_Orthogonal" or (kind == "_SpectralNorm" and holds_values(plist.original))


def swap_refused_by_graph_grads(example: Example) -> bool:
    """A conversion step of a sequence where a graph can hold a parameter that takes the swap
    path: ``swap_tensors`` refuses it, and torch has committed the tensors before it. The graph
    is a grad's (an earlier ``backward(create_graph=True)``: some parameter's grad carries one),
    an old-style reparametrization's computed attribute's (``old_norm_refusals``), or a
    forward's output an earlier step holds (``graph_held``)."""
    if getattr(example, "step", "") != "convert":
        return False
    if old_norm_refusals(example):
        return True
    params = _params(example)
    held = getattr(example, "graph_held", False)
    if not held and not any(p.grad is not None and p.grad.grad_fn is not None for p in params):
        return False
    return any(torch_path(example, p, applied) == "swap" for p, applied in _results(example, params))


def swaps_a_grad(example: Example) -> bool:
    """A conversion step of a sequence where a parameter with a grad takes the swap path."""
    if getattr(example, "step", "") != "convert":
        return False
    params = [p for p in _params(example) if p.grad is not None]
    return any(torch_path(example, p, applied) == "swap" for p, applied in _results(example, params))


def has_alias_groups(example: Example) -> bool:
    return bool(alias_groups(example.module))
