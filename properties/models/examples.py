"""The drawn example a property runs, and facts about it that deviation predicates read.

Facts are computed from the module *before* the target touches it, so a predicate
describes the input, never the outcome.

A deviation's predicate (``Deviation.applies``) receives one :class:`Example`. These fields
and methods are a stable API; a predicate reads nothing else:

- ``module``: the drawn ``nn.Module``, as it was before the target ran (predicates run first);
- ``conversion``: the ``swapspec.strategies.Conversion`` of an apply property, else None:
  ``name`` (``"double()"``, or a host's own name), ``repro`` (its source), ``preserves_values``,
  ``changes_impl`` (meta, sparse, XLA results), ``raises_on`` (the k of ``raise_on(k)``), ``device``;
  ``call``: the public method call it stands for (``strategies.method_calls.MethodCall``:
  ``method``, ``arguments``, ``kind``), or None for an ``_apply(fn)`` conversion;
- ``method``: the ``MethodCall`` of a method property (``APPLY-METHOD-*``), else None: ``method``
  (``"to"``, ``"requires_grad_"``...), ``arguments`` (their source), ``kind`` (``"conversion"``,
  ``"grad"``, ``"bad"``), ``error`` (the error type a bad form must raise); for a ``REGISTER-``
  property the ``strategies.registrations.RegistrationCall`` (``method``, ``owner``, ``name``,
  ``value``, ``kind``, ``defect``) or ``SwapPair`` (``defect``, ``requires_grad``) it draws;
- ``flags``: ``swapspec.strategies.FlagSetting(overwrite, swap)`` of an apply property, else None;
- ``call``: the ``swapspec.strategies.CallInput`` of a functional-call property, else None:
  ``tensors`` (as passed: a dict or a tuple of dicts), ``args``, ``kwargs``, ``tie_weights``,
  ``strict``, ``form`` (``"dict"``, ``"tuple-single"``, ``"tuple-disjoint"``,
  ``"tuple-overlap"``), ``invalid`` (the kind of bad input drawn, or None) and ``merged()``
  (every given name and value in one dict);
- ``recurse``: the ``recurse`` argument of ``apply``;
- ``refused``: the name of a parameter (``"a.weight"``) or grad (``"a.weight.grad"``) held by a
  weak reference, so ``swap_tensors`` refuses it; None if none;
- ``earlier``: the conversions applied before ``conversion`` (same flags);
- ``has(fact)``: a structural fact of the module (``module_facts``): ``"alias-parameter"``,
  ``"alias-buffer"``, ``"shared-submodule"``, ``"tied-parameter"``, ``"parameter-subclass"``,
  ``"uninitialized-parameter"``, ``"parameter-attributes"``, ``"grad"``, ``"parameter"``;
- ``names_before``: every name of every parameter and buffer, aliases included, and its tensor.

Helpers a predicate may call on ``module``: ``named_tensors``, ``alias_groups``,
``shared_submodules``, ``distinct_parameters`` (below), and ``swapspec.strategies.tree_info``
(``tree_info(example.module).features``: the drawn tree's feature tags, ``"leaf: host"`` for a
host's own module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedParameter, UninitializedTensorMixin


def named_tensors(module: nn.Module) -> dict[str, Tensor]:
    """Every name of every parameter and buffer, aliases included (``remove_duplicate=False``)."""
    return dict([
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ])


def slots(module: nn.Module) -> dict[str, Any]:
    """Every registered slot by dotted name, ``None`` slots and shared paths included."""
    table: dict[str, Any] = {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for registry in (m._parameters, m._buffers):
            for key, value in registry.items():
                table[f"{prefix}.{key}" if prefix else key] = value
    return table


def alias_groups(module: nn.Module) -> list[list[str]]:
    """Names that reach one tensor object, for every object with two or more names."""
    by_id: dict[int, list[str]] = {}
    for name, tensor in named_tensors(module).items():
        by_id.setdefault(id(tensor), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def shared_submodules(module: nn.Module) -> list[list[str]]:
    """Paths that reach one submodule object, for every submodule with two or more paths."""
    by_id: dict[int, list[str]] = {}
    for path, m in module.named_modules(remove_duplicate=False):
        by_id.setdefault(id(m), []).append(path)
    return [paths for paths in by_id.values() if len(paths) > 1]


def distinct_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Each parameter object once."""
    return list({id(p): p for p in module.parameters()}.values())


