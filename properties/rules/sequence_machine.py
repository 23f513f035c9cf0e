"""The sequence machine: a module's life, step by step, held to the model after every step.

``SequenceMachine`` is a ``hypothesis.stateful.RuleBasedStateMachine``. Its first step builds a
module from the tree strategy; each later step is one rule, drawn with its arguments:

- ``convert``: ``target.apply`` with a drawn conversion and flags (``half()``, ``to_empty``,
  ``share_memory()``, ``to('meta')``...);
- ``functional_call``: ``target.functional_call`` with drawn tensors, ``tie_weights`` and form,
  or ``vmap``: ``torch.func.vmap`` of it over 2 or 3 stacked copies of every parameter and
  buffer (``in_dims=(0, None)``);
- ``tie``: a slot re-pointed at another tensor of its kind, dtype and shape
  (``setattr(owner, key, tensor)``), or one slot of a tie given its own copy (untie);
- ``load_state_dict``: ``target.load_state_dict`` (only for targets that have one);
- ``backward`` (``create_graph`` either way), ``build_optimizer``/``optimizer_step`` (SGD),
  ``zero_grad`` (``set_to_none`` either way), ``clip_grads`` (a ``torch.nn.utils.clip_grad_*``
  call), ``requires_grad_`` (either way: the target's method), ``register_hooks`` (counting
  tensor hooks), ``optimizer_reload`` (``opt.load_state_dict`` of the state dict saved at its
  build), ``module_apply`` (``Module.apply`` of a weight-init function), ``keep_graph``
  (a forward's output held with its graph, or released),
  ``state_dict_round_trip`` (torch's own ``state_dict``/``load_state_dict``) and ``deepcopy``.

Conversions and loads run under the default dtype the build drew (torch's, or float64), the
torch mode it drew (``MODE_CHOICES``: a pass-through function or dispatch mode, or none) and,
in a quarter of the lives, under ``torch.inference_mode()`` (``INFERENCE_CHOICES``), and
every step under the global module hooks it drew (``GLOBAL_HOOKS``: forward, full backward or
non-full backward hooks that do nothing, or none).

The model (:mod:`~swapspec.properties.models.module_model`) predicts each step first, without calling
the target; after the step the machine checks one invariant, chosen per property:

- ``SEQ-STATE``: the module matches the model slot by slot (objects where identity is promised,
  ties, class, attributes, ``requires_grad``, dtype/device/shape/values, grads);
- ``SEQ-FORWARD``: a forward of the module equals the forward of a fresh build holding the
  model's values (after every step), and a functional call returns what the model's does;
- ``SEQ-HOOKS``: every counting hook fired as often as the model says;
- ``SEQ-OPTIMIZER``: the optimizer holds the module's parameters wherever the path promised
  identity.

Every property also checks that the step raised only where the model raised, and that no global
state changed (torch's and the reference's flags, default dtype, grad mode, the RNGs).

Declared deviations (see :class:`StepCheck`) are matched per step: a step is judged against the
target's declarations for the one-shot properties that cover that kind of step (an ``apply``
step: the ``APPLY-*`` properties; a functional call: the ``FC-*`` ones and
``TOGETHER-CONVERTED-CALL``) and for the sequence property itself, each predicate seeing that
step's example. After a declared deviation the model takes the module's state as its own, so
one known torch behaviour does not fail every later step.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import random
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.modules.module as module_globals
import torch.utils.deterministic
from hypothesis import HealthCheck, event, reproduce_failure, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from torch import Tensor, nn

from swapspec import reference
from swapspec.properties.harness import pairs
from swapspec.properties.harness import sequence_repro as repro
from swapspec.properties.harness.heap import freeze_heap, unfreeze_heap
from swapspec.properties.harness.isolation import global_module_hooks, restore_global_module_hooks
from swapspec.properties.harness.sequence_replay import REPLAY
from swapspec.properties.harness.step_checker import StepCheck
from swapspec.properties.models.apply_state import conversion_named
from swapspec.properties.models.examples import StepExample, named_tensors
from swapspec.properties.models.module_model import LR, ModuleModel, Prediction
from swapspec.properties.models.outcomes import Outcome, attempt
from swapspec.properties.rules.sequence_checks import (
    FORWARD,
    HOOKS,
    OPTIMIZER,
    STATE,
    check_hooks,
    check_optimizer,
    check_state,
    step_invariants,
    step_snapshot,
)
from swapspec.properties.rules.sequence_values import (
    agrees,
    count_hooks,
    given_value,
    graph_forward,
    load_value,
    no_grad_forward,
    own_copy,
    run_backward,
    shifted,
    shown,
    slot_owner,
    trainable,
    vmapped_call,
)
from swapspec.properties.vocabulary import Violation
from swapspec.strategies import (
    CallInput,
    LoadInput,
    flag_settings,
    forward_inputs,
    module_trees,
    tree_info,
)
from swapspec.strategies.constructions import default_dtype
from swapspec.strategies.conversions import among, trainable_on_cpu
from swapspec.strategies.decorations import OLD_STYLE
from swapspec.strategies.host_leaves import HostLeaf
from swapspec.strategies.host_material import host_material
from swapspec.strategies.method_calls import METHOD_CONVERSIONS
from swapspec.strategies.modes import MODE_CLASSES, MODES, active_mode
from swapspec.strategies.module_steps import GradClip, grad_clips, module_fn_source, module_fns

# The rules of the machine, by the step names ``begin`` gives them: ordered pairs of them
# (``properties.harness.pairs``) are what the report measures and the pair schedule runs.
# ``module_apply``, ``clip_grads``, ``optimizer_reload`` and ``keep_graph``/``release_graph``
# run in free sequences only: their ordered pairs (165 more per target) would take the
# CI-profile run of the built-in targets past its 5-minute budget.
RULES = ("convert", "functional_call", "vmap", "tie", "untie", "load_state_dict", "backward",
         "build_optimizer", "optimizer_step", "zero_grad", "requires_grad_", "register_hooks",
         "state_dict_round_trip", "deepcopy")


# Conversions a module goes through in a life on CPU: casts, moves, to_empty after a meta move.
SEQUENCE_CONVERSIONS = ("float()", "half()", "double()", "bfloat16()", "to(torch.float64)",
                        "cpu()", "share_memory()", "to(memory_format=torch.channels_last)",
                        "add(1)", "to('meta')", "to_empty(device='cpu')")


# A life uses a few conversions again and again (to the device and back, half() for inference,
# float() to train again): each sequence draws a palette of up to PALETTE of them at its build.
PALETTE = 2


# A palette holds conversions as ``_apply(fn)`` and as the public method call whose per-tensor
# function they are (``module.half()``: ``conversion.call``; not ``share_memory()``: on a wrapper
# subclass torch's kills the interpreter, the modelled fn passes those by). The palette, not the
# convert step, draws the form: an extra draw per step reshuffles the derandomized sequences.
PUBLIC_FORMS = {"float()": "module.float()", "half()": "module.half()",
                "double()": "module.double()", "bfloat16()": "module.bfloat16()",
                "to(torch.float64)": "module.to(torch.float64)", "cpu()": "module.cpu()",
                "to(memory_format=torch.channels_last)": "module.to(memory_format=torch.channels_last)",
                "to('meta')": "module.to(device='meta')",
                "to_empty(device='cpu')": "module.to_empty(device='cpu')"}
PUBLIC_FORMS = {name: next(c for c in METHOD_CONVERSIONS if c.name == public)
                for name, public in PUBLIC_FORMS.items()}


def _call_method(target: Any, module: nn.Module, call: Any, flags: Any) -> Any:
    """The public method call on the target (``Target.method``), under the drawn flags."""
    args, kwargs = call.args()
    return target.method(call.method)(module, *args, overwrite=flags.overwrite, swap=flags.swap,
                                      **kwargs)


PALETTE_CHOICES = (*(conversion_named(n) for n in SEQUENCE_CONVERSIONS), *PUBLIC_FORMS.values())
_BUILTIN_PALETTES = st.lists(st.sampled_from(PALETTE_CHOICES), min_size=1, max_size=PALETTE,
                             unique_by=lambda c: c.name)


@st.composite
def _palettes(draw: Any) -> list[Any]:
    """A palette of the conversions above or, for a target with its own conversions, of those
    and the target's that keep a module trainable (``Conversion.trainable``), each one chance in
    two. A target without them draws exactly the built-in palettes."""
    if host_material().conversions is None:
        return draw(_BUILTIN_PALETTES)
    return draw(st.lists(among(PALETTE_CHOICES, host=trainable_on_cpu), min_size=1,
                         max_size=PALETTE, unique_by=lambda c: c.name))


palettes = _palettes()


trees = module_trees(max_depth=2, max_leaves=3, lazy=False, catalogue=False, wrappers=())




# Copies a vmap step stacks, each the slot's values shifted 0, 1 or 2 times (``given_value``).
VMAP_COPIES = (2, 3)


HOOK_LOSS_CLAUSES = ("before-hook-lost", "after-hook-lost", "tensor-hooks")


# What a load step gives each tensor key: other values of the slot's dtype, other values in
# float64 (floating slots), the module's own state_dict() (a round trip), or other values with
# one key of a wrong shape (the load fails and changes nothing).
LOAD_KINDS = ("other-values", "float64", "own", "wrong-shape")


# A free sequence's ``requires_grad_`` argument: True three times in four, so a module frozen by
# ``requires_grad_(False)`` is soon trainable again and the training steps that need a trainable
# parameter (hooks, the optimizer) keep their share of the steps.
UNFREEZE_MOSTLY = st.sampled_from((True, True, True, False))


# The default dtype a life runs its conversions and loads under, drawn at the build: torch's
# own, or float64 as a program that sets it first has (no operation of the three may read it).
DEFAULT_DTYPES = (torch.float32, torch.float64)


# The torch mode a life runs the target's conversions and loads under, drawn at the build (none
# in half the lives): a pass-through ``TorchFunctionMode`` or ``TorchDispatchMode``
# (``strategies.modes``), under which each must do exactly what it does without one.
MODE_CHOICES = (None, None, *MODES)


# Whether a life runs the target's conversions and loads under ``torch.inference_mode()``, drawn
# at the build (in a quarter of the lives), as serving code that converts a loaded model inside
# its inference block does; the rest of the life (training steps included) runs outside it. The
# spec's conversion leaves no inference tensor behind (``reference.apply``, rule 14), so the
# model predicts the same as without it.
INFERENCE_CHOICES = (False, False, False, True)


# Global module hooks a life runs under, drawn at the build (none in half the lives): each kind's
# ``torch.nn.modules.module`` registration functions, each given a hook that does nothing. They
# fire for every module's call (the model's fresh builds too); full backward hooks wrap every
# module's inputs and outputs in ``BackwardHookFunction``. The teardown puts torch's global hook
# state back as the machine found it (tables and the backward hooks' kind, which torch never
# resets: ``properties.harness.isolation.GLOBAL_BACKWARD_KIND``).
GLOBAL_HOOKS = {
    "forward": ("register_module_forward_pre_hook", "register_module_forward_hook"),
    "full backward": ("register_module_full_backward_pre_hook",
                      "register_module_full_backward_hook"),
    "backward": ("register_module_backward_hook",),
}
GLOBAL_HOOK_CHOICES = (None, None, None, *GLOBAL_HOOKS)


def tie_slot(owner: nn.Module, key: str, tensor: Tensor, persistent: bool | None) -> None:
    """Give ``owner``'s slot ``key`` the tensor ``tensor``: ``setattr`` for a parameter slot
    (``persistent`` None), ``register_buffer`` for a buffer slot, which keeps it a buffer slot
    even where ``tensor`` is a ``Parameter`` (``setattr`` would make it a parameter slot)."""
    if persistent is None:
        setattr(owner, key, tensor)
    else:
        owner.register_buffer(key, tensor, persistent=persistent)


def no_op_hook(*args: Any) -> None:
    """A global module hook that changes nothing."""


def skip_raising(step: str, prediction: Prediction) -> bool:
    """Whether an in-place step (a clipping call, ``Module.apply`` of a function) is not run
    because it raises on a fresh build: torch's utilities and a user's function write tensor by
    tensor and can raise midway (``clip_grad_value_`` on a complex grad), which no rule of the
    family covers; the step's event says so."""
    if prediction.error is None:
        return False
    event(f"{step}: not run (raises {prediction.error.__name__} on a fresh build)")
    return True


