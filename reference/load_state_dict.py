"""Reference ``load_state_dict``: copy, assign or swap a state dict's tensors into a module.

This is the executable spec for ``nn.Module.load_state_dict`` under
``torch.__future__.set_swap_module_params_on_conversion``. It follows torch's own code path
(``load_state_dict``, ``_load_from_state_dict``, ``Tensor.module_load``, ``swap_tensors``, the
load pre- and post-hooks); the rules below say where, and what the spec adds on top of torch.
"""

from __future__ import annotations

import itertools
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.module import _EXTRA_STATE_KEY_SUFFIX, _IncompatibleKeys
from torch.nn.parameter import is_lazy

from swapspec.reference.apply import _carry_tensor_hooks, _run_overridden, _Step, _tensor_hooks
from swapspec.reference.flags import get_swap_module_params_on_conversion
from swapspec.reference.overrides import BUILTIN, ApplyOverride, hook_overrides_of

SWAP, ASSIGN, COPY = "swap", "assign", "copy"


def load_state_dict(
    module: nn.Module,
    state_dict: Mapping[str, Any],
    *,
    strict: bool = True,
    assign: bool = False,
    swap: bool | None = None,
) -> _IncompatibleKeys:
    """Load ``state_dict`` into ``module``; return torch's ``(missing_keys, unexpected_keys)``.

    Rules (torch's, unless marked *spec*):
    1. ``state_dict`` must be a ``Mapping`` (else torch's ``TypeError``); it is copied, with its
       ``_metadata``, before anything runs, and the caller's mapping and metadata are never
       changed (*spec*: torch writes ``assign_to_params_buffers`` into the caller's metadata).
       ``swap=None`` reads ``reference.flags``.
    2. Traversal (``_Load.visit``): torch's, pre-order over ``_modules``; a shared submodule is
       visited once per path. Each module's ``_load_from_state_dict`` runs, so a class's override
       is honoured; nn.Module's own version (reached directly or through ``super()``) is the
       reference's ``_Load.local``. It runs the load pre-hooks first, then loads each non-None
       parameter and persistent buffer whose key is given. After a module's children, its
       post-hooks run with the live ``(missing_keys, unexpected_keys)`` lists and must return
       None (else torch's ``AssertionError``).
    3. Checks per key (``_Load.local_tensor``), each adding torch's message to the error list and
       skipping the key: a value that is not tensor-like, a shape mismatch (a ``(1,)`` value
       given for a 0-dim slot is indexed first; lazy slots are not checked). Copying into a
       ``meta`` slot from a non-meta value warns as torch does (a no-op). Keys are always
       collected: a slot without a given key is missing; a given key under this module's prefix
       that names neither one of its slots nor a child is unexpected. Extra state is loaded with
       ``set_extra_state`` when the class defines it (missing if absent), else its key is
       unexpected.
    4. The path per distinct tensor object (``choose_load_path``): swap if the swap flag is set,
       else assign if ``assign``, else copy.
       - copy: ``slot.copy_(value)`` under ``no_grad``; object, ``_cdata`` and class stay.
       - assign: the slot gets ``value``, wrapped as ``nn.Parameter(value, requires_grad=...)``
         for a parameter slot unless it is a Parameter (whose ``requires_grad`` is then set to
         the slot's); the class and attributes are the value's (torch's documentation). A
         Parameter object that only buffer slots hold is a buffer: its slots get ``value``
         itself (*spec*: torch wraps it and registers it as a parameter).
       - With ``assign`` (with or without swap), a value that is the slot's own data (the slot
         itself, or a detached alias with its dtype, shape, strides and offset, as
         ``state_dict()`` gives) leaves the slot as it is (*spec*: torch puts in a new
         Parameter, so an optimizer loses it, or swaps in the value's class).
       - An uninitialized (lazy) slot given an uninitialized value is left as it is on every
         path: there is nothing to load (*spec*: torch's assign and swap paths raise).
       - swap: ``new = slot.module_load(value, assign=assign)`` (a subclass's ``module_load`` and
         ``__torch_function__`` are honoured; returning ``slot`` or ``value`` is torch's error),
         then ``torch.utils.swap_tensors(slot, new)``. A failure is reported as torch's
         ``While swapping the parameter named ...`` message.
    5. Identity on the swap path (*spec*, ``_swap``): the object stays, and keeps its class
       (unless ``new`` is itself a tensor subclass, whose class wins, as in ``apply``; with
       ``assign`` the class is the value's, torch's assign rule), its instance attributes (those
       ``new`` lacks), its ``requires_grad``, its grad (``.to`` the new dtype and device when
       they differ) and its ``register_hook`` / post-accumulate-grad hooks. An optimizer built
       before therefore still holds it. Buffers take ``new``'s class, as in torch.
    6. Ties (*spec*, ``_Load.already_loaded``): one tensor object is loaded once; every slot in
       the tree that held it holds one object afterwards, on every path (assign rebinds all of
       them). Which value it gets, when several keys reach it:
       - A value that is the object's own data when the load begins (``_own_data``: the object
         itself, or a tensor of its class and dtype, shape, device, strides and storage offset
         that aliases its storage, as ``state_dict()`` gives) is unchanged data: it yields to
         any other key's value for the object, whatever their order. Only when every key gives
         own data is the object loaded from the first of them.
       - Otherwise the first key giving a value that is not own data loads it. A later such key
         with the same value (the same object, or equal dtype, shape, device and values, as
         given: compared with copies taken before anything is written) is skipped; one with a
         different value is an error, reported in torch's list as ``While loading the tied
         names "<first>" and "<key>": they were given different values.``, and rule 8 leaves
         the module as it was. Never a silent last-wins.
    7. Errors: with ``strict``, missing and unexpected keys are put first in the list, as torch
       does; any entry in the list raises ``RuntimeError("Error(s) in loading state_dict for
       <Class>:\\n\\t...")``. Without ``strict`` the keys are only returned.
    8. Atomic (*spec*, ``_Snapshot`` and ``_Load.undo``): on any error (the ``RuntimeError`` of
       rule 7, or whatever a hook or an override raises) every change is undone before the error
       propagates unchanged: swaps are swapped back, slots added meanwhile are removed, then
       every slot gets its old object back
       (through ``setattr`` for parameters, so an RNN's flat weights follow) and every tensor its
       class, attributes, ``.data``, values, ``requires_grad`` and grad, ``set_extra_state`` gets
       the old extra state, and a given Parameter gets its ``requires_grad`` back. Side effects of
       hooks and overrides outside the module's tensors are theirs. The traversal only plans
       the writes (``_Load.flush`` makes them, in its order, after it has found no error, and
       before the post hooks of a module that has any, so those see the loaded values as
       torch's do): a load that fails on its input (rules 3, 6, 7) writes nothing. On the swap
       path that is what keeps the module usable: ``swap_tensors`` makes the autograd node of a
       tensor it swaps raise when run, if a graph still holds it (``backward(create_graph=True)``
       leaves one in the grad), so a swap undone by swapping back would break the next
       backward.
    9. State derived from the tensors, on the swap path (*spec*, ``_load_steps``): it is
       dropped before the load and made again after, by ``apply``'s own override steps
       (``reference.overrides``), run in ``apply``'s order and with its failure handling
       (``_run_overridden``: after a failure they rebuild it from the restored tensors).
       - The RNN family (every ``nn.RNNBase``: ``RNN``, ``LSTM``, ``GRU``, anywhere in the
         tree) keeps weak references to its parameters, which ``swap_tensors`` refuses: the
         built-in ``RNNBase`` step drops them before and ``_init_flat_weights`` rebuilds
         ``_flat_weights`` (and the references) after, so the parameters are swapped like any
         other (rule 5); torch refuses the swap.
       - Old-style reparametrizations (``torch.nn.utils.weight_norm``, ``spectral_norm``,
         ``prune``): their computed attribute holds an autograd graph over the parameters,
         which ``swap_tensors`` refuses, so it is dropped and computed again after; torch
         refuses the swap.
       Other ``_apply`` overrides play no part in a load.
    10. Round trip (follows from 4-6): loading ``module.state_dict()`` back changes no slot
       object, class, value, tie or grad, whatever the flags and ``assign``.
    11. Inference mode: the load runs with inference mode off (``torch.inference_mode(False)``),
       as ``apply`` does (its rule 14): what it leaves in the slots is never an inference tensor
       made by it, and a tensor subclass's ``module_load`` meets the ops it meets outside.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
    swap = get_swap_module_params_on_conversion() if swap is None else swap
    load = _Load(module, swap=swap, assign=assign)
    steps = _load_steps(module) if swap else []
    _run_overridden(steps, _distinct_modules(module)[::-1],
                    lambda: _load_atomically(load, module, state_dict, strict))
    return _IncompatibleKeys(load.missing_keys, load.unexpected_keys)


def _load_atomically(load: _Load, module: nn.Module, state_dict: Mapping[str, Any],
                     strict: bool) -> None:
    """Rules 2-8 and 11: the traversal, the errors, and the rollback on any failure, with
    inference mode off."""
    with torch.inference_mode(False):
        _load_atomically_normal(load, module, state_dict, strict)


def _load_atomically_normal(load: _Load, module: nn.Module, state_dict: Mapping[str, Any],
                            strict: bool) -> None:
    """Rules 2-8: the traversal, the errors, and the rollback on any failure."""
    snapshot = _Snapshot.of(module)
    try:
        copy = _copied(state_dict)
        load.metadata = getattr(copy, "_metadata", None)
        load.given = {id(v): v.detach().clone() for v in copy.values()
                      if isinstance(v, Tensor) and not is_lazy(v)}
        load.own = _own_data_pairs([s.tensor for s in snapshot.tensors], copy.values())
        with _routed_to(load):
            load.visit(module, copy, "")
        if not load.failing(strict):
            load.flush()
        load.raise_errors(strict)
    except BaseException:
        load.undo()
        snapshot.restore()
        raise


def _load_steps(module: nn.Module) -> list[_Step]:
    """Rule 9: ``apply``'s steps for the state derived from the tensors, parents first."""
    return [_Step(m, o) for m in module.modules()
            for o in (*_rnn_steps(m), *hook_overrides_of(m))]


