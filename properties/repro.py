"""Standalone repro scripts for failing examples.

A repro rebuilds the drawn module from its spec, runs the same call on the same target,
and asserts each broken clause with a line of code, so it can be pasted into a bug report.
It imports the tree builder from ``swapspec.strategies``, so swapspec must be installed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from swapspec.properties.common import slot_code
from swapspec.properties.deviations import Violation
from swapspec.strategies import tree_info

PRELUDE = [
    "import torch",
    "",
    "def named(m):  # every name of every parameter and buffer, aliases included",
    "    return dict([*m.named_parameters(remove_duplicate=False),",
    "                 *m.named_buffers(remove_duplicate=False)])",
    "",
]


def apply_repro(example: Any, target: Any, violations: list[Violation], *,
                setup: list[str] = (), extra: list[str] = ()) -> str:
    """A script that converts the example's module on ``target`` and shows the broken rule.

    ``setup`` lines run after the module is built (before the snapshot ``before``), ``extra``
    lines after the conversion (before the asserts).
    """
    flags = example.flags
    lines = [*PRELUDE, *_tree_lines(example.module), *setup]
    lines += ["before = named(module)", *example.conversion.source("fn").splitlines()]
    lines += _refused_lines(example)
    call = (f"module._apply(fn, recurse={example.recurse})" if target.name.startswith("torch")
            else f"target.apply(module, fn, overwrite={flags.overwrite}, swap={flags.swap}, "
                 f"recurse={example.recurse})")
    lines += _target_lines(target, flags)
    lines += ["try:", f"    {call}", "except Exception as e:  # some rules are about failed calls",
              "    print('raised', type(e).__name__, e)", "finally:", *_restore_flag_lines(target)]
    lines += ["after = named(module)", *extra, *_assert_lines(violations)]
    return "\n".join(lines)


def _refused_lines(example: Any) -> list[str]:
    """Hold a weak reference to the example's refused tensor, so ``swap_tensors`` refuses it."""
    if example.refused is None:
        return []
    name, is_grad = example.refused_parameter()
    code = slot_code(name) + (".grad" if is_grad else "")
    return ["import weakref", f"held = weakref.ref({code})  # swap_tensors refuses a weakly referenced tensor"]


def call_repro(example: Any, target: Any, violations: list[Violation], *,
               setup: list[str] = ()) -> str:
    """A script that runs the example's functional call on ``target`` and shows the broken rule.

    ``setup`` lines run after the module is built and the call's arguments are defined.
    """
    call = example.call
    own = {id(t): f"before[{name!r}]" for name, t in example.names_before.items()}
    lines = [*PRELUDE, *_tree_lines(example.module), "before = named(module)"]
    tensors = example.tensors_before  # as given: the call may have written back into them
    lines += _shared_value_lines(tensors, own)  # one variable per object given twice
    lines.append(f"tensors = {_tensors_code(tensors, own)}")
    lines.append(f"args = {_value_code(call.args, own)}")
    lines.append(f"kwargs = {_value_code(call.kwargs, own)}")
    lines += [*setup, *_target_lines(target, None)]
    fc = {"torch": "torch.func.functional_call",
          "torch-stateless": "torch.nn.utils.stateless.functional_call"}.get(
              target.name, "target.functional_call")
    lines += [
        "try:",
        f"    out = {fc}(module, tensors, args, kwargs, tie_weights={call.tie_weights}, "
        f"strict={call.strict})",
        "except Exception as e:",
        "    out = e",
        "    print('raised', type(e).__name__, e)",
        "after = named(module)",
        *_assert_lines(violations),
    ]
    return "\n".join(lines)


def _tree_lines(module) -> list[str]:
    info = tree_info(module)
    return info.source("module").splitlines() if info is not None else [
        "module = ...  # not a generated tree: build it by hand"]


def _target_lines(target: Any, flags: Any) -> list[str]:
    if target.name.startswith("torch"):
        if flags is None:
            return []
        return [
            f"torch.__future__.set_overwrite_module_params_on_conversion({flags.overwrite})",
            f"torch.__future__.set_swap_module_params_on_conversion({flags.swap})",
        ]
    return ["from swapspec.properties.targets import load_target", f"target = load_target({target.selector!r})"]


def _restore_flag_lines(target: Any) -> list[str]:
    if target.name.startswith("torch"):
        return ["    torch.__future__.set_overwrite_module_params_on_conversion(False)",
                "    torch.__future__.set_swap_module_params_on_conversion(False)"]
    return ["    pass"]


