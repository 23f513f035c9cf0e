"""Pure-data tree specs, the builder that turns a spec into an ``nn.Module``, and the per-module registry.

A :class:`TreeSpec` is made of frozen dataclasses and tuples only; ``repr(spec)`` is valid Python once the spec
classes are imported (fields equal to their default are left out). ``build_tree(spec)`` is a pure function of
the spec: the same spec gives byte-identical tensors, and building never reads or advances torch's global RNG.

Paths: the root is ``''``; a child's path is ``parent + '.' + name`` (just ``name`` under the root), i.e. the
names ``named_modules()`` reports for the tree as drawn, before any sharing is added. Child names are
``'0', '1', ...`` in ``Sequential``/``ModuleList``, ``'k0', 'k1', ...`` in ``ModuleDict`` and
``'first', 'second', 'third'`` in the custom :class:`~strategies.modules.Block`.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from swapspec.strategies import modules as M
from swapspec.strategies.decorations import DecorationSpec, decorate

CONTAINER_KINDS = ("Sequential", "ModuleList", "ModuleDict", "Block")
REAL_KINDS = ("Linear", "Conv1d", "Conv2d", "BatchNorm1d", "LayerNorm", "Embedding", "SparseEmbedding",
              "LazyLinear")
TRAININGS = ("backward", "backward-create-graph")
WRAPPERS = ("compiled", "data-parallel")


def usable_wrappers() -> tuple[str, ...]:
    """The wrappers that leave a tree where it is: ``nn.DataParallel`` moves its module to the
    first accelerator when one is present (its own ``_get_available_device_type`` check), a
    conversion of its own before any property runs, so it is drawn only where none is."""
    from torch.nn.parallel.data_parallel import _get_available_device_type

    accelerated = _get_available_device_type() not in (None, "mps")
    return tuple(w for w in WRAPPERS if not (accelerated and w == "data-parallel"))
WORLDS = ("meta", "fake", "two-tensor", "dtensor")
BLOCK_NAMES = ("first", "second", "third")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "complex64": torch.complex64,
    "int64": torch.int64,
    "bool": torch.bool,
}


class _Spec:
    """Mixin: a dataclass repr that leaves out fields equal to their default (still eval-able)."""

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.default is not dataclasses.MISSING and value == f.default:
                continue
            parts.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


@dataclass(frozen=True, repr=False)
class TensorSpec(_Spec):
    """One slot of a generic leaf: a parameter (``buffer=False``) or a buffer.

    ``none``: registered as ``None``. Parameters: ``frozen`` means ``requires_grad=False``, ``grad`` attaches a
    ``.grad`` of the same shape/dtype, ``tagged`` makes it a :class:`~strategies.modules.TaggedParameter`.
    Buffers: ``persistent=False`` keeps it out of ``state_dict()``.
    """

    name: str
    shape: tuple[int, ...] = (4,)
    dtype: str = "float32"
    buffer: bool = False
    none: bool = False
    frozen: bool = False
    grad: bool = False
    tagged: bool = False
    persistent: bool = True


@dataclass(frozen=True, repr=False)
class LeafSpec(_Spec):
    """A leaf module. ``kind`` is ``'generic'``, ``'catalogue'``, ``'host'`` or one of :data:`REAL_KINDS`.

    Generic leaves use ``tensors`` and ``behaviours`` (see :class:`~strategies.modules.GenericLeaf`).
    Real layers use ``dtype``, ``bias`` (False: bias registered as None; BatchNorm: ``affine=False``),
    and ``frozen``/``grad``/``tagged`` which apply to the ``weight`` only. ``LazyLinear`` uses ``initialized``
    (True: one forward at build time materializes it into a ``SwLinear``).
    Catalogue leaves use ``entry`` (a ``module_db`` name such as ``'nn.LSTM'``), ``variant`` (the index of
    its ``ModuleInput``; see :mod:`~strategies.torch_modules`) and ``frozen``/``grad``, which apply to every
    initialized parameter. Host leaves use ``entry`` only: the name of a registered
    :class:`~strategies.host_modules.HostModule`.
    """

    kind: str = "generic"
    tensors: tuple[TensorSpec, ...] = ()
    behaviours: tuple[str, ...] = ()
    dtype: str = "float32"
    bias: bool = True
    frozen: bool = False
    grad: bool = False
    tagged: bool = False
    initialized: bool = False
    entry: str = ""
    variant: int = 0


@dataclass(frozen=True, repr=False)
class ContainerSpec(_Spec):
    """A container (one of :data:`CONTAINER_KINDS`) and its children, in order."""

    kind: str = "Sequential"
    children: tuple[LeafSpec | ContainerSpec, ...] = ()


@dataclass(frozen=True, repr=False)
class TieSpec(_Spec):
    """One tie group: ``slots[0]`` is the source ``(module path, name)``; every other slot gets its object."""

    slots: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, repr=False)
class ShareSpec(_Spec):
    """Register the module at path ``source`` again as child ``name`` of the container at path ``parent``."""

    source: str = ""
    parent: str = ""
    name: str = ""


@dataclass(frozen=True, repr=False)
class TreeSpec(_Spec):
    """A whole tree: the nominal tree, then ties, then shares, then decorations (applied in that
    order, see :mod:`~strategies.decorations`), then ``train(training)``."""

    seed: int = 0
    root: LeafSpec | ContainerSpec = LeafSpec()
    ties: tuple[TieSpec, ...] = ()
    shares: tuple[ShareSpec, ...] = ()
    training: bool = True
    decorations: tuple[DecorationSpec, ...] = ()
    trained: str = ""  # "", or one of TRAININGS: one forward and backward() at the end of the build
    wrapper: str = ""  # "", or one of WRAPPERS: the built tree is returned inside it
    world: str = ""  # "", or one of WORLDS: the tensors the tree holds (see move_to_world)


SPEC_CLASSES = ("TreeSpec", "LeafSpec", "ContainerSpec", "TensorSpec", "TieSpec", "ShareSpec",
                "DecorationSpec")


# ---------------------------------------------------------------- spec helpers


def _catalogue() -> Any:
    """:mod:`~strategies.torch_modules`, imported on first use (so ``python -m`` can run it as a script)."""
    from swapspec.strategies import torch_modules

    return torch_modules


class Slot(NamedTuple):
    """A registered, non-None tensor slot as the spec predicts it."""

    path: str
    name: str
    buffer: bool
    shape: tuple[int, ...]
    dtype: str
    flexible: bool  # a generic p*/b* slot: its forward accepts any shape and dtype


def join(path: str, name: str) -> str:
    """Child path of ``name`` under ``path``."""
    return f"{path}.{name}" if path else name


def child_name(kind: str, index: int) -> str:
    """Name of the ``index``-th child of a container of ``kind``."""
    if kind == "ModuleDict":
        return f"k{index}"
    if kind == "Block":
        return BLOCK_NAMES[index]
    return str(index)


def walk(node: LeafSpec | ContainerSpec, path: str = "", depth: int = 0) -> Iterator[tuple[str, int, Any]]:
    """Yield ``(path, depth, node)`` for every node of the nominal tree, parents first."""
    yield path, depth, node
    if isinstance(node, ContainerSpec):
        for i, child in enumerate(node.children):
            yield from walk(child, join(path, child_name(node.kind, i)), depth + 1)


def real_slots(leaf: LeafSpec) -> list[tuple[str, bool, tuple[int, ...], str]]:
    """``(name, is_buffer, shape, dtype)`` of a real layer's non-None tensors (LazyLinear: none)."""
    d = leaf.dtype
    weight_bias = {
        "Linear": ((4, 4), (4,)),
        "Conv1d": ((1, 1, 3), (1,)),
        "Conv2d": ((2, 2, 1, 3), (2,)),
        "BatchNorm1d": ((4,), (4,)),
        "LayerNorm": ((4,), (4,)),
        "Embedding": ((M.EMBEDDINGS, M.FEATURES), None),
        "SparseEmbedding": ((M.EMBEDDINGS, M.FEATURES), None),
    }.get(leaf.kind)
    if weight_bias is None:
        return []
    w, b = weight_bias
    out = []
    if not (leaf.kind == "BatchNorm1d" and not leaf.bias):
        out.append(("weight", False, w, d))
    if b is not None and leaf.bias:
        out.append(("bias", False, b, d))
    if leaf.kind == "BatchNorm1d":
        out += [("running_mean", True, (4,), d), ("running_var", True, (4,), d), ("num_batches_tracked", True, (), "int64")]
    return out


