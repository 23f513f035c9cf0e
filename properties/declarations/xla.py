"""Deviations torch shows only on XLA device moves (torch_xla on the CPU backend), as data.

Observed with torch 2.9.0 + torch_xla 2.9.0 (``PJRT_DEVICE=CPU``), the only pair the XLA leg
installs (``constraints/xla.txt``); torch_xla X.Y works with torch X.Y only, so each entry is
bounded to torch 2.9. Every entry keeps a minimal repro in its ``reason``; the repros assume
``PJRT_DEVICE=CPU`` and ``import torch, torch_xla; from torch import nn; xla = torch_xla.device()``.

Why: a CPU->XLA move changes the TensorImpl type (``_has_compatible_shallow_copy_type(cpu, xla)``
is False), so under default or overwrite flags ``_apply`` puts a *new* ``Parameter`` in every slot
(pytorch #17072 / #21613); under the swap flag (#113000) it swaps a plain ``Parameter``'s contents
in. Buffers are rebound by ``self._buffers[k] = fn(buf)`` under every flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from swapspec.properties.declarations.torch_apply import (
    splits_parameter_in_buffer_slot,
    torch_apply_raises_on_state,
)
from swapspec.properties.vocabulary import Deviation

TORCH_XLA = ("2.9", "2.10")  # the torch releases the XLA leg was observed on

_PREFIX = ("Repro (PJRT_DEVICE=CPU; import torch, torch_xla; from torch import nn; "
           "xla = torch_xla.device()):\n")


def tied_buffer(module: nn.Module) -> bool:
    """One buffer object registered in two distinct (module, key) slots (not a shared submodule);
    a parameter held by buffer slots is a parameter's tie (``splits_parameter_in_buffer_slot``)."""
    seen: dict[int, tuple[int, str]] = {}
    params = {id(p) for p in module.parameters()}
    for m in {id(m): m for m in module.modules()}.values():
        for key, b in m._buffers.items():
            if b is None or id(b) in params:
                continue
            if id(b) in seen and seen[id(b)] != (id(m), key):
                return True
            seen.setdefault(id(b), (id(m), key))
    return False


def parameter_subclass_returned_as_is(example: Any) -> bool:
    """Swap or overwrite flag, and ``fn`` returns some ``Parameter``-subclass parameter itself.

    Both paths wrap ``fn(p)`` as ``Parameter(fn(p))``, which refuses a subclass instance; on
    XLA->XLA (TensorImpl-compatible) only the flags lead there.
    """
    if not (example.flags.swap or example.flags.overwrite):
        return False
    fn = example.conversion.make_fn()
    params = {id(p): p for p in example.module.parameters()}.values()
    with torch.no_grad():
        return any(type(p) is not nn.Parameter and fn(p) is p for p in params)


def _not_swap(example: Any) -> bool:
    return not example.flags.swap


