"""Properties of checkpoint forms around the target's operations: one rule per test.

A checkpoint is a module pickled whole (``torch.save``, ``copy.deepcopy``), a state dict in one of
``state_dict``'s forms (``prefix``, ``keep_vars``, ``destination``, its hooks, extra state) loaded
back with the target's ``load_state_dict``, or a parameter vector
(``torch.nn.utils.parameters_to_vector``). Recurrent modules (``nn.RNNBase``) keep flat weights
beside their parameters, which every conversion and unpickling must keep pointing at them.
"""

from __future__ import annotations

import copy
import inspect
import io
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st
from torch import Tensor, nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import script_repro
from swapspec.properties.models.call_state import reread_flat_weights
from swapspec.properties.models.examples import (
    Example,
    add_one_,
    alias_groups,
    holds_values,
    named_tensors,
    plus_one,
    same_values,
    shared_submodules,
    slots,
    value_copy,
)
from swapspec.properties.models.load_examples import changes, norm_defaults, snapshot_for_load
from swapspec.properties.models.outcomes import Outcome, attempt, seeded_attempt
from swapspec.strategies import BATCH, FEATURES, FlagSetting, flag_settings, module_trees, tree_info
from swapspec.strategies.checkpoints import ExtraState, extra_states, rnn_trees
from swapspec.strategies.conversions import modules_with_conversions
from swapspec.strategies.state_dicts import LoadInput

# Trees that pickle: no decorations (their hooks are local functions) and no wrapper; leaf grads
# only (a grad with a graph refuses deepcopy); no lazy module (its first forward draws values).
plain_trees = module_trees(lazy=False, decoration_chance=0, wrapper_chance=0,
                           needs=("leaf-grads",))
pickled_trees = st.one_of(plain_trees, rnn_trees())
loadable_trees = module_trees(lazy=False, wrapper_chance=0, needs=("leaf-grads",))
form_trees = module_trees(wrapper_chance=0, needs=("leaf-grads",))
# One parameter dtype: parameters_to_vector concatenates, promoting mixed dtypes.
float32_trees = module_trees(lazy=False, dtypes=(torch.float32,), decoration_chance=0,
                             wrapper_chance=0)


def _keeps_values(conversion: Any) -> bool:
    return conversion.preserves_values and not conversion.changes_impl


# ---------------------------------------------------------------- shared steps


def _draw_converted(target: Any, data: st.DataObject, modules: st.SearchStrategy[nn.Module],
                    where: Callable[[Any], bool] = _keeps_values) -> tuple[Example, Outcome]:
    """A module from ``modules`` converted on ``target`` with a drawn conversion and flags."""
    module, conversion = data.draw(modules_with_conversions(modules, ["cpu"], where=where),
                                   label="module and conversion")
    flags = data.draw(flag_settings(), label="flags")
    example = Example(module, conversion=conversion, flags=flags)
    outcome = attempt(lambda: target.apply(module, conversion.make_fn(), overwrite=flags.overwrite,
                                           swap=flags.swap))
    return example, outcome


def _convert_lines(example: Example) -> list[str]:
    """Repro lines that make the example's conversion on the target."""
    flags = example.flags or FlagSetting(overwrite=False, swap=False)
    return [*example.conversion.source("fn").splitlines(),
            f"target_apply(module, fn, overwrite={flags.overwrite}, swap={flags.swap})"]


def _forward(module: nn.Module, x: Tensor) -> Outcome:
    """``module(x)`` with the CPU RNG forked and seeded, so dropout draws the same masks."""
    return seeded_attempt(lambda: module(x))


def _same_outcome(a: Outcome, b: Outcome) -> bool:
    """Both raised the same type, or both returned tensors of one dtype and equal values."""
    if a.error is not None or b.error is not None:
        return type(a.error) is type(b.error)
    x, y = a.result, b.result
    if isinstance(x, Tensor) and isinstance(y, Tensor):
        return x.dtype == y.dtype and same_values(x, y)
    return type(x) is type(y)


def _saved(module: nn.Module) -> nn.Module:
    """``module`` through ``torch.save`` and ``torch.load`` (whole-object pickling) in memory."""
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _input() -> Tensor:
    return torch.linspace(-1, 1, BATCH * FEATURES).reshape(BATCH, FEATURES)


# ---------------------------------------------------------------- whole-module pickling


