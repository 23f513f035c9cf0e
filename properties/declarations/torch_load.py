"""Declared deviations of torch's ``nn.Module.load_state_dict`` from the ``LOAD-`` rules.

Each was observed with the suite and reduced to a minimal plain-torch repro (in ``reason``).
The predicates model torch's own decisions from the module and the drawn state dict before
the call: which keys it writes, in which order (``declarations.torch_load_failures``), and what
each path puts in a slot (``declarations.torch_load_objects``).
"""

from __future__ import annotations

from swapspec.properties import vocabulary
from swapspec.properties.declarations.torch_load_failures import (
    conflict_and_other_error,
    conflict_only,
    refused_on_a_succeeding_load,
    refused_with_conflict,
    rnn_swap_refused,
    scalar_takes_first_element,
    spec_fails,
    swaps_twice_before_failing,
    vectors_for_scalars,
    writes_before_failing,
)
from swapspec.properties.declarations.torch_load_objects import (
    assign_keeps_a_slot_given_itself,
    assign_keeps_tied_own_data,
    assign_moves_buffer_before_failing,
    assign_moves_buffer_to_parameters,
    assign_replaces_own_data,
    assign_splits_ties,
    round_trip_assign_replaces,
    round_trip_swap_loses_identity,
    step_assign_moves_buffer_to_parameters,
    step_assign_replaces_own_data,
    step_assign_splits_ties,
    step_swap_loses_identity,
    step_swaps_with_graph_grads,
    step_writes_before_failing,
    swap_drops_written_identity,
    swap_loses_identity,
    swapped_twice,
    uninitialized_refused,
)
from swapspec.properties.vocabulary import Deviation

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


# ---- declarations ---------------------------------------------------------------------------

CROSS_DEVICE = ("XLA-LOAD-INTO", "XLA-LOAD-FROM")  # the LOAD- rules across devices (test_xla.py)
SUCCEEDING = ("LOAD-PATH", "LOAD-VALUES", "LOAD-KEYS", "LOAD-IDENTITY", "LOAD-TIES",
              "LOAD-ROUND-TRIP", *CROSS_DEVICE)

