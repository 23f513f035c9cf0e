"""XLA properties: moving modules to an XLA device, and ``functional_call`` with XLA tensors.

Origin: pytorch #17072: ``model.to(xla_device)`` broke because ``_apply`` did
``param.data = fn(param.data)`` across a TensorImpl change; pytorch #21613 added the overwrite
fallback and its flag, #113000 the swap path. These run only where ``torch_xla`` is installed
(``.ci/xla-leg``, PJRT's CPU backend); the device comes lazily from ``strategies.xla_device()``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from functools import partial

import pytest
import torch
from hypothesis import HealthCheck, assume, given
from hypothesis import strategies as st

from swapspec import reference
from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import apply_repro, load_repro
from swapspec.properties.harness.target_calls import run_apply
from swapspec.properties.models.apply_state import (
    conversion_named,
    distinct,
    expected_path,
    slot_code,
    snapshot_for_apply,
)
from swapspec.properties.models.examples import Example, alias_groups, named_tensors, same_values
from swapspec.properties.models.load_examples import changes, key_model, snapshot_for_load
from swapspec.properties.models.outcomes import attempt
from swapspec.properties.rules.clauses import check_path, no_error
from swapspec.properties.rules.load_clauses import (
    check_load_path,
    expected_paths,
    holds_value,
    load_succeeds,
    run_load,
    slot_ties,
)
from swapspec.properties.vocabulary import Violation
from swapspec.strategies import (
    BATCH,
    FEATURES,
    flag_settings,
    forward_inputs,
    module_trees,
    tree_info,
    xla_device,
)
from swapspec.strategies.devices import xla_available
from swapspec.strategies.state_dicts import LoadInput, state_dicts, swap_refused

pytestmark = pytest.mark.skipif(
    not xla_available(), reason="torch_xla is not installed: run .ci/xla-leg for the XLA leg")

# Lazy modules stay out: torch turns an UninitializedParameter moved to XLA into an empty
# (0,)-shaped plain tensor, which no conversion of a real model meets.


trees = module_trees(lazy=False)
TO_XLA = conversion_named("to('xla')")
xla_moves = st.sampled_from([TO_XLA, conversion_named("to('xla', torch.bfloat16)")])
xla_dtype_changes = st.sampled_from([conversion_named(n) for n in (
    "to(torch.float64)", "half()", "double()", "float()", "bfloat16()")])

REPRO_HEADER = ("import os\nos.environ.setdefault('PJRT_DEVICE', 'CPU')\n"
                "from swapspec.strategies.devices import xla_device\n")


@pytest.fixture(scope="session")
def xla() -> torch.device:
    """The XLA device, created on first use (never at import: xdist's controller imports us)."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    return xla_device()


def _setup(target, property_id, module, conversion, flags):
    example = Example(module, conversion=conversion, flags=flags)
    snap = snapshot_for_apply(module, conversion.make_fn, flags=flags)
    assume(not snap.swap_refused)  # a refused swap is APPLY-REFUSED-SWAP's business
    check = Checker(property_id, target, example)
    return example, check, snap


def _verdict(check: Checker, example: Example, target, before: tuple[str, ...] = ()) -> None:
    """The verdict, with a repro whose setup selects the XLA CPU device, then runs ``before``."""
    setup = ["import os", "os.environ.setdefault('PJRT_DEVICE', 'CPU')", *before]
    check.verdict(partial(apply_repro, example, target, setup=setup))


def _on_xla(t: torch.Tensor) -> bool:
    return t.device.type == "xla"


@spec_property("XLA-MOVE-ALL-FLAGS")
@given(module=trees, conversion=xla_moves, flags=flag_settings())
def test_xla_move_all_flags(target, xla, module, conversion, flags):
    """Moving a module to XLA succeeds under every flag setting and never goes through ``.data =``.

    A parameter that kept its object and its ``_cdata`` across the move was set_data'd: the
    TensorImpl changed, so that is the #17072 bug. Origin: pytorch #17072, #21613, #113000.
    """
    example, check, snap = _setup(target, "XLA-MOVE-ALL-FLAGS", module, conversion, flags)
    assume(snap.expected_error is None)
    outcome = run_apply(target, example, conversion.make_fn())
    if no_error(check, outcome, f"apply({conversion.name})"):
        after = named_tensors(module)
        for name, before in snap.names.items():
            if id(before) not in snap.classes:
                continue  # a buffer: always rebound
            now = after[name]
            check.that(not (now is before and now._cdata == snap.cdata[id(before)]), "set-data",
                       f"{name!r} kept its object and _cdata across the CPU->XLA move",
                       code=f"{slot_code(name)}._cdata != before_cdata[{name!r}]")
    _verdict(check, example, target)


@spec_property("XLA-SET-DATA-REFUSED")
@given(dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16,
                              torch.complex64]),
       shape=st.lists(st.integers(0, 3), max_size=3))