def _rnn_steps(module: nn.Module) -> tuple[ApplyOverride, ...]:
    """Rule 9: the built-in ``RNNBase`` step for a module of the RNN family."""
    return (BUILTIN[nn.RNNBase],) if isinstance(module, nn.RNNBase) else ()


def choose_load_path(*, swap: bool, assign: bool) -> str:
    """Rule 4: the path of every tensor of one load."""
    return SWAP if swap else ASSIGN if assign else COPY


def _copied(state_dict: Mapping[str, Any]) -> OrderedDict:
    """Rule 1: torch's copy, ``_metadata`` carried over."""
    metadata = getattr(state_dict, "_metadata", None)
    copy = OrderedDict(state_dict)
    if metadata is not None:
        copy._metadata = metadata  # type: ignore[attr-defined]
    return copy


@contextmanager
def _routed_to(load: _Load) -> Iterator[None]:
    """Rule 2: nn.Module's ``_load_from_state_dict`` is ``load.local`` for this load's modules.

    Overrides reach it through ``super()``; any other module (a hook loading another module
    with torch) gets torch's own. The previous function is restored on exit.
    """
    previous = nn.Module._load_from_state_dict

    def local(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        if id(self) in load.module_ids:
            return load.local(self, state_dict, prefix, local_metadata)
        return previous(self, state_dict, prefix, local_metadata, strict, missing, unexpected,
                        errors)

    nn.Module._load_from_state_dict = local  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module._load_from_state_dict = previous  # type: ignore[method-assign]


@dataclass
class _Loaded:
    """Rule 6: the key whose value loads one tensor object, that value, the object after, the
    object the key reached when the load began (``origin``) and whether the value is its own
    data."""

    key: str
    value: Any
    result: Tensor
    origin: int
    own: bool


@dataclass
class _Write:
    """Rule 4: one slot's write, planned during the traversal and made by ``_Load.flush``."""

    key: str
    tensor: Tensor
    value: Tensor
    path: str
    assign: bool


@dataclass
class _Load:
    """One call's state: torch's three lists, the tie table, the planned writes and the undo
    log."""

    root: nn.Module
    swap: bool
    assign: bool
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    error_msgs: list[str] = field(default_factory=list)
    loaded: dict[int, _Loaded] = field(default_factory=dict)
    pending: list[_Write] = field(default_factory=list)
    undo_log: list[Callable[[], None]] = field(default_factory=list)
    metadata: Any = None  # the state dict's ``_metadata``
    given: dict[int, Any] = field(default_factory=dict)  # id -> a copy of each given tensor
    own: set[tuple[int, int]] = field(default_factory=set)  # (id(value), id(slot)), rule 6
    module_ids: set[int] = field(init=False)

    def __post_init__(self) -> None:
        self.module_ids = {id(m) for m in self.root.modules()}

    def visit(self, module: nn.Module, local_state_dict: Mapping[str, Any], prefix: str) -> None:
        """Rule 2: torch's ``load`` closure."""
        metadata = self.metadata
        local_metadata = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
        if self.assign:
            local_metadata["assign_to_params_buffers"] = self.assign
        module._load_from_state_dict(local_state_dict, prefix, local_metadata, True,
                                     self.missing_keys, self.unexpected_keys, self.error_msgs)
        for name, child in module._modules.items():
            if child is not None:
                child_prefix = prefix + name + "."
                child_state_dict = {k: v for k, v in local_state_dict.items()
                                    if k.startswith(child_prefix)}
                self.visit(child, child_state_dict, child_prefix)
        if module._load_state_dict_post_hooks:
            self.flush()  # a post hook sees the loaded values, as torch's do
        incompatible_keys = _IncompatibleKeys(self.missing_keys, self.unexpected_keys)
        for hook in module._load_state_dict_post_hooks.values():
            if hook(module, incompatible_keys) is not None:
                raise AssertionError(
                    "Hooks registered with ``register_load_state_dict_post_hook`` are not "
                    "expected to return new values, if incompatible_keys need to be modified, "
                    "it should be done inplace."
                )

    def local(self, module: nn.Module, state_dict: Mapping[str, Any], prefix: str,
              local_metadata: dict) -> None:
        """Rules 2-3: nn.Module's ``_load_from_state_dict`` for one module."""
        for hook in module._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, True, self.missing_keys,
                 self.unexpected_keys, self.error_msgs)
        local_state = _local_state(module)
        for name, tensor in local_state.items():
            key = prefix + name
            if key in state_dict:
                self.local_tensor(module, name, tensor, key, state_dict[key], local_metadata)
            else:
                self.missing_keys.append(key)
        self._extra_state(module, state_dict, prefix)
        self._unexpected(module, state_dict, prefix, local_state)

    def local_tensor(self, module: nn.Module, name: str, tensor: Tensor, key: str, value: Any,
                     local_metadata: dict) -> None:
        """Rule 3's checks, then rule 6, then rule 4's path for one slot."""
        if not torch.overrides.is_tensor_like(value):
            self.error_msgs.append(
                f'While copying the parameter named "{key}", expected torch.Tensor or '
                f"Tensor-like object from checkpoint but received {type(value)}")
            return
        lazy = is_lazy(tensor)
        if not lazy and len(tensor.shape) == 0 and len(value.shape) == 1 and value.shape[0] == 1:
            value = value[0]
        if not lazy and value.shape != tensor.shape:
            self.error_msgs.append(
                f"size mismatch for {key}: copying a param with shape {value.shape} from "
                f"checkpoint, the shape in current model is {tensor.shape}.")
            return
        assign = local_metadata.get("assign_to_params_buffers", False)
        if tensor.is_meta and not value.is_meta and not assign:
            warnings.warn(
                f"for {key}: copying from a non-meta parameter in the checkpoint to a meta "
                "parameter in the current model, which is a no-op. (Did you mean to "
                "pass `assign=True` to assign items in the state dictionary to their "
                "corresponding key in the module instead of copying them in place?)",
                stacklevel=4,
            )
        if self.already_loaded(tensor, key, value, assign):
            return
        self.plan(tensor, key, value, assign, origin=id(tensor))

    def plan(self, tensor: Tensor, key: str, value: Any, assign: bool, *, origin: int) -> None:
        """Rules 4 and 6: ``key``'s value is the one for ``tensor``; plan its write."""
        own = (id(value), origin) in self.own
        self.loaded[id(tensor)] = _Loaded(key, value, tensor, origin, own)
        path = choose_load_path(swap=self.swap, assign=assign)
        self.pending.append(_Write(key, tensor, value, path, assign))

    def flush(self) -> None:
        """Rule 4: make the planned writes, in the traversal's order; a write that raises is
        an entry of torch's error list."""
        writes, self.pending = self.pending, []
        for w in writes:
            try:
                with torch.no_grad():
                    result = self._write(w.tensor, w.value, w.path, w.assign)
            except Exception as ex:
                action = "swapping" if w.path == SWAP else "copying"
                self.error_msgs.append(
                    f'While {action} the parameter named "{w.key}", whose dimensions in the '
                    f"model are {w.tensor.size()} and whose dimensions in the checkpoint are "
                    f"{w.value.size()}, an exception occurred : {ex.args}.")
                continue
            self.loaded[id(result)] = replace(self.loaded[id(w.tensor)], result=result)

    def failing(self, strict: bool) -> bool:
        """Rule 7: whether the errors found so far fail the load."""
        return bool(self.error_msgs) or (strict and bool(self.missing_keys or self.unexpected_keys))

    def already_loaded(self, tensor: Tensor, key: str, value: Any, assign: bool) -> bool:
        """Rule 6: whether an earlier key reached this object. Own data yields to another
        value; two different values that are not own data are an error."""
        first = self.loaded.get(id(tensor))
        if first is None:
            return False
        if (id(value), first.origin) in self.own:
            return True
        if first.own:  # its write, if not made yet, is dropped: this value replaces it
            self.pending = [w for w in self.pending if w.tensor is not tensor]
            self.plan(tensor, key, value, assign, origin=first.origin)
            return True
        if not same_value(self.as_given(first.value), self.as_given(value)):
            self.error_msgs.append(
                f'While loading the tied names "{first.key}" and "{key}": they were given '
                "different values.")
        return True

    def as_given(self, value: Any) -> Any:
        """Rule 6: ``value`` as it was when the load began (a value aliasing a slot that an
        earlier key wrote shows the written values now)."""
        return self.given.get(id(value), value)

    def _write(self, tensor: Tensor, value: Tensor, path: str, assign: bool) -> Tensor:
        """Rule 4: one slot's write along ``path``; returns the object in the slot after."""
        if path == COPY:
            tensor.copy_(value)
            return tensor
        if (assign and _own_data(tensor, value)) or (is_lazy(tensor) and is_lazy(value)):
            return tensor
        if path == ASSIGN:
            new = self._as_slot_value(tensor, value)
            self._rebind_everywhere(tensor, new)
            return new
        self._swap(tensor, value, assign)
        return tensor

    def _as_slot_value(self, tensor: Tensor, value: Tensor) -> Tensor:
        """Rule 4's assign: the value itself, or wrapped as a Parameter for a parameter slot
        (a Parameter object that only buffer slots hold is a buffer)."""
        if not isinstance(tensor, nn.Parameter) or not self._in_a_parameter_slot(tensor):
            return value
        if not isinstance(value, nn.Parameter):
            return nn.Parameter(value, requires_grad=tensor.requires_grad)
        old = value.requires_grad
        value.requires_grad_(tensor.requires_grad)
        self.undo_log.append(lambda: value.requires_grad_(old))
        return value

    def _in_a_parameter_slot(self, tensor: Tensor) -> bool:
        """Whether some parameter slot of the tree holds ``tensor``."""
        return any(held is tensor for owner in _distinct_modules(self.root)
                   for held in owner._parameters.values())

    def _rebind_everywhere(self, tensor: Tensor, new: Tensor) -> None:
        """Rule 6: every slot of the tree holding ``tensor`` gets ``new`` (undone by rule 8)."""
        for owner in _distinct_modules(self.root):
            for registry in ("_parameters", "_buffers"):
                for key, held in list(getattr(owner, registry).items()):
                    if held is tensor:
                        _put(owner, registry, key, new)

    def _swap(self, tensor: Tensor, value: Tensor, assign: bool) -> None:
        """Rules 4 and 5: ``module_load`` then ``swap_tensors``, keeping the object's identity."""
        new = tensor.module_load(value, assign=assign)
        if id(new) == id(value) or id(new) == id(tensor):
            raise RuntimeError(
                "module_load returned one of self or other, please .detach() "
                "the result if returning one of the inputs in module_load")
        is_param = isinstance(tensor, nn.Parameter)
        grad = tensor.grad if is_param else None
        if is_param:
            new = _as_swapped_parameter(tensor, new, assign)
            hooks = _tensor_hooks(tensor)
        torch.utils.swap_tensors(tensor, new)  # a refusal is rolled back by rule 8
        self.undo_log.append(lambda: torch.utils.swap_tensors(tensor, new))
        if is_param:
            _carry_tensor_hooks(hooks, tensor)
        if grad is not None:
            tensor.grad = _grad_fitting(grad, tensor)

    def _extra_state(self, module: nn.Module, state_dict: Mapping[str, Any], prefix: str) -> None:
        """Rule 3's extra state; rule 8 puts the old one back on failure."""
        key = prefix + _EXTRA_STATE_KEY_SUFFIX
        if getattr(type(module), "set_extra_state", nn.Module.set_extra_state) \
                is nn.Module.set_extra_state:
            if key in state_dict:
                self.unexpected_keys.append(key)
            return
        if key not in state_dict:
            self.missing_keys.append(key)
            return
        old = module.get_extra_state()
        module.set_extra_state(state_dict[key])
        self.undo_log.append(lambda: module.set_extra_state(old))

    def _unexpected(self, module: nn.Module, state_dict: Mapping[str, Any], prefix: str,
                    local_state: dict[str, Tensor]) -> None:
        """Rule 3: given keys under ``prefix`` naming neither a slot nor a child."""
        extra = prefix + _EXTRA_STATE_KEY_SUFFIX
        for key in state_dict:
            if key.startswith(prefix) and key != extra:
                head, *rest = key[len(prefix):].split(".", 1)
                known = head in module._modules if rest else head in local_state
                if not known:
                    self.unexpected_keys.append(key)

    def raise_errors(self, strict: bool) -> None:
        """Rule 7: torch's message."""
        errors = list(self.error_msgs)
        if strict and self.unexpected_keys:
            keys = ", ".join(f'"{k}"' for k in self.unexpected_keys)
            errors.insert(0, f"Unexpected key(s) in state_dict: {keys}. ")
        if strict and self.missing_keys:
            keys = ", ".join(f'"{k}"' for k in self.missing_keys)
            errors.insert(0, f"Missing key(s) in state_dict: {keys}. ")
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                self.root.__class__.__name__, "\n\t".join(errors)))

    def undo(self) -> None:
        """Rule 8: the logged steps, last first."""
        for step in reversed(self.undo_log):
            step()