def leaf_slots(path: str, leaf: LeafSpec) -> list[Slot]:
    """All non-None tensor slots of one leaf (catalogue leaves: their initialized tensors under ``inner``)."""
    if leaf.kind == "host":
        return []  # a host's module: the spec knows its name only
    if leaf.kind == "catalogue":
        return [Slot(join(path, s.path), s.name, s.buffer, s.shape, s.dtype, False)
                for s in _catalogue().slots(leaf.entry, leaf.variant)]
    if leaf.kind != "generic":
        return [Slot(path, n, b, s, d, False) for n, b, s, d in real_slots(leaf)]
    out = [Slot(path, t.name, t.buffer, t.shape, t.dtype, True) for t in leaf.tensors if not t.none]
    if "inplace" in leaf.behaviours:
        out.append(Slot(path, "steps", True, (1,), "float32", False))
    if "rebind" in leaf.behaviours:
        out.append(Slot(path, "count", True, (), "int64", False))
    return out


def tree_slots(root: LeafSpec | ContainerSpec) -> list[Slot]:
    """All slots of the nominal tree, in build order."""
    return [s for path, _, node in walk(root) if isinstance(node, LeafSpec) for s in leaf_slots(path, node)]


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


def _make_param(data: Tensor, *, frozen: bool, grad: bool, tagged: bool, tag: str, gen: torch.Generator) -> nn.Parameter:
    p = M.TaggedParameter(data, not frozen, tag) if tagged else nn.Parameter(data, requires_grad=not frozen)
    if grad:
        p.grad = tensor_values(tuple(data.shape), _dtype_name(data.dtype), gen)
    return p