def test_xla_set_data_refused(target, xla, dtype, shape):
    """``cpu_param.data = xla_tensor`` raises the ``incompatible tensor type`` RuntimeError.

    A fact about the torch build in use, not about the target (it runs once per target so the
    report shows it): it is why a CPU->XLA move must never take the set_data path.
    Origin: pytorch #17072 (the error users hit from ``model.to(xla_device)``).
    """
    param = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
    cdata = param._cdata
    outcome = attempt(lambda: setattr(param, "data", torch.zeros(shape, dtype=dtype, device=xla)))
    error = outcome.error
    assert isinstance(error, RuntimeError) and "incompatible tensor type" in str(error), (
        f"torch {torch.__version__}: cpu_param.data = xla_tensor gave {error!r}, not the "
        "incompatible-tensor-type RuntimeError\nRepro:\n" + REPRO_HEADER
        + f"p = torch.nn.Parameter(torch.zeros({shape}, dtype={dtype}))\n"
        f"p.data = torch.zeros({shape}, dtype={dtype}, device=xla_device())")
    assert param.device.type == "cpu" and param._cdata == cdata, "the refused set_data changed p"


@spec_property("XLA-STATE")
@given(module=trees, conversion=xla_moves, flags=flag_settings())
def test_xla_state(target, xla, module, conversion, flags):
    """After a move to XLA every tensor is ``fn``'s result and the module's structure is kept.

    Device XLA; dtype, shape and values of ``fn(t)`` (compared on CPU); ``requires_grad``;
    ties (names aliasing one object before alias one after); ``Parameter`` class and instance
    attributes; grads moved to XLA; buffers moved; with the swap flag each parameter slot holds
    the same Python object. Origin: pytorch #17072 (``model.to(xla)``), #113000 (swap keeps
    identity), pytorch/xla #3718 (weight tying lost by ``.to(xla)``).
    """
    example, check, snap = _setup(target, "XLA-STATE", module, conversion, flags)
    assume(snap.expected_error is None)
    groups = alias_groups(module)
    outcome = run_apply(target, example, conversion.make_fn())
    if no_error(check, outcome, f"apply({conversion.name})"):
        after = named_tensors(module)
        for name, before in snap.names.items():
            _check_moved(check, name, before, after[name], snap, flags)
        for names in groups:
            kind = "parameter" if id(snap.names[names[0]]) in snap.classes else "buffer"
            held = len({id(after[n]) for n in names})
            check.that(held == 1, f"{kind}-tie-split",
                       f"tied {kind} names {names} now hold {held} objects",
                       code=f"{slot_code(names[0])} is {slot_code(names[-1])}")
    _verdict(check, example, target)


