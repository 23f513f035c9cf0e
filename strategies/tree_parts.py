"""Draws of a :class:`~strategies.tree_spec.TreeSpec`'s parts: the nominal tree's nodes (leaves and
containers), then what goes on it: ties, shares, decorations, the training step and the tensor world.

Each draw takes Hypothesis's ``draw`` and shrinks towards its simplest choice (see
:mod:`~strategies.tree_draws` for the order).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from swapspec.strategies.decorations import (
    BACKWARD_KINDS,
    MODULE_KINDS,
    DecorationSpec,
    decoratable,
)
from swapspec.strategies.tree_options import SHAPES, Draw, TreeOptions, coin
from swapspec.strategies.tree_spec import (
    CONTAINER_KINDS,
    TRAININGS,
    WORLDS,
    ContainerSpec,
    LeafSpec,
    ShareSpec,
    Slot,
    TensorSpec,
    TieSpec,
    child_name,
    join,
    tree_slots,
    walk,
)
from swapspec.strategies.tree_storage import STORAGES

# ---------------------------------------------------------------- nodes


def _tensor(draw: Draw, o: TreeOptions, name: str, buffer: bool) -> TensorSpec:
    shape = draw(st.sampled_from(SHAPES))
    dtype = draw(st.sampled_from(o.buffer_dtypes if buffer else o.param_dtypes))
    if coin(draw, 10):
        return TensorSpec(name, shape, dtype, buffer=buffer, none=True)
    if buffer:
        return TensorSpec(name, shape, dtype, buffer=True, persistent=not coin(draw, 25))
    frozen, grad = coin(draw, 15), o.grads and coin(draw, 20)
    # One draw for the class, so a tensor costs no more choices than before: 12% tagged, half of
    # those with their own module_load (trees are near Hypothesis's budget of choices per example).
    tag_roll = draw(st.integers(0, 99))
    return TensorSpec(name, shape, dtype, frozen=frozen, grad=grad, tagged=tag_roll >= 88,
                      loads_itself=tag_roll >= 94)


def _generic(draw: Draw, o: TreeOptions) -> LeafSpec:
    n_params = draw(st.integers(0, 4)) if o.param_dtypes else 0
    n_buffers = draw(st.integers(0, 4))
    tensors = [_tensor(draw, o, f"p{i}", False) for i in range(n_params)]
    tensors += [_tensor(draw, o, f"b{i}", True) for i in range(n_buffers)]
    return LeafSpec(tensors=tuple(tensors), behaviours=_behaviours(draw, o))


OWN_APPLY_CHANCE = 8  # percent of generic leaves (drawn past the minimal one) that override _apply


def _behaviours(draw: Draw, o: TreeOptions) -> tuple[str, ...]:
    """A generic leaf's behaviours: one roll per forward behaviour, each on with
    ``behaviour_chance`` percent; ``own-apply`` (a class that overrides ``_apply``) is read off
    the first roll, just below its own range (``OWN_APPLY_CHANCE`` percent), so it costs no
    choice of its own and shrinks away; with ``behaviour_chance`` 100 every behaviour is on, with
    0 none."""
    forward = [b for b in o.behaviours if b != "own-apply"]
    rolls = [draw(st.integers(0, 99)) for _ in forward]
    on = 100 - o.behaviour_chance
    chosen = [b for b, roll in zip(forward, rolls, strict=True) if roll >= on]
    if "own-apply" in o.behaviours and o.behaviour_chance and (
            o.behaviour_chance == 100 or (rolls and on - OWN_APPLY_CHANCE <= rolls[0] < on)):
        chosen.append("own-apply")
    return tuple(chosen)


def _real(draw: Draw, o: TreeOptions) -> LeafSpec:
    kind = draw(st.sampled_from(o.real_kinds))
    if kind == "LazyLinear":
        return LeafSpec(kind, initialized=coin(draw, 40))
    return LeafSpec(
        kind,
        dtype=draw(st.sampled_from(o.real_dtypes)),
        bias=not coin(draw, 20),
        frozen=coin(draw, 15),
        grad=o.grads and coin(draw, 20),
        tagged=coin(draw, 12),
    )


def _catalogue(draw: Draw, o: TreeOptions) -> LeafSpec:
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
    return LeafSpec("catalogue", entry=entry, variant=variant, frozen=coin(draw, 15),
                    grad=o.grads and coin(draw, 20))


def _host(draw: Draw, o: TreeOptions) -> LeafSpec:
    """A host leaf: one of the target's host modules, registered so the spec can rebuild it."""
    from swapspec.strategies.host_leaves import register

    return LeafSpec("host", entry=register(draw(o.host_modules)))


