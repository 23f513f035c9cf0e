"""Building a tree: ``build_tree`` turns a :class:`TreeSpec` into an ``nn.Module`` and registers its
:class:`TreeInfo`; the one import point of the tree API.

``build_tree(spec)`` is a pure function of the spec: the same spec gives byte-identical tensors, and
building never reads or advances torch's global RNG. The spec classes (:mod:`~strategies.tree_spec`),
the tensor worlds (:mod:`~strategies.tree_worlds`) and the feature tags
(:mod:`~strategies.tree_features`) are re-exported here, so ``from swapspec.strategies.trees import
TreeSpec, ...`` (the lines a repro prints) keeps working.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from swapspec.strategies import modules as M
from swapspec.strategies.decorations import DecorationSpec, decorate
from swapspec.strategies.tree_features import spec_features
from swapspec.strategies.tree_spec import (
    BLOCK_NAMES,
    CONTAINER_KINDS,
    DTYPES,
    REAL_KINDS,
    SPEC_CLASSES,
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
    catalogue_module,
    child_name,
    join,
    leaf_slots,
    real_slots,
    tree_slots,
    usable_wrappers,
    walk,
)
from swapspec.strategies.tree_storage import share_storage
from swapspec.strategies.tree_worlds import move_to_world, uninitialized_on_meta

__all__ = [
    "BLOCK_NAMES",
    "CONTAINER_KINDS",
    "COUNT_SLOTS",
    "DTYPES",
    "POSITIVE_SLOTS",
    "REAL_KINDS",
    "SPEC_CLASSES",
    "TRAININGS",
    "WORLDS",
    "WRAPPERS",
    "ContainerSpec",
    "DecorationSpec",
    "LeafSpec",
    "ShareSpec",
    "Slot",
    "TensorSpec",
    "TieSpec",
    "TreeInfo",
    "TreeSpec",
    "build_tree",
    "child_name",
    "join",
    "leaf_slots",
    "move_to_world",
    "real_slots",
    "slot_values",
    "spec_features",
    "tensor_values",
    "training_input",
    "tree_info",
    "tree_slots",
    "uninitialized_on_meta",
    "usable_wrappers",
    "walk",
]


# ---------------------------------------------------------------- building


def tensor_values(shape: tuple[int, ...], dtype: str, gen: torch.Generator) -> Tensor:
    """Deterministic values in [-1, 1) (bool: coin flips, int64: -3..3, complex: both parts)."""
    if dtype == "bool":
        return torch.rand(shape, generator=gen) > 0.5
    if dtype == "int64":
        return torch.randint(-3, 4, shape, generator=gen)
    if dtype == "complex64":
        re, im = (torch.rand(shape, generator=gen) * 2 - 1 for _ in range(2))
        return torch.complex(re, im)
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(DTYPES[dtype])


POSITIVE_SLOTS = frozenset({"running_var"})  # normalization divides by its square root
COUNT_SLOTS = frozenset({"num_batches_tracked"})  # batch norm with momentum=None divides by it + 1


def slot_values(names: Collection[str], shape: tuple[int, ...], dtype: str,
                gen: torch.Generator) -> Tensor:
    """``tensor_values`` that every slot in ``names`` (the names of one tensor) can hold in a
    forward: positive for a ``running_var``, a count (0 or more) for a ``num_batches_tracked``.
    Any other name takes ``tensor_values`` as they are, so a value no module can run with is
    never drawn as a valid one."""
    values = tensor_values(shape, dtype, gen)
    keys = {name.rpartition(".")[2] for name in names}
    if keys & POSITIVE_SLOTS and values.is_floating_point():
        values = values.abs() + 0.5
    if keys & COUNT_SLOTS and not (values.is_complex() or values.dtype == torch.bool):
        values = values.abs()
    return values


def _make_param(data: Tensor, *, frozen: bool, grad: bool, tagged: bool, tag: str, gen: torch.Generator,
                loads_itself: bool = False) -> nn.Parameter:
    if tagged:
        cls = M.SelfLoadingParameter if loads_itself else M.TaggedParameter
        p = cls(data, not frozen, tag)
    else:
        p = nn.Parameter(data, requires_grad=not frozen)
    if grad:
        p.grad = tensor_values(tuple(data.shape), _dtype_name(data.dtype), gen)
    return p


def _dtype_name(dtype: torch.dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == dtype)


def _build_generic(spec: LeafSpec, path: str, gen: torch.Generator) -> nn.Module:
    leaf = (M.OwnApplyLeaf if "own-apply" in spec.behaviours else M.GenericLeaf)(spec.behaviours)
    for t in spec.tensors:
        if t.none:
            (leaf.register_buffer if t.buffer else leaf.register_parameter)(t.name, None)
            continue
        data = tensor_values(t.shape, t.dtype, gen)
        if t.buffer:
            leaf.register_buffer(t.name, data, persistent=t.persistent)
        else:
            tag = f"tag:{join(path, t.name)}"
            leaf.register_parameter(t.name, _make_param(data, frozen=t.frozen, grad=t.grad, tagged=t.tagged, tag=tag,
                                                            gen=gen, loads_itself=t.loads_itself))
    if "inplace" in spec.behaviours:
        leaf.register_buffer("steps", torch.zeros(1))
    if "rebind" in spec.behaviours:
        leaf.register_buffer("count", torch.zeros((), dtype=torch.int64))
    return leaf


_REAL_CTORS: dict[str, Any] = {
    "Linear": lambda bias, **kw: M.SwLinear(4, 4, bias=bias, **kw),
    "Conv1d": lambda bias, **kw: M.SwConv1d(1, 1, 3, padding=1, bias=bias, **kw),
    "Conv2d": lambda bias, **kw: M.SwConv2d(2, 2, (1, 3), padding="same", bias=bias, **kw),
    "BatchNorm1d": lambda bias, **kw: M.SwBatchNorm1d(4, affine=bias, **kw),
    "LayerNorm": lambda bias, **kw: M.SwLayerNorm(4, bias=bias, **kw),
    "Embedding": lambda bias, **kw: M.SwEmbedding(M.EMBEDDINGS, M.FEATURES, **kw),
    "SparseEmbedding": lambda bias, **kw: M.SwEmbedding(M.EMBEDDINGS, M.FEATURES, sparse=True, **kw),
}


def _build_real(spec: LeafSpec, path: str, gen: torch.Generator) -> nn.Module:
    """Construct on ``meta`` (no RNG use), move to CPU with ``to_empty``, then fill every tensor from ``gen``."""
    if spec.kind == "LazyLinear":
        lazy = M.SwLazyLinear(4)
        lazy.sw_seed = int(torch.randint(0, 2**31 - 1, (), generator=gen))
        if spec.initialized:
            lazy(torch.zeros(M.BATCH, M.FEATURES))
        return lazy
    layer = _REAL_CTORS[spec.kind](spec.bias, device="meta", dtype=DTYPES[spec.dtype]).to_empty(device="cpu")
    with torch.no_grad():
        for name, shape, dtype in ((n, s, d) for n, _, s, d in real_slots(spec)):
            t = layer.get_parameter(name) if name in layer._parameters else layer.get_buffer(name)
            t.copy_(slot_values((name,), shape, dtype, gen))
    if "weight" in layer._parameters and layer.weight is not None:
        w = layer.weight
        layer.weight = _make_param(w.data, frozen=spec.frozen, grad=spec.grad, tagged=spec.tagged, tag=f"tag:{join(path, 'weight')}", gen=gen)
    return layer


_CONTAINERS: dict[str, type[nn.Module]] = {
    "Sequential": M.SwSequential,
    "ModuleList": M.SwModuleList,
    "ModuleDict": M.SwModuleDict,
    "Block": M.Block,
}


def _build_catalogue(spec: LeafSpec, path: str, gen: torch.Generator, out: dict[str, nn.Module]) -> nn.Module:
    """A :class:`~strategies.torch_modules.CatalogueLeaf` seeded from ``gen``; its submodules join ``out``.

    ``frozen`` and ``grad`` apply to every initialized parameter (grads drawn from ``gen``, in
    ``parameters()`` order).
    """
    seed = int(torch.randint(0, 2**31 - 1, (), generator=gen))
    leaf = catalogue_module().build_leaf(spec.entry, spec.variant, seed)
    for p in leaf.parameters():
        if isinstance(p, nn.parameter.UninitializedTensorMixin):
            continue
        p.requires_grad_(not spec.frozen)
        if spec.grad:
            p.grad = tensor_values(tuple(p.shape), _dtype_name(p.dtype), gen)
    for sub, module in leaf.named_modules():
        if sub:
            out[join(path, sub)] = module
    return leaf


def _build_node(node: LeafSpec | ContainerSpec, path: str, gen: torch.Generator, out: dict[str, nn.Module]) -> nn.Module:
    if isinstance(node, LeafSpec) and node.kind == "catalogue":
        module = _build_catalogue(node, path, gen, out)
    elif isinstance(node, LeafSpec) and node.kind == "host":
        from swapspec.strategies.host_leaves import build_leaf

        module = build_leaf(node.entry)
    elif isinstance(node, LeafSpec):
        module = _build_generic(node, path, gen) if node.kind == "generic" else _build_real(node, path, gen)
    else:
        module = _CONTAINERS[node.kind]()
        for i, child in enumerate(node.children):
            name = child_name(node.kind, i)
            module.add_module(name, _build_node(child, join(path, name), gen, out))
    out[path] = module
    return module


def _slot_dict(module: nn.Module, name: str) -> dict[str, Any]:
    return module._buffers if name in module._buffers else module._parameters


def build_tree(spec: TreeSpec) -> nn.Module:
    """Build the module tree described by ``spec`` and register its :class:`TreeInfo`.

    Order (the result is the root, or the wrapper around it): nominal tree (values from ``torch.Generator().manual_seed(spec.seed)`` in build order), then each
    tie puts the source slot's object into the other slots (the slots' own registration, e.g. persistence, is
    kept), then each share adds an existing module under a second parent, then the tensors move to
    ``spec.world``, then they are laid out as ``spec.storage`` says, then the decorations, then ``train(spec.training)``.
    """
    gen = torch.Generator().manual_seed(spec.seed)
    by_path: dict[str, nn.Module] = {}
    root = _build_node(spec.root, "", gen, by_path)
    for tie in spec.ties:
        (src_path, src_name), *targets = tie.slots
        obj = _slot_dict(by_path[src_path], src_name)[src_name]
        for path, name in targets:
            _slot_dict(by_path[path], name)[name] = obj
    for share in spec.shares:
        by_path[share.parent].add_module(share.name, by_path[share.source])
    move_to_world(root, spec.world)
    share_storage(root, spec.storage)
    decorate(root, spec.decorations, spec.seed)
    root.train(spec.training)
    if spec.trained:
        _train_once(root, gen, create_graph=spec.trained == "backward-create-graph")
    root = _wrap(root, spec.wrapper)
    _REGISTRY[root] = TreeInfo(spec=spec, features=spec_features(spec), **_counts(root))
    return root


def _wrap(root: nn.Module, wrapper: str) -> nn.Module:
    """``compiled``: ``torch.compile``'s ``OptimizedModule`` around the tree, its dynamo context
    disabled so forward stays eager and cheap (names gain ``_orig_mod.``); ``data-parallel``:
    ``nn.DataParallel`` on CPU (names gain ``module.``; ``functional_call`` refuses it)."""
    if wrapper == "compiled":
        from torch._dynamo.eval_frame import DisableContext, OptimizedModule

        return OptimizedModule(root, DisableContext())
    if wrapper == "data-parallel":
        return nn.DataParallel(root)
    return root


def training_input(spec: TreeSpec) -> Tensor:
    """The input of the tree's training step (``spec.trained``): the draw from the tree's generator
    that follows the nominal tree's tensors."""
    gen = torch.Generator().manual_seed(spec.seed)
    _build_node(spec.root, "", gen, {})
    return tensor_values((M.BATCH, M.FEATURES), "float32", gen)


