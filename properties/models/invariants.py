"""The invariants that hold after every operation (``apply``, a public method, ``functional_call``,
``load_state_dict``, and every step of a sequence), in one place: what the spec predicts whatever
the operation was.

- ``INV-RAISE-UNCHANGED``: a call that raises leaves everything as it was: the module, every
  other module, the caller's tensors and dicts, and the process state (flags, default dtype,
  grad mode).
- ``INV-WORKING``: a call that succeeds leaves a working module: whatever worked before still
  works (forward, backward, ``state_dict``); the module behaves as one built fresh in the
  resulting state would.
- ``INV-KINDS``: kinds are kept: parameters stay parameters (class, subclass, instance
  attributes, ``requires_grad``), buffers stay buffers (persistent or not), children stay
  children, a module keeps its forward and backward hooks, and its class unless torch's docs
  say when it changes.
- ``INV-INDEPENDENT``: modules that share no tensors never affect each other, whatever is done
  to one of them.
- ``INV-STRICT-EXACT``: strict means exact: every key that does not address a slot is reported
  (``load_state_dict``'s ``unexpected_keys`` or strict error, ``functional_call``'s strict error).

A snapshot (``world``, ``kinds``) is taken before the operation; the checks (``unchanged``,
``kinds_kept``, ``works``, ``independent``, ``strict_exact``) return the ``Violation``s found,
each under its invariant's ID as the clause, so a declaration names a torch break of one like any
other clause. The harness calls them where a one-shot property calls the target, and the sequence
machine after every step.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedTensorMixin

from swapspec import reference
from swapspec.properties.models.call_state import ModuleState, copy_layout, module_state
from swapspec.properties.models.examples import (
    holds_values,
    is_wrapper,
    named_tensors,
    same_values,
    value_copy,
)
from swapspec.properties.vocabulary import Violation
from swapspec.reference.apply import put_grad
from swapspec.strategies import tree_info
from swapspec.strategies.modules import BATCH, FEATURES

RAISE_UNCHANGED = "INV-RAISE-UNCHANGED"
WORKING = "INV-WORKING"
KINDS = "INV-KINDS"
INDEPENDENT = "INV-INDEPENDENT"
STRICT_EXACT = "INV-STRICT-EXACT"

# (ID, rule): the catalogue prints them (``harness.catalogue``).
INVARIANTS: tuple[tuple[str, str], ...] = (
    (RAISE_UNCHANGED, "A call that raises leaves everything as it was: the module, every other "
     "module, the caller's tensors and dicts, and the process state (flags, default dtype, grad "
     "mode)."),
    (WORKING, "Success leaves a working module: whatever worked before still works (forward, "
     "backward, ``state_dict``, the next operation); the module behaves as one built fresh in the "
     "resulting state would."),
    (KINDS, "Kinds are kept: parameters stay parameters (class, subclass, instance attributes, "
     "``requires_grad``), buffers stay buffers (persistent or not), children stay children; a "
     "module keeps its forward and backward hooks, and its class unless torch's docs say when it "
     "changes."),
    (INDEPENDENT, "Modules that share no tensors never affect each other, whatever is done to one "
     "of them."),
    (STRICT_EXACT, "Strict means exact: every key that does not address a slot is reported "
     "(``load_state_dict``'s ``unexpected_keys`` or strict error, ``functional_call``'s strict "
     "error)."),
)
IDS: tuple[str, ...] = tuple(i for i, _ in INVARIANTS)


def enabled(target: Any) -> bool:
    """Whether the harness checks the invariants on ``target``: ``SWAPSPEC_INVARIANTS=1`` or
    ``0`` decides for every target; unset, the target's ``invariants`` field does (on for the
    built-in targets, whose breaks of them are declared; off for a host's target unless it sets
    ``invariants=True``)."""
    chosen = os.environ.get("SWAPSPEC_INVARIANTS")
    if chosen in ("0", "1"):
        return chosen == "1"
    return bool(getattr(target, "invariants", False))


# ---- INV-RAISE-UNCHANGED -----------------------------------------------------------------


def process_state() -> tuple:
    """The process state no call may change when it raises: torch's and the reference's flags,
    the default dtype, grad mode and inference mode."""
    future = torch.__future__
    return (future.get_overwrite_module_params_on_conversion(),
            future.get_swap_module_params_on_conversion(),
            reference.get_overwrite_module_params_on_conversion(),
            reference.get_swap_module_params_on_conversion(),
            torch.get_default_dtype(), torch.is_grad_enabled(), torch.is_inference_mode_enabled())


@dataclass
class _Mapping:
    """A caller's dict as given: the object, its keys in order, each value's object and values."""

    obj: Mapping
    keys: tuple
    ids: tuple
    values: dict[int, Tensor]


def _mapping(obj: Mapping) -> _Mapping:
    items = list(obj.items())
    return _Mapping(obj, tuple(k for k, _ in items), tuple(id(v) for _, v in items),
                    {id(v): value_copy(v) for _, v in items
                     if isinstance(v, Tensor) and holds_values(v)})


@dataclass
class World:
    """What an operation may touch: the modules (``module_state``: slot objects, classes,
    attributes, values), the caller's dicts and tensors, and the process state."""

    modules: list[tuple[nn.Module, ModuleState]]
    mappings: list[_Mapping]
    process: tuple


