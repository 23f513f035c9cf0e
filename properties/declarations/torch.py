"""Deviations of the ``torch`` and ``torch-stateless`` targets from the spec, as data (the
predicates they name are in ``declarations.torch_apply`` and ``declarations.torch_functional_call``).

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

from swapspec.properties.declarations.torch_apply import (
    bad_argument_unchecked,
    buffer_carries_graph,
    commits_before_its_raise,
    commits_before_raising,
    converts_before_refused_swap,
    converts_some_tensor_twice,
    drops_parameter_class,
    grad_dtype_refused_midway,
    graph_grad_not_leaf,
    hooks_beside_a_split_parameter,
    inference_mode_reaches_the_module,
    loses_tensor_hooks,
    loses_tensor_hooks_unless_norm_raises,
    non_idempotent_twice,
    non_idempotent_twice_on_grads,
    old_norm_refused_before_fn_raises,
    old_weight_norm_swapped,
    overwrite_splits_tied_parameters,
    rebinding_splits_tied_buffers,
    requires_grad_on_uninitialized,
    rnn_weight_refused_before_fn_raises,
    rnn_weight_swapped_elsewhere,
    runs_an_override_twice,
    shared_grad_swapped,
    split_tie_shares_grad,
    split_tied_buffer_shares_storage,
    splits_parameter_in_buffer_slot,
    step_splits_parameter_in_buffer_slot,
    swap_ignores_new_hooks,
    swap_ignores_new_hooks_unless_norm_raises,
    swap_refuses_subclass,
    swaps_twice_back,
    swaps_unseen_before_refused_swap,
    type_checked_by_uninitialized,
)
from swapspec.properties.declarations.torch_functional_call import (
    forms_swap_one_slot_twice,
    forward_writes_beside_a_conflict,
    gives_a_lazy_tensor,
    parametrized_name_swap_refused,
    parametrized_name_with_right_inverse,
    parametrized_name_without_right_inverse,
    partial_tie_group_key_error,
    partial_ties_beside_conflict,
    reparametrizing_name_given,
    restore_sets_wrapper_into_plain,
    rnn_ignores_a_none_weight,
    rnn_none_weight_hides_forward_error,
    shared_slot_write_back_wrong,
    slot_conflict_ignored,
    spectral_norm_iterates_before_refused_swap,
    swap_refused_by_graph_grads,
    swaps_a_grad,
    swaps_one_slot_twice,
    tuple_rebind_lost,
    weight_norm_restore_rounds,
)
from swapspec.properties.vocabulary import CRASH, Deviation

APPLY_IDS = ("APPLY-PATH", "APPLY-NO-SET-DATA-ACROSS-IMPL", "APPLY-VALUES",
             "APPLY-PARAMETER-IDENTITY", "APPLY-GRADS", "APPLY-NONE-SLOTS", "APPLY-TIES",
             "APPLY-FN-ONCE", "APPLY-RECURSE-FALSE", "APPLY-ROUND-TRIP", "APPLY-FORWARD",
             "APPLY-TENSOR-HOOKS", "APPLY-OPTIMIZER", "APPLY-OVERRIDE")


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
        "# AttributeError: 'int' object has no attribute 'keys'",
        id="torch-stateless.fc.input-form-unchecked"),
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


# torch's public methods (nn.Module.to, requires_grad_...): for a target whose methods are
# torch's own. A host that wraps _apply only gets the reference's methods built on its apply,
# and inherits none of these.
TORCH_METHOD_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        ("APPLY-METHOD-ARGS", "APPLY-METHOD-GRADS"), requires_grad_on_uninitialized, "raised",
        reason="nn.Module.requires_grad_ calls p.requires_grad_ on every parameter, and an "
        "UninitializedParameter (a lazy module before its first forward) refuses it with "
        "ValueError, after the parameters before it were changed: a lazy module cannot be frozen "
        "before its first forward, and the failed call leaves it half frozen (the reference sets "
        "p.requires_grad, which an UninitializedParameter takes). Checked on torch 2.13.0 only. "
        "Repro: m = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2)); "
        "m.requires_grad_(False)  # ValueError: Attempted to use an uninitialized parameter; "
        "m[0].weight.requires_grad  # False", id="torch.methods.requires-grad-on-uninitialized"),
    Deviation(
        "APPLY-METHOD-ARGS", bad_argument_unchecked, "bad-form-accepted", reason=
        "nn.Module.requires_grad_ checks its argument only in p.requires_grad_ (per parameter), "
        "nn.Module.type and to_empty theirs only in the fn they pass to _apply (per tensor): on a "
        "module without any, a bad argument raises nothing and the method returns the module "
        "(with one parameter: TypeError, ValueError, TypeError). Checked on torch 2.13.0 only. "
        "Repro: m = nn.Module(); m.requires_grad_('yes'); m.type('torch.NoSuchTensor'); "
        "m.type(1); m.to_empty(device=1.5)  # no error; "
        "nn.Linear(2, 2).requires_grad_('yes')  # TypeError",
        id="torch.methods.bad-argument-unchecked"),
    Deviation(
        "APPLY-METHOD-ARGS", type_checked_by_uninitialized, ("bad-form-accepted", "message"),
        reason="nn.Module.type checks its argument only in the fn it passes to _apply, and an "
        "UninitializedParameter (a lazy module before its first forward) refuses Tensor.type "
        "before it reads the argument: when the first tensor _apply reaches is one, a bad dtype "
        "raises ValueError 'Attempted to use an uninitialized parameter', not TypeError 'dtype "
        "must be a type, str, or dtype object' (or ValueError 'invalid type'). Found by a random "
        "run (default profile, seed 5101). Checked on torch 2.13.0. Repro: "
        "m = nn.Sequential(nn.LazyLinear(2), nn.Linear(2, 2)); m.type(1)  # ValueError; "
        "nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2)).type(1)  # TypeError",
        id="torch.methods.type-checked-by-uninitialized"),
)


LAZY_VALUE = (
    "torch.func.functional_call does not refuse a value (None included) for an uninitialized "
    "tensor of a lazy module not yet initialized. It swaps the value in, and in forward the "
    "module's initialize hook materializes its other uninitialized tensors in place and raises "
    "AttributeError at a given one, or, meeting none, turns the module into its final class and "
    "drops its lazy hooks; the restore then puts the uninitialized tensor back, and the module's "
    "state_dict and forward raise ValueError from then on. The spec refuses the call with "
    "ValueError before touching anything (torch 2.9.0, 2.13.0 and 2.14.1). Repro: m = nn.LazyLinear(2); "
    "torch.func.functional_call(m, {'bias': None}, (torch.ones(1, 3),)); "
    "type(m).__name__  # 'Linear'; m.state_dict()  # ValueError: Attempted to use an "
    "uninitialized parameter; m = nn.LazyLinear(2); "
    "torch.func.functional_call(m, {'bias': torch.zeros(2)}, (torch.ones(1, 3),))  "
    "# AttributeError, with m.weight materialized"
)

TORCH_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        SEQUENCE_IDS, swaps_a_grad, "raised", always=False, reason=
        "Found by sequences only, and only sometimes (seen in CI runs of all targets under "
        "pytest -n 2, not when the property runs alone): on the swap path torch refuses to swap "
        "a parameter's grad ('_apply(): Couldn't swap GenericLeaf.p0.grad'): swap_tensors saw "
        "another reference to the grad's TensorImpl left by an earlier step. No minimal repro "
        "yet; torch 2.13. Repro: a sequence repro printed by SEQ-HOOKS on torch-stateless.",
        id="torch.seq.swaps-a-grad"),
    Deviation(
        SEQUENCE_IDS, swap_refused_by_graph_grads,
        ("value", "grad-value", "grad-lost", "object-changed", "class", "attributes"),
        always=False, reason=
        "Found by sequences (backward(create_graph=True), or a forward whose output is held, "
        "then a conversion on the swap path): the graph the backward kept alive (or the held "
        "output's) holds a parameter (the grads' graph, or an old-style "
        "weight_norm, spectral_norm or pruning attribute's), swap_tensors refuses it, and "
        "_apply has already committed the tensors it converted before that one, so the module "
        "is left half converted (the reference refuses before changing anything). Whether a "
        "grad's graph holds a parameter depends on the module (parametrizations hold theirs). "
        "Seen on torch 2.9.0, 2.13.0 and 2.14.1. Repro with an old norm: m = nn.Linear(2, 2); "
        "torch.nn.utils.weight_norm(m); (m(torch.ones(1, 2)) ** 2).sum().backward("
        "create_graph=True); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double()  # raises RuntimeError: Couldn't swap Linear.weight_g; "
        "assert m.bias.dtype == torch.float32  # fails: float64. Repro with grads: "
        "m = nn.Sequential(nn.Linear(2, 2), "
        "torch.nn.utils.parametrizations.weight_norm(nn.Linear(2, 2))); "
        "(m(torch.ones(1, 2)) ** 2).sum().backward(create_graph=True); "
        "torch.__future__.set_swap_module_params_on_conversion(True); m.double()  # raises "
        "RuntimeError: Couldn't swap ParametrizationList.original0; "
        "assert m[0].weight.dtype == torch.float32  # fails: float64. Repro with a held "
        "forward (its graph saves the second weight): m = nn.Sequential(nn.Linear(2, 2), "
        "nn.Linear(2, 2)); held = m(torch.ones(1, 2)); "
        "torch.__future__.set_swap_module_params_on_conversion(True); m.double()  # raises "
        "RuntimeError: Couldn't swap Linear.weight; "
        "assert m[0].weight.dtype == torch.float32  # fails: float64 (torch 2.13.0, 2.14.1)",
        id="torch.seq.swap-refused-by-graph-grads"),
    Deviation(
        APPLY_IDS + XLA_APPLY_IDS, old_weight_norm_swapped, "raised", always=False, reason=
        "The old hook-based torch.nn.utils.weight_norm (and spectral_norm) keep `weight` as an "
        "attribute computed from weight_g and weight_v (weight_orig), whose autograd graph can "
        "hold them; on the swap path swap_tensors then refuses them and _apply raises "
        "(torch 2.13; a backward without create_graph frees the graph, and then the swap goes "
        "through). Repro: "
        "m = nn.Linear(2, 2); "
        "torch.nn.utils.weight_norm(m); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double()  # RuntimeError: _apply(): Couldn't swap Linear.weight_g. A pruned "
        "parameter's _orig is refused the same way once a conversion off the swap path changed "
        "its dtype (the .data = drops its link to the AccumulateGrad node the pruned "
        "attribute's graph still holds, so swap_tensors finds a second one; torch 2.9.0, 2.13.0 and 2.14.1). "
        "Repro: import torch.nn.utils.prune as prune; m = nn.Linear(2, 2); "
        "prune.random_unstructured(m, 'weight', 0.5); "
        "m.half(); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.float()  # RuntimeError: _apply(): Couldn't swap Linear.weight_orig",
        id="torch.apply.old-weight-norm-swapped"),
    Deviation(
        "APPLY-ATOMIC", old_norm_refused_before_fn_raises, "no-error", always=False, reason=
        "Where fn would raise on a later tensor, torch's _apply may first raise its own "
        "RuntimeError: with the old hook-based weight_norm (or spectral_norm) on the swap path, "
        "swap_tensors refuses weight_g/weight_v (see the `raised` declaration), so fn's error "
        "never comes out (torch 2.13). Repro: m = nn.Linear(2, 2); torch.nn.utils.weight_norm(m); "
        "m(torch.ones(1, 2)); n = [0]; "
        "def fn(t):\n n[0] += 1\n if n[0] == 3: raise ValueError\n return t + 1; "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "m._apply(fn)  # RuntimeError: _apply(): Couldn't swap Linear.weight_g",
        id="torch.apply.old-weight-norm-no-error"),
    Deviation(
        APPLY_IDS + XLA_APPLY_IDS, shared_grad_swapped, "raised",
        "The overwrite path gives each slot of a tied parameter its own new Parameter but "
        "the same converted grad object; a later conversion on the swap path then refuses that "
        "grad, which the other Parameter still holds, and _apply raises (torch 2.13). Repro: "
        "m = nn.Module(); m.p0 = nn.Parameter(torch.ones(4)); m.p0.grad = torch.ones(4); "
        "m.p1 = m.p0; torch.__future__.set_overwrite_module_params_on_conversion(True); "
        "m.float(); assert m.p0 is not m.p1 and m.p0.grad is m.p1.grad; "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double()  # RuntimeError: _apply(): Couldn't swap Module.p0.grad",
        id="torch.apply.shared-grad-swapped"),
    Deviation(
        APPLY_IDS, rnn_weight_swapped_elsewhere, "raised",
        "RNNBase._apply drops the RNN's weak references to its flat weights only around its own "
        "conversion; a flat weight tied into another module is swapped there while a weak "
        "reference exists, and swap_tensors refuses it (torch 2.13). Repro: "
        "rnn = nn.RNN(2, 2); o = nn.Module(); o.p0 = rnn.weight_ih_l0; "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "nn.Sequential(o, rnn).double()  # RuntimeError: _apply(): Couldn't swap Module.p0. "
        "The same with recurse=False on a root that holds a child RNN's weight: "
        "o.rnn = rnn; o._apply(lambda t: t.double(), recurse=False)  # RuntimeError "
        "(torch 2.9.0, 2.13.0 and 2.14.1)",
        id="torch.apply.rnn-weight-swapped-elsewhere"),
    Deviation(
        "APPLY-ATOMIC", rnn_weight_refused_before_fn_raises, "no-error", reason=
        "Where fn would raise on a later tensor, torch's _apply first raises its own "
        "RuntimeError at an RNN's flat weight tied into another module on the swap path (see "
        "the `raised` declaration), so fn's error never comes out. Found by a random run "
        "(default profile, seed 3946935559). Seen on torch 2.9.0, 2.13.0 and 2.14.1. Repro: "
        "rnn = nn.RNN(2, 2); o = nn.Module(); o.p0 = rnn.weight_ih_l0; n = [0]; "
        "def fn(t):\n n[0] += 1\n if n[0] == 2: raise ValueError\n return t + 1; "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "nn.Sequential(o, rnn)._apply(fn)  # RuntimeError: _apply(): Couldn't swap Module.p0, "
        "not fn's ValueError",
        id="torch.apply.rnn-weight-no-error"),
    Deviation(
        APPLY_IDS + XLA_APPLY_IDS, graph_grad_not_leaf, "raised",
        "After backward(create_graph=True) the grads carry a graph; where _apply replaces a grad "
        "(overwrite flag, or a TensorImpl change such as to('meta')) it asserts "
        "`param_grad.is_leaf` and raises halfway. Repro: m = nn.Linear(2, 2); "
        "m(torch.ones(1, 2)).pow(2).sum().backward(create_graph=True); "
        "torch.__future__.set_overwrite_module_params_on_conversion(True); "
        "m.double()  # AssertionError: param_grad must be a leaf tensor",
        id="torch.apply.graph-grad-not-leaf"),
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
        "m.to_empty(device='cpu'); m(torch.ones(1, 2)).sum().backward(); assert n  # fails",
        id="torch.apply.loses-tensor-hooks"),
    Deviation("APPLY-TENSOR-HOOKS", loses_tensor_hooks_unless_norm_raises, "before-hook-lost",
              always=False, reason="Where an old-style weight or spectral norm may make _apply "
              "raise first (see its declaration): otherwise, as the declaration below. " + HOOKS_LOST,
              id="torch.apply.loses-tensor-hooks-unless-norm-raises"),
    Deviation("APPLY-TENSOR-HOOKS", swap_ignores_new_hooks_unless_norm_raises, "after-hook-lost",
              always=False, reason="Where an old-style weight or spectral norm may make _apply "
              "raise first (see its declaration): otherwise, as the declaration below. "
              + HOOKS_AFTER_SWAP, id="torch.apply.swap-ignores-new-hooks-unless-norm-raises"),
    Deviation(
        "APPLY-TENSOR-HOOKS", swap_ignores_new_hooks, "after-hook-lost",
        "After a swap, a hook registered on the parameter never fires: the swapped-in Python "
        "object already has a hook table, so register_hook only adds to it and never "
        "registers it on the new TensorImpl (torch 2.13). Repro: m = nn.Linear(2, 2); "
        "m.weight.register_hook(lambda g: g); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double(); n = []; m.weight.register_hook(lambda g: n.append(1)); "
        "m(torch.ones(1, 2, dtype=torch.double)).sum().backward(); assert n  # fails",
        id="torch.apply.swap-ignores-new-hooks"),
    Deviation(
        "APPLY-TENSOR-HOOKS", hooks_beside_a_split_parameter, ("before-hook-lost", "after-hook-lost"),
        always=False, reason="torch.apply.loses-tensor-hooks and torch.apply.swap-ignores-new-hooks "
        "on a module where a buffer slot holds a parameter (or what torch's split of one left: "
        "the old object, or a tensor whose graph leads to it, torch.apply.splits-parameter-in-"
        "buffer-slot): a backward through that buffer still reaches the old object's hooks, or "
        "creates the swapped parameter's gradient node anew, so whether a hook fires depends on "
        "what forward reads. Torch 2.13.0. Repro: as those two declarations, with "
        "m.register_buffer('b', m.weight) before the conversion.",
        id="torch.apply.hooks-beside-a-split-parameter"),
    Deviation("FC-PARAMETRIZED", parametrized_name_without_right_inverse, "raised",
              PARAMETRIZED_NAME, id="torch.fc.parametrized-name-without-right-inverse"),
    Deviation("FC-PARAMETRIZED", parametrized_name_with_right_inverse, "not-disabled",
              PARAMETRIZED_NAME, id="torch.fc.parametrized-name-not-disabled"),
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
        "got 3", id="torch.fc.parametrized-name-swap-refused"),
    Deviation(
        "FC-PARAMETRIZED", spectral_norm_iterates_before_refused_swap, "INV-RAISE-UNCHANGED",
        "Where the swap above is refused, functional_call has already read the attribute, and "
        "a spectral_norm in training mode computes it with a power iteration that updates its "
        "_u and _v buffers in place: the call raises with them changed, unless the iteration "
        "has converged (torch 2.13). Repro: m = nn.Linear(3, 3); "
        "torch.nn.utils.parametrizations.spectral_norm(m); "
        "u = m.parametrizations.weight[0]._u.clone(); "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "torch.func.functional_call(m, {'weight': torch.ones(3, 3)}, (torch.ones(1, 3),)) "
        "raises RuntimeError, and torch.equal(m.parametrizations.weight[0]._u, u) is False",
        id="torch.fc.spectral-norm-iterates-before-refused-swap"),
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
        "m.weight  # RuntimeError: ... its data is not allocated yet (or a segfault)",
        id="torch.fc.restore-sets-wrapper-into-plain"),
    Deviation(
        "FC-PARAMETRIZED", reparametrizing_name_given, "not-restored",
        "Restoring a parametrized weight after a call that named it assigns the old weight "
        "through right_inverse: for spectral_norm that stores weight/sigma, so "
        "`parametrizations.weight.original` keeps its object but not its values; for "
        "orthogonal it rebinds the parametrization's `base` buffer. Repro: m = nn.Linear(3, 3); "
        "torch.nn.utils.parametrizations.spectral_norm(m); o = m.parametrizations.weight.original; "
        "before = o.detach().clone(); torch.func.functional_call(m, {'weight': torch.rand(3, 3)}, "
        "(torch.ones(1, 3),)); assert torch.equal(o, before)  # fails",
        id="torch.fc.reparametrizing-name-given"),
    Deviation("FC-PARAMETRIZED", swaps_one_slot_twice, "not-restored", SHARED_SLOT,
        id="torch.fc.parametrized-shared-slot-not-restored"),
    Deviation(
        "FC-PARAMETRIZED", weight_norm_restore_rounds, "not-restored", reason=
        "Restoring a weight-normed weight after a call that named it assigns the old weight "
        "through right_inverse, which recomputes original0 = norm(w) and original1 = w: the "
        "values can come back rounded (torch 2.13). Repro: m = nn.Conv2d(2, 2, 3).double(); "
        "torch.nn.utils.parametrizations.weight_norm(m); o = m.parametrizations.weight.original0; "
        "before = o.detach().clone(); torch.func.functional_call(m, {'weight': torch.rand(2, 2, 3, 3, "
        "dtype=torch.double)}, (torch.ones(1, 2, 5, 5, dtype=torch.double),)); "
        "torch.equal(o, before)  # False where norm(w) rounds",
        id="torch.fc.weight-norm-restore-rounds"),
    Deviation(
        APPLY_IDS, swap_refuses_subclass, "raised",
        "The swap and overwrite paths build `Parameter(fn(p))`; when fn returns a Parameter "
        "subclass instance unchanged (float() on a float32 one), Parameter() refuses it "
        "(`Creating a Parameter from an instance of type P requires that detach() returns an "
        "instance of the same type`) and _apply raises halfway. Repro: "
        "class P(nn.Parameter): pass; m = nn.Linear(2, 2); m.weight = P(m.weight.detach()); "
        "torch.__future__.set_overwrite_module_params_on_conversion(True); m.float()",
        id="torch.apply.swap-refuses-subclass"),
    Deviation(
        "APPLY-PARAMETER-IDENTITY", drops_parameter_class, ("class", "attributes", "INV-KINDS"),
        "The swap and overwrite paths rebuild a plain `Parameter(fn(p), requires_grad)`: "
        "Parameter subclasses (and lazy modules' UninitializedParameter) and instance "
        "attributes are lost. Repro: p = nn.Parameter(torch.ones(2)); p.tag = 'x'; "
        "m = nn.Module(); m.p = p; torch.__future__.set_overwrite_module_params_on_conversion(True); "
        "m.double(); assert hasattr(m.p, 'tag')  # fails", id="torch.apply.drops-parameter-class"),
    Deviation(
        "APPLY-TIES", overwrite_splits_tied_parameters, "parameter-tie-split",
        "_apply keeps no memo: on the overwrite path each slot of a tied parameter gets its "
        "own new Parameter (pytorch/xla weight-tying docs). Repro: m = nn.Module(); "
        "m.a = nn.Parameter(torch.ones(2)); m.b = m.a; "
        "torch.__future__.set_overwrite_module_params_on_conversion(True); m.double(); "
        "assert m.a is m.b  # fails", id="torch.apply.overwrite-splits-tied-parameters"),
    Deviation(
        APPLY_IDS, commits_before_its_raise, "INV-RAISE-UNCHANGED", always=False, reason=
        "Where _apply raises on a tensor (a Parameter subclass fn returns unchanged on the swap "
        "or overwrite path, a grad that carries a graph, ...) it keeps the tensors it converted "
        "before it. Repro: m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)); "
        "class Tagged(nn.Parameter): pass; m[1].weight = Tagged(m[1].weight.detach().double()); "
        "torch.__future__.set_swap_module_params_on_conversion(True); m.double() raises "
        "RuntimeError, and m[0].weight.dtype is float64",
        id="torch.apply.commits-before-its-raise"),
    Deviation(
        (*APPLY_IDS, "OLD-STYLE-REMOVE"), split_tie_shares_grad, "INV-WORKING", always=False,
        reason=
        "On the overwrite path a tied parameter with a grad becomes two Parameters that share "
        "one grad tensor (fn(grad) is the grad itself where fn keeps its dtype), so a backward "
        "adds both parameters' grads into it: the module's grads differ from a fresh build's "
        "with two parameters. Repro: m = nn.Module(); m.a = nn.Parameter(torch.ones(2)); "
        "m.b = m.a; m.a.grad = torch.ones(2); "
        "torch.__future__.set_overwrite_module_params_on_conversion(True); m.float(); "
        "(m.a * 2 + m.b * 3).sum().backward(); "
        "assert m.a.grad.tolist() == [3., 3.]  # fails: [6., 6.], and m.a.grad is m.b.grad. "
        "The shared grad stays through later conversions that do not raise, and so does the "
        "difference. A parameter tied into a buffer slot splits the same way: the buffer slot "
        "keeps the old object, sharing the grad with the new one.",
        id="torch.apply.split-tie-shares-grad"),
    Deviation(
        "APPLY-TIES", rebinding_splits_tied_buffers, "buffer-tie-split",
        "Buffers are rebound per slot, `self._buffers[k] = fn(buf)`, so a buffer registered "
        "under two names ends as two tensors. Repro: m = nn.Module(); "
        "m.register_buffer('a', torch.ones(2)); m.register_buffer('b', m.a); m.double(); "
        "assert m.a is m.b  # fails", id="torch.apply.rebinding-splits-tied-buffers"),
    Deviation(
        "APPLY-TIES", splits_parameter_in_buffer_slot, "parameter-tie-split", reason=
        "A tensor registered as a parameter and as a buffer (register_buffer accepts a "
        "Parameter) is converted in each slot: _apply converts the parameter slot, then rebinds "
        "the buffer slot to fn of the tensor it meets there, so the buffer slot ends holding a "
        "new plain tensor wherever fn returns a new object (or the parameter takes the "
        "overwrite path); the reference converts the object once and keeps it in both slots. "
        "Found by module_trees' parameter-into-buffer ties; torch 2.13.0. Repro: m = nn.Module(); "
        "m.p = nn.Parameter(torch.ones(2)); m.register_buffer('b', m.p); m._apply(lambda t: t + 1); "
        "assert m.b is m.p  # fails: m.b is a Tensor [3., 3.], m.p [2., 2.]",
        id="torch.apply.splits-parameter-in-buffer-slot"),
    Deviation(
        ("APPLY-PARAMETER-IDENTITY", "APPLY-PATH", "APPLY-GRADS"), splits_parameter_in_buffer_slot,
        ("class", "attributes", "requires-grad", "path-swap", "path-set_data", "path-overwrite",
         "grad-lost", "grad-value"), always=False, reason=
        "What torch.apply.splits-parameter-in-buffer-slot leaves, seen name by name: the buffer "
        "slot's name no longer holds the parameter object (the path it took is not the "
        "parameter's), and holds fn's plain result (class Tensor, no attributes, no grad, "
        "requires_grad from fn's autograd record) or, on the overwrite path, the old object. It does not show "
        "in the class clause where fn returns a tensor subclass, whose class the property "
        "accepts. Torch 2.13.0. Repro: m = nn.Module(); m.p = nn.Parameter(torch.ones(2)); "
        "m.register_buffer('b', m.p); p = m.p; m._apply(lambda t: t + 1); "
        "type(m.b).__name__, m.b is p  # ('Tensor', False)",
        id="torch.apply.parameter-in-buffer-slot-names"),
    Deviation(
        SEQUENCE_IDS, step_splits_parameter_in_buffer_slot,
        ("parameter-tie-split", "buffer-tie-split", "value", "object-changed", "class",
         "attributes", "requires-grad", "grad-value", "grad-lost"), always=False, reason=
        "At a sequence's conversion step: torch.apply.splits-parameter-in-buffer-slot, seen "
        "slot by slot (the buffer slot's new object, its values where fn is applied twice, its "
        "requires_grad from fn's autograd record). Torch 2.13.0. Repro: as "
        "torch.apply.splits-parameter-in-buffer-slot.",
        id="torch.seq.splits-parameter-in-buffer-slot"),
    Deviation(
        SEQUENCE_IDS, inference_mode_reaches_the_module,
        ("raised", "INV-RAISE-UNCHANGED", "INV-WORKING", "value", "requires-grad", "grad-lost",
         "grad-value", "hook-count", "output", "stale-forward", "optimizer-stale"),
        always=False, reason=
        "_apply calls fn inside whatever mode its caller runs in, so a conversion under "
        "torch.inference_mode() (serving code converting a loaded model) leaves inference "
        "tensors in the module's parameters (through .data =, a new Parameter or swap_tensors) "
        "and buffers, while every parameter still says requires_grad=True. Outside the mode "
        "the module no longer trains: a backward never accumulates a grad into such a "
        "parameter (silently: the grad stays None), a forward that saves one for backward or "
        "updates a buffer in place (BatchNorm in training) raises, and requires_grad_(True) "
        "raises 'Setting requires_grad=True on inference tensor outside InferenceMode is not "
        "allowed' partway through the module. The step itself runs a tensor subclass's ops "
        "under the mode too, where some dispatch differently (a wrapper subclass's float() "
        "reaches aten.to.dtype, a swap-path load of one raises 'Cannot set version_counter "
        "for inference tensor' after writing earlier keys). What shows depends on the later "
        "steps. Torch "
        "2.13.0. Repro: m = nn.Linear(2, 2)\nwith torch.inference_mode(): m.double()\n"
        "m(torch.ones(1, 2, dtype=torch.float64)).sum().backward(); m.weight.grad  # None; "
        "m.weight.requires_grad  # True; m.weight.is_inference()  # True",
        id="torch.seq.conversion-under-inference-mode"),
    Deviation(
        ("APPLY-TENSOR-HOOKS", "APPLY-FORWARD", "PARAMETRIZE-DEEPCOPY", "PARAMETRIZE-CACHED",
         "CHECKPOINT-PICKLE", *SEQUENCE_IDS),
        buffer_carries_graph,
        ("raised", "before-hook-lost", "after-hook-lost", "stale-forward", "INV-WORKING",
         "grad-value", "requires-grad"), always=False, reason=
        "_apply rebinds buffers as `self._buffers[k] = fn(buf)` outside torch.no_grad(), so a "
        "buffer slot holding a parameter that requires grad (see "
        "torch.apply.splits-parameter-in-buffer-slot) ends holding a non-leaf whose graph leads "
        "back to the parameter: a backward through it sends grads into the parameter (or, on the "
        "overwrite path, into the old object), and on the swap path, where the buffer slot is "
        "met before the parameter is swapped, into an AccumulateGrad node swap_tensors "
        "poisoned, so every backward through the buffer raises. The buffer keeps its graph "
        "through later steps (a sequence's requires_grad_, zero_grad and backward see a buffer "
        "that requires grad, and copy.deepcopy (and pickling) refuses the module: 'Only Tensors created "
        "explicitly by the user (graph leaves) support the deepcopy protocol'). Whether it "
        "shows depends on whether forward reads the buffer. Found by module_trees' parameter-into-buffer ties; "
        "torch 2.13.0. Repro: m = nn.Module(); m.a = nn.Module(); m.c = nn.Module(); "
        "m.c.p = nn.Parameter(torch.ones(2)); m.a.register_buffer('b', m.c.p); "
        "torch.__future__.set_swap_module_params_on_conversion(True); m.half(); "
        "m.a.b.grad_fn  # ToCopyBackward0; m.a.b.float().sum().backward()  # RuntimeError: "
        "Trying to execute AccumulateGrad node that was poisoned by swap_tensors",
        id="torch.apply.buffer-slot-keeps-graph"),
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
        "assert torch.equal(m.running_var.a, m.running_var.b)  # fails: 0.29 vs 0.2",
        id="torch.apply.split-tied-buffer-shares-storage"),
    Deviation(
        "APPLY-FN-ONCE", converts_some_tensor_twice, ("fn-repeated", "fn-on-result"),
        "_apply keeps no memo and recurses through children(), which drops repeats within "
        "one parent only: a tied tensor, or a module shared by two parents, is converted "
        "once per encounter. Repro: m = nn.Module(); m.a = nn.Parameter(torch.ones(2)); "
        "m.b = m.a; calls = []; m._apply(lambda t: calls.append(t) or t); "
        "assert len(calls) == 1  # 2", id="torch.apply.converts-some-tensor-twice"),
    Deviation(
        "APPLY-OVERRIDE", runs_an_override_twice, "override-runs", always=False, reason=
        "_apply recurses through children(), which drops repeats within one parent only: the "
        "_apply override of a module shared by two parents runs once per parent, so the work it "
        "does after super()._apply is done twice in one conversion. Repro: "
        "class Counting(nn.Module): runs = 0; "
        "def _apply(self, fn, recurse=True): out = super()._apply(fn, recurse); "
        "self.runs += 1; return out; "
        "c = Counting(); m = nn.Sequential(nn.Sequential(c), nn.Sequential(c)); m.double(); "
        "assert c.runs == 1  # 2", id="torch.apply.runs-shared-override-twice"),
    Deviation(
        "APPLY-VALUES", non_idempotent_twice, "value",
        "Converted twice (see APPLY-FN-ONCE), a non-idempotent fn is applied to its own "
        "result: `t + 1` ends as `t + 2`. Repro: m = nn.Module(); "
        "m.a = nn.Parameter(torch.zeros(1)); m.b = m.a; m._apply(lambda t: t + 1); "
        "assert m.a.item() == 1  # 2.0", id="torch.apply.non-idempotent-twice"),
    Deviation(
        "APPLY-GRADS", non_idempotent_twice_on_grads, "grad-value",
        "A tied parameter's grad is converted once per slot too: `g + 1` ends as `g + 2`. "
        "Repro: as APPLY-VALUES with m.a.grad = torch.zeros(1); m.a.grad.item() == 2.0",
        id="torch.apply.non-idempotent-twice-on-grads"),
    Deviation(
        ("APPLY-PATH", "XLA-DTYPE-PATH"), swaps_twice_back, "path-swap", always=False, reason=
        "A parameter met twice on the swap path is swapped twice; the second new TensorImpl "
        "can reuse the address the first swap freed, so its _cdata may end where it started, "
        "as if set_data had run (only sometimes: it depends on the allocator). Repro: "
        "leaf = nn.Linear(2, 2); m = nn.ModuleList([nn.ModuleList([leaf]), "
        "nn.ModuleList([leaf])]); c = leaf.weight._cdata; "
        "torch.__future__.set_swap_module_params_on_conversion(True); m.float(); "
        "assert leaf.weight._cdata != c  # fails when the address is reused (0 of 300 tries "
        "of this loop on one machine, 0 of 13 examples of a random run: no count of examples "
        "tells a stale declaration from the allocator's luck)",
        id="torch.apply.swaps-twice-back", stale_after=None),
    Deviation(
        "APPLY-ATOMIC", commits_before_raising,
        ("value-changed", "slot-changed", "grad-changed", "INV-RAISE-UNCHANGED"),
        "_apply commits each tensor as soon as fn returns, so an error on the k-th tensor "
        "leaves the first k-1 converted. Repro: m = nn.Linear(2, 2); n = [0]; "
        "def fn(t):\n n[0] += 1\n if n[0] == 2: raise ValueError\n return t.double(); "
        "m._apply(fn) raises, and m.weight.dtype is float64",
        id="torch.apply.commits-before-raising"),
    Deviation(
        "APPLY-REFUSED-SWAP", converts_before_refused_swap,
        ("value-changed", "slot-changed", "grad-changed", "cdata-changed", "INV-RAISE-UNCHANGED"),
        "_apply commits each tensor before it swaps the next, so a tensor swap_tensors refuses "
        "leaves those before it converted; a refused grad also leaves its parameter swapped and "
        "its grad None. Repro: m = nn.Linear(2, 2); m.weight.grad = torch.ones(2, 2); "
        "held = weakref.ref(m.weight.grad); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m.double() raises RuntimeError, then m.weight.dtype is float64 and m.weight.grad is None",
        id="torch.apply.converts-before-refused-swap"),
    Deviation(
        "APPLY-GRAD-MISMATCH", grad_dtype_refused_midway, ("unchanged", "INV-RAISE-UNCHANGED"),
        "_apply sets `.grad` on the swap and overwrite paths after it has committed the "
        "parameter, so a grad of another dtype than its parameter (made by `param.data = ...`), "
        "which the `.grad` setter refuses, raises after the parameter (and every tensor before "
        "it) was converted; on the swap path the grad is also lost (torch 2.13). Repro: m = "
        "nn.Linear(2, 2); m(torch.ones(1, 2)).sum().backward(); m.weight.data = "
        "m.weight.data.double(); torch.__future__.set_swap_module_params_on_conversion(True); "
        "m._apply(lambda t: t.clone()) raises RuntimeError, then m.weight.grad is None",
        id="torch.apply.grad-dtype-refused-midway"),
    Deviation(
        "APPLY-REFUSED-SWAP", swaps_unseen_before_refused_swap, ("cdata-changed",),
        "_apply swaps each parameter before it swaps the next, so a tensor swap_tensors refuses "
        "leaves those before it swapped: where fn returned them as they were, only their "
        "TensorImpl is new, and only sometimes visibly (the allocator may give the new "
        "TensorImpl the freed one's address). Repro: m = nn.Module(); "
        "m.a = nn.Parameter(torch.ones(2)); m.b = nn.Parameter(torch.ones(2)); "
        "c = m.a._cdata; held = weakref.ref(m.b); "
        "torch.__future__.set_swap_module_params_on_conversion(True); "
        "m._apply(lambda t: t) raises RuntimeError, then m.a._cdata != c (when the address is "
        "not reused)",
        always=False, id="torch.apply.swaps-unseen-before-refused-swap", stale_after=None),
    Deviation(
        ("FC-RESTORE", "TOGETHER-CONVERTED-CALL"), swaps_one_slot_twice,
        ("not-restored", "INV-KINDS"),
        SHARED_SLOT, id="torch.fc.shared-slot-not-restored"),
    Deviation(
        "FC-FUNC-GRAD", swaps_one_slot_twice, ("restored", "grads"),
        "Under torch.func.grad too: " + SHARED_SLOT + " The second gradient path then runs on "
        "the given tensor left in the slot.",
        id="torch.fc.func-grad-shared-slot-not-restored"),
    Deviation(
        "FC-INPUT-FORMS", forms_swap_one_slot_twice, "INV-KINDS",
        "FC-INPUT-FORMS runs each form on a fresh build given fresh clones, so a given name of "
        "a shared submodule's slot leaves a clone in that slot (a plain Parameter where the "
        "module held a Parameter subclass). " + SHARED_SLOT,
        id="torch.fc.forms-shared-slot-not-restored"),
    Deviation("TOGETHER-APPLY-IN-FORWARD", swaps_one_slot_twice,
              ("original-changed", "INV-RAISE-UNCHANGED"),
              SHARED_SLOT, id="torch.together.shared-slot-original-changed"),
    Deviation("FC-TIES", slot_conflict_ignored, ("slot-conflict", "touched-on-error"),
              "With tie_weights=False torch does not notice two names of one shared slot "
              "given different objects; the last one wins and the slot is not restored. "
              + SHARED_SLOT, id="torch.fc.slot-conflict-ignored"),
    Deviation(
        "FC-RESTORE", forward_writes_beside_a_conflict, "not-restored", always=False,
        stale_after=None, reason=
        "With tie_weights=False torch runs a call whose two names of one shared slot carry "
        "different objects, which the spec refuses before touching the module; forward "
        "then writes slots the call does not fill, and those writes stay. FC-RESTORE sees it "
        "only where forward reaches such a write before anything raises (its own pre-hook "
        "raises in half the examples), which the drawn call does not tell. Repro: "
        "class Counter(nn.Module):\n def __init__(s): super().__init__(); "
        "s.register_buffer('count', torch.zeros(()))\n def forward(s, x): s.count = s.count + 1; "
        "return x; lin = nn.Linear(1, 1); c = Counter(); m = nn.Sequential(lin, lin, c); "
        "held = c.count; torch.func.functional_call(m, {'0.weight': torch.zeros(1, 1), "
        "'1.weight': torch.ones(1, 1)}, (torch.ones(1, 1),), tie_weights=False) returns; "
        "c.count is held  # False",
        id="torch.fc.conflict-runs-forward"),
    Deviation(("FC-VISIBLE", "FC-TIES"), partial_tie_group_key_error, ("raised", "tie-conflict"),
              PARTIAL_TIES, id="torch.fc.partial-tie-group-key-error"),
    Deviation("FC-TIES", partial_ties_beside_conflict, "tie-conflict", always=False,
              reason="Sometimes, by set order: " + PARTIAL_TIES,
              id="torch.fc.partial-ties-beside-conflict"),
    Deviation("FC-STRICT", partial_tie_group_key_error, ("strict-error", "raised"),
              PARTIAL_TIES, id="torch.fc.partial-tie-group-strict"),
    Deviation("FC-BAD-INPUT", partial_tie_group_key_error, "wrong-error", PARTIAL_TIES,
        id="torch.fc.partial-tie-group-wrong-error"),
    Deviation("FC-BAD-INPUT", swaps_one_slot_twice, ("touched-on-error", "INV-RAISE-UNCHANGED"),
              "When a later name is bad, torch undoes its swaps in the order it made them, so a "
              "shared submodule's slot swapped under two names keeps the first given tensor. "
              + SHARED_SLOT, id="torch.fc.shared-slot-touched-on-error"),
    Deviation("FC-ORACLE", partial_tie_group_key_error, "output", PARTIAL_TIES,
        id="torch.fc.partial-tie-group-output"),
    Deviation("FC-WRITE-BACK", partial_tie_group_key_error, "forward-outcome", PARTIAL_TIES,
        id="torch.fc.partial-tie-group-write-back"),
    Deviation("FC-WRITE-BACK", shared_slot_write_back_wrong, ("in-place-lost", "rebind-lost"),
              SHARED_SLOT, id="torch.fc.shared-slot-write-back"),
    Deviation(
        "FC-BAD-INPUT", gives_a_lazy_tensor,
        ("wrong-error", "touched-on-error", "INV-RAISE-UNCHANGED", "INV-WORKING", "INV-KINDS"),
        LAZY_VALUE, id="torch.fc.lazy-value-taken"),
    Deviation(
        "FC-RESTORE", gives_a_lazy_tensor,
        ("not-restored", "INV-RAISE-UNCHANGED", "INV-WORKING", "INV-KINDS"), always=False,
        stale_after=None, reason=LAZY_VALUE + " FC-RESTORE sees it only where the lazy module's "
        "hook ran before the call raised (a forward error raised earlier, or the hook's first "
        "tensor given, leave nothing to see), which the drawn call does not tell.",
        id="torch.fc.lazy-value-initializes"),
    Deviation(
        ("FC-ORACLE", "FC-WRITE-BACK"), rnn_ignores_a_none_weight, ("output", "forward-outcome"),
        always=False, reason=
        "An RNN's forward re-reads its weights only where RNNBase._weights_have_changed sees a "
        "changed one, and it skips None: a functional call that gives None to an RNN weight "
        "(and changes no other) runs forward with the weight it took out, where the spec's "
        "module holding None cannot run. Repro: rnn = nn.RNN(4, 4, num_layers=2); "
        "torch.func.functional_call(rnn, {'weight_hh_l1': None}, (torch.zeros(2, 4),)) "
        "returns an output; rnn.weight_hh_l1 = None; rnn(torch.zeros(2, 4)) raises TypeError",
        id="torch.fc.rnn-ignores-a-none-weight"),
    Deviation(
        ("FC-VISIBLE", "FC-TIES", "FC-STRICT"), rnn_none_weight_hides_forward_error, "raised",
        reason=
        "An RNN's forward re-reads its weights only where RNNBase._weights_have_changed sees a "
        "changed one, and it skips None: a functional call that gives None to an RNN weight "
        "(and changes no other) runs the RNN on the weight it took out, so a later layer's "
        "error comes out where the spec's module raises TypeError at the RNN. Repro: "
        "class M(nn.Module):\n def __init__(s): super().__init__(); s.rnn = nn.RNN(4, 4); "
        "s.lin = nn.Linear(4, 4)\n def forward(s, x): return s.lin(s.rnn(x)[0]); m = M(); "
        "torch.func.functional_call(m, {'rnn.weight_hh_l0': None, 'lin.weight': "
        "torch.zeros(3, 3)}, (torch.zeros(2, 4),)) raises RuntimeError (the Linear's shapes); "
        "m.rnn.weight_hh_l0 = None; m.lin.weight = nn.Parameter(torch.zeros(3, 3)); "
        "m(torch.zeros(2, 4)) raises TypeError at the RNN",
        id="torch.fc.rnn-none-weight-hides-forward-error"),
    Deviation(
        "FC-WRITE-BACK", tuple_rebind_lost, "rebind-lost",
        "torch.func.functional_call merges a tuple of dicts into a new dict, so a buffer "
        "rebound in forward is written back to that temporary dict, not to the caller's. "
        "Repro: class B(nn.Module):\n def __init__(s): super().__init__(); "
        "s.register_buffer('b', torch.zeros(1))\n def forward(s, x): s.b = s.b + 1; return x; "
        "d = {'b': torch.zeros(1)}; torch.func.functional_call(B(), (d,), (torch.ones(1),)); "
        "d['b'] is still the zeros tensor", id="torch.fc.tuple-rebind-lost"),
)
