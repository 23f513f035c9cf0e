"""Properties of ``apply`` on modules in training: forward, tensor hooks, optimizers.

Each converts a tree with a drawn conversion and flags, then checks that what training code
holds on to still works: the module's forward, the hooks registered on its parameters, an
optimizer built before the conversion.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import apply_repro
from swapspec.properties.harness.target_calls import run_converted
from swapspec.properties.models.apply_state import (
    WORLD_CHANCE,
    converted_like,
    distinct,
    expected_path,
    is_uninitialized,
    snapshot_for_apply,
)
from swapspec.properties.models.call_state import fresh_copy_holding
from swapspec.properties.models.examples import Example, named_tensors, same_values, value_copy
from swapspec.properties.models.load_examples import changes, snapshot_for_load
from swapspec.properties.models.outcomes import Outcome, attempt, same_output
from swapspec.properties.models.standalone import tensor_code
from swapspec.properties.rules.clauses import no_error
from swapspec.strategies import (
    conversions,
    flag_settings,
    forward_inputs,
    module_trees,
)
from swapspec.strategies.conversions import CONVERSIONS, among, trainable_on_cpu
from swapspec.strategies.decorations import KINDS as DECORATION_KINDS
from swapspec.strategies.decorations import OLD_STYLE
from swapspec.strategies.method_calls import METHOD_CONVERSIONS, method_conversions
from swapspec.strategies.trees import WRAPPERS

trees = module_trees(lazy=False, wrappers=WRAPPERS, world_chance=WORLD_CHANCE)
trainable_trees = module_trees(lazy=False, wrappers=WRAPPERS, world_chance=WORLD_CHANCE,
                               needs=("trainable",))
# The conversion under test is drawn as ``_apply(fn)`` or, one chance in two, as the public
# method call (``module.half()``...; no ``share_memory()``, which kills the interpreter on the
# TwoTensor world's parameters).
cpu_conversions = st.one_of(
    conversions(devices=(), raising=False),
    method_conversions(devices=(), where=lambda c: c.call.method != "share_memory"))
# Conversions after which backward() still runs on CPU: dense, real floating results.
BACKWARD_SAFE = ("float()", "double()", "half()", "bfloat16()", "to(torch.float64)", "cpu()",
                 "share_memory()", "add(1)", "to_empty(device='cpu')",
                 "to(memory_format=torch.channels_last)")
BACKWARD_SAFE_METHODS = ("module.float()", "module.double()", "module.half()",
                         "module.bfloat16()", "module.to(torch.float64)", "module.cpu()",
                         "module.to(dtype=torch.float16)", "module.to('cpu', torch.float64, True)",
                         "module.to(torch.empty(0, dtype=torch.float64))",
                         "module.to_empty(device='cpu')",
                         "module.to(memory_format=torch.channels_last)")
# ... and the running target's own conversions that say they keep a module trainable.
backward_apply_conversions = among([c for c in CONVERSIONS if c.name in BACKWARD_SAFE],
                                   host=trainable_on_cpu)
backward_conversions = st.one_of(
    backward_apply_conversions,
    st.sampled_from([c for c in METHOD_CONVERSIONS if c.name in BACKWARD_SAFE_METHODS]))
# (class, keywords besides lr=0.1): plain SGD keeps no state, SGD with momentum a
# momentum_buffer per parameter, Adam exp_avg, exp_avg_sq and step.
OPTIMIZERS = (("SGD", {}), ("SGD", {"momentum": 0.9}), ("Adam", {}))
# Conversions the module went through before the one under test (a module's life converts it
# more than once: to(device), then half() for inference...), as ``_apply(fn)``.
earlier_conversions = st.lists(backward_apply_conversions, max_size=2)


def _apply_earlier(target, module, flags, earlier) -> None:
    """Run the earlier conversions on the target; an example where one fails is not this
    property's (the one-shot properties judge each conversion)."""
    for conversion in earlier:
        done = attempt(lambda c=conversion: target.apply(module, c.make_fn(), overwrite=flags.overwrite,
                                                         swap=flags.swap))
        assume(done.error is None)


def _earlier_lines(flags, earlier) -> list[str]:
    """Repro lines that run the earlier conversions the way the example did."""
    lines = []
    for i, conversion in enumerate(earlier):
        lines += [*conversion.imports.splitlines(), f"fn{i} = {conversion.repro}",
                  f"target_apply(module, fn{i}, overwrite={flags.overwrite}, swap={flags.swap})"]
    return lines


