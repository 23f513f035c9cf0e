"""Declared deviations of torch's module registration and ``torch.utils.swap_tensors`` from the
``REGISTER-`` rules.

Each was observed with the suite and reduced to a minimal plain-torch repro (in ``reason``). The
predicates read the drawn registration call (``example.method``, a
``strategies.registrations.RegistrationCall``) or swap pair (a ``SwapPair``) and the module
before the call.
"""

from __future__ import annotations

from typing import Any

from swapspec.properties.vocabulary import Deviation

TORCH_CHECKED = ("2.13.0", None)  # repros checked on 2.13.0 only: no matrix run yet


def _call(example: Any) -> Any:
    return example.method


def non_leaf_parameter_over_a_name(example: Any) -> bool:
    """``setattr`` of a non-leaf ``Parameter`` under a name the owner already has as a buffer, a
    child or a plain attribute: torch removes the name, then ``register_parameter`` refuses."""
    call = _call(example)
    if call.method != "setattr" or call.defect != "value-non-leaf":
        return False
    owner = example.module.get_submodule(call.owner)
    return any(call.name in table for table in (owner.__dict__, owner._buffers, owner._modules))


def child_under_a_bad_name(example: Any) -> bool:
    """``setattr`` of a ``Module`` under a dotted or empty name, or a class attribute's:
    ``Module.__setattr__`` checks no name before it registers a child."""
    call = _call(example)
    return (call.method == "setattr" and call.kind == "bad"
            and call.defect in ("name-dotted", "name-empty", "name-taken")
            and call.value == "torch.nn.Linear(2, 2)")


def view_of_a_tensor_without_grad(example: Any) -> bool:
    """A swap pair whose ``t1`` is held by a view and does not require grad: its use count is
    2, and ``swap_tensors`` asks autograd for the gradient edge of a tensor that has none."""
    pair = _call(example)
    return pair.defect == "view" and not pair.requires_grad


def graph_on_a_subclass(example: Any) -> bool:
    """A good swap pair where a graph is built before the swap on a side of a tensor subclass
    with the default ``__torch_function__`` (``Slotted``)."""
    pair = _call(example)
    return any(side.graph and side.kind == "slotted" for side in (pair.t1, pair.t2))


REGISTRATION_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "REGISTER-REFUSED", non_leaf_parameter_over_a_name, "changed-on-error",
        "Module.__setattr__ removes the name from __dict__, the buffers and the children before "
        "register_parameter checks the Parameter, so a refused non-leaf Parameter (ValueError) "
        "drops the buffer, child or attribute it was assigned over (torch 2.13). Repro: "
        "m = nn.Module(); m.register_buffer('b', torch.zeros(2)); "
        "p = nn.Parameter(torch.zeros(2), requires_grad=False); "
        "p.add_(torch.zeros(2, requires_grad=True)); m.b = p  # ValueError; "
        "assert 'b' in m._buffers  # fails: the buffer is gone",
        torch_versions=TORCH_CHECKED,
        id="torch.register.non-leaf-parameter-drops-name"),
    Deviation(
        "REGISTER-REFUSED", child_under_a_bad_name, "accepted",
        "Module.__setattr__ registers a Module under any name, where add_module refuses a dotted "
        "or empty name or one a class attribute has (KeyError): the child's keys then cannot be "
        "told apart or loaded (torch 2.13). Repro: m = nn.Module(); "
        "setattr(m, 'a.b', nn.Linear(1, 1)); list(m.state_dict())  # ['a.b.weight', 'a.b.bias']; "
        "m.add_module('a.b', nn.Linear(1, 1))  # KeyError",
        torch_versions=TORCH_CHECKED,
        id="torch.register.setattr-child-under-bad-name"),
    Deviation(
        "REGISTER-SWAP-REFUSED", view_of_a_tensor_without_grad, "unclear-message",
        "swap_tensors refuses a tensor held by a view that does not require grad with "
        "'It is not possible to get the gradient edge for a Tensor that does not require "
        "gradients': its use-count check asks autograd for the AccumulateGrad node of every "
        "leaf with use count 2, and the message never says the tensor is held elsewhere (torch "
        "2.13). Repro: t = torch.zeros(2); v = t.view(-1); "
        "torch.utils.swap_tensors(t, torch.ones(2))  # RuntimeError: It is not possible to get "
        "the gradient edge ...",
        torch_versions=TORCH_CHECKED,
        id="torch.register.swap-view-unclear-message"),
    Deviation(
        "REGISTER-SWAP", graph_on_a_subclass, "stale-graph",
        "swap_tensors poisons the wrong autograd node of a tensor subclass that keeps the default "
        "__torch_function__: torch.autograd.graph.get_gradient_edge(t) goes through the "
        "subclass's view_as, whose result as_subclass wraps in a new node, and answers that "
        "view node instead of t's AccumulateGrad node; the pre-hook lands there, so a backward "
        "through a graph built before the swap runs and accumulates a grad into the other "
        "object (torch 2.13). Repro: class Sub(torch.Tensor): pass; "
        "t = torch.ones(1).as_subclass(Sub).requires_grad_(); y = (t * 2).sum(); "
        "o = torch.zeros(1).as_subclass(Sub); torch.utils.swap_tensors(t, o); "
        "y.backward()  # no 'poisoned by swap_tensors' error; o.grad == tensor([2.]); "
        "type(torch.autograd.graph.get_gradient_edge(o).node).__name__  # 'ViewBackward0'",
        torch_versions=TORCH_CHECKED,
        id="torch.register.swap-subclass-graph-not-poisoned"),
)
