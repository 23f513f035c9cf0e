"""Reference module registration: ``register_parameter``, ``register_buffer``, ``add_module``,
``register_module``, ``set_submodule``, ``setattr``, ``delattr`` and ``register_parametrization`` on an
``nn.Module``, and the ``swap_tensors`` the swap paths use.

Rules:

1. Check, then register. Every argument is checked before anything changes: the module's
   ``__init__`` has run, the name is a string that is not empty, holds no ``"."`` and names no
   other attribute, and the value has the slot's kind. A refusal raises torch's error type
   with torch's message and leaves the module exactly as it was (its registries, its
   ``__dict__``, its non-persistent set).
2. Hooks, then the slot. A registration that passes its checks calls torch's global
   registration hooks of its kind (``register_module_parameter_registration_hook``, ``..._buffer_...``,
   ``..._module_...``) in order with ``(module, name, value)``; a hook's non-None return replaces
   the value for the hooks after it and the slot. A ``None`` parameter skips the hooks (as
   torch's ``register_parameter`` does).
3. ``None`` keeps the slot. ``None`` given to a registered parameter, buffer or child keeps the
   name registered, holding ``None``.
4. ``setattr(module, name, value)`` is torch's ``Module.__setattr__``: a ``Parameter`` becomes a
   parameter (the name leaves ``__dict__``, the buffers and the children), a name that is a
   parameter takes only a ``Parameter`` or ``None``; a ``Module`` becomes a child (the name
   leaves ``__dict__``, the parameters and the buffers), a name that is a child takes only a
   ``Module`` or ``None``; an ``nn.Buffer`` or a name that is a buffer becomes a buffer (its
   persistence the ``Buffer``'s, else the slot's); anything else a plain attribute. A buffer
   goes through the module's own ``register_buffer`` where its class overrides ``nn.Module``'s:
   with its persistence where the override takes ``persistent``, else without it, and a
   non-persistent buffer is refused (``RuntimeError``) before anything changes. Unlike
   torch, rule 1 holds here too: the checks come before the name leaves the other registries,
   and a child's name is checked as ``add_module`` checks it.
5. ``delattr(module, name)`` removes a parameter, a buffer (and its non-persistence) or a
   child of that name, else the plain attribute (``AttributeError`` when there is none).
6. ``swap_tensors(t1, t2)`` is ``torch.utils.swap_tensors`` with its refusals checked first
   and each named by its cause (``RuntimeError``): a weak reference to either tensor, different
   ``__slots__``, a TensorImpl held elsewhere than by its object and its own AccumulateGrad
   node (a view, a saved tensor). Both tensors are left as they were. A swap it makes poisons
   the AccumulateGrad node of each swapped leaf that has one, whatever the tensor's class: a
   backward through a graph built before the swap raises instead of accumulating into the
   other object (torch's poisons a wrong node for a subclass with the default
   ``__torch_function__``).
7. ``register_parametrization(module, name, parametrization, unsafe=False)`` is
   ``torch.nn.utils.parametrize.register_parametrization`` with rule 1: a first registration's
   ``unsafe=False`` checks (``right_inverse`` keeps the dtype, the parametrization keeps the
   dtype and shape...) run on a copy of the tensor (its class, ``Parameter`` or not, and its
   ``requires_grad`` kept; a plain tensor for a wrapper subclass) and of the parametrization
   before anything is written, so a refused registration raises torch's ``ValueError`` and
   leaves the module and the parametrization as they were.
8. ``set_submodule(module, target, child, strict=False)`` is ``Module.set_submodule``: the
   target is a dotted path whose parent (all but its last name) must be a submodule
   (``get_submodule``'s ``AttributeError``); it is refused (``ValueError``) when empty or when
   ``child`` is no ``Module``, and (``AttributeError``) when its last name is an attribute of
   the parent that holds no module (a parameter, a buffer, a ``None`` child, a method) or, with
   ``strict``, no attribute of the parent; then the child is set by rule 4's ``setattr``.
"""

from __future__ import annotations

import copy
import copyreg
import inspect
import weakref
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules import module as torch_module
from torch.nn.parameter import Buffer, Parameter
from torch.nn.utils import parametrize
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from swapspec.reference.apply import _held_by_own_node

REGISTRATION_METHODS = ("register_parameter", "register_buffer", "add_module",
                        "register_module", "set_submodule", "setattr", "delattr",
                        "register_parametrization")


def _hooks(kind: str) -> dict:
    """torch's global registration hooks of ``kind`` (``parameter``, ``buffer``, ``module``)."""
    return getattr(torch_module, f"_global_{kind}_registration_hooks")


