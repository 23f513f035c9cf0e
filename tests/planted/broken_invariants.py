"""Targets that wrap ``reference`` with one planted break of an invariant each
(``swapspec.properties.models.invariants``), for ``tests/test_invariants.py``.

- ``raise_after_change``: ``apply`` adds 1 to the first parameter in place, then raises.
  Breaks ``INV-RAISE-UNCHANGED``.
- ``buffer_to_parameter``: ``apply`` converts like the reference, then re-registers every
  buffer as a parameter. Breaks ``INV-KINDS``.
- ``global_cache``: ``apply`` converts like the reference, then applies ``fn`` to every other
  live module of the same class, as if it kept a global cache of them. Breaks
  ``INV-INDEPENDENT``.
- ``strict_misses_key``: ``functional_call`` with ``strict`` reports only the first unexpected
  key. Breaks ``INV-STRICT-EXACT``.
- ``grad_hook_left``: ``apply`` converts like the reference, then leaves a hook on every
  parameter that zeroes its grad, so backward no longer gives a fresh build's grads. Breaks
  ``INV-WORKING``.
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import torch
from torch import nn

from swapspec import reference


def raising_apply(module, fn, *, overwrite, swap, recurse=True):
    for p in module.parameters():
        with torch.no_grad():
            p.data.add_(1)
        break
    raise RuntimeError("planted: apply failed after changing a tensor")


def buffer_to_parameter_apply(module, fn, *, overwrite, swap, recurse=True):
    reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)
    for m in module.modules():
        for key in list(m._buffers):
            value = m._buffers.pop(key)
            m._non_persistent_buffers_set.discard(key)
            m._parameters[key] = None if value is None else nn.Parameter(value, requires_grad=False)
    return module


def global_cache_apply(module, fn, *, overwrite, swap, recurse=True):
    reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)
    mine = {id(m) for m in module.modules()}
    for other in gc.get_objects():
        if type(other) is type(module) and id(other) not in mine:
            with torch.no_grad():
                for p in other.parameters():
                    p.add_(1)
    return module


def strict_missing_functional_call(module, tensors, args=None, kwargs=None, *,
                                   tie_weights=True, strict=False):
    valid = {n for n, _ in module.named_parameters(remove_duplicate=False)} | {
        n for n, _ in module.named_buffers(remove_duplicate=False)}
    given = [k for d in (tensors if isinstance(tensors, tuple) else (tensors,)) for k in d]
    extra = sorted(k for k in given if k not in valid)
    if strict and extra:
        raise RuntimeError(f"Unexpected key(s): {extra[0]!r}.")  # planted: the first one only
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights)


def grad_hook_apply(module, fn, *, overwrite, swap, recurse=True):
    reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)
    for p in module.parameters():
        if p.requires_grad:
            p.register_hook(torch.zeros_like)
    return module


raise_after_change = SimpleNamespace(name="broken-raise-after-change", apply=raising_apply,
                                     functional_call=reference.functional_call)
buffer_to_parameter = SimpleNamespace(name="broken-buffer-to-parameter",
                                      apply=buffer_to_parameter_apply,
                                      functional_call=reference.functional_call)
global_cache = SimpleNamespace(name="broken-global-cache", apply=global_cache_apply,
                               functional_call=reference.functional_call)
strict_misses_key = SimpleNamespace(name="broken-strict-misses-key", apply=reference.apply,
                                    functional_call=strict_missing_functional_call)
grad_hook_left = SimpleNamespace(name="broken-grad-hook-left", apply=grad_hook_apply,
                                 functional_call=reference.functional_call)