def same_value(a: Any, b: Any) -> bool:
    """Rule 6: the same object, or tensors of one kind with equal dtype, shape, device, values."""
    if a is b:
        return True
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        return False
    if type(a.detach()) is not type(b.detach()) or _layout(a)[:3] != _layout(b)[:3]:
        return False
    if a.is_meta:
        return True
    if a.is_complex():  # compared as real pairs: XLA's isnan takes real floating dtypes only
        a, b = torch.view_as_real(a.detach().resolve_conj()), torch.view_as_real(
            b.detach().resolve_conj())
    if not a.is_floating_point():  # no NaNs (and no isnan for bool on XLA)
        return bool(torch.equal(a, b))
    nan_a, nan_b = a.isnan(), b.isnan()
    return bool(torch.equal(nan_a, nan_b) and torch.equal(a.masked_fill(nan_a, 0),
                                                          b.masked_fill(nan_b, 0)))


def _as_swapped_parameter(param: nn.Parameter, new: Tensor, assign: bool) -> nn.Parameter:
    """Rule 5: torch's Parameter wrapping of ``module_load``'s result, then the spec's identity:
    the parameter's class (unless ``assign`` or ``new`` is a subclass) and its attributes."""
    if isinstance(new, nn.Parameter):
        new.requires_grad_(param.requires_grad)
    else:
        new = nn.Parameter(new, requires_grad=param.requires_grad)
    if not assign and type(new) is nn.Parameter:
        new.__class__ = type(param)
    for name, value in param.__dict__.items():
        new.__dict__.setdefault(name, value)
    _carry_tensor_hooks(_tensor_hooks(param), new)
    return new


