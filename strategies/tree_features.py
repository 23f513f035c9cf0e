"""The feature tags of a :class:`~strategies.tree_spec.TreeSpec` (:func:`spec_features`): what the tree
strategies report as Hypothesis events and the reach table counts; a pure function of the spec."""

from __future__ import annotations

from swapspec.strategies.tree_spec import (
    ContainerSpec,
    LeafSpec,
    ShareSpec,
    TensorSpec,
    TieSpec,
    TreeSpec,
    catalogue_module,
    real_slots,
    tree_slots,
    walk,
)


def spec_features(spec: TreeSpec) -> frozenset[str]:
    """The feature tags of a spec (see the README reach table for the list)."""
    tags: set[str] = set()
    depths = {}
    for path, depth, node in walk(spec.root):
        depths[path] = depth
        tags |= _container_tags(node) if isinstance(node, ContainerSpec) else _leaf_tags(node, spec.training)
    tags.add(f"depth={max(depths.values())}")
    tags |= _tie_tags(spec.ties, {(s.path, s.name): s.buffer for s in tree_slots(spec.root)})
    tags |= _share_tags(spec.shares, depths)
    tags |= {f"decoration: {d.kind}" for d in spec.decorations}
    if spec.wrapper:
        tags.add(f"wrapper: {spec.wrapper}")
    if spec.world:
        tags.add(f"world: {spec.world}")
    if spec.storage:
        tags.add(f"storage: {spec.storage}")
    if spec.trained:
        tags.add(f"trained: {spec.trained}")
        if any(isinstance(n, LeafSpec) and n.kind == "SparseEmbedding" and not n.frozen
               for _, _, n in walk(spec.root)):
            tags.add("sparse-grad")
    tags |= _catalogue_span_tags(spec)
    if not spec.training:
        tags.add("eval-mode")
    return frozenset(tags)


def _container_tags(node: ContainerSpec) -> set[str]:
    return {f"container: {'custom' if node.kind == 'Block' else node.kind}"}


def _leaf_tags(leaf: LeafSpec, training: bool) -> set[str]:
    if leaf.kind == "host":
        return {"leaf: host", f"host: {leaf.entry}"}
    if leaf.kind == "catalogue":
        return _catalogue_tags(leaf)
    if leaf.kind == "LazyLinear":
        return {f"leaf: LazyLinear-{'initialized' if leaf.initialized else 'uninitialized'}"}
    tags = {f"leaf: {leaf.kind}"}
    if leaf.kind != "generic":
        tags.add(f"param-dtype: {leaf.dtype}")
        if any(name == "weight" for name, *_ in real_slots(leaf)):
            tags |= {t for t, on in (("frozen-parameter", leaf.frozen), ("parameter-grad", leaf.grad), ("parameter-subclass", leaf.tagged)) if on}
        if not leaf.bias and leaf.kind not in ("Embedding", "SparseEmbedding"):
            tags.add("none-parameter")
        if leaf.kind == "BatchNorm1d":
            tags |= {"buffer-dtype: int64", "buffer-0d"} | ({"forward-inplace-buffer"} if training else set())
        return tags
    for t in leaf.tensors:
        tags |= _tensor_tags(t)
    tags |= {
        {"inplace": "forward-inplace-buffer", "rebind": "forward-rebind-buffer", "raise": "forward-raises", "report": "forward-reports",
         "own-apply": "module-own-apply"}[b]
        for b in leaf.behaviours
    }
    return tags


def _tensor_tags(t: TensorSpec) -> set[str]:
    kind = "buffer" if t.buffer else "parameter"
    if t.none:
        return {f"none-{kind}"}
    tags = {f"{'buffer' if t.buffer else 'param'}-dtype: {t.dtype}"}
    if len(t.shape) == 0:
        tags.add(f"{'buffer' if t.buffer else 'param'}-0d")
    if len(t.shape) == 4:
        tags.add("tensor-4d")
    if t.buffer and not t.persistent:
        tags.add("non-persistent-buffer")
    if not t.buffer:
        tags |= {n for n, on in (("frozen-parameter", t.frozen), ("parameter-grad", t.grad), ("parameter-subclass", t.tagged),
                                 ("parameter-own-module-load", t.tagged and t.loads_itself)) if on}
    return tags


def _catalogue_tags(leaf: LeafSpec) -> set[str]:
    tags = {"leaf: catalogue", f"catalogue: {catalogue_module().family(leaf.entry)}"}
    if any(not s.buffer for s in catalogue_module().slots(leaf.entry, leaf.variant)):
        tags |= {t for t, on in (("frozen-parameter", leaf.frozen), ("parameter-grad", leaf.grad)) if on}
    for s in catalogue_module().slots(leaf.entry, leaf.variant):
        kind = "buffer" if s.buffer else "param"
        tags.add(f"{kind}-dtype: {s.dtype}")
        if len(s.shape) == 0:
            tags.add(f"{kind}-0d")
        if len(s.shape) == 4:
            tags.add("tensor-4d")
    return tags


def _path_depth(path: str) -> int:
    """Depth of a module path: the number of names in it (the root is 0)."""
    return path.count(".") + 1 if path else 0


def _tie_tags(ties: tuple[TieSpec, ...], is_buffer: dict[tuple[str, str], bool]) -> set[str]:
    tags: set[str] = set()
    for tie in ties:
        tags |= {"ties", "tied-buffers" if is_buffer[tie.slots[0]] else "tied-parameters"}
        if len({is_buffer[slot] for slot in tie.slots}) > 1:
            tags.add("tied-parameter-and-buffer")
        paths = [p for p, _ in tie.slots]
        if len(tie.slots) >= 3:
            tags.add("tie-3plus-aliases")
        if len({_path_depth(p) for p in paths}) > 1:
            tags.add("tie-across-depths")
        if len(set(paths)) < len(paths):
            tags.add("tie-within-module")
    return tags


def _share_tags(shares: tuple[ShareSpec, ...], depths: dict[str, int]) -> set[str]:
    tags: set[str] = set()
    for share in shares:
        tags.add("shared-submodule")
        if depths[share.parent] + 1 != depths[share.source]:
            tags.add("shared-across-depths")
    if len({s.source for s in shares}) < len(shares):
        tags.add("shared-3plus-paths")
    return tags


def _catalogue_span_tags(spec: TreeSpec) -> set[str]:
    """``catalogue-root``; ``tie-catalogue`` (a tie group holds slots of a catalogue leaf and slots outside
    it); ``shared-catalogue`` (a shared module is or contains a catalogue leaf)."""
    leaves = [p for p, _, n in walk(spec.root) if isinstance(n, LeafSpec) and n.kind == "catalogue"]
    if not leaves:
        return set()

    def under(path: str, top: str) -> bool:
        return path == top or not top or path.startswith(top + ".")

    tags = {"catalogue-root"} if leaves == [""] else set()
    for tie, c in ((t, c) for t in spec.ties for c in leaves):
        inside = [under(p, c) for p, _ in tie.slots]
        if any(inside) and not all(inside):
            tags.add("tie-catalogue")
    if any(under(c, share.source) for c in leaves for share in spec.shares):
        tags.add("shared-catalogue")
    return tags
