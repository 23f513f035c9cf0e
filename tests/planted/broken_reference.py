"""Targets that wrap ``reference`` with one planted bug each, for ``tests/test_plugin.py``.

Select one with ``--swapspec-target=tests.planted.broken_reference:<attribute>``.

- ``tie_split``: ``apply`` converts like the reference, then splits every parameter that
  sits in two distinct (module, key) slots (fact ``tied-parameter``): the later slots
  get a new object. Breaks APPLY-TIES (clause ``parameter-tie-split``).
- ``tie_split_declared``: the same bug, declared exactly as a deviation.
- ``no_restore``: ``functional_call`` copies the reference's but does not put the
  original parameters back after the call. Breaks FC-RESTORE (``not-restored``).
- ``overlap_accepted``: ``functional_call`` merges a tuple of dicts, accepting a name given
  twice. Breaks FC-INPUT-FORMS (``overlap-accepted``).
- ``reordered``: ``functional_call`` leaves the root's ``_parameters`` in reverse order.
  Breaks FC-RESTORE (``not-restored``).
- ``torch_named``: ``tie_split`` named ``torchmylib``.
- ``stale``: the reference itself, declaring a deviation it does not have.
- ``not_a_target``: an object with a name but neither ``apply`` nor ``functional_call``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from swapspec import reference
from swapspec.properties.vocabulary import Deviation
from swapspec.reference.functional_call import _restore, _swap_in, _write_back, prepare_call


def _split_copy(param: torch.Tensor) -> nn.Parameter:
    try:
        return nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
    except Exception:  # uninitialized or exotic parameters: any other object splits the tie
        return nn.Parameter(torch.empty(0), requires_grad=False)


def tie_splitting_apply(module, fn, *, overwrite, swap, recurse=True):
    """The reference's apply, then every tied parameter's later slots get a new object."""
    reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)
    seen: dict[int, tuple[int, str]] = {}
    for m in {id(m): m for m in module.modules()}.values():
        for key, p in list(m._parameters.items()):
            if p is None:
                continue
            first = seen.setdefault(id(p), (id(m), key))
            if first != (id(m), key):
                m._parameters[key] = _split_copy(p)
    return module


def parameter_keeping_functional_call(module, tensors, args=None, kwargs=None, *,
                                      tie_weights=True, strict=False):
    """The reference's functional_call, but given parameters stay in the module afterwards."""
    call = prepare_call(module, tensors, args, kwargs, tie_weights=tie_weights, strict=strict)
    originals = _swap_in(call.slots)
    try:
        return module(*call.args, **call.kwargs)
    finally:
        # planted bug: parameter slots are not put back
        restored = [(s, o) for s, o in zip(call.slots, originals, strict=True)
                    if s.kind != "_parameters"]
        rebound = _restore([s for s, _ in restored], [o for _, o in restored])
        _write_back(rebound, call.slots, call.given, call.sources)


TIE_SPLIT = Deviation(
    "APPLY-TIES", lambda example: example.has("tied-parameter"), "parameter-tie-split",
    "planted: tie_splitting_apply gives each later slot of a tied parameter a new object",
    id="planted.apply.tie-split",
)

tie_split = SimpleNamespace(name="broken-tie-split", apply=tie_splitting_apply,
                            functional_call=reference.functional_call)

tie_split_declared = SimpleNamespace(name="declared-tie-split", apply=tie_splitting_apply,
                                     functional_call=reference.functional_call,
                                     deviations=[TIE_SPLIT])

no_restore = SimpleNamespace(name="broken-no-restore", apply=reference.apply,
                             functional_call=parameter_keeping_functional_call)

stale = SimpleNamespace(
    name="stale-declaration", apply=reference.apply, functional_call=reference.functional_call,
    deviations=[Deviation("APPLY-TIES", lambda example: True, "parameter-tie-split",
                          "planted: the reference never splits ties, so this is stale",
                          id="planted.apply.stale")],
)

not_a_target = SimpleNamespace(name="half-a-target")


def overlap_merging_functional_call(module, tensors, args=None, kwargs=None, *,
                                    tie_weights=True, strict=False):
    """The reference's functional_call on a tuple of dicts merged (the later dict wins), so a
    name given twice is accepted."""
    if isinstance(tensors, tuple | list):
        tensors = {k: v for d in tensors for k, v in d.items()}
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights,
                                     strict=strict)


def reordering_functional_call(module, tensors, args=None, kwargs=None, *, tie_weights=True,
                               strict=False):
    """The reference's functional_call, then the root's ``_parameters`` in reverse order."""
    try:
        return reference.functional_call(module, tensors, args, kwargs, tie_weights=tie_weights,
                                         strict=strict)
    finally:
        for key in reversed(list(module._parameters)):
            module._parameters[key] = module._parameters.pop(key)


def detaching_functional_call(module, tensors, args=None, kwargs=None, *, tie_weights=True,
                              strict=False):
    """The reference's functional_call with every given tensor detached: no grad reaches them."""
    detached = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
    return reference.functional_call(module, detached, args, kwargs, tie_weights=tie_weights,
                                     strict=strict)


detaching = SimpleNamespace(name="broken-detaching", apply=reference.apply,
                            functional_call=detaching_functional_call, call_forms=("dict",))

overlap_accepted = SimpleNamespace(name="broken-overlap-accepted", apply=reference.apply,
                                   functional_call=overlap_merging_functional_call)

reordered = SimpleNamespace(name="broken-reordered", apply=reference.apply,
                            functional_call=reordering_functional_call)

# A third-party target whose name starts with "torch": its repros still call its own code.
torch_named = SimpleNamespace(name="torchmylib", apply=tie_splitting_apply,
                              functional_call=reference.functional_call)
