"""Hypothesis strategies that draw :class:`~strategies.trees.TreeSpec` s and module trees.

Shrinking: every choice is ordered so that the simplest option comes first (a leaf before a container,
``generic`` before real layers before catalogue modules (the first family, entry and variant first), float32
before other dtypes, shape ``(4,)`` first, no ties, no sharing, train mode, every flag off). The minimal tree is ``TreeSpec(root=LeafSpec(tensors=(TensorSpec(name='p0'),)))``:
one generic leaf with one float32 ``(4,)`` parameter, seed 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import nn

from swapspec.strategies.decorations import KINDS as DECORATION_KINDS
from swapspec.strategies.decorations import DecorationSpec, decoratable
from swapspec.strategies.trees import (
    BLOCK_NAMES,
    CONTAINER_KINDS,
    TRAININGS,
    WORLDS,
    WRAPPERS,
    ContainerSpec,
    LeafSpec,
    ShareSpec,
    Slot,
    TensorSpec,
    TieSpec,
    TreeSpec,
    build_tree,
    child_name,
    join,
    tree_info,
    tree_slots,
    usable_wrappers,
    walk,
)

SHAPES: tuple[tuple[int, ...], ...] = ((4,), (), (3,), (2, 3), (1,), (2, 3, 2, 2))
PARAM_DTYPES = ("float32", "float16", "float64", "bfloat16", "complex64")
BUFFER_DTYPES = (*PARAM_DTYPES, "int64", "bool")
BEHAVIOURS = ("inplace", "rebind", "raise", "report")
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
         "parametrizable", "tensor", "trainable", "parameter", "tie", "swappable")
REAL_LEAVES = ("Linear", "Conv1d", "Conv2d", "BatchNorm1d", "LayerNorm", "Embedding", "SparseEmbedding")

Draw = Callable[[st.SearchStrategy[Any]], Any]


@dataclass(frozen=True)
class _Options:
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


def _options(max_depth, max_leaves, sharing, ties, real_layers, lazy, grads, dtypes,
             behaviours, behaviour_chance, catalogue, catalogue_chance, needs=()) -> _Options:
    if max_depth < 0 or max_leaves < 1:
        raise ValueError(f"need max_depth >= 0 and max_leaves >= 1, got {max_depth}, {max_leaves}")
    unknown = sorted(set(behaviours) - set(BEHAVIOURS))
    if unknown or not 0 <= behaviour_chance <= 100:
        raise ValueError(f"behaviours must come from {BEHAVIOURS} (got unknown {unknown}) and "
                         f"behaviour_chance must be 0..100 (got {behaviour_chance})")
    if not 0 <= catalogue_chance <= 100:
        raise ValueError(f"catalogue_chance must be 0..100 (got {catalogue_chance})")
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
    return _Options(max_depth, max_leaves, sharing, ties, kinds, real_dtypes, grads, param, names,
                    allowed, behaviour_chance, families, catalogue_chance, tuple(needs))


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


def _chance(draw: Draw, percent: int) -> bool:
    """A biased coin that is True about ``percent``% of the time and shrinks to False."""
    return draw(st.integers(0, 99)) >= 100 - percent


# ---------------------------------------------------------------- nodes


def _tensor(draw: Draw, o: _Options, name: str, buffer: bool) -> TensorSpec:
    shape = draw(st.sampled_from(SHAPES))
    dtype = draw(st.sampled_from(o.buffer_dtypes if buffer else o.param_dtypes))
    if _chance(draw, 10):
        return TensorSpec(name, shape, dtype, buffer=buffer, none=True)
    if buffer:
        return TensorSpec(name, shape, dtype, buffer=True, persistent=not _chance(draw, 25))
    return TensorSpec(
        name, shape, dtype,
        frozen=_chance(draw, 15), grad=o.grads and _chance(draw, 20), tagged=_chance(draw, 12),
    )


def _generic(draw: Draw, o: _Options) -> LeafSpec:
    n_params = draw(st.integers(0, 4)) if o.param_dtypes else 0
    n_buffers = draw(st.integers(0, 4))
    tensors = [_tensor(draw, o, f"p{i}", False) for i in range(n_params)]
    tensors += [_tensor(draw, o, f"b{i}", True) for i in range(n_buffers)]
    behaviours = tuple(b for b in o.behaviours if _chance(draw, o.behaviour_chance))
    return LeafSpec(tensors=tuple(tensors), behaviours=behaviours)


def _real(draw: Draw, o: _Options) -> LeafSpec:
    kind = draw(st.sampled_from(o.real_kinds))
    if kind == "LazyLinear":
        return LeafSpec(kind, initialized=_chance(draw, 40))
    return LeafSpec(
        kind,
        dtype=draw(st.sampled_from(o.real_dtypes)),
        bias=not _chance(draw, 20),
        frozen=_chance(draw, 15),
        grad=o.grads and _chance(draw, 20),
        tagged=_chance(draw, 12),
    )


def _catalogue(draw: Draw, o: _Options) -> LeafSpec:
    """A catalogue leaf: a family, then an entry of it, then one of its variants (each shrinks to the first),
    then ``frozen`` and ``grad`` (as for real layers).

    The entry and variant are drawn from ranges as wide as the largest family and entry, then wrapped, so every
    family takes the same choices and the family can shrink without the later choices shifting.
    """
    _, entries = draw(st.sampled_from(o.catalogue))
    widest = max(len(e) for _, e in o.catalogue)
    entry, variants = entries[draw(st.integers(0, widest - 1)) % len(entries)]
    longest = max(len(v) for _, e in o.catalogue for _, v in e)
    variant = variants[draw(st.integers(0, longest - 1)) % len(variants)]
    return LeafSpec("catalogue", entry=entry, variant=variant, frozen=_chance(draw, 15),
                    grad=o.grads and _chance(draw, 20))


def _node(draw: Draw, o: _Options, depth: int, budget: list[int]) -> LeafSpec | ContainerSpec:
    """A leaf, or (while ``depth < max_depth``, with chance 60% - 12% per level) a container of 1-3 children.

    ``budget`` counts the leaves still allowed; a container stops adding children when it reaches 0.
    The first leaf choice (15%) is the simplest leaf, a generic one with one float32 (4,) parameter, reached
    with a single choice so that Hypothesis (shortlex) shrinks to it before any other leaf. Then a catalogue
    leaf with ``catalogue_chance`` percent, else a real layer (55%) or a generic leaf.
    """
    if depth < o.max_depth and ((depth == 0 and "container-root" in o.needs)
                                or _chance(draw, 60 - 12 * depth)):
        kind = draw(st.sampled_from(CONTAINER_KINDS))
        children = []
        for _ in range(draw(st.integers(1, 3))):
            if budget[0] == 0:
                break
            children.append(_node(draw, o, depth + 1, budget))
        return ContainerSpec(kind, tuple(children))
    budget[0] -= 1
    if o.param_dtypes and not _chance(draw, 85):  # the minimal leaf: no behaviour drawn
        always = o.behaviours if o.behaviour_chance == 100 else ()
        return LeafSpec(tensors=(TensorSpec("p0", dtype=o.param_dtypes[0]),), behaviours=always)
    if o.catalogue and _chance(draw, o.catalogue_chance):
        return _catalogue(draw, o)
    if o.real_kinds and _chance(draw, 55):
        return _real(draw, o)
    return _generic(draw, o)


# ---------------------------------------------------------------- ties and shares


def _compatible(src: Slot, dst: Slot) -> bool:
    """Same kind (parameter/buffer); a rigid slot (real layer, steps/count) also needs the same shape and dtype."""
    return dst.buffer == src.buffer and (dst.flexible or (dst.shape, dst.dtype) == (src.shape, src.dtype))


def _ties(draw: Draw, root: LeafSpec | ContainerSpec, chance: int = 55,
          reserved: frozenset[tuple[str, str]] = frozenset()) -> tuple[TieSpec, ...]:
    """Up to two tie groups, each a source slot plus 1-3 compatible slots anywhere in the tree
    (outside ``reserved``)."""
    slots = [s for s in tree_slots(root) if (s.path, s.name) not in reserved]
    if len(slots) < 2 or not _chance(draw, chance):
        return ()
    used: set[tuple[str, str]] = set()
    groups = []
    for _ in range(draw(st.integers(1, 2))):
        free = [s for s in slots if (s.path, s.name) not in used]
        if len(free) < 2:
            break
        src = draw(st.sampled_from(free))
        cands = [s for s in free if s != src and _compatible(src, s)]
        if not cands:
            continue
        picks = draw(st.lists(st.sampled_from(range(len(cands))), min_size=1, max_size=min(3, len(cands)), unique=True))
        group = [(src.path, src.name)] + [(cands[i].path, cands[i].name) for i in picks]
        used.update(group)
        groups.append(TieSpec(tuple(group)))
    return tuple(groups)


def _reaches(edges: dict[str, list[str]], start: str, goal: str) -> bool:
    stack, seen = [start], set()
    while stack:
        path = stack.pop()
        if path == goal:
            return True
        if path not in seen:
            seen.add(path)
            stack.extend(edges.get(path, ()))
    return False


def _shares(draw: Draw, root: LeafSpec | ContainerSpec) -> tuple[ShareSpec, ...]:
    """Up to three shares: a non-root module registered again under a container it does not reach."""
    nodes = list(walk(root))
    sources = [p for p, _, _ in nodes if p]
    if not sources or not _chance(draw, 50):
        return ()
    kinds = {p: n.kind for p, _, n in nodes if isinstance(n, ContainerSpec)}
    edges = {p: [join(p, child_name(n.kind, i)) for i in range(len(n.children))] for p, _, n in nodes if isinstance(n, ContainerSpec)}
    extra: dict[str, int] = {}
    out = []
    for _ in range(draw(st.integers(1, 3))):
        src = draw(st.sampled_from(sources))
        parents = [p for p in edges if not _reaches(edges, src, p)]
        parent = draw(st.sampled_from(parents))  # the root is always allowed
        k = extra.get(parent, 0)
        name = str(len(edges[parent])) if kinds[parent] in ("Sequential", "ModuleList") else f"shared{k}"
        extra[parent] = k + 1
        edges[parent].append(src)
        out.append(ShareSpec(src, parent, name))
    return tuple(out)


# ---------------------------------------------------------------- decorations


def _decorations(draw: Draw, root: LeafSpec | ContainerSpec, ties: tuple[TieSpec, ...],
                 chance: int, kinds: tuple[str, ...],
                 feasible_only: bool = False) -> tuple[DecorationSpec, ...]:
    """With ``chance`` percent, 1-2 decorations, each on a parameter (or module) not yet decorated
    (``feasible_only``: of a kind drawn among those that have a slot to decorate, so none is
    drawn in vain).

    Tied slots are left alone (a parametrization moves the tensor it decorates), and so are
    ``Parameter`` subclasses, which ``parametrize`` refuses, and sparse embeddings' weights
    (reparametrized, their sparse grads fail in backward), and the tensors of catalogue leaves
    (torch's own modules: only their adapter gets module hooks). Shrinks towards none, and towards the
    hooks (first in the kind list) before any reparametrization.
    """
    if not _chance(draw, chance):
        return ()
    tied = {slot for tie in ties for slot in tie.slots}
    params = [s for s in tree_slots(root) if not s.buffer and (s.path, s.name) not in tied]
    tagged, frozen = _slots_with(root, "tagged"), _slots_with(root, "frozen")
    sparse = {(path, "weight") for path, _, n in walk(root)
              if isinstance(n, LeafSpec) and n.kind == "SparseEmbedding"}
    inners = [join(path, "inner") for path, _, n in walk(root)
              if isinstance(n, LeafSpec) and n.kind == "catalogue"]
    params = [s for s in params
              if not any(s.path == i or s.path.startswith(i + ".") for i in inners)]
    modules = [path for path, _, _ in walk(root)]
    used: set[tuple[str, str]] = set()
    out = []
    def candidates(kind: str) -> list[Slot]:
        return [s for s in params if (s.path, s.name) not in used and decoratable(kind, s.shape, s.dtype)
                and (s.path, s.name) not in (frozen if kind == "tensor-hooks" else tagged | sparse)]

    for _ in range(draw(st.integers(1, 2))):
        feasible = [k for k in kinds if k == "module-hooks" or candidates(k)] if feasible_only else kinds
        if not feasible:
            break
        kind = draw(st.sampled_from(feasible))
        if kind == "module-hooks":
            path = draw(st.sampled_from(modules))
            if (path, "") not in used:
                used.add((path, ""))
                out.append(DecorationSpec(kind, path))
            continue
        slots = candidates(kind)
        if slots:
            slot = draw(st.sampled_from(slots))
            used.add((slot.path, slot.name))
            out.append(DecorationSpec(kind, slot.path, slot.name))
    return tuple(out)


def _trained(draw: Draw, root: LeafSpec | ContainerSpec, chance: int,
             leaf_grads: bool = False) -> str:
    """``''`` or one of ``TRAININGS`` (``leaf_grads``: not ``create_graph``); shrinks to ``''``."""
    lazy = any(isinstance(n, LeafSpec) and n.kind == "LazyLinear" and not n.initialized
               for _, _, n in walk(root))
    if lazy or not _chance(draw, chance):
        return ""
    return draw(st.sampled_from([t for t in TRAININGS
                                 if not (leaf_grads and t == "backward-create-graph")]))


def _slots_with(root: LeafSpec | ContainerSpec, flag: str) -> set[tuple[str, str]]:
    """Parameter slots whose spec sets ``flag`` (``'tagged'``: a ``TaggedParameter``; ``'frozen'``:
    ``requires_grad=False``, which refuses tensor hooks)."""
    out = set()
    for path, _, node in walk(root):
        if isinstance(node, LeafSpec) and node.kind == "generic":
            out |= {(path, t.name) for t in node.tensors if getattr(t, flag)}
        elif isinstance(node, LeafSpec) and getattr(node, flag):
            out.add((path, "weight"))
    return out


# ---------------------------------------------------------------- needs


def _replace_first(node: LeafSpec | ContainerSpec, change: Callable[[LeafSpec, str], LeafSpec | None],
                   path: str = "") -> tuple[LeafSpec | ContainerSpec, bool]:
    """``node`` with its first leaf (in build order) that ``change(leaf, path)`` maps to a new
    leaf replaced; ``change`` returns None for a leaf it cannot change. Also says whether one was."""
    if isinstance(node, LeafSpec):
        new = change(node, path)
        return (node, False) if new is None else (new, True)
    children = list(node.children)
    for i, child in enumerate(children):
        children[i], done = _replace_first(child, change, join(path, child_name(node.kind, i)))
        if done:
            return ContainerSpec(node.kind, tuple(children)), True
    return node, False


def _has(root: LeafSpec | ContainerSpec, test: Callable[[LeafSpec], bool]) -> bool:
    return any(isinstance(n, LeafSpec) and test(n) for _, _, n in walk(root))


def _catalogue_has_parameters(leaf: LeafSpec) -> bool:
    """Whether a catalogue leaf's module has an initialized parameter (one that can hold a grad)."""
    from swapspec.strategies import torch_modules

    return any(not s.buffer for s in torch_modules.slots(leaf.entry, leaf.variant))


def _weightless(leaf: LeafSpec) -> bool:
    """A real layer built without an initialized ``weight`` (lazy, or ``affine=False``)."""
    return leaf.kind == "LazyLinear" or (leaf.kind == "BatchNorm1d" and not leaf.bias)


def _grad_survives(root: LeafSpec | ContainerSpec, taken: set[tuple[str, str]]) -> bool:
    """Whether a parameter outside ``taken`` (tied or decorated slots) is built with a grad."""
    for path, _, leaf in walk(root):
        if not isinstance(leaf, LeafSpec):
            continue
        if leaf.kind == "generic" and any(t.grad and not t.none and (path, t.name) not in taken
                                          for t in leaf.tensors):
            return True
        if leaf.kind == "catalogue":
            if leaf.grad and _catalogue_has_parameters(leaf):
                return True
        elif (leaf.kind != "generic" and leaf.grad and (path, "weight") not in taken
              and not _weightless(leaf)):
            return True
    return False


def _grad_giver(taken: set[tuple[str, str]]) -> Callable[[LeafSpec, str], LeafSpec | None]:
    """A ``change`` that puts a grad on a leaf's first parameter outside ``taken`` (tied or
    decorated slots, whose own object does not survive the build)."""

    def give(leaf: LeafSpec, path: str) -> LeafSpec | None:
        if leaf.kind == "generic":
            for i, t in enumerate(leaf.tensors):
                if not t.buffer and not t.none and (path, t.name) not in taken:
                    tensors = (*leaf.tensors[:i], dataclasses.replace(t, grad=True),
                               *leaf.tensors[i + 1:])
                    return dataclasses.replace(leaf, tensors=tensors)
            return None
        if leaf.kind == "catalogue":
            return dataclasses.replace(leaf, grad=True) if _catalogue_has_parameters(leaf) else None
        if _weightless(leaf) or (path, "weight") in taken:
            return None
        return dataclasses.replace(leaf, grad=True)

    return give


def _with_grad(root: LeafSpec | ContainerSpec, taken: set[tuple[str, str]]) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if a parameter carries a grad, else with one given a grad."""
    return root if _grad_survives(root, taken) else _replace_first(root, _grad_giver(taken))[0]


BIASED = ("Linear", "Conv1d", "Conv2d", "LayerNorm")


_GRAD_DTYPES = ("float32", "float16", "float64", "bfloat16", "complex64")


def _trainable_here(leaf: LeafSpec, path: str, taken: set[tuple[str, str]]) -> bool:
    """Whether ``leaf`` is built with a parameter that requires grad and keeps its own object
    (outside ``taken``, the tie targets). Host leaves: unknown, so no."""
    if leaf.kind == "generic":
        return any(not (t.buffer or t.none or t.frozen) and t.dtype in _GRAD_DTYPES
                   and (path, t.name) not in taken for t in leaf.tensors)
    if leaf.kind == "catalogue":
        return not leaf.frozen and _catalogue_has_parameters(leaf)
    if leaf.kind == "host" or _weightless(leaf):
        return False
    weight = not leaf.frozen and (path, "weight") not in taken
    return weight or (leaf.bias and leaf.kind in (*BIASED, "BatchNorm1d")
                      and (path, "bias") not in taken)


def _unfreezer(taken: set[tuple[str, str]]) -> Callable[[LeafSpec, str], LeafSpec | None]:
    """A ``change`` that makes a leaf's first frozen parameter outside ``taken`` (floating or
    complex) trainable."""

    def unfreeze(leaf: LeafSpec, path: str) -> LeafSpec | None:
        if leaf.kind == "generic":
            for i, t in enumerate(leaf.tensors):
                if (t.frozen and not (t.buffer or t.none) and t.dtype in _GRAD_DTYPES
                        and (path, t.name) not in taken):
                    tensors = (*leaf.tensors[:i], dataclasses.replace(t, frozen=False),
                               *leaf.tensors[i + 1:])
                    return dataclasses.replace(leaf, tensors=tensors)
            return None
        if (leaf.kind == "host" or _weightless(leaf) or not leaf.frozen
                or (path, "weight") in taken):
            return None
        if leaf.kind == "catalogue" and not _catalogue_has_parameters(leaf):
            return None
        return dataclasses.replace(leaf, frozen=False)

    return unfreeze


def _with_trainable(root: LeafSpec | ContainerSpec,
                    taken: set[tuple[str, str]] = frozenset()) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if a parameter outside ``taken`` (tie targets) requires grad, else
    with its first frozen one unfrozen, else (with nothing taken: before ties are drawn) with
    a generic leaf of one parameter added as the root's last child."""
    if any(isinstance(n, LeafSpec) and _trainable_here(n, p, taken) for p, _, n in walk(root)):
        return root
    root, done = _replace_first(root, _unfreezer(taken))
    if done or taken:
        return root
    return _append_leaf(root, LeafSpec(tensors=(TensorSpec("p0"),)))