def world(modules: Iterable[nn.Module], mappings: Iterable[Any] = ()) -> World:
    """The snapshot of ``modules``, the caller's ``mappings`` (dicts, or tuples of dicts) and the
    process state, taken before an operation."""
    flat: list[Mapping] = []
    for m in mappings:
        if isinstance(m, Mapping):
            flat.append(m)
        elif isinstance(m, (tuple, list)):
            flat.extend(d for d in m if isinstance(d, Mapping))
    return World([(m, module_state(m)) for m in modules], [_mapping(m) for m in flat],
                 process_state())


def unchanged(before: World, clause: str = RAISE_UNCHANGED, *,
              forward_ran: bool = False) -> list[Violation]:
    """``INV-RAISE-UNCHANGED``: every module, caller's dict and the process state as in
    ``before`` (read now).

    ``forward_ran``: the operation raised inside the module's own forward, which keeps what its
    code did before it raised (a value updated in place, a buffer rebound by ``self.count =
    ...``), as a plain call does. The objects in the slots, their values, and the objects and
    values of the caller's tensors (a functional call's forward updates the given tensors in
    place, and writes a given buffer it rebound back into the caller's dict, on a raise too)
    are then not compared: the caller holds them to its model of that forward. The
    registrations, the caller's dicts' keys and the process state still are."""
    out: list[Violation] = []
    for module, state in before.modules:
        out += _module_unchanged(state, module, clause, slots=not forward_ran)
    for m in before.mappings:
        items = list(m.obj.items())
        keys, ids = tuple(k for k, _ in items), tuple(id(v) for _, v in items)
        if keys != m.keys or (ids != m.ids and not forward_ran):
            out.append(Violation(clause, "the caller's dict changed (keys or the objects they hold)"))
            continue
        for key, value in items if not forward_ran else ():
            if id(value) in m.values and not _same_anywhere(value, m.values[id(value)]):
                out.append(Violation(clause, f"the caller's tensor under {key!r} changed value"))
    if process_state() != before.process:
        out.append(Violation(clause, "the process state changed (flags, default dtype, grad mode)",
                             code="process_state() == before"))
    return out


