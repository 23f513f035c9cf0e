"""Facts about torch's ``nn.Module.load_state_dict`` when a load fails or is refused: which keys it
writes, which swaps it refuses, and what a load that raises has already written.

Predicates of one example (its module and drawn state dict, before the call), read by the ``LOAD-``
declarations (``declarations.torch_load``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy

from swapspec.properties.models.apply_state import swap_tensors_takes
from swapspec.properties.models.examples import named_tensors
from swapspec.properties.models.load_examples import (
    as_loaded,
    conflicting_groups,
    equal_values,
    fits,
    key_model,
    norm_defaults,
)


def own_state(example: Any) -> dict[str, Any]:
    """The module's state dict holding its own tensors (``keep_vars=True``)."""
    return example.module.state_dict(keep_vars=True)


def torch_writes(example: Any) -> list[tuple[str, Tensor, Any]]:
    """(key, slot, value) for every key torch writes: a tensor-like value that fits its slot, as
    torch writes it (``as_loaded``: a ``(1,)`` value's element into a 0-dim slot), and the
    ``num_batches_tracked`` a norm layer fills in for itself (``norm_defaults``)."""
    own, given = own_state(example), example.load.state_dict
    return [*((k, own[k], as_loaded(own[k], v)) for k, v in given.items()
              if isinstance(own.get(k), Tensor) and fits(own[k], v)),
            *norm_defaults(example.module, given)]


def torch_refused(example: Any) -> set[int]:
    """Ids of the module's parameters and buffers ``swap_tensors`` refuses now, read on the
    module as it is (``swap_tensors_takes``: its own checks, no swap): a weak reference to it
    (an RNN's ``_flat_weight_refs``), or its TensorImpl held by something other than its object
    and its own AccumulateGrad node (an old-style reparametrization's computed attribute whose
    autograd graph holds ``_g``/``_v`` or ``_orig``, a grad's graph). Cached on the example."""
    cached = example.__dict__.get("_torch_refused")
    if cached is None:
        cached = example.__dict__["_torch_refused"] = {
            id(t) for t in named_tensors(example.module).values()
            if not is_lazy(t) and not swap_tensors_takes(t)}
    return cached


def spec_fails(example: Any) -> bool:
    """The spec's load of the example fails (a bad value, a conflict, or strict and bad keys)."""
    return key_model(example.module, example.load.state_dict).fails(example.load.strict)


def swap_refused_by_torch(example: Any) -> bool:
    """Under the swap flag, torch refuses a written parameter an old-style reparametrization holds."""
    if not example.load.swap:
        return False
    refused = torch_refused(example)
    return any(id(slot) in refused for _, slot, _ in torch_writes(example))


def refused_on_a_succeeding_load(example: Any) -> bool:
    """The load would succeed, but torch refuses a swap (``swap_refused_by_torch``) of a
    parameter that is not an RNN's (those are ``rnn_swap_refused``)."""
    if not example.load.swap or spec_fails(example):
        return False
    refused, rnn = torch_refused(example), _rnn_parameters(example)
    return any(id(slot) in refused and id(slot) not in rnn for _, slot, _ in torch_writes(example))


def rnn_swap_refused(example: Any) -> bool:
    """Under the swap flag torch refuses every written parameter of an RNN (``nn.RNNBase``:
    RNN, LSTM, GRU): the module keeps weak references to them (``_flat_weight_refs``), which
    ``swap_tensors`` refuses; the spec drops them for the load (rule 9)."""
    if not example.load.swap:
        return False
    rnn = _rnn_parameters(example)
    return any(id(slot) in rnn for _, slot, _ in torch_writes(example))


def _rnn_parameters(example: Any) -> set[int]:
    return {id(p) for m in example.module.modules() if isinstance(m, nn.RNNBase)
            for p in m._parameters.values() if p is not None}


def refused_with_conflict(example: Any) -> bool:
    """Tied names given different values, and torch raises for a refused swap after writing."""
    return (swap_refused_by_torch(example) and bool(conflicting_groups(
        example.module, example.load.state_dict)) and writes_before_failing(example))


def writes_before_failing(example: Any) -> bool:
    """torch writes every fitting key even when the load then raises, and some write shows:
    a swap (a new TensorImpl, certain only for a slot swapped once: ``swaps_twice_before_failing``;
    if torch refuses it, the values ``module_load`` copied in first, without ``assign``), an
    assign (a new object in the slot), or copies that leave other values (``_copies_show``)."""
    load = example.load
    if not spec_fails(example):
        return False
    if load.swap:
        return _swaps_show(example)
    if load.assign:
        return any(value is not slot for _, slot, value in torch_writes(example))
    return _copies_show(example)