def draw_node(draw: Draw, o: TreeOptions, depth: int, budget: list[int]) -> LeafSpec | ContainerSpec:
    """A leaf, or (while ``depth < max_depth``, with chance 60% - 12% per level) a container of 1-3 children.

    ``budget`` counts the leaves still allowed; a container stops adding children when it reaches 0.
    With the running target's host modules (``o.host_modules``), a leaf is first one of them with
    ``o.host_chance`` percent (a coin that shrinks to the built-in leaves; no coin without host
    modules, so such draws are unchanged). The next leaf choice (15%) is the simplest leaf, a generic one with one float32 (4,) parameter, reached
    with a single choice so that Hypothesis (shortlex) shrinks to it before any other leaf. Then a catalogue
    leaf with ``catalogue_chance`` percent, else a real layer (55%) or a generic leaf.
    """
    if depth < o.max_depth and ((depth == 0 and "container-root" in o.needs)
                                or coin(draw, 60 - 12 * depth)):
        kind = draw(st.sampled_from(CONTAINER_KINDS))
        children = []
        for _ in range(draw(st.integers(1, 3))):
            if budget[0] == 0:
                break
            children.append(draw_node(draw, o, depth + 1, budget))
        return ContainerSpec(kind, tuple(children))
    budget[0] -= 1
    if o.host_modules is not None and coin(draw, o.host_chance):
        return _host(draw, o)
    if o.param_dtypes and not coin(draw, 85):  # the minimal leaf: no behaviour drawn
        always = o.behaviours if o.behaviour_chance == 100 else ()
        return LeafSpec(tensors=(TensorSpec("p0", dtype=o.param_dtypes[0]),), behaviours=always)
    if o.catalogue and coin(draw, o.catalogue_chance):
        return _catalogue(draw, o)
    if o.real_kinds and coin(draw, 55):
        return _real(draw, o)
    return _generic(draw, o)


# ---------------------------------------------------------------- ties and shares


def compatible(src: Slot, dst: Slot) -> bool:
    """Same kind (parameter/buffer), or a parameter into a generic leaf's buffer slot (one tensor
    registered as a parameter and as a buffer, which ``register_buffer`` accepts); a rigid slot
    (real layer, steps/count) also needs the same kind, shape and dtype."""
    if dst.buffer != src.buffer:
        return not src.buffer and dst.flexible
    return dst.flexible or (dst.shape, dst.dtype) == (src.shape, src.dtype)


def draw_ties(draw: Draw, root: LeafSpec | ContainerSpec, chance: int = 55,
              reserved: frozenset[tuple[str, str]] = frozenset()) -> tuple[TieSpec, ...]:
    """Up to two tie groups, each a source slot plus 1-3 compatible slots anywhere in the tree
    (outside ``reserved``)."""
    slots = [s for s in tree_slots(root) if (s.path, s.name) not in reserved]
    if len(slots) < 2 or not coin(draw, chance):
        return ()
    used: set[tuple[str, str]] = set()
    groups = []
    for _ in range(draw(st.integers(1, 2))):
        free = [s for s in slots if (s.path, s.name) not in used]
        if len(free) < 2:
            break
        src = draw(st.sampled_from(free))
        cands = [s for s in free if s != src and compatible(src, s)]
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


def draw_shares(draw: Draw, root: LeafSpec | ContainerSpec) -> tuple[ShareSpec, ...]:
    """Up to three shares: a non-root module registered again under a container it does not reach."""
    nodes = list(walk(root))
    sources = [p for p, _, _ in nodes if p]
    if not sources or not coin(draw, 50):
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


