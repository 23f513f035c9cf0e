"""Checks shared by the LOAD- properties and the XLA-LOAD- ones (the same rules, on one device
or across two): which loads succeed, each tensor's path, what each slot holds, ties."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.harness import target_calls
from swapspec.properties.harness.checker import Checker
from swapspec.properties.models.apply_state import slot_code
from swapspec.properties.models.load_examples import (
    equal_values,
    expected_load_paths,
    key_model,
    meta_into_real,
    spec_swap_refused,
)
from swapspec.properties.models.outcomes import Outcome
from swapspec.strategies.state_dicts import LoadInput


def run_load(target: Any, example: Any) -> Outcome:
    """The example's load on ``target``: its result or its error (``target_calls.run_load``,
    which checks the invariants on the way)."""
    return target_calls.run_load(target, example)


def load_succeeds(module: nn.Module, load: LoadInput) -> bool:
    """The spec's load of this input succeeds: valid keys, no conflict, nothing refused."""
    model = key_model(module, load.state_dict)
    return not model.fails(load.strict) and not (load.swap and spec_swap_refused(module)) \
        and (load.assign or not meta_into_real(module, load.state_dict))


def expected_paths(before: dict[str, Tensor], load: LoadInput) -> dict[str, str]:
    """The path of each tensor object, under the first given key that reaches it, decided
    before the load (``expected_load_paths``: ``kept`` with ``assign`` only where every key of
    the object gives its own data)."""
    return expected_load_paths(before, load)


def check_load_path(check: Checker, key: str, before: Tensor, now: Tensor, cdata: int,
                    path: str) -> None:
    """Clause ``path-<path>``: copy and kept keep the object and its TensorImpl, swap keeps the
    object with a new TensorImpl, assign puts another object in the slot."""
    same, kept = now is before, now._cdata == cdata
    shown = {"copy": same and kept, "kept": same and kept, "swap": same and not kept,
             "assign": not same}[path]
    check.that(shown, f"path-{path}",
               f"{key!r} should take the {path} path (object kept: {same}, TensorImpl kept: "
               f"{kept})", code=f"{slot_code(key)} {'is not' if path == 'assign' else 'is'} "
               f"before[{key!r}]")


def dense(t: Tensor) -> Tensor:
    """A plain tensor of ``t``'s values (a TwoTensor's first half)."""
    t = t.detach()
    return t.a if is_traceable_wrapper_subclass(t) and hasattr(t, "a") else t.as_subclass(Tensor)


def holds_value(now: Tensor, value: Tensor, dtype: torch.dtype, device: torch.device) -> bool:
    """``now`` is ``value`` cast to ``dtype`` on ``device`` (values compared on the CPU)."""
    if (now.dtype, now.device) != (dtype, device):
        return False
    if now.is_meta or value.is_meta:
        return True
    want = dense(value).to(dtype=dtype, device=device)
    return equal_values(dense(now).cpu(), want.cpu())


def slot_ties(module: nn.Module) -> list[list[str]]:
    """Names of one tensor object held in two or more distinct (module, key) slots."""
    by_id: dict[int, dict[tuple[int, str], str]] = {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for registry in (m._parameters, m._buffers):
            for key, t in registry.items():
                if t is not None:
                    name = f"{prefix}.{key}" if prefix else key
                    by_id.setdefault(id(t), {}).setdefault((id(m), key), name)
    return [list(slots.values()) for slots in by_id.values() if len(slots) > 1]