def _assert_lines(violations: list[Violation]) -> list[str]:
    lines = []
    for v in violations:
        lines.append(f"# broken rule [{v.clause}]: {v.message}")
        if v.code:
            lines.append(f"assert {v.code}, {v.message!r}")
    return lines


def _shared_value_lines(tensors: Any, own: dict[int, str]) -> list[str]:
    """Define ``given_<i>`` for each fresh tensor given under two or more names; record it in ``own``."""
    dicts = [tensors] if isinstance(tensors, dict) else list(tensors) if isinstance(tensors, tuple | list) else []
    values = [v for d in dicts if isinstance(d, dict) for v in d.values() if isinstance(v, Tensor)]
    lines = []
    for v in values:
        if id(v) not in own and sum(w is v for w in values) > 1:
            own[id(v)] = f"given_{len(lines)}"
            lines.append(f"{own[id(v)]} = {_tensor_code(v)}")
    return lines


def _tensors_code(tensors: Any, own: dict[int, str]) -> str:
    if isinstance(tensors, dict):
        return _value_code(tensors, own)
    if isinstance(tensors, tuple | list):
        inner = ", ".join(_tensors_code(d, own) for d in tensors)
        return f"({inner},)" if isinstance(tensors, tuple) else f"[{inner}]"
    return repr(tensors)


def _value_code(value: Any, own: dict[int, str]) -> str:
    """Python source that rebuilds ``value`` (module tensors by name, others by value)."""
    if isinstance(value, Tensor):
        return own.get(id(value)) or _tensor_code(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_value_code(v, own)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + "".join(f"{_value_code(v, own)}, " for v in value) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_value_code(v, own) for v in value) + "]"
    return repr(value)


def _tensor_code(t: Tensor) -> str:
    data = t.detach()
    if data.device.type == "meta":
        code = f"torch.empty({list(data.shape)}, dtype={data.dtype}, device='meta')"
    else:
        code = f"torch.tensor({data.cpu().tolist()!r}, dtype={data.dtype})"
    if isinstance(t, torch.nn.Parameter):
        return f"torch.nn.Parameter({code}, requires_grad={t.requires_grad})"
    return f"{code}.requires_grad_()" if t.requires_grad else code


def load_repro(example: Any, target: Any, violations: list[Violation]) -> str:
    """A script that loads the example's state dict into its module on ``target`` and shows the
    broken rule. Values that are the module's own tensors are named by slot."""
    load = example.load
    named = example.names_before
    own = {id(t): f"named(module)[{name!r}]" for name, t in named.items()}
    for name, t in named.items():
        own.setdefault(id(t), f"named(module)[{name!r}]")
    lines = [*PRELUDE, "from torch.testing._internal.two_tensor import TwoTensor",
             *_tree_lines(example.module), "before = named(module)"]
    values = ", ".join(f"{k!r}: {_load_value_code(v, own, named.get(k))}"
                       for k, v in load.state_dict.items())
    lines.append(f"state_dict = {{{values}}}")
    kwargs = f"strict={load.strict}, assign={load.assign}"
    if target.name.startswith("torch"):
        lines += [f"torch.__future__.set_swap_module_params_on_conversion({load.swap})"]
        call = f"module.load_state_dict(state_dict, {kwargs})"
    else:
        lines += _target_lines(target, None)
        call = f"target.load_state_dict(module, state_dict, {kwargs}, swap={load.swap})"
    lines += ["try:", f"    print({call})", "except Exception as e:  # some rules are about failed loads",
              "    print('raised', type(e).__name__, e)", "finally:",
              "    torch.__future__.set_swap_module_params_on_conversion(False)"
              if target.name.startswith("torch") else "    pass"]
    lines += ["after = named(module)", *_assert_lines(violations)]
    return "\n".join(lines)


def _load_value_code(value: Any, own: dict[int, str], slot: Any) -> str:
    """The module's own tensor by name, its detached alias, a TwoTensor, or a value."""
    if isinstance(value, Tensor) and id(value) in own:
        return own[id(value)]
    if isinstance(value, Tensor) and slot is not None and value is not slot and \
            id(slot) in own and value.device == slot.device and not slot.is_meta and \
            value.dtype == slot.dtype and torch._C._is_alias_of(value, slot):
        return f"{own[id(slot)]}.detach()"
    if isinstance(value, Tensor) and type(value).__name__ == "TwoTensor":
        return f"TwoTensor({_tensor_code(value.a)}, {_tensor_code(value.b)})"
    return _value_code(value, own)
