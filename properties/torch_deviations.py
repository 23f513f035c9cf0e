"""Deviations of the ``torch`` and ``torch-stateless`` targets from the spec, as data.

Each entry was observed with the suite, reduced to a minimal repro (kept in its
``reason``), and given a predicate that describes exactly the examples where torch
shows it. A declaration that stops being observed fails the run as stale: that is how a
fix in a new torch release shows up.

The predicates model torch's own decisions from the module before the call: which
path ``_apply`` takes for each parameter, how often its traversal visits a module,
which names ``functional_call`` swaps into one slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.common import attempt, clone_value, is_uninitialized, loaded_copy
from swapspec.properties.deviations import CRASH, Deviation
from swapspec.properties.examples import Example, alias_groups, holds_values, named_tensors
from swapspec.properties.oracle import (
    ExpectedError,
    expand,
    expected_outcome,
    merge_inputs,
    name_error,
    owner_of,
    slot_conflict,
    slot_of,
    strict_error,
    tie_groups,
)
from swapspec.strategies import tree_info

# ---- facts about torch's _apply ---------------------------------------------------------


def torch_visits(module: nn.Module) -> dict[int, int]:
    """How many times ``module._apply`` runs on each submodule.

    ``_apply`` recurses through ``children()``, which drops repeats within one parent
    only, so a submodule shared by two parents is converted twice.
    """
    visits: dict[int, int] = {}

    def walk(m: nn.Module) -> None:
        visits[id(m)] = visits.get(id(m), 0) + 1
        for child in m.children():
            walk(child)

    walk(module)
    return visits


def _scope(example: Example) -> list[nn.Module]:
    module = example.module
    if not example.recurse:
        return [module]
    return list({id(m): m for m in module.modules()}.values())


def _params(example: Example) -> list[nn.Parameter]:
    found = [p for m in _scope(example) for p in m._parameters.values() if p is not None]
    return list({id(p): p for p in found}.values())


def _buffers(example: Example) -> list[Tensor]:
    found = [b for m in _scope(example) for b in m._buffers.values() if b is not None]
    return list({id(b): b for b in found}.values())


def _results(example: Example, tensors: list[Tensor]) -> list[tuple[Tensor, Any]]:
    """(tensor, what a fresh ``fn`` returns for it), up to the first tensor ``fn`` refuses."""
    fn = example.conversion.make_fn()
    results = []
    with torch.no_grad():
        for t in tensors:
            try:
                results.append((t, fn(t)))
            except Exception:
                break
    return results


def torch_path(example: Example, param: Tensor, applied: Any) -> str:
    """The path torch's ``_apply`` takes for one parameter."""
    if example.flags.swap or is_traceable_wrapper_subclass(applied):
        return "swap"
    if torch._has_compatible_shallow_copy_type(param, applied) and not example.flags.overwrite:
        return "set_data"
    return "overwrite"


def _is_subclassed(p: Tensor) -> bool:
    return type(p) is not nn.Parameter or bool(p.__dict__)


def swap_refuses_subclass(example: Example) -> bool:
    """Swap or overwrite path on a ``Parameter`` subclass whose ``fn`` returns it unchanged.

    Both paths wrap the result as ``Parameter(fn(p))``, which refuses an instance of a
    ``Parameter`` subclass, so ``_apply`` raises.
    """
    return any(issubclass(type(p), nn.Parameter) and type(p) is not nn.Parameter and applied is p
               and torch_path(example, p, applied) != "set_data"
               for p, applied in _results(example, _params(example)))


def old_norm_refusals(example: Example) -> list[Tensor]:
    """The tensors ``swap_tensors`` refuses on the swap path because an old hook-based
    ``weight_norm`` or ``spectral_norm`` holds them: the sources of its computed ``weight``
    attribute (``weight_g``/``weight_v``, ``weight_orig``) while that attribute's autograd graph
    still holds them. ``swap_tensors`` refuses a leaf whose TensorImpl has more uses than the
    tensor and its ``AccumulateGrad`` node (``Tensor._use_count() > 2``); a ``backward`` without
    ``create_graph`` frees the graph's saved tensors, and a spectral-norm weight computed with
    no forward yet has no graph, and then the swap goes through."""
    refused = []
    for m in _scope(example):
        hooks = [h for h in m._forward_pre_hooks.values() if isinstance(h, WeightNorm | SpectralNorm)]
        for hook in hooks:
            for suffix in ("_g", "_v", "_orig"):
                p = m._parameters.get(hook.name + suffix)
                if p is not None and p._use_count() > 2 and any(
                        torch_path(example, q, applied) == "swap"
                        for q, applied in _results(example, [p])):
                    refused.append(p)
    return refused


def old_weight_norm_swapped(example: Example) -> bool:
    """``_apply`` raises: ``swap_tensors`` refuses a tensor an old-style norm holds
    (``old_norm_refusals``)."""
    return bool(old_norm_refusals(example))


def graph_grad_not_leaf(example: Example) -> bool:
    """A grad that carries an autograd graph (``backward(create_graph=True)``) on a parameter
    whose grad torch replaces (not swapped, not ``.data =``): torch asserts
    ``param_grad.is_leaf``."""
    for p, applied in _results(example, _params(example)):
        grad = p.grad
        if grad is None or grad.is_leaf or torch_path(example, p, applied) == "swap":
            continue
        with torch.no_grad():
            grad_applied = example.conversion.make_fn()(grad)
        if example.flags.overwrite or not torch._has_compatible_shallow_copy_type(grad, grad_applied):
            return True
    return False


