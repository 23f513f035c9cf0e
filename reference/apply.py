"""Reference ``apply``: convert a module's parameters, grads and buffers with ``fn``.

This is the executable spec for ``nn.Module._apply`` (what ``to``, ``half``, ``cpu``,
``to_empty`` and ``share_memory`` run). Each rule lives in one place, named below.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedParameter, UninitializedTensorMixin
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.reference.flags import (
    get_overwrite_module_params_on_conversion,
    get_swap_module_params_on_conversion,
)
from swapspec.reference.overrides import ApplyOverride, hook_overrides_of, overrides_of

SWAP, SET_DATA, OVERWRITE = "swap", "set_data", "overwrite"


@dataclass
class _Slots:
    """Every (module, key) slot that holds one tensor object, in traversal order."""

    tensor: Tensor
    where: list[tuple[nn.Module, str]] = field(default_factory=list)


@dataclass(eq=False)
class _Step:
    """One class's ``_apply`` override (rules 9 and 10) on one module."""

    module: nn.Module
    override: ApplyOverride


def apply(
    module: nn.Module,
    fn: Callable[[Tensor], Tensor],
    *,
    overwrite: bool | None = None,
    swap: bool | None = None,
    recurse: bool = True,
) -> nn.Module:
    """Convert every parameter, grad and buffer of ``module`` with ``fn``; return ``module``.

    Rules:
    1. Flags left as ``None`` are read from ``reference.flags``.
    2. ``recurse=False`` touches only ``module``'s own tensors; otherwise every module of
       the tree, each shared submodule once (``_modules_to_convert``).
    3. ``fn`` runs exactly once per distinct tensor object, under ``torch.no_grad()``, and
       every slot that held one object ends up holding one result (``_convert_all``).
    4. Atomicity: every ``fn`` call happens before any slot changes, so if ``fn`` raises,
       the module is untouched and the error propagates unchanged. A failure while
       committing (a refused swap) is rolled back (``_commit``).
    5. The path is chosen per distinct parameter (``choose_path``): swap if the swap flag
       is set or ``fn(p)`` is a traceable wrapper subclass; else set_data if
       ``torch._has_compatible_shallow_copy_type(p, fn(p))``, the overwrite flag is off and
       ``fn(p)`` is not a ``FakeTensor`` (whose device lives in the Python object, which ``.data =``
       does not carry); else overwrite. A TensorImpl change therefore never goes through ``.data =``.
    6. The parameter keeps its class (``Parameter`` subclasses, ``UninitializedParameter``),
       its instance attributes and its ``requires_grad`` on every path, unless ``fn(p)`` is
       itself a tensor subclass, whose class then wins (``_as_parameter_like``); then the
       attributes the subclass instance sets itself win too (a ``FakeTensor``'s device).
    7. A grad follows its parameter: swapped when the parameter is swapped (unless ``fn``
       returns the grad itself), ``.data =`` when the parameter took set_data and the grad's
       result is compatible, else replaced by ``fn(grad)``. It stays a leaf and keeps its
       own ``requires_grad`` (``_commit_grad``). A grad whose dtype, device or shape differs
       from its parameter's (``param.data = ...`` makes that state) is converted the same way;
       where the swap or overwrite path then sets a grad the ``.grad`` setter refuses on the
       converted parameter (torch's ``RuntimeError``), the conversion is refused and changes
       nothing (rule 1); the set_data path never sets ``.grad`` and keeps the state.
    8. Buffers are rebound: ``module._buffers[key] = fn(buf)``. ``None`` slots stay ``None``.
    9. Overrides (``reference.overrides``): a class's own ``_apply`` may do work before and
       after the conversion of its own tensors, must delegate that conversion itself to
       ``super()._apply``, and its work must not change the tensors in slots. The reference
       converts the tensors itself and runs that work as the class's described ``before`` and
       ``after`` steps. Every class of a module's MRO ahead of ``nn.Module`` that defines
       ``_apply`` must be described (``torch.nn.RNNBase`` is built in; a host adds its own with
       ``register_apply_override``); an unknown or refused one raises ``ApplyOverrideError``
       before anything changes (``_override_steps``). Old-style reparametrizations
       (``torch.nn.utils.weight_norm``, ``spectral_norm``, ``prune``) are described per hook:
       their computed attribute is dropped before and computed again after.
    10. Order and failure (``_run_overridden``), torch's order: every ``before`` runs before
       any ``fn`` call, parents before children and the outer class first; every ``after``
       runs after the commit, children before parents and the inner class first. If a
       ``before`` or the conversion fails, the ``after`` of every step whose ``before`` ran
       still runs (its ``undo`` instead, where it has one), so state derived from the tensors
       (an RNN's ``_flat_weights``) is rebuilt from the restored ones, and that error propagates
       unchanged (an ``after`` error then becomes a note on it). After a successful commit every
       ``after`` runs and the first error among them propagates; the conversion stays.
    11. Tensor hooks (``_carry_tensor_hooks``): a parameter's ``register_hook`` and
       ``register_post_accumulate_grad_hook`` hooks fire after the conversion on every path:
       the overwrite path registers them on the new parameter, the swap path re-registers them
       on the swapped-in TensorImpl (a hook registered after the swap fires too). Removing a
       hook through its handle still works.
    12. A grad that carries an autograd graph (``backward(create_graph=True)``) keeps its
       ``requires_grad``. Its graph can hold the parameter, and then ``swap_tensors`` refuses
       the parameter: rule 4 rolls back, and the error notes the graph.
    13. Swaps are checked before any is made (``_check_swappable``): ``swap_tensors`` marks
       the AccumulateGrad node of every leaf it swaps unusable, and swapping back restores the
       TensorImpl with that node, so a refusal found after an earlier swap would leave a
       parameter whose next backward fails for as long as a graph holds the node. A parameter
       (or grad) that ``swap_tensors`` would refuse is refused before anything changes.
    14. Inference mode: the conversion and its commit run with inference mode off
       (``torch.inference_mode(False)``), so what a conversion leaves in the slots is never an
       inference tensor made by it: a module outlives the mode it was converted under, and
       later trains (an inference tensor in a parameter never accumulates a grad, and one in
       a buffer refuses a training forward's in-place update).
    """
    overwrite = get_overwrite_module_params_on_conversion() if overwrite is None else overwrite
    swap = get_swap_module_params_on_conversion() if swap is None else swap
    modules = _modules_to_convert(module, recurse)
    steps = _override_steps(list(module.modules()) if recurse else [module])
    _run_overridden(steps, modules, lambda: _convert_and_commit(fn, modules, overwrite, swap))
    return module