def draw_decorations(draw: Draw, root: LeafSpec | ContainerSpec, ties: tuple[TieSpec, ...],
                     chance: int, kinds: tuple[str, ...],
                     feasible_only: bool = False) -> tuple[DecorationSpec, ...]:
    """With ``chance`` percent, 1-2 decorations, each on a parameter (or module) not yet decorated
    (``feasible_only``: of a kind drawn among those that have a slot to decorate, so none is
    drawn in vain).

    Tied slots are left alone (a parametrization moves the tensor it decorates), and so are
    ``Parameter`` subclasses, which ``parametrize`` refuses, and sparse embeddings' weights
    (reparametrized, their sparse grads fail in backward), and the tensors of catalogue leaves
    (torch's own modules: only their adapter gets module hooks). A module gets full or non-full
    backward hooks, never both (``decorations.BACKWARD_KINDS``: torch refuses them together). Shrinks towards none, and towards the hooks
    (first in the kind list) before any reparametrization.
    """
    if not coin(draw, chance):
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
        feasible = ([k for k in kinds if k in MODULE_KINDS or candidates(k)] if feasible_only
                    else kinds)
        if not feasible:
            break
        kind = draw(st.sampled_from(feasible))
        if kind in MODULE_KINDS:
            path = draw(st.sampled_from(modules))
            key = (path, "backward hooks") if kind in BACKWARD_KINDS else (path, kind)
            if key not in used:  # one kind of backward hooks per module: torch refuses both
                used.add(key)
                out.append(DecorationSpec(kind, path))
            continue
        slots = candidates(kind)
        if slots:
            slot = draw(st.sampled_from(slots))
            used.add((slot.path, slot.name))
            out.append(DecorationSpec(kind, slot.path, slot.name))
    return tuple(out)


# Buffers a norm layer's training forward updates in place. Tied between two layers, the second
# update can bump a version the first one's backward checks (an ``nn.InstanceNorm`` after an
# ``nn.BatchNorm`` holding one ``running_mean``): torch refuses the backward of such a tree's
# training-mode forward, so it has no training step to run.
RUNNING_STATISTICS = ("running_mean", "running_var")


def ties_a_running_statistic(ties: Sequence[TieSpec]) -> bool:
    """Whether a tie holds a running statistic (``RUNNING_STATISTICS``) of some norm layer."""
    return any(name in RUNNING_STATISTICS for tie in ties for _, name in tie.slots)


def draw_training(draw: Draw, ties: Sequence[TieSpec], backward: bool = False) -> bool:
    """Whether the tree is in training mode: three times in four; shrinks to ``True``. Always
    ``False`` for a tree whose forward must allow a backward (``backward``) and that ties a
    running statistic (``RUNNING_STATISTICS``)."""
    training = not coin(draw, 25)
    return training and not (backward and ties_a_running_statistic(ties))


def draw_trained(draw: Draw, root: LeafSpec | ContainerSpec, chance: int,
                 leaf_grads: bool = False, ties: Sequence[TieSpec] = ()) -> str:
    """``''`` or one of ``TRAININGS`` (``leaf_grads``: not ``create_graph``); shrinks to ``''``.
    Always ``''`` for a tree with an uninitialized ``LazyLinear`` (forward would materialize it)
    or a tie of a running statistic (``RUNNING_STATISTICS``)."""
    lazy = any(isinstance(n, LeafSpec) and n.kind == "LazyLinear" and not n.initialized
               for _, _, n in walk(root))
    if lazy or not coin(draw, chance):
        return ""
    trained = draw(st.sampled_from([t for t in TRAININGS
                                    if not (leaf_grads and t == "backward-create-graph")]))
    return "" if ties_a_running_statistic(ties) else trained


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


# ---------------------------------------------------------------- worlds


# Worlds whose tensors ``swap_tensors`` refuses: a fake mode keeps a weak reference to each.
SWAP_REFUSING_WORLDS = ("fake",)


def draw_world(draw: Draw, needs: Sequence[str], worlds: Sequence[str], chance: int) -> str:
    """``''`` or one of ``worlds`` (never for a tree that needs a grad: a world's parameters carry
    none; never a swap-refusing one for a ``swappable`` tree); shrinks to ``''``."""
    unknown = sorted(set(worlds) - set(WORLDS))
    if unknown:
        raise ValueError(f"worlds must come from {WORLDS}; unknown: {unknown}")
    allowed = [w for w in WORLDS if w in worlds
               and not (w in SWAP_REFUSING_WORLDS and "swappable" in needs)]
    if "grad" in needs or not allowed or chance == 0 or not coin(draw, chance):  # 0: no draw
        return ""
    return draw(st.sampled_from(allowed))



def storage_of(seed: int, chance: int) -> str:
    """The storage layout of a tree whose seed is ``seed``: one of ``STORAGES``
    (:mod:`~strategies.tree_storage`) for ``chance`` percent of the seeds, ``''`` for the
    others and for seed 0 (so a tree shrinks to own storage with its seed)."""
    if seed % 100 < 100 - chance:
        return ""
    return STORAGES[seed // 100 % len(STORAGES)]