def _check_moved(check: Checker, name: str, before, now, snap, flags) -> None:
    """One slot after the move: where it is, what it holds, what it kept."""
    key, expected = id(before), snap.expected[id(before)]
    kind = "parameter" if key in snap.classes else "buffer"
    check.that(_on_xla(now), f"{kind}-device", f"{name!r} is on {now.device}, not XLA",
               code=f"{slot_code(name)}.device.type == 'xla'")
    check.that((now.dtype, now.shape) == (expected.dtype, expected.shape), "dtype-shape",
               f"{name!r} is {now.dtype}{tuple(now.shape)}, want "
               f"{expected.dtype}{tuple(expected.shape)}")
    check.that(_on_xla(now) and same_values(now.detach().cpu(), expected.cpu()), "value",
               f"{name!r} does not hold fn(t)'s values")
    if kind == "buffer":
        return
    check.that(now.requires_grad == snap.requires_grad[key], "requires-grad",
               f"{name!r} requires_grad changed")
    check.that(type(now) is snap.classes[key], "class",
               f"{name!r} became {type(now).__name__}, was {snap.classes[key].__name__}",
               code=f"type({slot_code(name)}) is {snap.classes[key].__name__}")
    check.that(all(getattr(now, a, _MISSING) == v for a, v in snap.attributes[key].items()),
               "attributes", f"{name!r} lost attributes {sorted(snap.attributes[key])}")
    if flags.swap:
        check.that(now is before, "swap-identity",
                   f"{name!r} holds a new object under the swap flag",
                   code=f"{slot_code(name)} is before[{name!r}]")
    grad = snap.grads.get(key)
    if grad is not None:
        moved = now.grad
        check.that(moved is not None and _on_xla(moved)
                   and same_values(moved.cpu(), snap.expected[id(grad)].cpu()),
                   "grad", f"{name!r}.grad is not fn(grad) on XLA: got "
                   f"{None if moved is None else (moved.dtype, moved.device)}",
                   code=f"{slot_code(name)}.grad.device.type == 'xla'")


_MISSING = object()


@spec_property("XLA-ROUND-TRIP")
@given(module=trees, flags=flag_settings())
def test_xla_round_trip(target, xla, module, flags):
    """CPU -> XLA -> CPU through ``apply`` gives back every tensor and grad exactly.

    Same dtype, shape and values (NaNs included), on the CPU. Origin: checkpoints saved after
    ``model.to(xla)`` and ``model.cpu()`` (pytorch #17072's users).
    """
    names = named_tensors(module)
    values = {n: t.detach().clone() for n, t in names.items()}
    grads = {n: t.grad.clone() for n, t in names.items() if t.grad is not None}
    back = conversion_named("cpu()")
    example = Example(module, conversion=TO_XLA, flags=flags)
    check = Checker("XLA-ROUND-TRIP", target, example)
    outcome = attempt(lambda: [
        target.apply(module, c.make_fn(), overwrite=flags.overwrite, swap=flags.swap)
        for c in (TO_XLA, back)])
    if no_error(check, outcome, "apply(to('xla')) then apply(cpu())"):
        after = named_tensors(module)
        for name, value in values.items():
            check.that(same_values(after[name].detach(), value), "value",
                       f"{name!r} came back as {after[name].dtype}{tuple(after[name].shape)} on "
                       f"{after[name].device}, or with other values")
            if name in grads:
                grad = after[name].grad
                check.that(grad is not None and same_values(grad, grads[name]), "grad",
                           f"{name!r}.grad did not come back")
    check.verdict(lambda violations: REPRO_HEADER + _round_trip_repro(module, flags, violations))


def _round_trip_repro(module, flags, violations: list[Violation]) -> str:
    info = tree_info(module)
    lines = [info.source("module") if info else "module = ...  # build by hand",
             "values = {n: t.detach().clone() for n, t in module.state_dict().items()}",
             f"torch.__future__.set_overwrite_module_params_on_conversion({flags.overwrite})",
             f"torch.__future__.set_swap_module_params_on_conversion({flags.swap})",
             "module.to(xla_device()).cpu()",
             "for n, t in module.state_dict().items():",
             "    assert torch.equal(t, values[n]), n"]
    lines += [f"# broken rule [{v.clause}]: {v.message}" for v in violations]
    return "\n".join(lines)


