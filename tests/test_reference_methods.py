"""The reference's public methods (``reference.methods``) against torch's own, on plain modules:
every argument form the suite draws (``strategies.method_calls``), the grad methods, the bad
forms (torch's error type, the module left as it was), the flags and the builder for a host's
``apply``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from swapspec import reference
from swapspec.reference.methods import METHODS, Methods
from swapspec.strategies.method_calls import BAD_CALLS, GRAD_CALLS, METHOD_CONVERSIONS


def plain_modules() -> dict[str, nn.Module]:
    """Fresh plain modules: 2-d and 4-d parameters, an int64 buffer, no tensor at all."""
    torch.manual_seed(0)
    return {
        "linear": nn.Linear(3, 2),
        "conv2d+batchnorm": nn.Sequential(nn.Conv2d(2, 2, 2), nn.BatchNorm1d(2)),
        "embedding": nn.Embedding(4, 3),
        "relu": nn.ReLU(),
    }


MODULE_NAMES = list(plain_modules())


def _state(module: nn.Module, values: bool = True) -> dict[str, tuple]:
    """Per slot: class, dtype, device, layout, channels-last-ness, values (where real and
    asked for: ``to_empty`` leaves them unset)."""
    out = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        cl = t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) \
            and not t.is_contiguous()
        shown = t.detach().tolist() if values and not t.is_meta else None
        out[name] = (type(t).__name__, t.dtype, t.device, t.layout, cl, t.requires_grad, shown)
    return out


def _objects(module: nn.Module) -> dict[str, object]:
    return {n: t for n, t in [*module.named_parameters(), *module.named_buffers()]}


def _run(who: str, module: nn.Module, method: str, args: tuple, kwargs: dict, **flags):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if who == "torch":
            return getattr(module, method)(*args, **kwargs)
        return getattr(reference, method)(module, *args, **flags, **kwargs)


@pytest.mark.parametrize("conversion", METHOD_CONVERSIONS, ids=lambda c: c.name)
@pytest.mark.parametrize("which", MODULE_NAMES)
def test_conversion_forms_match_torch(conversion, which):
    """Each conversion form leaves the module as torch's method does, keeps the parameter
    objects (default flags: set_data, or share_memory_ in place), returns the module, and is
    what its implied per-tensor function gives (a move to meta changes the TensorImpl type:
    new objects)."""
    call = conversion.call
    results = {}
    for who in ("torch", "reference"):
        module = plain_modules()[which]
        before = _objects(module)
        args, kwargs = call.args()
        assert _run(who, module, call.method, args, kwargs) is module
        params = dict(module.named_parameters())
        kept = all(params[n] is before[n] for n in params)
        assert kept or conversion.changes_impl, f"{who}: a parameter object changed"
        results[who] = _state(module, conversion.preserves_values)
    assert results["reference"] == results["torch"]
    module, fn = plain_modules()[which], conversion.make_fn()
    with torch.no_grad():
        implied = {n: fn(t) for n, t in _objects(module).items()}
    for name, t in implied.items():
        got = results["reference"][name]
        assert (t.dtype, t.device, t.layout) == got[1:4], name


@pytest.mark.parametrize("swap", [False, True])
def test_flags_reach_apply(swap):
    """``overwrite``/``swap`` go to ``apply``: the swap flag keeps the object, with a new
    TensorImpl; the overwrite flag puts a new object in the slot."""
    module = nn.Linear(2, 2)
    weight, cdata = module.weight, module.weight._cdata
    reference.double(module, overwrite=not swap, swap=swap)
    assert (module.weight is weight) is swap
    assert module.weight._cdata != cdata and module.weight.dtype == torch.float64


@pytest.mark.parametrize("call", GRAD_CALLS, ids=lambda c: c.name)
@pytest.mark.parametrize("which", MODULE_NAMES)
def test_grad_methods_match_torch(call, which):
    """``requires_grad_`` and ``zero_grad``: the parameters' ``requires_grad``, the grads
    (object kept, zeroed and detached; or None) and the return value, as torch's."""
    results = {}
    for who in ("torch", "reference"):
        module = plain_modules()[which]
        module.requires_grad_(False) if which == "embedding" else None
        for p in module.parameters():
            p.grad = torch.ones_like(p)
        grads = {n: p.grad for n, p in module.named_parameters()}
        args, kwargs = call.args()
        out = _run(who, module, call.method, args, kwargs)
        assert out is (module if call.method == "requires_grad_" else None)
        results[who] = (_state(module), {
            n: None if p.grad is None else (p.grad is grads[n], p.grad.requires_grad,
                                            p.grad.tolist())
            for n, p in module.named_parameters()})
    assert results["reference"] == results["torch"]


