"""Reference removal of the old-style (forward-pre-hook) reparametrizations:
``torch.nn.utils.prune.remove``, ``torch.nn.utils.remove_weight_norm`` and
``torch.nn.utils.remove_spectral_norm``.

Rules:

1. ``prune_remove(module, name)`` makes the pruning of ``name`` permanent. ``name`` must be
   pruned (a pruning of ``name`` among the module's forward pre-hooks), else ``ValueError`` with
   torch's message. The value ``mask * orig`` (the mask in ``orig``'s dtype) is written into
   ``<name>_orig``'s object in place: its class, TensorImpl, grad, hooks and instance
   attributes are kept, and a traceable wrapper subclass (``TwoTensor``) gets the value in
   each of its inner tensors. Then ``<name>_orig`` and ``<name>_mask`` leave the slots, the
   pruning leaves the forward pre-hooks, and that object becomes the parameter ``name``.
2. ``remove_weight_norm(module, name)`` makes the weight norm of ``name`` permanent. ``name``
   must be weight-normed (a ``WeightNorm`` of ``name`` among the module's forward pre-hooks),
   else ``ValueError`` with torch's message. ``<name>_g`` and ``<name>_v`` leave the slots, the
   hook leaves the forward pre-hooks, and ``name`` becomes a new parameter holding
   ``g * v / ||v||`` (the norm over every dimension but the hook's ``dim``), detached, of ``v``'s
   class.
3. ``remove_spectral_norm(module, name)`` makes the spectral norm of ``name`` permanent.
   ``name`` must be spectral-normed (a ``SpectralNorm`` of ``name`` among the module's forward
   pre-hooks), else ``ValueError`` with torch's message. ``<name>_orig``, ``<name>_u`` and
   ``<name>_v`` leave the slots; the norm's forward pre-hook, state-dict hook and
   load-state-dict pre-hook leave their tables (every hook the norm registered); and ``name``
   becomes a new parameter holding ``orig / sigma`` with the current ``u`` and ``v`` (no power
   iteration), detached, of ``orig``'s class.
4. Each computes the value before it changes anything: a computation that raises leaves the
   module as it was.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm


def prune_remove(module: nn.Module, name: str, *, overwrite: bool | None = None,
                 swap: bool | None = None) -> nn.Module:
    """``torch.nn.utils.prune.remove(module, name)`` by rules 1 and 4; returns ``module``. The
    flags are ignored."""
    key, hook = _hook_of(module, name, BasePruningMethod, "_tensor_name")
    if hook is None:
        raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before "
                         f"pruning can be removed")
    orig = module._parameters[name + "_orig"]
    value = hook.apply_mask(module)
    with torch.no_grad():
        orig.copy_(value)
    _drop(module, name, key, (name + "_orig", name + "_mask"))
    module.register_parameter(name, orig)
    return module


def remove_weight_norm(module: nn.Module, name: str = "weight", *, overwrite: bool | None = None,
                       swap: bool | None = None) -> nn.Module:
    """``torch.nn.utils.remove_weight_norm(module, name)`` by rules 2 and 4; returns ``module``.
    The flags are ignored."""
    key, hook = _hook_of(module, name, WeightNorm, "name")
    if hook is None:
        raise ValueError(f"weight_norm of '{name}' not found in {module}")
    with torch.no_grad():
        value = hook.compute_weight(module)
    _drop(module, name, key, (name + "_g", name + "_v"))
    module.register_parameter(name, nn.Parameter(value.detach()))
    return module


def remove_spectral_norm(module: nn.Module, name: str = "weight", *,
                         overwrite: bool | None = None, swap: bool | None = None) -> nn.Module:
    """``torch.nn.utils.remove_spectral_norm(module, name)`` by rules 3 and 4; returns
    ``module``. The flags are ignored."""
    key, hook = _hook_of(module, name, SpectralNorm, "name")
    if hook is None:
        raise ValueError(f"spectral_norm of '{name}' not found in {module}")
    with torch.no_grad():
        value = hook.compute_weight(module, do_power_iteration=False)
    for table in ("_state_dict_hooks", "_load_state_dict_pre_hooks"):
        hooks = getattr(module, table)
        for other in [k for k, h in hooks.items() if getattr(_unwrapped(h), "fn", None) is hook]:
            del hooks[other]
    _drop(module, name, key, (name + "_orig", name + "_u", name + "_v"))
    module.register_parameter(name, nn.Parameter(value.detach()))
    return module


def _unwrapped(hook: object) -> object:
    """The hook a module's table holds, out of the ``_WrappedHook`` torch may wrap it in."""
    return getattr(hook, "hook", hook)


def _hook_of(module: nn.Module, name: str, kind: type, attribute: str) -> tuple[int | None, object]:
    """``(handle id, hook)`` of the forward pre-hook of class ``kind`` reparametrizing ``name``
    (``hook.<attribute> == name``); ``(None, None)`` where there is none."""
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, kind) and getattr(hook, attribute) == name:
            return key, hook
    return None, None


def _drop(module: nn.Module, name: str, key: int, slots: tuple[str, ...]) -> None:
    """Remove the hook ``key``, the attribute ``name`` its forwards left, and the kept ``slots``."""
    del module._forward_pre_hooks[key]
    module.__dict__.pop(name, None)
    for slot in slots:
        module._parameters.pop(slot, None)
        module._buffers.pop(slot, None)
        module._non_persistent_buffers_set.discard(slot)