@dataclass
class Example:
    """One drawn case: a module and, depending on the property, a conversion, flags, a call."""

    module: nn.Module
    conversion: Any = None
    flags: Any = None
    call: Any = None
    recurse: bool = True
    refused: str | None = None  # a parameter (``"a.weight"``) or grad (``"a.weight.grad"``) held by a weakref
    earlier: tuple[Any, ...] = ()  # conversions applied (same flags) before ``conversion``
    load: Any = None  # a ``strategies.state_dicts.LoadInput`` for the LOAD- properties
    method: Any = None  # a ``strategies.method_calls.MethodCall`` for the APPLY-METHOD- properties
    facts: frozenset[str] = field(default=frozenset(), init=False)
    names_before: dict[str, Tensor] = field(default_factory=dict, init=False)
    tensors_before: Any = field(default=None, init=False)  # the call's mappings, before write-back

    def __post_init__(self) -> None:
        self.facts = frozenset(module_facts(self.module))
        self.names_before = named_tensors(self.module)
        if self.call is not None:
            own = {id(t) for t in self.names_before.values()}
            self.tensors_before = _copy_mappings(self.call.tensors, own)

    def refused_parameter(self) -> tuple[str, bool] | None:
        """``(parameter name, whether its grad is the refused tensor)``, or None."""
        if self.refused is None:
            return None
        return self.refused.removesuffix(".grad"), self.refused.endswith(".grad")

    def refused_tensor(self) -> Tensor | None:
        """The tensor named by ``refused``, as it was before the target ran."""
        if self.refused is None:
            return None
        name, is_grad = self.refused_parameter()
        tensor = self.names_before[name]
        return tensor.grad if is_grad else tensor

    def has(self, fact: str) -> bool:
        """Whether the module had ``fact`` (see ``module_facts``) before the target ran."""
        return fact in self.facts


def clone_value(value: Any) -> Any:
    """An independent copy of a given value, keeping ``Parameter``-ness."""
    if not isinstance(value, Tensor) or isinstance(value, UninitializedTensorMixin):
        return value
    copy = value_copy(value)
    if isinstance(value, nn.Parameter):
        return nn.Parameter(copy, requires_grad=value.requires_grad)
    return copy.requires_grad_(value.requires_grad) if copy.is_floating_point() else copy


def _copy_mappings(tensors: Any, own: set[int]) -> Any:
    """The call's mappings as given: new dicts, each given tensor cloned once (so two names
    given one object still share one copy), the module's own tensors kept as they are."""
    clones: dict[int, Any] = {}

    def copy(value: Any) -> Any:
        if not isinstance(value, Tensor) or id(value) in own:
            return value
        return clones.setdefault(id(value), clone_value(value))

    if isinstance(tensors, dict):
        return {k: copy(v) for k, v in tensors.items()}
    if isinstance(tensors, tuple | list):
        return type(tensors)({k: copy(v) for k, v in d.items()} if isinstance(d, dict) else d
                             for d in tensors)
    return tensors


def module_facts(module: nn.Module) -> set[str]:
    """Structural facts of a module, named as deviation predicates use them."""
    params = distinct_parameters(module)
    facts = set()
    groups = alias_groups(module)
    param_ids = {id(p) for p in params}
    tensors = named_tensors(module)
    if any(id(tensors[g[0]]) in param_ids for g in groups):
        facts.add("alias-parameter")
    if any(id(tensors[g[0]]) not in param_ids for g in groups):
        facts.add("alias-buffer")
    if shared_submodules(module):
        facts.add("shared-submodule")
    if _has_tied_parameter_across_modules(module):
        facts.add("tied-parameter")
    if any(type(p) is not nn.Parameter for p in params):
        facts.add("parameter-subclass")
    if any(isinstance(p, UninitializedParameter) for p in params):
        facts.add("uninitialized-parameter")
    if any(p.__dict__ for p in params):
        facts.add("parameter-attributes")
    if any(p.grad is not None for p in params):
        facts.add("grad")
    if params:
        facts.add("parameter")
    return facts


def _has_tied_parameter_across_modules(module: nn.Module) -> bool:
    """One parameter object registered in two distinct (module, key) slots."""
    seen: dict[int, tuple[int, str]] = {}
    for m in {id(m): m for m in module.modules()}.values():
        for key, p in m._parameters.items():
            if p is None:
                continue
            if id(p) in seen and seen[id(p)] != (id(m), key):
                return True
            seen.setdefault(id(p), (id(m), key))
    return False


