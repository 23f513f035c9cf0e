"""Facts about torch's ``nn.Module._apply``, as predicates over a drawn ``Example``: which path
it takes for each parameter, how often its traversal visits a module, what it converts twice,
what it commits before raising. The torch declarations (``declarations.torch``) read them."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.models.apply_state import (
    expected_path,
    is_uninitialized,
    swap_tensors_takes,
)
from swapspec.properties.models.examples import (
    Example,
    holds_values,
    memory_of,
    same_values,
)
from swapspec.properties.models.outcomes import attempt
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
    return any(_subclass_refused(example, p, applied)
               for p, applied in _results(example, _params(example)))


def commits_before_its_raise(example: Example) -> bool:
    """torch's ``_apply`` raises here (``torch_apply_raises``: a refused ``Parameter`` subclass,
    a graph-carrying grad, an old-style norm, a tied RNN weight, a shared grad) and ``fn``
    changes a tensor that comes first in its order (or the overwrite path puts a new
    ``Parameter`` in its slot), which ``_apply`` has committed when it raises. The raise comes
    at the first ``Parameter`` subclass ``fn`` returns unchanged off the set_data path, if
    any (nothing after it is committed); for the other causes, the last tensor of the order is
    taken as the raising one's latest place."""
    if not torch_apply_raises(example):
        return False
    results = _results(example, torch_call_order(example)[:-1])
    cut = next((i for i, (t, applied) in enumerate(results)
                if _subclass_refused(example, t, applied)), len(results))
    return any(applied is not t or _overwritten(example, t, applied)
               for t, applied in results[:cut])


def _overwritten(example: Example, t: Tensor, applied: Any) -> bool:
    """A parameter the overwrite path replaces by ``Parameter(applied)``: a new object in its
    slot even where ``fn`` returned the parameter itself."""
    return isinstance(t, nn.Parameter) and torch_path(example, t, applied) == "overwrite"


def old_norm_refusals(example: Example) -> list[Tensor]:
    """The tensors ``swap_tensors`` refuses on the swap path because an old hook-based
    reparametrization holds them: the sources of the computed attribute of a ``weight_norm``
    (``_g``/``_v``), a ``spectral_norm`` or a pruning method (``_orig``) while that attribute's
    autograd graph still holds them. ``swap_tensors`` refuses a leaf whose TensorImpl has
    more uses than the tensor and its current ``AccumulateGrad`` node (``swap_tensors_takes``):
    the graph's saved tensors (a norm's), or the graph's old ``AccumulateGrad`` node once a
    ``.data =`` of another dtype has dropped the tensor's link to it (a pruned ``_orig``).
    A ``backward`` without ``create_graph`` frees the graph's saved tensors, and a
    spectral-norm weight computed with no forward yet has no graph; then the swap goes
    through."""
    refused = []
    for m in _scope(example):
        for hook in m._forward_pre_hooks.values():
            for p in _hook_sources(m, hook):
                if not swap_tensors_takes(p) and any(
                        torch_path(example, q, applied) == "swap"
                        for q, applied in _results(example, [p])):
                    refused.append(p)
    return refused


def _hook_sources(module: nn.Module, hook: object) -> list[Tensor]:
    """The parameters an old-style reparametrization hook computes its attribute from."""
    if isinstance(hook, WeightNorm | SpectralNorm):
        name, suffixes = hook.name, ("_g", "_v", "_orig")
    elif isinstance(hook, BasePruningMethod):
        name, suffixes = hook._tensor_name, ("_orig",)
    else:
        return []
    found = [module._parameters.get(name + suffix) for suffix in suffixes]
    return [p for p in found if p is not None]


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
    """An RNN's flat weight is met on the swap path outside that RNN's own ``_apply``
    (``rnn_weight_refusal_positions``): ``swap_tensors`` refuses it and ``_apply`` raises."""
    return bool(rnn_weight_refusal_positions(example))


def shared_grad_swapped(example: Example) -> bool:
    """Two distinct parameters hold one grad object (what the overwrite path leaves of a tied
    parameter with a grad), and one of them takes the swap path: ``swap_tensors`` refuses a
    grad that another parameter still holds."""
    shared = params_sharing_a_grad(example)
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