def _own_data_pairs(slots: Iterable[Tensor], values: Iterable[Any]) -> set[tuple[int, int]]:
    """Rule 6: ``(id(value), id(slot))`` for every given value that is a slot's own data (the
    slot itself, or an alias with its layout); slots are looked up by layout."""
    by_layout: dict[tuple, list[Tensor]] = {}
    ids = set()
    for t in slots:
        ids.add(id(t))
        if not is_lazy(t):
            by_layout.setdefault(_layout(t), []).append(t)
    pairs = set()
    for v in values:
        if id(v) in ids:  # the slot itself, lazy or not
            pairs.add((id(v), id(v)))
        elif isinstance(v, Tensor) and not is_lazy(v):
            try:
                candidates = by_layout.get(_layout(v), ())
            except (RuntimeError, TypeError):  # no shape (rule 3 reports it if it is loaded)
                continue
            pairs.update((id(v), id(t)) for t in candidates if _own_data(t, v))
    return pairs


def _own_data(tensor: Tensor, value: Tensor) -> bool:
    """Rule 4: ``value`` is the slot's own data (``state_dict()``'s detached alias of it);
    an uninitialized tensor has no data to alias."""
    return value is tensor or (
        not is_lazy(tensor) and not is_lazy(value)
        and type(value.detach()) is type(tensor.detach()) and _layout(value) == _layout(tensor)
        and bool(torch._C._is_alias_of(value, tensor)))


