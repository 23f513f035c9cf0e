"""The functional_call model: a module's registration state before and after a call, what forward
saw, and the loaded copy whose plain forward is the spec's answer for a call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.module import register_module_forward_pre_hook

from swapspec.properties.models.examples import (
    clone_value,
    holds_values,
    memory_of,
    named_tensors,
    slots,
    value_copy,
)
from swapspec.properties.models.oracle import expected_view, owner_of
from swapspec.properties.models.outcomes import Outcome, attempt
from swapspec.strategies import tree_info


@dataclass
class ModuleState:
    """A module's registration state: slot objects, attribute names, classes, values."""

    slots: dict[str, Any]
    layout: dict[str, tuple]
    values: dict[int, Tensor]


def module_state(module: nn.Module) -> ModuleState:
    """Record what a functional call must leave exactly as it found it."""
    layout = {
        path: (type(m), tuple(sorted(m.__dict__)), tuple(m._parameters.keys()),
               tuple(m._buffers.keys()))
        for path, m in module.named_modules(remove_duplicate=False)
    }
    table = slots(module)
    values = {id(t): value_copy(t) for t in table.values()
              if isinstance(t, Tensor) and holds_values(t)}
    return ModuleState(table, layout, values)


def registration_state(module: nn.Module) -> dict[str, tuple]:
    """Per module path: what every registration may change, by object identity: its
    ``__dict__`` (hook tables included), its three registries, its non-persistent set."""
    return {
        path: ({k: id(v) for k, v in m.__dict__.items()},
               *({k: id(v) for k, v in getattr(m, r).items()}
                for r in ("_parameters", "_buffers", "_modules")),
               frozenset(m._non_persistent_buffers_set))
        for path, m in module.named_modules(remove_duplicate=False)
    }


REGISTRIES = ("_parameters", "_buffers", "_modules")


def registrations_kept(module: nn.Module) -> list[tuple[nn.Module, dict, list[dict], set]]:
    """Per module of the tree: shallow copies of its ``__dict__``, its registries and its
    non-persistent set, for ``put_back_registrations``."""
    return [(m, dict(m.__dict__), [dict(getattr(m, r)) for r in REGISTRIES],
             set(m._non_persistent_buffers_set))
            for m in module.modules(remove_duplicate=True)]


def put_back_registrations(kept: list[tuple[nn.Module, dict, list[dict], set]]) -> None:
    """Every module as ``registrations_kept`` found it: its ``__dict__`` entries, then the
    contents of its registries and non-persistent set, in their own objects."""
    for m, attributes, registries, non_persistent in kept:
        for key in [k for k in m.__dict__ if k not in attributes]:
            del m.__dict__[key]
        m.__dict__.update(attributes)
        for registry, content in zip(REGISTRIES, registries, strict=True):
            table = getattr(m, registry)
            table.clear()
            table.update(content)
        m._non_persistent_buffers_set.clear()
        m._non_persistent_buffers_set.update(non_persistent)


_MISSING = object()


@dataclass
class ForwardView:
    """What a forward pre-hook on the root saw during the first call."""

    named: dict[str, Tensor] = field(default_factory=dict)
    parameter_ids: set[int] = field(default_factory=set)
    buffer_ids: set[int] = field(default_factory=set)
    state_dict: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    # name -> ("parameter" | "buffer", what get_parameter/get_buffer gave: the object or the
    # error), and name -> whether get_submodule(its prefix) gave the owner; registered slots only.
    accessed: dict[str, tuple[str, Any]] = field(default_factory=dict)
    submodule_found: dict[str, bool] = field(default_factory=dict)
    seen: bool = False


# How forward is watched: a forward pre-hook on the root (with kwargs), or a global one
# (``register_module_forward_pre_hook``: it fires for every module's call, and records the root's).
WATCH_FORMS = ("module pre-hook", "global pre-hook")