@spec_property("CHECKPOINT-PICKLE", examples_divisor=8)
@given(data=st.data())
def test_converted_module_pickles(target, data):
    """A module the target converted comes back from ``torch.save``/``torch.load`` and from
    ``copy.deepcopy`` as an equal module: the same module classes and slots, each tensor with
    the same class, dtype, device, shape, ``requires_grad`` and values, the same ties and shared
    submodules, an RNN's flat weights its own parameters, and the same forward output.

    Torch's pickling of a ``Parameter`` (``__reduce_ex__``, ``__deepcopy__``) keeps no
    ``.grad``, and ``torch.save`` pickles a Parameter subclass as a plain ``Parameter``,
    whatever the target: grads are not compared, and the ``torch.save`` leg leaves out modules
    that hold a Parameter subclass.

    Origin: checkpoints of whole models (``torch.save(model)``, ``copy.deepcopy`` of a
    ``model.half()``); ``RNNBase.__getstate__``/``__setstate__`` rebuild the flat-weight
    references a conversion reset.
    """
    example, outcome = _draw_converted(target, data, pickled_trees)
    assume(outcome.error is None)  # the conversion's own properties judge a refusal
    module = example.module
    check = Checker("CHECKPOINT-PICKLE", target, example)
    x = _input()
    ways = {"deepcopy": copy.deepcopy}
    if not _has_parameter_subclass(module):
        ways["torch.save"] = _saved
    copies = {how: attempt(lambda f=f: f(module)) for how, f in ways.items()}
    made = {how: c.result for how, c in copies.items()
            if check.that(c.error is None, "raised", f"{how} raised {c.error!r}")}
    for how, other in made.items():
        _check_same_module(check, how, module, other)
    expected = _forward(module, x)  # after the comparisons: forward may update buffers
    for how, other in made.items():
        check.that(_same_outcome(_forward(other, x), expected), "forward",
                   f"the module from {how} computes another output")
    check.verdict(partial(script_repro, example, target, body=[
        *_convert_lines(example), "import copy", "loaded = copy.deepcopy(module)",
        "observed = {'slots': sorted(slots(loaded)), 'dtypes': "
        "[str(t.dtype) for t in named(loaded).values()], 'grads': "
        "[repr(t.grad) for t in named(loaded).values()]}"]))


def _has_parameter_subclass(module: nn.Module) -> bool:
    """Whether a parameter is an instance of a subclass of ``nn.Parameter``."""
    return any(type(p) is not nn.Parameter for p in module.parameters())


def _check_same_module(check: Checker, how: str, module: nn.Module, other: nn.Module) -> None:
    """Clauses ``class``, ``slots``, ``tensor``, ``ties``, ``flat-weights``: ``other`` equals
    ``module`` (see CHECKPOINT-PICKLE)."""
    classes = {p: type(m) for p, m in module.named_modules(remove_duplicate=False)}
    copied = {p: type(m) for p, m in other.named_modules(remove_duplicate=False)}
    check.that(classes == copied, "class", f"{how} changed the module classes: {copied}")
    before, after = slots(module), slots(other)
    if not check.that(before.keys() == after.keys(), "slots",
                      f"{how} changed the slots: {sorted(before)} -> {sorted(after)}"):
        return
    for name, t in before.items():
        if isinstance(t, Tensor):
            problem = _tensor_difference(t, after[name])
            check.that(problem is None, "tensor", f"{how}: {name!r} {problem}")
    check.that(alias_groups(module) == alias_groups(other)
               and shared_submodules(module) == shared_submodules(other), "ties",
               f"{how} changed the ties: {alias_groups(other)}, {shared_submodules(other)}")
    for path, m in other.named_modules():
        if isinstance(m, nn.RNNBase):
            check.that(_flat_weights_are_parameters(m), "flat-weights",
                       f"{how}: {path!r}'s _flat_weights are not its parameters")


def _tensor_difference(t: Tensor, u: Any) -> str | None:
    """What differs between tensor ``t`` and its copy ``u``, or None."""
    if type(t) is not type(u):
        return f"is a {type(u).__name__}, was a {type(t).__name__}"
    for attr in ("dtype", "device", "shape", "requires_grad"):
        if getattr(t, attr) != getattr(u, attr):
            return f"has {attr} {getattr(u, attr)}, was {getattr(t, attr)}"
    if holds_values(t) and not same_values(t.detach(), u.detach()):
        return "has other values"
    return None


# ---------------------------------------------------------------- recurrent modules


def _rnn(module: nn.Module) -> nn.RNNBase:
    """The recurrent module of an ``rnn_trees`` tree (a catalogue leaf's ``inner``)."""
    return next(m for m in module.modules() if isinstance(m, nn.RNNBase))


def _flat_weights_are_parameters(rnn: nn.RNNBase) -> bool:
    """Each of ``rnn._flat_weights`` is the module's attribute of its name."""
    return len(rnn._flat_weights) == len(rnn._flat_weights_names) and all(
        w is getattr(rnn, n, None) for w, n in zip(rnn._flat_weights, rnn._flat_weights_names,
                                                    strict=True))


