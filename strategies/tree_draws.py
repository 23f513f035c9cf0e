"""Hypothesis strategies that draw :class:`~strategies.trees.TreeSpec` s and module trees.

Shrinking: every choice is ordered so that the simplest option comes first (a leaf before a container,
``generic`` before real layers before catalogue modules (the first family, entry and variant first), float32
before other dtypes, shape ``(4,)`` first, no ties, no sharing, train mode, every flag off). The minimal tree is ``TreeSpec(root=LeafSpec(tensors=(TensorSpec(name='p0'),)))``:
one generic leaf with one float32 ``(4,)`` parameter, seed 0.
"""

from __future__ import annotations

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
    walk,
)

SHAPES: tuple[tuple[int, ...], ...] = ((4,), (), (3,), (2, 3), (1,), (2, 3, 2, 2))
PARAM_DTYPES = ("float32", "float16", "float64", "bfloat16", "complex64")
BUFFER_DTYPES = (*PARAM_DTYPES, "int64", "bool")
BEHAVIOURS = ("inplace", "rebind", "raise", "report")
# ``'fake'`` is left out by default: whether ``swap_tensors`` refuses a fake parameter depends on
# process-wide caches of torch's fake-tensor converter (a weak reference to it exists or not), so
# examples built there do not replay exactly.
DEFAULT_WORLDS = ("meta", "two-tensor")
# Decorations a world cannot take: ``orthogonal`` checks its tensor's values (``allclose``).
WORLD_REFUSED_DECORATIONS = {"meta": ("orthogonal",), "fake": ("orthogonal",)}
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


def _options(max_depth, max_leaves, sharing, ties, real_layers, lazy, grads, dtypes,
             behaviours, behaviour_chance, catalogue, catalogue_chance) -> _Options:
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
    families = _catalogue_families(lazy) if catalogue and catalogue_chance and "float32" in names else ()
    return _Options(max_depth, max_leaves, sharing, ties, kinds, real_dtypes, grads, param, names,
                    allowed, behaviour_chance, families, catalogue_chance)


@cache
def _catalogue_families(lazy: bool) -> tuple[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], ...]:
    """The catalogue grouped by family in shrinking order; ``lazy=False`` leaves out lazy entries."""
    from swapspec.strategies import torch_modules

    grouped: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for e in torch_modules.catalogue().values():
        if lazy or not e.lazy:
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
    if depth < o.max_depth and _chance(draw, 60 - 12 * depth):
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


def _ties(draw: Draw, root: LeafSpec | ContainerSpec, chance: int = 55) -> tuple[TieSpec, ...]:
    """Up to two tie groups, each a source slot plus 1-3 compatible slots anywhere in the tree."""
    slots = tree_slots(root)
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
                 chance: int, kinds: tuple[str, ...]) -> tuple[DecorationSpec, ...]:
    """With ``chance`` percent, 1-2 decorations, each on a parameter (or module) not yet decorated.

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
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(kinds))
        if kind == "module-hooks":
            path = draw(st.sampled_from(modules))
            if (path, "") not in used:
                used.add((path, ""))
                out.append(DecorationSpec(kind, path))
            continue
        cands = [s for s in params if (s.path, s.name) not in used and decoratable(kind, s.shape, s.dtype)
                 and (s.path, s.name) not in (frozen if kind == "tensor-hooks" else tagged | sparse)]
        if cands:
            slot = draw(st.sampled_from(cands))
            used.add((slot.path, slot.name))
            out.append(DecorationSpec(kind, slot.path, slot.name))
    return tuple(out)


def _trained(draw: Draw, root: LeafSpec | ContainerSpec, chance: int) -> str:
    """``''`` or one of ``TRAININGS``; shrinks to ``''``."""
    lazy = any(isinstance(n, LeafSpec) and n.kind == "LazyLinear" and not n.initialized
               for _, _, n in walk(root))
    if lazy or not _chance(draw, chance):
        return ""
    return draw(st.sampled_from(TRAININGS))


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
) -> TreeSpec:
    """Draw a pure-data :class:`TreeSpec`; options as for :func:`module_trees`."""
    o = _options(max_depth, max_leaves, sharing, ties, real_layers, lazy, grads, dtypes,
                 tuple(behaviours), behaviour_chance, catalogue, catalogue_chance)
    root = _node(draw, o, 0, [o.max_leaves])
    tie_specs = _ties(draw, root, tie_chance) if o.ties else ()
    share_specs = _shares(draw, root) if o.sharing else ()
    unknown = sorted(set(decoration_kinds) - set(DECORATION_KINDS))
    if unknown or not decoration_kinds:
        raise ValueError(f"decoration_kinds must be a non-empty subset of {DECORATION_KINDS}; "
                         f"unknown: {unknown}")
    training = not _chance(draw, 25)
    trained = _trained(draw, root, training_chance)
    world = _world(draw, trained, worlds, world_chance)
    kinds = tuple(k for k in DECORATION_KINDS if k in decoration_kinds
                  and k not in WORLD_REFUSED_DECORATIONS.get(world, ()))
    decorations = _decorations(draw, root, tie_specs, decoration_chance, kinds) if kinds else ()
    unknown = sorted(set(wrappers) - set(WRAPPERS))
    if unknown:
        raise ValueError(f"wrappers must come from {WRAPPERS}; unknown: {unknown}")
    allowed = [w for w in WRAPPERS if w in wrappers]
    wrapper = draw(st.sampled_from(allowed)) if allowed and _chance(draw, wrapper_chance) else ""
    seed = draw(st.integers(0, 2**32 - 1))
    return TreeSpec(seed=seed, root=root, ties=tie_specs, shares=share_specs, training=training,
                    decorations=decorations, trained=trained, wrapper=wrapper, world=world)


def _world(draw: Draw, trained: str, worlds: Sequence[str], chance: int) -> str:
    """``''`` or one of ``worlds`` (never for a trained tree: its grads come from a real backward);
    shrinks to ``''``."""
    unknown = sorted(set(worlds) - set(WORLDS))
    if unknown:
        raise ValueError(f"worlds must come from {WORLDS}; unknown: {unknown}")
    allowed = [w for w in WORLDS if w in worlds]
    if trained or not allowed or not _chance(draw, chance):
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
      ``TwoTensor`` subclass values; default ``meta`` and ``two-tensor``: a fake tree's swap
      refusals depend on process-wide caches, so it does not replay exactly), one with
      ``world_chance`` percent (default 0) of the trees that are not trained. ``()`` or 0 keeps every tree plain. Shrinks towards the plain world.

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
    )
    return strategy.map(_build_and_report)


def _build_and_report(spec: TreeSpec) -> nn.Module:
    module = build_tree(spec)
    for tag in sorted(tree_info(module).features):
        event(f"tree: {tag}")
    return module