@spec_property("XLA-DTYPE-PATH")
@given(module=trees, conversion=xla_dtype_changes, flags=flag_settings())
def test_xla_dtype_change_path(target, xla, module, conversion, flags):
    """On an XLA module, a dtype change takes the path the flags choose: set_data by default.

    XLA->XLA is TensorImpl-compatible, so with neither flag each parameter keeps its object and
    its ``_cdata``; the overwrite flag gives new objects, the swap flag the same objects with new
    ``_cdata``. The module is moved to XLA first by the reference (so the setup cannot deviate).
    Origin: pytorch #21613 (set_data stays the default where it is valid).
    """
    reference.apply(module, TO_XLA.make_fn(), overwrite=False, swap=False)
    example, check, snap = _setup(target, "XLA-DTYPE-PATH", module, conversion, flags)
    assume(snap.expected_error is None)
    outcome = run_apply(target, example, conversion.make_fn())
    if no_error(check, outcome, f"apply({conversion.name}) on XLA"):
        after = named_tensors(module)
        for name, before in snap.names.items():
            now, expected = after[name], snap.expected[id(before)]
            check.that(_on_xla(now) and now.dtype == expected.dtype, "value",
                       f"{name!r} is {now.dtype} on {now.device}, want {expected.dtype} on XLA")
            if id(before) not in snap.classes:
                continue
            path = expected_path(before, expected, flags.overwrite, flags.swap)
            check_path(check, name, before, now, snap.cdata[id(before)], path)
    _verdict(check, example, target, before=(
        "from swapspec import reference  # the move to XLA, as the property makes it",
        "reference.apply(module, lambda t: t.to(xla_device()), overwrite=False, swap=False)"))


@spec_property("XLA-FUNCTIONAL-CALL")
@given(module=trees, inputs=forward_inputs())
def test_xla_functional_call(target, xla, module, inputs):
    """``functional_call`` on a CPU module with every tensor on XLA matches the same call on CPU.

    Every parameter and buffer is given as an XLA copy (one copy per object, so ties stay tied)
    with an XLA input; the output, brought back to the CPU, is allclose to the call with CPU
    copies (tolerance of the least precise dtype in the module). Restoring the module is the
    FC properties' business, not checked here. The module runs in eval mode: training-mode batch statistics over a batch of two
    amplify float rounding (XLA and ATen reduce in different orders) far past any tight
    tolerance, which says nothing about functional_call.
    Origin: ``torch.func.functional_call`` (#92536 design) used with XLA weights.
    """
    module.eval()
    example = Example(module)
    check = Checker("XLA-FUNCTIONAL-CALL", target, example)
    tensors = named_tensors(module)
    cpu_dict = _copies(tensors, lambda t: t.detach().clone())
    xla_dict = _copies(tensors, lambda t: t.detach().to(xla))
    (x,) = inputs
    on_cpu = attempt(lambda: target.functional_call(module, cpu_dict, (x,)))
    assume(on_cpu.error is None)
    on_xla = attempt(lambda: target.functional_call(module, xla_dict, (x.to(xla),)))
    if no_error(check, on_xla, "functional_call with XLA tensors"):
        out = on_xla.result
        check.that(_on_xla(out), "output-device", f"the output is on {out.device}, not XLA")
        rtol, atol = _tolerance(distinct(list(tensors.values())))
        got = out.detach().cpu()
        want = on_cpu.result.detach()
        close = got.shape == want.shape and got.dtype == want.dtype and torch.allclose(
            got, want, rtol=rtol, atol=atol, equal_nan=True)
        check.that(close, "value", "the XLA output differs from the CPU output: max abs diff "
                   f"{(got - want).abs().max().item() if got.shape == want.shape else 'shape'}")
    check.verdict(lambda violations: REPRO_HEADER + _fc_repro(module, violations))


def _copies(tensors: dict[str, torch.Tensor], copy: Callable) -> dict[str, torch.Tensor]:
    """``{name: copy(t)}`` with one copy per distinct object (aliases share it)."""
    made: dict[int, torch.Tensor] = {}
    for t in tensors.values():
        if id(t) not in made:
            made[id(t)] = copy(t)
    return {n: made[id(t)] for n, t in tensors.items()}