def _module_unchanged(state: ModuleState, module: nn.Module, clause: str, *,
                      slots: bool = True) -> list[Violation]:
    """Slots (their objects and values, where ``slots``) and registrations as in ``state``."""
    now = module_state(module)
    out = []
    for name, obj in state.slots.items() if slots else ():
        if now.slots.get(name, _GONE) is not obj:
            out.append(Violation(clause, f"slot {name!r} holds another object",
                                 code=f"named(module).get({name!r}) is before.get({name!r})"))
    for name in now.slots.keys() - state.slots.keys():
        out.append(Violation(clause, f"slot {name!r} appeared"))
    for path, shape in state.layout.items():
        if now.layout.get(path) != shape:
            out.append(Violation(clause, f"module {path or '<root>'!r} changed class, attributes "
                                         "or registrations"))
    by_id = {id(t): (n, t) for n, t in state.slots.items() if isinstance(t, Tensor)}
    for key, value in state.values.items() if slots else ():
        name, tensor = by_id[key]
        if not _same_anywhere(tensor, value):
            out.append(Violation(clause, f"{name!r} changed dtype, device, shape or values"))
    return out


_GONE = object()


def _same_anywhere(now: Tensor, then: Tensor) -> bool:
    """``same_values``, reading tensors of a device other than CPU and meta on the CPU (an XLA
    device cannot lower every op ``same_values`` uses), their devices compared first, then
    their classes where one is a wrapper subclass (a swap can change an object's class)."""
    if now.device != then.device:
        return False
    if type(now) is not type(then) and (is_wrapper(now) or is_wrapper(then)):
        return False  # a slot whose tensor became (or stopped being) a wrapper subclass changed
    if now.device.type not in ("cpu", "meta"):
        now, then = now.detach().cpu(), then.detach().cpu()
    return same_values(now, then)


# ---- INV-KINDS ---------------------------------------------------------------------------


@dataclass
class Kinds:
    """The kind of everything registered, by dotted name: module classes, children and hooks,
    parameter slots (class, attribute names, ``requires_grad``), buffers (persistent or not)."""

    modules: dict[str, tuple[type, tuple[str, ...], tuple[tuple[int, ...], ...]]]
    parameters: dict[str, tuple[type, frozenset[str], bool] | None]
    buffers: dict[str, bool]


# A module's forward and backward hook tables (``Module._call_impl`` reads them).
HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def module_hooks(m: nn.Module) -> tuple[tuple[int, ...], ...]:
    """The handle ids of ``m``'s hooks, per table of :data:`HOOK_TABLES`, but a lazy module's
    initialization pre-hook, which its first forward removes (torch's documented rule)."""
    lazy = getattr(m, "_initialize_hook", None)
    skipped = {lazy.id} if lazy is not None else set()
    return tuple(tuple(k for k in getattr(m, table, {}) if k not in skipped)
                 for table in HOOK_TABLES)


def kinds(module: nn.Module) -> Kinds:
    mods, params, bufs = {}, {}, {}
    for path, m in module.named_modules(remove_duplicate=False):
        mods[path] = (type(m), tuple(m._modules), module_hooks(m))
        prefix = f"{path}." if path else ""
        for key, p in m._parameters.items():
            params[prefix + key] = None if p is None else (
                type(p), frozenset(getattr(p, "__dict__", {})), p.requires_grad)
        for key in m._buffers:
            bufs[prefix + key] = key not in m._non_persistent_buffers_set
    return Kinds(mods, params, bufs)