def rnn_weight_swapped_elsewhere(example: Example) -> bool:
    """An RNN's flat weight is tied into a slot of another module, on the swap path: only the
    RNN's own ``_apply`` drops its weak references to the flat weights (and ``_init_flat_weights``
    makes them again), so where torch's traversal meets the weight in the other module,
    ``swap_tensors`` refuses it."""
    if not example.recurse:
        return False
    rnn_params = {id(p): m for m in _scope(example) if isinstance(m, nn.RNNBase)
                  for p in m._parameters.values() if p is not None}
    elsewhere = [p for m in _scope(example) for p in m._parameters.values()
                 if p is not None and id(p) in rnn_params and m is not rnn_params[id(p)]]
    return any(torch_path(example, p, applied) == "swap" for p, applied in _results(example, elsewhere))


def shared_grad_swapped(example: Example) -> bool:
    """Two distinct parameters hold one grad object (what the overwrite path leaves of a tied
    parameter with a grad), and one of them takes the swap path: ``swap_tensors`` refuses a
    grad that another parameter still holds."""
    holders: dict[int, int] = {}
    for p in _params(example):
        if p.grad is not None:
            holders[id(p.grad)] = holders.get(id(p.grad), 0) + 1
    shared = [p for p in _params(example) if p.grad is not None and holders[id(p.grad)] > 1]
    return any(torch_path(example, p, applied) == "swap" for p, applied in _results(example, shared))


def torch_apply_raises_on_state(example: Example) -> bool:
    """torch's ``_apply`` raises because of what the module holds (old-style weight norm graphs,
    graph-carrying grads, tied RNN weights, a grad two parameters share), whatever the
    parameter classes."""
    return (old_weight_norm_swapped(example) or graph_grad_not_leaf(example)
            or rnn_weight_swapped_elsewhere(example) or shared_grad_swapped(example))


def torch_apply_raises(example: Example) -> bool:
    """torch's ``_apply`` raises on this example (then no other deviation shows)."""
    return swap_refuses_subclass(example) or torch_apply_raises_on_state(example)


def _certain_raise(example: Example) -> bool:
    """The raises that always happen (old-style norms raise only sometimes)."""
    return (swap_refuses_subclass(example) or graph_grad_not_leaf(example)
            or rnn_weight_swapped_elsewhere(example) or shared_grad_swapped(example))


def _earlier_leaves_set_data(example: Example) -> bool:
    """Some trainable parameter left the set_data path in an earlier conversion with no flag
    set: a TensorImpl change, as ``to_empty(device='cpu')`` makes on a ``meta``-world tree
    (``_has_compatible_shallow_copy_type(meta, cpu)`` is false: overwrite path). The example's
    module has already been through those conversions, so they are replayed on a fresh build
    of the tree (``tree_info``), each parameter holding the previous result, as set_data leaves it."""
    if not example.earlier:
        return False
    try:
        fresh = tree_info(example.module).build()
    except KeyError:  # not a built tree: nothing to replay
        return False
    tensors = list({id(p): p for p in fresh.parameters()
                    if p.requires_grad and not is_uninitialized(p)}.values())
    for conversion in example.earlier:
        fn, results = conversion.make_fn(), []
        with torch.no_grad():
            for t in tensors:
                try:
                    applied = fn(t)
                except Exception:  # the property assumes the earlier conversions ran
                    return False
                if torch_path(example, t, applied) != "set_data":
                    return True
                results.append(applied)
        tensors = results
    return False


def _loses_tensor_hooks(example: Example) -> bool:
    """Some parameter takes the overwrite path (a new object without the hooks) or the swap
    path (the hooks stay registered on the swapped-out TensorImpl), in the conversion or in an
    earlier one (a flag decides the path of those, or a TensorImpl change:
    ``_earlier_leaves_set_data``)."""
    if _certain_raise(example):
        return False
    trainable = [p for p in _params(example) if p.requires_grad]
    if example.earlier and trainable and (example.flags.swap or example.flags.overwrite):
        return True
    if trainable and _earlier_leaves_set_data(example):
        return True
    return any(torch_path(example, p, applied) != "set_data"
               for p, applied in _results(example, trainable))


def _swap_ignores_new_hooks(example: Example) -> bool:
    """Some parameter takes the swap path, in the conversion or an earlier one (the swap flag
    decides those): ``register_hook`` after the swap adds to the swapped-in hook table but never
    registers it on the new TensorImpl."""
    if _certain_raise(example):
        return False
    trainable = [p for p in _params(example) if p.requires_grad]
    if example.earlier and trainable and example.flags.swap:
        return True
    return any(torch_path(example, p, applied) == "swap"
               for p, applied in _results(example, trainable))


def loses_tensor_hooks(example: Example) -> bool:
    return not old_weight_norm_swapped(example) and _loses_tensor_hooks(example)


def swap_ignores_new_hooks(example: Example) -> bool:
    return not old_weight_norm_swapped(example) and _swap_ignores_new_hooks(example)


def loses_tensor_hooks_unless_norm_raises(example: Example) -> bool:
    """As ``loses_tensor_hooks`` where an old-style norm may make ``_apply`` raise first."""
    return old_weight_norm_swapped(example) and _loses_tensor_hooks(example)


def swap_ignores_new_hooks_unless_norm_raises(example: Example) -> bool:
    return old_weight_norm_swapped(example) and _swap_ignores_new_hooks(example)


