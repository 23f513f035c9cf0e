"""Standalone repro scripts for failing examples.

A repro is a Python script that rebuilds the drawn module, runs the same calls on the same
target and ends in asserts that fail there and pass on the reference. Rules:

* It imports nothing from swapspec: the module is built by plain torch code (see
  ``properties/models/standalone.py``), with the definitions of swapspec's module classes copied in.
* The implementation under test is one section of the script, between ``SECTION_START`` and
  ``SECTION_END``, that defines ``target_apply`` and ``target_functional_call``. For the
  built-in targets ``torch`` and ``torch-stateless`` they are plain torch calls (the flags set
  around ``nn.Module._apply``); for ``reference`` they call ``swapspec.reference``; any other
  target is imported by its selector (``importlib.import_module``, then the attribute).
  ``target_section`` gives that section for any target, so a repro can be pointed elsewhere.
* The asserts: each broken rule that comes with a line of code gets ``assert <code>``; then
  ``assert_same`` compares what the script observed (every slot of the module, the output,
  the caller's mapping, what forward saw) with what the reference does on the same script,
  entry by entry, for the entries where the two differ. Both are checked when the repro is
  made: the script runs here once on the target and once on the reference, and only asserts
  that fail on the target and hold on the reference are kept.
* ``apply_repro``/``call_repro`` with ``verify=False`` (the crash recorder's in-flight repro)
  give the script without asserts: the crash is the failure.
"""

from __future__ import annotations

import contextlib
import io
import random
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from swapspec.properties.models import standalone
from swapspec.properties.models.apply_state import slot_code
from swapspec.properties.vocabulary import Violation
from swapspec.reference import overrides as reference_overrides

SECTION_START = "# ---- the implementation under test: {name} ----"
SECTION_END = "# ---- end of the implementation under test ----"
TORCH_TARGETS = {"torch": "torch.func.functional_call",
                 "torch-stateless": "torch.nn.utils.stateless.functional_call"}