@pytest.mark.parametrize("call", BAD_CALLS, ids=lambda c: c.name)
@pytest.mark.parametrize("which", MODULE_NAMES)
def test_bad_forms_raise_and_leave_the_module(call, which):
    """A bad form raises torch's error type (and its sentence, where kept) and leaves every
    slot, value and dtype as it was. The reference checks the arguments first, so it raises
    on a module without tensors too, where torch's ``requires_grad_``, ``type`` and
    ``to_empty`` run nothing and raise nothing (declared: ``unchecked-bad-argument``)."""
    for who in ("torch", "reference"):
        module = plain_modules()[which]
        before, state = _objects(module), _state(module)
        args, kwargs = call.args()
        unchecked = who == "torch" and call.method in ("requires_grad_", "type", "to_empty") \
            and call.message and not before
        if unchecked:
            _run(who, module, call.method, args, kwargs)
            continue
        with pytest.raises(call.error) as raised:
            _run(who, module, call.method, args, kwargs)
        assert str(raised.value).startswith(call.message)
        assert _objects(module) == before and _state(module) == state


def test_a_host_apply_builds_every_method():
    """``Methods(apply)`` calls the given ``apply`` for every conversion method, with the flags
    it is given, and its result is the reference's."""
    seen = []

    def host_apply(module, fn, *, overwrite, swap, recurse=True):
        seen.append((overwrite, swap, recurse))
        return reference.apply(module, fn, overwrite=overwrite, swap=swap, recurse=recurse)

    host = Methods(host_apply)
    module = nn.Linear(2, 2)
    assert host.half(module, overwrite=True, swap=False) is module
    host.to_empty(module, device="meta", recurse=False, overwrite=False, swap=True)
    assert seen == [(True, False, True), (False, True, False)]
    assert module.weight.is_meta and module.weight.dtype == torch.float16
    assert set(METHODS) <= set(dir(host))


def test_requires_grad_freezes_a_lazy_module_before_its_first_forward():
    """The reference sets ``requires_grad`` on an uninitialized parameter too, and it holds
    after the first forward materializes it; torch's ``requires_grad_`` raises ``ValueError``
    there after changing the parameters before it (declared: ``requires_grad_on_uninitialized``)."""
    module = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2))
    assert reference.requires_grad_(module, False) is module
    module(torch.ones(1, 2))
    assert not any(p.requires_grad for p in module.parameters())
    theirs = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2))
    with pytest.raises(ValueError, match="uninitialized parameter"):
        theirs.requires_grad_(False)
    assert not theirs[0].weight.requires_grad and theirs[1].weight.requires_grad


def test_requires_grad_refuses_an_integral_parameter_first():
    """``requires_grad_(True)`` with an integral parameter raises ``RuntimeError`` before any
    parameter changes (torch raises at that parameter, after changing the ones before it)."""
    module = nn.Module()
    module.a = nn.Parameter(torch.ones(1), requires_grad=False)
    module.b = nn.Parameter(torch.ones(1, dtype=torch.int64), requires_grad=False)
    with pytest.raises(RuntimeError, match="only Tensors of floating point dtype can require gradients"):
        reference.requires_grad_(module, True)
    assert not module.a.requires_grad


