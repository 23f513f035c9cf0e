"""Facts about a drawn ``load_state_dict`` example, read by the LOAD- properties and by deviation
predicates. Each is computed from the module and the drawn input before the target runs."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.models.examples import Example, same_values, slots, value_copy
from swapspec.strategies.state_dicts import filled_by_overrides
from swapspec.strategies.state_dicts import (
    swap_refused as swap_refused,  # re-exported: the predicates' name
)


def spec_swap_refused(module: nn.Module) -> bool:
    """The spec refuses a swap of some tensor of ``module``: ``swap_refused``, less the weak
    references an RNN (``nn.RNNBase``) keeps to its parameters, which the reference drops
    for the load and makes again after (rule 9)."""
    rnn_refs = {id(r) for m in module.modules() if isinstance(m, nn.RNNBase)
                for r in getattr(m, "_flat_weight_refs", ()) if r is not None}
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}.values()
    if any(id(r) not in rnn_refs for t in tensors for r in weakref.getweakrefs(t)):
        return True
    return any(isinstance(t, nn.Parameter) and t.grad is not None and t.grad.grad_fn is not None
               for t in tensors)


def own_keys(module: nn.Module) -> list[str]:
    """The keys ``module.state_dict()`` has, in its order."""
    return list(module.state_dict(keep_vars=True))


def is_own_data(slot: Tensor, value: Any) -> bool:
    """``value`` is the slot itself, or a detached alias of its data with its layout (what
    ``state_dict()`` gives)."""
    if value is slot:
        return True
    if not isinstance(value, Tensor) or is_lazy(slot) or is_lazy(value):
        return False
    if type(value.detach()) is not type(slot.detach()):
        return False
    same = (value.dtype, value.shape, value.device) == (slot.dtype, slot.shape, slot.device)
    return same and value.stride() == slot.stride() and \
        value.storage_offset() == slot.storage_offset() and bool(torch._C._is_alias_of(value, slot))


def equal_values(a: Any, b: Any) -> bool:
    """Both the same object, or tensors of one kind with equal dtype, shape, device and values."""
    if a is b:
        return True
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or is_lazy(a) or is_lazy(b):
        return False
    if type(a.detach()) is not type(b.detach()):
        return False
    if (a.dtype, a.shape, a.device) != (b.dtype, b.shape, b.device):
        return False
    if a.is_meta:
        return True
    try:
        return bool(torch.equal(a.detach(), b.detach()))
    except (NotImplementedError, TypeError):  # a subclass without ``equal``: by its parts
        return same_values(a.detach(), b.detach())


def groups_by_object(module: nn.Module) -> list[list[str]]:
    """Every key of the state dict, grouped by the tensor object its slot holds."""
    groups: dict[int, list[str]] = {}
    for key, t in module.state_dict(keep_vars=True).items():
        if isinstance(t, Tensor):
            groups.setdefault(id(t), []).append(key)
    return list(groups.values())


def unchanged_data(slot: Tensor, value: Any, given: dict[str, Any]) -> bool:
    """Rule 6's unchanged data: a value of ``given`` (the load's input; a value a class's
    ``_load_from_state_dict`` puts in, such as a batch norm's own ``num_batches_tracked``, is
    not one unless it is given too) that is the slot's own data (``is_own_data``)."""
    return any(value is v for v in given.values()) and is_own_data(slot, value)


def loading_key(slot: Tensor, keys: list[str], values: dict[str, Any],
                given: dict[str, Any] | None = None) -> str | None:
    """Rule 6: of ``keys`` (the keys reaching one tensor object, in the load's order), the one
    whose value loads it: the first with a tensor value that is not unchanged data
    (``unchanged_data``), else, every such value being unchanged data, the first. ``values``:
    each key's value as the load sees it (``given``, the load's input, by default)."""
    given = values if given is None else given
    present = [k for k in keys if k in values and isinstance(values[k], Tensor)]
    changed = [k for k in present if not unchanged_data(slot, values[k], given)]
    return (changed or present or [None])[0]


def conflicting_groups(module: nn.Module, values: dict[str, Any],
                       given: dict[str, Any] | None = None) -> list[list[str]]:
    """Groups of keys of one tensor object given values that are not unchanged data (own
    data yields to any other value, in either order) and are not all equal (LOAD-TIES'
    conflict). ``values``: the values the load sees, ``given`` (default ``values``) its input."""
    given = values if given is None else given
    own = module.state_dict(keep_vars=True)
    out = []
    for keys in groups_by_object(module):
        slot = own[keys[0]]
        changed = [as_loaded(slot, values[k]) for k in keys
                   if k in values and isinstance(values[k], Tensor)
                   and not unchanged_data(slot, values[k], given)]
        if any(not equal_values(v, changed[0]) for v in changed[1:]):
            out.append(keys)
    return out


