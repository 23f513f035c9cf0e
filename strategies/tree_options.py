"""What the tree strategies may draw: the allowed values of their options, the options checked
and gathered into one :class:`TreeOptions`, and the biased coin every tree draw shrinks with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from hypothesis import strategies as st

SHAPES: tuple[tuple[int, ...], ...] = ((4,), (), (3,), (2, 3), (1,), (2, 3, 2, 2))
PARAM_DTYPES = ("float32", "float16", "float64", "bfloat16", "complex64")
BUFFER_DTYPES = (*PARAM_DTYPES, "int64", "bool")
BEHAVIOURS = ("inplace", "rebind", "raise", "report", "own-apply")
# ``'fake'`` is left out by default: whether ``swap_tensors`` refuses a fake parameter depends on
# process-wide caches of torch's fake-tensor converter (a weak reference to it exists or not), so
# examples built there do not replay exactly. ``'dtensor'`` is left out too: it starts a
# torch.distributed process group in the test process (strategies.dtensor_world), and its trees'
# forward needs DTensor inputs.
DEFAULT_WORLDS = ("meta", "two-tensor")
# Decorations a world cannot take: ``orthogonal`` checks its tensor's values (``allclose``, which
# a DTensor refuses beside a plain tensor).
WORLD_REFUSED_DECORATIONS = {"meta": ("orthogonal",), "fake": ("orthogonal",),
                             "dtensor": ("orthogonal",)}
NEEDS = ("grad", "none-slot", "container-root", "leaf-grads", "alias", "updating-leaf",
         "parametrizable", "tensor", "trainable", "parameter", "tie", "swappable", "conv2d",
         "conv3d", "own-apply")
HOST_CHANCE = 25  # module_trees' default percent of leaves drawn from a target's host modules
REAL_LEAVES = ("Linear", "Conv1d", "Conv2d", "BatchNorm1d", "LayerNorm", "Embedding", "SparseEmbedding")

Draw = Callable[[st.SearchStrategy[Any]], Any]


@dataclass(frozen=True)
class TreeOptions:
    """The tree strategies' options as the draws read them (made by :func:`tree_options`)."""

    max_depth: int
    max_leaves: int
    sharing: bool
    ties: bool
    real_kinds: tuple[str, ...]
    real_dtypes: tuple[str, ...]
    grads: bool
    param_dtypes: tuple[str, ...]
    buffer_dtypes: tuple[str, ...]
    behaviours: tuple[str, ...]
    behaviour_chance: int
    catalogue: tuple[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], ...]  # family, (entry, variants)
    catalogue_chance: int
    needs: tuple[str, ...] = ()
    # the running target's host modules (a strategy of HostModule; strategies.host_material) and
    # the percent of leaves drawn from them; None: no host leaf, and no choice drawn for one
    host_modules: Any = None
    host_chance: int = 0


def tree_options(max_depth, max_leaves, sharing, ties, real_layers, lazy, grads, dtypes,
                 behaviours, behaviour_chance, catalogue, catalogue_chance, needs=(),
                 host_chance=0) -> TreeOptions:
    """The options of :func:`~strategies.tree_draws.tree_specs`, checked (``ValueError`` for
    one out of range) and narrowed to what can be drawn."""
    if max_depth < 0 or max_leaves < 1:
        raise ValueError(f"need max_depth >= 0 and max_leaves >= 1, got {max_depth}, {max_leaves}")
    unknown = sorted(set(behaviours) - set(BEHAVIOURS))
    if unknown or not 0 <= behaviour_chance <= 100:
        raise ValueError(f"behaviours must come from {BEHAVIOURS} (got unknown {unknown}) and "
                         f"behaviour_chance must be 0..100 (got {behaviour_chance})")
    if not 0 <= catalogue_chance <= 100:
        raise ValueError(f"catalogue_chance must be 0..100 (got {catalogue_chance})")
    if not 0 <= host_chance <= 100:
        raise ValueError(f"host_chance must be 0..100 (got {host_chance})")
    names = BUFFER_DTYPES if dtypes is None else tuple(_name(d) for d in dtypes)
    names = tuple(sorted(names, key=BUFFER_DTYPES.index))  # float32 first where allowed
    param = tuple(d for d in names if d in PARAM_DTYPES)
    real_dtypes = tuple(d for d in ("float32", "float64") if d in names)
    kinds = REAL_LEAVES if real_layers and real_dtypes else ()
    if lazy and real_layers and "float32" in names:
        kinds = (*kinds, "LazyLinear")
    allowed = tuple(b for b in BEHAVIOURS if b in behaviours)
    unknown = sorted(set(needs) - set(NEEDS))
    if unknown:
        raise ValueError(f"needs must come from {NEEDS}; unknown: {unknown}")
    families = (_catalogue_families(lazy, "swappable" in needs)
                if catalogue and catalogue_chance and "float32" in names else ())
    from swapspec.strategies.host_material import host_material

    hosts = host_material().modules if host_chance else None
    return TreeOptions(max_depth, max_leaves, sharing, ties, kinds, real_dtypes, grads, param, names,
                    allowed, behaviour_chance, families, catalogue_chance, tuple(needs),
                    hosts, host_chance if hosts is not None else 0)


@cache
def _catalogue_families(lazy: bool, swappable: bool = False) -> tuple[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], ...]:
    """The catalogue grouped by family in shrinking order; ``lazy=False`` leaves out lazy entries,
    ``swappable`` the entries whose module keeps weak references to its parameters."""
    from swapspec.strategies import torch_modules

    grouped: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for e in torch_modules.catalogue().values():
        if (lazy or not e.lazy) and not (swappable and torch_modules.keeps_weak_references(e.name)):
            grouped.setdefault(e.family, []).append((e.name, e.variants))
    return tuple((f, tuple(entries)) for f, entries in grouped.items())


def _name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in BUFFER_DTYPES:
        raise ValueError(f"dtype {dtype} not supported; choose from {BUFFER_DTYPES}")
    return name


def coin(draw: Draw, percent: int) -> bool:
    """A biased coin that is True about ``percent``% of the time and shrinks to False."""
    return draw(st.integers(0, 99)) >= 100 - percent
