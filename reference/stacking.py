"""Reference ``stack_module_state``: the parameters and buffers of several alike modules, stacked
for ``torch.vmap`` over a functional call (``torch.func.stack_module_state``'s spec).

Rules:
1. The models must be alike, as torch's documentation requires ("the same, except for the
   values of their parameters/buffers"): at least one model; at every module path (``""`` and
   each ``named_modules()`` name) the same class and the same training mode; the same parameter
   names and the same buffer names (``named_parameters()``/``named_buffers()``: the first name
   of each tensor, so models tied differently differ); per name the same shape, dtype, device,
   layout and ``requires_grad``. Otherwise ``RuntimeError`` naming the first difference, and
   nothing is built.
2. Each result is a new tensor, ``torch.stack`` of the models' values in model order: it shares
   no storage with any model and carries no autograd history. A stacked parameter or buffer
   whose tensors require grad is a leaf that requires grad (an optimizer can take it).
3. The models are not changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import torch
from torch import Tensor, nn

_PREFIX = "stack_module_state"
_COMPARED = ("shape", "dtype", "device", "layout", "requires_grad")


def stack_module_state(models: Sequence[nn.Module]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Rules 1-3: ``(params, buffers)``, each ``{name: stacked tensor}`` in the first model's
    name order."""
    models = list(models)
    if not models:
        raise RuntimeError(f"{_PREFIX}: Expected at least one model, got 0.")
    _check_modules_alike(models)
    params = _stacked([dict(m.named_parameters()) for m in models], "parameter")
    buffers = _stacked([dict(m.named_buffers()) for m in models], "buffer")
    return params, buffers


def _check_modules_alike(models: list[nn.Module]) -> None:
    """Rule 1 for the module trees: the roots first (in torch's words), then every path, each
    of one class and one training mode."""
    if len({m.training for m in models}) > 1:
        raise RuntimeError(f"{_PREFIX}: Expected all models to have the same training/eval mode.")
    if len({type(m) for m in models}) > 1:
        raise RuntimeError(f"{_PREFIX}: Expected all models to be of the same class.")
    first = dict(models[0].named_modules(remove_duplicate=False))
    for index, model in enumerate(models[1:], start=1):
        tree = dict(model.named_modules(remove_duplicate=False))
        if tree.keys() != first.keys():
            _refuse(index, "submodules", sorted(first.keys() ^ tree.keys()))
        for path, module in tree.items():
            if type(module) is not type(first[path]):
                raise RuntimeError(f"{_PREFIX}: Expected all models to be of the same class: "
                                   f"model {index} has {type(module).__name__} at {path!r}, "
                                   f"model 0 has {type(first[path]).__name__}.")
            if module.training != first[path].training:
                raise RuntimeError(f"{_PREFIX}: Expected all models to have the same "
                                   f"training/eval mode: model {index} differs from model 0 at "
                                   f"{path!r}.")


def _stacked(named: list[dict[str, Tensor]], kind: str) -> dict[str, Tensor]:
    """Rules 1 and 2 for one kind of tensor: every model has the first model's names, each name
    with the same properties; then one new stacked tensor per name."""
    first = named[0]
    for index, tensors in enumerate(named[1:], start=1):
        if tensors.keys() != first.keys():
            _refuse(index, f"{kind} names", sorted(first.keys() ^ tensors.keys()))
        for name, tensor in tensors.items():
            for attribute in _COMPARED:
                if getattr(tensor, attribute) != getattr(first[name], attribute):
                    raise RuntimeError(
                        f"{_PREFIX}: Expected {kind} {name!r} of each model to have the same "
                        f".{attribute}: model {index} has {getattr(tensor, attribute)}, model 0 "
                        f"has {getattr(first[name], attribute)}.")
    return {name: _leaf([tensors[name] for tensors in named]) for name in first}


def _leaf(tensors: list[Tensor]) -> Tensor:
    """Rule 2: the stack of ``tensors``' values, detached; a leaf requiring grad where they do."""
    with torch.no_grad():
        stacked = torch.stack([t.detach() for t in tensors])
    return stacked.requires_grad_() if tensors[0].requires_grad else stacked


def _refuse(index: int, what: str, names: list[str]) -> NoReturn:
    raise RuntimeError(f"{_PREFIX}: Expected all models to have the same {what}: model {index} "
                       f"and model 0 differ in {names}.")