def runs_an_override_twice(example: Example) -> bool:
    """A module whose class overrides ``_apply`` is visited twice by torch's traversal (shared
    by two parents), so its override's work runs twice; where ``_apply`` raises first, it may
    not get that far."""
    if not example.recurse or _certain_raise(example):
        return False
    visits = torch_visits(example.module)
    return any(visits[id(m)] > 1 and type(m)._apply is not nn.Module._apply
               for m in _scope(example))


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
    return (not old_weight_norm_swapped(example) and not touches_a_split_parameter(example)
            and _loses_tensor_hooks(example))


def swap_ignores_new_hooks(example: Example) -> bool:
    return (not old_weight_norm_swapped(example) and not touches_a_split_parameter(example)
            and _swap_ignores_new_hooks(example))


def touches_a_split_parameter(example: Example) -> bool:
    """A buffer slot holds a parameter, or what torch's split of one left there (a Parameter no
    parameter slot holds, or a tensor with an autograd graph): a backward through that buffer
    reaches the old object's hooks, or the one its graph leads to."""
    params = {id(p) for p in _params(example)}
    return any(id(b) in params or isinstance(b, nn.Parameter) or b.grad_fn is not None
               for b in _buffers(example))


def hooks_beside_a_split_parameter(example: Example) -> bool:
    """``loses_tensor_hooks`` or ``swap_ignores_new_hooks`` where
    ``touches_a_split_parameter``: whether a lost hook fires anyway depends on what forward
    reads."""
    return (not old_weight_norm_swapped(example) and touches_a_split_parameter(example)
            and (_loses_tensor_hooks(example) or _swap_ignores_new_hooks(example)))


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


def split_tie_shares_grad(example: Example) -> bool:
    """A tied parameter with a grad takes the overwrite path: torch gives each slot its own new
    Parameter, and each of them ``fn(grad)``: one grad object where ``fn`` returns its input
    (for a new grad per call, each Parameter has its own). Or an earlier conversion did so:
    two parameters already share one grad (``params_sharing_a_grad``), and this one keeps it
    shared: off the overwrite path (``grad.data =``), or where ``fn`` returns it itself."""
    if torch_apply_raises(example):
        return False
    held = _summed(_distinct_slots(example, "_parameters"), _distinct_slots(example, "_buffers"))
    return any(torch_path(example, p, applied) != "overwrite" or _returns_itself(example, p.grad)
               for p, applied in _results(example, params_sharing_a_grad(example))) or any(
        held[id(p)] > 1 and p.grad is not None and torch_path(example, p, applied) == "overwrite"
        and _returns_itself(example, p.grad)
        for p, applied in _results(example, _params(example)))


def params_sharing_a_grad(example: Example) -> list[Tensor]:
    """Distinct parameters that hold one grad object between them (what the overwrite path
    leaves of a tied parameter with a grad, the old object staying in a buffer slot where the
    tie held one)."""
    in_buffers = [b for b in _buffers(example) if isinstance(b, nn.Parameter)]
    holders: dict[int, int] = {}
    for p in {id(t): t for t in [*_params(example), *in_buffers]}.values():
        if p.grad is not None:
            holders[id(p.grad)] = holders.get(id(p.grad), 0) + 1
    return [p for p in _params(example) if p.grad is not None and holders[id(p.grad)] > 1]


def _returns_itself(example: Example, t: Tensor) -> bool:
    """A fresh ``fn`` returns ``t`` itself."""
    return any(applied is t for _, applied in _results(example, [t]))


def rebinding_splits_tied_buffers(example: Example) -> bool:
    """A buffer held by two slots, with ``fn`` returning a new tensor: one result per slot (a
    parameter in buffer slots: ``splits_parameter_in_buffer_slot``)."""
    held = _distinct_slots(example, "_buffers")
    params = {id(p) for p in _params(example)}
    plain = [b for b in _buffers(example) if id(b) not in params]
    return not torch_apply_raises(example) and any(
        held[id(b)] > 1 and applied is not b for b, applied in _results(example, plain))


def params_in_buffer_slots(example: Example) -> list[Tensor]:
    """The parameters (in scope) that a buffer slot holds too."""
    buffered = {id(b) for b in _buffers(example)}
    return [p for p in _params(example) if id(p) in buffered]


