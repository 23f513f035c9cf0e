"""Needs met by construction: pure functions that give a drawn tree spec a feature a property
needs (a grad, a ``None`` slot, a tie, an alias, ...), changing its first leaf that can take it
or adding a leaf, so no property filters drawn trees. No draws here: each is a function of the spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from swapspec.strategies.tree_parts import compatible
from swapspec.strategies.tree_spec import (
    BLOCK_NAMES,
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


def with_grad(root: LeafSpec | ContainerSpec, taken: set[tuple[str, str]]) -> LeafSpec | ContainerSpec:
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


def with_trainable(root: LeafSpec | ContainerSpec,
                   taken: set[tuple[str, str]] = frozenset()) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if a parameter outside ``taken`` (tie targets) requires grad, else
    with its first frozen one unfrozen, else (with nothing taken: before ties are drawn) with
    a generic leaf of one parameter added as the root's last child."""
    if any(isinstance(n, LeafSpec) and _trainable_here(n, p, taken) for p, _, n in walk(root)):
        return root
    root, done = _replace_first(root, _unfreezer(taken))
    if done or taken:
        return root
    return append_leaf(root, LeafSpec(tensors=(TensorSpec("p0"),)))


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


def with_none_slot(root: LeafSpec | ContainerSpec) -> LeafSpec | ContainerSpec:
    """``root`` (drawn, before ties and shares) unchanged if a slot is registered as None, else
    with one more: on its first leaf that can take one, else in a generic leaf added as the
    root's last child (a leaf root first goes into a ``Sequential``)."""
    if _has(root, _leaf_has_none):
        return root
    root, done = _replace_first(root, _give_none)
    return root if done else append_leaf(root, NONE_LEAF)


def has_alias(root: LeafSpec | ContainerSpec, ties: tuple[TieSpec, ...],
              shares: tuple[ShareSpec, ...]) -> bool:
    """Whether two names will reach one tensor: a tie, or a share of a module holding a slot."""
    holders = {s.path for s in tree_slots(root)}
    return bool(ties) or any(h == s.source or h.startswith(s.source + ".")
                             for s in shares for h in holders)


UPDATING = ("inplace", "rebind")


def with_updating_leaf(root: LeafSpec | ContainerSpec, allowed: tuple[str, ...]) -> LeafSpec | ContainerSpec:
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
    return append_leaf(root, extra)


def with_own_apply_leaf(root: LeafSpec | ContainerSpec) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if a generic leaf overrides ``_apply`` (behaviour ``own-apply``), else
    with the first generic leaf given it (a leaf with one parameter and it added as the root's
    last child, where there is no generic leaf)."""
    if _has(root, lambda n: n.kind == "generic" and "own-apply" in n.behaviours):
        return root

    def give(leaf: LeafSpec, path: str) -> LeafSpec | None:
        if leaf.kind != "generic":
            return None
        return dataclasses.replace(leaf, behaviours=(*leaf.behaviours, "own-apply"))

    root, done = _replace_first(root, give)
    return root if done else append_leaf(root, LeafSpec(tensors=(TensorSpec("p0"),),
                                                        behaviours=("own-apply",)))


MATRIX = TensorSpec("p0", shape=(2, 3))


def plain_matrices(root: LeafSpec | ContainerSpec) -> list[tuple[str, str]]:
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


def with_matrix_parameter(root: LeafSpec | ContainerSpec) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if a plain float32/float64 matrix parameter exists (every
    parametrization applies to one), else with one more on its first generic leaf (or on a leaf
    added as the root's last child)."""
    if plain_matrices(root):
        return root

    def give(leaf: LeafSpec, path: str) -> LeafSpec | None:
        if leaf.kind != "generic":
            return None
        names = {t.name for t in leaf.tensors}
        name = next(f"p{i}" for i in range(len(names) + 1) if f"p{i}" not in names)
        return dataclasses.replace(leaf, tensors=(dataclasses.replace(MATRIX, name=name), *leaf.tensors))

    root, done = _replace_first(root, give)
    return root if done else append_leaf(root, LeafSpec(tensors=(MATRIX,)))


# The convolutions whose weight ``convert_conv{rank}d_weight_memory_format`` converts, as real
# leaves (``LeafSpec.kind``) and as catalogue entries.
CONVOLUTION_LEAVES = {2: ("Conv2d",), 3: ()}
CONVOLUTION_ENTRIES = {2: ("nn.Conv2d", "nn.ConvTranspose2d"), 3: ("nn.Conv3d", "nn.ConvTranspose3d")}


def has_convolution(root: LeafSpec | ContainerSpec, rank: int) -> bool:
    """Whether a leaf is a convolution over ``rank`` (2 or 3) spatial dimensions."""
    return _has(root, lambda leaf: leaf.kind in CONVOLUTION_LEAVES[rank] or (
        leaf.kind == "catalogue" and leaf.entry in CONVOLUTION_ENTRIES[rank]))


def with_convolution(root: LeafSpec | ContainerSpec, rank: int) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if it has a convolution over ``rank`` spatial dimensions, else with
    one added: a ``Conv2d`` leaf (rank 2) or a catalogue ``nn.Conv3d`` (rank 3, its first
    variant). Call it before ties are drawn."""
    if has_convolution(root, rank):
        return root
    leaf = LeafSpec(kind="Conv2d") if rank == 2 else LeafSpec(kind="catalogue", entry="nn.Conv3d")
    return append_leaf(root, leaf)


def _tie_pair(slots: list[Slot]) -> tuple[Slot, Slot] | None:
    """The first two slots (in build order) that ``draw_ties`` could tie: a source and a compatible one."""
    return next(((src, dst) for src in slots for dst in slots
                 if dst != src and compatible(src, dst)), None)


def with_tie_pair(root: LeafSpec | ContainerSpec) -> LeafSpec | ContainerSpec:
    """``root`` unchanged if two of its slots can be tied, else with a generic leaf added as the
    root's last child: one parameter (any parameter can be tied to it) or, in a tree without a
    parameter, two. Call it before ties are drawn."""
    slots = tree_slots(root)
    if _tie_pair(slots) is not None:
        return root
    extra = (TensorSpec("p0"),) if any(not s.buffer for s in slots) else (TensorSpec("p0"), TensorSpec("p1"))
    return append_leaf(root, LeafSpec(tensors=extra))


def first_tie(slots: list[Slot]) -> tuple[TieSpec, ...]:
    """One tie group of the first two slots that can be tied, for a tree whose drawn ties came out empty."""
    pair = _tie_pair(slots)
    return () if pair is None else (TieSpec(tuple((s.path, s.name) for s in pair)),)


def append_leaf(root: LeafSpec | ContainerSpec, leaf: LeafSpec) -> LeafSpec | ContainerSpec:
    """``leaf`` as the root's last child; a leaf root, or a custom block whose children are all
    taken, first goes into a ``Sequential``. Call it before ties and shares are drawn."""
    if isinstance(root, LeafSpec) or (root.kind == "Block" and len(root.children) == len(BLOCK_NAMES)):
        return ContainerSpec("Sequential", (root, leaf))
    return ContainerSpec(root.kind, (*root.children, leaf))


def with_share(root: LeafSpec | ContainerSpec) -> tuple[LeafSpec | ContainerSpec, tuple[ShareSpec, ...]]:
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