def _convert_and_commit(fn: Callable[[Tensor], Tensor], modules: list[nn.Module],
                        overwrite: bool, swap: bool) -> None:
    """Rules 3-8 and 14: the conversion itself, atomic, with inference mode off."""
    with torch.inference_mode(False):
        _convert_and_commit_normal(fn, modules, overwrite, swap)


def _convert_and_commit_normal(fn: Callable[[Tensor], Tensor], modules: list[nn.Module],
                               overwrite: bool, swap: bool) -> None:
    """Rules 3-8: the conversion itself, atomic."""
    params = _collect(modules, "_parameters")
    buffers = _collect(modules, "_buffers")
    grads = [s.tensor.grad for s in params if s.tensor.grad is not None]
    results = _convert_all(fn, [s.tensor for s in params] + grads + [s.tensor for s in buffers])
    _commit(params, buffers, results, overwrite=overwrite, swap=swap)


def choose_path(param: Tensor, applied: Tensor, *, overwrite: bool, swap: bool) -> str:
    """Rule 5: the conversion path of one parameter."""
    if _takes_swap(applied, swap=swap):
        return SWAP
    if torch._has_compatible_shallow_copy_type(param, applied) and not overwrite and not _is_fake(applied):
        return SET_DATA
    return OVERWRITE


def _takes_swap(applied: Tensor, *, swap: bool) -> bool:
    """Rule 5: whether a parameter converted to ``applied`` takes the swap path."""
    return swap or is_traceable_wrapper_subclass(applied)