def _buffer_slot_first(example: Example, param: Tensor) -> bool:
    """torch's traversal meets ``param`` in a buffer slot before its parameter slot."""
    return next((kind == "buffer" for _, t, kind in torch_calls(example) if t is param), False)


def splits_parameter_in_buffer_slot(example: Example) -> bool:
    """A parameter that a buffer slot holds too ends as two objects: torch converts the
    parameter slot (``.data =`` or a swap keeps the object, the overwrite path makes a new
    Parameter) and rebinds the buffer slot to ``fn`` of the tensor it meets there, the
    parameter before or after its own conversion, whichever comes first. The tie holds only
    off the overwrite path where ``fn`` returns that tensor itself."""
    if torch_apply_raises(example):
        return False
    for param, applied in _results(example, params_in_buffer_slots(example)):
        if torch_path(example, param, applied) == "overwrite":
            return True
        if applied is param:
            continue
        if _buffer_slot_first(example, param) or not _returns_itself(example, applied):
            return True
    return False


def buffer_slot_keeps_graph(example: Example) -> bool:
    """``splits_parameter_in_buffer_slot``, where the buffer slot's new tensor carries an
    autograd graph back to the parameter: torch rebinds buffers outside ``torch.no_grad()``, so
    ``fn`` of a parameter that requires grad records its op (``t + 1``, ``t.half()``)."""
    if not splits_parameter_in_buffer_slot(example):
        return False
    fn = example.conversion.make_fn()
    for param in params_in_buffer_slots(example):
        if not param.requires_grad:
            continue
        try:
            with torch.enable_grad():
                out = fn(param)
        except Exception:
            continue
        if isinstance(out, Tensor) and out.grad_fn is not None:
            return True
    return False


def buffer_carries_graph(example: Example) -> bool:
    """Some buffer in scope carries an autograd graph, or this conversion leaves one
    (``buffer_slot_keeps_graph``): what torch's conversion of a parameter in a buffer slot
    leaves, and keeps through later steps (``fn`` of such a buffer records its op again)."""
    if any(b.grad_fn is not None for b in _buffers(example)):
        return True
    converting = getattr(example, "step", "") in ("", "convert")
    return converting and example.conversion is not None and buffer_slot_keeps_graph(example)


def holds_inference_tensors(example: Example) -> bool:
    """A parameter, grad or buffer in scope is an inference tensor: what torch's conversion
    under ``torch.inference_mode()`` leaves behind (``fn``'s results made in that mode), kept
    through every later step until a slot is given another tensor."""
    params = _params(example)
    grads = [p.grad for p in params if p.grad is not None]
    return any(t.is_inference() for t in (*params, *grads, *_buffers(example)))


def step_under_inference_mode(example: Example) -> bool:
    """A sequence's conversion or load step run under ``torch.inference_mode()``."""
    return (getattr(example, "step", "") in ("convert", "load_state_dict")
            and getattr(example, "inference", False))


def inference_mode_reaches_the_module(example: Example) -> bool:
    """``step_under_inference_mode``, or the module holds inference tensors
    (``holds_inference_tensors``) from such a step."""
    return step_under_inference_mode(example) or holds_inference_tensors(example)


def step_splits_parameter_in_buffer_slot(example: Example) -> bool:
    """A sequence's conversion step where ``splits_parameter_in_buffer_slot`` holds."""
    return getattr(example, "step", "") == "convert" and splits_parameter_in_buffer_slot(example)


def _new_object_sharing_storage(t: Tensor, applied: Any) -> bool:
    """``applied`` is a new object that holds (part of) ``t``'s memory, as
    ``TwoTensor(t.detach(), t.detach().clone())`` does through its ``a``."""
    if applied is t or not isinstance(applied, Tensor):
        return False
    return bool(memory_of(t) & memory_of(applied))


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


def _met_counts(example: Example) -> dict[int, int]:
    """How many times torch's traversal meets each tensor, in parameter and buffer slots
    together (a parameter tied into a buffer slot is met in both)."""
    return _summed(_slot_counts(example, "_parameters"), _slot_counts(example, "_buffers"))


def _summed(params: dict[int, int], buffers: dict[int, int]) -> dict[int, int]:
    """Per-tensor counts of parameter and buffer slots added (a parameter in a buffer slot is
    counted in both)."""
    return {key: params.get(key, 0) + buffers.get(key, 0) for key in {*params, *buffers}}