XLA_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "XLA-STATE",
        applies=lambda e: _not_swap(e) and e.has("tied-parameter"),
        observed="parameter-tie-split",
        reason=(
            "m.to(xla) splits tied parameters unless the swap flag is set: the CPU->XLA move takes "
            "the overwrite path, each slot gets its own new Parameter (_apply keeps no memo). "
            "pytorch #17072 / #21613; torch_xla's docs tell users to re-tie weights after .to().\n"
            + _PREFIX
            + "m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)); m[1].weight = m[0].weight\n"
            "m.to(xla)\n"
            "assert m[0].weight is not m[1].weight  # tie split (also with the overwrite flag)"
        ),
        torch_versions=TORCH_XLA,
        id="torch.xla.parameter-tie-split",
    ),
    Deviation(
        "XLA-STATE",
        applies=lambda e: tied_buffer(e.module),
        observed="buffer-tie-split",
        reason=(
            "m.to(xla) splits tied buffers under every flag: buffers are rebound per slot "
            "(self._buffers[k] = fn(buf)) and fn returns a new XLA tensor for each slot.\n"
            + _PREFIX
            + "m = nn.Module(); m.a = nn.Module(); m.register_buffer('b', torch.ones(2)); "
            "m.a.register_buffer('b', m.b)\n"
            "torch.__future__.set_swap_module_params_on_conversion(True)\n"
            "m.to(xla)\n"
            "assert m.b is not m.a.b  # tie split, swap flag or not"
        ),
        torch_versions=TORCH_XLA,
        id="torch.xla.buffer-tie-split",
    ),
    Deviation(
        ("XLA-STATE", "XLA-ROUND-TRIP", "XLA-DTYPE-PATH"),
        applies=splits_parameter_in_buffer_slot,
        observed=("parameter-tie-split", "class", "grad", "swap-identity", "path-set_data",
                  "path-swap", "path-overwrite"),
        reason=(
            "m.to(xla) splits a tensor registered as a parameter and as a buffer, as on one "
            "device (torch.apply.splits-parameter-in-buffer-slot): the parameter slot takes "
            "the parameter's path, the buffer slot is rebound to fn of the tensor it meets, a "
            "new plain XLA tensor, so the buffer slot's name holds a Tensor where it held the "
            "Parameter (a new object under the swap flag too), and after a round trip back to "
            "the CPU it has no grad; a dtype change of an XLA module splits it the same way. "
            "It shows in the grad clause only where the parameter had one.\n"
            + _PREFIX
            + "m = nn.Module(); m.p = nn.Parameter(torch.ones(2)); m.register_buffer('b', m.p)\n"
            "m.to(xla)\n"
            "assert m.b is m.p  # fails: m.b is a plain Tensor"
        ),
        torch_versions=TORCH_XLA,
        always=False,
        id="torch.xla.splits-parameter-in-buffer-slot",
    ),
    Deviation(
        "XLA-STATE",
        applies=lambda e: e.has("parameter-subclass"),
        observed="class",
        reason=(
            "m.to(xla) turns a Parameter subclass into a plain Parameter under every flag: the "
            "overwrite path builds Parameter(fn(p)), and the swap path swaps in "
            "Parameter(fn(p)), whose __class__ swap_tensors carries over.\n"
            + _PREFIX
            + "class Tagged(nn.Parameter): pass\n"
            "m = nn.Linear(2, 2); m.weight = Tagged(m.weight.detach())\n"
            "torch.__future__.set_swap_module_params_on_conversion(True)  # or not\n"
            "m.to(xla)\n"
            "assert type(m.weight) is nn.Parameter"
        ),
        torch_versions=TORCH_XLA,
        id="torch.xla.parameter-class-lost",
    ),
    Deviation(
        "XLA-STATE",
        applies=lambda e: e.has("parameter-attributes"),
        observed="attributes",
        reason=(
            "m.to(xla) drops instance attributes set on a parameter under every flag: the "
            "overwrite path makes a new object, the swap path swaps __dict__ with the fresh "
            "Parameter's empty one.\n"
            + _PREFIX
            + "m = nn.Linear(2, 2); m.weight.tag = 'w'\n"
            "torch.__future__.set_swap_module_params_on_conversion(True)  # or not\n"
            "m.to(xla)\n"
            "assert not hasattr(m.weight, 'tag')"
        ),
        torch_versions=TORCH_XLA,
        id="torch.xla.parameter-attributes-lost",
    ),
    Deviation(
        "XLA-DTYPE-PATH",
        applies=parameter_subclass_returned_as_is,
        observed="raised",
        reason=(
            "Not XLA-specific (CPU too, torch 2.9 and 2.13): under the swap or overwrite flag, "
            "_apply wraps fn(p) as Parameter(fn(p)); when fn returns a Parameter-subclass p "
            "unchanged (float() on a float32 one) Parameter() refuses it ('Creating a Parameter "
            "from an instance of type Tagged requires that detach() returns an instance of the "
            "same type') and _apply raises 'Couldn't swap'.\n"
            + _PREFIX
            + "class Tagged(nn.Parameter): pass\n"
            "m = nn.Linear(2, 2); m.weight = Tagged(m.weight.detach().to(xla))\n"
            "torch.__future__.set_swap_module_params_on_conversion(True)\n"
            "m.float()  # RuntimeError: _apply(): Couldn't swap Linear.weight"
        ),
        torch_versions=TORCH_XLA,
        id="torch.xla.parameter-subclass-returned-as-is",
    ),
)


def _unless_torch_raises(applies: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Where torch's ``_apply`` raises first because of the module's state
    (``torch_deviations.torch_apply_raises_on_state``), no other behaviour of the move shows."""

    def region(example: Any) -> bool:
        return not torch_apply_raises_on_state(example) and applies(example)

    name = getattr(applies, "__name__", "")
    region.__name__ = region.__qualname__ = f"unless_torch_raises_{name.strip('<>')}"
    return region


XLA_DEVIATIONS = tuple(dataclasses.replace(d, applies=_unless_torch_raises(d.applies))
                       for d in XLA_DEVIATIONS)