def _grad_fitting(grad: Tensor, param: Tensor) -> Tensor:
    """Rule 5: the grad itself when it fits the swapped-in contents, else ``.to`` them."""
    if (grad.dtype, grad.device) == (param.dtype, param.device):
        return grad
    return grad.detach().to(dtype=param.dtype, device=param.device)


def _local_state(module: nn.Module) -> dict[str, Tensor]:
    """Rule 2: non-None parameters, then non-None persistent buffers."""
    persistent = ((k, v) for k, v in module._buffers.items()
                  if k not in module._non_persistent_buffers_set)
    return {k: v for k, v in itertools.chain(module._parameters.items(), persistent)
            if v is not None}


def _distinct_modules(root: nn.Module) -> list[nn.Module]:
    return list({id(m): m for m in root.modules()}.values())


def _put(module: nn.Module, registry: str, key: str, value: Any) -> None:
    """Put ``value`` in one slot: ``setattr`` for a Parameter in a parameter slot (a module's
    ``__setattr__`` override, an RNN's flat weights, sees it), the table itself otherwise."""
    if registry == "_parameters" and isinstance(value, nn.Parameter):
        setattr(module, key, value)
    else:
        getattr(module, registry)[key] = value


def _layout(t: Tensor) -> tuple:
    """What ``.data =`` changes: dtype, shape, device, then strides, offset and address."""
    try:
        address = t.data_ptr()
    except (RuntimeError, TypeError):
        address = None
    try:
        strides = (t.stride(), t.storage_offset())
    except (RuntimeError, TypeError):
        strides = None
    return (t.dtype, tuple(t.shape), t.device, strides, address)