def _is_fake(t: Tensor) -> bool:
    """Rule 5: whether ``t`` is a ``FakeTensor``."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _modules_to_convert(module: nn.Module, recurse: bool) -> list[nn.Module]:
    """Rule 2: children before parents (torch's order), each module object once."""
    if not recurse:
        return [module]
    ordered: list[nn.Module] = []
    seen: set[int] = set()

    def visit(m: nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        for child in m.children():
            visit(child)
        ordered.append(m)

    visit(module)
    return ordered


def _override_steps(parents_first: list[nn.Module]) -> list[_Step]:
    """Rule 9: every override step in ``before`` order; raises before anything changes."""
    return [_Step(m, override) for m in parents_first
            for override in (*overrides_of(m), *hook_overrides_of(m))]


def _run_overridden(steps: list[_Step], children_first: list[nn.Module],
                    convert: Callable[[], None]) -> None:
    """Rule 10: the ``before`` steps, ``convert()``, then the ``after`` of every step whose
    ``before`` ran, also when a ``before`` or the conversion raises (that error wins)."""
    ran: list[_Step] = []
    try:
        for step in steps:
            step.override.before(step.module)
            ran.append(step)
        convert()
    except BaseException as error:
        _run_afters(_after_order(ran, children_first), failure=error)
        raise
    _run_afters(_after_order(ran, children_first), failure=None)


def _after_order(ran: list[_Step], children_first: list[nn.Module]) -> list[_Step]:
    """Rule 10: children before parents; within one module the inner class first (``ran``
    lists it last, and the sort is stable)."""
    position = {id(m): i for i, m in enumerate(children_first)}
    return sorted(reversed(ran), key=lambda step: position[id(step.module)])


def _run_afters(steps: list[_Step], failure: BaseException | None) -> None:
    """Rule 10: every ``after`` (after a failure: its ``undo``, where given) runs. Their first
    error propagates when nothing failed before; after a failure, that failure propagates and
    their errors are only noted on it."""
    first: Exception | None = None
    for step in steps:
        undo = step.override.undo if failure is not None else None
        try:
            (undo or step.override.after)(step.module)
        except Exception as error:
            if failure is not None:
                failure.add_note(f"then the after step on {step.module._get_name()} raised {error!r}")
            elif first is None:
                first = error
    if first is not None:
        raise first


def _collect(modules: list[nn.Module], registry: str) -> list[_Slots]:
    """Group the non-None slots of ``registry`` by tensor object, in first-seen order."""
    by_id: dict[int, _Slots] = {}
    for m in modules:
        for key, tensor in getattr(m, registry).items():
            if tensor is not None:
                by_id.setdefault(id(tensor), _Slots(tensor)).where.append((m, key))
    return list(by_id.values())


def _convert_all(fn: Callable[[Tensor], Tensor], tensors: list[Tensor]) -> dict[int, Tensor]:
    """Rules 3 and 4: call ``fn`` once per distinct tensor before changing anything."""
    results: dict[int, Tensor] = {}
    with torch.no_grad():
        for t in tensors:
            if id(t) not in results:
                results[id(t)] = fn(t)
    return results


def _commit(params, buffers, results, *, overwrite: bool, swap: bool) -> None:
    """Rule 4: apply every change, undoing the ones already made if one fails."""
    _check_swappable(params, results, swap=swap)
    undo: list[Callable[[], None]] = []
    try:
        for slots in params:
            final = _commit_param(slots, results, undo, overwrite=overwrite, swap=swap)
            results[id(slots.tensor)] = final  # a buffer slot holding this parameter follows it
        for slots in buffers:
            _rebind(slots, results[id(slots.tensor)], "_buffers", undo)
    except BaseException:
        for step in reversed(undo):
            step()
        raise


def _check_swappable(params, results, *, swap: bool) -> None:
    """Rule 13: raise rule 12's error for the first swap-path parameter or grad that
    ``swap_tensors`` would refuse, before any is swapped; the cause says why."""
    for slots in params:
        param = slots.tensor
        if not _takes_swap(results[id(param)], swap=swap):
            continue
        grad = param.grad
        param.grad = None  # as _swap_param does before its swap
        try:
            reason = _swap_refusal(param)
            grad_reason = (_swap_refusal(grad) if grad is not None and results[id(grad)] is not grad
                           else None)
        finally:
            put_grad(param, grad)
        if reason is not None:
            raise _swap_error(slots, grad) from RuntimeError(reason)
        if grad_reason is not None:
            raise _grad_swap_error(slots) from RuntimeError(grad_reason)


def _swap_refusal(t: Tensor) -> str | None:
    """Why ``swap_tensors`` would refuse to swap ``t``'s contents, or None: a weak reference,
    or a TensorImpl referenced from elsewhere than its object and its own AccumulateGrad node."""
    if weakref.getweakrefs(t):
        return "the tensor has a weakref associated with it"
    count = t._use_count()
    if count == 1 or (count == 2 and _held_by_own_node(t)):
        return None
    return (f"the TensorImpl has {count} references, more than its object and its "
            "AccumulateGrad node; something else holds it (a view, a saved tensor)")


def _held_by_own_node(t: Tensor) -> bool:
    """Whether the one reference to ``t``'s TensorImpl beside its object is its AccumulateGrad
    node: ``t`` is a leaf that requires grad, and asking for the node did not create it."""
    if not (t.is_leaf and t.requires_grad):
        return False
    count = t._use_count()
    node = torch.autograd.graph.get_gradient_edge(t).node  # created here if it did not exist
    created = t._use_count() > count
    del node
    return not created


def _swap_error(slots: _Slots, grad: Tensor | None) -> RuntimeError:
    """Rule 12's error for a refused parameter swap, noting a grad's graph."""
    module, key = slots.where[0]
    error = RuntimeError(f"_apply(): Couldn't swap {module._get_name()}.{key}")
    if _carries_graph(grad):
        error.add_note(f"{key}'s grad carries an autograd graph (backward(create_graph=True)) "
                       "that can hold the parameter; clear or detach the grads first")
    return error


def _grad_swap_error(slots: _Slots) -> RuntimeError:
    """Rule 7's error for a refused grad swap, torch's message."""
    module, key = slots.where[0]
    return RuntimeError(f"_apply(): Couldn't swap {module._get_name()}.{key}.grad")


def _commit_param(slots: _Slots, results, undo, *, overwrite: bool, swap: bool) -> Tensor:
    """Rules 5 and 6 for one parameter object, then rule 7 for its grad; return the result."""
    param = slots.tensor
    applied = results[id(param)]
    grad = param.grad
    path = choose_path(param, applied, overwrite=overwrite, swap=swap)
    if path == SWAP:
        _swap_param(slots, param, applied, grad, undo)
        target = param
    elif path == SET_DATA:
        _set_data(param, applied, undo)
        target = param
    else:
        target = _as_parameter_like(param, applied)
        _rebind(slots, target, "_parameters", undo)
    if grad is not None:
        _commit_grad(slots, target, grad, results[id(grad)], path, undo)
    return target


def _as_parameter_like(param: Tensor, applied: Tensor) -> Tensor:
    """Rule 6: a new Parameter holding ``applied`` with ``param``'s class and attributes."""
    if isinstance(applied, UninitializedTensorMixin):
        new = UninitializedParameter(param.requires_grad, applied.device, applied.dtype)
    else:
        if isinstance(applied, nn.Parameter):
            applied = applied.detach()  # fn returned a parameter (often ``param`` itself)
        new = nn.Parameter(applied, requires_grad=param.requires_grad)
    if type(applied) in (Tensor, nn.Parameter):  # a parameter was detached above
        new.__class__ = type(param)
    new.__dict__.update({k: v for k, v in param.__dict__.items() if k not in new.__dict__})
    _carry_tensor_hooks(_tensor_hooks(param), new)
    return new


def _tensor_hooks(param: Tensor) -> tuple[object, object]:
    """Rule 11: the parameter's hook tables (``register_hook``, post-accumulate-grad)."""
    return param._backward_hooks, param._post_accumulate_grad_hooks


def _carry_tensor_hooks(hooks: tuple[object, object], tensor: Tensor) -> None:
    """Rule 11: register these hook tables on ``tensor``'s own TensorImpl. The tables are the
    same objects, so the handles ``register_hook`` returned still remove the hooks."""
    backward, post_accumulate = hooks
    if backward is not None:
        tensor._backward_hooks = backward
    if post_accumulate is not None:
        tensor._post_accumulate_grad_hooks = post_accumulate


def _swap_param(slots: _Slots, param: Tensor, applied: Tensor, grad, undo) -> None:
    """Swap path: the object stays, its contents (and grad, see rule 7) are replaced."""
    new = _as_parameter_like(param, applied)
    hooks = _tensor_hooks(param)
    if grad is not None:
        param.grad = None  # reading .grad holds a use count that blocks swap_tensors
    try:
        torch.utils.swap_tensors(param, new)
    except Exception as e:
        put_grad(param, grad)
        raise _swap_error(slots, grad) from e
    _carry_tensor_hooks(hooks, param)  # the hooks were registered on the swapped-out TensorImpl

    def swap_back() -> None:  # later steps are undone first, so param.grad is None again here
        torch.utils.swap_tensors(param, new)
        _carry_tensor_hooks(hooks, param)
        put_grad(param, grad)

    undo.append(swap_back)


def _carries_graph(grad: Tensor | None) -> bool:
    return grad is not None and grad.grad_fn is not None


def _set_data(tensor: Tensor, applied: Tensor, undo) -> None:
    """set_data path: the object and its ``_cdata`` stay, ``.data`` is replaced."""
    old = tensor.data
    tensor.data = applied

    def restore() -> None:
        tensor.data = old

    undo.append(restore)


def _rebind(slots: _Slots, value: Tensor, registry: str, undo) -> None:
    """Overwrite path and buffers: every slot of one object gets the one ``value``."""
    for module, key in slots.where:
        table = getattr(module, registry)
        old = table[key]
        table[key] = value
        undo.append(lambda table=table, key=key, old=old: table.__setitem__(key, old))


def _commit_grad(slots: _Slots, target: Tensor, grad: Tensor, applied: Tensor, path: str,
                 undo) -> None:
    """Rule 7: convert the grad along its parameter's path; it stays a leaf.

    A grad that ``fn`` returns unchanged is not swapped (there is nothing to swap in).
    """
    requires_grad = grad.requires_grad
    if path == SWAP and applied is grad:
        _set_grad(target, grad, undo)
    elif path == SWAP:
        applied.requires_grad_(requires_grad)
        try:
            torch.utils.swap_tensors(grad, applied)
        except Exception as e:
            raise _grad_swap_error(slots) from e
        undo.append(lambda: torch.utils.swap_tensors(grad, applied))
        _set_grad(target, grad, undo)
    elif path == SET_DATA and torch._has_compatible_shallow_copy_type(grad, applied):
        _set_data(grad, applied, undo)
    else:
        _set_grad(target, applied.requires_grad_(requires_grad), undo)


def _set_grad(target: Tensor, grad: Tensor, undo) -> None:
    old = target.grad
    target.grad = grad

    def restore() -> None:
        put_grad(target, old)

    undo.append(restore)


def put_grad(param: Tensor, grad: Tensor | None) -> None:
    """``param.grad = grad``, also where the grad's dtype, device or shape is not the
    parameter's: a state ``param.data = ...`` can make and the ``.grad`` setter refuses to make
    again, which a refused conversion must leave as it found it. The parameter shows the grad's
    metadata for the assignment only (its ``.data`` is put back)."""
    if grad is None or (grad.dtype, grad.device, grad.shape) == (param.dtype, param.device,
                                                                 param.shape):
        param.grad = grad
        return
    data = param.data
    param.data = torch.empty_like(grad)
    try:
        param.grad = grad
    finally:
        param.data = data
