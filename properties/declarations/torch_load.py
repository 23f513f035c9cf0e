"""Declared deviations of torch's ``nn.Module.load_state_dict`` from the ``LOAD-`` rules.

Each was observed with the suite and reduced to a minimal plain-torch repro (in ``reason``).
The predicates model torch's own decisions from the module and the drawn state dict before
the call: which keys it writes, in which order, and what each path puts in a slot.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties import vocabulary
from swapspec.properties.models.apply_state import _swappable
from swapspec.properties.models.examples import named_tensors
from swapspec.properties.models.load_examples import (
    conflicting_groups,
    equal_values,
    expected_load_paths,
    fits,
    key_model,
    loaded_values,
)
from swapspec.properties.vocabulary import Deviation
from swapspec.strategies import tree_info

# the SEQ-STATE clauses a load step that writes or swaps what the spec keeps breaks
STEP_STATE_CLAUSES = ("value", "object-changed", "class", "attributes", "requires-grad",
                      "grad-lost", "grad-value")
# Ranges from the oracle matrix (docs/oracle-matrix.md, "The load_state_dict and sequence matrix").
# Observed on every release it ran, 2.4.0 to 2.14.1:
TORCH_ALL = (None, None)
# Observed on 2.4.0, 2.8.0 and 2.9.0; the repro raises the size mismatch on 2.10.0 and later
# (pytorch #165873):
TORCH_SCALAR_INDEXED = (None, "2.10")
# The two sequence-step declarations no example of the matrix showed (seen on 2.13.0 in CI runs):
TORCH_SEEN = ("2.9.0", None)
# Declarations that came after the load matrix (the reference's rules 6 and 9 of 5c15658),
# their repros checked on 2.13.0 only: a run of the matrix sets their lower bounds.
TORCH_CHECKED = ("2.13.0", None)

# ---- facts about torch's load_state_dict --------------------------------------------------


def _own(example: Any) -> dict[str, Any]:
    return example.module.state_dict(keep_vars=True)


def _written(example: Any) -> list[tuple[str, Tensor, Any]]:
    """(key, slot, value) for every key torch writes: a tensor-like value that fits its slot."""
    own, given = _own(example), example.load.state_dict
    return [(k, own[k], v) for k, v in given.items()
            if isinstance(own.get(k), Tensor) and fits(own[k], v)]


def torch_refused(example: Any) -> set[int]:
    """Ids of the module's parameters and buffers ``swap_tensors`` refuses now, probed on a
    fresh build of the tree (the build replays its training): an old-style reparametrization's
    computed attribute whose autograd graph still holds them (weight_norm's ``_g``/``_v``,
    spectral_norm's and prune's ``_orig``, prune's mask; a ``backward()`` frees it), or a
    grad's graph. A module the tree builder did not build (a sequence's deep copy) has no
    fresh build to probe: nothing counts as refused. Cached on the example."""
    cached = example.__dict__.get("_torch_refused")
    if cached is None:
        cached = example.__dict__["_torch_refused"] = _probe_refused(example.module)
    return cached


def _probe_refused(module: nn.Module) -> set[int]:
    """A tensor where the fresh build has it on the same device is probed on the build; one the
    module has since moved (``XLA-LOAD-INTO`` moves it to XLA; the build's autograd state says
    nothing about it then) is probed in place, swapped with a copy and straight back."""
    try:
        info = tree_info(module)
    except KeyError:  # not built by strategies.build_tree
        return set()
    if info is None:
        return set()
    copy = info.build()  # kept alive: its computed attributes hold the graphs that refuse
    built = named_tensors(copy)
    refused = set()
    for name, t in named_tensors(module).items():
        if is_lazy(t):
            continue
        probe = built.get(name)
        if probe is None:
            continue
        if not _swappable_now(probe if probe.device == t.device else t):
            refused.add(id(t))
    return refused


def _swappable_now(t: Tensor) -> bool:
    """Whether ``swap_tensors`` takes ``t`` (swapped with a copy and straight back)."""
    if isinstance(t, nn.Parameter):
        return _swappable(t)
    probe = t.detach().clone()
    try:
        torch.utils.swap_tensors(t, probe)
    except RuntimeError:
        return False
    torch.utils.swap_tensors(t, probe)
    return True


def spec_fails(example: Any) -> bool:
    """The spec's load of the example fails (a bad value, a conflict, or strict and bad keys)."""
    return key_model(example.module, example.load.state_dict).fails(example.load.strict)