HELPERS = '''
def named(m):
    """Every name of every parameter and buffer, aliases included."""
    return dict([*m.named_parameters(remove_duplicate=False),
                 *m.named_buffers(remove_duplicate=False)])


def slots(module):
    """Every registered slot by dotted name, None slots and shared paths included."""
    out = {}
    for path, m in module.named_modules(remove_duplicate=False):
        for key, t in [*m._parameters.items(), *m._buffers.items()]:
            out[f"{path}.{key}" if path else key] = t
    return out


def snapshot(module):
    """{slot: (object, its TensorImpl, its grad)}, to compare with after the call."""
    return {n: (t, getattr(t, "_cdata", None), t.grad if isinstance(t, nn.Parameter) else None)
            for n, t in slots(module).items()}


def entries(tensors):
    """The caller's {name: value} over a dict or a tuple of dicts (a later dict wins)."""
    dicts = tensors if isinstance(tensors, (tuple, list)) else (tensors,)
    return {k: v for d in dicts if isinstance(d, dict) for k, v in d.items()}


def labels(before, given=()):
    """Names for the objects a call started from: the module's own ones and the given ones."""
    known = {}
    for n, (t, _, grad) in before.items():
        if t is not None:
            known.setdefault(id(t), f"its own {n}")
        if grad is not None:
            known.setdefault(id(grad), f"its own {n}.grad")
    for n, v in dict(given).items():
        known.setdefault(id(v), f"the given {n}")
    return known


def describe(v, known=None):
    """Which known object v is, if any, and its class, dtype, device, shape and values (a lazy
    module's uninitialized tensor has neither shape nor values: 'uninitialized')."""
    if isinstance(v, BaseException):
        return "raised " + type(v).__name__
    if not isinstance(v, torch.Tensor):
        return repr(v) if v is None or isinstance(v, (bool, int, float, str)) else type(v).__name__
    name = (known or {}).get(id(v), "a new object")
    if isinstance(v, nn.parameter.UninitializedTensorMixin):
        return (f"{name}: {type(v).__name__}({v.dtype}, {v.device.type}, uninitialized, "
                f"requires_grad={v.requires_grad})")
    try:
        values = v.detach().to_dense().cpu().reshape(-1).tolist()
    except Exception:  # a subclass without these ops: its parts, if it shows them
        values = parts(v)
    return (f"{name}: {type(v).__name__}({v.dtype}, {v.device.type}, {tuple(v.shape)}, "
            f"requires_grad={v.requires_grad}) {values}")


def parts(v):
    """A tensor subclass's values through its parts (__tensor_flatten__), else '?'."""
    try:
        names, ctx = v.__tensor_flatten__()
        return {"context": repr(ctx), **{n: describe(getattr(v, n)) for n in names}}
    except Exception:
        return "?"


def state(module, before, given=()):
    """What the module holds, slot by slot (and grads, and ties), against `before`."""
    known, out, by_id = labels(before, given), {}, {}
    plain = set(nn.Module().__dict__)
    for path, m in module.named_modules(remove_duplicate=False):
        out[f"module {path!r}"] = (f"{type(m).__name__}, parameters {list(m._parameters)}, "
                                   f"buffers {list(m._buffers)}, "
                                   f"other attributes {sorted(set(m.__dict__) - plain)}")
    for name, t in slots(module).items():
        out[name] = describe(t, known)
        was = before.get(name)
        if t is not None and was is not None and t is was[0]:
            out[name] += " same TensorImpl" if t._cdata == was[1] else " new TensorImpl"
        if isinstance(t, nn.Parameter):
            out[name + ".grad"] = describe(t.grad, known)
        if t is not None:
            by_id.setdefault(id(t), []).append(name)
    out["one object under several names"] = sorted(ns for ns in by_id.values() if len(ns) > 1)
    return out


def watch(module, known, given, form="module pre-hook"):
    """At the root's first forward, what each name shows: in named_*, parameters()/buffers(),
    state_dict(keep_vars=True) and (for given names) attribute access; seen by a forward
    pre-hook on the root or (form "global pre-hook") a global one."""
    seen = {}

    def hook(m, *_):
        if seen or m is not module:
            return
        ids = {id(t) for t in [*m.parameters(), *m.buffers()]}
        sd = m.state_dict(keep_vars=True)
        for name, t in named(m).items():
            seen[name] = (describe(t, known) + (" listed" if id(t) in ids else " not listed")
                          + ("" if sd.get(name, t) is t else ", state_dict shows another"))
        for name in given:
            try:
                seen[name + " (attribute)"] = describe(
                    functools.reduce(getattr, name.split("."), m), known)
            except Exception as e:
                seen[name + " (attribute)"] = "raised " + type(e).__name__
        seen["forward ran"] = True

    if form == "global pre-hook":
        torch.nn.modules.module.register_module_forward_pre_hook(hook)
    else:
        module.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def outcome(run):
    """run()'s result, or the exception it raised."""
    try:
        return run()
    except Exception as e:
        return e


def assert_same(observed, expected):
    """Each entry of `expected` (what the reference does in this script) is what happened."""
    wrong = {k: (observed.get(k, "absent"), want) for k, want in expected.items()
             if observed.get(k, "absent") != want}
    assert not wrong, "differs from the reference:\\n" + "\\n".join(
        f"  {k}:\\n    got  {got}\\n    want {want}" for k, (got, want) in wrong.items())
'''


# ---------------------------------------------------------------- the target section


def is_torch(target: Any) -> bool:
    """A built-in torch target (chosen by its selector, not by its name)."""
    return target.selector in TORCH_TARGETS


