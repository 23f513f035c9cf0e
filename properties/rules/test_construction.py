"""Properties of building a module without initializing it, on the target's ``to_empty``:
``torch.nn.utils.skip_init`` and a build under ``with torch.device("meta")``, each under a
default dtype. One rule per test.

Each property draws a catalogue class with its constructor arguments
(``strategies.constructions``) and compares what the uninitialized build gives with what a plain
build of the same class and arguments gives under the same default dtype.

Origin: ``torch.nn.utils.skip_init``'s documentation and torch's tutorial "Skipping Module
Parameter Initialization" (build on ``meta``, then ``to_empty``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from hypothesis import event, given
from hypothesis import strategies as st
from torch import Tensor, nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import asserting_repro
from swapspec.properties.models.examples import Example
from swapspec.properties.models.outcomes import attempt, seeded_attempt
from swapspec.strategies import FlagSetting, flag_settings
from swapspec.strategies.constructions import Construction, constructions, default_dtype
from swapspec.strategies.torch_modules import cast_inputs, reference_tensor, seeded


def plain_build(build: Construction) -> nn.Module:
    """``module_cls(*args, **kwargs)`` under a seeded RNG (the caller sets the default dtype)."""
    args, kwargs = build.constructor_inputs()
    with seeded(0), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the catalogue's constructors' own advice
        return build.module_cls(*args, **kwargs)


def uninitialized_build(target: Any, build: Construction, flags: FlagSetting) -> nn.Module:
    """The build on ``build.path``, with the target's ``skip_init`` or ``to_empty``."""
    args, kwargs = build.constructor_inputs()
    if build.path == "skip_init":
        return target.method("skip_init")(build.module_cls, *args, overwrite=flags.overwrite,
                                          swap=flags.swap, **kwargs)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = build.module_cls(*args, **kwargs)
    return target.method("to_empty")(module, device="cpu", overwrite=flags.overwrite,
                                     swap=flags.swap)


def tensor_table(module: nn.Module) -> dict[str, tuple]:
    """Per dotted name (every path of a shared tensor), what a build decides for it: parameter or
    buffer, class, shape, dtype, device, ``requires_grad``; and the state-dict keys."""
    table: dict[str, tuple] = {
        name: ("parameter", type(t).__name__, tuple(t.shape), t.dtype, t.device.type,
               t.requires_grad)
        for name, t in module.named_parameters(remove_duplicate=False)}
    table.update({
        name: ("buffer", type(t).__name__, tuple(t.shape), t.dtype, t.device.type)
        for name, t in module.named_buffers(remove_duplicate=False)})
    table["state_dict keys"] = tuple(module.state_dict())
    return table