def _setup(target, property_id, module, conversion, flags, earlier=()):
    example = Example(module, conversion=conversion, flags=flags, earlier=tuple(earlier))
    snap = snapshot_for_apply(module, conversion.make_fn, flags=flags)
    assume(snap.expected_error is None)
    assume(not snap.swap_refused)  # a refused swap is APPLY-REFUSED-SWAP's business
    return example, Checker(property_id, target, example), snap


def _verdict(check: Checker, example: Example, target, *, setup: list[str] = (),
             extra: list[str] = (), observe: dict[str, str] | None = None) -> None:
    check.verdict(partial(apply_repro, example, target, setup=list(setup), extra=list(extra),
                          observe=observe))


@spec_property("APPLY-FORWARD")
@given(module=trees, earlier=earlier_conversions, conversion=cpu_conversions, flags=flag_settings(),
       inputs=forward_inputs())
def test_apply_module_still_works(target, module, earlier, conversion, flags, inputs):
    """After a conversion, forward equals the forward of a fresh build holding the converted tensors.

    The module may have been converted up to twice before (with the same flags).
    The fresh build gets a clone of every converted tensor (one clone per object, so ties stay
    ties) through ``setattr``, so nothing the conversion left stale inside the module (an RNN's
    ``_flat_weights``, a cached reparametrized weight) can hide. Both raising the same error
    type counts as equal. Origin: pytorch #17072 follow-ups: ``RNNBase._apply`` must rebuild
    ``_flat_weights`` or a converted LSTM runs on the old weights.
    """
    _apply_earlier(target, module, flags, earlier)
    example, check, _ = _setup(target, "APPLY-FORWARD", module, conversion, flags, earlier)
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        fresh = fresh_copy_holding(module)
        (x,) = inputs
        converted_out = attempt(lambda: module(input_for(module, x)))
        fresh_out = attempt(lambda: fresh(input_for(fresh, x)))
        check.that(same_output(converted_out, fresh_out), "stale-forward",
                   f"forward after the conversion {_shown(converted_out)}, but a fresh build "
                   f"holding the converted tensors {_shown(fresh_out)}",
                   code="torch.equal(module(x.clone()), fresh(x.clone()))")
    _verdict(check, example, target, setup=_earlier_lines(flags, earlier),
             extra=_fresh_lines(inputs[0]),
             observe={"forward": "describe(converted_out)", "fresh forward": "describe(fresh_out)"})


def _shown(outcome: Outcome) -> str:
    if outcome.error is not None:
        return f"raised {type(outcome.error).__name__}: {outcome.error}"
    out = outcome.result
    return f"returned a {type(out).__name__} {out.dtype} {tuple(out.shape)}"


def _fresh_lines(x: torch.Tensor) -> list[str]:
    return [
        f"x = {tensor_code(x)}",
        "fresh = build_module()  # the same tree, built afresh, holding clones of the converted tensors:",
        "clones = {}",
        "for name, t in named(module).items():  # one clone per object: ties stay ties",
        "    owner, _, key = name.rpartition('.')",
        "    c = clones.setdefault(id(t), torch.nn.Parameter(t.detach().clone(), t.requires_grad)"
        " if isinstance(t, torch.nn.Parameter) else t.detach().clone())",
        "    setattr(fresh.get_submodule(owner) if owner else fresh, key, c)",
        "converted_out, fresh_out = outcome(lambda: module(x.clone())), outcome(lambda: fresh(x.clone()))",
    ]


@spec_property("APPLY-TENSOR-HOOKS")
@given(module=trainable_trees, earlier=earlier_conversions, conversion=backward_conversions,
       flags=flag_settings(), inputs=forward_inputs())