TORCH_METHOD = [
    "def target_method(module, name, overwrite, swap, /, *args, **kwargs):",
    "    \"\"\"module.<name>(*args, **kwargs): nn.Module's own public method, under the flags.\"\"\"",
    "    future = torch.__future__",
    "    saved = (future.get_overwrite_module_params_on_conversion(),",
    "             future.get_swap_module_params_on_conversion())",
    "    future.set_overwrite_module_params_on_conversion(overwrite)",
    "    future.set_swap_module_params_on_conversion(swap)",
    "    try:",
    "        if name in ('setattr', 'delattr'):  # setattr(module, name, value)",
    "            return (setattr if name == 'setattr' else delattr)(module, *args, **kwargs)",
    "        if name == 'register_parametrization':",
    "            return torch.nn.utils.parametrize.register_parametrization(module, *args, **kwargs)",
    "        if name == 'prune_remove':",
    "            return torch.nn.utils.prune.remove(module, *args, **kwargs)",
    "        if name in ('remove_weight_norm', 'remove_spectral_norm', 'skip_init',",
    "                    'convert_conv2d_weight_memory_format', 'convert_conv3d_weight_memory_format'):",
    "            return getattr(torch.nn.utils, name)(module, *args, **kwargs)",
    "        return getattr(module, name)(*args, **kwargs)",
    "    finally:",
    "        future.set_overwrite_module_params_on_conversion(saved[0])",
    "        future.set_swap_module_params_on_conversion(saved[1])",
    "",
]
# A target without methods of its own gets the reference's built on its apply: the one case
# where a repro of another target imports swapspec beyond the target itself.
TARGET_METHOD = [
    "def target_method(module, name, overwrite, swap, /, *args, **kwargs):",
    "    \"\"\"The target's public method `name`, else the reference's built on its apply.\"\"\"",
    "    method = getattr(getattr(target, 'methods', None), name, None)",
    "    if method is None:",
    "        from swapspec.reference.methods import Methods",
    "        method = getattr(Methods(target.apply), name)",
    "    return method(module, *args, overwrite=overwrite, swap=swap, **kwargs)",
    "",
]


def target_section(target: Any, *, methods: bool = False) -> list[str]:
    """The lines that define ``target_apply``, ``target_functional_call``,
    ``target_stack_module_state`` and ``target_load_state_dict`` for ``target`` (and
    ``target_method``, the public methods, with ``methods``)."""
    lines = [SECTION_START.format(name=target.selector)]
    if is_torch(target):
        fc = TORCH_TARGETS[target.selector]
        lines += [
            "def target_apply(module, fn, overwrite, swap, recurse=True):",
            "    \"\"\"nn.Module._apply under torch.__future__'s two flags.\"\"\"",
            "    future = torch.__future__",
            "    saved = (future.get_overwrite_module_params_on_conversion(),",
            "             future.get_swap_module_params_on_conversion())",
            "    future.set_overwrite_module_params_on_conversion(overwrite)",
            "    future.set_swap_module_params_on_conversion(swap)",
            "    try:",
            "        return module._apply(fn, recurse=recurse)",
            "    finally:",
            "        future.set_overwrite_module_params_on_conversion(saved[0])",
            "        future.set_swap_module_params_on_conversion(saved[1])",
            "",
            *(TORCH_METHOD if methods else []),
            "def target_functional_call(module, tensors, args, kwargs, **keywords):",
            "    with warnings.catch_warnings():",
            "        warnings.simplefilter('ignore', FutureWarning)",
            f"        return {fc}(module, tensors, args, kwargs, **keywords)",
            "",
            "target_stack_module_state = torch.func.stack_module_state",
            "",
            "def target_load_state_dict(module, state_dict, strict, assign, swap):",
            "    \"\"\"nn.Module.load_state_dict under torch.__future__'s swap flag.\"\"\"",
            "    saved = torch.__future__.get_swap_module_params_on_conversion()",
            "    torch.__future__.set_swap_module_params_on_conversion(swap)",
            "    try:",
            "        return module.load_state_dict(state_dict, strict=strict, assign=assign)",
            "    finally:",
            "        torch.__future__.set_swap_module_params_on_conversion(saved)",
        ]
    else:
        lines += [
            *_imported_target(target),
            "def target_apply(module, fn, overwrite, swap, recurse=True):",
            "    return target.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)",
            "",
            *(TARGET_METHOD if methods else []),
            "def target_functional_call(module, tensors, args, kwargs, **keywords):",
            "    return target.functional_call(module, tensors, args, kwargs, **keywords)",
            "",
            "target_stack_module_state = getattr(target, 'stack_module_state', None) or "
            "torch.func.stack_module_state",
            "",
            "def target_load_state_dict(module, state_dict, strict, assign, swap):",
            "    return target.load_state_dict(module, state_dict, strict=strict, assign=assign, swap=swap)",
        ]
    return [*lines, SECTION_END]