def converts_some_tensor_twice(example: Example) -> bool:
    """Some tensor is met twice by torch's traversal (a tie, or a module visited twice)."""
    if torch_apply_raises(example):
        return False
    counts = _met_counts(example)
    return any(n > 1 for n in counts.values())


def _converts_result_again(example: Example, tensors: list[Tensor],
                           met: dict[int, int] | None = None) -> bool:
    """Some tensor's second conversion is applied to its first result.

    That happens on the set_data and swap paths (the object itself changed) whenever the
    tensor is met twice (``met``: the counts of the slots where it is converted, by default
    ``_met_counts``), and on every path when its module is visited twice.
    """
    if torch_apply_raises(example):
        return False
    met = _met_counts(example) if met is None else met
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
    """``add(1)`` applied twice to some tensor that holds values (a ``meta`` tensor's ``+2``
    shows in no value): its value ends ``+2``."""
    if example.conversion.name != "add(1)":
        return False
    return _converts_result_again(example, [t for t in [*_params(example), *_buffers(example)]
                                            if holds_values(t)])


def non_idempotent_twice_on_grads(example: Example) -> bool:
    """``add(1)`` applied twice to a parameter whose grad holds values: the grad ends ``+2``.
    A grad is converted where its parameter is met in a parameter slot only (a buffer slot
    holding the parameter rebinds itself and leaves the grad alone)."""
    if example.conversion.name != "add(1)":
        return False
    with_grad = [p for p in _params(example) if p.grad is not None and holds_values(p.grad)]
    return _converts_result_again(example, with_grad, _slot_counts(example, "_parameters"))


def torch_calls(example: Example) -> list[tuple[tuple[nn.Module, ...], Tensor, str]]:
    """Each call torch's ``_apply`` makes of ``fn``, in order, repeats included: the modules
    whose ``_apply`` is running at that call (the root first, the module that owns the tensor
    last), the tensor, and the slot it is met in (``parameter``, ``grad`` right after its
    parameter, or ``buffer``: a parameter held by a buffer slot is met there too)."""
    calls: list[tuple[tuple[nn.Module, ...], Tensor, str]] = []

    def walk(m: nn.Module, running: tuple[nn.Module, ...]) -> None:
        running = (*running, m)
        if example.recurse:
            for child in m.children():
                walk(child, running)
        for p in m._parameters.values():
            if p is not None:
                calls.append((running, p, "parameter"))
                if p.grad is not None:
                    calls.append((running, p.grad, "grad"))
        calls.extend((running, b, "buffer") for b in m._buffers.values() if b is not None)

    walk(example.module, ())
    return calls


def torch_call_sites(example: Example) -> list[tuple[tuple[nn.Module, ...], Tensor]]:
    """``torch_calls`` without the slot kinds."""
    return [(running, t) for running, t, _ in torch_calls(example)]


def torch_call_order(example: Example) -> list[Tensor]:
    """The tensors torch's ``_apply`` passes to ``fn``, in order, repeats included."""
    return [t for _, t in torch_call_sites(example)]


def _rnn_weak_holders(example: Example) -> dict[int, list[nn.Module]]:
    """The RNNs of the tree that hold a weak reference to each tensor (by id): an RNN keeps
    one to each of its flat weights (``_flat_weight_refs``)."""
    held: dict[int, list[nn.Module]] = {}
    for m in {id(m): m for m in example.module.modules()}.values():
        for ref in getattr(m, "_flat_weight_refs", []) if isinstance(m, nn.RNNBase) else []:
            t = ref() if ref is not None else None
            if t is not None:
                held.setdefault(id(t), []).append(m)
    return held


def rnn_weight_refusal_positions(example: Example) -> list[int]:
    """The calls (indices into ``torch_call_sites``) after which ``swap_tensors`` refuses an
    RNN's flat weight and ``_apply`` raises: a parameter on the swap path that an RNN whose own
    ``_apply`` is not running holds a weak reference to (``RNNBase._apply`` drops its
    references only around its own conversion, and ``swap_tensors`` refuses a tensor with
    one). That is a flat weight tied into another module, or any parameter of a root
    converted with ``recurse=False`` that a child RNN holds."""
    held = _rnn_weak_holders(example)
    return [i for i, (running, t) in enumerate(torch_call_sites(example))
            if any(t is p for p in running[-1]._parameters.values())
            and any(all(h is not r for r in running) for h in held.get(id(t), []))
            and _takes_swap_path(example, t)]