def watch_forward(module: nn.Module, owners: dict[str, tuple[nn.Module, str]],
                  form: str = "module pre-hook"):
    """Register a pre-hook (``form``, one of ``WATCH_FORMS``) that fills a ``ForwardView`` at
    the root's first forward; return (view, handle)."""
    view = ForwardView()
    kinds = {n: _slot_kind(o, k) for n, (o, k) in owners.items()}

    def record(mod):
        if view.seen or mod is not module:
            return None
        view.seen = True
        view.named = named_tensors(mod)
        view.parameter_ids = {id(p) for p in mod.parameters()}
        view.buffer_ids = {id(b) for b in mod.buffers()}
        view.state_dict = dict(mod.state_dict(keep_vars=True))
        view.attributes = {n: getattr(o, k, _MISSING) for n, (o, k) in owners.items()}
        for name, (owner, _) in owners.items():
            if kinds[name] is not None:
                _record_accessors(view, mod, name, owner, kinds[name])
        return None

    if form == "global pre-hook":
        return view, register_module_forward_pre_hook(lambda mod, args: record(mod))
    return view, module.register_forward_pre_hook(lambda mod, args, kwargs: record(mod),
                                                  with_kwargs=True)


def _slot_kind(owner: nn.Module, key: str) -> str | None:
    """``'parameter'`` or ``'buffer'`` for a registered slot; None for any other name (a
    parametrized name is an attribute, not a slot)."""
    return "parameter" if key in owner._parameters else "buffer" if key in owner._buffers else None


def _record_accessors(view: ForwardView, root: nn.Module, name: str, owner: nn.Module,
                      kind: str) -> None:
    """What ``root.get_parameter``/``get_buffer`` (by the slot's kind before the call) and
    ``get_submodule`` give for the slot ``name``."""
    getter = root.get_parameter if kind == "parameter" else root.get_buffer
    try:
        view.accessed[name] = (kind, getter(name))
    except Exception as e:  # an accessor's refusal is part of what forward sees
        view.accessed[name] = (kind, e)
    try:
        view.submodule_found[name] = root.get_submodule(name.rpartition(".")[0]) is owner
    except Exception:
        view.submodule_found[name] = False


def load_into(owner: nn.Module, key: str, value: Any) -> None:
    """Put ``value`` permanently in ``owner``'s slot ``key`` (the oracle's copy)."""
    for table in (owner._parameters, owner._buffers):
        if key in table:
            table[key] = value
            return
    setattr(owner, key, value)


def identity_preserving_clones(values: Any) -> dict[int, Any]:
    """One clone per distinct object, so names that shared an object still share one."""
    return {id(v): clone_value(v) for v in values}


def cloned_inputs(tensors: Any) -> Any:
    """A call's tensors (a dict or a tuple of dicts) in the same form, each distinct object
    cloned once (``identity_preserving_clones``)."""
    dicts = [tensors] if isinstance(tensors, dict) else list(tensors)
    clones = identity_preserving_clones(v for d in dicts for v in d.values())
    copied = [{k: clones[id(v)] for k, v in d.items()} for d in dicts]
    return copied[0] if isinstance(tensors, dict) else tuple(copied)


def loaded_copy(module: nn.Module, filled: dict[str, Any], call: Any,
                own: dict[str, Tensor] | None = None) -> tuple[nn.Module, dict]:
    """A fresh build of ``module`` with ``filled`` loaded for good, and kwargs for it.

    The copy keeps every alias the real call has: a name filled with one of the module's own
    tensors gets the copy's counterpart of that tensor (so it still shares the object with the
    slots that hold it, and sees forward's in-place updates through them); every other filled
    object gets one clone, shared by every name filled with it. ``own`` is the module's
    ``named_tensors`` before the call (default: now; after a call that did not restore the
    module, pass what it held before). Every RNN of the copy runs on what its slots hold
    (``reread_flat_weights``).
    """
    copy = tree_info(module).build()
    counterparts = own_counterparts(named_tensors(module) if own is None else own, copy)
    stand_ins = {**identity_preserving_clones(v for v in filled.values() if id(v) not in counterparts),
                 **counterparts}
    for name, value in filled.items():
        owner, key = owner_of(copy, name)
        load_into(owner, key, stand_ins[id(value)])
    reread_flat_weights(copy)
    return copy, fresh_kwargs(call)