def _message(call) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def test_requires_grad_errors_are_torchs_own_words() -> None:
    """Rule: ``requires_grad_``'s two refusals carry the type and message of torch's own
    ``Module.requires_grad_`` on the same module (a non-bool argument; ``True`` with an
    integral parameter)."""
    def integral() -> nn.Module:
        m = nn.Linear(2, 2)
        m.weight = nn.Parameter(torch.zeros(2, 2, dtype=torch.int64), requires_grad=False)
        return m

    assert _message(lambda: reference.requires_grad_(nn.Linear(2, 2), "yes")) == _message(
        lambda: nn.Linear(2, 2).requires_grad_("yes"))
    assert _message(lambda: reference.requires_grad_(integral(), True)) == _message(
        lambda: integral().requires_grad_(True))


@pytest.mark.parametrize("order", ["lazy-first", "linear-first"])
def test_type_refuses_a_bad_dtype_first_whatever_tensor_comes_first(order):
    """The reference's ``type`` checks its argument before any tensor: ``TypeError`` on a lazy
    module too. torch's checks it in the fn only, so when the first tensor ``_apply`` reaches
    is an uninitialized parameter, that tensor's ``ValueError`` comes first (declared:
    ``torch.methods.type-checked-by-uninitialized``)."""
    leaves = [nn.LazyLinear(2), nn.Linear(2, 2)]
    module = nn.Sequential(*(leaves if order == "lazy-first" else leaves[::-1]))
    with pytest.raises(TypeError, match="dtype must be"):
        reference.type(module, 1)
    theirs = nn.Sequential(*([nn.LazyLinear(2), nn.Linear(2, 2)] if order == "lazy-first"
                             else [nn.Linear(2, 2), nn.LazyLinear(2)]))
    expected = ValueError if order == "lazy-first" else TypeError
    with pytest.raises(expected):
        theirs.type(1)


def test_the_type_declaration_applies_where_the_first_tensor_is_uninitialized():
    """``type_checked_by_uninitialized`` reads ``_apply``'s order: children first, depth first."""
    from swapspec.properties.declarations.torch_apply import type_checked_by_uninitialized
    from swapspec.properties.models.examples import Example

    bad_type = next(c for c in BAD_CALLS if c.method == "type")
    lazy_first = nn.Sequential(nn.Sequential(nn.LazyLinear(2)), nn.Linear(2, 2))
    linear_first = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2))
    assert type_checked_by_uninitialized(Example(lazy_first, method=bad_type))
    assert not type_checked_by_uninitialized(Example(linear_first, method=bad_type))
    good = next(c.call for c in METHOD_CONVERSIONS if c.call.method == "double")
    assert not type_checked_by_uninitialized(Example(lazy_first, method=good))


@pytest.mark.parametrize("device", [None, "meta"])
@pytest.mark.parametrize(("make", "memory_format"), [
    (lambda: nn.Conv2d(2, 2, 2), torch.channels_last),
    (lambda: nn.Conv3d(2, 2, 2), torch.channels_last_3d)], ids=["4-d", "5-d"])
def test_memory_format_reaches_4d_and_5d_tensors_as_torchs(make, memory_format, device):
    """``to(device, memory_format=...)`` lays out the 4-d (5-d) weight in the format and moves
    every tensor to the device, as torch's does; the 1-d bias keeps its layout."""
    results = {}
    for who in ("torch", "reference"):
        torch.manual_seed(0)
        module = make()
        args = () if device is None else (device,)
        _run(who, module, "to", args, {"memory_format": memory_format})
        results[who] = {n: (t.device, t.stride()) for n, t in module.named_parameters()}
        assert module.weight.is_contiguous(memory_format=memory_format), who
        assert not module.weight.is_contiguous(), who
        assert module.weight.device == torch.device(device or "cpu"), who
    assert results["reference"] == results["torch"]


def test_a_complex_to_warns_torchs_warning_once():
    """``to`` a complex dtype warns once, torch's ``UserWarning`` in torch's words."""
    seen = []
    for who in ("torch", "reference"):
        module = nn.Linear(2, 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module.to(torch.complex64) if who == "torch" else reference.to(module, torch.complex64)
        seen.append([(w.category, str(w.message)) for w in caught])
    assert seen[1] == seen[0] and len(seen[0]) == 1 and seen[0][0][0] is UserWarning