def _imported_target(target: Any) -> list[str]:
    if target.selector == "reference":
        return ["from swapspec import reference as target", ""]
    module_name, _, attribute = target.selector.partition(":")
    code = f"importlib.import_module({module_name!r})"
    return [f"target = {f'getattr({code}, {attribute!r})' if attribute else code}", ""]


def _reference() -> Any:
    from swapspec.properties.harness.targets import builtin_target

    return builtin_target("reference")


# ---------------------------------------------------------------- scripts


def apply_repro(example: Any, target: Any, violations: list[Violation], *,
                setup: list[str] = (), extra: list[str] = (), observe: dict[str, str] | None = None,
                verify: bool = True) -> str:
    """A script that converts the example's module on ``target`` and shows the broken rule.

    ``setup`` lines run after the module is built (before the snapshot ``before``), ``extra``
    lines after the conversion (before the asserts); ``observe`` adds ``{label: expression}``
    to what is compared with the reference.
    """
    body = ["module = build_module()", *setup, "before = named(module)", "snap = snapshot(module)",
            *_conversion_lines(example),
            "try:",
            f"    {_convert_code(example)}",
            "    error = None",
            "except Exception as e:  # some rules are about failed calls",
            "    error = e",
            "    print('raised', type(e).__name__, e)",
            "after = named(module)", *extra,
            "observed = {'error': describe(error), **state(module, snap)" + _observe(observe) + "}"]
    return _script(example.module, target, body, violations, verify, host_imports(example))


def method_repro(example: Any, target: Any, violations: list[Violation], *,
                 verify: bool = True) -> str:
    """A script that makes the example's public method call (``example.method``) on ``target``
    and shows the broken rule."""
    body = ["module = build_module()", "before = named(module)", "snap = snapshot(module)",
            "try:",
            f"    out = {method_code(example.method, example.flags)}",
            "    error = None",
            "except Exception as e:  # a bad form must raise",
            "    out, error = None, e",
            "    print('raised', type(e).__name__, e)",
            "after = named(module)",
            "observed = {'error': describe(error), 'returned module': out is module, "
            "**state(module, snap)}"]
    return _script(example.module, target, body, violations, verify, host_imports(example))


def registration_repro(example: Any, target: Any, violations: list[Violation], *,
                       setup: list[str] = (), verify: bool = True) -> str:
    """A script that makes the example's registration call (``example.method``, a
    ``strategies.registrations.RegistrationCall``) on ``target`` and shows the broken rule;
    ``setup`` lines run before the call."""
    call = example.method
    body = ["module = build_module()", f"owner = {call.owner_code}", *setup,
            "before = named(module)", "snap = snapshot(module)",
            "try:",
            f"    out = {call.code()}",
            "    error = None",
            "except Exception as e:  # a bad form must raise",
            "    out, error = None, e",
            "    print('raised', type(e).__name__, e)",
            "after = named(module)",
            "observed = {'error': describe(error), **state(module, snap)}"]
    return _script(example.module, target, body, violations, verify)


def _conversion_lines(example: Any) -> list[str]:
    """``fn = ...`` for an ``_apply(fn)`` conversion (a method call builds its own; the
    conversion's ``imports`` head the script: ``host_imports``), and the weak reference of a
    refused tensor."""
    call = getattr(example.conversion, "call", None)
    fn = [] if call is not None else example.conversion.source("fn").splitlines()[-1:]
    return [*fn, *_refused_lines(example)]


def _convert_code(example: Any) -> str:
    """The conversion as the example made it: ``target_apply(module, fn, ...)``, or the public
    method call ``target_method(module, 'to', overwrite, swap, <its arguments>)``."""
    flags = example.flags
    call = getattr(example.conversion, "call", None)
    if call is None:
        return (f"target_apply(module, fn, overwrite={flags.overwrite}, swap={flags.swap}, "
                f"recurse={example.recurse})")
    return method_code(call, flags)


def method_code(call: Any, flags: Any) -> str:
    """``target_method(module, <method>, <overwrite>, <swap>, <arguments>)``: the public method
    call on the target under test (for torch: ``module.<method>(<arguments>)`` under its flags)."""
    arguments = f", {call.arguments}" if call.arguments else ""
    return (f"target_method(module, {call.method!r}, {flags.overwrite}, {flags.swap}"
            f"{arguments})")