def _train_once(root: nn.Module, gen: torch.Generator, *, create_graph: bool) -> None:
    """One forward on values from ``gen`` and ``backward()`` of its sum: real grads, sparse ones for
    a sparse embedding, graph-carrying ones with ``create_graph``. Grad mode is on for it."""
    x = tensor_values((M.BATCH, M.FEATURES), "float32", gen)
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # create_graph=True warns of a reference cycle
        loss = root(x).sum()
        if loss.requires_grad:
            loss.backward(create_graph=create_graph)


def _counts(module: nn.Module) -> dict[str, int]:
    tensors = {id(t) for t in (*module.parameters(), *module.buffers())}
    return {"n_modules": len(list(module.modules())), "n_tensors": len(tensors)}


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class TreeInfo:
    """Metadata of a built tree.

    ``features`` are the bare feature tags (``'ties'``, ``'depth=2'``, ...); the strategy reports each as the
    Hypothesis event ``'tree: ' + tag``. ``n_modules`` counts distinct module objects, ``n_tensors`` distinct
    parameter/buffer objects (ties and shares counted once).
    """

    spec: TreeSpec
    features: frozenset[str]
    n_modules: int
    n_tensors: int

    def build(self) -> nn.Module:
        """A fresh, identical and independent module built from the spec."""
        return build_tree(self.spec)

    def source(self, var: str = "module") -> str:
        """Python lines that rebuild the module into variable ``var`` (exec-able from the repo root)."""
        return (
            "from swapspec.strategies import build_tree\n"
            f"from swapspec.strategies.trees import {', '.join(SPEC_CLASSES)}  # noqa: F401\n"
            f"{var} = build_tree({self.spec!r})\n"
        )


_REGISTRY: weakref.WeakKeyDictionary[nn.Module, TreeInfo] = weakref.WeakKeyDictionary()


def tree_info(module: nn.Module) -> TreeInfo:
    """The :class:`TreeInfo` of a module made by :func:`build_tree` (``KeyError`` for any other module)."""
    try:
        return _REGISTRY[module]
    except KeyError:
        raise KeyError(f"{type(module).__name__} was not built by strategies.build_tree") from None

