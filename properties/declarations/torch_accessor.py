"""Declared deviations of torch's ``NamedMemberAccessor`` from the ``ACCESSOR-`` rules.

Each was observed with the suite and reduced to a minimal plain-torch repro (in ``reason``). The
predicates read the drawn module before the target converts it (the conversion adds and removes
no slot): ``ACCESSOR-REFUSED`` makes every refused call of ``bad_calls`` on each example, the
batched ones on a module with a registered slot, the shared one on a module whose slot is
reachable under two paths.
"""

from __future__ import annotations

from typing import Any

from swapspec.properties.models.examples import slots
from swapspec.properties.vocabulary import Deviation

TORCH_CHECKED = ("2.13.0", None)  # repros checked on 2.13.0 only: no matrix run yet


def has_a_slot(example: Any) -> bool:
    """The module has a registered parameter or buffer slot: the refused batched writes
    (``set_tensors``, ``set_tensors_dict``, ``swap_tensors``, ``del_tensors`` with a good first
    name) are made."""
    return bool(slots(example.module))


def slot_under_two_paths(example: Any) -> bool:
    """A registered slot of a child shared under two paths: the refused ``swap_tensors_dict``
    through both paths is made."""
    by_slot: dict[tuple[int, str], int] = {}
    for name in slots(example.module):
        prefix, _, attr = name.rpartition(".")
        key = (id(example.module.get_submodule(prefix)), attr)
        by_slot[key] = by_slot.get(key, 0) + 1
    return any(count > 1 for count in by_slot.values())


ACCESSOR_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "ACCESSOR-REFUSED", has_a_slot, "batch-changed-on-error",
        "NamedMemberAccessor.set_tensors, set_tensors_dict, swap_tensors and del_tensors write "
        "name by name and "
        "put nothing back when a later name is refused, so the refused call leaves the earlier "
        "names set, swapped or deleted (swap_tensors_dict swaps back; torch 2.13). Repro: "
        "from torch.nn.utils._named_member_accessor import NamedMemberAccessor; "
        "m = torch.nn.Linear(2, 2); w = m.weight; a = NamedMemberAccessor(m); "
        "a.swap_tensors(['weight', 'nope'], [torch.ones(2, 2), torch.ones(2)])  # AttributeError; "
        "assert m.weight is w  # fails (likewise set_tensors(['weight', 'training.x'], ...), "
        "set_tensors_dict({'weight': ..., 'training.x': ...}), del_tensors(['weight', 'nope']))",
        torch_versions=TORCH_CHECKED, id="torch.accessor.batched-refusal-keeps-earlier-writes"),
    Deviation(
        "ACCESSOR-REFUSED", slot_under_two_paths, "shared-rollback",
        "NamedMemberAccessor.swap_tensors_dict swaps back on error in the order it swapped, so "
        "a slot given under two paths of a shared child gets the first given tensor back, not "
        "its own (torch 2.13; the functional-call form is FC-RESTORE's SHARED_SLOT). Repro: "
        "from torch.nn.utils._named_member_accessor import NamedMemberAccessor; "
        "lin = torch.nn.Linear(2, 2); w = lin.weight; m = torch.nn.Sequential(lin, lin); "
        "NamedMemberAccessor(m).swap_tensors_dict({'0.weight': torch.ones(2, 2), "
        "'1.weight': torch.zeros(2, 2), 'training': torch.ones(1)}, allow_missing=True)"
        "  # TypeError; assert lin.weight is w  # fails: it holds the ones",
        torch_versions=TORCH_CHECKED, id="torch.accessor.shared-slot-rollback"),
)