# Budget: steps per sequence, and the share of the profile's max_examples a sequence property
# runs (a sequence costs about as much as STEPS one-shot examples). 15 steps: a bug that needs
# three steps in order (convert, backward, convert) is met in far fewer sequences than with 10
# (docs/sequences.md, "Ordered pairs of rules").
STEPS = 15


EXAMPLES_DIVISOR = 3


def global_state() -> tuple:
    """What no step may change: the flags, default dtype, grad mode and both RNGs."""
    future = torch.__future__
    return (future.get_overwrite_module_params_on_conversion(),
            future.get_swap_module_params_on_conversion(),
            reference.get_overwrite_module_params_on_conversion(),
            reference.get_swap_module_params_on_conversion(),
            torch.get_default_dtype(), torch.is_grad_enabled(),
            tuple(torch.get_rng_state().tolist()), random.getstate())


def while_judged(step: Callable) -> Callable:
    """A rule that does nothing once a declared deviation has shown (see ``SequenceMachine``)."""

    @functools.wraps(step)
    def run(self: SequenceMachine, *args: Any, **kwargs: Any) -> None:
        if self.judged:
            step(self, *args, **kwargs)

    return run


# steps after which garbage is collected: the build (no garbage of an earlier test or sequence
# reaches this one) and the steps whose outcome can depend on a swap being refused
COLLECTING_STEPS = ("build", "convert", "load_state_dict")