def test_apply_keeps_tensor_hooks(target, module, earlier, conversion, flags, inputs):
    """A hook registered on a parameter before a conversion still fires after it, on every path;
    so does one registered after the conversion. The hooks registered first also survive up to
    two earlier conversions.

    Both ``register_hook`` and ``register_post_accumulate_grad_hook`` are checked: after one
    ``backward()``, each hook fires once for every parameter that received a grad.
    Origin: training code (gradient clipping, DDP-style reducers, logging) registers hooks on
    parameters before ``model.to(...)``; the overwrite path makes new parameter objects.
    """
    params = [p for p in distinct(list(module.parameters()))
              if p.requires_grad and not is_uninitialized(p)]
    assume(params)  # a safety net: needs=("trainable",) gives every tree one
    fired: Counter[str] = Counter()
    names_of = {id(p): [n for n, t in named_tensors(module).items() if t is p] for p in params}
    for p in params:
        _count_hooks(p, fired, f"before:{names_of[id(p)][0]}")
    _apply_earlier(target, module, flags, earlier)
    example, check, _ = _setup(target, "APPLY-TENSOR-HOOKS", module, conversion, flags, earlier)
    outcome = run_converted(target, example)
    if no_error(check, outcome, "apply"):
        after = named_tensors(module)
        for p in params:
            now = after[names_of[id(p)][0]]
            now.grad = None
            _count_hooks(now, fired, f"after:{names_of[id(p)][0]}")
        ran = _backward(module, inputs[0])
        # A CPU kernel missing for the converted dtype ("orgqr_cpu" for Half) is not about hooks.
        assume(not isinstance(ran.error, NotImplementedError))
        assume(not fails_without_the_conversion(module, inputs[0], ran))
        if no_error(check, ran, "forward and backward after the conversion"):
            for p in params:
                name = names_of[id(p)][0]
                got_grad = after[name].grad is not None
                for when in ("before", "after"):
                    for kind in ("hook", "post-accumulate"):
                        key = f"{when}:{name}:{kind}"
                        check.that(fired[key] == int(got_grad), f"{when}-hook-lost",
                                   f"{kind} hook registered on {name!r} {when} the conversion "
                                   f"fired {fired[key]} time(s); {name!r} received "
                                   f"{'a' if got_grad else 'no'} grad",
                                   code=f"fired[{key!r}] == {int(got_grad)}")
    names = [names_of[id(p)][0] for p in params]
    _verdict(check, example, target,
             setup=[*_hook_lines(names, "before"), *_earlier_lines(flags, earlier)],
             extra=[*_hook_lines(names, "after"), *_backward_lines(inputs[0])],
             observe={"hooks fired": "dict(sorted(fired.items()))"})


def _hook_lines(names: list[str], when: str) -> list[str]:
    lines = ["import collections", "fired = collections.Counter()"] if when == "before" else []
    lines.append(f"for name in {names!r}:  # counting hooks, registered {when} the conversion")
    if when == "after":
        lines.append("    named(module)[name].grad = None")
    return [*lines,
            f"    named(module)[name].register_hook(lambda g, k='{when}:' + name: "
            "fired.update([k + ':hook']))",
            f"    named(module)[name].register_post_accumulate_grad_hook(lambda p, k='{when}:' + "
            "name: fired.update([k + ':post-accumulate']))"]


def _backward_lines(x: torch.Tensor) -> list[str]:
    return [f"out = module({tensor_code(x)})",
            "if out.requires_grad:", "    out.float().sum().backward()"]


def _count_hooks(param: torch.Tensor, fired: Counter, key: str) -> None:
    param.register_hook(lambda g: fired.update([f"{key}:hook"]))
    param.register_post_accumulate_grad_hook(lambda p: fired.update([f"{key}:post-accumulate"]))