def drops_parameter_class(example: Example) -> bool:
    """A ``Parameter`` subclass or attribute-carrying parameter takes swap or overwrite
    with a new tensor from ``fn``: torch rebuilds a plain ``Parameter`` (or, for a tensor
    subclass result such as ``TwoTensor``, that class) without the instance attributes."""
    return not torch_apply_raises(example) and any(
        _is_subclassed(p) and applied is not p and torch_path(example, p, applied) != "set_data"
        and (_keeps_own_attributes(p, applied) or not is_traceable_wrapper_subclass(applied))
        for p, applied in _results(example, _params(example)))


def _keeps_own_attributes(p: Tensor, applied: Any) -> bool:
    """Whether ``p`` has instance attributes the spec keeps: ones ``applied`` does not set
    (``_is_param``, the mark ``Parameter()`` puts on a tensor subclass, is the parameter itself)."""
    return any(a not in getattr(applied, "__dict__", {}) for a in p.__dict__ if a != "_is_param")


def _distinct_slots(example: Example, registry: str) -> dict[int, int]:
    """How many distinct (module, key) slots hold each tensor in ``registry``."""
    counts: dict[int, int] = {}
    for m in _scope(example):
        for t in getattr(m, registry).values():
            if t is not None:
                counts[id(t)] = counts.get(id(t), 0) + 1
    return counts


def overwrite_splits_tied_parameters(example: Example) -> bool:
    """A parameter held by two slots takes the overwrite path: each slot gets its own copy."""
    held = _distinct_slots(example, "_parameters")
    return not torch_apply_raises(example) and any(
        held[id(p)] > 1 and torch_path(example, p, applied) == "overwrite"
        for p, applied in _results(example, _params(example)))


def rebinding_splits_tied_buffers(example: Example) -> bool:
    """A buffer held by two slots, with ``fn`` returning a new tensor: one result per slot."""
    held = _distinct_slots(example, "_buffers")
    return not torch_apply_raises(example) and any(
        held[id(b)] > 1 and applied is not b for b, applied in _results(example, _buffers(example)))