def _reread(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose RNNs read their flat weights from their parameters again."""
    twin = copy.deepcopy(module)
    reread_flat_weights(twin)
    return twin


@spec_property("CHECKPOINT-RNN-FLAT-WEIGHTS", examples_divisor=8)
@given(data=st.data())
def test_converted_rnn_flat_weights(target, data):
    """After the target converts an RNN, its flat weights are its parameters, ``all_weights``
    gives them layer by layer, and forward (after ``flatten_parameters``) computes what the
    module computes with its flat weights read from its parameters again.

    Origin: ``RNNBase._apply`` resets ``_flat_weights`` after ``Module._apply``
    ("3rd party device types likely rely on this behavior to properly .to() modules like
    LSTM"); pytorch #115442 (swap_tensors refuses the flat weights' weak references).
    """
    example, outcome = _draw_converted(target, data, rnn_trees())
    assume(outcome.error is None)
    module = example.module
    rnn = _rnn(module)
    check = Checker("CHECKPOINT-RNN-FLAT-WEIGHTS", target, example)
    check.that(_flat_weights_are_parameters(rnn), "flat-weights",
               "the converted RNN's _flat_weights are not its parameters",
               code="all(w is getattr(module.inner, n) for w, n in "
                    "zip(module.inner._flat_weights, module.inner._flat_weights_names))")
    layers = [[getattr(rnn, n) for n in names] for names in rnn._all_weights]
    check.that(_same_objects(rnn.all_weights, layers), "all-weights",
               "all_weights does not give the module's parameters")
    x = _input()
    expected = _forward(_reread(module), x)
    flattened = attempt(rnn.flatten_parameters)
    check.that(flattened.error is None and _flat_weights_are_parameters(rnn), "flatten",
               f"flatten_parameters raised {flattened.error!r} or changed the flat weights")
    check.that(_same_outcome(_forward(module, x), expected), "forward",
               "forward of the converted RNN differs from its parameters' output")
    check.verdict(partial(script_repro, example, target, body=[
        *_convert_lines(example),
        "observed = {'flat': [w is getattr(module.inner, n) for w, n in "
        "zip(module.inner._flat_weights, module.inner._flat_weights_names)]}"]))


def _same_objects(a: list[list[Any]], b: list[list[Any]]) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(u is v for u, v in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True))


LEGACY_DROPPED = ("proj_size", "_flat_weights_names", "_all_weights", "_flat_weights",
                  "_flat_weight_refs")


def legacy_state(rnn: nn.RNNBase) -> dict[str, Any]:
    """``rnn``'s pickled state as torch before 1.8 wrote it: ``all_weights`` holding the
    parameters layer by layer, and no ``proj_size``, flat-weight names or flat weights."""
    state = {k: v for k, v in rnn.__getstate__().items() if k not in LEGACY_DROPPED}
    state["all_weights"] = [[getattr(rnn, n) for n in names] for names in rnn._all_weights]
    return state


@spec_property("CHECKPOINT-RNN-LEGACY", examples_divisor=8)
@given(data=st.data())
def test_legacy_rnn_state(target, data):
    """An RNN the target converted, unpickled from the state torch before 1.8 saved (its
    parameters in ``all_weights``, no ``proj_size``), gets ``proj_size`` 0, the flat-weight
    names of its layers, flat weights that are its parameters, and computes the same output.

    Origin: ``RNNBase.__setstate__`` keeps checkpoints of ``torch.save(model)`` from torch
    before 1.8 loadable (``proj_size`` arrived in 1.8).
    """
    example, outcome = _draw_converted(target, data, rnn_trees())
    rnn = _rnn(example.module)
    assume(outcome.error is None and rnn.proj_size == 0)  # no LSTM projection before 1.8
    check = Checker("CHECKPOINT-RNN-LEGACY", target, example)
    restored = type(rnn).__new__(type(rnn))
    unpickled = attempt(lambda: restored.__setstate__(legacy_state(rnn)))
    if check.that(unpickled.error is None, "raised", f"__setstate__ raised {unpickled.error!r}"):
        check.that(restored.proj_size == 0 and restored._flat_weights_names
                   == rnn._flat_weights_names and restored._all_weights == rnn._all_weights,
                   "names", f"flat-weight names {restored._flat_weights_names}, expected "
                            f"{rnn._flat_weights_names}")
        check.that(_flat_weights_are_parameters(restored), "flat-weights",
                   "the unpickled RNN's _flat_weights are not its parameters")
        x = _input()
        expected = _forward(example.module, x)
        example.module.inner = restored
        check.that(_same_outcome(_forward(example.module, x), expected), "forward",
                   "the unpickled RNN computes another output")
    check.verdict(partial(script_repro, example, target, body=[
        *_convert_lines(example), "observed = {}"]))


# ---------------------------------------------------------------- state dict forms


@st.composite
def state_dict_forms(draw: Any) -> dict[str, Any]:
    """``state_dict`` keywords: a prefix, ``keep_vars``, a destination with one earlier entry
    (or none), and whether they are passed positionally (torch's deprecated form)."""
    return {"prefix": draw(st.sampled_from(["", "model.", "a.b."])),
            "keep_vars": draw(st.booleans()),
            "destination": draw(st.sampled_from([None, "given"])),
            "positional": draw(st.booleans())}


def _expected_entries(module: nn.Module, prefix: str) -> dict[str, Tensor]:
    """Every persistent, non-None slot by its state-dict key, one entry per path."""
    out: dict[str, Tensor] = {}
    for path, m in module.named_modules(remove_duplicate=False):
        here = f"{prefix}{path}." if path else prefix
        for name, p in m._parameters.items():
            if p is not None:
                out[here + name] = p
        for name, b in m._buffers.items():
            if b is not None and name not in m._non_persistent_buffers_set:
                out[here + name] = b
    return out


def _call_state_dict(module: nn.Module, form: dict[str, Any], destination: Any) -> Any:
    if form["positional"]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return module.state_dict(destination, form["prefix"], form["keep_vars"])
    return module.state_dict(destination=destination, prefix=form["prefix"],
                             keep_vars=form["keep_vars"])


def _register_state_dict_hooks(module: nn.Module, seen: list[tuple[str, Any, str]]) -> list[Any]:
    """A counting state-dict pre- and post-hook on every module; their handles."""
    handles = []
    for m in {id(m): m for m in module.modules()}.values():
        handles.append(m.register_state_dict_pre_hook(
            lambda mod, prefix, keep_vars: seen.append(("pre", mod, prefix))))
        handles.append(m.register_state_dict_post_hook(
            lambda mod, sd, prefix, meta: seen.append(("post", mod, prefix))))
    return handles


def _visits(module: nn.Module, prefix: str) -> list[tuple[Any, str]]:
    """``(module, prefix)`` of every visit ``state_dict`` makes: one per path."""
    return sorted(((id(m), f"{prefix}{p}." if p else prefix)
                   for p, m in module.named_modules(remove_duplicate=False)), key=repr)


@spec_property("CHECKPOINT-STATE-DICT-FORMS", examples_divisor=4)
@given(module=form_trees, data=st.data())
def test_state_dict_forms(target, module, data):
    """``state_dict(destination, prefix, keep_vars)`` (by keyword, or positionally) returns
    ``destination`` when given, keeping its entries, with one entry per persistent slot and
    path under ``prefix``: the slot object itself with ``keep_vars``, else a detached tensor
    sharing its storage; its pre- and post-hooks run once per visit with that prefix; and the
    target's ``load_state_dict`` of those entries (prefix removed) into a fresh build of the
    module reproduces every slot's values (a lazy module's included: an uninitialized one
    loads a materialized one's tensors).

    Origin: ``nn.Module.state_dict``'s documented arguments and hooks
    (``register_state_dict_pre_hook``, ``register_state_dict_post_hook``); checkpoints saved
    with a prefix (a submodule saved inside a bigger model) or with ``keep_vars``.
    """
    form = data.draw(state_dict_forms(), label="state_dict form")
    example = Example(module)
    check = Checker("CHECKPOINT-STATE-DICT-FORMS", target, example)
    module = _with_lazy_norm(module, data.draw(st.booleans(), label="lazy norm initialized"))
    _perturb(module)
    earlier = {"earlier": torch.zeros(1)} if form["destination"] else None
    seen: list[tuple[str, Any, str]] = []
    handles = _register_state_dict_hooks(module, seen)
    try:
        result = _call_state_dict(module, form, earlier)
    finally:
        for handle in handles:
            handle.remove()
    _check_entries(check, module, form, result, earlier)
    for kind in ("pre", "post"):
        visits = sorted(((id(m), p) for k, m, p in seen if k == kind), key=repr)
        check.that(visits == _visits(module, form["prefix"]), "hooks",
                   f"state-dict {kind}-hooks ran {len(visits)} times, once per path expected")
    _check_load_back(check, target, module, result, form["prefix"])
    check.verdict(partial(script_repro, example, target, body=["observed = {}"]))


def _with_lazy_norm(tree: nn.Module, initialized: bool) -> nn.Module:
    """A root holding ``tree`` and an ``nn.LazyBatchNorm1d`` (lazy buffers), as ``lazy``; the
    norm initialized by one forward, or left uninitialized."""
    root = nn.Module()
    root.tree = tree
    root.lazy = nn.LazyBatchNorm1d()
    if initialized:
        root.lazy(torch.linspace(-1, 1, 6).reshape(2, 3))
    return root


def _fresh(root: nn.Module) -> nn.Module:
    """A fresh build of ``_with_lazy_norm``'s root: the tree rebuilt, the norm uninitialized."""
    return _with_lazy_norm(tree_info(root.tree).build(), initialized=False)


def _perturb(module: nn.Module) -> None:
    """Add one to every floating tensor that holds values, so a fresh build differs from it."""
    with torch.no_grad():
        for t in {id(t): t for t in named_tensors(module).values()}.values():
            if holds_values(t) and t.is_floating_point() and not t.is_sparse:
                add_one_(t)


def _check_entries(check: Checker, module: nn.Module, form: dict[str, Any], result: Any,
                   earlier: dict[str, Tensor] | None) -> None:
    """Clauses ``destination``, ``keys``, ``entry``."""
    if earlier is not None:
        check.that(result is earlier and "earlier" in result, "destination",
                   "state_dict did not return the given destination with its entries")
    expected = _expected_entries(module, form["prefix"])
    keys = [k for k in result if k != "earlier" or earlier is None]
    check.that(sorted(keys) == sorted(expected), "keys",
               f"state_dict gave keys {sorted(keys)}, expected {sorted(expected)}")
    for key, slot in expected.items():
        entry = result.get(key)
        if form["keep_vars"]:
            check.that(entry is slot, "entry", f"with keep_vars, {key!r} is not the slot itself")
        elif entry is not None and holds_values(slot) and not slot.is_sparse:
            check.that(not entry.requires_grad and entry.data_ptr() == slot.data_ptr(), "entry",
                       f"{key!r} is not a detached view of the slot")


def _check_load_back(check: Checker, target: Any, module: nn.Module, result: Any,
                     prefix: str) -> None:
    """Clause ``load-back``: the entries load into a fresh build and reproduce the values."""
    if target.load_state_dict is None:
        return
    fresh = _fresh(module)
    state = {k[len(prefix):]: v for k, v in result.items()
             if k.startswith(prefix) and k != "earlier"}
    loaded = attempt(lambda: target.load_state_dict(fresh, state, strict=True, assign=False,
                                                    swap=False))
    if not check.that(loaded.error is None, "load-back", f"loading the entries back raised "
                                                         f"{loaded.error!r}"):
        return
    want, got = _expected_entries(module, ""), _expected_entries(fresh, "")
    for name, t in want.items():
        if holds_values(t) and name in got and holds_values(got[name]):
            check.that(same_values(t.detach(), got[name].detach()), "load-back",
                       f"{name!r} did not load back its value")


# ---------------------------------------------------------------- load hooks and extra state


def _holder(module: nn.Module, state: Any) -> nn.Module:
    """A root holding the drawn tree as ``tree`` and an ``ExtraState(state)`` as ``extra``."""
    holder = nn.Module()
    holder.tree = module
    holder.extra = ExtraState(state)
    return holder


EXTRA_STATE_SOURCE = inspect.getsource(ExtraState).splitlines()
HOLDER_LINES = [*EXTRA_STATE_SOURCE, "holder = torch.nn.Module()", "holder.tree = module",
                "holder.extra = ExtraState(0)"]


@spec_property("CHECKPOINT-EXTRA-STATE", examples_divisor=4)
@given(module=loadable_trees, data=st.data())
def test_extra_state_round_trip(target, module, data):
    """A module's extra state is in its state dict under ``<path>._extra_state`` as the object
    ``get_extra_state`` returns; the target's ``load_state_dict`` hands the given
    ``_extra_state`` object to ``set_extra_state`` exactly once; without it a strict load
    raises torch's ``RuntimeError`` naming the key and changes nothing, a non-strict one
    reports it missing; an ``_extra_state`` key for a module without extra state is unexpected.

    Origin: ``nn.Module.get_extra_state``/``set_extra_state`` (documented: the extra state is
    saved in and loaded from the state dict; checkpoints of modules with Python-side state,
    such as quantization observers and Transformer Engine's FP8 metadata).
    """
    # tagged, so the saved and the given state are distinct objects that compare unequal
    old = ("saved", data.draw(extra_states(), label="saved state"))
    new = ("given", data.draw(extra_states(), label="given state"))
    given_as = data.draw(st.sampled_from(["given", "missing", "unexpected"]), label="extra key")
    strict = data.draw(st.booleans(), label="strict")
    holder = _holder(module, old)
    saved = holder.state_dict()
    state = dict(saved)
    if given_as == "missing":
        del state["extra._extra_state"]
    else:
        state["extra._extra_state"] = new
    if given_as == "unexpected":
        state["tree._extra_state"] = new
    example = Example(module, load=LoadInput(state, strict, assign=False, swap=False))
    check = Checker("CHECKPOINT-EXTRA-STATE", target, example)
    check.that(saved.get("extra._extra_state", None) is old, "saved",
               "the state dict does not hold get_extra_state's object under 'extra._extra_state'")
    before = snapshot_for_load(holder)
    outcome = attempt(lambda: target.load_state_dict(holder, state, strict=strict, assign=False,
                                                     swap=False))
    _check_extra_outcome(check, holder, outcome, given_as, strict, new, old, before)
    check.verdict(partial(script_repro, example, target, body=[
        *HOLDER_LINES,
        f"state = {{**holder.state_dict(), 'extra._extra_state': {_value_code(new)}}}",
        *([f"state['tree._extra_state'] = {_value_code(new)}"] if given_as == "unexpected"
          else []),
        *(["del state['extra._extra_state']"] if given_as == "missing" else []),
        f"out = outcome(lambda: target_load_state_dict(holder, state, strict={strict}, "
        "assign=False, swap=False))",
        "observed = {'extra state': repr(holder.extra.state), 'error': describe(out)}"]))


def _value_code(value: Any) -> str:
    """Python code for a drawn extra state: tensors as ``torch.tensor(...)``, tuples itemwise."""
    if isinstance(value, Tensor):
        return f"torch.tensor({value.tolist()!r})"
    if isinstance(value, tuple):
        return f"({', '.join(_value_code(v) for v in value)},)"
    return repr(value)


def _check_extra_outcome(check: Checker, holder: nn.Module, outcome: Outcome, given_as: str,
                         strict: bool, new: Any, old: Any, before: Any) -> None:
    """The clauses of CHECKPOINT-EXTRA-STATE after the load."""
    received = holder.extra.received
    key = "extra._extra_state" if given_as == "missing" else "tree._extra_state"
    if given_as != "given" and strict:
        check.that(isinstance(outcome.error, RuntimeError) and key in str(outcome.error),
                   "strict-error", f"expected torch's RuntimeError naming {key!r}, got "
                                   f"{outcome.error!r}")
        changed = changes(before, holder)
        check.that(not changed and holder.extra.state is old, "changed",
                   f"the refused load changed the module: {changed[:3]}, extra state "
                   f"{holder.extra.state!r} (was {old!r})", code="holder.extra.state == 0")
        return
    if not check.that(outcome.error is None, "raised", f"the load raised {outcome.error!r}"):
        return
    if given_as == "missing":
        check.that(received == [] and key in outcome.result.missing_keys, "missing",
                   f"{key!r} not reported missing: {outcome.result}, set_extra_state got "
                   f"{received}")
        return
    check.that(len(received) == 1 and received[0] is new, "set-extra-state",
               f"set_extra_state received {received}, expected the given object once")
    if given_as == "unexpected":
        check.that(key in outcome.result.unexpected_keys, "unexpected",
                   f"{key!r} not reported unexpected: {outcome.result}")


def _hooked_modules(holder: nn.Module) -> list[nn.Module]:
    return list({id(m): m for m in holder.modules()}.values())


@spec_property("CHECKPOINT-LOAD-HOOKS", examples_divisor=4)
@given(module=loadable_trees, data=st.data())
def test_load_hooks(target, module, data):
    """The target's ``load_state_dict`` runs each module's load pre-hooks once per path of the
    module, before loading it, with its prefix and the state dict's entries under that prefix,
    and its load post-hooks once per path, after its children, with the keys the load returns.

    Origin: ``register_load_state_dict_pre_hook``/``register_load_state_dict_post_hook``
    (their documented signatures; checkpoint converters rename keys in a pre-hook).
    """
    strict = data.draw(st.booleans(), label="strict")
    holder = _holder(module, 0)
    state = holder.state_dict()
    if not strict and state:
        dropped = data.draw(st.sampled_from(sorted(state)), label="dropped key")
        state = {k: v for k, v in state.items() if k != dropped}
    example = Example(module, load=LoadInput(state, strict, assign=False, swap=False))
    check = Checker("CHECKPOINT-LOAD-HOOKS", target, example)
    seen: list[tuple[str, int, Any]] = []
    handles = []
    for m in _hooked_modules(holder):
        handles.append(m.register_load_state_dict_pre_hook(
            lambda mod, sd, prefix, *rest: seen.append(("pre", id(mod), (prefix, sorted(sd))))))
        handles.append(m.register_load_state_dict_post_hook(
            lambda mod, keys: seen.append(("post", id(mod), keys))))
    try:
        outcome = attempt(lambda: target.load_state_dict(holder, state, strict=strict,
                                                         assign=False, swap=False))
    finally:
        for handle in handles:
            handle.remove()
    if check.that(outcome.error is None, "raised", f"the load raised {outcome.error!r}"):
        _check_hook_calls(check, holder, seen, state, outcome.result)
    check.verdict(partial(script_repro, example, target, body=[
        *HOLDER_LINES, "seen = []",
        "for m in holder.modules():",
        "    m.register_load_state_dict_pre_hook(",
        "        lambda mod, sd, prefix, *rest: seen.append(('pre', prefix, sorted(sd))))",
        "    m.register_load_state_dict_post_hook(lambda mod, keys: seen.append(('post', keys)))",
        f"state = {{k: v for k, v in holder.state_dict().items() if k in {sorted(state)!r}}}",
        f"out = outcome(lambda: target_load_state_dict(holder, state, strict={strict}, "
        "assign=False, swap=False))",
        "observed = {'hooks': repr(seen)}"]))


def _check_hook_calls(check: Checker, holder: nn.Module, seen: list[tuple[str, int, Any]],
                      state: dict[str, Any], result: Any) -> None:
    """Clauses ``pre-hook``, ``post-hook``, ``hook-order``, ``hook-keys``."""
    keys = sorted(state)
    paths = [(id(m), f"{p}." if p else "") for p, m in holder.named_modules(remove_duplicate=False)]
    pre = [(i, a[0]) for k, i, a in seen if k == "pre"]
    check.that(sorted(pre, key=repr) == sorted(paths, key=repr), "pre-hook",
               f"load pre-hooks ran {len(pre)} times for {len(paths)} module paths")
    # a norm layer fills in its own missing num_batches_tracked before its pre-hooks run
    filled = [key for key, _, _ in norm_defaults(holder, state)]
    check.that(all(a[1] == sorted([k for k in keys if k.startswith(a[0])]
                                  + [k for k in filled if k == f"{a[0]}num_batches_tracked"])
                   for kind, _, a in seen if kind == "pre"), "pre-hook",
               "a load pre-hook did not get the state dict's entries under its prefix")
    post = [i for k, i, _ in seen if k == "post"]
    check.that(sorted(post) == sorted(i for i, _ in paths), "post-hook",
               f"load post-hooks ran {len(post)} times for {len(paths)} module paths")
    check.that(_post_after_children(seen, holder), "hook-order",
               "a load post-hook ran before its module's children were loaded")
    check.that(all(k is result or tuple(k) == tuple(result) for kind, _, k in seen
                   if kind == "post"), "hook-keys",
               f"a load post-hook got other keys than the load returned: {result}")


def _post_after_children(seen: list[tuple[str, int, Any]], holder: nn.Module) -> bool:
    """Each module's first post-hook call comes after the first pre-hook call of each child."""
    order = [(k, i) for k, i, _ in seen]
    for m in _hooked_modules(holder):
        if ("post", id(m)) not in order:
            continue
        post = order.index(("post", id(m)))
        for child in m.children():
            if ("pre", id(child)) in order and order.index(("pre", id(child))) > post:
                return False
    return True


@spec_property("CHECKPOINT-POST-HOOK-RETURN", examples_divisor=4)
@given(module=loadable_trees, data=st.data())
def test_post_hook_returning_a_value(target, module, data):
    """A load post-hook that returns a value (instead of editing the keys in place) makes the
    target's ``load_state_dict`` raise torch's ``AssertionError`` and leaves the module exactly
    as it was.

    Origin: ``register_load_state_dict_post_hook`` ("not expected to return new values");
    swapspec spec: a refused load changes nothing.
    """
    holder = _holder(module, 0)
    state = {k: _changed(v) for k, v in holder.state_dict().items()}
    state["extra._extra_state"] = 1
    strict = data.draw(st.booleans(), label="strict")
    example = Example(module, load=LoadInput(state, strict, assign=False, swap=False))
    check = Checker("CHECKPOINT-POST-HOOK-RETURN", target, example)
    before = snapshot_for_load(holder)
    handle = holder.register_load_state_dict_post_hook(lambda mod, keys: "renamed")
    try:
        outcome = attempt(lambda: target.load_state_dict(holder, state, strict=strict,
                                                         assign=False, swap=False))
    finally:
        handle.remove()
    check.that(isinstance(outcome.error, AssertionError), "error",
               f"expected torch's AssertionError, got {outcome.error!r}")
    changed = changes(before, holder)
    check.that(not changed and holder.extra.state == 0, "changed",
               f"the refused load changed the module: {changed[:3]}; extra state "
               f"{holder.extra.state!r} (was 0)", code="holder.extra.state == 0")
    check.verdict(partial(script_repro, example, target, body=[
        *HOLDER_LINES, "module = holder", "before = {k: t.detach().clone() for k, t in "
        "named(module).items()}",
        "state = {k: (v + 1 if v.is_floating_point() else v) for k, v in "
        "module.state_dict().items() if isinstance(v, torch.Tensor)}",
        "state['extra._extra_state'] = 1",
        "holder.register_load_state_dict_post_hook(lambda mod, keys: 'renamed')",
        f"out = outcome(lambda: target_load_state_dict(module, state, strict={strict}, "
        "assign=False, swap=False))",
        "observed = {'changed': [k for k, t in named(module).items() if "
        "t.is_floating_point() and not torch.equal(t, before[k])]}"]))


def _changed(value: Any) -> Any:
    """A state-dict value with other values where it holds floating ones."""
    if isinstance(value, Tensor) and holds_values(value) and value.is_floating_point() \
            and not value.is_sparse:
        return plus_one(value)
    return value


# ---------------------------------------------------------------- parameter vectors


@spec_property("CHECKPOINT-VECTOR", examples_divisor=4)
@given(data=st.data())
def test_parameter_vector_round_trip(target, data):
    """After the target converts a module whose parameters share one floating dtype and are
    contiguous, ``parameters_to_vector`` gives their values in order in one vector of their
    total length, and ``vector_to_parameters`` of it leaves every parameter the same object
    with its dtype, shape and values; a vector that is not a tensor is refused with
    ``TypeError``.

    Origin: ``torch.nn.utils.parameters_to_vector``/``vector_to_parameters`` (second-order
    optimizers, evolution strategies and model averaging flatten a converted model's
    parameters; ``vector_to_parameters`` writes ``param.data`` one parameter at a time).
    """
    example, outcome = _draw_converted(target, data, float32_trees)
    assume(outcome.error is None)
    params = list(example.module.parameters())
    dtypes = {p.dtype for p in params}
    uniform = len(dtypes) == 1 and next(iter(dtypes)).is_floating_point \
        and all(holds_values(p) and not p.is_sparse and p.is_contiguous() for p in params)
    event(f"vector: {'one dtype' if uniform else 'mixed, non-contiguous or no parameters'}")
    assume(uniform)
    check = Checker("CHECKPOINT-VECTOR", target, example)
    values = [value_copy(p) for p in params]
    try:
        vector = torch.nn.utils.parameters_to_vector(params)
    except NotImplementedError:  # a host's tensor class without view: no vector to check
        event("vector: a tensor class without the ops parameters_to_vector needs")
        assume(False)
    check.that(vector.numel() == sum(p.numel() for p in params)
               and same_values(vector, torch.cat([v.reshape(-1) for v in values])), "vector",
               "parameters_to_vector does not give the parameters' values in order")
    not_tensor = [0.0] * vector.numel()
    refused = attempt(lambda: torch.nn.utils.vector_to_parameters(not_tensor, params))
    check.that(isinstance(refused.error, TypeError), "not-tensor",
               f"a list for the vector gave {refused.error!r}, expected TypeError")
    torch.nn.utils.vector_to_parameters(vector, params)
    after = list(example.module.parameters())
    check.that(len(after) == len(params) and all(a is p for a, p in zip(after, params,
                                                                          strict=False)),
               "identity", "vector_to_parameters replaced a parameter object")
    for p, v in zip(params, values, strict=True):
        check.that(p.dtype == v.dtype and p.shape == v.shape and same_values(p.detach(), v),
                   "value", "vector_to_parameters changed a parameter's dtype, shape or values")
    check.verdict(partial(script_repro, example, target, body=[
        *_convert_lines(example), "observed = {}"]))


# ---------------------------------------------------------------- meta modules


meta_trees = module_trees(lazy=False, wrapper_chance=0, worlds=("meta",), world_chance=100,
                          training_chance=0, needs=("tensor",))
META_MESSAGE = "Please use torch.nn.Module.to_empty() instead of torch.nn.Module.to()"


@spec_property("CHECKPOINT-META-TO", examples_divisor=4)
@given(module=meta_trees, data=st.data())
def test_meta_module_to_is_refused(target, module, data):
    """Moving a module whose tensors are on ``meta`` to a real device with the target's ``to``
    raises torch's ``NotImplementedError`` that points to ``to_empty``, and leaves the module
    exactly as it was.

    Origin: deferred initialization (a model built under ``torch.device('meta')`` and
    materialized with ``to_empty`` before its checkpoint is loaded); ``Module.to``'s own error.
    """
    assume(any(t.is_meta for t in named_tensors(module).values()))
    flags = data.draw(flag_settings(), label="flags")
    example = Example(module, flags=flags)
    check = Checker("CHECKPOINT-META-TO", target, example)
    before = snapshot_for_load(module)
    outcome = attempt(lambda: target.method("to")(module, "cpu", overwrite=flags.overwrite,
                                                  swap=flags.swap))
    check.that(isinstance(outcome.error, NotImplementedError)
               and META_MESSAGE in str(outcome.error), "error",
               f"expected torch's NotImplementedError naming to_empty, got {outcome.error!r}")
    changed = changes(before, module)
    check.that(not changed, "changed", f"the refused move changed the module: {changed[:3]}")
    check.verdict(partial(script_repro, example, target, body=[
        "snap = snapshot(module)",
        f"out = outcome(lambda: target_method(module, 'to', {flags.overwrite}, {flags.swap}, "
        "'cpu'))",
        "observed = {'error': describe(out), **state(module, snap)}"]))


# ---------------------------------------------------------------- checkpoint containers


NOT_MAPPINGS = ("items", "values", "tensor")
NOT_MAPPING_CODE = {"items": "list(module.state_dict().items())",
                    "values": "tuple(module.state_dict().values())", "tensor": "torch.zeros(1)"}


def _not_a_mapping(state: dict[str, Any], form: str) -> Any:
    """The state dict as a checkpoint mistaken for one: its ``(key, value)`` pairs, its values,
    or its first value alone."""
    if form == "items":
        return list(state.items())
    if form == "values":
        return tuple(state.values())
    return next(iter(state.values()), torch.zeros(1))


@spec_property("CHECKPOINT-NOT-A-MAPPING", examples_divisor=4)
@given(module=loadable_trees, data=st.data())
def test_load_refuses_a_non_mapping(target, module, data):
    """The target's ``load_state_dict`` refuses a state dict that is not a mapping (its pairs,
    its values, one tensor) with torch's ``TypeError("Expected state_dict to be dict-like,
    got <type>.")`` and leaves the module exactly as it was.

    Origin: ``nn.Module.load_state_dict``'s check of its argument; checkpoints saved as
    ``list(model.state_dict().items())`` or as a whole training state.
    """
    form = data.draw(st.sampled_from(NOT_MAPPINGS), label="form")
    strict = data.draw(st.booleans(), label="strict")
    given_state = _not_a_mapping({k: _changed(v) for k, v in module.state_dict().items()}, form)
    example = Example(module)
    check = Checker("CHECKPOINT-NOT-A-MAPPING", target, example)
    before = snapshot_for_load(module)
    outcome = attempt(lambda: target.load_state_dict(module, given_state, strict=strict,
                                                     assign=False, swap=False))
    check.that(isinstance(outcome.error, TypeError)
               and f"got {type(given_state)}" in str(outcome.error), "error",
               f"expected torch's TypeError naming {type(given_state)}, got {outcome.error!r}")
    changed = changes(before, module)
    check.that(not changed, "changed", f"the refused load changed the module: {changed[:3]}")
    check.verdict(partial(script_repro, example, target, body=[
        "snap = snapshot(module)",
        f"given = {NOT_MAPPING_CODE[form]}",
        f"out = outcome(lambda: target_load_state_dict(module, given, strict={strict}, "
        "assign=False, swap=False))",
        "observed = {'error': describe(out), **state(module, snap)}"]))
