"""Decorations torch itself provides, applied to a built tree: parametrizations, old-style hook
reparametrizations, pruning, tensor hooks and module hooks.

A :class:`DecorationSpec` is pure data (part of a :class:`~strategies.tree_spec.TreeSpec`), applied by
:func:`decorate` after the tree's ties and shares. Rules:

* Parametrizations (``torch.nn.utils.parametrize``): ``weight_norm``, ``spectral_norm`` and
  ``orthogonal`` from ``torch.nn.utils.parametrizations``; ``custom`` (``Double``: ``2 * x``, no
  ``right_inverse``, so the slot's value doubles) and ``custom-inverse`` (``Negate`` with its
  ``right_inverse``, so the slot's value is kept).
* Old hook-based ones: ``old-weight-norm`` (``torch.nn.utils.weight_norm``), ``old-spectral-norm``
  (``torch.nn.utils.spectral_norm``) and ``prune`` (``prune.l1_unstructured``, amount 0.5).
* ``tensor-hooks``: ``register_hook`` and ``register_post_accumulate_grad_hook`` on the
  parameter; ``module-hooks``: a forward hook and a forward pre-hook on the module;
  ``backward-hooks``: a full backward pre-hook and a full backward hook on the module
  (``register_full_backward_pre_hook``/``register_full_backward_hook``, which wrap forward's
  inputs and outputs in ``BackwardHookFunction``); ``old-backward-hook``: one non-full
  ``register_backward_hook``, which hooks the ``grad_fn`` of forward's output (torch refuses
  both kinds on one module); ``forward-kwargs-hooks``: a forward pre-hook
  and a forward hook registered ``with_kwargs=True``, the latter ``always_call=True``. Each hook
  counts its firings in its module's ``sw_hook_counts`` (a ``collections.Counter``) under
  ``'<kind>:<path>[.<name>]'`` (:func:`hook_counts` adds them up over a tree); the hooks change
  no value. The module kinds (:data:`MODULE_KINDS`) decorate a module, the others a parameter.
* Anything random at registration (power-iteration vectors) runs under a forked RNG seeded from
  the tree's seed, so decorating never reads or advances torch's global RNG.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrizations, parametrize, prune

PARAMETRIZATIONS = ("weight_norm", "spectral_norm", "orthogonal", "custom", "custom-inverse")
OLD_STYLE = ("old-weight-norm", "old-spectral-norm", "prune")
HOOKS = ("tensor-hooks", "module-hooks", "backward-hooks", "forward-kwargs-hooks",
         "old-backward-hook")
MODULE_KINDS = ("module-hooks", "backward-hooks", "forward-kwargs-hooks", "old-backward-hook")
KINDS = (*HOOKS, *PARAMETRIZATIONS, *OLD_STYLE)
# Full and non-full backward hooks: torch refuses both on one module.
BACKWARD_KINDS = ("backward-hooks", "old-backward-hook")
NEEDS_MATRIX = ("orthogonal",)
HOOK_COUNTS = "sw_hook_counts"


@dataclass(frozen=True)
class DecorationSpec:
    """Decorate the slot ``name`` of the module at ``path`` (``module-hooks``: the module) with ``kind``."""

    kind: str
    path: str = ""
    name: str = ""

    def __repr__(self) -> str:
        fields = [f"kind={self.kind!r}", f"path={self.path!r}"]
        if self.name:
            fields.append(f"name={self.name!r}")
        return f"DecorationSpec({', '.join(fields)})"

    @property
    def key(self) -> str:
        """The slot (or module) it decorates, as a dotted name."""
        return ".".join(p for p in (self.path, self.name) if p)


class Double(nn.Module):
    """A parametrization without ``right_inverse``: the slot reads ``2 * original``."""

    def forward(self, x: Tensor) -> Tensor:
        return 2 * x


class Negate(nn.Module):
    """A parametrization with ``right_inverse``: ``original`` stores ``-value``, the slot reads ``value``."""

    def forward(self, x: Tensor) -> Tensor:
        return -x

    def right_inverse(self, x: Tensor) -> Tensor:
        return -x


def decorate(root: nn.Module, decorations: tuple[DecorationSpec, ...], seed: int) -> None:
    """Apply each decoration in order (see the module docstring)."""
    if not decorations:
        return
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old-style ones are deprecated
        torch.default_generator.manual_seed(seed)
        for spec in decorations:
            _DECORATORS[spec.kind](root, spec)


def _owner(root: nn.Module, spec: DecorationSpec) -> nn.Module:
    return root.get_submodule(spec.path) if spec.path else root


def _parametrize(fn: Callable[[nn.Module, str], object]) -> Callable[[nn.Module, DecorationSpec], None]:
    def apply(root: nn.Module, spec: DecorationSpec) -> None:
        fn(_owner(root, spec), spec.name)

    return apply


def _counter(module: nn.Module) -> Counter:
    if HOOK_COUNTS not in module.__dict__:
        setattr(module, HOOK_COUNTS, Counter())
    return getattr(module, HOOK_COUNTS)


def _tensor_hooks(root: nn.Module, spec: DecorationSpec) -> None:
    owner = _owner(root, spec)
    counts = _counter(owner)
    param = getattr(owner, spec.name)
    param.register_hook(GradHook(counts, f"tensor-hook:{spec.key}"))
    param.register_post_accumulate_grad_hook(GradHook(counts, f"post-accumulate-hook:{spec.key}"))


def _module_hooks(root: nn.Module, spec: DecorationSpec) -> None:
    module = _owner(root, spec)
    _counter(module)
    module.register_forward_pre_hook(ModuleHook(f"forward-pre-hook:{spec.path}"))
    module.register_forward_hook(ModuleHook(f"forward-hook:{spec.path}"))


def _backward_hooks(root: nn.Module, spec: DecorationSpec) -> None:
    module = _owner(root, spec)
    _counter(module)
    module.register_full_backward_pre_hook(ModuleHook(f"backward-pre-hook:{spec.path}"))
    module.register_full_backward_hook(ModuleHook(f"backward-hook:{spec.path}"))


def _old_backward_hook(root: nn.Module, spec: DecorationSpec) -> None:
    module = _owner(root, spec)
    _counter(module)
    module.register_backward_hook(ModuleHook(f"old-backward-hook:{spec.path}"))


def _forward_kwargs_hooks(root: nn.Module, spec: DecorationSpec) -> None:
    module = _owner(root, spec)
    _counter(module)
    module.register_forward_pre_hook(ModuleHook(f"forward-pre-hook-kwargs:{spec.path}"),
                                     with_kwargs=True)
    module.register_forward_hook(ModuleHook(f"forward-hook-kwargs:{spec.path}"),
                                 with_kwargs=True, always_call=True)


class GradHook:
    """A tensor hook that counts its firings and changes nothing."""

    def __init__(self, counts: Counter, key: str) -> None:
        self.counts, self.key = counts, key

    def __call__(self, arg: Tensor) -> None:
        self.counts[self.key] += 1


class ModuleHook:
    """A module hook (forward or backward, pre or post) that counts its firings in its
    module's counter and returns None."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, module: nn.Module, *args: object) -> None:
        getattr(module, HOOK_COUNTS)[self.key] += 1