@dataclass
class _TensorState:
    """Rule 8: what a load can change on one tensor object."""

    tensor: Tensor
    cls: type
    attributes: dict
    requires_grad: bool
    grad: Tensor | None
    data: Tensor
    layout: tuple | None
    values: Tensor | None

    @classmethod
    def of(cls, tensor: Tensor) -> _TensorState:
        lazy = is_lazy(tensor)
        is_param = isinstance(tensor, nn.Parameter)
        data = tensor.data
        readable = not lazy and not tensor.is_meta
        return cls(tensor, type(tensor), dict(tensor.__dict__), tensor.requires_grad,
                   tensor.grad if is_param else None, data,
                   None if lazy else _layout(data),
                   tensor.detach().clone() if readable else None)

    def restore(self) -> None:
        t = self.tensor
        if type(t) is not self.cls:
            t.__class__ = self.cls
        if t.__dict__ != self.attributes:
            t.__dict__.clear()
            t.__dict__.update(self.attributes)
        if self.layout is None or _layout(t.data) != self.layout:
            t.data = self.data
        if self.values is not None and not same_value(t.detach(), self.values):
            with torch.no_grad():
                t.copy_(self.values)
        if t.is_leaf and t.requires_grad != self.requires_grad:
            t.requires_grad_(self.requires_grad)
        if isinstance(t, nn.Parameter) and t.grad is not self.grad:
            t.grad = self.grad