def loaded_values(before: dict[str, Tensor], given: dict[str, Any]) -> dict[str, Any]:
    """Each given key of a slot (``before``: every name's tensor, as ``named_tensors`` gives
    them) -> the value its tensor object is loaded from (``loading_key``; keys in the given
    order, which a drawn state dict takes from ``state_dict()``, the traversal's), as the load
    writes it (``as_loaded``)."""
    keys_of: dict[int, list[str]] = {}
    for key in given:
        if key in before:
            keys_of.setdefault(id(before[key]), []).append(key)
    out = {}
    for keys in keys_of.values():
        key = loading_key(before[keys[0]], keys, given)
        if key is not None:
            out.update(dict.fromkeys(keys, as_loaded(before[keys[0]], given[key])))
    return out


def as_loaded(slot: Any, value: Any) -> Any:
    """What a load writes into ``slot`` from ``value``: ``value`` itself, or its element where
    ``slot`` is 0-dim and ``value`` has shape ``(1,)`` (torch's 0.3 compatibility, which indexes
    it: the element is a view of ``value``)."""
    if (isinstance(slot, Tensor) and isinstance(value, Tensor) and not is_lazy(slot)
            and slot.dim() == 0 and tuple(value.shape) == (1,)):
        return value[0]
    return value


def expected_load_paths(before: dict[str, Tensor], load: Any) -> dict[str, str]:
    """The path of each tensor object (rule 4), under the first given key that reaches it:
    ``kept`` with ``assign`` where the value that loads it (``loaded_values``) is its own data
    (so every key of it gives own data), else swap, assign or copy."""
    values = loaded_values(before, load.state_dict)
    expected: dict[str, str] = {}
    seen: set[int] = set()
    for key in load.state_dict:
        slot = before.get(key)
        if slot is None or id(slot) in seen or key not in values:
            continue
        seen.add(id(slot))
        kept = load.assign and is_own_data(slot, values[key])
        expected[key] = "kept" if kept else "swap" if load.swap else \
            "assign" if load.assign else "copy"
    return expected


def fits(slot: Tensor, value: Any) -> bool:
    """A tensor-like value of the slot's shape (a ``(1,)`` value fits a 0-dim slot)."""
    if not torch.overrides.is_tensor_like(value):
        return False
    if is_lazy(slot):
        return True
    shape = tuple(value.shape)
    return shape == tuple(slot.shape) or (slot.dim() == 0 and shape == (1,))


@dataclass
class KeyModel:
    """What a load of ``given`` must report: torch's missing and unexpected keys, bad values."""

    missing: list[str]
    unexpected: list[str]
    bad_values: list[str]
    conflicts: list[list[str]]

    def fails(self, strict: bool) -> bool:
        return bool(self.bad_values or self.conflicts or (strict and (self.missing
                                                                       or self.unexpected)))


def key_model(module: nn.Module, given: dict[str, Any]) -> KeyModel:
    own = module.state_dict(keep_vars=True)
    filled = filled_by_overrides(module, given)
    missing = _spectral_norm_missing(module, given) + [k for k in own if k not in given
                                                         and k not in filled]
    unexpected = [k for k in given if k not in own]
    bad = [k for k in given if k in own and isinstance(own[k], Tensor) and not fits(own[k], given[k])]
    fitting = {k: v for k, v in given.items() if k not in bad}
    loaded = {**_filled_values(own, filled - set(given)), **fitting}
    return KeyModel(missing, unexpected, bad, conflicting_groups(module, loaded, given))


def _filled_values(own: dict[str, Any], keys: set[str]) -> dict[str, Tensor]:
    """The values a batch norm's ``_load_from_state_dict`` puts in for these absent
    ``num_batches_tracked`` keys: its own buffer, or ``tensor(0)`` for a meta one. They are
    loaded like given values, so they can conflict with a tied key's given value."""
    return {k: own[k] if not own[k].is_meta else torch.tensor(0, dtype=torch.long)
            for k in keys}


def _spectral_norm_missing(module: nn.Module, given: dict[str, Any]) -> list[str]:
    """Keys an old-style ``spectral_norm``'s load pre-hook reports missing, whatever ``strict``
    (torch passes the hooks ``strict=True``): where the state dict records no version 1 for it
    and lacks one of ``<name>_orig``, ``<name>_u``, ``<name>_v``, each of ``<name>_orig``,
    ``<name>`` (the old format's key) and ``<name>_u`` it lacks. (A state dict in that old
    format, with ``<name>``, is converted by the hook; no strategy draws one.)"""
    metadata = getattr(given, "_metadata", None) or {}
    out: list[str] = []
    for path, m in module.named_modules(remove_duplicate=False):
        for hook in m._forward_pre_hooks.values():
            if not isinstance(hook, SpectralNorm):
                continue
            version = metadata.get(path, {}).get("spectral_norm", {}).get(f"{hook.name}.version")
            key = f"{path}.{hook.name}" if path else hook.name
            if version is not None and version >= 1:
                continue
            if version is None and key not in given and all(
                    key + s in given for s in ("_orig", "_u", "_v")):
                continue
            out += [key + s for s in ("_orig", "", "_u") if key + s not in given]
    return out