def copy_values(source: nn.Module, into: nn.Module) -> None:
    """Every parameter and buffer of ``into`` takes the values of ``source``'s of the same name."""
    values = dict(source.named_parameters(remove_duplicate=False))
    values.update(source.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for name, t in (*into.named_parameters(remove_duplicate=False),
                        *into.named_buffers(remove_duplicate=False)):
            t.copy_(values[name])


def eval_forward(module: nn.Module, build: Construction) -> Any:
    """The module's forward in eval mode on the variant's inputs (floating ones in its dtype)."""
    args, kwargs = build.forward_inputs()
    like = reference_tensor(module)
    module.eval()
    return module(*cast_inputs(args, like), **cast_inputs(kwargs, like))


def same_output(a: Any, b: Any) -> bool:
    """Equal structure, and tensors equal in dtype, shape and values within float rounding."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.allclose(
            a.double(), b.double(), rtol=1e-5, atol=1e-6, equal_nan=True)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same_output(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and (a is None or a == b)


@spec_property("APPLY-SKIP-INIT")
@given(data=st.data(), flags=flag_settings())
def test_skip_init_builds_what_a_plain_build_builds(target, data, flags):
    """``skip_init(cls, *args, **kwargs)``, and ``cls(*args, **kwargs)`` built under ``with
    torch.device("meta")`` then given the target's ``to_empty(device="cpu")``, under a float32
    or float64 default dtype and any flags, give a module of ``cls`` with the tensors a plain
    build gives (per name: parameter or buffer, class, shape, dtype, ``requires_grad``; the same
    state-dict keys), none left on ``meta``; given the plain build's values, its eval-mode forward
    returns what the plain build's returns.

    Origin: ``torch.nn.utils.skip_init``'s documentation ("instantiates a module without
    initializing its parameters / buffers"); torch's tutorial on skipping initialization.
    """
    build = data.draw(constructions(), label="construction")
    event(f"construction: {build.path}, default {build.default_dtype}")
    with default_dtype(build.default_dtype):
        plain = plain_build(build)
        example = Example(plain, flags=flags, method=build)
        check = Checker("APPLY-SKIP-INIT", target, example)
        outcome = attempt(lambda: uninitialized_build(target, build, flags))
    check.that(outcome.error is None, "returned", f"the build raised {outcome.error!r}")
    if outcome.error is None:
        module = outcome.result
        check.that(type(module) is build.module_cls, "class",
                   f"built a {type(module).__name__}, expected {build.module_cls.__name__}")
        got, want = tensor_table(module), tensor_table(plain)
        wrong = sorted(n for n in want.keys() | got.keys() if got.get(n) != want.get(n))
        check.that(not wrong, "tensors", "the tensors differ from a plain build's at "
                   f"{[(n, got.get(n), want.get(n)) for n in wrong[:3]]}")
        if not wrong:
            copy_values(plain, module)
            mine = seeded_attempt(lambda: eval_forward(module, build))
            theirs = seeded_attempt(lambda: eval_forward(plain, build))
            check.that(mine.error is None or theirs.error is not None, "forward",
                       f"forward raised {mine.error!r} where the plain build's returns")
            if mine.error is None and theirs.error is None:
                check.that(same_output(mine.result, theirs.result), "forward",
                           "given the plain build's values, forward returns another output")
    check.verdict(lambda violations: _repro(example, target, build, flags))


@spec_property("APPLY-SKIP-INIT-REFUSED")
@given(data=st.data())
def test_skip_init_refuses_a_class_it_cannot_build(target, data):
    """``skip_init`` of a class that is no ``nn.Module``, or whose constructor does not name
    ``device``, raises ``RuntimeError`` before it builds anything: torch's RNG and default
    dtype are as they were.

    Origin: ``torch.nn.utils.skip_init``'s documentation ("The module must accept a ``device``
    arg"); swapspec spec (bad input gets a clear error).
    """
    build = data.draw(constructions(refused=True), label="construction")
    event(f"construction refused: {build.refused}")
    with default_dtype(build.default_dtype):
        plain = plain_build(build) if build.refused != "not-a-module" else nn.Module()
        example = Example(plain, method=build)
        check = Checker("APPLY-SKIP-INIT-REFUSED", target, example)
        rng = torch.get_rng_state()
        outcome = attempt(lambda: uninitialized_build(target, build, FlagSetting(False, False)))
        check.that(torch.get_default_dtype() == build.default_dtype, "unchanged",
                   f"the default dtype became {torch.get_default_dtype()}")
    check.that(isinstance(outcome.error, RuntimeError), "raised",
               f"skip_init of {build.module_cls.__name__} "
               f"{'raised ' + repr(outcome.error) if outcome.error else 'returned'}; "
               "expected RuntimeError")
    check.that(torch.equal(torch.get_rng_state(), rng), "unchanged",
               "skip_init drew from torch's RNG before it refused")
    check.verdict(lambda violations: _repro(example, target, build, FlagSetting(False, False)))


def _repro(example: Example, target: Any, build: Construction, flags: FlagSetting) -> str:
    args, kwargs = build.constructor_inputs()
    cls = "dict" if build.refused == "not-a-module" else f"nn.{build.module_cls.__name__}"
    lines = ["tensor = torch.tensor  # as the arguments print",
             f"torch.set_default_dtype({build.default_dtype})",
             f"args, kwargs = {args!r}, {kwargs!r}"]
    if build.path == "skip_init":
        lines += ["try:",
                  f"    built = target_method({cls}, 'skip_init', {flags.overwrite}, {flags.swap},"
                  " *args, **kwargs)",
                  "    error = None",
                  "except Exception as e:",
                  "    built, error = None, e"]
    else:
        lines += ["with torch.device('meta'):",
                  f"    built = {cls}(*args, **kwargs)",
                  f"built = target_method(built, 'to_empty', {flags.overwrite}, {flags.swap}, "
                  "device='cpu')",
                  "error = None"]
    lines += [f"plain = {cls}(*args, **kwargs)" if build.refused is None else "plain = None"]
    if build.refused is not None:
        asserts = [("isinstance(error, RuntimeError)", "skip_init did not refuse the class")]
    else:
        asserts = [("error is None", "the build raised"),
                   ("[(n, type(t), t.shape, t.dtype, t.device, t.requires_grad) for n, t in "
                    "built.named_parameters()] == [(n, type(t), t.shape, t.dtype, t.device, "
                    "t.requires_grad) for n, t in plain.named_parameters()]",
                    "the parameters differ from a plain build's"),
                   ("[(n, t.shape, t.dtype, t.device) for n, t in built.named_buffers()] == "
                    "[(n, t.shape, t.dtype, t.device) for n, t in plain.named_buffers()]",
                    "the buffers differ from a plain build's")]
    return asserting_repro(example, target, lines, asserts)
