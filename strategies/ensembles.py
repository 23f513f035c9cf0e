"""Ensembles to draw: several copies of one module, stacked by ``stack_module_state`` and run
together by ``torch.vmap`` over a functional call (the ``torch.func`` model-ensembling pattern).

An :class:`Ensemble` is pure data; :func:`ensemble_models` builds its models from a drawn module.
Rules:

* ``size`` models (2 or 3), each a ``copy.deepcopy`` of the drawn module whose floating and
  complex tensors model ``k`` scales by ``1 + k / 4``: one class, one structure, other values.
* ``container``: how the models are passed (``list``, ``tuple``, ``nn.ModuleList``).
* ``skeleton``: the module the functional call runs, the first model itself (``first``) or a
  ``deepcopy`` of it moved to ``meta`` (``meta``), as torch's tutorial does (ties kept:
  ``skeleton_of``).
* ``unlike``: ``None`` for alike models, else how one model (``1``, or ``0`` for ``missing-name``)
  departs from the rest, which ``stack_module_state`` must refuse (``UNLIKE``). ``pick`` chooses
  the submodule or parameter the departure touches (modulo the candidates).
* Shrinks towards two alike models in a list, run on the first.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.strategies.tree_worlds import move_to_world

SIZES = (2, 3)
CONTAINERS = ("list", "tuple", "ModuleList")
SKELETONS = ("first", "meta")
EXTRA_NAME = "ensemble_extra"
# How a model can depart from the others, and what each needs of the drawn module.
UNLIKE = {
    "empty": "no model at all",
    "class": "model 1 is another class (wrapped in an nn.Sequential, or an nn.ModuleList "
             "where it is one)",
    "mode": "model 1 is in the other training mode",
    "submodule-mode": "one submodule of model 1 is in the other training mode",
    "requires-grad": "one parameter of model 1 does not require grad",
    "extra-name": f"model 1 has a buffer {EXTRA_NAME!r} the others lack",
    "missing-name": f"model 0 has a buffer {EXTRA_NAME!r} the others lack",
    "dtype": "model 1's floating tensors are float64 (float32 where its first one is float64)",
}


@dataclass(frozen=True)
class Ensemble:
    """One drawn ensemble: see the module docstring."""

    size: int = 2
    container: str = "list"
    skeleton: str = "first"
    unlike: str | None = None
    pick: int = 0

    @property
    def features(self) -> frozenset[str]:
        """Reach tags: the departure (``alike`` for none), the container and the skeleton."""
        return frozenset({f"unlike: {self.unlike or 'alike'}", f"container: {self.container}",
                          f"skeleton: {self.skeleton}", f"size: {self.size}"})


def ensembles(*, unlike: bool = False) -> st.SearchStrategy[Ensemble]:
    """Alike ensembles (``unlike=False``) or ensembles with one departure from ``UNLIKE``."""
    departures = st.sampled_from(sorted(UNLIKE)) if unlike else st.none()
    return st.builds(Ensemble, size=st.sampled_from(SIZES),
                     container=st.sampled_from(CONTAINERS),
                     skeleton=st.sampled_from(SKELETONS), unlike=departures,
                     pick=st.integers(0, 7))


def ensemble_models(module: nn.Module, ensemble: Ensemble) -> Sequence[nn.Module]:
    """The ensemble's models built from ``module`` (left as it is), in their container."""
    models = [_scaled(copy.deepcopy(module), 1 + k / 4) for k in range(ensemble.size)]
    if ensemble.unlike is not None:
        models = _departed(models, ensemble)
    return {"list": list, "tuple": tuple, "ModuleList": nn.ModuleList}[ensemble.container](models)


def skeleton_of(models: Sequence[nn.Module], ensemble: Ensemble) -> nn.Module:
    """The module the ensemble's functional call runs: the first model, or a deep copy of it
    with every tensor on ``meta``, one object per tie (``strategies.tree_worlds.move_to_world``;
    torch's tutorial's ``.to('meta')`` takes the overwrite path, which gives each tied slot a
    parameter of its own, so the functional call would fill only the first of them)."""
    if ensemble.skeleton == "first":
        return models[0]
    skeleton = copy.deepcopy(models[0])
    move_to_world(skeleton, "meta")
    return skeleton


def departs(module: nn.Module, unlike: str) -> bool:
    """Whether ``module`` has what the departure ``unlike`` changes (a submodule, a parameter
    that requires grad, a floating tensor)."""
    if unlike == "submodule-mode":
        return bool(_submodules(module))
    if unlike == "requires-grad":
        return bool(_trainable(module))
    if unlike == "dtype":  # plain floating tensors only: a host's own class may refuse `to`
        tensors = (*module.parameters(), *module.buffers())
        return any(t.is_floating_point() for t in tensors) and not any(
            is_traceable_wrapper_subclass(t) for t in tensors)
    return True


def _scaled(module: nn.Module, factor: float) -> nn.Module:
    """``module`` with each floating or complex tensor (each once) multiplied in place; a tensor
    whose class implements no in-place multiply (a host's quantized weight) keeps its values."""
    seen: set[int] = set()
    with torch.no_grad():
        for t in (*module.parameters(), *module.buffers()):
            if id(t) not in seen and (t.is_floating_point() or t.is_complex()):
                seen.add(id(t))
                with contextlib.suppress(NotImplementedError, RuntimeError, TypeError):
                    t.mul_(factor)
    return module


def _departed(models: list[nn.Module], ensemble: Ensemble) -> list[nn.Module]:
    """``models`` with the departure ``ensemble.unlike`` made to one of them."""
    unlike, other = ensemble.unlike, models[1]
    if unlike == "empty":
        return []
    if unlike == "class":
        models[1] = nn.ModuleList([other]) if type(other) is nn.Sequential else nn.Sequential(other)
    elif unlike == "mode":
        other.train(not other.training)
    elif unlike == "submodule-mode":
        paths = _submodules(other)
        sub = other.get_submodule(paths[ensemble.pick % len(paths)])
        sub.train(not sub.training)
    elif unlike == "requires-grad":
        names = _trainable(other)
        other.get_parameter(names[ensemble.pick % len(names)]).requires_grad_(False)
    elif unlike in ("extra-name", "missing-name"):
        models[1 if unlike == "extra-name" else 0].register_buffer(EXTRA_NAME, torch.zeros(1))
    elif unlike == "dtype":
        dtype = _other_dtype(other)
        other._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
    return models


def _other_dtype(module: nn.Module) -> torch.dtype:
    """float64, or float32 where the module's first floating tensor is float64: one dtype for
    every tensor, so a tensor ``_apply`` meets twice (a tie) converts once."""
    first = next(t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point())
    return torch.float32 if first.dtype == torch.float64 else torch.float64


def _submodules(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_modules() if name]


def _trainable(module: nn.Module) -> list[str]:
    return [name for name, p in module.named_parameters() if p.requires_grad]
