"""Checking converted tensors against a conversion's contract (``strategies.contracts``), with a
line of code per broken fact that a standalone repro asserts (it holds where the contract does).

Shared by APPLY-CONTRACT (per-tensor conversions) and the ``MODCONV-`` properties (module
conversions).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.models.examples import holds_values, named_tensors, value_copy
from swapspec.strategies.contracts import Contract, plain_values, tensor_class


def before_copies(module: nn.Module) -> dict[str, Tensor]:
    """Every tensor by name as it is now: a copy of its values where it holds some, else the
    object (uninitialized, meta: only its metadata is read)."""
    return {name: value_copy(t) if holds_values(t) else t
            for name, t in named_tensors(module).items()}


def check_contract(check: Checker, contract: Contract, before: dict[str, Tensor],
                   after: dict[str, Tensor], converted: set[str] | None = None) -> None:
    """Each tensor of ``after`` meets ``contract`` against its copy in ``before``; ``converted``:
    the names the conversion converts (None: those the contract's ``converts`` accepts), the
    others must be as they were."""
    for name, was in before.items():
        now = after.get(name)
        if now is None:
            check.that(False, "contract", f"{name!r} is gone after the conversion")
            continue
        converts = contract.converts(was) if converted is None else name in converted
        problems = contract.problems(was, now, converts)
        what = contract.text if converts else "not converted: kept as it was"
        check.that(not problems, "contract",
                   f"{name!r} breaks the contract ({what}): {'; '.join(problems)}",
                   code=contract_code(f"after[{name!r}]", was, now, contract, converts))


def contract_code(var: str, before: Tensor, after: Tensor, contract: Contract,
                  converted: bool) -> str | None:
    """A Python expression, true where ``var`` (the tensor after) meets the contract's first
    broken fact of dtype, device and values, for a repro to assert; None when none applies."""
    if not converted:
        cls = tensor_class(before)
        same_class = (f"type({var}).__torch_dispatch__ is torch.Tensor.__torch_dispatch__"
                      if cls is Tensor else f"type({var}).__name__ == {cls.__name__!r}")
        return (f"{var}.dtype == {before.dtype} and {var}.device.type == {before.device.type!r}"
                f" and {same_class}")
    want_dtype = contract.dtype_for(before, True)
    want_device = contract.device or before.device.type
    if after.dtype != want_dtype:
        return f"{var}.dtype == {want_dtype}"
    if after.device.type != want_device:
        return f"{var}.device.type == {want_device!r}"
    if contract.cls is not None and not isinstance(after, contract.cls):
        return f"{contract.cls.__name__!r} in [c.__name__ for c in type({var}).__mro__]"
    return _values_code(var, before, after, contract) if contract.values else None


def _values_code(var: str, before: Tensor, after: Tensor, contract: Contract) -> str | None:
    want = plain_values(before)
    dequantize = _importable(contract.dequantize) if contract.dequantize is not None else ""
    if want is None or want.is_complex() or bool(want.isnan().any()) or dequantize is None:
        return None
    atol, rtol = contract.tolerance(before, after)
    got = f"{dequantize}({var})" if dequantize else var
    return (f"bool(((torch.as_tensor({got}.detach()).double().cpu() - torch.tensor("
            f"{want.double().tolist()!r}, dtype=torch.float64)).abs() <= {atol!r} + {rtol!r} * "
            f"torch.tensor({want.double().abs().tolist()!r}, dtype=torch.float64)).all())")


def _importable(fn: Any) -> str | None:
    """``__import__('pkg.mod', fromlist=['name']).name`` for an importable function, else None."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module is None or not name.isidentifier():
        return None
    return f"__import__({module!r}, fromlist=[{name!r}]).{name}"
