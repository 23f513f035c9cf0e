"""The pure data of a tree: the :class:`TreeSpec` classes, their vocabularies, and the slots a spec predicts.

A :class:`TreeSpec` is made of frozen dataclasses and tuples only; ``repr(spec)`` is valid Python once the spec
classes are imported (fields equal to their default are left out).

Paths: the root is ``''``; a child's path is ``parent + '.' + name`` (just ``name`` under the root), i.e. the
names ``named_modules()`` reports for the tree as drawn, before any sharing is added. Child names are
``'0', '1', ...`` in ``Sequential``/``ModuleList``, ``'k0', 'k1', ...`` in ``ModuleDict`` and
``'first', 'second', 'third'`` in the custom :class:`~strategies.modules.Block`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from swapspec.strategies import modules as M
from swapspec.strategies.decorations import DecorationSpec

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
    ``.grad`` of the same shape/dtype, ``tagged`` makes it a :class:`~strategies.modules.TaggedParameter`,
    and ``loads_itself`` (with ``tagged``) a :class:`~strategies.modules.SelfLoadingParameter`
    (its own ``module_load``).
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
    loads_itself: bool = False


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
    """A whole tree: the nominal tree, then ties, then shares, then its world, then its storage
    layout, then decorations (applied in that order, see :mod:`~strategies.decorations`), then
    ``train(training)``."""

    seed: int = 0
    root: LeafSpec | ContainerSpec = LeafSpec()
    ties: tuple[TieSpec, ...] = ()
    shares: tuple[ShareSpec, ...] = ()
    training: bool = True
    decorations: tuple[DecorationSpec, ...] = ()
    trained: str = ""  # "", or one of TRAININGS: one forward and backward() at the end of the build
    wrapper: str = ""  # "", or one of WRAPPERS: the built tree is returned inside it
    world: str = ""  # "", or one of WORLDS: the tensors the tree holds (see move_to_world)
    storage: str = ""  # "", or one of STORAGES: slots laid out in shared storage (see share_storage)


SPEC_CLASSES = ("TreeSpec", "LeafSpec", "ContainerSpec", "TensorSpec", "TieSpec", "ShareSpec",
                "DecorationSpec")


# ---------------------------------------------------------------- spec helpers


def catalogue_module() -> Any:
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
                for s in catalogue_module().slots(leaf.entry, leaf.variant)]
    if leaf.kind != "generic":
        return [Slot(path, n, b, s, d, False) for n, b, s, d in real_slots(leaf)]
    out = [Slot(path, t.name, t.buffer, t.shape, t.dtype, True) for t in leaf.tensors if not t.none]
    if "inplace" in leaf.behaviours:
        out.append(Slot(path, "steps", True, (1,), "float32", False))
    if "rebind" in leaf.behaviours:
        out.append(Slot(path, "count", True, (), "int64", False))
    return out


def has_host_leaf(root: LeafSpec | ContainerSpec) -> bool:
    """Whether the nominal tree has a host leaf (a target's own module)."""
    return any(isinstance(n, LeafSpec) and n.kind == "host" for _, _, n in walk(root))


def tree_slots(root: LeafSpec | ContainerSpec) -> list[Slot]:
    """All slots of the nominal tree, in build order."""
    return [s for path, _, node in walk(root) if isinstance(node, LeafSpec) for s in leaf_slots(path, node)]