def _takes_swap_path(example: Example, param: Tensor) -> bool:
    """Whether torch's ``_apply`` swaps ``param`` (``torch_path`` of a fresh ``fn``'s result)."""
    return any(torch_path(example, param, applied) == "swap"
               for _, applied in _results(example, [param]))


def old_norm_refusal_positions(example: Example) -> list[int]:
    """The calls (indices into ``torch_call_sites``) on the tensors ``old_norm_refusals``
    names."""
    refused = {id(t) for t in old_norm_refusals(example)}
    return [i for i, t in enumerate(torch_call_order(example)) if id(t) in refused]


def swap_refusal_positions(example: Example) -> list[int]:
    """The calls (indices into ``torch_call_sites``) after which ``swap_tensors`` refuses the
    tensor, and ``_apply`` raises its own RuntimeError, whatever ``fn`` does later: a tensor an
    old-style reparametrization holds (``old_norm_refusal_positions``; only sometimes, see
    ``old_norm_refusals``) or an RNN's flat weight outside its RNN
    (``rnn_weight_refusal_positions``)."""
    return sorted({*old_norm_refusal_positions(example), *rnn_weight_refusal_positions(example)})


def _first_uninitialized_call(example: Example) -> int:
    """The index of torch's first call on an uninitialized parameter (``t + 1`` raises there),
    or the number of calls."""
    order = torch_call_order(example)
    return next((i for i, t in enumerate(order) if is_uninitialized(t)), len(order))


def _refused_before_fn_raises(example: Example, positions: list[int]) -> bool:
    """A refused swap at one of ``positions`` comes before the call on which the raising ``fn``
    raises (``raise_on(k)``: call k; ``t + 1``: at once on an uninitialized parameter), so
    torch's own RuntimeError comes out of ``_apply``, not ``fn``'s error."""
    raising = min(example.conversion.raises_on - 1, _first_uninitialized_call(example))
    return any(i < raising for i in positions)


def old_norm_refused_before_fn_raises(example: Example) -> bool:
    """``_refused_before_fn_raises`` at a tensor an old-style norm holds."""
    return _refused_before_fn_raises(example, old_norm_refusal_positions(example))


def rnn_weight_refused_before_fn_raises(example: Example) -> bool:
    """``_refused_before_fn_raises`` at an RNN's flat weight outside its RNN."""
    return _refused_before_fn_raises(example, rnn_weight_refusal_positions(example))


def commits_before_raising(example: Example) -> bool:
    """torch's first ``fn`` call succeeds before the raising one, so it committed something.

    ``raise_on(k)`` raises on call k, and ``t + 1`` raises at once on an uninitialized
    parameter; ``_apply`` commits each tensor right after its call, and raises its own error
    right after the call on a tensor ``swap_tensors`` refuses (``swap_refusal_positions``). A raise
    on a grad whose parameter was swapped shows too: that grad is left None.
    """
    k = example.conversion.raises_on
    order = torch_call_order(example)
    first_failure = min([_first_uninitialized_call(example), *swap_refusal_positions(example)])
    committed = _results(example, order[:min(k - 1, first_failure)])
    return ((k - 1 < first_failure and _raises_on_swapped_grad(example, order, committed, k - 1))
            or _any_commit_shows(example, committed))


def _raises_on_swapped_grad(example: Example, order: list[Tensor],
                            committed: list[tuple[Tensor, Any]], index: int) -> bool:
    """``fn`` raises on a grad (call ``index``) whose parameter took the swap path: torch set
    the parameter's grad to None before converting it, and leaves it so."""
    if not 0 < index < len(order) or len(committed) < index:
        return False
    param, applied = committed[index - 1]
    return (isinstance(param, nn.Parameter) and param.grad is order[index]
            and torch_path(example, param, applied) == "swap")