def reread_flat_weights(module: nn.Module) -> None:
    """Every RNN of ``module`` reads its flat weights, the list its forward runs on, from its
    slots again: a value loaded straight into a slot, ``None`` included, is what it runs on."""
    for m in module.modules():
        if isinstance(m, nn.RNNBase):
            m._init_flat_weights()


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
    update in place, and so is one that shares memory with a tensor forward can reach (the
    half-tie torch's conversion leaves of a tied buffer: two objects, one storage).
    """
    registered = named_tensors(module)
    reachable = [*expected_view(module, filled).values(), *filled.values()]
    reachable = [v for v in reachable if isinstance(v, Tensor)]
    ids = {id(v) for v in reachable}
    memory = set().union(*(memory_of(v) for v in reachable))
    out_of_reach = {id(registered[n]): registered[n] for n in filled if n in registered}
    return {key for key, t in out_of_reach.items() if key not in ids and not memory_of(t) & memory}


def fresh_copy_holding(module: nn.Module) -> nn.Module:
    """A fresh build of ``module``'s tree whose every slot holds a clone of ``module``'s tensor
    there, one clone per object (ties stay ties), in ``module``'s memory layout
    (``copy_layout``); a parameter slot is set with ``setattr`` so modules that derive state
    from their parameters (an RNN's ``_flat_weights``) see it, a buffer slot through its table
    (a parameter tied into a buffer slot stays in a buffer slot)."""
    copy = tree_info(module).build()
    named = named_tensors(module)
    clones = identity_preserving_clones(named.values())
    for name, value in named.items():
        prefix, _, key = name.rpartition(".")
        owner = copy.get_submodule(prefix) if prefix else copy
        clone = clones[id(value)]
        if key in owner._buffers:
            owner._buffers[key] = clone
            continue
        if key in owner._parameters and not isinstance(clone, nn.Parameter):
            clone = nn.Parameter(clone, requires_grad=value.requires_grad)
        setattr(owner, key, clone)
    copy_layout(module, copy)
    return copy


def copy_layout(module: nn.Module, fresh: nn.Module) -> None:
    """Give ``fresh``'s plain tensors ``module``'s layout: one new storage per storage of
    ``module``, each tensor at its offset and strides there. Slices of one flat vector sit at
    offsets a kernel may not find aligned, and a kernel's rounding can depend on alignment;
    ``Parameter.__deepcopy__`` clones each parameter into a storage of its own."""
    theirs = named_tensors(fresh)
    storages: dict[int, Any] = {}
    done: set[int] = set()
    for name, t in named_tensors(module).items():
        f = theirs.get(name)
        if not (_plain_strided(t) and _plain_strided(f)) or id(f) in done:
            continue
        done.add(id(f))
        source = t.untyped_storage()
        if source.data_ptr() not in storages:
            storages[source.data_ptr()] = source.clone()
        with torch.no_grad():
            f.data = torch.empty(0, dtype=t.dtype).set_(
                storages[source.data_ptr()], t.storage_offset(), t.shape, t.stride())


def _plain_strided(t: Any) -> bool:
    return (type(t) in (Tensor, nn.Parameter) and t.layout == torch.strided
            and t.device.type == "cpu" and holds_values(t) and not t.is_inference()
            and not t.is_conj() and not t.is_neg())




def fresh_kwargs(call: Any) -> dict[str, Any]:
    """The call's kwargs with a new ``report`` list, so runs do not share one."""
    return {k: ([] if k == "report" else v) for k, v in call.kwargs.items()}


def copy_outcome(module: nn.Module, filled: dict[str, Any], call: Any,
                 own: dict[str, Tensor] | None = None) -> Outcome:
    """What forward does on a loaded copy: the spec's model of the call's result (``own``: as
    for ``loaded_copy``)."""
    copy, kwargs = loaded_copy(module, filled, call, own)
    with call.grad_context():
        return attempt(lambda: copy(*[clone_value(a) for a in call.args], **kwargs))


def runs_in_its_world(module: nn.Module, args: tuple) -> bool:
    """Whether a fresh build of ``module``'s tree runs its forward on ``args``: a tree that
    cannot run in its world (a catalogue layer that reads a value out of ``meta`` tensors)
    owes no successful call."""
    own = attempt(lambda: tree_info(module).build()(*[clone_value(a) for a in args]))
    return own.error is None