def kinds_kept(before: Kinds, module: nn.Module, *, requires_grad: bool = True,
               classes: bool = True, attributes: bool = True) -> list[Violation]:
    """``INV-KINDS`` after a successful operation. ``requires_grad=False``: the operation sets it
    (``requires_grad_``); ``classes=False``: parameters take the given value's class and
    attributes (``load_state_dict(assign=True)``, torch's documented rule); ``attributes=False``:
    parameters are new objects made by their class (``copy.deepcopy``, the same on every target:
    ``Parameter.__deepcopy__`` calls ``type(p)(data, requires_grad)``), so instance attributes
    are those the class sets."""
    now = kinds(module)
    out: list[Violation] = []
    for path, (cls, children, hooks) in before.modules.items():
        got = now.modules.get(path)
        if got is None:
            out.append(Violation(KINDS, f"module {path or '<root>'!r} is gone"))
            continue
        for table, had, has in zip(HOOK_TABLES, hooks, got[2], strict=True):
            if had != has:
                out.append(Violation(KINDS, f"module {path or '<root>'!r}'s {table} changed: "
                                            f"hook ids {list(had)} -> {list(has)}"))
        if got[0] is not cls and getattr(cls, "cls_to_become", None) is not got[0]:
            out.append(Violation(KINDS, f"module {path or '<root>'!r} became a {got[0].__name__}, "
                                        f"was a {cls.__name__}"))
        if got[1] != children:
            out.append(Violation(KINDS, f"module {path or '<root>'!r}'s children changed: "
                                        f"{list(children)} -> {list(got[1])}"))
    named = dict(_registered(module))
    for name, kind in before.parameters.items():
        if name not in now.parameters:
            where = "a buffer" if name in now.buffers else "unregistered"
            out.append(Violation(KINDS, f"parameter {name!r} is {where} now",
                                 code=f"{name!r} in dict(module.named_parameters())"))
            continue
        got = now.parameters[name]
        if (kind is None) != (got is None):
            out.append(Violation(KINDS, f"parameter slot {name!r} went {'from' if kind is None else 'to'}"
                                        " None"))
            continue
        if kind is None or issubclass(kind[0], UninitializedTensorMixin):
            continue  # a lazy parameter: its first forward materializes it (torch's docs)
        value = named[name]
        if not isinstance(value, nn.Parameter):
            out.append(Violation(KINDS, f"{name!r} is a {type(value).__name__}, not a Parameter"))
        elif classes and got[0] is not kind[0] and issubclass(got[0], nn.Parameter):
            # a wrapper subclass result (a DTensor parameter) takes the result's class
            out.append(Violation(KINDS, f"parameter {name!r} became a {got[0].__name__}, was a "
                                        f"{kind[0].__name__}"))
        if classes and attributes and not kind[1] <= got[1]:
            out.append(Violation(KINDS, f"parameter {name!r} lost its attributes "
                                        f"{sorted(kind[1] - got[1])}"))
        if requires_grad and got[2] != kind[2]:
            out.append(Violation(KINDS, f"parameter {name!r} requires_grad went {kind[2]} -> {got[2]}"))
    for name, persistent in before.buffers.items():
        if name not in now.buffers:
            where = "a parameter" if name in now.parameters else "unregistered"
            out.append(Violation(KINDS, f"buffer {name!r} is {where} now",
                                 code=f"{name!r} in dict(module.named_buffers())"))
        elif now.buffers[name] != persistent:
            out.append(Violation(KINDS, f"buffer {name!r} is {'not ' if persistent else ''}"
                                        "persistent now"))
    return out


def _registered(module: nn.Module):
    for path, m in module.named_modules(remove_duplicate=False):
        prefix = f"{path}." if path else ""
        for key, p in m._parameters.items():
            yield prefix + key, p


# ---- INV-INDEPENDENT ---------------------------------------------------------------------


@dataclass
class Bystander:
    """A module sharing no tensor with the one operated on (an independent copy of it), and its
    state when made."""

    module: nn.Module
    state: ModuleState


def bystander(module: nn.Module) -> Bystander | None:
    """A deep copy of ``module`` (no tensor shared), or None where torch cannot copy it."""
    try:
        other = copy.deepcopy(module)
    except Exception:
        return None
    mine = {id(t) for t in named_tensors(module).values()}
    if mine & {id(t) for t in named_tensors(other).values()}:
        return None
    return Bystander(other, module_state(other))


def independent(before: Bystander | None) -> list[Violation]:
    """``INV-INDEPENDENT``: the bystander is as it was made."""
    if not before:
        return []
    return [Violation(INDEPENDENT, f"a module sharing no tensor with the operated one changed: "
                                   f"{v.message}")
            for v in _module_unchanged(before.state, before.module, INDEPENDENT)]