def swap_refused_by_torch(example: Any) -> bool:
    """Under the swap flag, torch refuses a written parameter an old-style reparametrization holds."""
    if not example.load.swap:
        return False
    refused = torch_refused(example)
    return any(id(slot) in refused for _, slot, _ in _written(example))


def refused_on_a_succeeding_load(example: Any) -> bool:
    """The load would succeed, but torch refuses a swap (``swap_refused_by_torch``) of a
    parameter that is not an RNN's (those are ``rnn_swap_refused``)."""
    if not example.load.swap or spec_fails(example):
        return False
    refused, rnn = torch_refused(example), _rnn_parameters(example)
    return any(id(slot) in refused and id(slot) not in rnn for _, slot, _ in _written(example))


def rnn_swap_refused(example: Any) -> bool:
    """Under the swap flag torch refuses every written parameter of an RNN (``nn.RNNBase``:
    RNN, LSTM, GRU): the module keeps weak references to them (``_flat_weight_refs``), which
    ``swap_tensors`` refuses; the spec drops them for the load (rule 9)."""
    if not example.load.swap:
        return False
    rnn = _rnn_parameters(example)
    return any(id(slot) in rnn for _, slot, _ in _written(example))


def _rnn_parameters(example: Any) -> set[int]:
    return {id(p) for m in example.module.modules() if isinstance(m, nn.RNNBase)
            for p in m._parameters.values() if p is not None}


def refused_with_conflict(example: Any) -> bool:
    """Tied names given different values, and torch raises for a refused swap after writing."""
    return (swap_refused_by_torch(example) and bool(conflicting_groups(
        example.module, example.load.state_dict)) and writes_before_failing(example))


def writes_before_failing(example: Any) -> bool:
    """torch writes every fitting key even when the load then raises, and some write shows:
    a swap (a new TensorImpl; if torch refuses it, the values ``module_load`` copied in first,
    without ``assign``), an
    assign (a new object in the slot), or copies that leave other values (``_copies_show``)."""
    load = example.load
    if not spec_fails(example):
        return False
    refused = torch_refused(example) if load.swap else set()
    for _, slot, value in _written(example):
        if load.swap and (id(slot) not in refused
                          or (not load.assign and not _copy_keeps(slot, value))):
            return True  # a refused swap still shows module_load's copy_ (not with assign)
        if not load.swap and load.assign and value is not slot:
            return True
    return not load.swap and not load.assign and _copies_show(example)


def _copies_show(example: Any) -> bool:
    """On the copy path each slot object ends with the last value copied into it that is not
    an alias of it (copying an alias copies what the slot holds by then); it shows when that
    value differs from the slot's own."""
    finals: dict[int, tuple[Tensor, Any]] = {}
    for _, slot, value in _written(example):
        if not _aliases(value, slot):
            finals[id(slot)] = (slot, value)
    return any(not _copy_keeps(slot, value) for slot, value in finals.values())


def _aliases(value: Any, slot: Tensor) -> bool:
    return (isinstance(value, Tensor) and value.device == slot.device and not is_lazy(slot)
            and bool(torch._C._is_alias_of(value, slot)))


def vectors_for_scalars(example: Any) -> list[str]:
    """Keys whose slot is 0-dim and whose value is 1-dim of length 2 or more: torch before
    pytorch #165873's fix loads ``value[0]`` into the slot instead of reporting a size mismatch."""
    own, given = _own(example), example.load.state_dict
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
    own = _own(example)
    return only_these or load.swap or load.assign or any(
        not _copy_keeps(own[k], load.state_dict[k][0]) for k in keys)