def _tolerance(tensors: list[torch.Tensor]) -> tuple[float, float]:
    """``torch.testing.assert_close``'s default (rtol, atol) for the least precise dtype."""
    widths = {torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5),
              torch.float32: (1.3e-6, 1e-5), torch.complex64: (1.3e-6, 1e-5)}
    found = [widths[t.dtype] for t in tensors if t.dtype in widths]
    return max(found, default=(1e-7, 1e-7))


def _fc_repro(module, violations: list[Violation]) -> str:
    info = tree_info(module)
    lines = [info.source("module") if info else "module = ...  # build by hand",
             "module.eval()",
             f"x = torch.randn({BATCH}, {FEATURES})",
             "named = {**dict(module.named_parameters(remove_duplicate=False)),",
             "         **dict(module.named_buffers(remove_duplicate=False))}",
             "def copies(move):  # one copy per object, so ties stay tied",
             "    made = {id(t): move(t.detach()) for t in named.values()}",
             "    return {n: made[id(t)] for n, t in named.items()}",
             "cpu = torch.func.functional_call(module, copies(torch.clone), (x,))",
             "on_xla = torch.func.functional_call(module, copies(lambda t: t.to(xla_device())), "
             "(x.to(xla_device()),))",
             "torch.testing.assert_close(on_xla.cpu(), cpu)"]
    lines += [f"# broken rule [{v.clause}]: {v.message}" for v in violations]
    return "\n".join(lines)



# ---- load_state_dict across devices ---------------------------------------------------------

LOAD_KINDS = ("own", "fresh", "other-dtype")  # values that move to another device as they are


@spec_property("XLA-LOAD-INTO", suppress=(HealthCheck.filter_too_much,))
@given(module=trees, data=st.data())
def test_xla_load_into(target, xla, module, data):
    """A CPU state dict loaded into a module on XLA follows the LOAD- rules: a load that
    succeeds leaves each value on XLA (on the CPU with ``assign``), each tensor on its LOAD-PATH
    path, ties kept, and on the swap path each parameter's class, attributes, ``requires_grad``
    and grad; a load that fails raises and leaves the module exactly as it was.

    The module is moved to XLA by the reference (so the setup cannot deviate), the state dict is
    drawn for it and each value copied to the CPU (one copy per object, so ties in the state dict
    stay ties). Origin: checkpoints saved on the CPU and loaded into a model already on the
    accelerator (``model.to(xla)`` then ``model.load_state_dict(torch.load(...))``).
    """
    reference.apply(module, TO_XLA.make_fn(), overwrite=False, swap=False)
    load = _moved(data.draw(state_dicts(module, kinds=LOAD_KINDS), label="load"),
                  torch.device("cpu"))
    _check_cross_device_load(target, "XLA-LOAD-INTO", module, load, into=True)


@spec_property("XLA-LOAD-FROM", suppress=(HealthCheck.filter_too_much,))
@given(module=trees, data=st.data())
def test_xla_load_from(target, xla, module, data):
    """An XLA state dict loaded into a module on the CPU follows the LOAD- rules: a load that
    succeeds leaves each value on the CPU (on XLA with ``assign``), each tensor on its LOAD-PATH
    path, ties kept, and on the swap path each parameter's class, attributes, ``requires_grad``
    and grad; a load that fails raises and leaves the module exactly as it was.

    The state dict is drawn for the CPU module and each value copied to XLA (one copy per
    object). Origin: checkpoints saved from a model on the accelerator
    (``model.state_dict()`` after ``model.to(xla)``) loaded into a CPU model.
    """
    load = _moved(data.draw(state_dicts(module, kinds=LOAD_KINDS), label="load"), xla)
    _check_cross_device_load(target, "XLA-LOAD-FROM", module, load, into=False)


def _moved(load: LoadInput, device: torch.device) -> LoadInput:
    """``load`` with each tensor value copied to ``device``, one copy per object."""
    made: dict[int, torch.Tensor] = {}
    moved = {}
    for key, value in load.state_dict.items():
        if isinstance(value, torch.Tensor):
            value = made.setdefault(id(value), value.detach().to(device))
        moved[key] = value
    return dataclasses.replace(load, state_dict=moved)


