"""Facts about what torch's ``load_state_dict`` puts in a slot on its assign and swap paths: one new
object per key (ties split), own data replaced, a tensor swapped twice, a parameter's identity
lost on a swap; and the same at a sequence's load step.

Predicates of one example (its module and drawn state dict, before the call), read by the ``LOAD-``
declarations (``declarations.torch_load``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.declarations.torch_load_failures import (
    own_state,
    spec_fails,
    swap_counts,
    swap_refused_by_torch,
    torch_writes,
    writes_before_failing,
)
from swapspec.properties.models.examples import loads_itself, named_tensors
from swapspec.properties.models.load_examples import (
    equal_values,
    expected_load_paths,
    loaded_values,
)


def assign_splits_ties(example: Any) -> bool:
    """``assign=True`` without swap: torch's ``setattr`` puts ``Parameter(value)`` (a new object
    per key) or the value itself in each slot, so slots that held one object may differ after."""
    load = example.load
    if not load.assign or load.swap or spec_fails(example):
        return False
    given, order = load.state_dict, list(load.state_dict)
    finals: dict[int, dict[tuple[int, str], tuple[int, Any]]] = {}
    for prefix, m in example.module.named_modules(remove_duplicate=False):
        for registry in (m._parameters, m._buffers):
            for key, t in registry.items():
                if t is None:
                    continue
                name = f"{prefix}.{key}" if prefix else key
                slots = finals.setdefault(id(t), {})
                rank, final = (order.index(name), _final_object(t, given[name])) \
                    if name in given else (-1, t)  # a slot no key reaches keeps its object
                earlier = slots.get((id(m), key))
                if earlier is None or rank > earlier[0]:
                    slots[(id(m), key)] = (rank, final)
    return any(len({id(f) for _, f in slots.values()}) > 1 for slots in finals.values()
               if len(slots) > 1)


class _New:
    """Stands for a new object torch makes (one per write)."""


def _final_object(slot: Tensor, value: Any) -> Any:
    if isinstance(slot, nn.Parameter) and not isinstance(value, nn.Parameter):
        return _New()
    return value


def assign_replaces_own_data(example: Any) -> bool:
    """With ``assign``, torch replaces a slot whose every key gives its own data (the spec's
    kept path): a new Parameter (or the detached alias as the buffer) without swap, a
    swapped-in TensorImpl with it. A tensor torch swaps more than once is left to
    ``swapped_twice``: its last TensorImpl can sit at the address of the one it started with
    (seen: a buffer reached by two consecutive keys does, by three does not), so whether it
    shows as replaced is the allocator's choice."""
    load = example.load
    if not load.assign or swap_refused_by_torch(example):
        return False
    given, swaps = load.state_dict, swap_counts(example)
    before = named_tensors(example.module)
    for key, path in expected_load_paths(before, load).items():
        if path != "kept":
            continue
        slot = before[key]
        if load.swap:
            if swaps.get(id(slot), 0) == 1:
                return True  # one swap: a new TensorImpl, the old one still alive meanwhile
            continue
        same_slot = [k for k in given if _slot_of(example.module, k) == _slot_of(example.module, key)]
        if same_slot and given[same_slot[-1]] is not slot:
            return True  # torch's last write into that slot puts in another object
    return False