def _dense_leaves(t: Tensor) -> list[Tensor]:
    """``t``, or the plain tensors a wrapper subclass (``TwoTensor``) holds, nested ones too."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [leaf for n in names for leaf in _dense_leaves(getattr(t, n))]
    return [t]


def _new_object_sharing_storage(t: Tensor, applied: Any) -> bool:
    """``applied`` is a new object that holds (part of) ``t``'s memory, as
    ``TwoTensor(t.detach(), t.detach().clone())`` does through its ``a``."""
    if applied is t or not isinstance(applied, Tensor):
        return False
    try:
        mine = {x.untyped_storage().data_ptr() for x in _dense_leaves(t)
                if x.device.type != "meta"} - {0}
        return any(x.untyped_storage().data_ptr() in mine for x in _dense_leaves(applied)
                   if x.device.type != "meta")
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return False


def split_tied_buffer_shares_storage(example: Example) -> bool:
    """A buffer held by two slots, with ``fn`` returning a new object that shares (part of) its
    memory: torch's one result per slot (``rebinding_splits_tied_buffers``) are two objects that
    still alias each other in part, a half-tie that a fresh build (one clone per object) lacks.
    It shows in forward only where forward updates one of them in place (BatchNorm's running
    stats in training, a GenericLeaf's ``steps``) before the other is read."""
    held = _distinct_slots(example, "_buffers")
    return not torch_apply_raises(example) and any(
        held[id(b)] > 1 and _new_object_sharing_storage(b, applied)
        for b, applied in _results(example, _buffers(example)))


def _slot_counts(example: Example, registry: str) -> dict[int, int]:
    """How many times torch's traversal meets each tensor in ``registry`` slots."""
    visits = torch_visits(example.module)
    counts: dict[int, int] = {}
    for m in _scope(example):
        times = visits[id(m)] if example.recurse else 1
        for t in getattr(m, registry).values():
            if t is not None:
                counts[id(t)] = counts.get(id(t), 0) + times
    return counts


def converts_some_tensor_twice(example: Example) -> bool:
    """Some tensor is met twice by torch's traversal (a tie, or a module visited twice)."""
    if torch_apply_raises(example):
        return False
    counts = {**_slot_counts(example, "_parameters"), **_slot_counts(example, "_buffers")}
    return any(n > 1 for n in counts.values())


def _converts_result_again(example: Example, tensors: list[Tensor]) -> bool:
    """Some tensor's second conversion is applied to its first result.

    That happens on the set_data and swap paths (the object itself changed) whenever the
    tensor is met twice, and on every path when its module is visited twice.
    """
    if torch_apply_raises(example):
        return False
    met = {**_slot_counts(example, "_parameters"), **_slot_counts(example, "_buffers")}
    visits = torch_visits(example.module)
    twice_visited = {id(t) for m in _scope(example) if visits[id(m)] > 1
                     for t in [*m._parameters.values(), *m._buffers.values()] if t is not None}
    params = {id(p) for p in _params(example)}
    for t, applied in _results(example, tensors):
        in_place = id(t) in params and torch_path(example, t, applied) != "overwrite"
        if (in_place and met.get(id(t), 0) > 1) or id(t) in twice_visited:
            return True
    return False


def non_idempotent_twice(example: Example) -> bool:
    """``add(1)`` applied twice to some tensor: its value ends ``+2``."""
    if example.conversion.name != "add(1)":
        return False
    return _converts_result_again(example, [*_params(example), *_buffers(example)])


def non_idempotent_twice_on_grads(example: Example) -> bool:
    """``add(1)`` applied twice to a parameter that has a grad: the grad ends ``+2``."""
    if example.conversion.name != "add(1)":
        return False
    with_grad = [p for p in _params(example) if p.grad is not None]
    return _converts_result_again(example, with_grad)


def torch_call_order(example: Example) -> list[Tensor]:
    """The tensors torch's ``_apply`` passes to ``fn``, in order, repeats included."""
    order: list[Tensor] = []

    def walk(m: nn.Module) -> None:
        if example.recurse or m is example.module:
            children = list(m.children()) if example.recurse else []
            for child in children:
                walk(child)
            for p in m._parameters.values():
                if p is not None:
                    order.extend([p] + ([p.grad] if p.grad is not None else []))
            order.extend(b for b in m._buffers.values() if b is not None)

    walk(example.module)
    return order


def commits_before_raising(example: Example) -> bool:
    """torch's first ``fn`` call succeeds before the raising one, so it committed something.

    ``raise_on(k)`` raises on call k, and ``t + 1`` raises at once on an uninitialized
    parameter; ``_apply`` commits each tensor right after its call, and raises its own error
    right after the call on a tensor ``swap_tensors`` refuses (``old_norm_refusals``).
    """
    k = example.conversion.raises_on
    order = torch_call_order(example)
    refused = {id(t) for t in old_norm_refusals(example)}
    first_failure = next((i for i, t in enumerate(order)
                          if is_uninitialized(t) or id(t) in refused), len(order))
    committed = order[:min(k - 1, first_failure)]
    return any(_commit_shows(example, t, applied) for t, applied in _results(example, committed))


def _commit_shows(example: Example, t: Tensor, applied: Any) -> bool:
    """Whether committing ``fn(t)`` is visible: always for a tensor with values; for a
    ``meta`` one only as a new object in its slot or new metadata."""
    if holds_values(t):
        return True
    replaced = not isinstance(t, nn.Parameter) or torch_path(example, t, applied) == "overwrite"
    return replaced or (t.dtype, t.shape, t.device) != (applied.dtype, applied.shape, applied.device)


def converts_before_refused_swap(example: Example) -> bool:
    """torch converts another tensor before the first swap it cannot make (a refused grad
    comes right after its own parameter's swap), and ``_apply`` keeps what it converted.

    That first refusal is the drawn refused tensor or, when earlier, one an old-style norm
    holds (``old_norm_refusals``): ``weight_g`` comes before ``weight_v``, so with ``weight_v``
    refused torch raises on ``weight_g`` and converts nothing before it."""
    refused = {id(example.refused_tensor())} | {id(t) for t in old_norm_refusals(example)}
    order = torch_call_order(example)
    return next(i for i, t in enumerate(order) if id(t) in refused) > 0


def swaps_twice_back(example: Example) -> bool:
    """A swapped parameter is met two or more times: each swap frees a TensorImpl whose
    address a later swap may reuse, so its ``_cdata`` can end where it started."""
    if torch_apply_raises(example):
        return False
    counts = _slot_counts(example, "_parameters")
    return any(counts[id(p)] >= 2 and torch_path(example, p, applied) == "swap"
               for p, applied in _results(example, _params(example)))


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
    """torch leaves some slot holding another object than before the call.

    Modelled on torch's own steps: it records each slot's content as it swaps name by
    name, then puts the records back in the same order (after forward, or at once when a
    later name fails). A slot reached by two names (a shared submodule) gets the first
    name's value back last unless that value is the slot's own tensor.
    """
    order = _torch_swap_order(example)
    if not order:
        return False
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
    return any(content[slot] is not original[slot] for slot in original)


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


def slot_conflict_ignored(example: Example) -> bool:
    """``tie_weights=False`` and two names of one shared slot carry different objects."""
    call = example.call
    given = merge_inputs(call.tensors)
    if call.tie_weights or isinstance(given, ExpectedError):
        return False
    return slot_conflict(example.module, given) is not None


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
    """A conversion step of a sequence where some parameter takes the swap path while a grad
    carries an autograd graph (an earlier ``backward(create_graph=True)``): that graph can hold
    a parameter, ``swap_tensors`` refuses it, and torch has committed the tensors before it."""
    if getattr(example, "step", "") != "convert":
        return False
    params = _params(example)
    if not any(p.grad is not None and p.grad.grad_fn is not None for p in params):
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


APPLY_IDS = ("APPLY-PATH", "APPLY-NO-SET-DATA-ACROSS-IMPL", "APPLY-VALUES",
             "APPLY-PARAMETER-IDENTITY", "APPLY-GRADS", "APPLY-NONE-SLOTS", "APPLY-TIES",
             "APPLY-FN-ONCE", "APPLY-RECURSE-FALSE", "APPLY-ROUND-TRIP", "APPLY-FORWARD",
             "APPLY-TENSOR-HOOKS", "APPLY-OPTIMIZER")
# The XLA leg's conversions run the same _apply: its raising behaviours show there too.
XLA_APPLY_IDS = ("XLA-DTYPE-PATH", "XLA-MOVE-ALL-FLAGS", "XLA-ROUND-TRIP", "XLA-STATE")

SHARED_SLOT = (
    "functional_call swaps a shared submodule's slot once per name and restores in the same "
    "order, so the last restore puts a given tensor back (or raises KeyError). Repro: "
    "lin = nn.Linear(2, 2); m = nn.Sequential(lin, lin); W = lin.weight; "
    "torch.func.functional_call(m, {'0.weight': torch.zeros(2, 2)}, (torch.ones(1, 2),)); "
    "assert lin.weight is W  # fails")
PARTIAL_TIES = (
    "With tie_weights=True, a tie group of 3+ names with 2+ (not all) given makes "
    "_untie_named_tensors_map read a name that was not given: KeyError. Repro: "
    "m = nn.Module(); m.a = nn.Parameter(torch.ones(1)); m.b = m.a; m.c = m.a; "
    "m.forward = lambda x: x; t = torch.zeros(1); "
    "torch.func.functional_call(m, {'a': t, 'b': t}, (t,))  # KeyError: 'c'")

STATELESS_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "FC-BAD-INPUT", lambda ex: not isinstance(ex.call.tensors, Mapping), "wrong-error",
        "torch.nn.utils.stateless.functional_call does not check its input's form: a "
        "non-mapping fails later with AttributeError. Repro: "
        "torch.nn.utils.stateless.functional_call(nn.Linear(2, 2), 7, (torch.ones(1, 2),)) "
        "# AttributeError: 'int' object has no attribute 'keys'"),
)