_DECORATORS: dict[str, Callable[[nn.Module, DecorationSpec], None]] = {
    "weight_norm": _parametrize(lambda m, n: parametrizations.weight_norm(m, n, dim=0)),
    "spectral_norm": _parametrize(lambda m, n: parametrizations.spectral_norm(m, n, dim=0)),
    "orthogonal": _parametrize(lambda m, n: parametrizations.orthogonal(m, n)),
    "custom": _parametrize(lambda m, n: parametrize.register_parametrization(m, n, Double())),
    "custom-inverse": _parametrize(lambda m, n: parametrize.register_parametrization(m, n, Negate())),
    "old-weight-norm": _parametrize(lambda m, n: torch.nn.utils.weight_norm(m, n, dim=0)),
    "old-spectral-norm": _parametrize(lambda m, n: torch.nn.utils.spectral_norm(m, n, dim=0)),
    "prune": _parametrize(lambda m, n: prune.l1_unstructured(m, n, amount=0.5)),
    "tensor-hooks": _tensor_hooks,
    "module-hooks": _module_hooks,
    "backward-hooks": _backward_hooks,
    "old-backward-hook": _old_backward_hook,
    "forward-kwargs-hooks": _forward_kwargs_hooks,
}


def hook_counts(root: nn.Module) -> Counter:
    """The firing counts of every counting hook of the tree (each module once; empty if none)."""
    total: Counter = Counter()
    for module in root.modules():
        total.update(module.__dict__.get(HOOK_COUNTS, Counter()))
    return total


def decoratable(kind: str, shape: tuple[int, ...], dtype: str) -> bool:
    """Whether ``kind`` applies to a parameter slot of this shape and dtype."""
    if kind == "tensor-hooks":
        return True
    if dtype not in ("float32", "float64") or len(shape) == 0 or 0 in shape:
        return False
    return len(shape) >= 2 if kind in NEEDS_MATRIX else True