def _hooked(kind: str, module: nn.Module, name: str, value: Any) -> Any:
    """Rule 2: the value after every global hook of ``kind`` has seen it."""
    for hook in list(_hooks(kind).values()):
        output = hook(module, name, value)
        if output is not None:
            value = output
    return value


def _check_initialized(module: nn.Module, registry: str, what: str) -> None:
    if registry not in module.__dict__:
        raise AttributeError(f"cannot assign {what} before Module.__init__() call")


def _check_name(name: Any, kind: str, taken: bool) -> None:
    """Rule 1 for a parameter's or buffer's name; ``taken``: another attribute has it."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string. Got {torch.typename(name)}")
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain "."')
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if taken:
        raise KeyError(f"attribute '{name}' already exists")


def _is_tensor_like(value: Any) -> bool:
    return isinstance(value, Tensor) or hasattr(value, "__torch_function__")


def _check_parameter(module: nn.Module, name: Any, param: Any, taken: bool) -> None:
    _check_initialized(module, "_parameters", "parameter")
    _check_name(name, "parameter", taken)
    if param is None:
        return
    if not isinstance(param, Parameter):
        raise TypeError(f"cannot assign '{torch.typename(param)}' object to parameter '{name}' "
                        "(torch.nn.Parameter or None required)")
    if param.grad_fn:
        raise ValueError(
            f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
            f"created explicitly. To express '{name}' as a function of another Tensor, compute "
            "the value in the forward() method.")


def _check_buffer(module: nn.Module, name: Any, tensor: Any, persistent: bool,
                  taken: bool) -> None:
    if persistent is False and isinstance(module, torch.jit.ScriptModule):
        raise RuntimeError("ScriptModule does not support non-persistent buffers")
    _check_initialized(module, "_buffers", "buffer")
    _check_name(name, "buffer", taken)
    if tensor is not None and not _is_tensor_like(tensor):
        raise TypeError(f"cannot assign '{torch.typename(tensor)}' object to buffer '{name}' "
                        "(torch Tensor or None required)")


def _check_child(module: nn.Module, name: Any, child: Any, taken: bool) -> None:
    if not isinstance(child, nn.Module) and child is not None:
        raise TypeError(f"{torch.typename(child)} is not a Module subclass")
    if not isinstance(name, str):
        raise TypeError(f"module name should be a string. Got {torch.typename(name)}")
    if "_modules" not in module.__dict__:  # torch's words: its read of the missing registry
        raise AttributeError(f"'{type(module).__name__}' object has no attribute '_modules'")
    if taken:
        raise KeyError(f"attribute '{name}' already exists")
    if "." in name:
        raise KeyError(f'module name can\'t contain ".", got: {name}')
    if name == "":
        raise KeyError('module name can\'t be empty string ""')


def _taken(module: nn.Module, name: Any, registry: str) -> bool:
    """Whether ``name`` is an attribute of ``module`` other than a slot of ``registry``."""
    return (isinstance(name, str) and hasattr(module, name)
            and name not in module.__dict__.get(registry, {}))


def _taken_by_class(module: nn.Module, name: str, registry: str) -> bool:
    """``_taken`` once ``setattr`` has removed the name from ``__dict__`` and the other
    registries: only a class attribute still has it."""
    return hasattr(type(module), name) and name not in module.__dict__.get(registry, {})


def _put_parameter(module: nn.Module, name: str, param: Parameter | None) -> None:
    module._parameters[name] = param if param is None else _hooked("parameter", module, name, param)


def _put_buffer(module: nn.Module, name: str, tensor: Tensor | None, persistent: bool) -> None:
    module._buffers[name] = _hooked("buffer", module, name, tensor)
    if persistent:
        module._non_persistent_buffers_set.discard(name)
    else:
        module._non_persistent_buffers_set.add(name)


def _put_child(module: nn.Module, name: str, child: nn.Module | None) -> None:
    module._modules[name] = _hooked("module", module, name, child)


def register_parameter(module: nn.Module, name: str, param: Parameter | None, *,
                       overwrite: bool | None = None, swap: bool | None = None) -> None:
    """``module.register_parameter(name, param)`` (rules 1-3); the flags are ignored."""
    _check_parameter(module, name, param, _taken(module, name, "_parameters"))
    _put_parameter(module, name, param)


def register_buffer(module: nn.Module, name: str, tensor: Tensor | None, persistent: bool = True,
                    *, overwrite: bool | None = None, swap: bool | None = None) -> None:
    """``module.register_buffer(name, tensor, persistent=True)`` (rules 1-3)."""
    _check_buffer(module, name, tensor, persistent, _taken(module, name, "_buffers"))
    _put_buffer(module, name, tensor, persistent)


def add_module(module: nn.Module, name: str, child: nn.Module | None, *,
               overwrite: bool | None = None, swap: bool | None = None) -> None:
    """``module.add_module(name, child)`` (rules 1-3)."""
    _check_child(module, name, child, _taken(module, name, "_modules"))
    _put_child(module, name, child)


def register_module(module: nn.Module, name: str, child: nn.Module | None, *,
                    overwrite: bool | None = None, swap: bool | None = None) -> None:
    """``module.register_module(name, child)``: ``add_module``."""
    add_module(module, name, child)


def set_submodule(module: nn.Module, target: str, child: nn.Module, strict: bool = False, *,
                  overwrite: bool | None = None, swap: bool | None = None) -> None:
    """``module.set_submodule(target, child, strict=False)`` (rule 8)."""
    if target == "":
        raise ValueError("Cannot set the submodule without a target name!")
    if not isinstance(child, nn.Module):
        raise ValueError(f"`module` is not an nn.Module, found {type(child)}")
    *path, name = target.split(".")
    parent = module.get_submodule(".".join(path))
    if strict and not hasattr(parent, name):
        raise AttributeError(f"{parent._get_name()} has no attribute `{name}`")
    if hasattr(parent, name) and not isinstance(getattr(parent, name), nn.Module):
        raise AttributeError(f"`{name}` is not an nn.Module")
    setattr(parent, name, child)


def _remove(module: nn.Module, name: str, registries: tuple[str, ...]) -> None:
    """``name`` out of ``__dict__`` and each of ``registries`` (dicts or the non-persistent set)."""
    module.__dict__.pop(name, None)
    for registry in registries:
        found = module.__dict__[registry]
        if isinstance(found, dict):
            found.pop(name, None)
        else:
            found.discard(name)


def setattr(module: nn.Module, name: str, value: Any, *, overwrite: bool | None = None,
            swap: bool | None = None) -> None:
    """``setattr(module, name, value)``: rule 4."""
    params = module.__dict__.get("_parameters")
    modules = module.__dict__.get("_modules")
    buffers = module.__dict__.get("_buffers")
    if isinstance(value, Parameter):
        _check_initialized(module, "_parameters", "parameters")
        _check_parameter(module, name, value, _taken_by_class(module, name, "_parameters"))
        _remove(module, name, ("_buffers", "_modules", "_non_persistent_buffers_set"))
        _put_parameter(module, name, value)
    elif params is not None and name in params:
        if value is not None:
            raise TypeError(f"cannot assign '{torch.typename(value)}' as parameter '{name}' "
                            "(torch.nn.Parameter or None expected)")
        _put_parameter(module, name, None)
    elif isinstance(value, nn.Module):
        _check_initialized(module, "_modules", "module")
        _check_child(module, name, value, _taken_by_class(module, name, "_modules"))
        _remove(module, name, ("_parameters", "_buffers", "_non_persistent_buffers_set"))
        _put_child(module, name, value)
    elif modules is not None and name in modules:
        if value is not None:
            raise TypeError(f"cannot assign '{torch.typename(value)}' as child module '{name}' "
                            "(torch.nn.Module or None expected)")
        _put_child(module, name, None)
    elif isinstance(value, Buffer) or (buffers is not None and name in buffers):
        if value is not None and not _is_tensor_like(value):
            raise TypeError(f"cannot assign '{torch.typename(value)}' as buffer '{name}' "
                            "(torch.nn.Buffer, torch.Tensor or None expected)")
        persistent = (value.persistent if isinstance(value, Buffer)
                      else name not in module._non_persistent_buffers_set)
        _set_buffer(module, name, value, persistent)
    else:
        object.__setattr__(module, name, value)


def _set_buffer(module: nn.Module, name: str, value: Any, persistent: bool) -> None:
    """Rule 4's buffer: the reference's ``register_buffer``, or the override of the module's
    class (with ``persistent`` where it takes it; a non-persistent buffer refused where not)."""
    if type(module).register_buffer is nn.Module.register_buffer:
        register_buffer(module, name, value, persistent)
    elif "persistent" in inspect.signature(module.register_buffer).parameters:
        module.register_buffer(name, value, persistent)
    elif not persistent:
        raise RuntimeError("Registering a non-persistent buffer on a Module subclass that "
                           "implements register_buffer() without the persistent argument is "
                           "not allowed.")
    else:
        module.register_buffer(name, value)


def delattr(module: nn.Module, name: str, *, overwrite: bool | None = None,
            swap: bool | None = None) -> None:
    """``delattr(module, name)``: rule 5."""
    for registry in ("_parameters", "_buffers", "_modules"):
        if name in module.__dict__[registry]:
            del module.__dict__[registry][name]
            if registry == "_buffers":
                module._non_persistent_buffers_set.discard(name)
            return
    object.__delattr__(module, name)


def swap_tensors(t1: Tensor, t2: Tensor) -> None:
    """``torch.utils.swap_tensors(t1, t2)``: rule 6."""
    for label, t in (("t1", t1), ("t2", t2)):
        if weakref.getweakrefs(t):
            raise RuntimeError(f"Cannot swap {label} because it has weakref associated with it")
    if set(copyreg._slotnames(type(t1))) != set(copyreg._slotnames(type(t2))):
        raise RuntimeError("Cannot swap t1 and t2 if they have different slots")
    for label, t in (("t1", t1), ("t2", t2)):
        count = t._use_count()
        if count > 1 and not (count == 2 and _held_by_own_node(t)):
            raise RuntimeError(
                f"Expected use_count of {label} to be 1 or 2 with an AccumulateGrad node but got "
                f"{count} make sure you are not holding references to the tensor in other places.")
    for t in (t1, t2):
        if t._use_count() == 2:  # a leaf held by its own AccumulateGrad node (checked above)
            _accumulate_grad_node(t).register_prehook(_poisoned)
    torch.utils.swap_tensors(t1, t2)


def _accumulate_grad_node(t: Tensor) -> Any:
    """``t``'s AccumulateGrad node, read with subclasses' ``__torch_function__`` off (through
    it, ``get_gradient_edge`` answers a view node of the subclass's wrapping instead)."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.autograd.graph.get_gradient_edge(t).node


def _poisoned(grad_outputs: Any) -> None:
    """Rule 6's pre-hook on a swapped leaf's AccumulateGrad node."""
    raise RuntimeError(
        "Trying to execute AccumulateGrad node that was poisoned by swap_tensors this can happen "
        "when you try to run backward on a tensor that was swapped. For a module m with "
        "`torch.__future__.set_swap_module_params_on_conversion(True)` you should not change the "
        "device or dtype of the module (e.g. `m.cpu()` or `m.half()`) between running forward "
        "and backward. To resolve this, please only change the device/dtype before running "
        "forward (or after both forward and backward).")


def register_parametrization(module: nn.Module, tensor_name: str, parametrization: nn.Module,
                             *, unsafe: bool = False, overwrite: bool | None = None,
                             swap: bool | None = None) -> nn.Module:
    """``parametrize.register_parametrization(module, tensor_name, parametrization,
    unsafe=unsafe)`` (rule 7); the flags are ignored."""
    if not unsafe and not parametrize.is_parametrized(module, tensor_name):
        _probe_first_parametrization(module, tensor_name, parametrization)
    return parametrize.register_parametrization(module, tensor_name, parametrization,
                                                unsafe=unsafe)


def _probe_first_parametrization(module: nn.Module, tensor_name: str,
                                 parametrization: nn.Module) -> None:
    """Raise what torch's first registration would raise, on a module holding a copy of the
    tensor and with a copy of the parametrization: torch writes ``right_inverse``'s result into
    the tensor before its forward checks, which the real module must not see."""
    tensor = module._parameters.get(tensor_name, module._buffers.get(tensor_name))
    if not isinstance(tensor, Tensor):
        return  # torch's own error (no such tensor) changes nothing
    probe = nn.Module()
    copied = _probe_copy(tensor.detach())
    if tensor_name in module._parameters:
        probe.register_parameter(tensor_name, Parameter(copied, tensor.requires_grad))
    else:
        probe.register_buffer(tensor_name, copied.requires_grad_(tensor.requires_grad))
    parametrize.register_parametrization(probe, tensor_name, copy.deepcopy(parametrization))


def _probe_copy(tensor: Tensor) -> Tensor:
    """A copy of ``tensor`` for the probe: a plain tensor of its dtype, shape and device where it
    is a traceable wrapper subclass (torch's checks read only those, and a wrapper's write goes
    through ``swap_tensors``, which a view-returning ``right_inverse`` makes refuse)."""
    if is_traceable_wrapper_subclass(tensor):
        return torch.zeros(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return tensor.clone()
