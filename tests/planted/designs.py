"""Targets that follow one design of ``properties.harness.targets.DESIGNS`` each, for
``tests/test_designs.py``: each comes declared with its design (``switched``) and without it
(``unswitched``), which the properties must fail. All wrap the reference's functional call.

- ``registered``: a name that is not a registered parameter or buffer raises ``KeyError``;
- ``no_write_back``: forward's rebinds go into a copy of the caller's dict;
- ``unchecked``: a value that is not a tensor (or None) is dropped without a word.
"""

from __future__ import annotations

from types import SimpleNamespace

from torch import Tensor

from swapspec import reference
from swapspec.properties.models.oracle import registered as is_registered


def registered_call(module, tensors, args=(), kwargs=None, *, tie_weights=True, strict=False):
    for name in tensors if isinstance(tensors, dict) else ():
        if not is_registered(module, name):
            raise KeyError(f"{name!r} is not a registered parameter or buffer")
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights,
                                     strict=strict)


def no_write_back_call(module, tensors, args=(), kwargs=None, *, tie_weights=True,
                       strict=False):
    copied = dict(tensors) if isinstance(tensors, dict) else tensors
    return reference.functional_call(module, copied, args, kwargs, tie_weights=tie_weights,
                                     strict=strict)


def unchecked_call(module, tensors, args=(), kwargs=None, *, tie_weights=True, strict=False):
    if isinstance(tensors, dict):
        tensors = {k: v for k, v in tensors.items() if v is None or isinstance(v, Tensor)}
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights,
                                     strict=strict)


def _pair(name: str, call, design: str) -> tuple[SimpleNamespace, SimpleNamespace]:
    common = {"functional_call": call, "call_forms": ("dict",)}
    return (SimpleNamespace(name=name, designs={design}, **common),
            SimpleNamespace(name=f"{name}-unswitched", **common))


registered, registered_unswitched = _pair("registered", registered_call,
                                          "registered-names-only")
no_write_back, no_write_back_unswitched = _pair("no-write-back", no_write_back_call,
                                                "no-write-back")
unchecked, unchecked_unswitched = _pair("unchecked", unchecked_call, "no-input-checks")
