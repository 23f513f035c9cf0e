"""What users do to a module between the family's operations, as the sequence machine draws it:
a function for ``Module.apply(fn)`` (weight initialization) and a gradient clipping call
(``torch.nn.utils.clip_grad_*``).

Each is data with the source a repro prints. ``module_fns()`` and ``grad_clips()`` draw them.
A module function writes tensors in place and rebinds nothing; where it draws numbers it draws
them from a forked RNG with a fixed seed, so it leaves the global RNG as it found it.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from torch import nn

INIT_SEED = 0  # the seed of the forked RNG a module function draws from


def fill_floating_parameters(module: nn.Module) -> None:
    """``nn.init.constant_(p, 0.25)`` on each of the module's own floating parameters."""
    for p in module.parameters(recurse=False):
        if p.is_floating_point():
            nn.init.constant_(p, 0.25)


def halve_floating_tensors(module: nn.Module) -> None:
    """Each of the module's own floating parameters and buffers multiplied by 0.5 in place."""
    with torch.no_grad():
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if t.is_floating_point():
                t.mul_(0.5)


def reset_parameters(module: nn.Module) -> None:
    """The module's own ``reset_parameters()`` where it has one (the usual re-initialization),
    drawing from a forked RNG seeded ``INIT_SEED``."""
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(INIT_SEED)
            reset()


MODULE_FNS: tuple[Callable[[nn.Module], None], ...] = (
    fill_floating_parameters, halve_floating_tensors, reset_parameters)
# The functions that write registered slots only, never an attribute a module computes from
# them: old-style ``spectral_norm`` leaves its computed ``weight`` sharing storage with
# ``weight_orig`` until the first forward, so ``reset_parameters`` writing ``self.weight`` in
# place then rewrites ``weight_orig`` too, which a fresh build (a new ``weight_orig``) does not.
SLOT_FNS = (fill_floating_parameters, halve_floating_tensors)


def module_fns(slots_only: bool = False) -> st.SearchStrategy[Callable[[nn.Module], None]]:
    """A function ``Module.apply`` runs on every module of a tree (``MODULE_FNS``; with
    ``slots_only``, one of ``SLOT_FNS``)."""
    return st.sampled_from(SLOT_FNS if slots_only else MODULE_FNS)


def module_fn_source(fn: Callable[[nn.Module], None]) -> str:
    """The function's definition, for a repro (it names ``INIT_SEED`` by its value)."""
    return inspect.getsource(fn).replace("INIT_SEED", str(INIT_SEED))


@dataclass(frozen=True)
class GradClip:
    """One call of a ``torch.nn.utils`` clipping function on ``module.parameters()``."""

    function: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, module: nn.Module) -> Any:
        """Clip ``module``'s grads in place; the function's deprecation warning is not shown."""
        kwargs = dict(self.kwargs)
        if "total_norm" in kwargs:
            kwargs["total_norm"] = torch.tensor(kwargs["total_norm"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return getattr(torch.nn.utils, self.function)(module.parameters(), **kwargs)

    def source(self, module: str = "module") -> str:
        """The call as a line of code."""
        args = ", ".join(f"{k}=torch.tensor({_code(v)})" if k == "total_norm" else
                         f"{k}={_code(v)}" for k, v in self.kwargs.items())
        return f"torch.nn.utils.{self.function}({module}.parameters(), {args})"


def _code(value: Any) -> str:
    return "float('inf')" if value == float("inf") else repr(value)


FOREACH = (None, False, True)
# the clipping functions of the installed torch (``clip_grads_with_norm_`` is newer than 2.5)
CLIP_FUNCTIONS = tuple(f for f in ("clip_grad_norm_", "clip_grad_norm", "clip_grads_with_norm_",
                                   "clip_grad_value_") if hasattr(torch.nn.utils, f))


@st.composite
def grad_clips(draw: Any) -> GradClip:
    """A clipping call with every argument form: ``clip_grad_norm_`` (``max_norm`` that clips or
    not, ``norm_type`` 1, 2 or inf, ``error_if_nonfinite``, ``foreach``), its deprecated alias
    ``clip_grad_norm``, ``clip_grads_with_norm_`` with a given total norm, ``clip_grad_value_``."""
    function = draw(st.sampled_from(CLIP_FUNCTIONS))
    foreach = draw(st.sampled_from(FOREACH))
    if function == "clip_grad_value_":
        return GradClip(function, {"clip_value": draw(st.sampled_from((0.01, 1.0))),
                                   "foreach": foreach})
    max_norm = draw(st.sampled_from((0.5, 100.0)))
    if function == "clip_grads_with_norm_":
        return GradClip(function, {"max_norm": max_norm, "total_norm": 4.0, "foreach": foreach})
    return GradClip(function, {"max_norm": max_norm,
                               "norm_type": draw(st.sampled_from((2.0, 1.0, float("inf")))),
                               "error_if_nonfinite": draw(st.booleans()), "foreach": foreach})