def _leaf_has_none(leaf: LeafSpec) -> bool:
    if leaf.kind == "generic":
        return any(t.none for t in leaf.tensors)
    return not leaf.bias and leaf.kind in (*BIASED, "BatchNorm1d")


def _give_none(leaf: LeafSpec, path: str) -> LeafSpec | None:
    """The leaf with one more None slot: a real layer's bias, or a generic leaf's extra buffer."""
    if leaf.kind in BIASED and leaf.bias:
        return dataclasses.replace(leaf, bias=False)
    if leaf.kind != "generic":
        return None
    names = {t.name for t in leaf.tensors}
    name = next(f"b{i}" for i in range(len(names) + 1) if f"b{i}" not in names)
    return dataclasses.replace(leaf, tensors=(*leaf.tensors, TensorSpec(name, buffer=True, none=True)))


NONE_LEAF = LeafSpec(tensors=(TensorSpec("b0", buffer=True, none=True),))


def _with_none_slot(root: LeafSpec | ContainerSpec) -> LeafSpec | ContainerSpec:
    """``root`` (drawn, before ties and shares) unchanged if a slot is registered as None, else
    with one more: on its first leaf that can take one, else in a generic leaf added as the
    root's last child (a leaf root first goes into a ``Sequential``)."""
    if _has(root, _leaf_has_none):
        return root
    root, done = _replace_first(root, _give_none)
    return root if done else _append_leaf(root, NONE_LEAF)