def assign_keeps_tied_own_data(example: Any) -> bool:
    """With ``assign`` torch writes every key of a tied object in turn, own data too: without
    the swap flag each slot ends with the last value written into it, and a tied slot no key
    writes (a non-persistent buffer) keeps the object (the ties split); with it the object
    ends with the last key's value that is not the object itself (given itself, it is swapped
    with what it holds by then). Where what a slot of a tie (an object in two or more slots)
    ends with is not the value the spec loads (own data, which yields to a tied name's other
    value in the spec, or the old object), the difference shows."""
    load = example.load
    if not load.assign or spec_fails(example) or swap_refused_by_torch(example):
        return False
    module = example.module
    before = named_tensors(module)
    loading = {id(before[k]): v for k, v in loaded_values(before, load.state_dict).items()}
    slots: dict[int, dict[tuple[int, str], Tensor]] = {}
    for _, m in module.named_modules(remove_duplicate=False):
        for registry in (m._parameters, m._buffers):
            for key, t in registry.items():
                if t is not None and id(t) in loading:
                    slots.setdefault(id(t), {})[(id(m), key)] = t
    finals: dict[Any, Any] = {}
    for key, slot, value in torch_writes(example):
        if load.swap and value is slot:
            continue  # swapping the object with itself keeps what the last swap put in
        finals[id(slot) if load.swap else _slot_of(module, key)] = value
    for ident, held in slots.items():
        if len(held) < 2:
            continue  # not a tie
        ends = [finals.get(ident, t) for t in held.values()] if load.swap else \
            [finals.get(where, t) for where, t in held.items()]
        if any(not equal_values(end, loading[ident]) for end in ends):
            return True
    return False


def assign_keeps_a_slot_given_itself(example: Any) -> bool:
    """With ``assign`` (swap flag off) torch writes each key into its own slot: a slot whose
    last key gives the parameter or buffer it holds keeps it, where the spec assigns a tied
    name's other value to the object (``path-assign``)."""
    load = example.load
    if not load.assign or load.swap or spec_fails(example):
        return False
    module = example.module
    finals = {_slot_of(module, key): value for key, _, value in torch_writes(example)}
    before = named_tensors(module)
    return any(path == "assign" and finals.get(_slot_of(module, key)) is before[key]
               for key, path in expected_load_paths(before, load).items())


def _slot_of(module: nn.Module, key: str) -> tuple[int, str]:
    prefix, _, name = key.rpartition(".")
    owner = module.get_submodule(prefix) if prefix else module
    return id(owner), name


def round_trip_assign_replaces(example: Any) -> bool:
    return example.load.assign and not example.load.swap and bool(_tensor_slots(example)) \
        and not _has_uninitialized(example)


def swapped_twice(example: Any) -> bool:
    """Under the swap flag torch swaps a tensor once per key that reaches it (tied names, a
    shared submodule's paths): the second swap can put a TensorImpl at the address the first
    one freed, so ``_cdata`` reads as kept."""
    return example.load.swap and not spec_fails(example) and any(
        n > 1 for n in swap_counts(example).values())


def _tensor_slots(example: Any) -> list[Tensor]:
    return [t for t in own_state(example).values() if isinstance(t, Tensor)]


def _has_uninitialized(example: Any) -> bool:
    return any(is_lazy(t) for t in _tensor_slots(example))


def _params(example: Any) -> list[nn.Parameter]:
    return list({id(p): p for p in example.module.parameters()}.values())


def _hookable(p: nn.Parameter) -> bool:
    return (p.requires_grad and p.is_floating_point() and not p.is_meta
            and not is_traceable_wrapper_subclass(p))


def swap_loses_identity(example: Any) -> bool:
    """On the swap path torch swaps ``__class__`` and ``__dict__`` with a fresh
    ``Parameter(module_load(...))`` and the TensorImpl with its autograd meta: a parameter
    subclass's class (without ``assign``), instance attributes, grad and hooks are lost (the
    class and attributes are kept by a class with its own ``module_load``: ``loads_itself``)."""
    load = example.load
    if not load.swap or swap_refused_by_torch(example):
        return False
    return any(_hookable(p) or p.grad is not None or _identity_lost(p, load.assign)
               for p in _params(example))


def _identity_lost(p: nn.Parameter, assign: bool) -> bool:
    """A swap-path load loses ``p``'s instance attributes or (without ``assign``) its class."""
    if loads_itself(p):
        return False
    return bool(p.__dict__) or (not assign and type(p) is not nn.Parameter)