def _commit_shows(example: Example, t: Tensor, applied: Any,
                  param_path: str | None = None, buffer_slot: bool = False) -> bool:
    """Whether committing ``fn(t)`` is visible without reading TensorImpls: a new object in its
    slot, new metadata, or new values or class (for a tensor that holds values). Where ``fn``
    returned ``t`` itself only the overwrite path shows. A grad (``param_path``: its
    parameter's path) keeps its object on its parameter's swap path and where ``set_data``
    takes it; a buffer slot (``buffer_slot``, a parameter in one too) is always rebound; a
    parameter is replaced on the overwrite path."""
    if param_path is not None:  # a grad
        kept = param_path == "swap" or (torch._has_compatible_shallow_copy_type(t, applied)
                                        and not example.flags.overwrite)
        replaced = not kept
    else:
        replaced = (buffer_slot or not isinstance(t, nn.Parameter)
                    or torch_path(example, t, applied) == "overwrite")
    if applied is t:
        return replaced and isinstance(t, nn.Parameter) and not buffer_slot
    if replaced or (t.dtype, t.shape, t.device) != (applied.dtype, applied.shape, applied.device):
        return True
    return holds_values(t) and not same_values(t, applied)


def _any_commit_shows(example: Example, committed: list[tuple[Tensor, Any]]) -> bool:
    """Whether any of ``committed`` (torch's call order, a grad right after its parameter)
    shows (``_commit_shows``)."""
    kinds = [kind for _, _, kind in torch_calls(example)]
    for i, (t, applied) in enumerate(committed):
        path = torch_path(example, *committed[i - 1]) if kinds[i] == "grad" else None
        if _commit_shows(example, t, applied, path, buffer_slot=kinds[i] == "buffer"):
            return True
    return False


def converts_before_refused_swap(example: Example) -> bool:
    """torch converts another tensor visibly (``_commit_shows``) before the first swap it
    cannot make (a refused grad comes right after its own parameter's swap), and ``_apply``
    keeps what it converted.

    That first refusal is the drawn refused tensor or, when earlier, one an old-style norm
    holds (``old_norm_refusals``): ``weight_g`` comes before ``weight_v``, so with ``weight_v``
    refused torch raises on ``weight_g`` and converts nothing before it."""
    return ((_grad_refused_first(example) and _reaches_refusal(example))
            or _any_commit_shows(example, _before_refusal(example)))


def swaps_unseen_before_refused_swap(example: Example) -> bool:
    """Before the first swap torch cannot make it swaps parameters whose new TensorImpl is all
    that changed (``fn`` returned them as they were, or equal): a new ``_cdata``, unless the
    allocator gives the new TensorImpl the freed one's address."""
    before = _before_refusal(example)
    return (not converts_before_refused_swap(example)
            and any(_swapped(example, t, applied) for t, applied in before))


def _grad_refused_first(example: Example) -> bool:
    """The first refused swap is the drawn grad's: torch set its parameter's grad to None
    before it tried, and leaves it so (whatever ``fn`` returned)."""
    first = torch_call_order(example)[_first_refusal(example)]
    return example.refused.endswith(".grad") and first is example.refused_tensor()


def _first_refusal(example: Example) -> int:
    """The index of the first call after which a swap is refused: the drawn refused tensor's,
    or one torch refuses on its own (``swap_refusal_positions``)."""
    drawn = id(example.refused_tensor())
    return min([i for i, (_, t, kind) in enumerate(torch_calls(example))
                if id(t) == drawn and kind != "buffer"]  # a buffer slot is rebound, not swapped
               + swap_refusal_positions(example))


def _before_refusal(example: Example) -> list[tuple[Tensor, Any]]:
    """(tensor, fn's result) for each tensor torch converts before the first refused swap, or
    before a ``Parameter`` subclass ``fn`` returns unchanged off the set_data path (where
    ``Parameter()`` refuses it first: ``swap_refuses_subclass``)."""
    results = _results(example, torch_call_order(example)[:_first_refusal(example)])
    cut = next((i for i, (t, applied) in enumerate(results)
                if _subclass_refused(example, t, applied)), len(results))
    return results[:cut]


def _reaches_refusal(example: Example) -> bool:
    """Whether torch gets to the first refused swap: ``fn`` returns on every tensor before it,
    and no ``Parameter`` subclass refusal comes first."""
    return len(_before_refusal(example)) == _first_refusal(example)