def _has_alias(root: LeafSpec | ContainerSpec, ties: tuple[TieSpec, ...],
               shares: tuple[ShareSpec, ...]) -> bool:
    """Whether two names will reach one tensor: a tie, or a share of a module holding a slot."""
    holders = {s.path for s in tree_slots(root)}
    return bool(ties) or any(h == s.source or h.startswith(s.source + ".")
                             for s in shares for h in holders)


UPDATING = ("inplace", "rebind")


def _with_updating_leaf(root: LeafSpec | ContainerSpec, allowed: tuple[str, ...]) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if a generic leaf updates or rebinds a buffer in forward, else with the
    first generic leaf given the first of those behaviours ``allowed`` (a leaf that has none
    added as the root's last child, where there is no generic leaf)."""
    kinds = [b for b in UPDATING if b in allowed]
    if not kinds or _has(root, lambda n: n.kind == "generic" and bool(set(n.behaviours) & set(UPDATING))):
        return root

    def give(leaf: LeafSpec, path: str) -> LeafSpec | None:
        if leaf.kind != "generic":
            return None
        return dataclasses.replace(leaf, behaviours=tuple(b for b in allowed if b in (*leaf.behaviours, kinds[0])))

    root, done = _replace_first(root, give)
    if done:
        return root
    extra = LeafSpec(tensors=(TensorSpec("p0"),), behaviours=(kinds[0],))
    return _append_leaf(root, extra)


MATRIX = TensorSpec("p0", shape=(2, 3))


def _plain_matrices(root: LeafSpec | ContainerSpec) -> list[tuple[str, str]]:
    """``(path, name)`` of every plain float32/float64 matrix parameter (every parametrization
    applies to one), in build order."""
    out = []
    for path, _, leaf in walk(root):
        if isinstance(leaf, LeafSpec) and leaf.kind == "generic":
            out += [(path, t.name) for t in leaf.tensors
                    if not t.buffer and not t.none and not t.tagged and len(t.shape) >= 2
                    and t.dtype in ("float32", "float64")]
        elif (isinstance(leaf, LeafSpec) and leaf.kind in ("Linear", "Conv1d", "Conv2d", "Embedding")
              and not leaf.tagged):
            out.append((path, "weight"))
    return out


def _with_matrix_parameter(root: LeafSpec | ContainerSpec) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if a plain float32/float64 matrix parameter exists (every
    parametrization applies to one), else with one more on its first generic leaf (or on a leaf
    added as the root's last child)."""
    if _plain_matrices(root):
        return root

    def give(leaf: LeafSpec, path: str) -> LeafSpec | None:
        if leaf.kind != "generic":
            return None
        names = {t.name for t in leaf.tensors}
        name = next(f"p{i}" for i in range(len(names) + 1) if f"p{i}" not in names)
        return dataclasses.replace(leaf, tensors=(dataclasses.replace(MATRIX, name=name), *leaf.tensors))

    root, done = _replace_first(root, give)
    return root if done else _append_leaf(root, LeafSpec(tensors=(MATRIX,)))


def _tie_pair(slots: list[Slot]) -> tuple[Slot, Slot] | None:
    """The first two slots (in build order) that ``_ties`` could tie: a source and a compatible one."""
    return next(((src, dst) for src in slots for dst in slots
                 if dst != src and _compatible(src, dst)), None)


def _with_tie_pair(root: LeafSpec | ContainerSpec) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if two of its slots can be tied, else with a generic leaf added as the
    root's last child: one parameter (any parameter can be tied to it) or, in a tree without a
    parameter, two. Call it before ties are drawn."""
    slots = tree_slots(root)
    if _tie_pair(slots) is not None:
        return root
    extra = (TensorSpec("p0"),) if any(not s.buffer for s in slots) else (TensorSpec("p0"), TensorSpec("p1"))
    return _append_leaf(root, LeafSpec(tensors=extra))


def _first_tie(slots: list[Slot]) -> tuple[TieSpec, ...]:
    """One tie group of the first two slots that can be tied, for a tree whose drawn ties came out empty."""
    pair = _tie_pair(slots)
    return () if pair is None else (TieSpec(tuple((s.path, s.name) for s in pair)),)


def _append_leaf(root: LeafSpec | ContainerSpec, leaf: LeafSpec) -> LeafSpec | ContainerSpec:
    """``leaf`` as the root's last child; a leaf root, or a custom block whose children are all
    taken, first goes into a ``Sequential``. Call it before ties and shares are drawn."""
    if isinstance(root, LeafSpec) or (root.kind == "Block" and len(root.children) == len(BLOCK_NAMES)):
        return ContainerSpec("Sequential", (root, leaf))
    return ContainerSpec(root.kind, (*root.children, leaf))


def _with_share(root: LeafSpec | ContainerSpec) -> tuple[LeafSpec | ContainerSpec, tuple[ShareSpec, ...]]:
    """A tree without ties or shares, given one alias: its first module below the root that holds
    a tensor is registered again under the root (a leaf root first goes into a ``Sequential``)."""
    if isinstance(root, LeafSpec):
        root = ContainerSpec("Sequential", (root,))
    holders = {s.path for s in tree_slots(root)}
    source = next((p for p, _, _ in walk(root) if p and any(h == p or h.startswith(p + ".")
                                                          for h in holders)), None)
    if source is None:
        return root, ()
    name = str(len(root.children)) if root.kind in ("Sequential", "ModuleList") else "shared0"
    return root, (ShareSpec(source, "", name),)


# ---------------------------------------------------------------- public strategies


@st.composite
def tree_specs(
    draw: Draw,
    *,
    max_depth: int = 4,
    max_leaves: int = 6,
    sharing: bool = True,
    ties: bool = True,
    real_layers: bool = True,
    lazy: bool = True,
    grads: bool = True,
    dtypes: Sequence[torch.dtype] | None = None,
    behaviours: Sequence[str] = BEHAVIOURS,
    behaviour_chance: int = 12,
    decoration_chance: int = 30,
    decoration_kinds: Sequence[str] = DECORATION_KINDS,
    training_chance: int = 20,
    catalogue: bool = True,
    catalogue_chance: int = 7,
    wrappers: Sequence[str] = ("compiled",),
    wrapper_chance: int = 8,
    tie_chance: int = 55,
    worlds: Sequence[str] = DEFAULT_WORLDS,
    world_chance: int = 0,
    needs: Sequence[str] = (),
) -> TreeSpec:
    """Draw a pure-data :class:`TreeSpec`; options as for :func:`module_trees`."""
    o = _options(max_depth, max_leaves, sharing, ties, real_layers, lazy, grads, dtypes,
                 tuple(behaviours), behaviour_chance, catalogue, catalogue_chance, tuple(needs))
    root = _node(draw, o, 0, [o.max_leaves])
    if "none-slot" in o.needs:
        root = _with_none_slot(root)
    if "updating-leaf" in o.needs:
        root = _with_updating_leaf(root, o.behaviours)
    if "parametrizable" in o.needs:
        root = _with_matrix_parameter(root)
    if "trainable" in o.needs:
        root = _with_trainable(root)
    if "tensor" in o.needs and not tree_slots(root):
        root = _append_leaf(root, LeafSpec(tensors=(TensorSpec("p0"),)))
    if "grad" in o.needs and o.grads and all(slot.buffer for slot in tree_slots(root)):
        root = _append_leaf(root, LeafSpec(tensors=(TensorSpec("p0", grad=True),)))
    if "parameter" in o.needs and all(slot.buffer for slot in tree_slots(root)):
        root = _append_leaf(root, LeafSpec(tensors=(TensorSpec("p0"),)))
    if "tie" in o.needs and o.ties:
        root = _with_tie_pair(root)
    # a parametrizable tree keeps its first plain matrix out of ties (decorations skip tied slots)
    reserved = frozenset(_plain_matrices(root)[:1]) if "parametrizable" in o.needs else frozenset()
    tie_specs = _ties(draw, root, tie_chance, reserved) if o.ties else ()
    if "tie" in o.needs and not tie_specs:
        tie_specs = _first_tie(tree_slots(root))
    share_specs = _shares(draw, root) if o.sharing else ()
    if "alias" in o.needs and not _has_alias(root, tie_specs, share_specs):
        root, share_specs = _with_share(root)
    unknown = sorted(set(decoration_kinds) - set(DECORATION_KINDS))
    if unknown or not decoration_kinds:
        raise ValueError(f"decoration_kinds must be a non-empty subset of {DECORATION_KINDS}; "
                         f"unknown: {unknown}")
    world = _world(draw, o.needs, worlds, world_chance)
    kinds = tuple(k for k in DECORATION_KINDS if k in decoration_kinds
                  and k not in WORLD_REFUSED_DECORATIONS.get(world, ()))
    decorations = _decorations(draw, root, tie_specs, decoration_chance, kinds,
                               feasible_only="parametrizable" in o.needs) if kinds else ()
    # slots whose own object does not survive the build: tie targets, decorated parameters
    taken = ({slot for tie in tie_specs for slot in tie.slots[1:]}
             | {(d.path, d.name) for d in decorations if d.kind != "tensor-hooks"})
    if "grad" in o.needs and o.grads:
        root = _with_grad(root, taken)
    if "trainable" in o.needs:  # a tie to a frozen parameter can take the trainable one
        root = _with_trainable(root, {slot for tie in tie_specs for slot in tie.slots[1:]})
    training = not _chance(draw, 25)
    trained = _trained(draw, root, training_chance,
                       "leaf-grads" in o.needs or "swappable" in o.needs)
    world = "" if trained else world  # a trained tree's grads come from a real backward
    unknown = sorted(set(wrappers) - set(WRAPPERS))
    if unknown:
        raise ValueError(f"wrappers must come from {WRAPPERS}; unknown: {unknown}")
    allowed = [w for w in usable_wrappers() if w in wrappers]
    wrapper = draw(st.sampled_from(allowed)) if allowed and _chance(draw, wrapper_chance) else ""
    seed = draw(st.integers(0, 2**32 - 1))
    return TreeSpec(seed=seed, root=root, ties=tie_specs, shares=share_specs, training=training,
                    decorations=decorations, trained=trained, wrapper=wrapper, world=world)


# Worlds whose tensors ``swap_tensors`` refuses: a fake mode keeps a weak reference to each.
SWAP_REFUSING_WORLDS = ("fake",)


def _world(draw: Draw, needs: Sequence[str], worlds: Sequence[str], chance: int) -> str:
    """``''`` or one of ``worlds`` (never for a tree that needs a grad: a world's parameters carry
    none; never a swap-refusing one for a ``swappable`` tree); shrinks to ``''``."""
    unknown = sorted(set(worlds) - set(WORLDS))
    if unknown:
        raise ValueError(f"worlds must come from {WORLDS}; unknown: {unknown}")
    allowed = [w for w in WORLDS if w in worlds
               and not (w in SWAP_REFUSING_WORLDS and "swappable" in needs)]
    if "grad" in needs or not allowed or chance == 0 or not _chance(draw, chance):  # 0: no draw
        return ""
    return draw(st.sampled_from(allowed))


def module_trees(
    *,
    max_depth: int = 4,
    max_leaves: int = 6,
    sharing: bool = True,
    ties: bool = True,
    real_layers: bool = True,
    lazy: bool = True,
    grads: bool = True,
    dtypes: Sequence[torch.dtype] | None = None,
    behaviours: Sequence[str] = BEHAVIOURS,
    behaviour_chance: int = 12,
    decoration_chance: int = 30,
    decoration_kinds: Sequence[str] = DECORATION_KINDS,
    training_chance: int = 20,
    catalogue: bool = True,
    catalogue_chance: int = 7,
    wrappers: Sequence[str] = ("compiled",),
    wrapper_chance: int = 8,
    tie_chance: int = 55,
    worlds: Sequence[str] = DEFAULT_WORLDS,
    world_chance: int = 0,
    needs: Sequence[str] = (),
) -> st.SearchStrategy[nn.Module]:
    """Draw a module tree (built by :func:`~strategies.trees.build_tree` from a drawn :class:`TreeSpec`).

    Every module maps a float tensor ``(BATCH, FEATURES)`` to one of the same shape/dtype, takes ``**kwargs``
    (``fail=True``, ``report=[...]``) and is deterministic; its output depends on every registered tensor
    outside catalogue leaves, and on the tensors a catalogue module's own forward reads.

    Options:

    * ``max_depth``: deepest leaf (0: the root is a leaf). ``max_leaves``: leaves in the drawn tree (>= 1).
    * ``sharing``: allow the same submodule object under a second path (``ShareSpec``).
    * ``ties``: allow tie groups (one tensor object in 2-4 slots, parameters or buffers), drawn in
      ``tie_chance`` percent of the trees that have two compatible slots (default 55).
    * ``real_layers``: allow Linear/Conv1d/Conv2d/BatchNorm1d/LayerNorm/Embedding leaves; ``lazy``: LazyLinear
      (uninitialized or initialized at build time; float32 only).
    * ``grads``: allow parameters that carry a ``.grad``.
    * ``dtypes``: dtypes allowed for tensors (default float32/16/64, bfloat16, complex64 and, for buffers,
      int64 and bool). Parameters only use the floating/complex ones; real layers float32/float64.
      BatchNorm's ``num_batches_tracked`` is int64 regardless.
    * ``behaviours``: forward behaviours a generic leaf may have (default all of ``'inplace'``, ``'rebind'``,
      ``'raise'``, ``'report'``; see :class:`~strategies.modules.GenericLeaf`), each with ``behaviour_chance``
      percent (default 12; the minimal one-parameter leaf has none unless it is 100). Shrinks towards none.
    * ``decoration_chance``: percent of trees (default 30) that get 1-2 decorations torch provides
      (parametrizations, old hook-based weight/spectral norm and pruning, counting tensor and module
      hooks; see :mod:`~strategies.decorations`). 0 turns them off. ``decoration_kinds``: the
      kinds that may be drawn (default all of ``strategies.decorations.KINDS``).
    * ``training_chance``: percent of trees (default 20) built with one real ``backward()`` at the
      end (real grads; sparse ones for ``SparseEmbedding``; half of them with ``create_graph=True``).
      Trees with an uninitialized ``LazyLinear`` are never trained (forward would materialize it).
    * ``catalogue``: allow leaves that wrap a real module from torch's ``module_db``
      (:class:`~strategies.torch_modules.CatalogueLeaf`; as the root, or anywhere in a tree, where ties and
      shares can reach them), each leaf one with ``catalogue_chance`` percent (default 7). Needs float32 in
      ``dtypes``; ``lazy=False`` leaves out the lazy entries. Shrinks towards none, then to the first
      family, entry and variant.
    * ``wrappers``: the wrappers a tree may come in (``'compiled'``: ``torch.compile``'s
      ``OptimizedModule``, forward kept eager; ``'data-parallel'``: ``nn.DataParallel`` on CPU,
      which ``functional_call`` refuses, so it is not in the default), each tree wrapped with
      ``wrapper_chance`` percent (default 8). Shrinks towards no wrapper.

    * ``worlds``: the tensor worlds a tree may be built in (see
      :func:`~strategies.trees.move_to_world`: ``'meta'``, as under ``torch.device('meta')``;
      ``'fake'``, as under ``FakeTensorMode``; ``'two-tensor'``, floating parameters holding
      ``TwoTensor`` subclass values; ``'dtensor'``, floating parameters replicated ``DTensor``
      values on a one-rank CPU mesh; default ``meta`` and ``two-tensor``: a fake tree's swap
      refusals depend on process-wide caches, so it does not replay exactly, and a dtensor tree
      starts a process group), one with
      ``world_chance`` percent (default 0) of the trees that are not trained. ``()`` or 0 keeps every tree plain. Shrinks towards the plain world.
    * ``needs``: features every drawn tree has, by construction rather than by filtering (a
      property that needs one draws no tree without it): ``'grad'`` (a parameter carries a
      ``.grad``: the first leaf that can hold one gets one), ``'none-slot'`` (a ``None``-registered
      slot: the first real layer's bias, or one more buffer of the first generic leaf),
      ``'container-root'`` (the root is a
      container, so ``recurse=False`` leaves tensors alone), ``'leaf-grads'`` (every grad is a
      leaf: no training with ``create_graph=True``), ``'alias'`` (two names reach one tensor: a tree
      drawn without ties or shares gets a module registered again under the root),
      ``'updating-leaf'`` (a generic leaf updates or rebinds a buffer in forward, one of
      ``behaviours``' ``inplace``/``rebind``), ``'parametrizable'`` (a plain float32 matrix
      parameter, which every parametrization applies to, kept out of ties; decorations are then
      drawn among the kinds that have a slot), ``'tensor'`` (at least one tensor slot), ``'trainable'`` (a
      parameter that requires grad: the first frozen one is unfrozen, or a generic leaf of one
      parameter is added), ``'parameter'`` (at least one parameter slot: a generic leaf of one
      parameter is added to a tree without one), ``'tie'`` (a tie group: with ``ties``, a tree
      whose drawn ties come out empty gets its first two compatible slots tied, after a generic
      leaf is added where no two slots are compatible), ``'swappable'`` (``swap_tensors``
      accepts every tensor: no training with ``create_graph=True``, whose grads' graphs hold
      the parameters, no catalogue module that keeps weak references to its parameters (RNNs),
      no ``fake`` world).
      An added leaf is the root's last child; a leaf root, or a custom block root whose
      children are all taken, first goes into a ``Sequential``.
      A tree with no leaf that can take the feature (no parameter at all; for ``'grad'``, every
      parameter tied or decorated) is drawn as it is; so is, for ``'alias'`` and ``'tie'``, a tree whose training forward
      (``trained``) rebinds a tied buffer, which splits the tie.

    Each feature of the drawn tree is reported as ``hypothesis.event('tree: <tag>')`` and kept in
    ``tree_info(module).features``.
    """
    strategy = tree_specs(
        max_depth=max_depth, max_leaves=max_leaves, sharing=sharing, ties=ties,
        real_layers=real_layers, lazy=lazy, grads=grads, dtypes=dtypes,
        behaviours=behaviours, behaviour_chance=behaviour_chance,
        decoration_chance=decoration_chance, decoration_kinds=tuple(decoration_kinds),
        training_chance=training_chance,
        catalogue=catalogue, catalogue_chance=catalogue_chance,
        wrappers=tuple(wrappers), wrapper_chance=wrapper_chance, tie_chance=tie_chance,
        worlds=tuple(worlds), world_chance=world_chance,
        needs=tuple(needs),
    )
    return strategy.map(_build_and_report)


def _build_and_report(spec: TreeSpec) -> nn.Module:
    module = build_tree(spec)
    for tag in sorted(tree_info(module).features):
        event(f"tree: {tag}")
    return module