def _check_cross_device_load(target, property_id: str, module, load: LoadInput,
                             into: bool) -> None:
    assume(not (load.swap and swap_refused(module)))
    example = Example(module, load=load)
    check = Checker(property_id, target, example)
    before = snapshot_for_load(module)
    names = named_tensors(module)
    paths = expected_paths(names, load)
    groups = slot_ties(module)
    succeeds = load_succeeds(module, load)
    assume(succeeds or key_model(module, load.state_dict).fails(load.strict))
    outcome = run_load(target, example)
    if not succeeds:
        check.that(isinstance(outcome.error, RuntimeError), "raised-none",
                   f"expected torch's RuntimeError, got {outcome.error!r}")
        changed = changes(before, module)
        check.that(not changed, "changed", f"the failed load changed the module: {changed[:4]}")
    elif no_error(check, outcome, "load_state_dict"):
        after = named_tensors(module)
        for key, path in paths.items():
            check_load_path(check, key, names[key], after[key], before.tensors[id(names[key])].cdata,
                            path)
        _check_loaded_values(check, names, after, load)
        _check_load_ties(check, groups, after)
        if load.swap:
            _check_swap_identity(check, before, module, load)
    check.verdict(lambda violations: _load_repro(example, target, violations, into))


def _check_loaded_values(check: Checker, names, after, load: LoadInput) -> None:
    for key, value in load.state_dict.items():
        if key in names and isinstance(value, torch.Tensor):
            slot = names[key]
            dtype, device = (value.dtype, value.device) if load.assign else (slot.dtype, slot.device)
            check.that(holds_value(after[key], value, dtype, device), "value",
                       f"{key!r} does not hold its value as {dtype} on {device}: got "
                       f"{after[key].dtype} on {after[key].device}")


def _check_load_ties(check: Checker, groups: list[list[str]], after) -> None:
    for names in groups:
        held = len({id(after[n]) for n in names})
        check.that(held == 1, "tie-split", f"{names} held one tensor and now hold {held}",
                   code=" is ".join(slot_code(n) for n in names[:2]))


def _check_swap_identity(check: Checker, before, module, load: LoadInput) -> None:
    """On the swap path: class (the value's with ``assign``), attributes, requires_grad, grad."""
    for name, p in module.named_parameters():
        rec = before.tensors.get(id(p))
        if rec is None or name not in load.state_dict:
            continue
        check.that(load.assign or type(p) is rec.cls, "class",
                   f"{name!r} changed class {rec.cls.__name__} -> {type(p).__name__}")
        check.that(all(a in p.__dict__ for a in rec.attributes), "attributes",
                   f"{name!r} lost instance attributes {rec.attributes}")
        check.that(p.requires_grad == rec.requires_grad, "requires-grad",
                   f"{name!r} requires_grad changed")
        check.that(rec.grad is None or p.grad is not None, "grad", f"{name!r} lost its grad")


def _load_repro(example: Example, target, violations: list[Violation], into: bool) -> str:
    """``load_repro``'s script, with the module moved to XLA (into) or the values (from)."""
    lines = load_repro(example, target, violations, verify=False).splitlines()
    if into:
        at = lines.index("module = build_module()")
        lines.insert(at + 1, "reference.apply(module, lambda t: t.to(xla_device()), "
                             "overwrite=False, swap=False)")
    else:
        at = next(i for i, line in enumerate(lines) if line.startswith("state_dict = "))
        lines.insert(at + 1, "moved = {}; state_dict = {k: moved.setdefault(id(v), "
                             "v.detach().to(xla_device())) if isinstance(v, torch.Tensor) "
                             "else v for k, v in state_dict.items()}")
    start = next(i for i, line in enumerate(lines) if not line.startswith("from __future__"))
    lines[start:start] = [*REPRO_HEADER.splitlines(), "from swapspec import reference"]
    return "\n".join(lines + [f"# broken rule [{v.clause}]: {v.message}" for v in violations])