def _copy_keeps(slot: Tensor, value: Tensor) -> bool:
    """``slot.copy_(value)`` leaves the slot's values as they are."""
    if slot.is_meta or value.is_meta:
        return True
    cast = value.detach().to(dtype=slot.dtype, device=slot.device)
    return equal_values(slot.detach().cpu(), cast.cpu())


def _conflict_only(example: Any) -> bool:
    model = key_model(example.module, example.load.state_dict)
    others = model.bad_values or (example.load.strict and (model.missing or model.unexpected))
    return bool(model.conflicts) and not others and not swap_refused_by_torch(example)


def _conflict_and_other_error(example: Any) -> bool:
    model = key_model(example.module, example.load.state_dict)
    return bool(model.conflicts) and model.fails(example.load.strict) and not _conflict_only(example)


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
    given, swaps = load.state_dict, _swap_counts(example)
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
        if any(given[k] is not slot for k in same_slot):
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
    for key, slot, value in _written(example):
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
    finals = {_slot_of(module, key): value for key, _, value in _written(example)}
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
        n > 1 for n in _swap_counts(example).values())


def _swap_counts(example: Any) -> dict[int, int]:
    """Under the swap flag: id of each slot object -> how many keys torch swaps into it."""
    counts: dict[int, int] = {}
    if example.load.swap:
        for _, slot, _ in _written(example):
            counts[id(slot)] = counts.get(id(slot), 0) + 1
    return counts


def _tensor_slots(example: Any) -> list[Tensor]:
    return [t for t in _own(example).values() if isinstance(t, Tensor)]


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
    subclass's class (without ``assign``), instance attributes, grad and hooks are lost."""
    load = example.load
    if not load.swap or swap_refused_by_torch(example):
        return False
    return any(_hookable(p) or p.grad is not None or p.__dict__
               or (not load.assign and type(p) is not nn.Parameter) for p in _params(example))


def swap_drops_written_identity(example: Any) -> bool:
    """``swap_loses_identity`` for the parameters torch writes (the check of the XLA-LOAD-
    properties, which sets no hooks): a grad, instance attributes, or (without ``assign``) a
    Parameter subclass."""
    load = example.load
    if not load.swap or swap_refused_by_torch(example) or spec_fails(example):
        return False
    written = {id(slot): slot for _, slot, _ in _written(example) if isinstance(slot, nn.Parameter)}
    return any(p.grad is not None or p.__dict__ or (not load.assign and type(p) is not nn.Parameter)
               for p in written.values())


def round_trip_swap_loses_identity(example: Any) -> bool:
    load = example.load
    if not load.swap or swap_refused_by_torch(example) or _has_uninitialized(example):
        return False
    return any(p.grad is not None or p.__dict__ or type(p) is not nn.Parameter
               for p in _params(example))


def uninitialized_refused(example: Any) -> bool:
    """torch's assign and swap paths raise on an uninitialized parameter given itself."""
    return (example.load.assign or example.load.swap) and _has_uninitialized(example)


def load_step(example: Any) -> bool:
    """A sequence's ``load_state_dict`` step (its example carries the step's name)."""
    return getattr(example, "step", "") == "load_state_dict"


def step_swap_loses_identity(example: Any) -> bool:
    return load_step(example) and swap_loses_identity(example)


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


# ---- declarations ---------------------------------------------------------------------------

CROSS_DEVICE = ("XLA-LOAD-INTO", "XLA-LOAD-FROM")  # the LOAD- rules across devices (test_xla.py)
SUCCEEDING = ("LOAD-PATH", "LOAD-VALUES", "LOAD-KEYS", "LOAD-IDENTITY", "LOAD-TIES",
              "LOAD-ROUND-TRIP", *CROSS_DEVICE)

