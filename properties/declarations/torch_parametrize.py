"""Declared deviations of torch's ``torch.nn.utils.parametrize`` from the ``PARAMETRIZE-`` rules.

The predicates read the drawn registration (``Example.method``, a
``strategies.parametrizations.Registration``) before the call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.properties.vocabulary import Deviation

# Checked on torch 2.13.0 and 2.14.1: a run of the oracle matrix sets the lower bound.
TORCH_CHECKED = ("2.13.0", None)
# The refused first registrations whose ``right_inverse`` changes the tensor before torch's
# forward checks refuse them (``strategies.parametrizations.Refused``: ``inverse-shape`` stores
# the flattened tensor).
WRITES_BEFORE_ITS_CHECKS = ("inverse-shape",)


def _writes_before_its_checks(example: Any) -> bool:
    registration = example.method
    return (registration is not None and not registration.stacked
            and registration.kind in WRITES_BEFORE_ITS_CHECKS)


def converts_to_wrapper(example: Any) -> bool:
    """Whether the example's conversion makes a traceable wrapper subclass (``TwoTensor``) of a
    floating tensor: torch's ``_maybe_set`` then swaps instead of ``set_``."""
    out = example.conversion.make_fn()(torch.zeros(2, 3))
    return is_traceable_wrapper_subclass(out)


def refused_first_registration_writes(example: Any) -> bool:
    """A first registration whose ``right_inverse`` result torch writes into a plain tensor
    (``set_``) before its checks refuse the parametrization."""
    return _writes_before_its_checks(example) and not converts_to_wrapper(example)


def refused_first_registration_swap_refused(example: Any) -> bool:
    """The same registration on a wrapper-subclass tensor: torch's ``swap_tensors`` refuses to
    write the ``right_inverse`` result (a view of the original) before the checks run."""
    return _writes_before_its_checks(example) and converts_to_wrapper(example)


PARAMETRIZE_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "PARAMETRIZE-REFUSED", refused_first_registration_writes, "changed",
        "register_parametrization (unsafe=False) of a first parametrization writes "
        "right_inverse(original) into the tensor (ParametrizationList.__init__: _maybe_set) "
        "before it runs the forward checks, so a registration it then refuses has changed the "
        "tensor (torch 2.13, 2.14). Repro: class NegFlat(nn.Module): forward = lambda s, x: "
        "x.flatten(); right_inverse = lambda s, x: -x.flatten(); m = nn.Linear(3, 2); "
        "w = m.weight.detach().clone(); torch.nn.utils.parametrize.register_parametrization(m, "
        "'weight', NegFlat())  # ValueError: may not change the shape; then m.weight.shape is "
        "(6,) and its values -w",
        torch_versions=TORCH_CHECKED, id="torch.parametrize.refused-first-writes"),
    Deviation(
        "PARAMETRIZE-REFUSED", refused_first_registration_swap_refused, "error",
        "The same first registration on a traceable wrapper subclass (TwoTensor) raises "
        "swap_tensors' RuntimeError instead of the ValueError of its checks: _maybe_set swaps "
        "the right_inverse result, a view of the original, into it, and the view holds the "
        "original's TensorImpl (torch 2.13, 2.14). Repro: m = nn.Linear(3, 2); m.weight = "
        "nn.Parameter(TwoTensor(m.weight.detach(), m.weight.detach().clone())); class Flat("
        "nn.Module): forward = lambda s, x: x; right_inverse = lambda s, x: x.flatten(); "
        "torch.nn.utils.parametrize.register_parametrization(m, 'weight', Flat())  "
        "# RuntimeError: Expected use_count of t1 to be 1 or 2 ...",
        torch_versions=TORCH_CHECKED, id="torch.parametrize.refused-first-swap-refused"),
)