def is_fresh(value: Any, module_tensors: dict[str, Tensor]) -> bool:
    """A given value that is a tensor not already held by the module."""
    return isinstance(value, Tensor) and all(value is not t for t in module_tensors.values())


def floating_or_complex(t: Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def snapshot_values(module: nn.Module) -> dict[str, Tensor]:
    """Detached clones of every tensor's values (meta tensors as they are)."""
    return {name: value_copy(t) for name, t in named_tensors(module).items()}


def holds_values(t: Tensor) -> bool:
    """Whether ``t`` has values to compare: not uninitialized, not on ``meta``, not a ``FakeTensor``,
    not a batched tensor that escaped a vmapped function (every op on it raises)."""
    return not (isinstance(t, nn.parameter.UninitializedTensorMixin) or t.device.type == "meta"
                or is_fake(t) or torch._C._functorch.is_batchedtensor(t))


def is_fake(t: Tensor) -> bool:
    """Whether ``t`` is a ``FakeTensor`` (it reports a real device but holds no storage)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


Comparison = Callable[[Tensor, Tensor], bool]


# The running target's own comparisons (``Target.comparisons``): ``{class: same(a, b)}``.
HOST_COMPARISONS: ContextVar[Mapping[type, Comparison] | None] = ContextVar(
    "swapspec_comparisons", default=None)


@contextmanager
def comparing(comparisons: Mapping[type, Comparison] | None) -> Iterator[None]:
    """Inside the block, ``same_values`` compares a tensor of a class in ``comparisons`` (or of
    a subclass of one) with that class's function: a host's comparison for its own tensors."""
    token = HOST_COMPARISONS.set(dict(comparisons or {}))
    try:
        yield
    finally:
        HOST_COMPARISONS.reset(token)


def host_comparison(a: Tensor, b: Tensor) -> Comparison | None:
    """The running target's comparison for ``a``'s class, else for ``b``'s; None without one."""
    table = HOST_COMPARISONS.get() or {}
    for t in (a, b):
        for cls in type(t).__mro__:
            if cls in table:
                return table[cls]
    return None


def is_wrapper(t: Tensor) -> bool:
    """A traceable wrapper subclass (``__tensor_flatten__``/``__tensor_unflatten__``): a tensor
    whose values are its inner tensors, whatever ops its class implements."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(t)


def value_copy(t: Tensor) -> Tensor:
    """A detached copy of ``t``'s values: ``t.detach().clone()``, and for a traceable wrapper
    subclass the class rebuilt from copies of its inner tensors (it need not implement
    ``detach`` or ``clone``). Meta and fake tensors copy as ``clone`` copies them."""
    if not is_wrapper(t) or is_fake(t):
        return t.detach().clone()
    names, ctx = t.__tensor_flatten__()
    inner = {name: value_copy(getattr(t, name)) for name in names}
    return type(t).__tensor_unflatten__(inner, ctx, t.size(), t.stride())


def _parts(t: Tensor) -> list[Tensor] | None:
    """The inner tensors of a traceable wrapper subclass (``__tensor_flatten__``), else None."""
    if not is_wrapper(t) or is_fake(t):
        return None
    names, _ = t.__tensor_flatten__()
    return [getattr(t, name) for name in names]


def plus_one(t: Tensor) -> Tensor:
    """A detached tensor of ``t``'s class with other values: ``t.detach() + 1``, and for a
    wrapper subclass whose class lacks ``add`` the class rebuilt from its inner tensors plus
    one (a bool part negated)."""
    try:
        return t.detach() + 1
    except (NotImplementedError, TypeError):
        if _parts(t) is None:
            raise
    return by_parts(t, _other)


def by_parts(t: Tensor, fn: Any) -> Tensor:
    """A traceable wrapper subclass ``t`` rebuilt from ``fn`` of each of its inner tensors
    (``__tensor_flatten__``/``__tensor_unflatten__``): what the suite does to a tensor whose
    class lacks the op it would use."""
    names, ctx = t.__tensor_flatten__()
    inner = {name: fn(getattr(t, name)) for name in names}
    return type(t).__tensor_unflatten__(inner, ctx, t.size(), t.stride())


def own_attributes(t: Tensor) -> dict[str, Any]:
    """``t.__dict__`` without a traceable wrapper subclass's inner tensors (its values, not
    attributes a conversion should keep)."""
    parts = set(t.__tensor_flatten__()[0]) if _parts(t) is not None else set()
    return {k: v for k, v in t.__dict__.items() if k not in parts}


def _other(t: Tensor) -> Tensor:
    return ~t.detach() if t.dtype == torch.bool else plus_one(t)


def add_one_(t: Tensor) -> None:
    """Add one to ``t``'s values in place: ``t.add_(1)``, and for a wrapper subclass whose class
    lacks ``add_`` to each of its floating inner tensors (their values are its values)."""
    try:
        t.add_(1)
        return
    except (NotImplementedError, TypeError):
        parts = _parts(t)
        if parts is None:
            raise
    for part in parts:
        if part.is_floating_point():
            add_one_(part)


def loads_itself(t: Tensor | type) -> bool:
    """``t`` (or the class ``t``) is a ``Parameter`` subclass with its own ``module_load``: on the
    swap path of a load, the class and instance attributes it ends with are what that method
    gives, and the suite's one such class (``strategies.modules.SelfLoadingParameter``) keeps
    both, which the models and declarations take as the rule for any such class."""
    cls = t if isinstance(t, type) else type(t)
    return issubclass(cls, nn.Parameter) and cls.module_load is not Tensor.module_load


def dense_leaves(t: Tensor) -> list[Tensor]:
    """``t``, or the plain tensors a wrapper subclass (``TwoTensor``) holds, nested ones too."""
    if is_wrapper(t):
        names, _ = t.__tensor_flatten__()
        return [leaf for n in names for leaf in dense_leaves(getattr(t, n))]
    return [t]


def memory_of(t: Tensor) -> set[int]:
    """The addresses of the storages ``t`` (or its inner tensors) views: empty for tensors that
    hold no values (``holds_values``: meta, fake, uninitialized) and layouts without a storage
    (sparse), where no two tensors can alias."""
    try:
        return {x.untyped_storage().data_ptr() for x in dense_leaves(t) if holds_values(x)} - {0}
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return set()


def same_values(a: Tensor, b: Tensor) -> bool:
    """Equal dtype, shape, device and values (NaNs equal); meta and fake tensors compare by
    metadata (and a fake tensor equals only a fake one).

    Values compare through the running target's comparison for the class, if it gives one
    (``comparing``); else through torch's ops (``equal``, ``isnan``, ``nan_to_num``); two
    wrapper subclass tensors of one class whose class lacks one of those ops compare by their
    parts (``__tensor_flatten__``: equal context, same values inner tensor by inner tensor), and
    two tensors of different classes where one lacks them differ (a class change is a change)."""
    if (a.dtype, a.shape, a.device, a.layout) != (b.dtype, b.shape, b.device, b.layout):
        return False
    if not holds_values(a) or not holds_values(b):
        return is_fake(a) == is_fake(b)
    compare = host_comparison(a, b)
    if compare is not None:
        return bool(compare(a, b))
    try:
        return _same_by_ops(a, b)
    except (NotImplementedError, TypeError):  # what a subclass raises for an op it lacks
        if type(a) is not type(b) and (is_wrapper(a) or is_wrapper(b)):
            return False
        if type(a) is not type(b) or not is_wrapper(a):
            raise
    return _same_parts(a, b)


def _same_by_ops(a: Tensor, b: Tensor) -> bool:
    a, b = a.detach(), b.detach()
    if a.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()
    if torch.equal(a, b):
        return True
    if not floating_or_complex(a):
        return False
    if a.device.type != "cpu":  # NaNs compared on the CPU: XLA cannot lower isnan on float16
        a, b = a.cpu(), b.cpu()
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _same_parts(a: Tensor, b: Tensor) -> bool:
    """Two tensors of one traceable wrapper subclass: equal flatten contexts and inner tensors."""
    (names, ctx), (other_names, other_ctx) = a.__tensor_flatten__(), b.__tensor_flatten__()
    return (names == other_names and ctx == other_ctx
            and all(same_values(getattr(a, n), getattr(b, n)) for n in names))


@dataclass
class StepExample(Example):
    """A step's example, as deviation predicates see it: the module before the step, the
    step's conversion, flags or call, ``step`` (the rule's name), ``graph_held`` (an
    earlier step holds a forward's output with its autograd graph) and ``inference`` (the
    step runs under ``torch.inference_mode()``)."""

    step: str = ""
    graph_held: bool = False
    inference: bool = False