HOOKS_LOST = (
    "Hooks registered on a parameter stop firing after a conversion on the overwrite path (a new "
    "Parameter without them) and on the swap path (they stay on the swapped-out TensorImpl).")
HOOKS_AFTER_SWAP = (
    "After a swap, a hook registered on the parameter never fires: register_hook only adds to "
    "the swapped-in Python object's hook table.")

PARAMETRIZED_NAME = (
    "torch.func.functional_call's documentation says a value given under a parametrized "
    "attribute's own name 'will completely disable the parametrization'. torch instead assigns "
    "it through the parametrization's right_inverse and reads the parametrization again, so "
    "forward reads another tensor (orthogonal and spectral_norm even change its values), and "
    "a parametrization without right_inverse raises. Repro: m = nn.Linear(2, 2); "
    "torch.nn.utils.parametrizations.orthogonal(m); seen = {}; "
    "m.register_forward_pre_hook(lambda mod, a: seen.update(w=mod.weight)); "
    "v = torch.ones(2, 2); torch.func.functional_call(m, {'weight': v}, (torch.ones(1, 2),)); "
    "assert seen['w'] is v  # fails")

SEQUENCE_IDS = ("SEQ-STATE", "SEQ-FORWARD", "SEQ-HOOKS", "SEQ-OPTIMIZER")