@contextlib.contextmanager
def defined_empty_memory(active: bool = True) -> Iterator[None]:
    """With ``active``, ``torch.empty`` fills floats with NaN and integers with their maximum, as
    torch's deterministic mode does, so a conversion whose values the spec leaves open
    (``to_empty``) gives the same values in every process: the model takes them from the
    module, and a repro run in another interpreter must see them too. Restores the mode after."""
    if not active:
        yield
        return
    mode = (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])
        torch.utils.deterministic.fill_uninitialized_memory = mode[2]


# the repro's lines around such a conversion (the same mode, on and off again)
DEFINED_EMPTY_MEMORY_LINES = (
    ["torch.use_deterministic_algorithms(True, warn_only=True)  # to_empty's values: NaN",
     "torch.utils.deterministic.fill_uninitialized_memory = True"],
    ["torch.use_deterministic_algorithms(False)"])


class SequenceMachine(RuleBasedStateMachine):
    """A module's life on one target, checked against the model (see the module docstring).

    ``for_target`` makes the machine for a target and a property. A host adds its own steps by
    subclassing it and adding ``@rule`` methods: ``check = self.begin(name)`` before the step,
    the step on ``self.module`` and its prediction on ``self.model``, then
    ``self.after(check, prediction, outcome, repro_lines)`` (see the README), and decorating
    it with ``while_judged``.

    Once a step shows a declared deviation, the module is in a state the spec says nothing
    about (torch left a given tensor in a slot, or half a conversion): the rest of the sequence
    is not judged, and its rules do nothing.
    """

    target: Any = None
    property_id: str = STATE

    @classmethod
    def for_target(cls, target: Any, property_id: str) -> type[SequenceMachine]:
        return type(cls.__name__, (cls,), {"target": target, "property_id": property_id})

    def __init__(self) -> None:
        super().__init__()
        self.module: nn.Module | None = None
        self.model: ModuleModel | None = None
        self.x: Tensor | None = None
        self.palette: list[Any] = []
        self.opt: torch.optim.Optimizer | None = None
        self.fired: Counter[str] = Counter()
        self.build_lines: list[str] = []
        self.steps: list[list[str]] = []
        self.start = global_state()
        self.judged = True  # False once a declared deviation has shown
        # What is alive before the sequence draws its module is no garbage of the sequence:
        # frozen (``gc.freeze``) until its teardown, unless something else froze objects first,
        # so the collections before its steps scan only what the sequence made. The module is
        # drawn after, so a cycle that later holds one of its tensors is collected.
        gc.collect()
        self.froze = freeze_heap()
        self.trail: list[tuple[str, bool]] = []  # (rule, raised) of each step after the build
        self.vmappable = False
        self.old_style = False  # the tree holds an old-style reparametrization (OLD_STYLE)
        self.default_dtype = torch.float32
        self.kept: Tensor | None = None  # a forward's output held with its graph (keep_graph)
        self.opt_saved: dict[str, Any] | None = None  # the optimizer's state dict at its build
        self.global_hooks: str | None = None  # the kind of global module hooks (GLOBAL_HOOKS)
        self.global_hooks_before = global_module_hooks()  # put back by the teardown

    def teardown(self) -> None:
        """Record the sequence's ordered pairs of rules (``properties.harness.pairs``); unfreeze
        what the build froze, so the process collects it again; remove the global hooks."""
        restore_global_module_hooks(self.global_hooks_before)
        if self.target is not None and self.trail:
            universe = [r for r in RULES if r != "load_state_dict"
                        or getattr(self.target, "load_state_dict", None) is not None]
            pairs.record(self.target.name, universe, self.trail)
        if self.froze:
            unfreeze_heap()
            self.froze = False

    # ---- build -----------------------------------------------------------------------

    @initialize(module=trees, inputs=forward_inputs(), palette=palettes,
                dtype=st.sampled_from(DEFAULT_DTYPES),
                global_hooks=st.sampled_from(GLOBAL_HOOK_CHOICES),
                mode=st.sampled_from(MODE_CHOICES),
                inference=st.sampled_from(INFERENCE_CHOICES))
    def build(self, module: nn.Module, inputs: tuple[Tensor], palette: list[Any],
              dtype: torch.dtype = torch.float32, global_hooks: str | None = None,
              mode: str | None = None, inference: bool = False) -> None:
        self.module, (self.x,), self.palette = module, inputs, palette
        self.default_dtype, self.mode, self.inference = dtype, mode, inference
        self.global_hooks = global_hooks
        registrations = GLOBAL_HOOKS.get(global_hooks, ())
        for registration in registrations:
            getattr(module_globals, registration)(no_op_hook)
        spec = tree_info(module).spec
        self.model = ModuleModel.observe(module, spec)
        # Old-style reparametrizations (weight_norm, spectral_norm, prune) store their computed
        # attribute on the module in a forward pre-hook: under vmap that is a batched tensor
        # escaping the vmapped function, and every later use of it raises (torch's documented
        # vmap limitation), so the module is not left as it was in any way the spec can state.
        # A host's module promises its forward on the tensors it was given, not on batched ones
        # (a wrapper subclass cannot even be stacked): no vmap step on a tree that holds one.
        self.old_style = any(d.kind in OLD_STYLE for d in spec.decorations)
        self.vmappable = (not self.old_style
                          and not any(isinstance(m, HostLeaf) for m in module.modules()))
        self.build_lines = [*tree_info(module).source("module").splitlines(),
                            f"x = {repro.tensor_code(self.x)}",
                            *(f"torch.nn.modules.module.{f}(lambda *args: None)"
                              for f in registrations)]
        self.after(self.begin("build"), Prediction(), Outcome(), [])

    # ---- the rules -------------------------------------------------------------------

    @rule(data=st.data(), flags=flag_settings())
    @while_judged
    def convert(self, data: st.DataObject, flags: Any) -> None:
        conversion = data.draw(st.sampled_from(self.palette), label="conversion")
        check = self.begin("convert", conversion=conversion, flags=flags, inference=self.inference)
        before = self.model.snapshot()
        open_values = not conversion.preserves_values
        with default_dtype(self.default_dtype):
            prediction = self.model.convert(conversion.make_fn, flags.overwrite, flags.swap,
                                            conversion.preserves_values)
            with defined_empty_memory(open_values), self.process_state():
                outcome = attempt(lambda: self.target.apply(
                    self.module, conversion.make_fn(), overwrite=flags.overwrite, swap=flags.swap)
                    if conversion.call is None else
                    _call_method(self.target, self.module, conversion.call, flags))
        if prediction.may_refuse and isinstance(outcome.error, RuntimeError):
            self.model, prediction = before, Prediction(error=RuntimeError)  # a refused swap
            self.model.poisoned = True  # a rolled-back swap poisons autograd nodes too
        lines = (repro.apply_lines(self.target, conversion.source("fn"), flags.overwrite,
                                   flags.swap) if conversion.call is None else
                 repro.method_lines(self.target, conversion.call, flags.overwrite, flags.swap))
        if open_values:
            lines = [*DEFINED_EMPTY_MEMORY_LINES[0], *lines, *DEFINED_EMPTY_MEMORY_LINES[1]]
        self.after(check, prediction, outcome, self.under_process_state(lines))
        self.stop_checking_lost_hooks(check)

    @rule(data=st.data())
    @while_judged
    def functional_call(self, data: st.DataObject) -> None:
        """A functional call: ``target.functional_call`` with drawn tensors, or (where
        ``vmappable``) ``torch.func.vmap`` of it over stacked copies (``vmap``)."""
        if self.vmappable and data.draw(st.booleans(), label="vmap"):
            self.vmap(data)
        else:
            self.plain_call(data)

    def plain_call(self, data: st.DataObject) -> None:
        """``target.functional_call`` given other values for up to 3 drawn tensors, with
        ``tie_weights`` (one drawn name per tensor, else all its names) and form drawn."""
        model = self.model
        chosen = data.draw(st.lists(st.sampled_from(range(len(model.tensors))), unique=True,
                                    max_size=3), label="tensors") if model.tensors else []
        tie_weights = data.draw(st.booleans(), label="tie_weights")
        tuple_form = "tuple-single" in self.target.call_forms and data.draw(st.booleans(),
                                                                            label="tuple form")
        given: dict[str, Tensor] = {}
        for i in chosen:
            state = model.tensors[i]
            names = (data.draw(st.sampled_from(state.names), label="name"),) if tie_weights \
                else state.names
            value = given_value(state.value)
            given.update(dict.fromkeys(names, value))
        tensors: Any = (given,) if tuple_form else given
        call = CallInput(tensors, (self.x,), {}, tie_weights=tie_weights,
                         form="tuple-single" if tuple_form else "dict")
        check = self.begin("functional_call", call=call)
        lines = repro.functional_call_lines(self.target, given, tie_weights, tuple_form)
        prediction = model.forward(self.x, given=given, tie_weights=tie_weights)
        outcome = attempt(lambda: self.target.functional_call(
            self.module, tensors, (self.x.clone(),), {}, tie_weights=tie_weights))
        self.after(check, prediction, outcome, lines, output=True)

    def vmap(self, data: st.DataObject) -> None:
        """``torch.func.vmap`` of ``target.functional_call`` over ``torch.stack`` of 2 or 3
        copies of every tensor (each copy's values shifted 0-2 times by ``given_value``), under
        one name of each tensor: vmap hands each dict entry in as its own batched tensor, so two
        names given one object would arrive as two values, which ``tie_weights=True`` refuses;
        given one name, a tie's other names follow it. Where the model's own vmap raises, the
        step must raise that error type and leave the module as it was: a module vmap cannot
        run (a batching rule torch lacks, values on ``meta``) is still held to the restore
        rules, which a step not drawn there would not check."""
        model = self.model
        shifts = data.draw(st.lists(st.integers(0, 2), min_size=min(VMAP_COPIES),
                                    max_size=max(VMAP_COPIES)), label="copies")
        copies = [{i: shifted(t.value, k) for i, t in enumerate(model.tensors)} for k in shifts]
        stacked = {i: torch.stack([c[i] for c in copies]) for i in range(len(model.tensors))}
        given = {t.names[0]: stacked[i] for i, t in enumerate(model.tensors)}
        check = self.begin("vmap", call=CallInput(given, (self.x,), {}, tie_weights=True))
        prediction = model.vmap_call(self.x, copies)
        outcome = attempt(lambda: vmapped_call(self.target, self.module, given, self.x))
        self.after(check, prediction, outcome, repro.vmap_lines(self.target, given), output=True)

    @precondition(lambda self: self.judged and self.model is not None
                  and bool(self.model.untie_choices() or self.model.tie_choices()))
    @rule(data=st.data())
    @while_judged
    def tie(self, data: st.DataObject) -> None:
        """Tie a slot to another tensor as users do (``decoder.weight = encoder.weight``:
        ``setattr(owner, key, tensor)``), or untie one slot of a tie (its own copy: a new
        ``nn.Parameter`` of the same values and ``requires_grad``, a buffer slot's
        ``detach().clone()``, also where it holds a parameter). A tie joins slots of one kind
        (parameters, or buffers: ``register_buffer``, since a Parameter set on a buffer's key
        would make it a parameter) whose tensors have one dtype, device and shape, so the
        module's forward still runs. A slot is one (module, key): re-pointing a shared
        submodule's slot re-points all its paths."""
        model = self.model
        kinds = [k for k, choices in (("tie", model.tie_choices()),
                                      ("untie", model.untie_choices())) if choices]
        kind = data.draw(st.sampled_from(kinds), label="tie or untie")
        if kind == "tie":
            names, index = data.draw(st.sampled_from(model.tie_choices()), label="slot, tensor")
            source = model.tensors[index].names[0]
            check = self.begin("tie")
            owner, key = slot_owner(self.module, names[0])
            persistent = (key not in owner._non_persistent_buffers_set
                          if names[0] in model.buffer_names else None)
            outcome = attempt(lambda: tie_slot(owner, key, named_tensors(self.module)[source],
                                               persistent))
            prediction, lines = model.tie(names, index), repro.tie_lines(names, source, persistent)
        else:
            names = data.draw(st.sampled_from(model.untie_choices()), label="slot")
            parameter = names[0] not in model.buffer_names
            check = self.begin("untie")
            owner, key = slot_owner(self.module, names[0])
            outcome = attempt(lambda: setattr(owner, key, own_copy(getattr(owner, key),
                                                                   buffer=not parameter)))
            prediction, lines = model.untie(names), repro.untie_lines(names, parameter)
        self.after(check, prediction, outcome, lines)

    @precondition(lambda self: getattr(self.target, "load_state_dict", None) is not None)
    @rule(data=st.data())
    @while_judged
    def load_state_dict(self, data: st.DataObject) -> None:
        """A strict ``target.load_state_dict`` of every key, with ``assign`` and the swap flag
        drawn, and values drawn by kind (``LOAD_KINDS``)."""
        assign = data.draw(st.booleans(), label="assign")
        swap = data.draw(st.booleans(), label="swap")
        kind = data.draw(st.sampled_from(LOAD_KINDS), label="values")
        state_dict, values, bad = self.load_values(kind, data)
        load = LoadInput(state_dict, strict=True, assign=assign, swap=swap,
                         invalid=("wrong-shape",) if bad else (), bad_keys=bad)
        check = self.begin("load_state_dict", load=load, inference=self.inference)
        before = self.model.snapshot()
        with default_dtype(self.default_dtype):
            prediction = (Prediction(error=RuntimeError) if bad else
                          self.model.load(values, assign=assign, swap=swap, own=kind == "own"))
            with self.process_state():
                outcome = attempt(lambda: self.target.load_state_dict(
                    self.module, state_dict, strict=True, assign=assign, swap=swap))
        if prediction.may_refuse and isinstance(outcome.error, RuntimeError):
            self.model, prediction = before, Prediction(error=RuntimeError)  # a refused swap
            self.model.poisoned = True
        self.after(check, prediction, outcome, self.under_process_state(
            repro.load_lines(self.target, kind, state_dict, assign, swap)))
        self.stop_checking_lost_hooks(check)

    def process_state(self) -> contextlib.AbstractContextManager:
        """The life's torch mode and inference mode, entered around a conversion or a load (the
        default dtype is entered separately: the model's prediction runs under it too)."""
        stack = contextlib.ExitStack()
        stack.enter_context(active_mode(self.mode))
        if self.inference:
            stack.enter_context(torch.inference_mode())
        return stack

    def under_process_state(self, lines: list[str]) -> list[str]:
        """A conversion's or load's repro lines, run under the life's inference mode and torch
        mode (if any) and its default dtype where it is not torch's."""
        if self.inference:
            lines = ["with torch.inference_mode():", *(f"    {line}" for line in lines)]
        if self.mode is not None:
            mode = MODE_CLASSES[self.mode].__name__
            lines = [f"from swapspec.strategies.modes import {mode}", f"with {mode}():",
                     *(f"    {line}" for line in lines)]
        if self.default_dtype == torch.float32:
            return lines
        return [f"torch.set_default_dtype({self.default_dtype})", *lines,
                "torch.set_default_dtype(torch.float32)"]

    def load_values(self, kind: str, data: st.DataObject
                    ) -> tuple[dict[str, Any], dict[int, Tensor], tuple[str, ...]]:
        """The state dict of one load (the module's own ``state_dict()``, its tensor keys
        replaced by ``kind``), each tensor index's value, and the keys given a wrong shape."""
        state_dict = self.module.state_dict()
        keys = [k for k in state_dict if k in self.model.slots]
        made: dict[int, Tensor] = {}
        for key in keys:
            index = self.model.slots[key]
            if kind != "own" and index not in made:
                made[index] = load_value(self.model.tensors[index].value, kind)
            if kind != "own":
                state_dict[key] = made[index]
        values = {}
        for key in keys:
            values.setdefault(self.model.slots[key], state_dict[key])
        bad: tuple[str, ...] = ()
        if kind == "wrong-shape" and keys:
            key = data.draw(st.sampled_from(keys), label="wrong-shape key")
            value = state_dict[key]
            state_dict[key] = torch.zeros((*value.shape, 2), dtype=value.dtype, device=value.device)
            bad = (key,)
        return state_dict, values, bad

    @precondition(lambda self: self.judged and self.model is not None and not self.model.poisoned)
    @rule(create_graph=st.booleans())
    @while_judged
    def backward(self, create_graph: bool) -> None:
        """``module(x).float().sum().backward(create_graph=...)``: a training step's backward,
        predicted as the same on a fresh build (grads, buffers, hook firings)."""
        check = self.begin("backward")
        kind = "create-graph" if create_graph else "plain"
        prediction = self.model.forward(self.x, backward=kind)
        outcome = attempt(lambda: run_backward(self.module, self.x, create_graph))
        lines = ["error = None", *repro.guarded([
            "with torch.enable_grad():", "    out = module(x.clone())",
            "    if out.requires_grad:",
            f"        out.float().sum().backward(create_graph={create_graph})"])]
        self.after(check, Prediction(error=prediction.error), outcome, lines)

    @rule(data=st.data())
    @while_judged
    def train(self, data: st.DataObject) -> None:
        """A step on the grads: ``zero_grad`` (``set_to_none`` either way) or, where a grad
        exists, clipping them (``clip_grads``)."""
        kinds = ["zero-grad"]
        if any(t.grad is not None for t in self.model.tensors):
            kinds.append("clip-grads")
        kind = data.draw(st.sampled_from(kinds), label="training step")
        if kind == "zero-grad":
            self.zero_grad(data.draw(st.booleans(), label="set_to_none"))
        else:
            self.clip_grads(data.draw(grad_clips(), label="clip"))

    @precondition(lambda self: self.judged and trainable(self.model))
    @rule(data=st.data())
    @while_judged
    def optimize(self, data: st.DataObject) -> None:
        """The optimizer: build one (SGD over the trainable parameters) where the sequence has
        none; else step it, or load into it the state dict it had when it was built
        (``optimizer_reload``: a resumed checkpoint)."""
        if self.opt is None:
            self.build_optimizer()
        elif data.draw(st.sampled_from(("step", "step", "reload")), label="optimizer") == "step":
            self.optimizer_step()
        else:
            self.optimizer_reload()

    @rule(deep=st.booleans())
    @while_judged
    def checkpoint(self, deep: bool) -> None:
        """``state_dict()`` then torch's own ``load_state_dict`` of it, or ``copy.deepcopy``."""
        if deep:
            self.deepcopy()
        else:
            self.state_dict_round_trip()

    def build_optimizer(self) -> None:
        indices = trainable(self.model)
        named = named_tensors(self.module)
        params = [named[self.model.tensors[i].names[0]] for i in indices]
        names = [self.model.tensors[i].names[0] for i in indices]
        check = self.begin("build_optimizer")
        outcome = attempt(lambda: torch.optim.SGD(params, lr=LR, foreach=False))
        self.opt = outcome.result
        self.opt_saved = None if self.opt is None else copy.deepcopy(self.opt.state_dict())
        if self.opt is not None:
            self.model.build_optimizer(indices)
        lines = [f"opt = torch.optim.SGD([named(module)[n] for n in {names!r}], lr={LR}, "
                 "foreach=False)", "saved = copy.deepcopy(opt.state_dict())"]
        self.after(check, Prediction(), outcome, lines)

    def optimizer_step(self) -> None:
        check = self.begin("optimizer_step")
        prediction = self.model.optimizer_step()
        outcome = attempt(self.opt.step)
        lines = ["error = None", *repro.guarded(["opt.step()"])]
        self.after(check, prediction, outcome, lines)

    def clip_grads(self, clip: GradClip) -> None:
        """A ``torch.nn.utils.clip_grad_*`` call on ``module.parameters()``: the grads as the
        same call leaves a fresh build's (``ModuleModel.in_place_on_fresh``). A call that raises
        on the fresh build is not run (``skip_raising``)."""
        model = self.model.snapshot()
        if skip_raising("clip_grads", model.in_place_on_fresh(clip)):
            return
        check = self.begin("clip_grads")
        self.model = model
        outcome = attempt(lambda: clip(self.module))
        lines = ["error = None", *repro.guarded([clip.source()])]
        self.after(check, Prediction(), outcome, lines)

    def optimizer_reload(self) -> None:
        """``opt.load_state_dict`` of the state dict saved at the build: the optimizer keeps
        its parameter objects (SEQ-OPTIMIZER), and the module changes in nothing."""
        check = self.begin("optimizer_reload")
        outcome = attempt(lambda: self.opt.load_state_dict(copy.deepcopy(self.opt_saved)))
        lines = ["error = None", *repro.guarded(["opt.load_state_dict(saved)"])]
        self.after(check, Prediction(), outcome, lines)

    def zero_grad(self, set_to_none: bool) -> None:
        check = self.begin("zero_grad")
        self.model.zero_grad(set_to_none)
        outcome = attempt(lambda: self.module.zero_grad(set_to_none=set_to_none))
        self.after(check, Prediction(), outcome,
                   [f"module.zero_grad(set_to_none={set_to_none})"])

    @rule()
    @while_judged
    def keep_graph(self) -> None:
        """Hold a forward's output with its autograd graph (``out = module(x)``, kept as code
        that stores a loss for later does), or release the one held. While one is held, a swap
        may be refused (``ModuleModel.kept_graph``); the held graph is never run backward."""
        if self.kept is not None:
            check = self.begin("release_graph")
            self.kept = None
            self.model.kept_graph = False
            self.after(check, Prediction(), Outcome(), ["held = None  # the held graph is released"])
            return
        check = self.begin("keep_graph")
        prediction = self.model.forward(self.x)
        outcome = attempt(lambda: graph_forward(self.module, self.x))
        if outcome.error is None:
            self.kept = outcome.result
            self.model.kept_graph = True
        lines = ["error = None", *repro.guarded([
            "with torch.enable_grad():",
            "    held = module(x.clone())  # its graph can hold the module's tensors"])]
        self.after(check, Prediction(error=prediction.error), outcome, lines)

    @rule(data=st.data())
    @while_judged
    def module_apply(self, data: st.DataObject) -> None:
        """``module.apply(fn)``: a user's function on every module, children first
        (``strategies.module_steps``: weight initialization in place), predicted as the same
        call on a fresh build (``ModuleModel.in_place_on_fresh``). A tree with an old-style
        reparametrization draws only functions that write registered slots (``SLOT_FNS``): its
        computed attribute can share storage with its original, which a fresh build's does not."""
        fn = data.draw(module_fns(slots_only=self.old_style), label="fn")
        model = self.model.snapshot()
        if skip_raising("module_apply", model.in_place_on_fresh(lambda copy: copy.apply(fn))):
            return
        check = self.begin("module_apply")
        self.model = model
        outcome = attempt(lambda: self.module.apply(fn))
        lines = ["from torch import nn", *module_fn_source(fn).splitlines(), "error = None",
                 *repro.guarded([f"module.apply({fn.__name__})"])]
        self.after(check, Prediction(), outcome, lines)

    @rule(requires_grad=UNFREEZE_MOSTLY)
    @while_judged
    def requires_grad_(self, requires_grad: bool) -> None:
        """``requires_grad_``, the target's method: freezing or unfreezing every parameter."""
        check = self.begin("requires_grad_")
        prediction = self.model.requires_grad_(requires_grad)
        outcome = attempt(lambda: self.target.method("requires_grad_")(
            self.module, requires_grad, overwrite=False, swap=False))
        lines = ["error = None", *repro.guarded([
            f"module.requires_grad_({requires_grad})" if repro.is_torch(self.target) else
            f"target.method('requires_grad_')(module, {requires_grad}, overwrite=False, "
            "swap=False)"])]
        self.after(check, prediction, outcome, lines)

    @precondition(lambda self: self.judged and trainable(self.model))
    @rule(data=st.data())
    @while_judged
    def register_hooks(self, data: st.DataObject) -> None:
        """A counting ``register_hook`` and ``register_post_accumulate_grad_hook`` on a drawn
        trainable parameter."""
        candidates = trainable(self.model)
        index = data.draw(st.sampled_from(candidates), label="parameter")
        name, key = self.model.tensors[index].names[0], f"h{len(self.model.hooks) // 2}"
        check = self.begin("register_hooks")
        param = named_tensors(self.module)[name]
        outcome = attempt(lambda: count_hooks(param, key, self.fired))
        self.model.add_hooks(index, key)
        lines = [f"named(module)[{name!r}].register_hook(lambda g: fired.update([{key + ':hook'!r}]))",
                 f"named(module)[{name!r}].register_post_accumulate_grad_hook("
                 f"lambda p: fired.update([{key + ':post-accumulate'!r}]))"]
        self.after(check, Prediction(), outcome, lines)

    def stop_checking_lost_hooks(self, check: StepCheck) -> None:
        """After a step where a declaration of lost hooks applies: no hook on any tensor is
        held to the model any more, nor (clause ``after-hook-lost``) any registered later."""
        declared = check.declared_clauses
        if set(HOOK_LOSS_CLAUSES) & declared:
            self.model.stop_checking_hooks(range(len(self.model.tensors)),
                                           later="after-hook-lost" in declared)

    def state_dict_round_trip(self) -> None:
        check = self.begin("state_dict_round_trip")
        outcome = attempt(lambda: self.module.load_state_dict(self.module.state_dict()))
        lines = ["error = None", *repro.guarded(["module.load_state_dict(module.state_dict())"])]
        self.after(check, Prediction(), outcome, lines)

    def deepcopy(self) -> None:
        check = self.begin("deepcopy")
        outcome = attempt(lambda: copy.deepcopy(self.module))
        if outcome.error is None:  # torch refuses to deep-copy non-leaf tensors: no step then
            self.module, self.kept = outcome.result, None
            self.model.deepcopied()
        lines = ["try:", "    module = copy.deepcopy(module)", "except RuntimeError as e:",
                 "    print('deepcopy refused:', e)"]
        self.after(check, Prediction(), Outcome(), lines)

    # ---- after each step -------------------------------------------------------------

    def begin(self, step: str, **example: Any) -> StepCheck:
        """The check of a step about to run: its declarations are matched now, on the module
        before the step (a predicate describes the input, never the outcome).

        Before the build and a step that may swap tensors (``COLLECTING_STEPS``) garbage is
        collected: a reference cycle left earlier (an exception's traceback holding an autograd
        graph) can keep a tensor's implementation referenced, and ``swap_tensors`` refuses such
        a tensor, so without it the step's outcome would depend on when Python's collector last
        ran. These collections scan only what the sequence made (see ``__init__``)."""
        if step in COLLECTING_STEPS:
            gc.collect()
        check = StepCheck(self.property_id, self.target,
                          StepExample(self.module, step=step, graph_held=self.kept is not None,
                                      **example))
        self.invariants_before = step_snapshot(self, step, example)
        return check

    def after(self, check: StepCheck, prediction: Prediction, outcome: Outcome,
              lines: list[str], *, output: bool = False) -> None:
        """Check the property's invariant after the step; resync where a declaration applies."""
        step = check.example.step
        event(f"rule: {step}")
        if step in RULES:
            self.trail.append((step, outcome.error is not None))
        self.steps.append(["before = named(module)", *lines])
        self.check_outcome(check, prediction, outcome)
        if self.property_id == STATE:
            check_state(check, self.model, self.module, step)
        elif self.property_id == FORWARD and output and prediction.error is None \
                and outcome.error is None:
            check.that(agrees(outcome, prediction), "output",
                       "the call's output differs from the model's call on a fresh build",
                       code=f"same(out, {repro.tensor_code(prediction.result)})")
        elif self.property_id == HOOKS:
            check_hooks(check, self.model, self.fired, self.target)
        elif self.property_id == OPTIMIZER:
            check_optimizer(check, self.model, self.module, self.opt)
        check.that(global_state() == self.start, "global-state",
                   f"step {step!r} changed global state (flags, default dtype, grad mode or RNG)",
                   code="global_state() == start")
        check.violations += step_invariants(self, step, outcome)
        symptoms = copy.copy(check)
        symptoms.violations = []
        if self.property_id != STATE and check.declared:
            check_state(symptoms, self.model, self.module, step)
        resync = check.verdict(self.script, symptoms.violations)
        self.judged = not check.shown
        if not self.judged:  # the rest is not judged: nothing to keep the model in step with
            return
        if resync:
            self.model.resync(self.module)
        self.model.adopt(self.module)
        if self.model.drop_stale_optimizer() or self.model.optimizer is None:
            if self.opt is not None:
                self.steps[-1].append("opt = None  # stale (a new object): a later step builds one")
            self.opt = None
        if self.property_id == FORWARD and self.judged:
            self.forward_check()

    def check_outcome(self, check: StepCheck, prediction: Prediction, outcome: Outcome) -> None:
        """Clauses ``raised`` / ``no-error``: the step raised exactly where the model did."""
        error = outcome.error
        if prediction.error is None:
            check.that(error is None, "raised",
                       f"raised {type(error).__name__}: {error}" if error else "",
                       code="error is None")
        else:
            check.that(isinstance(error, prediction.error), "no-error",
                       f"the model raised {prediction.error.__name__}; the step gave "
                       f"{type(error).__name__ if error else 'no error'}",
                       code=f"isinstance(error, {prediction.error.__name__})")

    def forward_check(self) -> None:
        """SEQ-FORWARD: the module's forward equals a fresh build's with the model's values."""
        check = self.begin("forward")
        prediction = self.model.forward(self.x)
        outcome = attempt(lambda: no_grad_forward(self.module, self.x))
        want = (f"same(forward(module, x), {repro.tensor_code(prediction.result)})"
                if prediction.error is None else "False  # the model's forward raised")
        check.that(agrees(outcome, prediction), "stale-forward",
                   f"forward {shown(outcome)}, but a fresh build holding the model's values "
                   f"{shown(prediction)}", code=want)
        resync = check.verdict(self.script)
        self.judged = not check.shown
        self.steps.append(["forward(module, x)  # the forward check"])
        if resync:
            self.model.resync(self.module)
        self.model.adopt(self.module)

    def script(self, violations: list[Violation]) -> str:
        """The sequence so far as a standalone script ending in the violated clauses' asserts."""
        *done, last = self.steps
        asserts = [f"assert {v.code}, {v.message!r}" for v in violations]
        return repro.script(self.target, self.build_lines, [*done, last], asserts)


