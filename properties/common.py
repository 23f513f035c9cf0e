"""Shared pieces of the properties: the marker, settings, and running a target safely."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from torch import Tensor, nn
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.deviations import Checker
from swapspec.properties.examples import (
    Example,
    clone_value,
    holds_values,
    is_fake,
    named_tensors,
    same_values,
    slots,
)
from swapspec.properties.oracle import expected_view, owner_of
from swapspec.strategies import call_inputs, tree_info


def spec_property(property_id: str, *, suppress: tuple[HealthCheck, ...] = ()) -> Callable:
    """Mark a test as the check of one property, for the report and deviation lookup.

    Also relaxes what a host profile may set that does not fit torch: the deadline
    (torch's first calls are slow and machines are noisy), the too-slow and data-too-large
    health checks, and any in ``suppress``; and always prints a failure's
    ``@reproduce_failure`` blob, so a random run's failure can be replayed exactly.
    """
    relax = settings(deadline=None, print_blob=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            *suppress])

    def mark(test: Callable) -> Callable:
        return pytest.mark.swapspec_property(property_id)(relax(test))

    return mark


@dataclass
class Outcome:
    """What calling the target did: its result, or the exception it raised."""

    result: Any = None
    error: BaseException | None = None


def attempt(call: Callable[[], Any]) -> Outcome:
    """Run ``call``; capture any ``Exception`` instead of raising it."""
    try:
        return Outcome(result=call())
    except Exception as e:  # the property decides whether raising was right
        # without this frame in its traceback: the frame holds ``e``, a cycle that would keep
        # every frame below (and the tensors and graphs they hold) alive until a collection
        return Outcome(error=e.with_traceback(e.__traceback__.tb_next))


def no_error(check: Checker, outcome: Outcome, what: str) -> bool:
    """Clause ``raised``: the target must not raise here."""
    error = outcome.error
    return check.that(error is None, "raised",
                      f"{what} raised {type(error).__name__}: {error}" if error else "")


def is_uninitialized(t: Any) -> bool:
    return isinstance(t, UninitializedTensorMixin)


# ---- apply -----------------------------------------------------------------------------


def distinct(tensors: list[Tensor]) -> list[Tensor]:
    return list({id(t): t for t in tensors}.values())


@dataclass
class ApplySnapshot:
    """The module before ``apply``: slot contents, grads, ``_cdata``, and ``fn``'s results."""

    slots: dict[str, Any]
    names: dict[str, Tensor]
    grads: dict[int, Tensor | None]
    cdata: dict[int, int]
    requires_grad: dict[int, bool]
    classes: dict[int, type]
    attributes: dict[int, dict]
    expected: dict[int, Any] = field(default_factory=dict)
    expected_error: BaseException | None = None
    swap_refused: set[str] = field(default_factory=set)  # parameters the swap path would refuse


def snapshot_for_apply(module: nn.Module, make_fn: Callable[[], Callable],
                       recurse: bool = True, flags: Any = None) -> ApplySnapshot:
    """Record the module and what a fresh ``fn`` returns for each distinct tensor.

    With ``flags``, also the parameters that would take the swap path and that
    ``swap_tensors`` refuses (``swap_refused``; see ``refused_by_swap``).
    """
    names = named_tensors(module)
    params = distinct(list(module.parameters()))
    snap = ApplySnapshot(
        slots=slots(module), names=names,
        grads={id(p): p.grad for p in params},
        cdata={id(t): t._cdata for t in [*names.values(), *_grads(params)]},
        requires_grad={id(p): p.requires_grad for p in params},
        classes={id(p): type(p) for p in params},
        attributes={id(p): dict(p.__dict__) for p in params},
    )
    fn = make_fn()
    tensors = distinct(_tensors_in_apply_order(module, recurse))
    try:
        with torch.no_grad():
            for t in tensors:
                snap.expected[id(t)] = _frozen(fn(t))
    except Exception as e:
        snap.expected_error = e
    if flags is not None:
        swapped = {name for name, t in names.items() if id(t) in snap.classes
                   and id(t) in snap.expected  # converted (recurse=False converts fewer)
                   and expected_path(t, snap.expected[id(t)], flags.overwrite, flags.swap) == "swap"}
        snap.swap_refused = swapped & refused_by_swap(module)
    return snap


def refused_by_swap(module: nn.Module) -> set[str]:
    """Names of the parameters ``swap_tensors`` refuses, read on the module as it is now.

    Only trees trained with ``backward(create_graph=True)`` have any: their grads' autograd
    graphs can hold parameters (a use count ``swap_tensors`` refuses), and so can the
    AccumulateGrad node a parameter had before a conversion changed its dtype on the ``.data``
    path; and trees built under ``FakeTensorMode``, whose mode holds a weak reference to every
    fake parameter. A parameter counts when its grad is refused too (a view or a graph can hold
    the grad). The module itself is read, after whatever conversions it went through, with
    ``swap_tensors``' own checks and no swap (``swap_tensors_takes``).
    """
    info = tree_info(module)
    if info.spec.trained != "backward-create-graph" and info.spec.world != "fake":
        return set()
    return {name for name, p in module.named_parameters(remove_duplicate=False)
            if not is_uninitialized(p) and not (swap_tensors_takes(p) and _grad_swappable(p))}


def _grad_swappable(param: nn.Parameter) -> bool:
    """Whether ``swap_tensors`` takes the parameter's grad, read with the grad taken off the
    parameter meanwhile (as a conversion does: the parameter's own reference would count)."""
    grad, param.grad = param.grad, None
    try:
        return grad is None or swap_tensors_takes(grad)
    finally:
        param.grad = grad


def swap_tensors_takes(t: Tensor) -> bool:
    """Whether ``torch.utils.swap_tensors`` takes ``t`` now, by its own checks, read without
    swapping (a swap would leave its AccumulateGrad node unusable): no weak reference to it,
    and its TensorImpl held by its object alone, or also by its own AccumulateGrad node (the
    one ``get_gradient_edge`` finds without making a new one). A leaf held twice that does not
    require grad is refused, as ``swap_tensors`` refuses it (``get_gradient_edge`` raises)."""
    if weakref.getweakrefs(t):
        return False
    count = t._use_count()
    if count == 1:
        return True
    if count > 2 or not (t.is_leaf and t.requires_grad):
        return False
    node = torch.autograd.graph.get_gradient_edge(t).node  # made here if it did not exist
    made = t._use_count() > count
    del node
    return not made


def _swappable(param: nn.Parameter) -> bool:
    grad, param.grad = param.grad, None
    probe = nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
    try:
        torch.utils.swap_tensors(param, probe)
    except RuntimeError:
        return False
    else:
        torch.utils.swap_tensors(param, probe)
        return True
    finally:
        param.grad = grad


def _grads(params: list[Tensor]) -> list[Tensor]:
    return [p.grad for p in params if p.grad is not None]


def _tensors_in_apply_order(module: nn.Module, recurse: bool) -> list[Tensor]:
    """Parameters, then grads, then buffers: the order the reference converts them in."""
    modules = distinct_modules(module) if recurse else [module]
    params = distinct([p for m in modules for p in m._parameters.values() if p is not None])
    buffers = [b for m in modules for b in m._buffers.values() if b is not None]
    return [*params, *_grads(params), *buffers]


def distinct_modules(module: nn.Module) -> list[nn.Module]:
    return list({id(m): m for m in module.modules()}.values())


def _frozen(result: Any) -> Any:
    """A value copy of ``fn``'s result, so later in-place changes do not move it."""
    if not isinstance(result, Tensor) or is_uninitialized(result):
        return result
    if not holds_values(result) or is_traceable_wrapper_subclass(result):
        return result
    return result.detach().clone()


def expected_path(param: Tensor, applied: Tensor, overwrite: bool, swap: bool) -> str:
    """The spec's choice of path for one parameter."""
    if swap or is_traceable_wrapper_subclass(applied):
        return "swap"
    if torch._has_compatible_shallow_copy_type(param, applied) and not overwrite and not is_fake(applied):
        return "set_data"
    return "overwrite"


def check_path(check: Checker, name: str, before: Tensor, now: Tensor, before_cdata: int,
               path: str) -> None:
    """Clause ``path-<path>``: set_data keeps object and ``_cdata``, swap keeps the object
    with new ``_cdata``, overwrite puts a new object in the slot."""
    same, cdata_kept = now is before, now._cdata == before_cdata
    shown = {"set_data": same and cdata_kept, "swap": same and not cdata_kept,
             "overwrite": not same}[path]
    check.that(shown, f"path-{path}",
               f"{name!r} should take the {path} path (object kept: {same}, "
               f"_cdata kept: {cdata_kept})",
               code=f"{slot_code(name)} is before[{name!r}]" if path != "overwrite"
               else f"{slot_code(name)} is not before[{name!r}]")


def same_metadata(a: Tensor, b: Tensor) -> bool:
    return (a.dtype, a.device, a.layout, a.shape) == (b.dtype, b.device, b.layout, b.shape)


def converted_like(actual: Tensor, expected: Tensor, values: bool) -> bool:
    """``actual`` has ``expected``'s dtype, device, layout and shape, and values if asked."""
    if is_uninitialized(expected) or is_uninitialized(actual):
        return actual.dtype == expected.dtype and actual.device == expected.device
    if values and not is_traceable_wrapper_subclass(expected):
        return same_values(actual, expected)
    return same_metadata(actual, expected)


def run_apply(target: Any, example: Example, fn: Callable) -> Outcome:
    flags = example.flags
    return attempt(lambda: target.apply(example.module, fn, overwrite=flags.overwrite,
                                        swap=flags.swap, recurse=example.recurse))


def slot_code(name: str) -> str:
    """Repro code for the object in slot ``name`` after the call."""
    return f"named(module)[{name!r}]"


# ---- functional_call ---------------------------------------------------------------------

KEYWORD_DEFAULTS = {"tie_weights": True, "strict": False}


def target_call_inputs(target: Any, module: nn.Module, **options: Any):
    """``call_inputs`` drawing only what ``target`` takes: its ``call_forms``, and each keyword it
    lacks (``Target.has``) fixed to the spec's default."""
    fixed = {k: v for k, v in KEYWORD_DEFAULTS.items() if not target.has(k)}
    return call_inputs(module, forms=target.call_forms, **{**options, **fixed})


def call_target(target: Any, module: nn.Module, tensors: Any, args: tuple, kwargs: dict, *,
                tie_weights: bool = True, strict: bool = False) -> Any:
    """``target.functional_call``, passing only the keywords the target takes."""
    return target.functional_call(module, tensors, args, kwargs,
                                  **target.call_keywords(tie_weights=tie_weights, strict=strict))


@dataclass
class ModuleState:
    """A module's registration state: slot objects, attribute names, classes, values."""

    slots: dict[str, Any]
    layout: dict[str, tuple]
    values: dict[int, Tensor]


def module_state(module: nn.Module) -> ModuleState:
    """Record what a functional call must leave exactly as it found it."""
    layout = {
        path: (type(m), tuple(sorted(m.__dict__)), tuple(m._parameters), tuple(m._buffers))
        for path, m in module.named_modules(remove_duplicate=False)
    }
    table = slots(module)
    values = {id(t): t.detach().clone() for t in table.values()
              if isinstance(t, Tensor) and holds_values(t)}
    return ModuleState(table, layout, values)


def check_untouched(check: Checker, before: ModuleState, module: nn.Module,
                    clause: str, *, values_of: set[int] | None = None,
                    names: set[str] | None = None) -> None:
    """Clause ``clause``: same slot objects, no new or lost attributes, same classes.

    ``values_of`` limits the value comparison to those tensor ids, ``names`` the slot
    comparison to those slot names (default: all of both).
    """
    now = module_state(module)
    for name, obj in before.slots.items():
        if names is not None and name not in names:
            continue
        check.that(now.slots.get(name, _MISSING) is obj, clause,
                   f"slot {name!r} holds another object afterwards",
                   code=f"{slot_code(name)} is before[{name!r}]")
    for path, shape in before.layout.items():
        check.that(now.layout.get(path) == shape or _lazy_materialized(shape, now.layout.get(path)),
                   clause,
                   f"module {path or '<root>'!r} changed class or attributes: "
                   f"{_layout_diff(shape, now.layout.get(path))}")
    for key, value in before.values.items():
        if values_of is not None and key not in values_of:
            continue
        tensor = next(t for t in before.slots.values() if id(t) == key)
        check.that(same_values(tensor, value), clause, "a module tensor changed value")


_MISSING = object()


def _lazy_materialized(old: tuple, new: tuple | None) -> bool:
    """A lazy module that forward initialized: its class became ``cls_to_become``."""
    return new is not None and getattr(old[0], "cls_to_become", None) is new[0]


def _layout_diff(old: tuple, new: tuple | None) -> str:
    if new is None:
        return "module gone"
    labels = ("class", "__dict__", "_parameters", "_buffers")
    return "; ".join(f"{label}: {a} -> {b}" for label, a, b in zip(labels, old, new, strict=True)
                     if a != b)


@dataclass
class ForwardView:
    """What a forward pre-hook on the root saw during the first call."""

    named: dict[str, Tensor] = field(default_factory=dict)
    parameter_ids: set[int] = field(default_factory=set)
    buffer_ids: set[int] = field(default_factory=set)
    state_dict: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    seen: bool = False


def watch_forward(module: nn.Module, owners: dict[str, tuple[nn.Module, str]]):
    """Register a pre-hook that fills a ``ForwardView``; return (view, handle)."""
    view = ForwardView()

    def hook(mod, args, kwargs):
        if view.seen:
            return None
        view.seen = True
        view.named = named_tensors(mod)
        view.parameter_ids = {id(p) for p in mod.parameters()}
        view.buffer_ids = {id(b) for b in mod.buffers()}
        view.state_dict = dict(mod.state_dict(keep_vars=True))
        view.attributes = {n: getattr(o, k, _MISSING) for n, (o, k) in owners.items()}
        return None

    return view, module.register_forward_pre_hook(hook, with_kwargs=True)


def load_into(owner: nn.Module, key: str, value: Any) -> None:
    """Put ``value`` permanently in ``owner``'s slot ``key`` (the oracle's copy)."""
    for table in (owner._parameters, owner._buffers):
        if key in table:
            table[key] = value
            return
    setattr(owner, key, value)


def same_output(a: Outcome, b: Outcome) -> bool:
    """Both raised the same exception type, or both returned equal tensors."""
    if a.error is not None or b.error is not None:
        return type(a.error) is type(b.error)
    x, y = a.result, b.result
    if isinstance(x, Tensor) and isinstance(y, Tensor):
        return same_values(x.detach(), y.detach())
    return x == y


def conversion_named(name: str):
    """The built-in conversion called ``name`` (``"double()"``, ``"to('meta')"``...)."""
    from swapspec.strategies.conversions import CONVERSIONS

    return next(c for c in CONVERSIONS if c.name == name)


def identity_preserving_clones(values: Any) -> dict[int, Any]:
    """One clone per distinct object, so names that shared an object still share one."""
    return {id(v): clone_value(v) for v in values}


def loaded_copy(module: nn.Module, filled: dict[str, Any], call: Any,
                own: dict[str, Tensor] | None = None) -> tuple[nn.Module, dict]:
    """A fresh build of ``module`` with ``filled`` loaded for good, and kwargs for it.

    The copy keeps every alias the real call has: a name filled with one of the module's own
    tensors gets the copy's counterpart of that tensor (so it still shares the object with the
    slots that hold it, and sees forward's in-place updates through them); every other filled
    object gets one clone, shared by every name filled with it. ``own`` is the module's
    ``named_tensors`` before the call (default: now; after a call that did not restore the
    module, pass what it held before).
    """
    copy = tree_info(module).build()
    counterparts = own_counterparts(named_tensors(module) if own is None else own, copy)
    stand_ins = {**identity_preserving_clones(v for v in filled.values() if id(v) not in counterparts),
                 **counterparts}
    for name, value in filled.items():
        owner, key = owner_of(copy, name)
        load_into(owner, key, stand_ins[id(value)])
    return copy, fresh_kwargs(call)


def own_counterparts(mine: dict[str, Tensor], copy: nn.Module) -> dict[int, Tensor]:
    """Each of the module's own tensors ``mine`` (by name, as ``named_tensors`` gives them; keyed
    by id here) -> the tensor ``copy`` holds under the same name.

    ``copy`` is a fresh build of the module's tree, so its tensors are tied as the module's are."""
    theirs = named_tensors(copy)
    return {id(t): theirs[name] for name, t in mine.items() if name in theirs}


def replaced_originals(module: nn.Module, filled: dict[str, Any]) -> set[int]:
    """Ids of the module's own tensors that a valid call filled with ``filled`` takes out of
    reach: every slot that held one holds a filled value during the call.

    Only these must keep their values: an original that an unfilled alias still shows (a
    tied buffer with ``tie_weights=False``), or that is itself a filled value, is forward's to
    update in place.
    """
    registered = named_tensors(module)
    reachable = {id(v) for v in expected_view(module, filled).values()}
    reachable |= {id(v) for v in filled.values()}
    return {id(registered[n]) for n in filled if n in registered} - reachable


def fresh_copy_holding(module: nn.Module) -> nn.Module:
    """A fresh build of ``module``'s tree whose every slot holds a clone of ``module``'s tensor
    there, one clone per object (ties stay ties), set with ``setattr`` so modules that derive
    state from their parameters (an RNN's ``_flat_weights``) see them."""
    copy = tree_info(module).build()
    named = named_tensors(module)
    clones = identity_preserving_clones(named.values())
    for name, value in named.items():
        prefix, _, key = name.rpartition(".")
        owner = copy.get_submodule(prefix) if prefix else copy
        clone = clones[id(value)]
        if key in owner._parameters and not isinstance(clone, nn.Parameter):
            clone = nn.Parameter(clone, requires_grad=value.requires_grad)
        setattr(owner, key, clone)
    return copy


def fresh_kwargs(call: Any) -> dict[str, Any]:
    """The call's kwargs with a new ``report`` list, so runs do not share one."""
    return {k: ([] if k == "report" else v) for k, v in call.kwargs.items()}


def copy_outcome(module: nn.Module, filled: dict[str, Any], call: Any,
                 own: dict[str, Tensor] | None = None) -> Outcome:
    """What forward does on a loaded copy: the spec's model of the call's result (``own``: as
    for ``loaded_copy``)."""
    copy, kwargs = loaded_copy(module, filled, call, own)
    return attempt(lambda: copy(*[clone_value(a) for a in call.args], **kwargs))


# Percent of the untrained trees of the conversion, FC-* and TOGETHER-* properties built in a
# tensor world (meta, TwoTensor parameters; see strategies.trees.move_to_world).
WORLD_CHANCE = 10