# ---- INV-WORKING -------------------------------------------------------------------------


def input_for(module: nn.Module) -> Tensor | None:
    """A forward input for a module drawn by ``strategies.module_trees`` (a fixed float32
    ``(BATCH, FEATURES)`` tensor); None for any other module (a host's: its input is its own)."""
    try:
        tree_info(module)
    except KeyError:
        return None
    return torch.linspace(-2, 2, BATCH * FEATURES).reshape(BATCH, FEATURES)


def works(module: nn.Module, x: Tensor | None) -> list[Violation]:
    """``INV-WORKING``: ``module`` does what a fresh build in its state (a deep copy) does:
    ``state_dict()`` runs; forward on ``x`` (None: no input known) raises where the copy's does
    and gives its output; backward of it raises where the copy's does and gives its grads.
    The module's values and grads are put back after (a lazy module, which a forward would
    initialize, is not run). A module holding an inference tensor (made by a forward under
    ``torch.inference_mode()``: a lazy module initialized there, a buffer rebound there) can
    neither take part in autograd nor be updated in place outside inference mode, by torch's
    rules for inference tensors, so both run forward only, under ``inference_mode``."""
    out: list[Violation] = []
    try:
        module.state_dict()
    except Exception as e:
        out.append(Violation(WORKING, f"state_dict() raised {type(e).__name__}: {e}",
                             code="module.state_dict() is not None"))
    if x is None or any(isinstance(t, UninitializedTensorMixin)
                        for t in named_tensors(module).values()):
        return out
    try:
        fresh = _fresh(module)
    except Exception:
        return out
    saved = [(t, _clone(t), t.grad, _clone(t.grad))
             for t in {id(t): t for t in named_tensors(module).values()}.values()]
    autograd = not any(isinstance(t, Tensor) and t.is_inference()
                       for t in named_tensors(module).values())
    try:
        mine = _run(module, x, autograd)
    finally:
        _restore(saved)
    theirs = _run(fresh, x, autograd)
    by_values = not mixes_meta_with_values(module)
    if theirs[0] is None:  # a fresh build runs: so must the module, and alike
        if mine[0] is not None:
            out.append(Violation(WORKING, f"forward/backward raised {type(mine[0]).__name__}: "
                                          f"{mine[0]}, where a fresh build in its state runs"))
        elif not _same(mine[1], theirs[1], by_values):
            out.append(Violation(WORKING, "forward differs from a fresh build's in the same state"))
        elif not all(_same(a, b, by_values) for a, b in zip(mine[2], theirs[2], strict=True)):
            out.append(Violation(WORKING, "backward's grads differ from a fresh build's in the "
                                          "same state"))
    return out


def _run(module: nn.Module, x: Tensor, autograd: bool = True) -> tuple[BaseException | None, Any, list]:
    """``(error, output, grads)`` of a forward and (``autograd``) a backward of
    ``out.float().sum()``, under a fixed seed (dropout draws alike) and the RNG restored after;
    without ``autograd`` the forward runs under ``inference_mode``."""
    devices = {t.device.type for t in named_tensors(module).values()}
    x = x.to("meta") if devices == {"meta"} else x.clone()
    try:
        with torch.random.fork_rng(devices=[]), (
                torch.enable_grad() if autograd else torch.inference_mode()):
            torch.default_generator.manual_seed(0)  # the CPU RNG only, as forked
            result = module(x)
            if isinstance(result, Tensor) and result.requires_grad and holds_values(result):
                result.float().sum().backward()
    except Exception as e:
        return e, None, []
    grads = [_clone(p.grad) if p.grad is not None else None
             for _, p in sorted(module.named_parameters(remove_duplicate=False))]
    return None, result, grads