def meta_into_real(module: nn.Module, given: dict[str, Any]) -> bool:
    """A ``meta`` value given for a real slot: copying out of meta fails on the copy and swap
    paths (``assign`` puts it in)."""
    own = module.state_dict(keep_vars=True)
    return any(isinstance(v, Tensor) and v.is_meta and isinstance(own.get(k), Tensor)
               and not own[k].is_meta for k, v in given.items())


@dataclass
class TensorRecord:
    """One tensor object before the load."""

    obj: Tensor
    cls: type
    cdata: int
    attributes: tuple[str, ...]
    requires_grad: bool
    grad: Tensor | None
    dtype: torch.dtype
    device: torch.device
    values: Tensor | None


def record(t: Tensor) -> TensorRecord:
    readable = not is_lazy(t) and not t.is_meta
    grad = t.grad if isinstance(t, nn.Parameter) else None
    return TensorRecord(t, type(t), t._cdata, tuple(sorted(t.__dict__)), t.requires_grad, grad,
                        t.dtype, t.device, value_copy(t) if readable else None)


@dataclass
class LoadSnapshot:
    """The module before the load: every slot's object and every tensor's record."""

    slots: dict[str, Any]
    tensors: dict[int, TensorRecord]


def snapshot_for_load(module: nn.Module) -> LoadSnapshot:
    table = slots(module)
    return LoadSnapshot(table, {id(t): record(t) for t in table.values() if isinstance(t, Tensor)})


def changes(before: LoadSnapshot, module: nn.Module) -> list[str]:
    """What differs from ``before``: slot objects, and each tensor's class, TensorImpl,
    attributes, requires_grad, grad, dtype, device and values."""
    now = slots(module)
    out = [f"slot {name!r} holds another object" for name, obj in before.slots.items()
           if now.get(name, _ABSENT) is not obj]
    out += [f"new slot {name!r}" for name in now if name not in before.slots]
    for rec in before.tensors.values():
        out += [f"{_name_of(before, rec)}: {what}" for what in _tensor_changes(rec)]
    return out


def _tensor_changes(rec: TensorRecord) -> list[str]:
    t = rec.obj
    checks = [
        (type(t) is rec.cls, f"class {rec.cls.__name__} -> {type(t).__name__}"),
        (t._cdata == rec.cdata, "TensorImpl replaced"),
        (tuple(sorted(t.__dict__)) == rec.attributes, "instance attributes changed"),
        (t.requires_grad == rec.requires_grad, "requires_grad changed"),
        (not isinstance(t, nn.Parameter) or t.grad is rec.grad, "grad changed"),
        ((t.dtype, t.device) == (rec.dtype, rec.device), "dtype or device changed"),
    ]
    out = [what for ok, what in checks if not ok]
    if rec.values is not None and not out and not equal_values(t.detach(), rec.values):
        out.append("values changed")
    return out


def _name_of(before: LoadSnapshot, rec: TensorRecord) -> str:
    return next(n for n, o in before.slots.items() if o is rec.obj)


_ABSENT = object()


def load_example(module: nn.Module, load: Any) -> Example:
    return Example(module, load=load)


def wrapper_value(value: Any) -> bool:
    return isinstance(value, Tensor) and is_traceable_wrapper_subclass(value)


def norm_defaults(module: nn.Module, given: Any) -> list[tuple[str, Tensor, Tensor]]:
    """What a norm layer that tracks running stats writes when its ``num_batches_tracked`` key
    is missing and the state dict's metadata gives it no version 2 or later
    (``_NormBase._load_from_state_dict``): the buffer itself (a fresh ``tensor(0)`` on meta), a
    write that on the swap path replaces its TensorImpl even when the load then fails."""
    metadata = getattr(given, "_metadata", None) or {}
    writes = []
    for path, m in module.named_modules(remove_duplicate=False):
        tracked = getattr(m, "num_batches_tracked", None)
        if not isinstance(m, nn.modules.batchnorm._NormBase) or not isinstance(tracked, Tensor):
            continue
        key = f"{path}.num_batches_tracked" if path else "num_batches_tracked"
        version = metadata.get(path, {}).get("version")
        if m.track_running_stats and (version is None or version < 2) and key not in given:
            value = tracked if tracked.device.type != "meta" else torch.tensor(0, dtype=torch.long)
            writes.append((key, tracked, value))
    return writes