@dataclass
class _Snapshot:
    """Rule 8: every slot's object, every non-persistent set, every slot tensor's state."""

    slots: list[tuple[nn.Module, str, str, Any]]
    non_persistent: list[tuple[nn.Module, set[str]]]
    tensors: list[_TensorState]

    @classmethod
    def of(cls, module: nn.Module) -> _Snapshot:
        modules = _distinct_modules(module)
        slots = [(m, registry, key, value) for m in modules
                 for registry in ("_parameters", "_buffers")
                 for key, value in getattr(m, registry).items()]
        tensors = {id(v): v for *_, v in slots if isinstance(v, Tensor)}
        return cls(slots, [(m, set(m._non_persistent_buffers_set)) for m in modules],
                   [_TensorState.of(t) for t in tensors.values()])

    def restore(self) -> None:
        known = {(id(m), registry, key) for m, registry, key, _ in self.slots}
        for m, _ in self.non_persistent:
            for registry in ("_parameters", "_buffers"):
                table = getattr(m, registry)
                for key in [k for k in table if (id(m), registry, k) not in known]:
                    del table[key]  # a slot a hook or an override added
        for m, registry, key, value in self.slots:
            if getattr(m, registry).get(key, _ABSENT) is not value:
                _put(m, registry, key, value)
        for m, names in self.non_persistent:
            if m._non_persistent_buffers_set != names:
                m._non_persistent_buffers_set.clear()
                m._non_persistent_buffers_set.update(names)
        for state in self.tensors:
            state.restore()


_ABSENT = object()
