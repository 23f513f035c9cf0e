"""What the spec says a functional call should do, computed from the module alone.

These are written independently of ``reference/`` so that the suite can judge the
reference too: a planted bug in the reference is caught here, not echoed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn
from torch.nn.parameter import UninitializedTensorMixin

from swapspec.properties.models.examples import named_tensors
from swapspec.strategies.calls import initializes_lazily


@dataclass(frozen=True)
class ExpectedError:
    """The error the spec requires: its type, the keys its message must name, torch's wording.

    Every target must raise ``type`` (or a subclass) with a message that names each of
    ``keys`` (the names involved, as torch's own message names them), and leave the module as
    it was (the properties check that separately). A target that declares
    ``exact_messages`` (torch's own functions, the reference) must also raise exactly
    ``type`` with exactly ``message``, so a change of torch's wording is reported.
    ``alternatives`` are other errors the spec accepts instead (another conflicting group).
    """

    type: type[BaseException]
    message: str
    rule: str = "name"  # which check: form, tie, slot, strict or name
    keys: tuple[str, ...] = ()
    alternatives: tuple[ExpectedError, ...] = ()

    def matches(self, exc: BaseException, *, exact: bool = False) -> bool:
        """Whether ``exc`` is this error (or an alternative): by type and keys, or, with
        ``exact``, by exact type and message."""
        return any(e._matches_one(exc, exact) for e in (self, *self.alternatives))

    def _matches_one(self, exc: BaseException, exact: bool) -> bool:
        if exact:
            return type(exc) is self.type and _message(exc) == self.message
        return isinstance(exc, self.type) and all(key in _message(exc) for key in self.keys)

    def wanted(self, *, exact: bool = False) -> str:
        """What a matching error looks like, for a failure message."""
        if exact:
            return f"{self.type.__name__}: {self.message!r}"
        named = f" naming {', '.join(repr(k) for k in self.keys)}" if self.keys else ""
        return f"{self.type.__name__}{named}"


def _message(exc: BaseException) -> str:
    # KeyError's str() quotes its argument; compare the argument itself.
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def merge_inputs(tensors: Any) -> dict[str, Any] | ExpectedError:
    """The ``{name: value}`` a call sees, or the error its form deserves."""
    if isinstance(tensors, Mapping):
        return dict(tensors)
    if not isinstance(tensors, list | tuple):
        return ExpectedError(ValueError, "Expected parameter_and_buffer_dicts to be a dict, or a "
                             f"list/tuple of dicts, but got {type(tensors)}", "form")
    if any(not isinstance(d, Mapping) for d in tensors):
        return ExpectedError(ValueError,
                             "Expected all elements of parameter_and_buffer_dicts to be dictionaries",
                             "form")
    keys = [k for d in tensors for k in d]
    repeated = list(dict.fromkeys(k for k in keys if keys.count(k) > 1))
    if repeated:
        return ExpectedError(ValueError, f"{repeated} appeared in multiple dictionaries; "
                             "behavior of functional call is ambiguous", "form",
                             tuple(repeated))
    return {k: v for d in tensors for k, v in d.items()}


def tie_groups(module: nn.Module) -> dict[str, frozenset[str]]:
    """Each aliased name -> every name of the same tensor."""
    names_of: dict[int, set[str]] = {}
    for name, t in named_tensors(module).items():
        names_of.setdefault(id(t), set()).add(name)
    return {n: frozenset(g) for g in names_of.values() if len(g) > 1 for n in g}


def expand(module: nn.Module, given: dict[str, Any], tie_weights: bool) -> dict[str, Any] | ExpectedError:
    """Every name the call fills, with its value; or the tie conflict error."""
    if not tie_weights:
        return dict(given)
    groups = tie_groups(module)
    conflicts = [ExpectedError(ValueError, f"functional_call got multiple values for keys "
                               f"{sorted(group)}, which are tied. Consider using tie_weights=False",
                               "tie", tuple(sorted(n for n in group if n in given)))
                 for group in dict.fromkeys(groups.get(n, frozenset()) for n in given)
                 if len({id(given[n]) for n in group if n in given}) > 1]
    if conflicts:
        return dataclasses.replace(conflicts[0], alternatives=tuple(conflicts[1:]))
    filled = dict(given)
    for name in given:
        filled.update(dict.fromkeys(groups.get(name, ()), given[name]))
    return filled


def strict_error(module: nn.Module, filled: dict[str, Any]) -> ExpectedError | None:
    """torch's strict key rule, over the filled names."""
    valid = set(named_tensors(module))
    unexpected, missing = sorted(set(filled) - valid), sorted(valid - set(filled))
    parts = []
    if unexpected:
        parts.append("Unexpected key(s): " + ", ".join(repr(k) for k in unexpected) + ".")
    if missing:
        parts.append("Missing key(s): " + ", ".join(repr(k) for k in missing) + ".")
    if not parts:
        return None
    return ExpectedError(RuntimeError, f"Error(s) in reparametrizing for {module._get_name()}:\n\t"
                         + "\n\t".join(parts), "strict", (*unexpected, *missing))


def owner_of(module: nn.Module, name: str) -> tuple[nn.Module, str] | ExpectedError:
    """The submodule that owns ``name`` and the key inside it, or the lookup error."""
    prefix, _, key = name.rpartition(".")
    path = prefix.split(".") if prefix else []
    owner = module
    for i, part in enumerate(path):
        if not hasattr(owner, part):
            return ExpectedError(AttributeError, f"{owner._get_name()} has no attribute `{part}`",
                                 keys=(part,))
        nxt = getattr(owner, part)
        if not isinstance(nxt, nn.Module):
            return ExpectedError(TypeError, f"submodule `{'.'.join(path[:i + 1])}`: {nxt} "
                                 "is not an instance of torch.nn.Module",
                                 keys=(".".join(path[:i + 1]),))
        owner = nxt
    return owner, key


def name_error(module: nn.Module, name: str, value: Any) -> ExpectedError | None:
    """torch's per-name checks in torch's order: submodule path, value type, empty key,
    attribute type (the spec adds ``lazy_value_error``)."""
    found = owner_of(module, name)
    if isinstance(found, ExpectedError):
        return found
    owner, key = found
    if value is not None and not isinstance(value, Tensor):
        return ExpectedError(TypeError, f"{value} is not an instance of torch.Tensor")
    if not key:
        return ExpectedError(KeyError, 'tensor name can\'t be empty string ""')
    registered = key in owner._parameters or key in owner._buffers
    current = getattr(owner, key, None)
    if not registered and current is not None and not isinstance(current, Tensor):
        return ExpectedError(TypeError, f"attribute `{key}`: {current} is not an instance of torch.Tensor",
                             keys=(key,))
    return None


def lazy_value_error(module: nn.Module, name: str, value: Any) -> ExpectedError | None:
    """The spec's check after torch's per-name checks (torch has none): a value (``None``
    included) for an uninitialized tensor of a lazy module not yet initialized is a
    ``ValueError`` naming it. Its forward would finish initializing the module around the
    value, so the call cannot leave the module as it was."""
    found = owner_of(module, name)
    if isinstance(found, ExpectedError):
        return None
    owner, key = found
    current = owner._parameters.get(key, owner._buffers.get(key))
    if value is current or not isinstance(current, UninitializedTensorMixin):
        return None
    if not initializes_lazily(owner):
        return None
    return ExpectedError(ValueError, f"functional_call cannot give a value to {name!r}, an "
                         f"uninitialized tensor of the lazy module {owner._get_name()}: run one "
                         "forward to initialize it first", keys=(name,))


def slot_conflict(module: nn.Module, filled: dict[str, Any]) -> ExpectedError | None:
    """Two names that reach one slot with different objects (shared submodules)."""
    by_slot: dict[tuple[int, str], list[str]] = {}
    for name in filled:
        found = owner_of(module, name)
        if isinstance(found, ExpectedError):
            continue
        owner, key = found
        names = by_slot.setdefault((id(owner), key), [])
        if names and filled[names[0]] is not filled[name]:
            keys = tuple(sorted([*names, name]))
            return ExpectedError(ValueError, f"functional_call got multiple values for keys "
                                 f"{list(keys)}, which name one slot of a shared submodule",
                                 "slot", keys)
        names.append(name)
    return None


def registered(module: nn.Module, name: str) -> bool:
    """Whether ``name`` is a registered parameter or buffer slot (its value may be None)."""
    found = owner_of(module, name)
    if isinstance(found, ExpectedError) or not found[1]:
        return False
    owner, key = found
    return key in owner._parameters or key in owner._buffers


def unregistered_error(module: nn.Module, filled: dict[str, Any]) -> ExpectedError | None:
    """The design ``registered-names-only``: a ``KeyError`` naming a given name that is not a
    registered parameter or buffer; any other name's error (torch's, ``name_error``) is
    accepted instead, whichever a library checks first."""
    errors = [ExpectedError(KeyError, f"{name!r} is not a registered parameter or buffer",
                            keys=(name,)) for name in filled if not registered(module, name)]
    if not errors:
        return None
    others = [e for e in (name_error(module, n, v) for n, v in filled.items()) if e is not None]
    return dataclasses.replace(errors[0], alternatives=(*errors[1:], *others))


def expected_outcome(module: nn.Module, tensors: Any, *, tie_weights: bool,
                     strict: bool, registered_only: bool = False) -> dict[str, Any] | ExpectedError:
    """The filled ``{name: value}`` the forward sees, or the error the call must raise.

    Order: input form, ties, one slot one value, strict, then each name (torch's checks, then
    ``lazy_value_error``); with
    ``registered_only`` (the design ``registered-names-only``) a name that is not a registered
    parameter or buffer raises ``KeyError`` (``unregistered_error``).
    """
    given = merge_inputs(tensors)
    if isinstance(given, ExpectedError):
        return given
    filled = expand(module, given, tie_weights)
    if isinstance(filled, ExpectedError):
        return filled
    error = slot_conflict(module, filled) or (strict_error(module, filled) if strict else None)
    if error is not None:
        return error
    if registered_only:
        error = unregistered_error(module, filled)
        if error is not None:
            return error
    for name, value in filled.items():
        error = name_error(module, name, value) or lazy_value_error(module, name, value)
        if error is not None:
            return error
    return filled


def slot_of(module: nn.Module, name: str) -> tuple[int, str] | None:
    """An identity for the slot ``name`` reaches: (owner id, key), or None if unreachable."""
    found = owner_of(module, name)
    return None if isinstance(found, ExpectedError) else (id(found[0]), found[1])


def expected_view(module: nn.Module, filled: dict[str, Any]) -> dict[str, Any]:
    """What every valid name shows during forward: its filled value, else its original.

    A name not filled itself still shows a filled value when it reaches the same slot
    as a filled name (a shared submodule's other path).
    """
    by_slot = {slot_of(module, n): v for n, v in filled.items()}
    view = {}
    for name, original in named_tensors(module).items():
        slot = slot_of(module, name)
        view[name] = filled[name] if name in filled else by_slot.get(slot, original)
    return view
