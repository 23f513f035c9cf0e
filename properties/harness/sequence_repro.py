"""Standalone repro scripts for failing sequences: one block of lines per step, then asserts.

A sequence repro rebuilds the drawn module from its spec (so swapspec must be installed for the
tree builder), runs every step the sequence ran, on the same target, with plain torch calls where
the target is torch's own (``module._apply`` under the ``torch.__future__`` flags,
``torch.func.functional_call``), and ends in one ``assert`` per broken clause: the script fails
on the target and passes on the reference.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from swapspec.properties.models import standalone

PRELUDE = [
    "import collections",
    "import copy",
    "import gc",
    "import importlib",
    "import random",
    "import torch",
    "",
    "def named(m):  # every name of every parameter and buffer, aliases included",
    "    return dict([*m.named_parameters(remove_duplicate=False),",
    "                 *m.named_buffers(remove_duplicate=False)])",
    "",
    "def same(t, want):  # dtype, shape and values equal (NaNs equal); meta tensors by metadata",
    "    if t is None or (t.dtype, t.shape, t.device) != (want.dtype, want.shape, want.device):",
    "        return False",
    "    if t.device.type == 'meta':",
    "        return True",
    "    t, want = t.detach(), want.detach()",
    "    t, want = (t.to_dense(), want.to_dense()) if t.layout != torch.strided else (t, want)",
    "    return torch.equal(t.isnan(), want.isnan()) and torch.equal(t.nan_to_num(), want.nan_to_num())",
    "",
    "def forward(m, x):  # a forward without autograd, as the sequence's forward check runs it",
    "    with torch.no_grad():",
    "        return m(x.clone())",
    "",
    "def global_state():  # what no step may change",
    "    f = torch.__future__",
    "    return (f.get_overwrite_module_params_on_conversion(), f.get_swap_module_params_on_conversion(),",
    "            torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_rng_state().tolist())",
    "",
    "fired = collections.Counter()  # counting tensor hooks: key -> firings",
    "start = global_state()",
    "error = None",
]


def is_torch(target: Any) -> bool:
    """Targets whose calls are written as torch's own (``torch``, ``torch-stateless``)."""
    return target.name in ("torch", "torch-stateless")


def target_lines(target: Any) -> list[str]:
    """Lines that make ``target`` available to the steps (none for torch's own)."""
    if is_torch(target):
        return []
    return ["from swapspec.properties.harness.targets import load_target",
            f"target = load_target({target.selector!r})"]


def guarded(lines: list[str]) -> list[str]:
    """``lines`` run so that an error is printed and kept in ``error`` (some steps may raise)."""
    return ["try:", *(f"    {line}" for line in lines), "except Exception as e:",
            "    error = e", "    print('step raised', type(e).__name__, e)"]


def apply_lines(target: Any, fn_source: str, overwrite: bool, swap: bool) -> list[str]:
    """One conversion: ``fn`` defined from its source, then the target's apply."""
    lines = [*fn_source.splitlines()]
    if is_torch(target):
        call = [f"torch.__future__.set_overwrite_module_params_on_conversion({overwrite})",
                f"torch.__future__.set_swap_module_params_on_conversion({swap})",
                "try:", "    module._apply(fn)", "finally:",
                "    torch.__future__.set_overwrite_module_params_on_conversion(False)",
                "    torch.__future__.set_swap_module_params_on_conversion(False)"]
    else:
        call = [f"target.apply(module, fn, overwrite={overwrite}, swap={swap})"]
    return [*lines, "error = None", *guarded(call)]


def method_lines(target: Any, call: Any, overwrite: bool, swap: bool) -> list[str]:
    """One public method call (``module.half()``, ``module.to(...)``): torch's own method under
    the flags, or the target's (``Target.method``: its own, else built on its apply)."""
    arguments = f", {call.arguments}" if call.arguments else ""
    if is_torch(target):
        made = [f"torch.__future__.set_overwrite_module_params_on_conversion({overwrite})",
                f"torch.__future__.set_swap_module_params_on_conversion({swap})",
                "try:", f"    {call.code('module')}", "finally:",
                "    torch.__future__.set_overwrite_module_params_on_conversion(False)",
                "    torch.__future__.set_swap_module_params_on_conversion(False)"]
    else:
        made = [f"target.method({call.method!r})(module{arguments}, overwrite={overwrite}, "
                f"swap={swap})"]
    return ["error = None", *guarded(made)]


def functional_call_lines(target: Any, tensors: dict[str, Tensor], tie_weights: bool,
                          tuple_form: bool) -> list[str]:
    """One functional call on ``x``; its output is kept in ``out``. Names given one object get
    one object (``g0``, ``g1``, ... defined first): a call treats one tensor under two names of
    a slot otherwise than two equal tensors."""
    lines, code = [], {}
    for value in tensors.values():
        if id(value) not in code:
            code[id(value)] = f"g{len(code)}"
            lines.append(f"{code[id(value)]} = {tensor_code(value)}")
    given = "{" + ", ".join(f"{k!r}: {code[id(v)]}" for k, v in tensors.items()) + "}"
    if tuple_form:
        given = f"({given},)"
    return [*lines, "error = None", "out = None", *guarded(
        [f"out = {functional_call_name(target)}(module, {given}, (x.clone(),), "
         f"tie_weights={tie_weights})"])]


