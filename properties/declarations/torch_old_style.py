"""Declared deviations of torch's removals of the old-style reparametrizations from the
``OLD-STYLE-`` rules.

The predicates read the drawn reparametrization (``Example.method``, a
``strategies.old_style.OldStyle``) and the module it was applied to, before the target runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.declarations.torch_parametrize import TORCH_CHECKED, converts_to_wrapper
from swapspec.properties.models.old_style_state import kept_slots, spectral_dim, spectral_value
from swapspec.properties.models.outcomes import attempt
from swapspec.properties.models.parametrize_state import matrix_slot, owner_at
from swapspec.properties.vocabulary import Deviation
from swapspec.strategies.old_style import OldStyle


def pruning_lost_on_wrapper(example: Any) -> bool:
    """A pruning that zeroes at least one nonzero entry, on a tensor the conversion makes a
    traceable wrapper subclass (``TwoTensor``) whose class computes the pruned value (a class
    that does not implement the product raises in the removal instead)."""
    old_style = example.method
    if not isinstance(old_style, OldStyle) or old_style.first is None:
        return False
    if not converts_to_wrapper(example):
        return False
    path, name = matrix_slot(example.module)
    owner = owner_at(example.module, path)
    orig, mask = getattr(owner, name + "_orig"), getattr(owner, name + "_mask")
    return bool(((mask == 0) & (orig.detach() != 0)).any()) and _pruned_value_computes(
        example, orig, mask)


def _pruned_value_computes(example: Any, orig: Any, mask: Any) -> bool:
    """Whether ``orig``, as the example's conversion makes it, is a traceable wrapper subclass on
    which ``mask * orig`` computes."""
    converted = attempt(lambda: example.conversion.make_fn()(orig.detach())).result
    if converted is None:
        return False
    product = attempt(lambda: mask.to(dtype=converted.dtype) * converted)
    return product.error is None and is_traceable_wrapper_subclass(converted)


def spectral_norm_removed(example: Any) -> bool:
    """The drawn reparametrization is the old ``spectral_norm``, and its value computes on the
    slots as the example's conversion makes them (else the removal raises, leaving no hook)."""
    old_style = example.method
    if not isinstance(old_style, OldStyle) or old_style.method != "spectral_norm":
        return False
    path, name = matrix_slot(example.module)
    owner = owner_at(example.module, path)
    def value() -> Any:
        fn = example.conversion.make_fn()
        slots = [fn(getattr(owner, s).detach()) for s in kept_slots(old_style, name)]
        with torch.no_grad():
            return spectral_value(*slots, spectral_dim(owner, old_style))

    return attempt(value).error is None  # a dtype or class the product is not implemented for


OLD_STYLE_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "OLD-STYLE-REMOVE", pruning_lost_on_wrapper, "value",
        "prune.remove writes the pruned value with `orig.data = weight.data`, and on a traceable "
        "wrapper subclass (TwoTensor) set_data replaces the outer TensorImpl but not the inner "
        "tensors the subclass computes with, so the parameter keeps its unpruned values: the "
        "pruning is silently lost (torch 2.13, 2.14). Repro: from torch.testing._internal."
        "two_tensor import TwoTensor; import torch.nn.utils.prune as prune; m = nn.Linear(4, 3); "
        "prune.l1_unstructured(m, 'weight', amount=0.5); m._apply(lambda t: "
        "TwoTensor(t.detach(), t.detach().clone()) if t.is_floating_point() else t); prune.remove(m, 'weight'); "
        "(m.weight.a == 0).sum()  # 0: no entry pruned (6 before the removal)",
        torch_versions=TORCH_CHECKED, id="torch.prune.remove-loses-pruning-on-wrapper"),
    Deviation(
        "OLD-STYLE-REMOVE", spectral_norm_removed, "hooks",
        "remove_spectral_norm looks for its load_state_dict pre-hook with isinstance(hook, "
        "SpectralNormLoadStateDictPreHook), but Module._register_load_state_dict_pre_hook "
        "stores it wrapped in a _WrappedHook, so the check never matches and the hook stays: "
        "every later load_state_dict(module.state_dict()) of the plain module raises (torch "
        "2.13, 2.14). Repro: m = nn.Linear(4, 3); torch.nn.utils.spectral_norm(m); "
        "torch.nn.utils.remove_spectral_norm(m); len(m._load_state_dict_pre_hooks)  # 1; "
        "m.load_state_dict(m.state_dict())  # RuntimeError: Missing key(s) in state_dict: "
        "\"weight_orig\", \"weight_u\"",
        torch_versions=TORCH_CHECKED, id="torch.remove-spectral-norm-leaves-load-pre-hook"),
)