TORCH_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        SEQUENCE_IDS, swaps_a_grad, "raised", always=False, reason=
        "Found by sequences only, and only sometimes (seen in CI runs of all targets under "
        "pytest -n 2, not when the property runs alone): on the swap path torch refuses to swap "
        "a parameter's grad ('_apply(): Couldn't swap GenericLeaf.p0.grad'): swap_tensors saw "
        "another reference to the grad's TensorImpl left by an earlier step. No minimal repro "
        "yet; torch 2.13. Repro: a sequence repro printed by SEQ-HOOKS on torch-stateless."),
    Deviation(
        SEQUENCE_IDS, swap_refused_by_graph_grads,
        ("value", "grad-value", "grad-lost", "object-changed", "class", "attributes"),
        always=False, reason=
        "Found by sequences (backward(create_graph=True), then a conversion on the swap path): "
        "the grads' graph holds a parameter, swap_tensors refuses it, and _apply has already "
        "committed the tensors it converted before that one, so the module is left half "
        "converted (the reference refuses before changing anything). Whether a parameter is "
        "held depends on the module (parametrizations hold theirs). Seen on torch 2.13. Repro: "
        "m = nn.Sequential(nn.Linear(2, 2), "
        "torch.nn.utils.parametrizations.weight_norm(nn.Linear(2, 2))); "
        "(m(torch.ones(1, 2)) ** 2).sum().backward(create_graph=True); "
        "torch.__future__.set_swap_module_params_on_conversion(True); m.double()  # raises "
        "RuntimeError: Couldn't swap ParametrizationList.original0; "
        "assert m[0].weight.dtype == torch.float32  # fails: float64"),
    Deviation(
        APPLY_IDS + XLA_APPLY_IDS, old_weight_norm_swapped, "raised", always=False, reason=
        "The old hook-based torch.nn.utils.weight_norm (and spectral_norm) keep `weight` as an "
        "attribute computed from weight_g and weight_v (weight_orig), whose autograd graph can "
        "hold them; on the swap path swap_tensors then refuses them and _apply raises "
        "(torch 2.13; a backward without create_graph frees the graph, and then the swap goes "
        "through). Repro: "
        "m = nn.Linear(2, 2); "
        "torch.nn.utils.weight_norm(m); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double()  # RuntimeError: _apply(): Couldn't swap Linear.weight_g"),
    Deviation(
        "APPLY-ATOMIC", old_weight_norm_swapped, "no-error", always=False, reason=
        "Where fn would raise on a later tensor, torch's _apply may first raise its own "
        "RuntimeError: with the old hook-based weight_norm (or spectral_norm) on the swap path, "
        "swap_tensors refuses weight_g/weight_v (see the `raised` declaration), so fn's error "
        "never comes out (torch 2.13). Repro: m = nn.Linear(2, 2); torch.nn.utils.weight_norm(m); "
        "m(torch.ones(1, 2)); n = [0]; "
        "def fn(t):\n n[0] += 1\n if n[0] == 3: raise ValueError\n return t + 1; "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "m._apply(fn)  # RuntimeError: _apply(): Couldn't swap Linear.weight_g"),
    Deviation(
        APPLY_IDS + XLA_APPLY_IDS, shared_grad_swapped, "raised",
        "The overwrite path gives each slot of a tied parameter its own new Parameter but "
        "the same converted grad object; a later conversion on the swap path then refuses that "
        "grad, which the other Parameter still holds, and _apply raises (torch 2.13). Repro: "
        "m = nn.Module(); m.p0 = nn.Parameter(torch.ones(4)); m.p0.grad = torch.ones(4); "
        "m.p1 = m.p0; torch.__future__.set_overwrite_module_params_on_conversion(True); "
        "m.float(); assert m.p0 is not m.p1 and m.p0.grad is m.p1.grad; "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double()  # RuntimeError: _apply(): Couldn't swap Module.p0.grad"),
    Deviation(
        APPLY_IDS, rnn_weight_swapped_elsewhere, "raised",
        "RNNBase._apply drops the RNN's weak references to its flat weights only around its own "
        "conversion; a flat weight tied into another module is swapped there while a weak "
        "reference exists, and swap_tensors refuses it (torch 2.13). Repro: "
        "rnn = nn.RNN(2, 2); o = nn.Module(); o.p0 = rnn.weight_ih_l0; "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "nn.Sequential(o, rnn).double()  # RuntimeError: _apply(): Couldn't swap Module.p0"),
    Deviation(
        APPLY_IDS + XLA_APPLY_IDS, graph_grad_not_leaf, "raised",
        "After backward(create_graph=True) the grads carry a graph; where _apply replaces a grad "
        "(overwrite flag, or a TensorImpl change such as to('meta')) it asserts "
        "`param_grad.is_leaf` and raises halfway. Repro: m = nn.Linear(2, 2); "
        "m(torch.ones(1, 2)).pow(2).sum().backward(create_graph=True); "
        "torch.__future__.set_overwrite_module_params_on_conversion(True); "
        "m.double()  # AssertionError: param_grad must be a leaf tensor"),
    Deviation(
        "APPLY-TENSOR-HOOKS", loses_tensor_hooks, "before-hook-lost",
        "Hooks registered on a parameter (register_hook, register_post_accumulate_grad_hook) "
        "stop firing after a conversion on the overwrite path (a new Parameter without them) "
        "and on the swap path (they stay on the swapped-out TensorImpl) (torch 2.13). Repro: "
        "m = nn.Linear(2, 2); n = []; m.weight.register_hook(lambda g: n.append(1)); "
        "torch.__future__.set_swap_module_params_on_conversion(True); m.double(); "
        "m(torch.ones(1, 2, dtype=torch.double)).sum().backward(); assert n  # fails. "
        "A module built on meta and given storage by to_empty(device='cpu') takes the overwrite "
        "path whatever the flags (meta and CPU TensorImpls are not shallow-copy compatible), so "
        "hooks registered before to_empty are lost too. Repro: "
        "m = nn.Linear(2, 2, device='meta'); n = []; m.weight.register_hook(lambda g: n.append(1)); "
        "m.to_empty(device='cpu'); m(torch.ones(1, 2)).sum().backward(); assert n  # fails"),
    Deviation("APPLY-TENSOR-HOOKS", loses_tensor_hooks_unless_norm_raises, "before-hook-lost",
              always=False, reason="Where an old-style weight or spectral norm may make _apply "
              "raise first (see its declaration): otherwise, as the declaration below. " + HOOKS_LOST),
    Deviation("APPLY-TENSOR-HOOKS", swap_ignores_new_hooks_unless_norm_raises, "after-hook-lost",
              always=False, reason="Where an old-style weight or spectral norm may make _apply "
              "raise first (see its declaration): otherwise, as the declaration below. "
              + HOOKS_AFTER_SWAP),
    Deviation(
        "APPLY-TENSOR-HOOKS", swap_ignores_new_hooks, "after-hook-lost",
        "After a swap, a hook registered on the parameter never fires: the swapped-in Python "
        "object already has a hook table, so register_hook only adds to it and never "
        "registers it on the new TensorImpl (torch 2.13). Repro: m = nn.Linear(2, 2); "
        "m.weight.register_hook(lambda g: g); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double(); n = []; m.weight.register_hook(lambda g: n.append(1)); "
        "m(torch.ones(1, 2, dtype=torch.double)).sum().backward(); assert n  # fails"),
    Deviation("FC-PARAMETRIZED", parametrized_name_without_right_inverse, "raised",
              PARAMETRIZED_NAME),
    Deviation("FC-PARAMETRIZED", parametrized_name_with_right_inverse, "not-disabled",
              PARAMETRIZED_NAME),
    Deviation(
        "FC-PARAMETRIZED", parametrized_name_swap_refused, "raised",
        "Given a value under a weight-normed or spectral-normed attribute's own name, "
        "functional_call first reads the attribute (to restore it later), computing it with "
        "grad enabled, so its autograd graph saves the originals; it then assigns the value "
        "through right_inverse, and where parametrize._maybe_set takes the swap path (the "
        "originals are a traceable wrapper subclass such as TwoTensor, or the swap "
        "flag is set) swap_tensors refuses the saved originals and the call raises (torch 2.13). "
        "Repro: m = nn.Linear(2, 2); torch.nn.utils.parametrizations.weight_norm(m); "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "torch.func.functional_call(m, {'weight': torch.ones(2, 2)}, (torch.ones(1, 2),))  "
        "# RuntimeError: Expected use_count of t1 to be 1 or 2 with an AccumulateGrad node but "
        "got 3"),
    Deviation(
        "FC-PARAMETRIZED", restore_sets_wrapper_into_plain, CRASH,
        "Given a plain value under a parametrized attribute's own name while its originals are "
        "a traceable wrapper subclass (TwoTensor) and the swap flag is off, functional_call "
        "assigns it through right_inverse and parametrize._maybe_set swaps it into the "
        "original (a wrapper destination takes the swap path), so the original is a plain "
        "Parameter; the restore then assigns the old TwoTensor-valued right_inverse through "
        "`set_`, which leaves the original without storage, and the next read of the module "
        "raises or kills the interpreter (torch 2.13). Repro: from "
        "torch.testing._internal.two_tensor import TwoTensor; m = nn.Linear(3, 3); "
        "w = m.weight.detach(); m.weight = nn.Parameter(TwoTensor(w, w.clone())); "
        "torch.nn.utils.parametrizations.orthogonal(m); "
        "torch.func.functional_call(m, {'weight': torch.rand(3, 3)}, (torch.rand(1, 3),)); "
        "m.weight  # RuntimeError: ... its data is not allocated yet (or a segfault)"),
    Deviation(
        "FC-PARAMETRIZED", reparametrizing_name_given, "not-restored",
        "Restoring a parametrized weight after a call that named it assigns the old weight "
        "through right_inverse: for spectral_norm that stores weight/sigma, so "
        "`parametrizations.weight.original` keeps its object but not its values; for "
        "orthogonal it rebinds the parametrization's `base` buffer. Repro: m = nn.Linear(3, 3); "
        "torch.nn.utils.parametrizations.spectral_norm(m); o = m.parametrizations.weight.original; "
        "before = o.detach().clone(); torch.func.functional_call(m, {'weight': torch.rand(3, 3)}, "
        "(torch.ones(1, 3),)); assert torch.equal(o, before)  # fails"),
    Deviation("FC-PARAMETRIZED", swaps_one_slot_twice, "not-restored", SHARED_SLOT),
    Deviation(
        "FC-PARAMETRIZED", weight_norm_restore_rounds, "not-restored", reason=
        "Restoring a weight-normed weight after a call that named it assigns the old weight "
        "through right_inverse, which recomputes original0 = norm(w) and original1 = w: the "
        "values can come back rounded (torch 2.13). Repro: m = nn.Conv2d(2, 2, 3).double(); "
        "torch.nn.utils.parametrizations.weight_norm(m); o = m.parametrizations.weight.original0; "
        "before = o.detach().clone(); torch.func.functional_call(m, {'weight': torch.rand(2, 2, 3, 3, "
        "dtype=torch.double)}, (torch.ones(1, 2, 5, 5, dtype=torch.double),)); "
        "torch.equal(o, before)  # False where norm(w) rounds"),
    Deviation(
        APPLY_IDS, swap_refuses_subclass, "raised",
        "The swap and overwrite paths build `Parameter(fn(p))`; when fn returns a Parameter "
        "subclass instance unchanged (float() on a float32 one), Parameter() refuses it "
        "(`Creating a Parameter from an instance of type P requires that detach() returns an "
        "instance of the same type`) and _apply raises halfway. Repro: "
        "class P(nn.Parameter): pass; m = nn.Linear(2, 2); m.weight = P(m.weight.detach()); "
        "torch.__future__.set_overwrite_module_params_on_conversion(True); m.float()"),
    Deviation(
        "APPLY-PARAMETER-IDENTITY", drops_parameter_class, ("class", "attributes"),
        "The swap and overwrite paths rebuild a plain `Parameter(fn(p), requires_grad)`: "
        "Parameter subclasses (and lazy modules' UninitializedParameter) and instance "
        "attributes are lost. Repro: p = nn.Parameter(torch.ones(2)); p.tag = 'x'; "
        "m = nn.Module(); m.p = p; torch.__future__.set_overwrite_module_params_on_conversion(True); "
        "m.double(); assert hasattr(m.p, 'tag')  # fails"),
    Deviation(
        "APPLY-TIES", overwrite_splits_tied_parameters, "parameter-tie-split",
        "_apply keeps no memo: on the overwrite path each slot of a tied parameter gets its "
        "own new Parameter (pytorch/xla weight-tying docs). Repro: m = nn.Module(); "
        "m.a = nn.Parameter(torch.ones(2)); m.b = m.a; "
        "torch.__future__.set_overwrite_module_params_on_conversion(True); m.double(); "
        "assert m.a is m.b  # fails"),
    Deviation(
        "APPLY-TIES", rebinding_splits_tied_buffers, "buffer-tie-split",
        "Buffers are rebound per slot, `self._buffers[k] = fn(buf)`, so a buffer registered "
        "under two names ends as two tensors. Repro: m = nn.Module(); "
        "m.register_buffer('a', torch.ones(2)); m.register_buffer('b', m.a); m.double(); "
        "assert m.a is m.b  # fails"),
    Deviation(
        "APPLY-FORWARD", split_tied_buffer_shares_storage, "stale-forward", always=False, reason=
        "A buffer registered under two names is converted once per slot (see buffer-tie-split); "
        "when fn's result shares its input's memory, as TwoTensor(t.detach(), t.detach().clone()) "
        "does through `a`, the two results are distinct objects whose `a` tensors still share "
        "memory while their `b` tensors do not. A fresh build holding clones of them has no such "
        "half-tie, so where forward updates one of them in place (BatchNorm's running stats in "
        "training) the converted module's output has a != b (torch 2.13). Repro: "
        "m = nn.BatchNorm1d(2); m.running_var = m.running_mean; "
        "m._apply(lambda t: TwoTensor(t.detach(), t.detach().clone()) if t.is_floating_point() "
        "else t); m(torch.tensor([[0., 2.], [2., 0.]])); "
        "assert torch.equal(m.running_var.a, m.running_var.b)  # fails: 0.29 vs 0.2"),
    Deviation(
        "APPLY-FN-ONCE", converts_some_tensor_twice, ("fn-repeated", "fn-on-result"),
        "_apply keeps no memo and recurses through children(), which drops repeats within "
        "one parent only: a tied tensor, or a module shared by two parents, is converted "
        "once per encounter. Repro: m = nn.Module(); m.a = nn.Parameter(torch.ones(2)); "
        "m.b = m.a; calls = []; m._apply(lambda t: calls.append(t) or t); "
        "assert len(calls) == 1  # 2"),
    Deviation(
        "APPLY-VALUES", non_idempotent_twice, "value",
        "Converted twice (see APPLY-FN-ONCE), a non-idempotent fn is applied to its own "
        "result: `t + 1` ends as `t + 2`. Repro: m = nn.Module(); "
        "m.a = nn.Parameter(torch.zeros(1)); m.b = m.a; m._apply(lambda t: t + 1); "
        "assert m.a.item() == 1  # 2.0"),
    Deviation(
        "APPLY-GRADS", non_idempotent_twice_on_grads, "grad-value",
        "A tied parameter's grad is converted once per slot too: `g + 1` ends as `g + 2`. "
        "Repro: as APPLY-VALUES with m.a.grad = torch.zeros(1); m.a.grad.item() == 2.0"),
    Deviation(
        ("APPLY-PATH", "XLA-DTYPE-PATH"), swaps_twice_back, "path-swap", always=False, reason=
        "A parameter met twice on the swap path is swapped twice; the second new TensorImpl "
        "can reuse the address the first swap freed, so its _cdata may end where it started, "
        "as if set_data had run (only sometimes: it depends on the allocator). Repro: "
        "leaf = nn.Linear(2, 2); m = nn.ModuleList([nn.ModuleList([leaf]), "
        "nn.ModuleList([leaf])]); c = leaf.weight._cdata; "
        "torch.__future__.set_swap_module_params_on_conversion(True); m.float(); "
        "assert leaf.weight._cdata != c  # fails when the address is reused"),
    Deviation(
        "APPLY-ATOMIC", commits_before_raising,
        ("value-changed", "slot-changed", "grad-changed"),
        "_apply commits each tensor as soon as fn returns, so an error on the k-th tensor "
        "leaves the first k-1 converted. Repro: m = nn.Linear(2, 2); n = [0]; "
        "def fn(t):\n n[0] += 1\n if n[0] == 2: raise ValueError\n return t.double(); "
        "m._apply(fn) raises, and m.weight.dtype is float64"),
    Deviation(
        "APPLY-REFUSED-SWAP", converts_before_refused_swap,
        ("value-changed", "slot-changed", "grad-changed", "cdata-changed"),
        "_apply commits each tensor before it swaps the next, so a tensor swap_tensors refuses "
        "leaves those before it converted; a refused grad also leaves its parameter swapped and "
        "its grad None. Repro: m = nn.Linear(2, 2); m.weight.grad = torch.ones(2, 2); "
        "held = weakref.ref(m.weight.grad); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double() raises RuntimeError, then m.weight.dtype is float64 and m.weight.grad is None"),
    Deviation(
        ("FC-RESTORE", "TOGETHER-CONVERTED-CALL"), swaps_one_slot_twice, "not-restored",
        SHARED_SLOT),
    Deviation("TOGETHER-APPLY-IN-FORWARD", swaps_one_slot_twice, "original-changed",
              SHARED_SLOT),
    Deviation("FC-TIES", slot_conflict_ignored, ("slot-conflict", "touched-on-error"),
              "With tie_weights=False torch does not notice two names of one shared slot "
              "given different objects; the last one wins and the slot is not restored. "
              + SHARED_SLOT),
    Deviation(("FC-VISIBLE", "FC-TIES"), partial_tie_group_key_error, ("raised", "tie-conflict"),
              PARTIAL_TIES),
    Deviation("FC-TIES", partial_ties_beside_conflict, "tie-conflict", always=False,
              reason="Sometimes, by set order: " + PARTIAL_TIES),
    Deviation("FC-STRICT", partial_tie_group_key_error, ("strict-error", "raised"),
              PARTIAL_TIES),
    Deviation("FC-BAD-INPUT", partial_tie_group_key_error, "wrong-error", PARTIAL_TIES),
    Deviation("FC-BAD-INPUT", swaps_one_slot_twice, "touched-on-error",
              "When a later name is bad, torch undoes its swaps in the order it made them, so a "
              "shared submodule's slot swapped under two names keeps the first given tensor. "
              + SHARED_SLOT),
    Deviation("FC-ORACLE", partial_tie_group_key_error, "output", PARTIAL_TIES),
    Deviation("FC-WRITE-BACK", partial_tie_group_key_error, "forward-outcome", PARTIAL_TIES),
    Deviation("FC-WRITE-BACK", shared_slot_write_back_wrong, ("in-place-lost", "rebind-lost"),
              SHARED_SLOT),
    Deviation(
        "FC-WRITE-BACK", tuple_rebind_lost, "rebind-lost",
        "torch.func.functional_call merges a tuple of dicts into a new dict, so a buffer "
        "rebound in forward is written back to that temporary dict, not to the caller's. "
        "Repro: class B(nn.Module):\n def __init__(s): super().__init__(); "
        "s.register_buffer('b', torch.zeros(1))\n def forward(s, x): s.b = s.b + 1; return x; "
        "d = {'b': torch.zeros(1)}; torch.func.functional_call(B(), (d,), (torch.ones(1),)); "
        "d['b'] is still the zeros tensor"),
)
