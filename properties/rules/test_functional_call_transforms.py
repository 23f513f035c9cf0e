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
from hypothesis import event, given
from hypothesis import strategies as st
from torch import Tensor, nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import asserting_repro
from swapspec.properties.models.examples import Example, value_copy
from swapspec.properties.models.invariants import input_for
from swapspec.properties.models.load_examples import changes, snapshot_for_load
from swapspec.properties.models.outcomes import seeded_attempt
from swapspec.strategies import module_trees
from swapspec.strategies.calls import CallInput

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
