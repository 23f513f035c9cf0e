"""A model of a module's life, as plain data: what each operation must do, by the reference's spec.

The model never calls a target. It starts from a freshly built tree (read once, before any
target runs) and predicts each operation on its own copies of the values:

- **names -> slots**: every parameter and buffer name maps to one :class:`TensorState`; names that
  hold one tensor object (ties, shared submodules) map to the same one;
- **per tensor**: class, instance attributes, ``requires_grad``, dtype/device/shape and values
  (a copy the model owns; ``values_known=False`` after ``to_empty``, whose values the spec leaves
  open), and ``obj``: the object every name must still hold, where the path promises identity
  (set_data and swap keep the parameter object; the overwrite path and buffers get a new object,
  ``obj=None``, which the model adopts once it has been checked);
- **grads**: values (dense or sparse) and whether they carry an autograd graph;
- **hooks**: each counting tensor hook and how often it must have fired;
- **optimizer**: which tensor each entry of the optimizer's parameter list must still be
  (``UNNAMED``: a tensor no name holds any more, which the optimizer keeps);
- **slots**: each slot is one (module, key); a shared submodule's paths are several names of one
  slot (``slot_groups``), so re-pointing a slot re-points all its names.

Values the spec computes with torch (a conversion ``fn``, a forward, a backward, an optimizer
step) are computed here on copies: ``fresh()`` builds the tree again from its spec and loads the
model's values and grads into it, so a forward on it is the spec's forward.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from swapspec.properties.models.apply_state import expected_path, same_metadata
from swapspec.properties.models.examples import (
    loads_itself,
    named_tensors,
    own_attributes,
    value_copy,
)
from swapspec.properties.models.oracle import slot_of
from swapspec.strategies.trees import TreeSpec, build_tree

LR = 0.1  # the SGD learning rate of every optimizer the sequences build
HOOK_KINDS = ("hook", "post-accumulate")
# An optimizer entry whose tensor no name of the module holds any more (a tie re-pointed its
# last slot): the optimizer keeps the object; nothing about it is checked, and it is not stale.
UNNAMED = -1


@dataclass
class TensorState:
    """One tensor object of the module, as the spec says it must be."""

    names: tuple[str, ...]
    parameter: bool
    cls: type
    attributes: dict[str, Any] | None  # None: whatever the module holds (read at adopt)
    requires_grad: bool
    value: Tensor  # the model's own copy
    values_known: bool = True
    obj: Tensor | None = None  # the object every name must hold; None: a new one is allowed
    grad: Tensor | None = None
    grad_graph: bool = False  # the grad carries an autograd graph (backward(create_graph=True))


@dataclass
class HookState:
    """A counting hook on a parameter: ``kind`` is ``hook`` or ``post-accumulate``."""

    index: int  # the TensorState it was registered on
    key: str
    kind: str
    fired: int = 0
    live: bool = True  # False once the module no longer holds the tensor it is on (deepcopy)
    checked: bool = True  # False where a declared deviation may have lost it


@dataclass
class Prediction:
    """What an operation must return: a value (compared by ``same_output``) or an error type.

    ``may_refuse``: the spec also allows a ``RuntimeError`` that leaves the module as it was
    (a swap refused by a grad's autograd graph, reference rule 12).
    """

    result: Any = None
    error: type[BaseException] | None = None
    may_refuse: bool = False


@dataclass
class ModuleModel:
    """The predicted state of one module (see the module docstring)."""

    spec: TreeSpec
    tensors: list[TensorState]
    slots: dict[str, int]  # name -> index into tensors
    hooks: list[HookState] = field(default_factory=list)
    # the names registered as buffers (a parameter tied into a buffer slot keeps that slot a
    # buffer slot: no operation changes a slot's kind)
    buffer_names: frozenset[str] = frozenset()
    # per entry: the tensor it must be; None: stale; UNNAMED: held by no name any more
    optimizer: list[int | None] | None = None
    # A parameter was swapped while a grad's graph held autograd nodes of the module: torch
    # refuses a backward through them ("AccumulateGrad node that was poisoned by swap_tensors")
    # until the grads are cleared. No backward runs then (a misuse torch documents).
    poisoned: bool = False
    graph_backward: bool = False  # a backward(create_graph=True) ran since the grads were cleared
    # A tensor left the module while its grad carried an autograd graph: that graph lives on
    # (a reference cycle through the tensor's AccumulateGrad node) and can hold the module's
    # tensors (a batch norm saves its running stats, a linear its weight), so a swap may be
    # refused. zero_grad does not reach it; only a deepcopy (all new objects) leaves it behind.
    orphan_graph: bool = False
    # A forward's output is held with its autograd graph (the machine's ``keep_graph``): the
    # graph can hold the module's tensors (a linear saves its weight), so a swap may be refused,
    # and an AccumulateGrad node a swap poisons stays alive (no backward) until it is released.
    kept_graph: bool = False
    # Tensors a declared deviation left deaf to new hooks (clause ``after-hook-lost``): a hook
    # registered on one of them later is not held to the model either.
    deaf: set[int] = field(default_factory=set)

    # ---- reading a module (the build, and resyncing after a declared deviation) ----

    @classmethod
    def observe(cls, module: nn.Module, spec: TreeSpec) -> ModuleModel:
        """The model of a module as it is now (a fresh build, before any target runs)."""
        tensors: list[TensorState] = []
        slots: dict[str, int] = {}
        parameter_ids = {id(p) for p in module.parameters()}
        by_id: dict[int, int] = {}
        for name, t in named_tensors(module).items():
            if id(t) not in by_id:
                by_id[id(t)] = len(tensors)
                tensors.append(_state_of(t, id(t) in parameter_ids))
            slots[name] = by_id[id(t)]
            tensors[by_id[id(t)]].names += (name,)
        buffers = frozenset(name for name, _ in module.named_buffers(remove_duplicate=False))
        return cls(spec, tensors, slots, buffer_names=buffers)

    def resync(self, module: nn.Module) -> None:
        """Take the module's state as the model's (after a declared deviation), keeping hook
        counts and the optimizer entries that still point at a tensor the module holds."""
        old_objects = {i: t.obj for i, t in enumerate(self.tensors)}
        fresh = ModuleModel.observe(module, self.spec)
        index_of = {id(t.obj): i for i, t in enumerate(fresh.tensors)}
        remap = {i: index_of.get(id(o)) for i, o in old_objects.items() if o is not None}
        for hook in self.hooks:
            hook.index = remap.get(hook.index)
            hook.live = hook.live and hook.index is not None
        if self.optimizer is not None:
            self.optimizer = [i if i in (None, UNNAMED) else remap.get(i) for i in self.optimizer]
        self.tensors, self.slots, self.buffer_names = fresh.tensors, fresh.slots, fresh.buffer_names

    def adopt(self, module: nn.Module) -> None:
        """After a check: take the module's new objects where a new one was allowed, its values
        where the spec leaves them open (``to_empty``) and its parameters' attributes where
        torch's own step decides them (``deepcopy``)."""
        named = named_tensors(module)
        for state in self.tensors:
            now = named.get(state.names[0])
            if now is None:
                continue
            if state.obj is None:
                state.obj = now
            if state.attributes is None:
                state.attributes = own_attributes(now) if state.parameter else {}
            if not state.values_known:
                state.value = _copy(now)
                state.grad = None if now.grad is None or not isinstance(now, nn.Parameter) \
                    else _copy(now.grad)
                state.values_known = True

    def snapshot(self) -> ModuleModel:
        """A copy to go back to (tensor values are never changed in place)."""
        return dataclasses.replace(
            self, tensors=[dataclasses.replace(t) for t in self.tensors], slots=dict(self.slots),
            hooks=[dataclasses.replace(h) for h in self.hooks], deaf=set(self.deaf),
            optimizer=None if self.optimizer is None else list(self.optimizer))

    # ---- the spec's copies -----------------------------------------------------------

    def fresh(self) -> tuple[nn.Module, dict[int, Tensor]]:
        """A fresh build of the tree holding copies of the model's values and grads (one copy
        per tensor, so ties stay ties), and ``{index: the copy's tensor}``."""
        copy = build_tree(self.spec)
        objects: dict[int, Tensor] = {}
        for i, state in enumerate(self.tensors):
            value = _copy(state.value)
            if holds_parameter_object(state):
                value = nn.Parameter(value, requires_grad=state.requires_grad)
                value.grad = None if state.grad is None else _copy(state.grad)
            objects[i] = value
            for name in state.names:
                _set_slot(copy, name, value)
        return copy, objects

    # ---- operations ------------------------------------------------------------------

    def holds_graphs(self) -> bool:
        """Whether an autograd graph may hold the module's tensors: a forward's output is held
        (``kept_graph``), a ``backward(create_graph=True)`` ran since the grads were cleared, a
        grad carries one, or a tensor that left the module carried one (``orphan_graph``)."""
        return (self.kept_graph or self.graph_backward or self.orphan_graph
                or any(t.grad_graph for t in self.tensors))

    def convert(self, make_fn: Callable[[], Callable], overwrite: bool, swap: bool,
                preserves_values: bool = True) -> Prediction:
        """``apply(module, fn, overwrite=..., swap=...)`` (reference rules 3-8, 11, 12).

        Predicts an error (and no change) where ``fn`` raises on the copies. Without
        ``preserves_values`` (``to_empty``) the values and grads are left open."""
        fn = make_fn()
        new: list[TensorState] = []
        may_refuse = False
        try:
            with torch.no_grad():
                inputs = {i: _copy(t.value) for i, t in enumerate(self.tensors)}
                results = {i: fn(v) for i, v in inputs.items()}
                grads = {i: fn(_copy(t.grad)) for i, t in enumerate(self.tensors)
                         if t.parameter and t.grad is not None}
        except Exception as e:
            return Prediction(error=type(e))
        graphs = self.holds_graphs()
        for i, state in enumerate(self.tensors):
            applied = results[i]
            path = (expected_path(state.value, applied, overwrite, swap) if state.parameter
                    else "rebind")
            may_refuse |= path == "swap" and graphs
            keeps = path in ("set_data", "swap")
            self.orphan_graph |= not keeps and state.grad_graph
            # a buffer slot whose fn returned its input keeps its object, and so its grad
            kept_grad = state.grad if applied is inputs[i] and not state.parameter else None
            new.append(dataclasses.replace(
                state, value=_copy(applied), values_known=state.values_known and preserves_values,
                obj=state.obj if keeps else None,
                grad=_copy(grads[i]) if i in grads else kept_grad))
        self.tensors = new
        self.poisoned |= may_refuse
        self._mark_stale_entries()
        return Prediction(result=None, may_refuse=may_refuse)

    def forward(self, x: Tensor, *, backward: str = "", given: dict[str, Tensor] | None = None,
                tie_weights: bool = True) -> Prediction:
        """A forward on ``x`` (with ``backward`` ``plain`` or ``create-graph``: then
        ``out.float().sum().backward()``), optionally as a ``functional_call`` with ``given``
        tensors. The model takes the copy's effects: buffers forward updated or rebound, grads,
        hook firings; the tensors given to a call keep their values and objects."""
        copy, objects = self.fresh()
        given_indices = self._load_given(copy, given or {}, tie_weights)
        before = {name: t for name, t in named_tensors(copy).items()}
        fired: Counter[int] = Counter()
        for n, hook in enumerate(self.hooks):
            if hook.live and hook.index is not None:
                _count(objects[hook.index], hook.kind, fired, n)
        outcome = _run(copy, x, backward)
        self.graph_backward |= backward == "create-graph"
        after = named_tensors(copy)
        states: list[TensorState] = []
        remap: dict[int, int] = {}
        for i, state in enumerate(self.tensors):
            remap[i] = len(states)
            if i in given_indices:
                states.append(state)
                continue
            groups: dict[int, list[str]] = {}
            for name in state.names:  # forward may rebind some names of a tie (and split it)
                groups.setdefault(id(after[name]), []).append(name)
            for names in groups.values():
                now = after[names[0]]
                grad = now.grad if isinstance(now, nn.Parameter) else None
                states.append(dataclasses.replace(
                    state, names=tuple(names), value=_copy(now),
                    obj=state.obj if now is before[names[0]] else None,
                    grad=None if grad is None else _copy(grad),
                    grad_graph=state.grad_graph or (grad is not None and grad.grad_fn is not None)))
        self._renumber(states, remap)
        for n, hook in enumerate(self.hooks):
            hook.fired += fired[n]
        return outcome

    def _renumber(self, states: list[TensorState], remap: dict[int, int]) -> None:
        """Take ``states`` as the tensors; ``remap`` maps old indices to new ones."""
        self.tensors = states
        self.slots = {name: i for i, state in enumerate(states) for name in state.names}
        for hook in self.hooks:
            hook.index = None if hook.index is None else remap[hook.index]
        if self.optimizer is not None:
            self.optimizer = [i if i in (None, UNNAMED) else remap[i] for i in self.optimizer]

    def _mark_stale_entries(self) -> None:
        """An optimizer entry whose tensor got a new object is stale (``None``)."""
        if self.optimizer is not None:
            self.optimizer = [i if i == UNNAMED or (i is not None and self.tensors[i].obj is not None)
                              else None for i in self.optimizer]

    def _load_given(self, copy: nn.Module, given: dict[str, Tensor], tie_weights: bool) -> set[int]:
        """Put the call's tensors in the copy's slots for good; return the indices they fill."""
        filled: set[int] = set()
        copies = {id(v): _copy(v) for v in given.values()}  # one copy per given object
        for name, value in given.items():
            index = self.slots[name]
            names = self.tensors[index].names if tie_weights else (name,)
            for n in names:
                _set_slot(copy, n, copies[id(value)])
            filled.add(index)
        return filled

    def zero_grad(self, set_to_none: bool) -> None:
        """``module.zero_grad(set_to_none)``: grads become None, or zeros without a graph; a
        poisoned node a held graph keeps alive stays poisoned."""
        self.poisoned = self.poisoned and self.kept_graph
        self.graph_backward = False
        for state in self.tensors:
            if not state.parameter:  # module.parameters() does not reach it
                continue
            if state.grad is not None:
                state.grad = None if set_to_none else torch.zeros_like(state.grad)
            state.grad_graph = False

    def requires_grad_(self, requires_grad: bool) -> Prediction:
        """``module.requires_grad_(requires_grad)``: every parameter gets ``requires_grad``;
        buffers, grads and objects stay. ``True`` with an integral parameter raises
        ``RuntimeError`` before anything changes (the reference's ``Methods.requires_grad_``)."""
        params = [state for state in self.tensors if state.parameter]
        if requires_grad and any(not (s.value.is_floating_point() or s.value.is_complex())
                                 for s in params):
            return Prediction(error=RuntimeError)
        for state in params:
            state.requires_grad = requires_grad
        return Prediction()

    def in_place_on_fresh(self, operation: Callable[[nn.Module], Any]) -> Prediction:
        """An operation that writes tensors and grads in place and rebinds no slot
        (``Module.apply`` of a weight-init function, a grad clipping call): the model takes its
        effect on a fresh build holding the model's values and grads; objects, ties, classes
        and hooks stay. An error there is the prediction (nothing changes)."""
        copy, objects = self.fresh()
        try:
            result = operation(copy)
        except Exception as e:
            return Prediction(error=type(e))
        for i, state in enumerate(self.tensors):
            now = objects[i]
            state.value = _copy(now)
            if holds_parameter_object(state):
                state.grad = None if now.grad is None else _copy(now.grad)
        return Prediction(result=result)

    def build_optimizer(self, indices: list[int]) -> None:
        """An optimizer over these tensors, in this order."""
        self.optimizer = list(indices)

    def optimizer_step(self) -> Prediction:
        """``SGD(lr=LR, foreach=False).step()``: ``p.add_(grad, alpha=-LR)`` for every entry
        that has a grad (the model holds no stale entry: see ``drop_stale_optimizer``; an
        ``UNNAMED`` entry's update changes nothing the module holds). An error of that update on
        the copies is the prediction (nothing changes)."""
        updated: dict[int, Tensor] = {}
        try:
            with torch.no_grad():
                for i in self.optimizer or ():
                    if i == UNNAMED:
                        continue
                    state = self.tensors[i]
                    if state.grad is not None:
                        updated[i] = _copy(state.value).add_(state.grad, alpha=-LR)
        except Exception as e:
            return Prediction(error=type(e))
        for i, value in updated.items():
            self.tensors[i].value = value
        return Prediction()

    def drop_stale_optimizer(self) -> bool:
        """Forget an optimizer with a stale entry (its tensor got a new object); return whether
        one was dropped. What a stale optimizer's step does is not the spec's business (it can
        share storage with the new object): the user builds a new one, and so does a later step."""
        if self.optimizer is None or all(i is not None for i in self.optimizer):
            return False
        self.optimizer = None
        return True

    def add_hooks(self, index: int, key: str) -> None:
        """Counting hooks of every kind on tensor ``index``, held to the model unless a
        declared deviation left that tensor deaf to new hooks."""
        for kind in HOOK_KINDS:
            self.hooks.append(HookState(index, f"{key}:{kind}", kind, checked=index not in self.deaf))

    def deepcopied(self) -> None:
        """``copy.deepcopy(module)``: same values in new objects, parameters without grads
        (``Parameter.__deepcopy__`` copies the data only); tensor hooks and the optimizer stay
        with the old objects, and the new objects take new hooks."""
        self.poisoned = self.graph_backward = self.orphan_graph = self.kept_graph = False
        self.deaf = set()
        for state in self.tensors:
            state.obj = None
            state.grad, state.grad_graph = None, False
            state.attributes = None  # Parameter.__deepcopy__ drops them too: read at adopt
        for hook in self.hooks:
            hook.live = False
        if self.optimizer is not None:
            self.optimizer = [None] * len(self.optimizer)

    def load(self, values: dict[int, Tensor], *, assign: bool, swap: bool,
             own: bool) -> Prediction:
        """``load_state_dict`` of ``values`` (tensor index -> the value its first key gives;
        ``own``: each value is the slot's own data, as ``state_dict()`` gives it), by
        ``reference.load_state_dict``'s rules 4-6 and 10, strict, every key given and fitting:

        - ``own`` with ``assign``: nothing changes, on either path;
        - copy (no flag, no ``assign``): ``slot.copy_(value)``: the slot's dtype and device
          (a meta slot stays meta), object, class, attributes, grad, hooks and optimizer kept;
        - assign (no flag): a buffer slot holds the value itself; a parameter slot a new
          ``nn.Parameter(value)`` with the slot's ``requires_grad``, no grad, no attributes,
          whose hooks and optimizer entries are the old object's (no longer the module's);
        - swap (the flag): ``module_load`` then ``swap_tensors``: the object stays with its
          attributes, ``requires_grad``, hooks and optimizer entries; values as copy gives them
          (``assign``: the value's dtype and device, class ``nn.Parameter`` unless the class
          has its own ``module_load``: ``loads_itself``); the grad stays,
          ``.to`` the new dtype and device where they differ (then without a graph).

        Every name of a tie holds one object after. An error computing the values on the
        copies is the prediction (nothing changes). A swap while a grad's graph holds the
        module's autograd nodes may be refused (``may_refuse``) and poisons them either way.
        """
        if own and assign:
            return Prediction()
        path = "swap" if swap else "assign" if assign else "copy"
        try:
            new = {i: self._loaded_state(self.tensors[i], v, path, assign)
                   for i, v in values.items()}
        except Exception as e:
            return Prediction(error=type(e))
        may_refuse = path == "swap" and bool(values) and self.holds_graphs()
        self.poisoned |= may_refuse
        for i, state in new.items():
            self.orphan_graph |= self.tensors[i].grad_graph and state.obj is None
            self.tensors[i] = state
        for hook in self.hooks:
            hook.live = hook.live and (hook.index is None or self.tensors[hook.index].obj is not None)
        self._mark_stale_entries()
        return Prediction(may_refuse=may_refuse)

    @staticmethod
    def _loaded_state(state: TensorState, value: Tensor, path: str, assign: bool) -> TensorState:
        """One tensor after a load along ``path`` (see ``load``), computed on copies."""
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a copy into a meta slot is a no-op
            if path == "assign" and not state.parameter:
                return dataclasses.replace(state, cls=type(value), value=_copy(value), obj=value,
                                           grad=None, grad_graph=False)
            if path == "assign":
                return dataclasses.replace(
                    state, cls=parameter_class(value), attributes={}, value=_copy(value), obj=None,
                    grad=None, grad_graph=False)
            if path == "copy" or not assign:
                return dataclasses.replace(state, value=_copy(state.value).copy_(value))
            grad, graph = state.grad, state.grad_graph
            if grad is not None and (grad.dtype, grad.device) != (value.dtype, value.device):
                grad, graph = _copy(grad).to(dtype=value.dtype, device=value.device), False
            kept = not state.parameter or loads_itself(state.cls)
            return dataclasses.replace(
                state, cls=state.cls if kept else parameter_class(value),
                value=_copy(value), grad=grad, grad_graph=graph)

    # ---- ties ------------------------------------------------------------------------

    def slot_groups(self) -> tuple[tuple[str, ...], ...]:
        """The names of each slot the model holds a tensor in, in ``named_tensors`` order (see
        ``_slot_groups``)."""
        return tuple(names for names in _slot_groups(self.spec)
                     if all(n in self.slots for n in names))

    def tie_choices(self) -> list[tuple[tuple[str, ...], int]]:
        """(a slot's names, a tensor index) pairs a tie may draw: the tensor is of the slot's
        kind (a parameter into a parameter slot, a plain tensor into a buffer slot: a Parameter
        set on a buffer's key would make it a parameter) and holds the slot's dtype, device and
        shape, so a forward still runs; the slot does not hold it yet."""
        choices = []
        for names in self.slot_groups():
            here = self.tensors[self.slots[names[0]]]
            parameter_slot = names[0] not in self.buffer_names
            for j, other in enumerate(self.tensors):
                if other is not here and other.parameter == parameter_slot \
                        and same_metadata(other.value, here.value):
                    choices.append((names, j))
        return choices

    def untie_choices(self) -> list[tuple[str, ...]]:
        """The slots an untie may draw: those whose tensor another slot holds too."""
        return [names for names in self.slot_groups()
                if len(self.tensors[self.slots[names[0]]].names) > len(names)]

    def tie(self, names: tuple[str, ...], index: int) -> Prediction:
        """``setattr(owner, key, tensor)``: slot ``names`` (all its names) holds tensor
        ``index`` from now on, which keeps its object, class, attributes, values, grad, hooks
        and optimizer entries. The slot's old tensor loses these names; left with none, it
        drops out of the model: its hooks never fire again (backward does not reach it) and
        its optimizer entries become ``UNNAMED`` (the optimizer still holds it)."""
        old = self.slots[names[0]]
        target = self.tensors[index]
        self.tensors[index] = dataclasses.replace(target, names=(*target.names, *names))
        self._drop_names(old, names)
        return Prediction()

    def untie(self, names: tuple[str, ...]) -> Prediction:
        """Slot ``names`` gets its own copy of its tensor (a new ``nn.Parameter`` of the same
        values and ``requires_grad``, or a buffer's ``detach().clone()``): a new object, of
        class ``nn.Parameter`` without attributes, grad or hooks, in no optimizer. The tensor
        keeps its other names, object, grad, hooks and optimizer entries. The copy is of the
        slot's kind: a buffer slot holding a parameter gets a buffer."""
        state = self.tensors[self.slots[names[0]]]
        parameter = names[0] not in self.buffer_names
        self.tensors.append(TensorState(
            names=names, parameter=parameter,
            cls=parameter_class(state.value) if parameter else Tensor, attributes={},
            requires_grad=state.requires_grad if parameter else False,
            value=_copy(state.value), values_known=state.values_known))
        self._drop_names(self.slots[names[0]], names)
        return Prediction()

    def _drop_names(self, index: int, names: tuple[str, ...]) -> None:
        """Tensor ``index`` no longer holds ``names``; left with none, it is forgotten. A
        parameter left in buffer slots only is no parameter of the module any more
        (``parameters()`` and ``requires_grad_`` no longer reach it), though its class stays."""
        state = self.tensors[index]
        left = tuple(n for n in state.names if n not in names)
        parameter = state.parameter and (not left or any(n not in self.buffer_names for n in left))
        self.tensors[index] = dataclasses.replace(state, names=left, parameter=parameter)
        self.orphan_graph |= state.grad_graph and not self.tensors[index].names
        kept = [i for i, t in enumerate(self.tensors) if t.names]
        remap = {i: kept.index(i) if i in kept else None for i in range(len(self.tensors))}
        if self.optimizer is not None:
            self.optimizer = [UNNAMED if i is not None and i != UNNAMED and remap[i] is None
                              else i for i in self.optimizer]
        self._renumber([self.tensors[i] for i in kept], remap)

    # ---- vmap ------------------------------------------------------------------------

    def vmap_call(self, x: Tensor, copies: list[dict[int, Tensor]]) -> Prediction:
        """``torch.func.vmap(lambda p, x: functional_call(module, p, (x,), {}), in_dims=(0,
        None))`` with every name of tensor ``i`` given ``torch.stack`` of the copies' ``i``-th
        values: the module is left as it was (every tensor is given), and the output is the
        same vmap over a fresh build whose slots hold the stacked values, which is the stack of
        one forward per copy (vmap's batched kernels round as any target's do under vmap: one
        forward per copy can differ in the last bit). Where that vmap raises (a batching rule
        torch lacks, values on ``meta``), the prediction is its error type."""
        copy, _ = self.fresh()
        stacked = {i: torch.stack([_copy(c[i]) for c in copies]) for i in range(len(self.tensors))}

        def call(given: dict[int, Tensor], inputs: Tensor) -> Tensor:
            for i, value in given.items():
                for name in self.tensors[i].names:
                    _set_slot(copy, name, value)
            return copy(inputs)

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a batching rule's fallback warns
                out = torch.func.vmap(call, in_dims=(0, None))(stacked, x.clone())
        except Exception as e:
            return Prediction(error=type(e))
        return Prediction(result=out.detach())

    def stop_checking_hooks(self, indices: Iterable[int], later: bool = False) -> None:
        """Hooks on these tensors may have been lost by a declared deviation; ``later``: so
        may every hook registered on them from now on."""
        wanted = set(indices)
        if later:
            self.deaf |= wanted
        for hook in self.hooks:
            hook.checked = hook.checked and hook.index not in wanted


def _state_of(t: Tensor, parameter: bool) -> TensorState:
    grad = t.grad if isinstance(t, nn.Parameter) else None
    return TensorState(
        names=(), parameter=parameter, cls=type(t), attributes=own_attributes(t) if parameter else {},
        requires_grad=t.requires_grad, value=_copy(t), obj=t,
        grad=None if grad is None else _copy(grad),
        grad_graph=grad is not None and grad.grad_fn is not None)


def holds_parameter_object(state: TensorState) -> bool:
    """Whether the tensor is an ``nn.Parameter`` object, a parameter of the module or one left
    in buffer slots only: either way it carries a grad, which backward and an optimizer reach."""
    return state.parameter or issubclass(state.cls, nn.Parameter)


@functools.lru_cache(maxsize=256)
def _slot_groups(spec: TreeSpec) -> tuple[tuple[str, ...], ...]:
    """The names of each slot of the tree, read on a fresh build: a slot is one (module, key),
    and no step changes which module owns which key (a shared submodule's paths stay one
    slot, a deep copy keeps the sharing)."""
    built = build_tree(spec)
    groups: dict[Any, list[str]] = {}
    for name in named_tensors(built):
        groups.setdefault(slot_of(built, name), []).append(name)
    return tuple(tuple(names) for names in groups.values())


def parameter_class(value: Tensor) -> type:
    """The class ``nn.Parameter(value)`` has: ``nn.Parameter`` for a plain tensor (or a
    parameter), else ``value``'s own class (a tensor subclass is flagged ``_is_param``, not
    rewrapped)."""
    return nn.Parameter if type(value) in (Tensor, nn.Parameter) else type(value)


def _copy(t: Tensor) -> Tensor:
    """A detached copy the model owns (meta tensors stay meta)."""
    return value_copy(t)


def _set_slot(module: nn.Module, name: str, value: Tensor) -> None:
    """Put ``value`` in slot ``name`` of ``module``: a Parameter into a parameter slot through
    ``setattr`` (modules deriving state from their parameters see it), anything else straight
    into the slot's table, as ``functional_call`` puts a given tensor (a parameter tied into a
    buffer slot stays in the buffer table)."""
    prefix, _, key = name.rpartition(".")
    owner = module.get_submodule(prefix) if prefix else module
    if isinstance(value, nn.Parameter) and key not in owner._buffers:
        setattr(owner, key, value)
    elif key in owner._parameters:
        owner._parameters[key] = value
    else:
        owner._buffers[key] = value


def _count(t: Tensor, kind: str, fired: Counter, n: int) -> None:
    if not t.requires_grad:
        return
    if kind == "hook":
        t.register_hook(lambda g: fired.update([n]))
    else:
        t.register_post_accumulate_grad_hook(lambda p: fired.update([n]))


def _run(module: nn.Module, x: Tensor, backward: str) -> Prediction:
    """Forward (and backward) on the copy, as the machine runs them on the module."""
    try:
        with torch.enable_grad() if backward else torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # create_graph=True warns of a cycle
            out = module(x.clone())
            if backward and out.requires_grad:
                out.float().sum().backward(create_graph=backward == "create-graph")
    except Exception as e:
        return Prediction(error=type(e))
    return Prediction(result=out.detach())