def _fresh(module: nn.Module) -> nn.Module:
    """A module built fresh in ``module``'s state: a deep copy, given copies of the grads
    (``Parameter.__deepcopy__`` leaves them out) and ``module``'s memory layout."""
    fresh = copy.deepcopy(module)
    theirs = named_tensors(fresh)
    for name, t in named_tensors(module).items():  # a parameter in a buffer slot has one too
        if t.grad is not None and theirs[name].grad is None:
            theirs[name].grad = t.grad.detach().clone()
    copy_layout(module, fresh)
    return fresh


def _clone(t: Tensor | None) -> Tensor | None:
    return value_copy(t) if isinstance(t, Tensor) and holds_values(t) else None


def _restore(saved: list) -> None:
    """Put back each tensor's values (an inference tensor's under ``inference_mode``, the only
    place it can be written), its grad object and the grad's values."""
    for t, values, grad, grad_values in saved:
        for dst, src in ((t, values), (grad, grad_values)):
            if src is not None and (dst.dtype, dst.shape, dst.device) == (
                    src.dtype, src.shape, src.device):
                with torch.inference_mode() if dst.is_inference() else torch.no_grad():
                    dst.copy_(src)
        if t.grad is not grad:
            put_grad(t, grad)


def mixes_meta_with_values(module: nn.Module) -> bool:
    """Whether ``module`` holds both tensors without values (``meta``, fake) and tensors with
    values: its forward's values are then undefined, since some torch kernels read a ``meta``
    operand's memory without checking its device (``F.conv1d`` on CPU given a ``meta`` bias
    returns what unallocated memory holds, where ``F.linear`` raises; torch 2.13)."""
    return {holds_values(t) for t in named_tensors(module).values()} == {True, False}


def _same(a: Any, b: Any, by_values: bool = True) -> bool:
    """Tensors by ``same_values`` (by class, dtype, shape and device where not ``by_values``);
    anything else by type (a forward's non-tensor output)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        if not by_values:
            return (type(a), a.dtype, a.shape, a.device) == (type(b), b.dtype, b.shape, b.device)
        return same_values(a, b)
    return type(a) is type(b)


# ---- INV-STRICT-EXACT --------------------------------------------------------------------


def call_extras(module: nn.Module, keys: Iterable[str]) -> list[str]:
    """The keys of a functional call that address no slot: not a ``remove_duplicate=False``
    name of a parameter or buffer (``None`` slots address nothing)."""
    valid = set(named_tensors(module))
    return sorted({k for k in keys if isinstance(k, str) and k not in valid})


def load_extras(module: nn.Module, keys: Iterable[str]) -> list[str]:
    """The keys of a load that address no slot: not a key of ``module.state_dict()``."""
    valid = set(module.state_dict(keep_vars=True))
    return sorted({k for k in keys if isinstance(k, str) and k not in valid})


def strict_exact(extras: list[str], error: BaseException | None, reported: Any = None,
                 *, strict: bool) -> list[Violation]:
    """``INV-STRICT-EXACT``: with ``strict``, an error naming every key of ``extras``; without,
    ``reported`` (the load's ``unexpected_keys``; None for a call, which reports nothing) holds
    every one of them."""
    if not extras:
        return []
    if strict:
        if error is not None and "nexpected" not in str(error):
            return []  # another error came first (a bad input): the strict report is not reached
        if error is None:
            return [Violation(STRICT_EXACT, f"strict accepted the keys {extras}, which address no "
                                            "slot", code="error is not None")]
        text = str(error)
        missed = [k for k in extras if repr(k) not in text and f'"{k}"' not in text]
        return [Violation(STRICT_EXACT, f"the strict error does not name {missed}")] if missed else []
    if reported is None or error is not None:
        return []
    missed = [k for k in extras if k not in set(getattr(reported, "unexpected_keys", ()))]
    return [Violation(STRICT_EXACT, f"unexpected_keys lacks {missed}",
                      code=f"set({missed!r}) <= set(result.unexpected_keys)")] if missed else []