def _refused_lines(example: Any) -> list[str]:
    """Hold a weak reference to the example's refused tensor, so ``swap_tensors`` refuses it."""
    if example.refused is None:
        return []
    name, is_grad = example.refused_parameter()
    code = slot_code(name) + (".grad" if is_grad else "")
    return ["import weakref", f"held = weakref.ref({code})  # swap_tensors refuses a weakly referenced tensor"]


def call_repro(example: Any, target: Any, violations: list[Violation], *,
               setup: list[str] = (), calls: list[str] | None = None,
               observe: dict[str, str] | None = None, verify: bool = True,
               watch_form: str = "module pre-hook") -> str:
    """A script that runs the example's functional call on ``target`` and shows the broken rule.

    ``setup`` lines run after the call's arguments are defined; ``calls`` replace the one call
    (they set ``out``); ``observe`` adds ``{label: expression}`` to what is compared;
    ``watch_form`` is how forward is watched (``models.call_state.WATCH_FORMS``).
    """
    call = example.call
    own = {id(t): f"before[{name!r}]" for name, t in example.names_before.items()}
    body = ["module = build_module()", "before = named(module)", "snap = snapshot(module)"]
    tensors = example.tensors_before  # as given: the call may have written back into them
    body += _shared_value_lines(tensors, own)  # one variable per object given twice
    body += [f"tensors = {_tensors_code(tensors, own)}",
             f"args = {_value_code(call.args, own)}",
             f"kwargs = {_value_code(call.kwargs, own)}",
             "given = entries(tensors)",
             "known = labels(snap, given)",
             *setup,
             "view = watch(module, known, given)" if watch_form == "module pre-hook" else
             f"view = watch(module, known, given, {watch_form!r})"]
    body += calls if calls is not None else [
        *_in_grad_mode(call, f"out = outcome(lambda: target_functional_call(module, tensors, "
                             f"args, kwargs{keyword_code(target, call)}))"),
        "if isinstance(out, Exception):",
        "    print('raised', type(out).__name__, out)"]
    body += ["after = named(module)",
             "observed = {**state(module, snap, given), 'output': describe(out, known), "
             "**{f'forward saw {k}': v for k, v in view.items()}, "
             "**{f'caller holds {k}': describe(v, known) for k, v in entries(tensors).items()}"
             + _observe(observe) + "}"]
    return _script(example.module, target, body, violations, verify, host_imports(example))


def _in_grad_mode(call: Any, line: str) -> list[str]:
    """``line`` as it runs under the call's autograd mode (``CallInput.grad_mode``)."""
    mode = getattr(call, "grad_mode", "enabled")
    return [line] if mode == "enabled" else [f"with torch.{mode}():", f"    {line}"]


def _observe(observe: dict[str, str] | None) -> str:
    return "".join(f", {label!r}: {code}" for label, code in (observe or {}).items())


def keyword_code(target: Any, call: Any) -> str:
    """``, tie_weights=..., strict=...``: only the keywords the target takes."""
    keywords = target.call_keywords(tie_weights=call.tie_weights, strict=call.strict)
    return "".join(f", {k}={v}" for k, v in keywords.items())


def host_imports(example: Any) -> list[str]:
    """The host's lines a repro of ``example`` needs, each once: the ``imports`` of its
    conversions (``earlier`` ones first) and the imports of its host modules."""
    conversions = [c for c in (*example.earlier, example.conversion) if c is not None]
    lines = [line for c in conversions for line in getattr(c, "imports", "").splitlines()
             if line.strip()]
    return list(dict.fromkeys([*lines, *standalone.host_imports(example.module)]))