def input_for(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x``, on ``meta`` when every tensor of the module is there (a tree built on
    ``meta`` and not given storage yet runs on meta inputs only)."""
    devices = {t.device.type for t in named_tensors(module).values()}
    return x.to("meta") if devices == {"meta"} else x.clone()


def _backward(module: torch.nn.Module, x: torch.Tensor) -> Outcome:
    def run():
        with torch.enable_grad():
            out = module(input_for(module, x))
            if out.requires_grad:
                out.float().sum().backward()

    return attempt(run)


def fails_without_the_conversion(module: torch.nn.Module, x: torch.Tensor, ran: Outcome) -> bool:
    """Whether ``ran`` (forward and backward of the converted ``module``) raised, and a fresh
    build holding clones of the converted tensors raises the same error type: then the error
    belongs to the tree (``.item()`` in a forward on a ``meta``-world tree), not to the
    conversion. The fresh build shares no tensor with ``module``, so no hook of it fires."""
    return ran.error is not None and same_output(ran, _backward(fresh_copy_holding(module), x))


def optimizer_state(opt: torch.optim.Optimizer) -> dict[int, tuple[object, dict[str, object]]]:
    """``{id(parameter): (parameter, {key: (object, a copy of its value)})}`` of ``opt.state``."""
    def kept(v: object) -> tuple[object, object]:
        return v, v.detach().clone() if isinstance(v, torch.Tensor) else v

    return {id(p): (p, {k: kept(v) for k, v in entry.items()}) for p, entry in opt.state.items()}


def _check_optimizer_state(check: Checker, before: dict, opt: torch.optim.Optimizer,
                           names_of: dict[int, str]) -> None:
    """Clause ``optimizer-state``: ``opt.state`` has the same parameter keys as ``before``, and
    each entry the same objects with the same values (a conversion never reads an optimizer)."""
    after = {id(p): entry for p, entry in opt.state.items()}
    check.that(set(after) == set(before), "optimizer-state",
               f"the optimizer's state has {len(after)} parameter entries, {len(before)} before "
               "the conversion")
    for key, (_held, entry) in before.items():  # _held keeps the id from being reused
        now, name = after.get(key, {}), names_of.get(key, "?")
        for field, (obj, value) in entry.items():
            same = now.get(field) is obj and (not isinstance(value, torch.Tensor)
                                               or same_values(obj, value))
            check.that(same, "optimizer-state",
                       f"the optimizer's state[{name!r}][{field!r}] was replaced or changed by "
                       "the conversion")


@spec_property("APPLY-OPTIMIZER")
@given(module=trainable_trees, conversion=backward_conversions, flags=flag_settings(),
       optimizer=st.sampled_from(OPTIMIZERS), inputs=forward_inputs())
def test_apply_keeps_optimizer_parameters(target, module, conversion, flags, optimizer, inputs):
    """An optimizer built (and stepped) before the conversion holds the module's parameters after
    it, wherever the path promises identity (set_data and swap); its per-parameter state is
    untouched on every path: the same keys, each entry's objects, and their values.

    Origin: the documented recipe "move the model
    before building the optimizer" exists because the overwrite path (and ``model.to(xla)``)
    leaves optimizers holding the old parameters; ``_apply`` never reads an optimizer.
    """
    params = [p for p in distinct(list(module.parameters()))
              if p.requires_grad and not is_uninitialized(p)]
    assume(params)
    name, keywords = optimizer
    opt = getattr(torch.optim, name)(params, lr=0.1, **keywords)
    opt.zero_grad(set_to_none=True)  # the grads of this training step only
    assume(_backward(module, inputs[0]).error is None)
    assume(attempt(opt.step).error is None)  # Adam refuses sparse grads
    example, check, snap = _setup(target, "APPLY-OPTIMIZER", module, conversion, flags)
    names_of = {id(p): next(n for n, t in snap.names.items() if t is p) for p in params}
    state_before = optimizer_state(opt)
    outcome = run_converted(target, example)
    _check_optimizer_state(check, state_before, opt, names_of)
    if no_error(check, outcome, "apply"):
        after = named_tensors(module)
        held = opt.param_groups[0]["params"]
        for index, (p, old) in enumerate(zip(held, params, strict=True)):
            name = names_of[id(old)]
            path = expected_path(old, snap.expected[id(old)], flags.overwrite, flags.swap)
            if path == "overwrite":
                continue
            check.that(p is after[name], "optimizer-stale",
                       f"the optimizer holds another object than {name!r} after the {path} path",
                       code=f"opt.param_groups[0]['params'][{index}] is "
                            f"named(module)[{name!r}]")
    names = [names_of[id(p)] for p in params]
    _verdict(check, example, target, setup=[
        f"opt = torch.optim.{name}([named(module)[n] for n in {names!r}], lr=0.1"
        + "".join(f", {k}={v!r}" for k, v in keywords.items()) + ")",
        "opt.zero_grad(set_to_none=True)", *_backward_lines(inputs[0]), "opt.step()"],
        observe={"optimizer holds": "[describe(p, labels(snap)) for p in opt.param_groups[0]['params']]"})


# ---------------------------------------------------------------- a grad of another dtype

# No old-style reparametrization (torch's swap refuses the tensors its computed attribute holds:
# APPLY-REFUSED-SWAP's business), no tie and no shared submodule (torch runs fn once per path:
# APPLY-FN-ONCE's), which would hide this rule's outcome behind theirs.
grad_trees = module_trees(lazy=False, world_chance=0, needs=("grad", "leaf-grads"), ties=False,
                          sharing=False,
                          decoration_kinds=tuple(k for k in DECORATION_KINDS if k not in OLD_STYLE))
MISMATCH_DTYPES = (torch.float32, torch.float64)


def mismatched_parameters(module: torch.nn.Module) -> list[str]:
    """The first names of the parameters with a dense floating grad that ``.data =`` can give
    another dtype (the state this property draws)."""
    seen: set[int] = set()
    names = []
    for name, p in module.named_parameters():
        if id(p) not in seen and p.grad is not None and p.grad.layout == torch.strided \
                and p.is_floating_point() and type(p.data) is torch.Tensor:
            seen.add(id(p))
            names.append(name)
    return names


def converted_dtypes(param: torch.Tensor, fn) -> tuple[torch.dtype, torch.dtype] | None:
    """``(fn(param).dtype, fn(param.grad).dtype)``, or None where ``fn`` raises on either."""
    with torch.no_grad():
        done = attempt(lambda: (fn(param.detach()).dtype, fn(param.grad).dtype))
    return done.result


@spec_property("APPLY-GRAD-MISMATCH")
@given(module=grad_trees, conversion=conversions(devices=(), raising=False),
       flags=flag_settings(), data=st.data())
def test_apply_converts_a_grad_of_another_dtype(target, module, conversion, flags, data):
    """A parameter whose grad has another dtype (``param.data = param.data.to(dtype)`` after a
    backward makes that state) converts like any other: where the conversion succeeds, the
    parameter holds ``fn(param)`` and its grad ``fn(grad)`` (their dtypes; their values where
    the conversion keeps values); it succeeds wherever the two
    converted dtypes agree; and where it raises (torch's ``.grad`` setter refuses a grad of
    another dtype on the swap and overwrite paths) it raises ``RuntimeError`` and changes
    nothing.

    Origin: ``Module._apply``'s grad handling (``param.grad.data =`` on the set_data path,
    ``.grad =`` otherwise) and the ``.grad`` setter's dtype check; swapspec spec (raising
    changes nothing).
    """
    names = mismatched_parameters(module)
    # Parameter subclasses refuse Parameter(fn(p)) where fn returns them unchanged, a refusal of
    # its own (declared `torch.apply.swap-refuses-subclass`) that would hide this one.
    assume(names and all(type(p) is torch.nn.Parameter for p in module.parameters()))
    name = data.draw(st.sampled_from(names), label="parameter")
    param = module.get_parameter(name)
    dtype = data.draw(st.sampled_from([d for d in MISMATCH_DTYPES if d != param.dtype]),
                      label="dtype")
    with torch.no_grad():
        param.data = param.data.to(dtype)
    converted = converted_dtypes(param, conversion.make_fn())
    assume(converted is not None)
    example, check, _ = _setup(target, "APPLY-GRAD-MISMATCH", module, conversion, flags)
    expected = (value_copy(param), value_copy(param.grad))
    before = snapshot_for_load(module)
    outcome = run_converted(target, example)
    if outcome.error is not None:
        check.that(isinstance(outcome.error, RuntimeError), "raised",
                   f"the conversion raised {outcome.error!r}, expected RuntimeError")
        check.that(converted[0] != converted[1], "raised",
                   f"the conversion raised {outcome.error!r}, but the converted parameter and "
                   f"grad agree in dtype ({converted[0]})")
        changed = changes(before, module)
        check.that(not changed, "unchanged", f"the refused conversion changed {changed[:4]}")
    else:
        fn = conversion.make_fn()
        now = module.get_parameter(name)
        with torch.no_grad():
            want = (fn(expected[0]), fn(expected[1]))
        values = conversion.preserves_values
        check.that(now.grad is not None and converted_like(now.detach(), want[0], values)
                   and converted_like(now.grad, want[1], values), "values",
                   f"{name} holds {now.dtype} with a {getattr(now.grad, 'dtype', None)} grad; "
                   f"expected fn(param) {want[0].dtype} with fn(grad) {want[1].dtype}")
    _verdict(check, example, target,
             setup=[f"p = module.get_parameter({name!r})", f"p.data = p.data.to({dtype})"])