def _subclass_refused(example: Example, p: Tensor, applied: Any) -> bool:
    """A ``Parameter`` subclass ``fn`` returned unchanged, off the set_data path: torch's
    ``Parameter(fn(p))`` refuses it and ``_apply`` raises there."""
    return (issubclass(type(p), nn.Parameter) and type(p) is not nn.Parameter and applied is p
            and torch_path(example, p, applied) != "set_data")


def _swapped(example: Example, t: Tensor, applied: Any) -> bool:
    """A parameter on the swap path: ``swap_tensors`` gives it a new TensorImpl even where
    ``fn`` returned it as it was."""
    return isinstance(t, nn.Parameter) and torch_path(example, t, applied) == "swap"


def swaps_twice_back(example: Example) -> bool:
    """A swapped parameter is met two or more times: each swap frees a TensorImpl whose
    address a later swap may reuse, so its ``_cdata`` can end where it started."""
    if torch_apply_raises(example):
        return False
    counts = _slot_counts(example, "_parameters")
    return any(counts[id(p)] >= 2 and torch_path(example, p, applied) == "swap"
               for p, applied in _results(example, _params(example)))


# ---- facts about torch's public methods ----------------------------------------------------
# Bad arguments torch's methods check only where they use them: per parameter
# (``requires_grad_`` calls ``p.requires_grad_(requires_grad)``), per tensor (``type`` and
# ``to_empty`` inside the ``fn`` they pass to ``_apply``).
CHECKED_PER_PARAMETER = ("module.requires_grad_('yes')",)
CHECKED_PER_TENSOR = ("module.type('torch.NoSuchTensor')", "module.type(1)",
                      "module.to_empty(device=1.5)")


def bad_argument_unchecked(example: Example) -> bool:
    """A bad argument torch checks only per parameter or per tensor, on a module without
    any: nothing checks it, and torch's method returns the module."""
    call, module = example.method, example.module
    if call is None or call.kind != "bad":
        return False
    if call.name in CHECKED_PER_PARAMETER:
        return not any(True for _ in module.parameters())
    if call.name in CHECKED_PER_TENSOR:
        return not any(True for _ in module.parameters()) and not any(True for _ in module.buffers())
    return False


def _first_tensor_apply_reaches(module: nn.Module) -> Tensor | None:
    """The first tensor torch's ``_apply`` hands its fn: children first, depth first, then the
    module's own parameters, then its buffers."""
    for child in module.children():
        first = _first_tensor_apply_reaches(child)
        if first is not None:
            return first
    slots = [*module._parameters.values(), *module._buffers.values()]
    return next((t for t in slots if t is not None), None)


def type_checked_by_uninitialized(example: Example) -> bool:
    """A bad ``type`` argument on a module whose first tensor in ``_apply``'s order is an
    uninitialized parameter: that tensor's ``type`` refuses to run before it reads the argument."""
    call = example.method
    if call is None or call.kind != "bad" or call.method != "type":
        return False
    return is_uninitialized(_first_tensor_apply_reaches(example.module))


def requires_grad_on_uninitialized(example: Example) -> bool:
    """A good ``requires_grad_`` call on a module holding an uninitialized parameter (a lazy
    module before its first forward): torch's ``p.requires_grad_`` refuses it."""
    call = example.method
    return (call is not None and call.method == "requires_grad_" and call.kind == "grad"
            and example.has("uninitialized-parameter"))


def grad_dtype_refused_midway(example: Example) -> bool:
    """A parameter whose grad has another dtype than itself, which the conversion leaves so
    (``fn(param)`` and ``fn(grad)`` differ in dtype), on a path that sets ``.grad`` (swap or
    overwrite): torch refuses it there after converting what came before."""
    fn = example.conversion.make_fn()
    flags = example.flags
    for p in {id(p): p for p in example.module.parameters()}.values():
        if p.grad is None or p.grad.dtype == p.dtype:
            continue
        with torch.no_grad():
            done = attempt(lambda p=p: (fn(p.detach()), fn(p.grad)))
        if done.error is None and done.result[0].dtype != done.result[1].dtype and expected_path(
                p, done.result[0], flags.overwrite, flags.swap) != "set_data":
            return True
    return False