def _script(module: Any, target: Any, body: list[str], violations: list[Violation],
            verify: bool, imports: list[str] = ()) -> str:
    """Imports (swapspec's, then the host's), definitions, ``build_module``, the target section,
    ``body``, then the asserts."""
    build = standalone.build_source(module)
    methods = any("target_method(" in line for line in body)
    catalogue = "catalogue_leaf(" in "\n".join(build)
    head = [*standalone.IMPORTS, ""]
    if imports:
        head += ["# the host's own imports", *imports, ""]
    if any("TwoTensor" in line for line in body):
        head.append("from torch.testing._internal.two_tensor import TwoTensor")
    codes = [v.code for v in violations if v.code]
    needed = standalone.names_used([*build, *body, *codes]) | {"assert_same"}
    needed |= {"seeded", "CatalogueLeaf"} if catalogue else set()
    head += ["", *standalone.definitions(needed, HELPERS), ""]
    if catalogue:
        head += ["", *standalone.CATALOGUE_LEAF]
    head += ["", "", *build, "", ""]
    tail = ["", *body]
    if not verify:
        return "\n".join([*head, *target_section(target, methods=methods), *tail]) + "\n"
    return "\n".join([*head, *target_section(target, methods=methods), *tail,
                      *_asserts(head, tail, target, violations, methods)]) + "\n"


def comment_lines(text: str) -> list[str]:
    """``text`` as Python comment lines, one per line of it: a message can span lines (an
    error's text that prints a tensor), and each of them must stay a comment."""
    return [f"# {line}".rstrip() for line in text.splitlines() or [""]]


def _asserts(head: list[str], tail: list[str], target: Any, violations: list[Violation],
             methods: bool = False) -> list[str]:
    """Each broken rule as a comment, its code as an assert where that fails on the target and
    holds on the reference, then ``assert_same`` on the entries where the two differ."""
    run = {who: _run_here([*head, *target_section(t, methods=methods), *tail])
           for who, t in (("target", target), ("reference", _reference()))}
    lines = [""]
    failed = [f"{who}: {type(ns).__name__}: {ns}" for who, ns in run.items() if isinstance(ns, Exception)]
    for v in violations:
        lines += comment_lines(f"broken rule [{v.clause}]: {v.message}")
        if v.code and not failed and _holds(v.code, run["reference"]) is True \
                and _holds(v.code, run["target"]) is False:
            lines.append(f"assert {v.code}, {v.message!r}")
    if failed:
        return [*lines, "# this script could not be checked here: " + "; ".join(failed)]
    got, want = run["target"]["observed"], run["reference"]["observed"]
    differ = {k: want.get(k, "absent") for k in [*want, *(k for k in got if k not in want)]
              if got.get(k, "absent") != want.get(k, "absent")}
    if differ:
        lines += ["# what the reference does in this script, where the target did otherwise:",
                  f"assert_same(observed, {standalone.literal(differ)})"]
    elif not any(line.startswith("assert ") for line in lines):
        lines.append("# no observed difference from the reference: the broken rule is about "
                     "something this script does not record")
    return lines


def _holds(code: str, namespace: dict) -> bool | None:
    try:
        return bool(eval(code, dict(namespace)))
    except Exception:
        return None


def _run_here(lines: list[str]) -> dict | Exception:
    """The namespace the script leaves, run in this process with global state put back."""
    namespace: dict[str, Any] = {"__name__": "swapspec_repro"}
    with _restored_globals(), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            exec(compile("\n".join(lines), "<swapspec repro>", "exec"), namespace)
        except Exception as e:
            return e
    return namespace


@contextlib.contextmanager
def _restored_globals() -> Iterator[None]:
    future = torch.__future__
    saved = (future.get_overwrite_module_params_on_conversion(),
             future.get_swap_module_params_on_conversion(), torch.get_default_dtype(),
             torch.is_grad_enabled(), random.getstate())
    described = reference_overrides.registered_apply_overrides()  # a script's own classes
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        reference_overrides.restore_registered_apply_overrides(described)
        future.set_overwrite_module_params_on_conversion(saved[0])
        future.set_swap_module_params_on_conversion(saved[1])
        torch.set_default_dtype(saved[2])
        torch.set_grad_enabled(saved[3])
        random.setstate(saved[4])


# ---------------------------------------------------------------- values


def _shared_value_lines(tensors: Any, own: dict[int, str]) -> list[str]:
    """Define ``given_<i>`` for each fresh tensor given under two or more names; record it in ``own``."""
    dicts = [tensors] if isinstance(tensors, dict) else list(tensors) if isinstance(tensors, tuple | list) else []
    values = [v for d in dicts if isinstance(d, dict) for v in d.values() if isinstance(v, Tensor)]
    lines = []
    for v in values:
        if id(v) not in own and sum(w is v for w in values) > 1:
            own[id(v)] = f"given_{len(lines)}"
            lines.append(f"{own[id(v)]} = {standalone.tensor_code(v)}")
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
        return own.get(id(value)) or standalone.tensor_code(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_value_code(v, own)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + "".join(f"{_value_code(v, own)}, " for v in value) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_value_code(v, own) for v in value) + "]"
    return standalone.literal(value)