def functional_call_name(target: Any) -> str:
    """How a repro calls the target's ``functional_call``."""
    return {"torch": "torch.func.functional_call",
            "torch-stateless": "torch.nn.utils.stateless.functional_call"}.get(
                target.name, "target.functional_call")


def vmap_lines(target: Any, tensors: dict[str, Tensor]) -> list[str]:
    """One ``torch.func.vmap`` of the target's ``functional_call`` over stacked tensors (one
    line per stacked tensor, named once however many names it is given under); its output is
    kept in ``out``."""
    lines, code = [], {}
    for value in tensors.values():
        if id(value) not in code:
            code[id(value)] = f"s{len(code)}"
            lines.append(f"{code[id(value)]} = {tensor_code(value)}")
    given = "{" + ", ".join(f"{k!r}: {code[id(v)]}" for k, v in tensors.items()) + "}"
    fc = functional_call_name(target)
    return [*lines, "error = None", "out = None", *guarded(
        [f"out = torch.func.vmap(lambda p, x: {fc}(module, p, (x,), {{}}), "
         f"in_dims=(0, None))({given}, x.clone())"])]


def tie_lines(names: tuple[str, ...], source: str, persistent: bool | None = None) -> list[str]:
    """One slot (by its first name) given the tensor the module holds at ``source``: ``setattr``
    for a parameter slot, ``register_buffer`` (with the slot's ``persistent``) for a buffer slot."""
    prefix, _, key = names[0].rpartition(".")
    owner, value = f"module.get_submodule({prefix!r})", f"named(module)[{source!r}]"
    if persistent is None:
        return [f"setattr({owner}, {key!r}, {value})"]
    return [f"{owner}.register_buffer({key!r}, {value}, persistent={persistent})"]


def untie_lines(names: tuple[str, ...], parameter: bool) -> list[str]:
    """One slot (by its first name) given its own copy of its tensor."""
    prefix, _, key = names[0].rpartition(".")
    value = f"named(module)[{names[0]!r}]"
    copy = (f"torch.nn.Parameter({value}.detach().clone(), requires_grad={value}.requires_grad)"
            if parameter else f"{value}.detach().clone()")
    return [f"setattr(module.get_submodule({prefix!r}), {key!r}, {copy})"]


def load_lines(target: Any, kind: str, state_dict: dict[str, Any], assign: bool,
               swap: bool) -> list[str]:
    """One strict load: the module's own ``state_dict()`` with its given keys replaced (all of
    them unless ``kind`` is ``own``), under the swap flag for torch's own targets."""
    own = kind == "own"
    given = {} if own else {k: v for k, v in state_dict.items() if isinstance(v, Tensor)}
    lines, first = ["sd = module.state_dict()"], {}
    for key, value in given.items():  # keys given one object get one object
        code = first.setdefault(id(value), f"sd[{key!r}]")
        lines.append(f"sd[{key!r}] = {tensor_code(value) if code == f'sd[{key!r}]' else code}")
    if is_torch(target):
        call = [f"torch.__future__.set_swap_module_params_on_conversion({swap})",
                "try:", f"    module.load_state_dict(sd, strict=True, assign={assign})",
                "finally:", "    torch.__future__.set_swap_module_params_on_conversion(False)"]
    else:
        call = [f"target.load_state_dict(module, sd, strict=True, assign={assign}, swap={swap})"]
    return [*lines, "error = None", *guarded(call)]


def tensor_code(t: Tensor) -> str:
    """Python source for a tensor of these values and dtype (meta: its shape; sparse: dense
    values then ``to_sparse()``)."""
    data = t.detach()
    if standalone.rebuilt_by_parts(data):  # a host's tensor class: by its parts
        return standalone.wrapper_code(data)
    if data.device.type == "meta":
        return f"torch.empty({list(data.shape)}, dtype={data.dtype}, device='meta')"
    sparse = data.layout != torch.strided
    data = data.to_dense() if sparse else data
    code = f"torch.tensor({_literal(data.cpu().tolist())}, dtype={data.dtype})"
    return f"{code}.to_sparse()" if sparse else code


def _literal(values: Any) -> str:
    """``repr`` of nested lists with NaN and infinities written as valid Python."""
    return (repr(values).replace("nan", "float('nan')").replace("inf", "float('inf')"))


def script(target: Any, build: list[str], steps: list[list[str]], asserts: list[str]) -> str:
    """The whole repro: prelude, target, build, every step (numbered), then the asserts."""
    lines = [*PRELUDE, *target_lines(target), *build]
    for n, step in enumerate(steps, 1):
        lines += [f"# step {n}", "out = None  # an earlier step's output and its graph are not kept",
                  "gc.collect()  # no cycle left by an earlier step may decide a swap", *step]
    return "\n".join([*lines, "# the broken rule:", *asserts])