LOAD_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        SUCCEEDING, refused_on_a_succeeding_load, "raised",
        "Under the swap flag torch refuses parameters of old-style reparametrizations: the "
        "computed attribute's autograd graph holds them, and swap_tensors sees a use count of 3 "
        "(the reference drops the attribute for the load and computes it again, as apply does).\n"
        "m = torch.nn.utils.weight_norm(torch.nn.Linear(2, 2))\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(m.state_dict())  # RuntimeError: ... Expected use_count of t1 to be 1 "
        "or 2 ... got 3",
        TORCH_ALL),
    Deviation(
        SUCCEEDING, lambda e: rnn_swap_refused(e) and not spec_fails(e), "raised",
        "Under the swap flag torch refuses every parameter of an RNN (RNN, LSTM, GRU): the "
        "module keeps weak references to them (_flat_weight_refs) and swap_tensors refuses a "
        "tensor with a weakref (the reference drops them for the load and rebuilds "
        "_flat_weights after, as apply does). No LOAD- property draws the swap flag for a "
        "module swap_tensors refuses where the load succeeds (strategies' swap_refused); this "
        "names the deviation where one does. Checked on torch 2.13.0.\n"
        "m = torch.nn.LSTM(3, 4)\n"
        "sd = {k: v + 1 for k, v in m.state_dict().items()}\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(sd)  # RuntimeError: ... Cannot swap t1 because it has weakref "
        "associated with it",
        TORCH_CHECKED),
    Deviation(
        ("LOAD-ATOMIC", *CROSS_DEVICE), scalar_takes_first_element, ("raised-none", "changed"),
        "torch before pytorch #165873's fix indexes any 1-dim value given for a 0-dim slot "
        "(value[0]) instead of only a (1,)-shaped one, so a wrong-shaped value loads its first "
        "element: no size mismatch is reported, and a load failing for another key still writes "
        "it. Seen on torch 2.9.0; torch 2.13.0 raises the size mismatch.\n"
        "m = torch.nn.Module(); m.register_buffer('b', torch.tensor(0.5))\n"
        "m.load_state_dict({'b': torch.zeros(2)})  # no error\n"
        "assert m.b.item() == 0.0",
        TORCH_SCALAR_INDEXED),
    Deviation(
        "LOAD-KEYS", lambda e: bool(vectors_for_scalars(e)), ("raised-none", "message"),
        "The 0-dim slot given a longer 1-dim value (see the LOAD-ATOMIC deviation of torch "
        "before pytorch #165873's fix): torch reports no size mismatch for it, so the load does "
        "not raise, or raises without naming that key.\n"
        "m = torch.nn.Module(); m.register_buffer('b', torch.tensor(0.5))\n"
        "m.load_state_dict({'b': torch.zeros(2), 'extra': torch.zeros(1)})\n"
        "# RuntimeError naming only the unexpected key 'extra'",
        TORCH_SCALAR_INDEXED),
    Deviation(
        ("LOAD-ATOMIC", *CROSS_DEVICE), writes_before_failing, "changed",
        "torch loads key by key and only raises at the end, so every key it could load stays "
        "loaded when another key fails.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "sd = {k: v + 1 for k, v in m.state_dict().items()}; sd['1.bias'] = torch.zeros(5)\n"
        "w = m[0].weight.clone()\n"
        "try: m.load_state_dict(sd)\n"
        "except RuntimeError: pass\n"
        "assert not torch.equal(m[0].weight, w)  # half-loaded",
        TORCH_ALL),
    Deviation(
        "LOAD-TIES", refused_with_conflict, "changed",
        "A load with tied names given different values that torch refuses for a refused swap "
        "(see the 'raised' deviation) leaves the keys it wrote before written (see LOAD-ATOMIC).\n"
        "m = torch.nn.utils.weight_norm(torch.nn.Linear(2, 2)); m.register_buffer('s', torch.ones(2))\n"
        "m.register_buffer('t', m.s)\n"
        "sd = m.state_dict(); sd['s'] = torch.zeros(2); sd['bias'] = sd['bias'] + 1\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(sd)  # RuntimeError (weight_g), and bias, s are loaded",
        TORCH_ALL),
    Deviation(
        ("LOAD-TIES", "LOAD-ATOMIC", "LOAD-KEYS", *CROSS_DEVICE), _conflict_only,
        ("conflict-accepted", "raised-none"),
        "torch loads tied names given different values one after the other: the last one wins, "
        "silently.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight\n"
        "sd = m.state_dict(); sd['0.weight'] = torch.zeros(2, 2); sd['1.weight'] = torch.ones(2, 2)\n"
        "m.load_state_dict(sd)  # no error\n"
        "assert torch.equal(m[0].weight, torch.ones(2, 2))",
        TORCH_ALL),
    Deviation(
        "LOAD-KEYS", _conflict_and_other_error, "message",
        "torch's error message never names tied names given different values (it does not see "
        "them); the reference adds 'While loading the tied names ...'.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight\n"
        "sd = m.state_dict(); sd['0.weight'] = torch.zeros(2, 2); sd['1.weight'] = torch.ones(2, 2)\n"
        "sd['1.bias'] = torch.zeros(3)\n"
        "m.load_state_dict(sd)  # RuntimeError naming only the size mismatch of 1.bias",
        TORCH_ALL),
    Deviation(
        ("LOAD-TIES", *CROSS_DEVICE), assign_splits_ties, "tie-split",
        "With assign=True (swap flag off) torch setattr's Parameter(value) into each slot, one "
        "new object per key, so tied parameters come apart.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight\n"
        "m.load_state_dict(m.state_dict(), assign=True)\n"
        "assert m[0].weight is not m[1].weight",
        TORCH_ALL),
    Deviation(
        "LOAD-TIES", assign_keeps_tied_own_data, "tie-value",
        "With assign=True torch writes every key of a tied object in turn, a key giving the "
        "object's own data too: under the swap flag the object ends with the last key's value "
        "(but for the object itself, which holds what the last swap put in), so state_dict()'s "
        "alias given after another value puts the old values back; "
        "without it each slot ends with the last value written into it (the ties split), so the "
        "slot of the own-data key, in either order, and a tied slot no key writes (a "
        "non-persistent buffer) keep the old values. The spec lets own data yield "
        "to the other value. Copy and swap without assign agree (the alias shares the slot's "
        "storage). Checked on torch 2.13.0.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight; w = m[0].weight.detach().clone()\n"
        "sd = m.state_dict(); sd['0.weight'] = torch.zeros(2, 2)  # '1.weight': own data, last\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(sd, assign=True)\n"
        "assert torch.equal(m[0].weight, w)  # the old values, not zeros",
        TORCH_CHECKED),
    Deviation(
        "LOAD-PATH", assign_keeps_a_slot_given_itself, "path-assign",
        "With assign=True (swap flag off) torch writes each key into its own slot, so a slot "
        "given the very parameter it holds keeps it, while a tied name given another value gets "
        "Parameter(value): the spec lets the own data yield and assigns the other value to the "
        "object, in every slot. Checked on torch 2.13.0.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight; w = m[0].weight\n"
        "sd = m.state_dict(); sd['0.weight'] = w; sd['1.weight'] = w.detach().clone()\n"
        "m.load_state_dict(sd, assign=True)\n"
        "assert m[0].weight is w  # the spec puts Parameter(sd['1.weight']) in both slots",
        TORCH_CHECKED),
    Deviation(
        "LOAD-PATH", assign_replaces_own_data, "path-kept",
        "With assign=True torch replaces a slot given its own data (state_dict()'s detached "
        "alias): a new Parameter without the swap flag (an optimizer loses it), a swapped-in "
        "TensorImpl with it.\n"
        "m = torch.nn.Linear(2, 2); w = m.weight\n"
        "m.load_state_dict(m.state_dict(), assign=True)\n"
        "assert m.weight is not w",
        TORCH_ALL),
    Deviation(
        ("LOAD-PATH", *CROSS_DEVICE), swapped_twice, ("path-swap", "path-kept"), always=False,
        reason=
        "Under the swap flag torch swaps a tensor reached by two keys twice; the TensorImpl the "
        "first swap freed can be reused by the second, so the tensor ends with its old "
        "_cdata or not (allocator-dependent): a swap that looks like none, and with "
        "assign=True its own data that looks kept or replaced.\n"
        "m = torch.nn.BatchNorm1d(2); m.running_var = m.running_mean\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "c = m.running_mean._cdata; m.load_state_dict(m.state_dict(), assign=True)\n"
        "print(m.running_mean._cdata == c)  # True or False, by the allocator",
        torch_versions=TORCH_ALL),
    Deviation(
        "LOAD-ROUND-TRIP", round_trip_assign_replaces, "changed",
        "Loading state_dict() back with assign=True (swap flag off) puts new objects in every "
        "slot: Parameter(detached alias) for parameters, the alias itself for buffers.\n"
        "m = torch.nn.BatchNorm1d(2); w, mean = m.weight, m.running_mean\n"
        "m.load_state_dict(m.state_dict(), assign=True)\n"
        "assert m.weight is not w and m.running_mean is not mean",
        TORCH_ALL),
    Deviation(
        "LOAD-IDENTITY", swap_loses_identity, ("class", "attributes", "grad", "tensor-hooks"),
        "On the swap path swap_tensors swaps __class__, __dict__ and the TensorImpl (with its "
        "autograd meta) with a fresh Parameter(module_load(...)): a Parameter subclass becomes "
        "Parameter, instance attributes, the grad and register_hook hooks are gone.\n"
        "class P(torch.nn.Parameter): pass\n"
        "m = torch.nn.Linear(2, 2); m.weight = P(m.weight.detach()); m.weight.tag = 1\n"
        "m(torch.ones(1, 2)).sum().backward(); m.weight.register_hook(print)\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(m.state_dict())\n"
        "assert type(m.weight) is torch.nn.Parameter and m.weight.grad is None\n"
        "assert not hasattr(m.weight, 'tag')",
        TORCH_ALL),
    Deviation(
        CROSS_DEVICE, swap_drops_written_identity, ("class", "attributes", "grad"),
        "Across devices as on one (see the LOAD-IDENTITY deviation): on the swap path "
        "swap_tensors swaps __class__, __dict__ and the autograd meta with a fresh Parameter, so "
        "a Parameter subclass, instance attributes and the grad are lost.\n"
        "Repro (PJRT_DEVICE=CPU; import torch, torch_xla):\n"
        "m = torch.nn.Linear(2, 2); m(torch.ones(1, 2)).sum().backward(); m.weight.tag = 1\n"
        "sd = {k: v.to(torch_xla.device()) for k, v in m.state_dict().items()}\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(sd)\n"
        "assert m.weight.grad is None and not hasattr(m.weight, 'tag')",
        TORCH_ALL),
    Deviation(
        "LOAD-ROUND-TRIP", round_trip_swap_loses_identity, "changed",
        "Loading state_dict() back under the swap flag loses a Parameter subclass's class, its "
        "instance attributes and the grad (see the LOAD-IDENTITY deviation).\n"
        "m = torch.nn.Linear(2, 2); m(torch.ones(1, 2)).sum().backward()\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(m.state_dict())\n"
        "assert m.weight.grad is None",
        TORCH_ALL),
    Deviation(
        "LOAD-ROUND-TRIP", uninitialized_refused, "raised",
        "torch's assign and swap paths raise on an uninitialized (lazy) parameter given its own "
        "state dict entry (Parameter() and module_load touch the uninitialized data).\n"
        "m = torch.nn.LazyLinear(2)\n"
        "m.load_state_dict(m.state_dict(), assign=True)  # RuntimeError: ... uninitialized",
        TORCH_ALL),
    # The same behaviours at a sequence's load step, under the SEQ- clause names: the one-shot
    # declarations above are matched there too, but name their own clauses.
    Deviation(
        vocabulary.SEQUENCES, step_swap_loses_identity,
        ("class", "attributes", "grad-lost", "grad-value"), always=False, reason=
        "At a sequence's load step under the swap flag torch loses a Parameter subclass's class, "
        "its instance attributes, its grad and its hooks (the LOAD-IDENTITY deviation). "
        "Seen on torch 2.13.\n"
        "m = torch.nn.Linear(2, 2); m(torch.ones(1, 2)).sum().backward()\n"
        "sd = {k: v + 1 for k, v in m.state_dict().items()}\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(sd)\n"
        "assert m.weight.grad is not None  # fails",
        torch_versions=TORCH_ALL),
    Deviation(
        vocabulary.SEQUENCES, step_assign_splits_ties, ("parameter-tie-split", "buffer-tie-split"),
        always=False, reason=
        "At a sequence's load step with assign=True (swap flag off) torch puts one new object "
        "per key, so tied slots come apart (the LOAD-TIES deviation). Seen on torch 2.13.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight\n"
        "sd = {k: v + 1 for k, v in m.state_dict().items()}\n"
        "m.load_state_dict(sd, assign=True)\n"
        "assert m[0].weight is m[1].weight  # fails",
        torch_versions=TORCH_SEEN),
    Deviation(
        vocabulary.SEQUENCES, step_assign_replaces_own_data,
        ("object-changed", "class", "attributes", "grad-lost", "grad-value"), always=False,
        reason=
        "At a sequence's load step of the module's own state_dict() with assign=True torch "
        "replaces the slot (a new Parameter without grad, attributes or hooks; with the swap "
        "flag a swapped-in TensorImpl) where the spec leaves it as it is (the LOAD-PATH "
        "deviation). Seen on torch 2.13.\n"
        "m = torch.nn.Linear(2, 2); w = m.weight\n"
        "m.load_state_dict(m.state_dict(), assign=True)\n"
        "assert m.weight is w  # fails",
        torch_versions=TORCH_ALL),
    Deviation(
        vocabulary.SEQUENCES, step_writes_before_failing,
        (*STEP_STATE_CLAUSES, "parameter-tie-split", "buffer-tie-split"), always=False, reason=
        "At a sequence's load step where one key has a wrong shape, torch loads every other "
        "key before it raises (the LOAD-ATOMIC deviation). Seen on torch 2.13.\n"
        "m = torch.nn.Linear(2, 2); w = m.weight.clone()\n"
        "sd = {k: v + 1 for k, v in m.state_dict().items()}; sd['bias'] = torch.zeros(2, 2)\n"
        "try: m.load_state_dict(sd)\n"
        "except RuntimeError: pass\n"
        "assert torch.equal(m.weight, w)  # fails",
        torch_versions=TORCH_ALL),
    Deviation(
        vocabulary.SEQUENCES, step_swaps_with_graph_grads,
        STEP_STATE_CLAUSES, always=False, reason=
        "At a sequence's load step under the swap flag after backward(create_graph=True), the "
        "grads' graph holds a parameter, swap_tensors refuses it, and torch has already swapped "
        "the keys before it (values loaded, grads lost): the load raises half done (the "
        "reference refuses and undoes everything). Seen on torch 2.13.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "(m(torch.ones(1, 2)) ** 2).sum().backward(create_graph=True)\n"
        "sd = {k: v + 1 for k, v in m.state_dict().items()}; b = m[1].bias.clone()\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "try: m.load_state_dict(sd)  # RuntimeError: While swapping the parameter named ...\n"
        "except RuntimeError: pass\n"
        "assert torch.equal(m[1].bias, b)  # fails",
        torch_versions=TORCH_SEEN),
)