def retargeted(script: str, target: Any) -> str:
    """``script`` with its implementation-under-test section replaced by ``target``'s."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(SECTION_START.split("{")[0]))
    end = lines.index(SECTION_END)
    methods = any(line.startswith("def target_method(") for line in lines[start:end])
    return "\n".join([*lines[:start], *target_section(target, methods=methods),
                      *lines[end + 1:]]) + "\n"

def load_repro(example: Any, target: Any, violations: list[Violation], *, verify: bool = True) -> str:
    """A script that loads the example's state dict into its module on ``target`` and shows the
    broken rule. Values that are the module's own tensors are named by slot."""
    load = example.load
    named = example.names_before
    own: dict[int, str] = {}
    for name, t in named.items():
        own.setdefault(id(t), f"before[{name!r}]")
    values = ", ".join(f"{k!r}: {_load_value_code(v, own, named.get(k))}"
                       for k, v in load.state_dict.items())
    body = ["module = build_module()", "before = named(module)", "snap = snapshot(module)",
            f"state_dict = {{{values}}}",
            "given = dict(state_dict)",
            "known = labels(snap, given)",
            f"out = outcome(lambda: target_load_state_dict(module, state_dict, strict={load.strict}, "
            f"assign={load.assign}, swap={load.swap}))",
            "if isinstance(out, Exception):",
            "    print('raised', type(out).__name__, out)",
            "after = named(module)",
            "observed = {**state(module, snap, given), 'output': describe(out, known)}"]
    return _script(example.module, target, body, violations, verify, host_imports(example))


def _load_value_code(value: Any, own: dict[int, str], slot: Any) -> str:
    """The module's own tensor by name, its detached alias, a TwoTensor, or a value."""
    if isinstance(value, Tensor) and id(value) in own:
        return own[id(value)]
    if isinstance(value, Tensor) and slot is not None and value is not slot and \
            id(slot) in own and value.device == slot.device and not slot.is_meta and \
            value.dtype == slot.dtype and torch._C._is_alias_of(value, slot):
        return f"{own[id(slot)]}.detach()"
    return _value_code(value, own)


def script_repro(example: Any, target: Any, violations: list[Violation], body: list[str], *,
                 verify: bool = True) -> str:
    """A script that builds the example's module and runs ``body`` on ``target``.

    ``body`` starts from ``module = build_module()``, calls the target through ``target_apply``
    or ``target_load_state_dict`` and sets ``observed``, the dict compared with the reference."""
    return _script(example.module, target, ["module = build_module()", *body], violations, verify)


def asserting_repro(example: Any, target: Any, body: list[str],
                    asserts: list[tuple[str, str]], imports: list[str] = ()) -> str:
    """A script that builds the example's module, runs ``body`` (on ``target`` where it calls
    ``target_apply``/``target_method``) and ends in ``asserts`` (``(code, message)``), each as
    written: for rules about host material (a conversion's contract, a module conversion), where
    the reference would run the same host code, so nothing is compared with it. The host's
    imports head it; it exits 1 on the first assert that fails."""
    lines = ["module = build_module()", *body]
    head = list(dict.fromkeys([*host_imports(example), *imports]))
    script = _script(example.module, target, lines, [], False, head)
    return script + "".join(f"assert {code}, {message!r}\n" for code, message in asserts)


def converted_body(example: Any) -> list[str]:
    """Lines that convert the example's module as it was converted (``_apply(fn)`` or the public
    method call), keeping the error (``error``) and the tensors after (``after``)."""
    return ["before = named(module)", *_conversion_lines(example),
            "try:",
            f"    {_convert_code(example)}",
            "    error = None",
            "except Exception as e:",
            "    error = e",
            "    print('raised', type(e).__name__, e)",
            "after = named(module)"]
