"""Clause checks shared by the APPLY-, FC- and TOGETHER- rules: no error raised, the path a
parameter took, a module left untouched. Each records its violations on a ``Checker``."""

from __future__ import annotations

from torch import Tensor, nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.models.apply_state import slot_code
from swapspec.properties.models.call_state import _MISSING, ModuleState, module_state
from swapspec.properties.models.examples import (
    same_values,
)
from swapspec.properties.models.outcomes import Outcome


def no_error(check: Checker, outcome: Outcome, what: str) -> bool:
    """Clause ``raised``: the target must not raise here."""
    error = outcome.error
    return check.that(error is None, "raised",
                      f"{what} raised {type(error).__name__}: {error}" if error else "")


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


def _lazy_materialized(old: tuple, new: tuple | None) -> bool:
    """A lazy module that forward initialized: its class became ``cls_to_become``."""
    return new is not None and getattr(old[0], "cls_to_become", None) is new[0]


def _layout_diff(old: tuple, new: tuple | None) -> str:
    if new is None:
        return "module gone"
    labels = ("class", "__dict__", "_parameters", "_buffers")
    return "; ".join(_reordered(label, a, b) or f"{label}: {a} -> {b}"
                     for label, a, b in zip(labels, old, new, strict=True) if a != b)


def _reordered(label: str, old: tuple, new: tuple) -> str:
    """``"slot order changed: ..."`` where a slot table holds the same names in another order."""
    if label in ("_parameters", "_buffers") and sorted(old) == sorted(new) and old != new:
        return f"slot order changed: {label} {old} -> {new}"
    return ""


def slot_orders(module: nn.Module) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Each submodule's ``_parameters`` and ``_buffers`` names, in their order."""
    return {path: (tuple(m._parameters), tuple(m._buffers))
            for path, m in module.named_modules(remove_duplicate=False)}


def slot_order_changes(before: dict, now: dict) -> list[str]:
    """Where ``now`` (``slot_orders``) holds a module's slot names in another order than
    ``before``, each said in those words."""
    changes = []
    for path, tables in before.items():
        for label, old, new in zip(("_parameters", "_buffers"), tables, now.get(path, tables),
                                   strict=True):
            said = _reordered(label, old, new)
            if said:
                changes.append(f"module {path or '<root>'!r}: {said}")
    return changes


def got_rebound_object(caller: object, given: object, rebound: Tensor, held_by_copy: set[int],
                       held_before: set[int]) -> bool:
    """Clause ``rebind-lost``'s test for one name forward rebound: the caller's mapping holds
    the new object forward made. ``rebound`` is what the model's copy holds after its forward,
    ``held_by_copy`` the ids the copy held before it, ``held_before`` the ids the module and
    the caller held before the call. The caller's object is not the one it gave, has the
    rebound values, and is no tensor held before the call unless forward rebound the slot to
    such a tensor (an equal value held before is not the new object)."""
    made = id(rebound) in held_by_copy or id(caller) not in held_before
    return caller is not given and made and same_values(caller, rebound)
