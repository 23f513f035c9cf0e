"""Properties of the target's ``functional_call`` under ``torch.func``'s transforms: what
``functional_call`` is for (``torch.func.grad`` over a module's parameters). One rule per test.

Each property draws a tree with a trainable parameter (``module_trees(needs=('trainable',))``,
plain tensors), gives the target every trainable floating parameter and every buffer as fresh
copies, and differentiates the summed output with respect to the parameters given.

Origin: ``torch.func.functional_call``'s documentation (its purpose: ``torch.func.grad``,
``jacrev``, ``vmap`` over a module's parameters) and the ``torch.func`` tutorial on per-sample
gradients.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import asserting_repro
from swapspec.properties.harness.targets import builtin_target
from swapspec.properties.models.examples import Example, same_values, value_copy
from swapspec.properties.models.invariants import input_for
from swapspec.properties.models.load_examples import changes, snapshot_for_load
from swapspec.properties.models.outcomes import attempt, seeded_attempt
from swapspec.properties.models.standalone import world_lines
from swapspec.strategies import module_trees
from swapspec.strategies.calls import CallInput
from swapspec.strategies.decorations import KINDS as DECORATION_KINDS
from swapspec.strategies.decorations import OLD_STYLE
from swapspec.strategies.ensembles import (
    EXTRA_NAME,
    UNLIKE,
    Ensemble,
    departs,
    ensemble_models,
    ensembles,
    skeleton_of,
)

trainable_trees = module_trees(lazy=False, needs=("trainable",))
# Gradients of one call through two autograd paths agree to within the rounding of the least
# precise dtype the call computes in (the summed output is float32).
TOLERANCES = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4}


def transformable(module: nn.Module) -> bool:
    """Whether ``torch.func`` can differentiate the module's forward: no module holds a full
    backward hook or backward pre-hook, which torch runs through ``BackwardHookFunction``, an
    ``autograd.Function`` without the ``setup_context`` functorch's transforms need (torch's
    documented limit of ``torch.func``, whatever the functional call)."""
    globals_full = bool(torch.nn.modules.module._global_backward_pre_hooks) or (
        bool(torch.nn.modules.module._global_backward_hooks)
        and torch.nn.modules.module._global_is_full_backward_hook)
    return not globals_full and not any(
        m._backward_pre_hooks or (m._backward_hooks and m._is_full_backward_hook)
        for m in module.modules())


# torch.func's documented limit: an autograd.Function without setup_context in forward.
BEYOND_TORCH_FUNC = "must override the setup_context staticmethod"


def beyond_torch_func(error: BaseException) -> bool:
    """Whether ``error`` is ``torch.func`` refusing an ``autograd.Function`` that has no
    ``setup_context`` (a module's own, as ``nn.LinearCrossEntropyLoss``'s), which no functional
    call can change."""
    return isinstance(error, RuntimeError) and BEYOND_TORCH_FUNC in str(error)


def given_parameters(module: nn.Module) -> dict[str, Tensor]:
    """A copy of each trainable floating (real) parameter, by its first name."""
    return {name: value_copy(p) for name, p in module.named_parameters()
            if p.requires_grad and p.is_floating_point()}


def given_buffers(module: nn.Module) -> dict[str, Tensor]:
    """Each buffer by its first name, as the module holds it (copied at every call)."""
    return dict(module.named_buffers())


def summed_call(target: Any, module: nn.Module, buffers: dict[str, Tensor], x: Tensor):
    """``params -> target.functional_call(module, {**copies of buffers, **params}, (x,))``
    summed to a real float32 scalar: the function both gradient paths differentiate, each under
    the same seeded RNG (``seeded_attempt``: dropout drops the same entries)."""
    keywords = target.call_keywords(tie_weights=True, strict=False)

    def loss(params: dict[str, Tensor]) -> Tensor:
        tensors = {**{n: value_copy(b) for n, b in buffers.items()}, **params}
        return target.functional_call(module, tensors, (x,), {}, **keywords).real.float().sum()

    return loss


def backward_grads(loss: Any, params: dict[str, Tensor]) -> dict[str, Tensor]:
    """Each parameter's gradient by ``backward()`` through ``loss`` of fresh leaves (zeros where
    backward reaches none)."""
    leaves = {n: value_copy(p).requires_grad_() for n, p in params.items()}
    loss(leaves).backward()
    return {n: leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            for n, leaf in leaves.items()}


def tolerance(module: nn.Module) -> float:
    """The relative tolerance of the least precise floating dtype among the module's tensors and
    float32 (``TOLERANCES``)."""
    dtypes = {t.dtype for t in (*module.parameters(), *module.buffers())} | {torch.float32}
    return max(TOLERANCES.get(d, 0.0) for d in dtypes)


def differing(grads: dict[str, Tensor], expected: dict[str, Tensor], tol: float) -> list[str]:
    """The names whose gradients differ beyond ``tol`` (relative, and absolute on the scale of
    the largest entry; NaN where both are NaN is no difference)."""
    out = []
    for name, want in expected.items():
        got = grads.get(name)
        scale = max(1.0, float(want.abs().max()) if want.numel() else 1.0)
        if got is None or got.shape != want.shape or not torch.allclose(
                got.double(), want.double(), rtol=tol, atol=tol * scale, equal_nan=True):
            out.append(name)
    return out


@spec_property("FC-FUNC-GRAD")
@given(data=st.data())
def test_fc_func_grad_gives_the_gradients_backward_gives(target, data):
    """``torch.func.grad`` over the target's functional call gives each given parameter the
    gradient that ``backward()`` through the same call gives it (zero where backward reaches
    none); it raises only where that backward raises or forward runs an ``autograd.Function``
    ``torch.func`` cannot transform (a full backward hook's, a module's own without
    ``setup_context``); and, raising or not, it leaves the module as it was (its slots hold the
    same objects, values and grads).

    Origin: ``torch.func.functional_call``'s documentation (``torch.func.grad`` over the
    parameters given); swapspec spec (the transform sees the call as backward does, and the
    module is put back as after any call).
    """
    module = data.draw(trainable_trees, label="module")
    x, params, buffers = input_for(module), given_parameters(module), given_buffers(module)
    copies = {n: value_copy(b) for n, b in buffers.items()}  # as each call gets them
    example = Example(module, call=CallInput({**copies, **params}, (x,), {}))
    check = Checker("FC-FUNC-GRAD", target, example)
    loss = summed_call(target, module, buffers, x)
    before = snapshot_for_load(module)
    transformed = seeded_attempt(lambda: torch.func.grad(loss)(params))
    check.that(not changes(before, module), "restored",
               f"the module changed under torch.func.grad: {changes(before, module)[:4]}")
    expected = seeded_attempt(lambda: backward_grads(loss, params))
    event(f"func.grad: {'raised' if transformed.error else 'returned'}; "
          f"backward: {'raised' if expected.error else 'returned'}")
    if transformed.error is not None and (not transformable(module)
                                          or beyond_torch_func(transformed.error)):
        event("func.grad: a full backward hook (torch.func cannot transform it)")
    elif transformed.error is not None:
        check.that(expected.error is not None, "raised",
                   f"torch.func.grad raised {transformed.error!r} where backward returns")
    elif expected.error is None:
        wrong = differing(transformed.result, expected.result, tolerance(module))
        check.that(not wrong, "grads",
                   f"torch.func.grad and backward give {wrong} different gradients")
    check.verdict(lambda violations: _repro(example, target, params, buffers, violations))


def _repro(example: Example, target: Any, params: dict[str, Tensor],
           buffers: dict[str, Tensor], violations: list) -> str:
    x = input_for(example.module)
    body = [
        f"x = torch.linspace(-2, 2, {x.numel()}).reshape{tuple(x.shape)}",
        f"params = {{n: module.get_parameter(n).detach().clone() for n in {sorted(params)!r}}}",
        f"buffers = {{n: module.get_buffer(n) for n in {sorted(buffers)!r}}}",
        "def loss(ps):",
        "    tensors = {**{n: b.detach().clone() for n, b in buffers.items()}, **ps}",
        "    return target_functional_call(module, tensors, (x,), {}).real.float().sum()",
        "before = {n: t.detach().clone() for n, t in module.state_dict(keep_vars=True).items()}",
        "grads = torch.func.grad(loss)(params)",
        "leaves = {n: p.clone().requires_grad_() for n, p in params.items()}",
        "loss(leaves).backward()",
        "backward = {n: l.grad if l.grad is not None else torch.zeros_like(l) for n, l in leaves.items()}",
    ]
    asserts = [("all(torch.allclose(grads[n].double(), backward[n].double(), rtol=1e-3, "
                "atol=1e-3, equal_nan=True) for n in params)", "torch.func.grad and backward give different gradients"),
               ("all(torch.equal(before[n], t.detach()) for n, t in "
                "module.state_dict(keep_vars=True).items())", "the module changed")]
    return asserting_repro(example, target, body, asserts)


# ---------------------------------------------------------------- ensembles (torch.func)

# Trees that deepcopy (leaf grads only, no old-style reparametrization: its computed attribute
# carries a graph), with no forward behaviour of a generic leaf, no wrapper and no submodule
# under two paths (torch's restore of a shared slot is FC-RESTORE's): an ensemble is copies of
# one model, all run by one vmapped call.
ensemble_trees = module_trees(lazy=False, wrapper_chance=0, behaviours=(), sharing=False,
                              decoration_kinds=tuple(k for k in DECORATION_KINDS
                                                     if k not in OLD_STYLE),
                              needs=("leaf-grads",))


def _draw_ensemble(data: st.DataObject, *, unlike: bool) -> tuple[nn.Module, Ensemble, list]:
    module = data.draw(ensemble_trees, label="module")
    # Stacking runs torch.stack on every tensor: a host's own tensor class need not implement it.
    assume(not any(is_traceable_wrapper_subclass(t)
                   for t in (*module.parameters(), *module.buffers())))
    drawn = ensembles(unlike=unlike).filter(lambda e: e.unlike is None or departs(module, e.unlike))
    ensemble = data.draw(drawn, label="ensemble")
    event(f"ensemble: {ensemble.unlike or 'alike'}, {ensemble.container}")
    return module, ensemble, ensemble_models(module, ensemble)


def _stacked_names(model: nn.Module) -> tuple[list[str], list[str]]:
    return [n for n, _ in model.named_parameters()], [n for n, _ in model.named_buffers()]


def _wrong_stacks(models: list[nn.Module], params: dict, buffers: dict) -> list[str]:
    """What differs from rule 2 of ``reference.stacking``: per name, the shape, dtype, values (the
    models' in order), ``requires_grad`` and leafness of the stacked tensor."""
    out = []
    for kind, stacked, named in (("parameter", params, [dict(m.named_parameters()) for m in models]),
                                 ("buffer", buffers, [dict(m.named_buffers()) for m in models])):
        for name, got in stacked.items():
            tensors = [n[name] for n in named]
            want = torch.stack([value_copy(t) for t in tensors])
            if got.shape != want.shape or got.dtype != want.dtype:
                out.append(f"{kind} {name}: {got.dtype}{tuple(got.shape)}, "
                           f"expected {want.dtype}{tuple(want.shape)}")
            elif not same_values(got.detach(), want):
                out.append(f"{kind} {name}: values are not the models' in order")
            elif got.requires_grad != tensors[0].requires_grad or not got.is_leaf:
                out.append(f"{kind} {name}: requires_grad={got.requires_grad}, "
                           f"leaf={got.is_leaf}; the models' require_grad={tensors[0].requires_grad}")
    return out


@spec_property("STACK-MODULE-STATE")
@given(data=st.data())
def test_stack_module_state_stacks_each_name(target, data):
    """``stack_module_state(models)`` of alike models (copies of one module with other values, in
    a list, tuple or ``nn.ModuleList``) returns ``(params, buffers)`` keyed by the first model's
    ``named_parameters()``/``named_buffers()`` names; each value is a new leaf, the models'
    tensors stacked in model order, that requires grad where theirs do and shares no memory with
    them (writing into it changes no model); the models are not changed.

    Origin: ``torch.func.stack_module_state``'s documentation ("new leaf nodes in the autograd
    history that are unrelated to the original parameters"); swapspec spec (nothing changed).
    """
    module, ensemble, models = _draw_ensemble(data, unlike=False)
    example = Example(module, method=ensemble)
    check = Checker("STACK-MODULE-STATE", target, example)
    before = [snapshot_for_load(m) for m in models]
    outcome = attempt(lambda: target.stack_module_state(models))
    check.that(outcome.error is None, "returned", f"stack_module_state raised {outcome.error!r}")
    changed = [c for b, m in zip(before, models, strict=True) for c in changes(b, m)]
    check.that(not changed, "unchanged", f"stack_module_state changed the models: {changed[:4]}")
    if outcome.error is None:
        params, buffers = outcome.result
        names = _stacked_names(models[0])
        check.that((list(params), list(buffers)) == names, "names",
                   f"stacked names {list(params)}, {list(buffers)}; expected {names}")
        wrong = _wrong_stacks(list(models), params, buffers)
        check.that(not wrong, "values", f"stacked tensors: {wrong[:4]}")
        with torch.no_grad():
            for t in (*params.values(), *buffers.values()):
                t.fill_(3)
        written = [c for b, m in zip(before, models, strict=True) for c in changes(b, m)]
        check.that(not written, "independent",
                   f"writing into the stacked tensors changed the models: {written[:4]}")
    check.verdict(lambda violations: _stack_repro(example, target, ensemble))


@spec_property("STACK-MODULE-STATE-REFUSED")
@given(data=st.data())
def test_stack_module_state_refuses_unlike_models(target, data):
    """``stack_module_state`` refuses models that are not alike (none; another class; another
    training mode, of the root or of one submodule; a parameter that does not require grad where
    the others' do; a name only some models have; another dtype) with ``RuntimeError``, and
    changes none of them.

    Origin: ``torch.func.stack_module_state``'s documentation ("All of the modules being stacked
    together must be the same (except for the values of their parameters/buffers)... in the same
    mode") and its ``RuntimeError`` s; swapspec spec (bad input gets a clear error, nothing
    changed).
    """
    module, ensemble, models = _draw_ensemble(data, unlike=True)
    example = Example(module, method=ensemble)
    check = Checker("STACK-MODULE-STATE-REFUSED", target, example)
    before = [snapshot_for_load(m) for m in models]
    outcome = attempt(lambda: target.stack_module_state(models))
    check.that(isinstance(outcome.error, RuntimeError), "raised",
               f"stack_module_state of models where {UNLIKE[ensemble.unlike]} "
               f"{'raised ' + repr(outcome.error) if outcome.error else 'returned'}; "
               "expected RuntimeError")
    changed = [c for b, m in zip(before, models, strict=True) for c in changes(b, m)]
    check.that(not changed, "unchanged", f"stack_module_state changed the models: {changed[:4]}")
    check.verdict(lambda violations: _stack_repro(example, target, ensemble))


def _vmapped_call(target: Any, skeleton: nn.Module, params: dict, buffers: dict, x: Tensor):
    """``torch.vmap`` of the target's functional call on ``skeleton`` over the stacked tensors
    (dim 0), the input shared."""
    keywords = target.call_keywords(tie_weights=True, strict=False)

    def call(ps: dict, bs: dict, inputs: Tensor) -> Tensor:
        return target.functional_call(skeleton, {**ps, **bs}, (inputs,), {}, **keywords)

    return torch.vmap(call, in_dims=(0, 0, None))(params, buffers, x)


@spec_property("FC-STACKED-ENSEMBLE")
@given(data=st.data())
def test_fc_stacked_ensemble_runs_each_model(target, data):
    """``torch.vmap`` of the target's functional call over ``stack_module_state(models)`` (on the
    first model, or a ``meta`` copy of it) gives, at index ``k``, what model ``k``'s own forward
    gives; each stacked buffer then holds what model ``k``'s forward leaves in its buffer
    (in-place updates land on the given tensor); it raises only where the same ``vmap`` over
    ``torch.func.functional_call`` raises (``vmap``'s own limits: random ops, ops without a
    batching rule); and the models are not changed by it.

    Origin: ``torch.func.stack_module_state``'s documentation and the ``torch.func``
    model-ensembling tutorial; swapspec spec (a functional call puts the module back).
    """
    module, ensemble, models = _draw_ensemble(data, unlike=False)
    x = input_for(module)
    params, buffers = torch.func.stack_module_state(models)
    given = {n: value_copy(t) for n, t in (*models[0].named_parameters(),
                                            *models[0].named_buffers())}
    example = Example(module, call=CallInput(given, (x,), {}), method=ensemble)
    check = Checker("FC-STACKED-ENSEMBLE", target, example)
    skeleton = skeleton_of(models, ensemble)
    called = list({id(m): m for m in (skeleton, *models)}.values())
    before = [snapshot_for_load(m) for m in called]
    vmapped = seeded_attempt(lambda: _vmapped_call(target, skeleton, params, buffers, x))
    changed = [c for b, m in zip(before, called, strict=True) for c in changes(b, m)]
    check.that(not changed, "restored",
               f"the vmapped call changed the models or the skeleton: {changed[:4]}")
    if vmapped.error is not None:
        event(f"vmap raised {type(vmapped.error).__name__}")
        _, torch_buffers = torch.func.stack_module_state(models)
        by_torch = seeded_attempt(lambda: _vmapped_call(
            _TORCH_FUNC, skeleton_of(models, ensemble), params, torch_buffers, x))
        check.that(by_torch.error is not None, "raised",
                   f"vmap over the target's functional call raised {vmapped.error!r}; over "
                   "torch.func.functional_call it returns")
    else:
        _check_each_model(check, module, models, vmapped.result, buffers, x)
    check.verdict(lambda violations: _stack_repro(example, target, ensemble, vmapped=True))


def _close(a: Tensor, b: Tensor, tol: float) -> bool:
    """Equal shapes and values within ``tol`` (relative and absolute; exact for integers and
    bools, NaNs equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.allclose(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True)


def _check_each_model(check: Checker, module: nn.Module, models: list, out: Tensor,
                      buffers: dict[str, Tensor], x: Tensor) -> None:
    """FC-STACKED-ENSEMBLE's clauses ``outputs`` and ``buffers``: index ``k`` of the vmapped
    output and of each stacked buffer against model ``k``'s own forward (where that returns)."""
    tol = tolerance(module)
    own = [seeded_attempt(lambda m=m: m(x)) for m in models]
    ran = [k for k, o in enumerate(own) if o.error is None]
    wrong = [k for k in ran if not _close(out[k], own[k].result, tol)]
    check.that(not wrong, "outputs",
               f"the vmapped call's outputs at {wrong} differ from those models' own forward")
    stale = [f"{name}[{k}]" for name, b in buffers.items() for k in ran
             if not _close(b[k].detach(), models[k].get_buffer(name).detach(), tol)]
    check.that(not stale, "buffers", f"stacked buffers {stale[:4]} do not hold what the "
                                     "models' own forward leaves in theirs")


_TORCH_FUNC = builtin_target("torch")
# The repro's lines that make each departure (``strategies.ensembles.UNLIKE``) to ``models``.
_DEPARTURE_LINES = {
    "empty": ["models = []"],
    "class": ["models[1] = (nn.ModuleList([models[1]]) if type(models[1]) is nn.Sequential "
              "else nn.Sequential(models[1]))"],
    "mode": ["models[1].train(not models[1].training)"],
    "submodule-mode": ["paths = [n for n, _ in models[1].named_modules() if n]",
                       "sub = models[1].get_submodule(paths[{pick} % len(paths)])",
                       "sub.train(not sub.training)"],
    "requires-grad": ["names = [n for n, p in models[1].named_parameters() if p.requires_grad]",
                      "models[1].get_parameter(names[{pick} % len(names)]).requires_grad_(False)"],
    "extra-name": [f"models[1].register_buffer({EXTRA_NAME!r}, torch.zeros(1))"],
    "missing-name": [f"models[0].register_buffer({EXTRA_NAME!r}, torch.zeros(1))"],
    "dtype": ["first = next(t for t in (*models[1].parameters(), *models[1].buffers()) "
              "if t.is_floating_point())",
              "dtype = torch.float32 if first.dtype == torch.float64 else torch.float64",
              "models[1]._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)"],
}


def _ensemble_lines(ensemble: Ensemble) -> list[str]:
    """The repro's lines that build ``models`` as ``strategies.ensembles`` does."""
    departure = _DEPARTURE_LINES.get(ensemble.unlike, [])
    container = {"list": "list", "tuple": "tuple", "ModuleList": "nn.ModuleList"}[ensemble.container]
    return ["import copy",
            "def scaled(m, factor):",
            "    with torch.no_grad():",
            "        for t in {id(t): t for t in (*m.parameters(), *m.buffers())}.values():",
            "            if t.is_floating_point() or t.is_complex():",
            "                t.mul_(factor)",
            "    return m",
            f"models = [scaled(copy.deepcopy(module), 1 + k / 4) for k in range({ensemble.size})]",
            *(line.format(pick=ensemble.pick) for line in departure),
            f"models = {container}(models)",
            "before = [{n: t.detach().clone() for n, t in m.state_dict(keep_vars=True).items()} "
            "for m in models]",
            "def unchanged():",
            "    return all(n in b and torch.equal(b[n], t.detach()) for m, b in zip(models, before)"
            " for n, t in m.state_dict(keep_vars=True).items())"]


def _stack_repro(example: Example, target: Any, ensemble: Ensemble, *,
                 vmapped: bool = False) -> str:
    lines = _ensemble_lines(ensemble)
    if ensemble.unlike is not None:
        lines += ["try:", "    target_stack_module_state(models)", "    error = None",
                  "except Exception as e:", "    error = e"]
        asserts = [("isinstance(error, RuntimeError)", "stack_module_state did not refuse with "
                    "RuntimeError models that are not alike"),
                   ("unchanged()", "the models changed")]
    elif not vmapped:
        lines += ["params, buffers = target_stack_module_state(models)"]
        asserts = [("list(params) == [n for n, _ in models[0].named_parameters()] and "
                    "list(buffers) == [n for n, _ in models[0].named_buffers()]",
                    "the stacked names are not the first model's"),
                   ("all(torch.equal(s.detach(), torch.stack([dict(m.named_parameters())[n].detach()"
                    " for m in models])) for n, s in params.items())",
                    "the stacked parameters are not the models' values"),
                   ("all(s.is_leaf for s in params.values())", "a stacked parameter is no leaf"),
                   ("unchanged()", "the models changed")]
    else:
        skeleton = ["skeleton = models[0]"] if ensemble.skeleton == "first" else [
            "root = copy.deepcopy(models[0])  # then every tensor on meta, one object per tie",
            *world_lines("meta"), "skeleton = root"]
        x = input_for(example.module)
        lines += ["params, buffers = torch.func.stack_module_state(models)", *skeleton,
                  f"x = torch.linspace(-2, 2, {x.numel()}).reshape{tuple(x.shape)}",
                  "def call(ps, bs, inputs):",
                  "    return target_functional_call(skeleton, {**ps, **bs}, (inputs,), {})",
                  "out = torch.vmap(call, in_dims=(0, 0, None))(params, buffers, x)",
                  "own = [m(x) for m in models]"]
        asserts = [("all(torch.allclose(out[k], own[k], rtol=1e-3, atol=1e-3) "
                    "for k in range(len(models)))", "the vmapped outputs are not each model's own"),
                   ("all(torch.equal(b[k], m.get_buffer(n)) for n, b in buffers.items() "
                    "for k, m in enumerate(models))", "a stacked buffer is not the model's own")]
    return asserting_repro(example, target, lines, asserts)