def _dtype_name(dtype: torch.dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == dtype)


def _build_generic(spec: LeafSpec, path: str, gen: torch.Generator) -> nn.Module:
    leaf = M.GenericLeaf(spec.behaviours)
    for t in spec.tensors:
        if t.none:
            (leaf.register_buffer if t.buffer else leaf.register_parameter)(t.name, None)
            continue
        data = tensor_values(t.shape, t.dtype, gen)
        if t.buffer:
            leaf.register_buffer(t.name, data, persistent=t.persistent)
        else:
            tag = f"tag:{join(path, t.name)}"
            leaf.register_parameter(t.name, _make_param(data, frozen=t.frozen, grad=t.grad, tagged=t.tagged, tag=tag, gen=gen))
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
    leaf = _catalogue().build_leaf(spec.entry, spec.variant, seed)
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
    ``spec.world``, then the decorations, then ``train(spec.training)``.
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
    decorate(root, spec.decorations, spec.seed)
    root.train(spec.training)
    if spec.trained:
        _train_once(root, gen, create_graph=spec.trained == "backward-create-graph")
    root = _wrap(root, spec.wrapper)
    _REGISTRY[root] = TreeInfo(spec=spec, features=spec_features(spec), **_counts(root))
    return root


def move_to_world(root: nn.Module, world: str) -> None:
    """Put every registered tensor of ``root`` into ``world``, as if the tree had been built there.

    - ``'meta'``: every tensor becomes a ``meta`` tensor of its shape and dtype (``torch.device('meta')``
      at construction); ``to_empty`` is how such a tree gets storage.
    - ``'fake'``: every tensor becomes a ``FakeTensor`` of one ``FakeTensorMode`` (built under
      ``FakeTensorMode``); forward runs, on no values.
    - ``'two-tensor'``: every floating parameter holds a ``TwoTensor`` of its value and a copy (a
      traceable wrapper subclass, as ``DTensor`` and quantized weights are).
    - ``'dtensor'``: every floating parameter holds a ``DTensor`` of its value, replicated over the
      one-rank CPU mesh of :mod:`~strategies.dtensor_world` (as ``fully_shard`` and tensor
      parallelism leave parameters; buffers stay plain). Forward does not run there: DTensor
      refuses the plain tensors the suite's leaves mix in.

    Slots are rebound directly (torch's ``_apply`` is what the suite tests, so the builder never runs it):
    one tensor object stays one object in every slot that held it, parameters keep ``requires_grad``,
    and RNNs rebuild ``_flat_weights`` from the new parameters. Moved parameters carry no grad.
    A lazy module's uninitialized tensors are made again on ``meta`` in the ``'meta'`` world (so its
    first forward materializes them there, as under ``torch.device('meta')``) and stay as they are
    in the other worlds. ``''`` changes nothing.
    """
    if not world:
        return
    convert = _WORLD_MAKERS[world]()
    moved: dict[int, tuple[Tensor, Tensor]] = {}  # id -> (old, new); old kept alive so ids stay unique
    for module in root.modules():
        for slots in (module._parameters, module._buffers):
            for name, t in slots.items():
                lazy = isinstance(t, nn.parameter.UninitializedTensorMixin)
                if t is None or (lazy and world != "meta"):
                    continue
                if id(t) not in moved:
                    moved[id(t)] = (t, uninitialized_on_meta(t) if lazy else _moved(t, convert))
                slots[name] = moved[id(t)][1]
        if isinstance(module, nn.RNNBase):
            module._init_flat_weights()


