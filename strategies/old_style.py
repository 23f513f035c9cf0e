"""Old-style (forward-pre-hook) reparametrizations to put on a drawn tree's matrix and take off
again, for the ``OLD-STYLE-`` properties: every pruning method of ``torch.nn.utils.prune`` and
the old ``torch.nn.utils.weight_norm`` and ``torch.nn.utils.spectral_norm``.

An :class:`OldStyle` is pure data: ``method`` (one of :data:`PRUNINGS` or :data:`NORMS`) and
its arguments, and ``then``, a second pruning of the same tensor (a ``PruningContainer``) or
None. Rules:

* ``l1_unstructured``, ``random_unstructured`` and ``global_unstructured`` (``L1Unstructured``
  over the one tensor) prune a fraction ``amount`` of the entries; ``ln_structured`` (norm
  ``n``: 1, 2 or inf) and ``random_structured`` a fraction of the slices along ``dim``;
  ``identity`` keeps every entry; ``custom_from_mask`` keeps the entries whose flat index is
  not a multiple of ``every``.
* ``weight_norm`` splits the tensor into ``<name>_g`` and ``<name>_v`` along ``dim`` (0, or
  ``None``: the whole tensor); it takes no second pruning.
* ``spectral_norm`` divides the tensor by its largest singular value, estimated by
  ``power_iterations`` (1, 2 or 3; torch refuses 0) power iterations per training forward from
  random vectors ``<name>_u`` and ``<name>_v``, with the tensor as a matrix along ``dim`` (None:
  torch's default, 0 but 1 for a transposed convolution); it takes no second pruning.
* The random methods and ``spectral_norm``'s vectors read torch's global RNG:
  :meth:`OldStyle.apply` runs under a forked RNG seeded with ``seed``, so it never reads or
  advances the caller's RNG, and the repro sets the same seed.
* A vector (``ndim`` 1) gets no structured pruning: torch refuses it.
* Shrinks towards ``l1_unstructured`` with amount 0.5 and no second pruning.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import prune

PRUNINGS = ("l1_unstructured", "random_unstructured", "global_unstructured", "ln_structured",
            "random_structured", "identity", "custom_from_mask")
NORMS = ("weight_norm", "spectral_norm")
METHODS = (*PRUNINGS, *NORMS)
STRUCTURED = ("ln_structured", "random_structured")
AMOUNTS = (0.5, 0.0, 0.25, 1.0)
LN_NORMS = (2, 1, math.inf)
POWER_ITERATIONS = (1, 2, 3)


@dataclass(frozen=True)
class Pruning:
    """One pruning method with its arguments (unused ones keep their defaults)."""

    method: str
    amount: float = 0.5
    n: float = 2
    dim: int = 0
    every: int = 2

    def apply(self, owner: nn.Module, name: str) -> None:
        """Prune ``owner.name`` (under the caller's RNG: see :meth:`OldStyle.apply`)."""
        tensor = getattr(owner, name)
        calls = {
            "l1_unstructured": lambda: prune.l1_unstructured(owner, name, amount=self.amount),
            "random_unstructured": lambda: prune.random_unstructured(owner, name, amount=self.amount),
            "global_unstructured": lambda: prune.global_unstructured(
                [(owner, name)], pruning_method=prune.L1Unstructured, amount=self.amount),
            "ln_structured": lambda: prune.ln_structured(owner, name, amount=self.amount, n=self.n,
                                                         dim=self.dim),
            "random_structured": lambda: prune.random_structured(owner, name, amount=self.amount,
                                                                 dim=self.dim),
            "identity": lambda: prune.identity(owner, name),
            "custom_from_mask": lambda: prune.custom_from_mask(owner, name, mask=kept_mask(
                tensor, self.every)),
        }
        calls[self.method]()

    def source(self, owner: str, name: str) -> str:
        """The call as repro source, on the module expression ``owner``."""
        p = "torch.nn.utils.prune"
        n = "float('inf')" if math.isinf(self.n) else repr(self.n)
        return {
            "l1_unstructured": f"{p}.l1_unstructured({owner}, {name!r}, amount={self.amount!r})",
            "random_unstructured": f"{p}.random_unstructured({owner}, {name!r}, amount={self.amount!r})",
            "global_unstructured": f"{p}.global_unstructured([({owner}, {name!r})], "
                                   f"pruning_method={p}.L1Unstructured, amount={self.amount!r})",
            "ln_structured": f"{p}.ln_structured({owner}, {name!r}, amount={self.amount!r}, n={n}, "
                             f"dim={self.dim!r})",
            "random_structured": f"{p}.random_structured({owner}, {name!r}, amount={self.amount!r}, "
                                 f"dim={self.dim!r})",
            "identity": f"{p}.identity({owner}, {name!r})",
            "custom_from_mask": f"{p}.custom_from_mask({owner}, {name!r}, mask=(torch.arange("
                                f"getattr({owner}, {name!r}).numel()) % {self.every} != 0)"
                                f".reshape(getattr({owner}, {name!r}).shape))",
        }[self.method]


def kept_mask(tensor: torch.Tensor, every: int) -> torch.Tensor:
    """A boolean mask of ``tensor``'s shape that drops the entries whose flat index is a multiple
    of ``every``."""
    return (torch.arange(tensor.numel()) % every != 0).reshape(tensor.shape)


@dataclass(frozen=True)
class OldStyle:
    """An old-style reparametrization of one tensor: a pruning (``first``, then ``then`` or
    None), or, where ``first`` is None, the norm ``norm`` along ``norm_dim`` (spectral_norm with
    ``power_iterations``); ``seed`` seeds the random prunings and spectral_norm's vectors."""

    first: Pruning | None  # None: the norm ``norm``
    then: Pruning | None = None
    norm_dim: int | None = 0
    seed: int = 0
    norm: str = "weight_norm"
    power_iterations: int = 1

    @property
    def method(self) -> str:
        return self.norm if self.first is None else self.first.method

    @property
    def features(self) -> frozenset[str]:
        """Reach tags: ``method: <m>`` for each method applied, ``pruned twice`` for a container."""
        methods = [self.method] + ([self.then.method] if self.then else [])
        return frozenset({f"method: {m}" for m in methods} | ({"pruned twice"} if self.then else set()))

    def apply(self, owner: nn.Module, name: str) -> None:
        """Reparametrize ``owner.name`` under a forked RNG seeded with ``seed``."""
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the old weight_norm is deprecated
            torch.manual_seed(self.seed)
            if self.first is None:
                self._norm_call(owner, name)
                return
            self.first.apply(owner, name)
            if self.then is not None:
                self.then.apply(owner, name)

    def _norm_call(self, owner: nn.Module, name: str) -> None:
        if self.norm == "weight_norm":
            torch.nn.utils.weight_norm(owner, name, dim=self.norm_dim)
        else:
            torch.nn.utils.spectral_norm(owner, name, n_power_iterations=self.power_iterations,
                                         dim=self.norm_dim)

    def source(self, owner: str, name: str) -> list[str]:
        """Repro lines doing what :meth:`apply` does (the seed set, not forked)."""
        lines = [f"torch.manual_seed({self.seed})"]
        if self.first is None and self.norm == "weight_norm":
            return [f"torch.nn.utils.weight_norm({owner}, {name!r}, dim={self.norm_dim!r})"]
        if self.first is None:
            return [*lines, f"torch.nn.utils.spectral_norm({owner}, {name!r}, n_power_iterations="
                            f"{self.power_iterations}, dim={self.norm_dim!r})"]
        lines.append(self.first.source(owner, name))
        return lines + ([self.then.source(owner, name)] if self.then else [])

    @property
    def removal(self) -> str:
        """The method that makes it permanent: ``prune_remove`` (``torch.nn.utils.prune.remove``),
        ``remove_weight_norm`` or ``remove_spectral_norm``."""
        return "prune_remove" if self.first is not None else f"remove_{self.norm}"


@st.composite
def prunings(draw: st.DrawFn, ndim: int, method: str | None = None) -> Pruning:
    """A pruning (``method``, or one of :data:`PRUNINGS` drawn alike) with its arguments, for a
    tensor of ``ndim`` (>= 1) dimensions; the structured ones, which torch refuses on a vector,
    only for ``ndim >= 2``."""
    method = method or draw(st.sampled_from(
        [m for m in PRUNINGS if ndim >= 2 or m not in STRUCTURED]))
    if method == "custom_from_mask":
        return Pruning(method, every=draw(st.integers(1, 3)))
    amount = 0.0 if method == "identity" else draw(st.sampled_from(AMOUNTS))
    if method not in STRUCTURED:
        return Pruning(method, amount=amount)
    dim = draw(st.sampled_from(sorted({0, ndim - 1, -1})))
    n = draw(st.sampled_from(LN_NORMS)) if method == "ln_structured" else 2
    return Pruning(method, amount=amount, n=n, dim=dim)


@st.composite
def old_styles(draw: st.DrawFn, ndim: int = 2) -> OldStyle:
    """An old-style reparametrization for a tensor of ``ndim`` (>= 1) dimensions: one of the
    :data:`METHODS`, each drawn alike; a pruning is followed by a second one in a third of
    cases (see the module docstring)."""
    seed = draw(st.integers(0, 2**16 - 1))
    method = draw(st.sampled_from([m for m in METHODS if ndim >= 2 or m not in STRUCTURED]))
    if method == "weight_norm":
        return OldStyle(None, norm_dim=draw(st.sampled_from((0, None))), seed=seed)
    if method == "spectral_norm":
        dims = (None, 0, 1) if ndim >= 2 else (None, 0)
        return OldStyle(None, norm_dim=draw(st.sampled_from(dims)), seed=seed, norm=method,
                        power_iterations=draw(st.sampled_from(POWER_ITERATIONS)))
    first = draw(prunings(ndim, method))
    then = draw(prunings(ndim)) if draw(st.integers(0, 2)) == 2 else None
    return OldStyle(first, then, seed=seed)