def swap_drops_written_identity(example: Any) -> bool:
    """``swap_loses_identity`` for the parameters torch writes (the check of the XLA-LOAD-
    properties, which sets no hooks): a grad, instance attributes, or (without ``assign``) a
    Parameter subclass."""
    load = example.load
    if not load.swap or swap_refused_by_torch(example) or spec_fails(example):
        return False
    written = {id(slot): slot for _, slot, _ in torch_writes(example) if isinstance(slot, nn.Parameter)}
    return any(p.grad is not None or _identity_lost(p, load.assign) for p in written.values())


def round_trip_swap_loses_identity(example: Any) -> bool:
    """Under the swap flag a parameter loses its grad, and a ``Parameter`` subclass its class
    and instance attributes. A traceable wrapper subclass parameter (a host's quantized weight)
    keeps its class: its instance attributes are its parts, which its state dict entry brings."""
    load = example.load
    if not load.swap or swap_refused_by_torch(example) or _has_uninitialized(example):
        return False
    return any(p.grad is not None or (not is_traceable_wrapper_subclass(p)
                                      and _identity_lost(p, assign=False))
               for p in _params(example))


def uninitialized_refused(example: Any) -> bool:
    """torch's assign and swap paths raise on an uninitialized parameter given itself."""
    return (example.load.assign or example.load.swap) and _has_uninitialized(example)


def load_step(example: Any) -> bool:
    """A sequence's ``load_state_dict`` step (its example carries the step's name)."""
    return getattr(example, "step", "") == "load_state_dict"


def step_swap_loses_identity(example: Any) -> bool:
    return load_step(example) and swap_loses_identity(example)


def _given_buffer_slots_holding_parameters(example: Any) -> bool:
    """A key the load writes (given, not one of its bad keys) names a buffer slot that holds
    a ``Parameter``, with ``assign=True`` and no swap flag."""
    load = example.load
    if not load.assign or load.swap:
        return False
    for prefix, m in example.module.named_modules(remove_duplicate=False):
        for key, t in m._buffers.items():
            name = f"{prefix}.{key}" if prefix else key
            if isinstance(t, nn.Parameter) and name in load.state_dict and name not in load.bad_keys:
                return True
    return False


def assign_moves_buffer_to_parameters(example: Any) -> bool:
    """``assign=True`` without swap, with a key given for a buffer slot that holds a
    ``Parameter``: torch wraps the value as a ``Parameter`` (the slot's current object is one)
    and ``setattr`` registers it as a parameter, so the buffer slot becomes a parameter slot."""
    return not spec_fails(example) and _given_buffer_slots_holding_parameters(example)


def assign_moves_buffer_before_failing(example: Any) -> bool:
    """``assign_moves_buffer_to_parameters`` on a load that fails for another key: torch
    writes every key it can before it raises (``writes_before_failing``)."""
    return spec_fails(example) and _given_buffer_slots_holding_parameters(example)


def step_assign_moves_buffer_to_parameters(example: Any) -> bool:
    return load_step(example) and assign_moves_buffer_to_parameters(example)


def step_assign_splits_ties(example: Any) -> bool:
    return load_step(example) and assign_splits_ties(example)


def step_assign_replaces_own_data(example: Any) -> bool:
    return load_step(example) and assign_replaces_own_data(example)


def step_writes_before_failing(example: Any) -> bool:
    return load_step(example) and not example.load.is_valid and writes_before_failing(example)


def step_swaps_with_graph_grads(example: Any) -> bool:
    """A load step under the swap flag while some parameter's grad carries an autograd graph
    (an earlier ``backward(create_graph=True)``): that graph can hold a parameter, which
    ``swap_tensors`` refuses, after torch has swapped the keys before it."""
    return load_step(example) and example.load.swap and any(
        p.grad is not None and p.grad.grad_fn is not None for p in _params(example))