def sequence_settings() -> settings:
    """The active profile's settings, scaled to sequences: ``STEPS`` steps per sequence and a
    ``1/EXAMPLES_DIVISOR`` share of its examples (at least one); a failure prints its
    ``@reproduce_failure`` blob whatever the profile."""
    current = settings()
    return settings(current, max_examples=max(1, current.max_examples // EXAMPLES_DIVISOR),
                    stateful_step_count=STEPS, deadline=None, print_blob=True,
                    suppress_health_check=[*current.suppress_health_check, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


def sequence_property(property_id: str) -> Callable:
    """Mark a test as the check of one sequence property (as ``spec_property`` does for
    ``@given`` tests; the relaxed settings are in ``sequence_settings``)."""
    return pytest.mark.swapspec_property(property_id)


def run_sequences(target: Any, property_id: str,
                  machine: type[SequenceMachine] = SequenceMachine,
                  settings_: settings | None = None) -> None:
    """Run ``machine`` on ``target``, asserting ``property_id``'s invariant after every step
    (``settings_``: instead of ``sequence_settings()``); inside ``replaying``, only the
    sequence its blob encodes."""
    factory = machine.for_target(target, property_id)
    replay = REPLAY.get()
    if replay is not None:
        factory = reproduce_failure(*replay)(factory)
    run_state_machine_as_test(factory, settings=settings_ or sequence_settings())


def repro_of(error: BaseException) -> str:
    """The standalone script in a failing sequence's ``ConformanceError``."""
    marker = "Standalone repro (save it as a file and run it with python):\n\n"
    return str(error).split(marker, 1)[1]


def steps_in(script: str) -> int:
    """How many steps after the build a repro script runs."""
    return script.count("\n# step ") - 1