LOAD_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        SUCCEEDING, refused_on_a_succeeding_load, ("raised", "INV-RAISE-UNCHANGED"),
        "Under the swap flag torch refuses parameters of old-style reparametrizations: the "
        "computed attribute's autograd graph holds them, and swap_tensors sees a use count of 3 "
        "(the reference drops the attribute for the load and computes it again, as apply does).\n"
        "m = torch.nn.utils.weight_norm(torch.nn.Linear(2, 2))\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(m.state_dict())  # RuntimeError: ... Expected use_count of t1 to be 1 "
        "or 2 ... got 3",
        TORCH_ALL, id="torch.load.refused-on-a-succeeding-load"),
    Deviation(
        SUCCEEDING, lambda e: rnn_swap_refused(e) and not spec_fails(e),
        ("raised", "INV-RAISE-UNCHANGED"),
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
        TORCH_CHECKED, id="torch.load.rnn-swap-refused"),
    Deviation(
        ("LOAD-ATOMIC", *CROSS_DEVICE), scalar_takes_first_element, ("raised-none", "changed"),
        "torch before pytorch #165873's fix indexes any 1-dim value given for a 0-dim slot "
        "(value[0]) instead of only a (1,)-shaped one, so a wrong-shaped value loads its first "
        "element: no size mismatch is reported, and a load failing for another key still writes "
        "it. Seen on torch 2.9.0; torch 2.13.0 raises the size mismatch.\n"
        "m = torch.nn.Module(); m.register_buffer('b', torch.tensor(0.5))\n"
        "m.load_state_dict({'b': torch.zeros(2)})  # no error\n"
        "assert m.b.item() == 0.0",
        TORCH_SCALAR_INDEXED, id="torch.load.scalar-takes-first-element"),
    Deviation(
        "LOAD-KEYS", lambda e: bool(vectors_for_scalars(e)), ("raised-none", "message"),
        "The 0-dim slot given a longer 1-dim value (see the LOAD-ATOMIC deviation of torch "
        "before pytorch #165873's fix): torch reports no size mismatch for it, so the load does "
        "not raise, or raises without naming that key.\n"
        "m = torch.nn.Module(); m.register_buffer('b', torch.tensor(0.5))\n"
        "m.load_state_dict({'b': torch.zeros(2), 'extra': torch.zeros(1)})\n"
        "# RuntimeError naming only the unexpected key 'extra'",
        TORCH_SCALAR_INDEXED, id="torch.load.vectors-for-scalars-message"),
    Deviation(
        ("LOAD-ATOMIC", *CROSS_DEVICE), writes_before_failing, ("changed", "INV-RAISE-UNCHANGED"),
        "torch loads key by key and only raises at the end, so every key it could load stays "
        "loaded when another key fails; a norm layer's num_batches_tracked missing from the "
        "dict is such a key, loaded from the buffer itself (under the swap flag a new "
        "TensorImpl: m = torch.nn.BatchNorm1d(4, affine=False); c = "
        "m.num_batches_tracked._cdata; torch.__future__.set_swap_module_params_on_conversion("
        "True); m.load_state_dict({}) raises, and m.num_batches_tracked._cdata != c).\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "sd = {k: v + 1 for k, v in m.state_dict().items()}; sd['1.bias'] = torch.zeros(5)\n"
        "w = m[0].weight.clone()\n"
        "try: m.load_state_dict(sd)\n"
        "except RuntimeError: pass\n"
        "assert not torch.equal(m[0].weight, w)  # half-loaded",
        TORCH_ALL, id="torch.load.writes-before-failing"),
    Deviation(
        ("LOAD-ATOMIC", *CROSS_DEVICE), swaps_twice_before_failing,
        ("changed", "INV-RAISE-UNCHANGED"), always=False, reason=
        "A load that then raises swaps a tensor reached by two keys twice (each key it can load "
        "is loaded, as writes-before-failing says); the second new TensorImpl can take the "
        "address the first swap freed, so the tensor may end with the _cdata it started with "
        "(allocator-dependent) or not.\n"
        "m = torch.nn.Module(); b = torch.ones(2)\n"
        "m.register_buffer('b0', b); m.register_buffer('b1', b)\n"
        "m.register_buffer('count', torch.tensor(0)); c = b._cdata\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "try: m.load_state_dict({'b0': b, 'b1': b})  # 'count' missing: raises\n"
        "except RuntimeError: pass\n"
        "print(m.b0._cdata == c)  # True on one machine in 200 of 200 tries; a single key: 0 of 200",
        torch_versions=TORCH_ALL, stale_after=None,
        id="torch.load.swaps-twice-back-before-failing"),
    Deviation(
        "LOAD-TIES", refused_with_conflict, "changed",
        "A load with tied names given different values that torch refuses for a refused swap "
        "(see the 'raised' deviation) leaves the keys it wrote before written (see LOAD-ATOMIC).\n"
        "m = torch.nn.utils.weight_norm(torch.nn.Linear(2, 2)); m.register_buffer('s', torch.ones(2))\n"
        "m.register_buffer('t', m.s)\n"
        "sd = m.state_dict(); sd['s'] = torch.zeros(2); sd['bias'] = sd['bias'] + 1\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(sd)  # RuntimeError (weight_g), and bias, s are loaded",
        TORCH_ALL, id="torch.load.refused-with-conflict"),
    Deviation(
        ("LOAD-TIES", "LOAD-ATOMIC", "LOAD-KEYS", *CROSS_DEVICE), conflict_only,
        ("conflict-accepted", "raised-none"),
        "torch loads tied names given different values one after the other: the last one wins, "
        "silently.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight\n"
        "sd = m.state_dict(); sd['0.weight'] = torch.zeros(2, 2); sd['1.weight'] = torch.ones(2, 2)\n"
        "m.load_state_dict(sd)  # no error\n"
        "assert torch.equal(m[0].weight, torch.ones(2, 2))",
        TORCH_ALL, id="torch.load.conflict-only"),
    Deviation(
        "LOAD-KEYS", conflict_and_other_error, "message",
        "torch's error message never names tied names given different values (it does not see "
        "them); the reference adds 'While loading the tied names ...'.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight\n"
        "sd = m.state_dict(); sd['0.weight'] = torch.zeros(2, 2); sd['1.weight'] = torch.ones(2, 2)\n"
        "sd['1.bias'] = torch.zeros(3)\n"
        "m.load_state_dict(sd)  # RuntimeError naming only the size mismatch of 1.bias",
        TORCH_ALL, id="torch.load.conflict-and-other-error"),
    Deviation(
        ("LOAD-TIES", *CROSS_DEVICE), assign_splits_ties, "tie-split",
        "With assign=True (swap flag off) torch setattr's Parameter(value) into each slot, one "
        "new object per key, so tied parameters come apart.\n"
        "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "m[1].weight = m[0].weight\n"
        "m.load_state_dict(m.state_dict(), assign=True)\n"
        "assert m[0].weight is not m[1].weight",
        TORCH_ALL, id="torch.load.assign-splits-ties"),
    Deviation(
        ("LOAD-PATH", "LOAD-VALUES", "LOAD-KEYS", "LOAD-IDENTITY", "LOAD-TIES", "LOAD-ROUND-TRIP"),
        assign_moves_buffer_to_parameters, "INV-KINDS",
        "With assign=True (swap flag off) torch's _load_from_state_dict wraps a value as a "
        "Parameter wherever the slot's current object is one, and setattr's it: a buffer slot "
        "holding a Parameter (register_buffer accepts one) becomes a parameter slot, leaving "
        "named_buffers(). The reference assigns a buffer slot's value as a buffer.\n"
        "m = torch.nn.Module(); m.p = torch.nn.Parameter(torch.ones(2)); m.register_buffer('b', m.p)\n"
        "m.load_state_dict(m.state_dict(), assign=True)\n"
        "assert 'b' in dict(m.named_buffers())  # fails: 'b' is in m._parameters",
        TORCH_CHECKED, id="torch.load.assign-moves-buffer-to-parameters"),
    Deviation(
        "LOAD-ATOMIC", assign_moves_buffer_before_failing, "INV-KINDS", always=False,
        torch_versions=TORCH_CHECKED, id="torch.load.assign-moves-buffer-before-failing", reason=
        "A load with assign=True that fails for another key still writes the keys it can "
        "(torch.load.writes-before-failing), and a buffer slot holding a Parameter among them "
        "becomes a parameter slot (torch.load.assign-moves-buffer-to-parameters); it shows where "
        "torch reaches that key before the error it raises for the other.\n"
        "m = torch.nn.Module(); m.p = torch.nn.Parameter(torch.ones(2)); m.register_buffer('b', m.p)\n"
        "m.load_state_dict({'p': torch.ones(3), 'b': torch.ones(2)}, assign=True)  # RuntimeError\n"
        "assert 'b' in dict(m.named_buffers())  # fails"),
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
        TORCH_CHECKED, id="torch.load.assign-keeps-tied-own-data"),
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
        TORCH_CHECKED, id="torch.load.assign-keeps-a-slot-given-itself"),
    Deviation(
        "LOAD-PATH", assign_replaces_own_data, "path-kept",
        "With assign=True torch replaces a slot given its own data (state_dict()'s detached "
        "alias): a new Parameter without the swap flag (an optimizer loses it), a swapped-in "
        "TensorImpl with it.\n"
        "m = torch.nn.Linear(2, 2); w = m.weight\n"
        "m.load_state_dict(m.state_dict(), assign=True)\n"
        "assert m.weight is not w",
        TORCH_ALL, id="torch.load.assign-replaces-own-data"),
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
        torch_versions=TORCH_ALL, stale_after=None, id="torch.load.swapped-twice"),
    Deviation(
        "LOAD-ROUND-TRIP", round_trip_assign_replaces, "changed",
        "Loading state_dict() back with assign=True (swap flag off) puts new objects in every "
        "slot: Parameter(detached alias) for parameters, the alias itself for buffers.\n"
        "m = torch.nn.BatchNorm1d(2); w, mean = m.weight, m.running_mean\n"
        "m.load_state_dict(m.state_dict(), assign=True)\n"
        "assert m.weight is not w and m.running_mean is not mean",
        TORCH_ALL, id="torch.load.round-trip-assign-replaces"),
    Deviation(
        "LOAD-IDENTITY", swap_loses_identity,
        ("class", "attributes", "grad", "tensor-hooks", "after-hook-lost", "INV-KINDS"),
        "On the swap path swap_tensors swaps __class__, __dict__ and the TensorImpl (with its "
        "autograd meta) with a fresh Parameter(module_load(...)): a Parameter subclass becomes "
        "Parameter, instance attributes, the grad and register_hook hooks are gone. A hook "
        "registered after the load never fires either where the parameter had hooks of that "
        "kind: the Python object keeps its hook table, so register_hook (and "
        "register_post_accumulate_grad_hook) only add to it and never register it on the new "
        "TensorImpl (torch 2.9.0, 2.13.0 and 2.14.1).\n"
        "class P(torch.nn.Parameter): pass\n"
        "m = torch.nn.Linear(2, 2); m.weight = P(m.weight.detach()); m.weight.tag = 1\n"
        "m(torch.ones(1, 2)).sum().backward(); m.weight.register_hook(print)\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(m.state_dict())\n"
        "assert type(m.weight) is torch.nn.Parameter and m.weight.grad is None\n"
        "assert not hasattr(m.weight, 'tag')\n"
        "n = []; m.weight.register_hook(lambda g: n.append(1))\n"
        "m(torch.ones(1, 2)).sum().backward(); assert n  # fails",
        TORCH_ALL, id="torch.load.swap-loses-identity"),
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
        TORCH_ALL, id="torch.load.swap-drops-written-identity"),
    Deviation(
        "LOAD-ROUND-TRIP", round_trip_swap_loses_identity, "changed",
        "Loading state_dict() back under the swap flag loses a Parameter subclass's class, its "
        "instance attributes and the grad (see the LOAD-IDENTITY deviation).\n"
        "m = torch.nn.Linear(2, 2); m(torch.ones(1, 2)).sum().backward()\n"
        "torch.__future__.set_swap_module_params_on_conversion(True)\n"
        "m.load_state_dict(m.state_dict())\n"
        "assert m.weight.grad is None",
        TORCH_ALL, id="torch.load.round-trip-swap-loses-identity"),
    Deviation(
        "LOAD-ROUND-TRIP", uninitialized_refused, "raised",
        "torch's assign and swap paths raise on an uninitialized (lazy) parameter given its own "
        "state dict entry (Parameter() and module_load touch the uninitialized data).\n"
        "m = torch.nn.LazyLinear(2)\n"
        "m.load_state_dict(m.state_dict(), assign=True)  # RuntimeError: ... uninitialized",
        TORCH_ALL, id="torch.load.uninitialized-refused"),
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
        torch_versions=TORCH_ALL, id="torch.load.step-swap-loses-identity"),
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
        torch_versions=TORCH_SEEN, id="torch.load.step-assign-splits-ties"),
    Deviation(
        vocabulary.SEQUENCES, step_assign_moves_buffer_to_parameters, "INV-KINDS", always=False,
        reason="At a sequence's load step with assign=True (swap flag off) a buffer slot holding "
        "a Parameter becomes a parameter slot (torch.load.assign-moves-buffer-to-parameters). "
        "Checked on torch 2.13.0.\n"
        "m = torch.nn.Module(); m.p = torch.nn.Parameter(torch.ones(2)); m.register_buffer('b', m.p)\n"
        "m.load_state_dict({k: v + 1 for k, v in m.state_dict().items()}, assign=True)\n"
        "assert 'b' in dict(m.named_buffers())  # fails",
        torch_versions=TORCH_CHECKED, id="torch.load.step-assign-moves-buffer-to-parameters"),
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
        torch_versions=TORCH_ALL, id="torch.load.step-assign-replaces-own-data"),
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
        torch_versions=TORCH_ALL, id="torch.load.step-writes-before-failing"),
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
        torch_versions=TORCH_SEEN, id="torch.load.step-swaps-with-graph-grads"),
)
