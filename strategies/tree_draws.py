"""Hypothesis strategies that draw :class:`~strategies.tree_spec.TreeSpec` s and module trees.

Shrinking: every choice is ordered so that the simplest option comes first (a leaf before a container,
``generic`` before real layers before catalogue modules (the first family, entry and variant first), float32
before other dtypes, shape ``(4,)`` first, no ties, no sharing, train mode, every flag off). The minimal tree is ``TreeSpec(root=LeafSpec(tensors=(TensorSpec(name='p0'),)))``:
one generic leaf with one float32 ``(4,)`` parameter, seed 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import nn

from swapspec.strategies.decorations import KINDS as DECORATION_KINDS
from swapspec.strategies.tree_needs import (
    append_leaf,
    first_tie,
    has_alias,
    plain_matrices,
    with_convolution,
    with_grad,
    with_matrix_parameter,
    with_none_slot,
    with_own_apply_leaf,
    with_share,
    with_tie_pair,
    with_trainable,
    with_updating_leaf,
)
from swapspec.strategies.tree_options import (
    BEHAVIOURS,
    DEFAULT_WORLDS,
    HOST_CHANCE,
    WORLD_REFUSED_DECORATIONS,
    Draw,
    coin,
    tree_options,
)
from swapspec.strategies.tree_parts import (
    draw_decorations,
    draw_node,
    draw_shares,
    draw_ties,
    draw_trained,
    draw_training,
    draw_world,
    storage_of,
)
from swapspec.strategies.tree_spec import (
    WRAPPERS,
    LeafSpec,
    TensorSpec,
    TreeSpec,
    has_host_leaf,
    tree_slots,
    usable_wrappers,
)
from swapspec.strategies.trees import build_tree, tree_info

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
    host_chance: int = HOST_CHANCE,
    storage_chance: int = 8,
) -> TreeSpec:
    """Draw a pure-data :class:`TreeSpec`; options as for :func:`module_trees`."""
    o = tree_options(max_depth, max_leaves, sharing, ties, real_layers, lazy, grads, dtypes,
                 tuple(behaviours), behaviour_chance, catalogue, catalogue_chance, tuple(needs),
                 host_chance)
    root = draw_node(draw, o, 0, [o.max_leaves])
    if "none-slot" in o.needs:
        root = with_none_slot(root)
    if "updating-leaf" in o.needs:
        root = with_updating_leaf(root, o.behaviours)
    if "own-apply" in o.needs:
        root = with_own_apply_leaf(root)
    if "parametrizable" in o.needs:
        root = with_matrix_parameter(root)
    for rank in (2, 3):
        if f"conv{rank}d" in o.needs:
            root = with_convolution(root, rank)
    if "trainable" in o.needs:
        root = with_trainable(root)
    if "tensor" in o.needs and not tree_slots(root):
        root = append_leaf(root, LeafSpec(tensors=(TensorSpec("p0"),)))
    if "grad" in o.needs and o.grads and all(slot.buffer for slot in tree_slots(root)):
        root = append_leaf(root, LeafSpec(tensors=(TensorSpec("p0", grad=True),)))
    if "parameter" in o.needs and all(slot.buffer for slot in tree_slots(root)):
        root = append_leaf(root, LeafSpec(tensors=(TensorSpec("p0"),)))
    if "tie" in o.needs and o.ties:
        root = with_tie_pair(root)
    # a parametrizable tree keeps its first plain matrix out of ties (decorations skip tied slots)
    reserved = frozenset(plain_matrices(root)[:1]) if "parametrizable" in o.needs else frozenset()
    tie_specs = draw_ties(draw, root, tie_chance, reserved) if o.ties else ()
    if "tie" in o.needs and not tie_specs:
        tie_specs = first_tie(tree_slots(root))
    share_specs = draw_shares(draw, root) if o.sharing else ()
    if "alias" in o.needs and not has_alias(root, tie_specs, share_specs):
        root, share_specs = with_share(root)
    unknown = sorted(set(decoration_kinds) - set(DECORATION_KINDS))
    if unknown or not decoration_kinds:
        raise ValueError(f"decoration_kinds must be a non-empty subset of {DECORATION_KINDS}; "
                         f"unknown: {unknown}")
    # a world remakes every floating tensor as its own class: a host leaf's would stop being the host's
    world = "" if has_host_leaf(root) else draw_world(draw, o.needs, worlds, world_chance)
    kinds = tuple(k for k in DECORATION_KINDS if k in decoration_kinds
                  and k not in WORLD_REFUSED_DECORATIONS.get(world, ()))
    decorations = draw_decorations(draw, root, tie_specs, decoration_chance, kinds,
                               feasible_only="parametrizable" in o.needs) if kinds else ()
    # slots whose own object does not survive the build: tie targets, decorated parameters
    taken = ({slot for tie in tie_specs for slot in tie.slots[1:]}
             | {(d.path, d.name) for d in decorations if d.kind != "tensor-hooks"})
    if "grad" in o.needs and o.grads:
        root = with_grad(root, taken)
    if "trainable" in o.needs:  # a tie to a frozen parameter can take the trainable one
        root = with_trainable(root, {slot for tie in tie_specs for slot in tie.slots[1:]})
    training = draw_training(draw, tie_specs, backward="trainable" in o.needs)
    trained = draw_trained(draw, root, training_chance,
                           "leaf-grads" in o.needs or "swappable" in o.needs, tie_specs)
    world = "" if trained else world  # a trained tree's grads come from a real backward
    unknown = sorted(set(wrappers) - set(WRAPPERS))
    if unknown:
        raise ValueError(f"wrappers must come from {WRAPPERS}; unknown: {unknown}")
    allowed = [w for w in usable_wrappers() if w in wrappers]
    wrapper = draw(st.sampled_from(allowed)) if allowed and coin(draw, wrapper_chance) else ""
    seed = draw(st.integers(0, 2**32 - 1))
    storage = "" if world else storage_of(seed, storage_chance)
    return TreeSpec(seed=seed, root=root, ties=tie_specs, shares=share_specs, training=training,
                    decorations=decorations, trained=trained, wrapper=wrapper, world=world,
                    storage=storage)


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
    host_chance: int = HOST_CHANCE,
    storage_chance: int = 8,
) -> st.SearchStrategy[nn.Module]:
    """Draw a module tree (built by :func:`~strategies.trees.build_tree` from a drawn :class:`TreeSpec`).

    Every module maps a float tensor ``(BATCH, FEATURES)`` to one of the same shape/dtype, takes ``**kwargs``
    (``fail=True``, ``report=[...]``) and is deterministic; its output depends on every registered tensor
    outside catalogue leaves, and on the tensors a catalogue module's own forward reads.

    Options:

    * ``max_depth``: deepest leaf (0: the root is a leaf). ``max_leaves``: leaves in the drawn tree (>= 1).
    * ``sharing``: allow the same submodule object under a second path (``ShareSpec``).
    * ``ties``: allow tie groups (one tensor object in 2-4 slots, parameters or buffers, or a
      parameter also in generic leaves' buffer slots), drawn in ``tie_chance`` percent of the
      trees that have two compatible slots (default 55).
    * ``real_layers``: allow Linear/Conv1d/Conv2d/BatchNorm1d/LayerNorm/Embedding leaves; ``lazy``: LazyLinear
      (uninitialized or initialized at build time; float32 only).
    * ``grads``: allow parameters that carry a ``.grad``.
    * ``dtypes``: dtypes allowed for tensors (default float32/16/64, bfloat16, complex64 and, for buffers,
      int64 and bool). Parameters only use the floating/complex ones; real layers float32/float64.
      BatchNorm's ``num_batches_tracked`` is int64 regardless.
    * ``behaviours``: behaviours a generic leaf may have (default all of ``'inplace'``, ``'rebind'``,
      ``'raise'``, ``'report'``; see :class:`~strategies.modules.GenericLeaf`; and ``'own-apply'``: its
      class overrides ``_apply``, :class:`~strategies.modules.OwnApplyLeaf`), each with ``behaviour_chance``
      percent (default 12; the minimal one-parameter leaf has none unless it is 100). Shrinks towards none.
    * ``decoration_chance``: percent of trees (default 30) that get 1-2 decorations torch provides
      (parametrizations, old hook-based weight/spectral norm and pruning, counting tensor and module
      hooks; see :mod:`~strategies.decorations`). 0 turns them off. ``decoration_kinds``: the
      kinds that may be drawn (default all of ``strategies.decorations.KINDS``).
    * ``training_chance``: percent of trees (default 20) built with one real ``backward()`` at the
      end (real grads; sparse ones for ``SparseEmbedding``; half of them with ``create_graph=True``).
      Trees with an uninitialized ``LazyLinear`` are never trained (forward would materialize it),
      nor trees that tie a norm layer's running statistic (its backward may find it updated).
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
      :func:`~strategies.tree_worlds.move_to_world`: ``'meta'``, as under ``torch.device('meta')``;
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
      parameter is added; a tree that ties a running statistic is in eval mode, where a backward
      through its forward always runs), ``'parameter'`` (at least one parameter slot: a generic leaf of one
      parameter is added to a tree without one), ``'tie'`` (a tie group: with ``ties``, a tree
      whose drawn ties come out empty gets its first two compatible slots tied, after a generic
      leaf is added where no two slots are compatible), ``'swappable'`` (``swap_tensors``
      accepts every tensor: no training with ``create_graph=True``, whose grads' graphs hold
      the parameters, no catalogue module that keeps weak references to its parameters (RNNs),
      no ``fake`` world), ``'conv2d'``/``'conv3d'`` (a convolution over 2 or 3 spatial
      dimensions, whose weight ``convert_conv{2,3}d_weight_memory_format`` converts: a tree
      without one gets a ``Conv2d`` leaf, or a catalogue ``nn.Conv3d``), ``'own-apply'`` (a
      module whose class overrides ``_apply``: the first generic leaf gets behaviour
      ``own-apply``, or a generic leaf of one parameter with it is added).
      An added leaf is the root's last child; a leaf root, or a custom block root whose
      children are all taken, first goes into a ``Sequential``.
      A tree with no leaf that can take the feature (no parameter at all; for ``'grad'``, every
      parameter tied or decorated) is drawn as it is; so is, for ``'alias'`` and ``'tie'``, a tree whose training forward
      (``trained``) rebinds a tied buffer, which splits the tie.

    * ``storage_chance``: percent of the plain-world trees (default 8) whose tensors share
      storage (:func:`~strategies.tree_storage.share_storage`): ``'flat-parameters'``, every
      plain parameter of a dtype a slice of one flat vector (``vector_to_parameters``), or
      ``'view-buffers'``, every plain buffer a view of a longer tensor of its own. The slices
      are disjoint: each slot keeps values of its own. 0 turns it off. The layout is read
      off the tree's seed (:func:`~strategies.tree_parts.storage_of`), so it takes no draw of
      its own and shrinks with the seed, towards own storage.

    * ``host_chance``: percent of leaves (default 25) drawn from the running target's host
      modules (:mod:`~strategies.host_material`; a target's ``modules``), where it has some: a
      :class:`~strategies.host_leaves.HostLeaf` around the host's module, anywhere in the tree,
      where shares, module hooks, training, wrappers and ties of the other leaves reach it. 0
      turns them off; without host material nothing is drawn for them (the draws are those of
      ``host_chance=0``). Shrinks towards built-in leaves. The spec does not know a host leaf's
      tensors (``leaf_slots`` gives none): a host tensor's class may implement only the ops its
      own forward needs, so the spec never ties one into another leaf (whose forward would run
      ops the host never promised) nor ties another leaf's tensor into a host module (which then
      no longer holds its own class), never decorates one, and counts none for ``needs`` (a
      needed feature comes from a built-in leaf, added where the tree has none). A tree with a
      host leaf is built in the plain world (a world would remake the host's tensors).

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
        needs=tuple(needs), host_chance=host_chance, storage_chance=storage_chance,
    )
    return strategy.map(_build_and_report)


def _build_and_report(spec: TreeSpec) -> nn.Module:
    module = build_tree(spec)
    for tag in sorted(tree_info(module).features):
        event(f"tree: {tag}")
    return module
