"""Reference ``functional_call``: run a module with other tensors in its slots.

This is the executable spec for ``torch.func.functional_call``. Each rule lives in one
place, named in the docstring of ``functional_call``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedTensorMixin

_MISSING: Any = object()
ATTRIBUTE = "attribute"
PARAMETRIZED = "parametrized"


class _GivenTensor(nn.Module):
    """Stands in for a ``ParametrizationList`` during a call: the parametrized attribute reads
    the given value itself, which ``parameters()`` shows as ``parametrizations.<name>.original``."""

    def __init__(self, value: Tensor | None) -> None:
        super().__init__()
        self._parameters["original"] = value

    def forward(self) -> Tensor | None:
        return self._parameters["original"]


@dataclass
class _Slot:
    """One place a tensor lives: ``module._parameters[key]``, ``_buffers[key]`` or an attribute."""

    module: nn.Module
    key: str
    kind: str  # "_parameters", "_buffers" or ATTRIBUTE
    names: list[str] = field(default_factory=list)
    value: Tensor | None = None

    @property
    def ident(self) -> tuple[int, str]:
        return (id(self.module), self.key)


def functional_call(
    module: nn.Module,
    tensors: Mapping[str, Tensor | None] | Sequence[Mapping[str, Tensor | None]],
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """Call ``module(*args, **kwargs)`` with ``tensors`` in place of its own; return the output.

    Rules:
    1. Input forms (``_merge``): a mapping, or a list/tuple of mappings with disjoint keys;
       anything else raises torch's ``ValueError``. ``args=None`` is ``()``, a non-tuple
       ``args`` is one argument, ``kwargs=None`` is ``{}``. Jitted modules are refused.
    2. Ties (``_expand_ties``): with ``tie_weights=True`` the names of one tensor form a
       group (``named_parameters``/``named_buffers`` with ``remove_duplicate=False``, so a
       shared submodule's paths are aliases); giving any member fills every member, and
       members given different objects raise torch's ``ValueError``.
    3. One slot, one value (``_check_one_value_per_slot``): names that reach the same slot through a
       shared submodule and carry different objects raise ``ValueError``, whatever
       ``tie_weights`` is.
    4. Strict (``_check_strict``): valid keys are the ``remove_duplicate=False`` names of
       parameters and buffers; missing or unexpected keys raise torch's ``RuntimeError``.
    5. Bad input (``_resolve_slots``): non-tensor values, unknown submodules, non-tensor
       attributes and empty names raise torch's errors. A lazy module's uninitialized tensor
       takes no other value (``None`` included): its forward would finish initializing the
       module around that value and leave it of its final class holding the uninitialized
       tensor restored after the call; ``ValueError`` (``lazy_value_error``).
       Rules 2-5 run in this order, all before anything is touched.
    6. Swapping in (``_swap_in``): each value goes straight into the owning module's
       ``_parameters``/``_buffers`` slot, unwrapped; an unknown name becomes an attribute
       for the call. ``None`` disables that tensor for the call. The name of a parametrized
       attribute (``weight`` of a module with ``parametrizations.weight``) disables that
       parametrization for the call: the attribute reads the given value itself, as torch's
       documentation promises; ``parametrizations.weight.original`` instead gives the
       parametrization its input. Values go in as given, whatever their device or tensor
       class, and the module's own tensors stay where they are: nothing is converted. A
       module built on ``meta`` runs on real values given for every name (and on ``meta``
       values with a ``meta`` input); a ``TwoTensor`` or ``DTensor`` parameter is replaced by
       the given object, which forward reads as it is. A module of the RNN family runs on
       its flat weights (``_flat_weights``), a list of its weight tensors: when the call
       fills one of them, the list is read from its slots again (``_reread_flat_weights``),
       so forward runs on the given values, ``None`` included, and, after the restore, on the
       module's own.
    7. Restoring (``_restore``): afterwards, whether forward returned or raised, every slot
       holds the object it held before and no temporary attribute remains.
    8. Write-back (``_write_back``): a slot that forward rebound is written into the
       caller's mapping that supplied the key; in-place updates land on the caller's tensor.
    """
    call = prepare_call(module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict)
    originals = _swap_in(call.slots)
    try:
        _reread_flat_weights(call.slots)
        return module(*call.args, **call.kwargs)
    finally:
        rebound = _restore(call.slots, originals)
        _write_back(rebound, call.slots, call.given, call.sources)
        _reread_flat_weights(call.slots)


@dataclass
class PreparedCall:
    """A call that passed rules 1-5: what to swap in where, with nothing touched yet."""

    given: dict[str, Any]  # the caller's names and values, merged
    sources: dict[str, Mapping]  # the caller's mapping each name came from
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    slots: list[_Slot]


def prepare_call(module: nn.Module, tensors: Any, args: Any, kwargs: dict[str, Any] | None, *,
                 tie_weights: bool, strict: bool) -> PreparedCall:
    """Rules 1-5 in order (input forms, ties, one value per slot, strict, bad input); raises
    as ``functional_call`` does. Variants that change only swapping or restoring reuse it."""
    given, sources = _merge(tensors)
    _refuse_jitted(module)
    args = () if args is None else args if isinstance(args, tuple) else (args,)
    kwargs = {} if kwargs is None else kwargs
    named = _expand_ties(module, given) if tie_weights else dict(given)
    _check_one_value_per_slot(module, named)
    if strict:
        _check_strict(module, named)
    return PreparedCall(given, sources, args, kwargs, _resolve_slots(module, named))


def _refuse_jitted(module: nn.Module) -> None:
    """Rule 1: the stateless API does not work on scripted or traced modules."""
    jitted = (torch.jit.RecursiveScriptModule, torch.jit.ScriptModule, torch.jit.ScriptFunction)
    if torch.jit.is_tracing() or torch.jit.is_scripting() or isinstance(module, jitted):
        raise RuntimeError("The stateless API can't be used with Jitted modules")
    if isinstance(module, nn.DataParallel):
        raise RuntimeError("The stateless API can't be used with nn.DataParallel module")


def _merge(tensors) -> tuple[dict[str, Any], dict[str, Mapping]]:
    """Rule 1: one ``{name: value}`` dict, plus the caller's mapping each name came from."""
    if isinstance(tensors, Mapping):
        return dict(tensors), dict.fromkeys(tensors, tensors)
    if not isinstance(tensors, Sequence):
        raise ValueError(
            "Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of dicts, "
            f"but got {type(tensors)}"
        )
    if not all(isinstance(d, Mapping) for d in tensors):
        raise ValueError("Expected all elements of parameter_and_buffer_dicts to be dictionaries")
    counts: dict[str, int] = {}
    for d in tensors:
        for k in d:
            counts[k] = counts.get(k, 0) + 1
    repeated = [k for k, n in counts.items() if n > 1]
    if repeated:
        raise ValueError(
            f"{repeated} appeared in multiple dictionaries; behavior of functional call is ambiguous"
        )
    return {k: v for d in tensors for k, v in d.items()}, {k: d for d in tensors for k in d}


def _expand_ties(module: nn.Module, given: dict[str, Any]) -> dict[str, Any]:
    """Rule 2: fill every alias of a given tied tensor; refuse conflicting aliases."""
    groups: dict[int, set[str]] = {}
    for name, tensor in _all_named_tensors(module):
        groups.setdefault(id(tensor), set()).add(name)
    group_of = {name: names for names in groups.values() for name in names}
    expanded = dict(given)
    for name in given:
        if name not in group_of:
            continue
        members = group_of[name]
        if len({id(given[m]) for m in members if m in given}) > 1:
            raise ValueError(
                f"functional_call got multiple values for keys {sorted(members)}, "
                "which are tied. Consider using tie_weights=False"
            )
        expanded.update(dict.fromkeys(members, given[name]))
    return expanded


def _all_named_tensors(module: nn.Module) -> list[tuple[str, Tensor]]:
    """Every name of every parameter and buffer, aliases included."""
    return [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]


def _check_strict(module: nn.Module, named: dict[str, Any]) -> None:
    """Rule 4: torch's key rule and message."""
    valid = {name for name, _ in _all_named_tensors(module)}
    unexpected = sorted(set(named) - valid)
    missing = sorted(valid - set(named))
    errors = []
    if unexpected:
        errors.append(f"Unexpected key(s): {', '.join(map(repr, unexpected))}.")
    if missing:
        errors.append(f"Missing key(s): {', '.join(map(repr, missing))}.")
    if errors:
        raise RuntimeError(
            "Error(s) in reparametrizing for {}:\n\t{}".format(module._get_name(), "\n\t".join(errors))
        )


def _check_one_value_per_slot(module: nn.Module, named: dict[str, Any]) -> None:
    """Rule 3: names reaching one slot through a shared submodule must carry one object."""
    names_of: dict[tuple[int, str], list[str]] = {}
    for name, value in named.items():
        try:
            owner, key = _owner_and_key(module, name)
        except (AttributeError, TypeError):
            continue  # reported by rule 5
        names = names_of.setdefault((id(owner), key), [])
        if names and named[names[0]] is not value:
            raise ValueError(
                f"functional_call got multiple values for keys {sorted([*names, name])}, "
                "which name one slot of a shared submodule"
            )
        names.append(name)


def _resolve_slots(module: nn.Module, named: dict[str, Any]) -> list[_Slot]:
    """Rule 5: validate every name and value; group the names by the slot they reach."""
    slots: dict[tuple[int, str], _Slot] = {}
    for name, value in named.items():
        owner, key = _owner_and_key(module, name)
        _check_value(owner, key, value)
        _check_lazy(owner, name, key, value)
        slot = slots.setdefault((id(owner), key), _Slot(owner, key, _kind(owner, key), value=value))
        slot.names.append(name)
    return list(slots.values())


def _owner_and_key(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    """Walk ``name``'s prefix to the owning submodule, with torch's errors."""
    prefix, _, key = name.rpartition(".")
    owner = module
    walked = []
    for attr in prefix.split(".") if prefix else []:
        walked.append(attr)
        try:
            child = getattr(owner, attr)
        except AttributeError as ex:
            raise AttributeError(f"{owner._get_name()} has no attribute `{attr}`") from ex
        if not isinstance(child, nn.Module):
            raise TypeError(
                f"submodule `{'.'.join(walked)}`: {child} is not an instance of torch.nn.Module"
            )
        owner = child
    return owner, key


def _check_value(owner: nn.Module, key: str, value: Any) -> None:
    """Rule 5: torch's checks, in torch's order, for one name."""
    if value is not None and not isinstance(value, Tensor):
        raise TypeError(f"{value} is not an instance of torch.Tensor")
    if key == "":
        raise KeyError('tensor name can\'t be empty string ""')
    if torch.nn.utils.parametrize.is_parametrized(owner, key):
        return  # a tensor; reading it would run the parametrization (spectral_norm's power iteration)
    current = getattr(owner, key, None)  # a registered slot holds a tensor or None
    if current is not None and not isinstance(current, Tensor):
        raise TypeError(f"attribute `{key}`: {current} is not an instance of torch.Tensor")


def _check_lazy(owner: nn.Module, name: str, key: str, value: Any) -> None:
    """Rule 5: a lazy module's uninitialized tensor takes no other value (``lazy_value_error``)."""
    current = owner._parameters.get(key, owner._buffers.get(key))
    if value is not current and isinstance(current, UninitializedTensorMixin) and initializes_lazily(owner):
        raise ValueError(lazy_value_error(name, owner))


def initializes_lazily(module: nn.Module) -> bool:
    """Whether ``module`` is a lazy module whose first forward has not initialized it yet."""
    return isinstance(module, LazyModuleMixin) and hasattr(module, "_initialize_hook")


def lazy_value_error(name: str, owner: nn.Module) -> str:
    """The message for a value given to a lazy module's uninitialized tensor: its forward would
    finish initializing the module around the given value (materializing the others, or
    failing on the given one) and turn it into its final class, which restoring the
    uninitialized tensor after the call would leave holding it."""
    return (f"functional_call cannot give a value to {name!r}, an uninitialized tensor of the "
            f"lazy module {owner._get_name()}: run one forward to initialize it first")


def _kind(owner: nn.Module, key: str) -> str:
    """Which table holds ``owner``'s slot ``key``."""
    for kind in ("_parameters", "_buffers"):
        if key in getattr(owner, kind):
            return kind
    if torch.nn.utils.parametrize.is_parametrized(owner, key):
        return PARAMETRIZED
    return ATTRIBUTE


def _swap_in(slots: list[_Slot]) -> list[Any]:
    """Rule 6: put each value straight into its slot; return what each slot held."""
    return [_put(slot, slot.value) for slot in slots]


def _reread_flat_weights(slots: list[_Slot]) -> None:
    """Rule 6: every RNN that holds one of ``slots`` among its flat weights reads its
    ``_flat_weights`` (and their weak references, which its forward compares) from its slots.

    They are not flattened into one buffer (``flatten_parameters``): that would move the
    caller's tensors, or the module's own, into new storage."""
    rnns = {id(slot.module): slot.module for slot in slots
            if isinstance(slot.module, nn.RNNBase) and slot.key in slot.module._flat_weights_names}
    for rnn in rnns.values():
        rnn._flat_weights = [getattr(rnn, name, None) for name in rnn._flat_weights_names]
        rnn._flat_weight_refs = [None if w is None else weakref.ref(w) for w in rnn._flat_weights]


def _put(slot: _Slot, value: Any) -> Any:
    """Store ``value`` in ``slot`` and return what it held (``_MISSING``: no attribute).

    A registered slot is written in its ``_parameters``/``_buffers`` table directly,
    unwrapped. An attribute slot first loses whatever ``nn.Module.__setattr__`` registered
    under its name, so that restoring ``_MISSING`` leaves no trace.
    """
    if slot.kind == PARAMETRIZED:
        return _put_parametrization(slot.module, slot.key, value)
    if slot.kind != ATTRIBUTE:
        table = getattr(slot.module, slot.kind)
        old = table[slot.key]
        table[slot.key] = value
        return old
    old = _pop_attribute(slot.module, slot.key)
    if value is not _MISSING:
        setattr(slot.module, slot.key, value)
    return old


def _put_parametrization(module: nn.Module, key: str, value: Any) -> Any:
    """Replace the ``ParametrizationList`` of ``key`` (restoring: put it back); return what it
    read: the given value while a ``_GivenTensor`` stands in, else the list itself."""
    table = module.parametrizations._modules
    old = table[key]
    table[key] = value if isinstance(value, nn.Module) else _GivenTensor(value)
    return old.forward() if isinstance(old, _GivenTensor) else old


def _pop_attribute(module: nn.Module, key: str) -> Any:
    """Remove instance attribute ``key`` wherever it is registered; return it.

    A module whose class routes attributes elsewhere (``torch.compile``'s ``OptimizedModule``
    sets and deletes them on the module it wraps) is asked through ``getattr``/``delattr``, so
    an attribute set for the call is removed from where ``setattr`` put it.
    """
    for table in (module._parameters, module._buffers, module.__dict__):
        if key in table:
            return table.pop(key)
    if type(module).__delattr__ is not nn.Module.__delattr__:
        try:
            value = getattr(module, key)
            delattr(module, key)
        except AttributeError:
            return _MISSING
        return value
    return _MISSING


def _restore(slots: list[_Slot], originals: list[Any]) -> dict[tuple[int, str], Any]:
    """Rule 7: put every original back; return what forward rebound, by slot."""
    rebound = {}
    for slot, original in zip(slots, originals, strict=True):
        current = _put(slot, original)
        if current is not slot.value:
            rebound[slot.ident] = current
    return rebound


def _write_back(rebound, slots: list[_Slot], given: dict[str, Any], sources) -> None:
    """Rule 8: a rebound slot's new object goes to the caller's mapping for that key."""
    slot_of = {name: slot.ident for slot in slots for name in slot.names}
    for name in given:
        ident = slot_of[name]
        source = sources[name]
        if ident in rebound and isinstance(source, MutableMapping):
            source[name] = rebound[ident]