def _moved(t: Tensor, convert: Any) -> Tensor:
    """``t`` in the new world (``t`` itself where the world leaves it): a parameter stays a parameter,
    with its ``requires_grad``; a moved parameter has no grad (a tree built there is untrained)."""
    is_param = isinstance(t, nn.Parameter)
    data = convert(t.detach(), is_param)
    if data is None:
        return t
    if not is_param:
        return data
    return data if isinstance(data, nn.Parameter) else nn.Parameter(data, requires_grad=t.requires_grad)


def uninitialized_on_meta(t: Tensor) -> Tensor:
    """A new uninitialized parameter or buffer like ``t`` (dtype, ``requires_grad``, a buffer's
    ``persistent`` where torch has it: 2.5 and later) whose data is on ``meta``, so it
    materializes there."""
    if isinstance(t, nn.parameter.UninitializedParameter):
        return nn.parameter.UninitializedParameter(t.requires_grad, device="meta", dtype=t.dtype)
    persistent = {"persistent": t.persistent} if hasattr(t, "persistent") else {}
    return nn.parameter.UninitializedBuffer(t.requires_grad, device="meta", dtype=t.dtype,
                                            **persistent)


def _meta_maker() -> Any:
    return lambda t, is_param: torch.empty_like(t, device="meta")


def _fake_maker() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return lambda t, is_param: mode.from_tensor(t)


def _two_tensor_maker() -> Any:
    from torch.testing._internal.two_tensor import TwoTensor

    return lambda t, is_param: TwoTensor(t, t.clone()) if is_param and t.is_floating_point() else None


def _dtensor_maker() -> Any:
    from torch.distributed.tensor import Replicate, distribute_tensor

    from swapspec.strategies import dtensor_world

    mesh = dtensor_world.mesh()
    return lambda t, is_param: (distribute_tensor(t, mesh, [Replicate()])
                                if is_param and t.is_floating_point() else None)


_WORLD_MAKERS = {"meta": _meta_maker, "fake": _fake_maker, "two-tensor": _two_tensor_maker,
                 "dtensor": _dtensor_maker}


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


# ---------------------------------------------------------------- features


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
        return {"leaf: host"}
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
        {"inplace": "forward-inplace-buffer", "rebind": "forward-rebind-buffer", "raise": "forward-raises", "report": "forward-reports"}[b]
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
        tags |= {n for n, on in (("frozen-parameter", t.frozen), ("parameter-grad", t.grad), ("parameter-subclass", t.tagged)) if on}
    return tags


def _catalogue_tags(leaf: LeafSpec) -> set[str]:
    tags = {"leaf: catalogue", f"catalogue: {_catalogue().family(leaf.entry)}"}
    if any(not s.buffer for s in _catalogue().slots(leaf.entry, leaf.variant)):
        tags |= {t for t, on in (("frozen-parameter", leaf.frozen), ("parameter-grad", leaf.grad)) if on}
    for s in _catalogue().slots(leaf.entry, leaf.variant):
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