def _swaps_show(example: Any) -> bool:
    """Under the swap flag, some write shows for certain: new values, a refused swap's copied
    values (without ``assign``), or the new TensorImpl of a slot swapped once."""
    refused, swaps, assign = torch_refused(example), swap_counts(example), example.load.assign
    for _, slot, value in torch_writes(example):
        if id(slot) in refused:
            if not assign and not _copy_keeps(slot, value):
                return True  # a refused swap still shows module_load's copy_
        elif swaps[id(slot)] == 1 or not _swap_keeps(slot, value, assign):
            return True
    return False


def _swap_keeps(slot: Tensor, value: Any, assign: bool) -> bool:
    """A swap of ``value`` into ``slot`` leaves its dtype, shape, device and values as they are:
    ``module_load`` copies ``value`` into the slot's data, or with ``assign`` hands ``value``
    itself in."""
    if not assign:
        return _copy_keeps(slot, value)
    return value is slot or ((value.dtype, value.shape, value.device)
                             == (slot.dtype, slot.shape, slot.device) and _copy_keeps(slot, value))


def swaps_twice_before_failing(example: Any) -> bool:
    """A load that fails swaps some slot twice or more (tied names, a shared submodule's paths)
    and no write shows for certain (``writes_before_failing``): each swap frees a TensorImpl
    whose address the next one may take, so the slot can end at the ``_cdata`` it started with."""
    return (example.load.swap and spec_fails(example) and not writes_before_failing(example)
            and any(n > 1 for n in swap_counts(example).values()))


def swap_counts(example: Any) -> dict[int, int]:
    """Under the swap flag: id of each slot object -> how many keys torch swaps into it."""
    counts: dict[int, int] = {}
    if example.load.swap:
        for _, slot, _ in torch_writes(example):
            counts[id(slot)] = counts.get(id(slot), 0) + 1
    return counts


def _copies_show(example: Any) -> bool:
    """On the copy path each slot object ends with the last value copied into it that is not
    an alias of it (copying an alias copies what the slot holds by then); it shows when that
    value differs from the slot's own."""
    finals: dict[int, tuple[Tensor, Any]] = {}
    for _, slot, value in torch_writes(example):
        if not _aliases(value, slot):
            finals[id(slot)] = (slot, value)
    return any(not _copy_keeps(slot, value) for slot, value in finals.values())


def _aliases(value: Any, slot: Tensor) -> bool:
    return (isinstance(value, Tensor) and value.device == slot.device and not is_lazy(slot)
            and bool(torch._C._is_alias_of(value, slot)))


def vectors_for_scalars(example: Any) -> list[str]:
    """Keys whose slot is 0-dim and whose value is 1-dim of length 2 or more: torch before
    pytorch #165873's fix loads ``value[0]`` into the slot instead of reporting a size mismatch."""
    own, given = own_state(example), example.load.state_dict
    return [k for k, v in given.items() if isinstance(own.get(k), Tensor) and not is_lazy(own[k])
            and own[k].dim() == 0 and torch.overrides.is_tensor_like(v) and v.dim() == 1
            and v.shape[0] >= 2]


def scalar_takes_first_element(example: Any) -> bool:
    """Such a key (``vectors_for_scalars``) was the load's only failure, so torch does not
    raise, or torch's write of ``value[0]`` shows (another object, another TensorImpl, or
    other values)."""
    keys = vectors_for_scalars(example)
    if not keys:
        return False
    load = example.load
    model = key_model(example.module, load.state_dict)
    only_these = (set(model.bad_values) <= set(keys) and not model.conflicts
                  and not (load.strict and (model.missing or model.unexpected)))
    own = own_state(example)
    return only_these or load.swap or load.assign or any(
        not _copy_keeps(own[k], load.state_dict[k][0]) for k in keys)


def _copy_keeps(slot: Tensor, value: Tensor) -> bool:
    """``slot.copy_(value)`` leaves the slot's values as they are."""
    if slot.is_meta or value.is_meta:
        return True
    cast = value.detach().to(dtype=slot.dtype, device=slot.device)
    return equal_values(slot.detach().cpu(), cast.cpu())


def conflict_only(example: Any) -> bool:
    """Tied names given different values are the load's only failure (and no swap is refused)."""
    model = key_model(example.module, example.load.state_dict)
    others = model.bad_values or (example.load.strict and (model.missing or model.unexpected))
    return bool(model.conflicts) and not others and not swap_refused_by_torch(example)


def conflict_and_other_error(example: Any) -> bool:
    """Tied names given different values, and the load fails for another reason too."""
    model = key_model(example.module, example.load.state_dict)
    return bool(model.conflicts) and model.fails(example.load.strict) and not conflict_only(example)

