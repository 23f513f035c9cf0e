"""The reference's registration (``reference.registration``) against torch's own, form by form
on fixed modules: every good form the suite draws ends in the same registration state as
torch's, every bad form raises torch's error and message and leaves the module as it was, the
global hooks fire alike, and ``swap_tensors`` refuses each bad pair by its cause."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

from swapspec import reference
from swapspec.properties.harness.targets import BUILTIN_FORMS
from swapspec.strategies.registrations import (
    BUFFER_OVERRIDES,
    SWAP_DEFECTS,
    RegistrationCall,
    SwapPair,
    SwapSide,
    bad_forms,
    good_forms,
    owners,
)

# where torch breaks the REGISTER-REFUSED rule (declared in declarations.torch_registration)
TORCH_ACCEPTS = {("setattr", "name-dotted"), ("setattr", "name-empty"), ("setattr", "name-taken")}


def build() -> nn.Module:
    """A root with a parameter, a persistent and a non-persistent buffer, and two children."""
    torch.manual_seed(0)
    root = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    root.register_parameter("p", nn.Parameter(torch.ones(2)))
    root.register_buffer("b", torch.zeros(2), persistent=False)
    root.tag = 7
    return root


def _forms(make) -> list[RegistrationCall]:
    """Every form ``make`` gives on each owner of ``build()``, with each ``register_buffer``
    override for the ``setattr`` and ``delattr`` forms."""
    module = build()
    forms = [f for path in owners(module) for f in make(module.get_submodule(path), path)]
    return forms + [f for override in BUFFER_OVERRIDES if override
                    for path in owners(module)
                    for f in make(module.get_submodule(path), path, override) if f.override]


def _shape(module: nn.Module) -> dict[str, Any]:
    """Per module: ``__dict__`` keys, each registry's (name, class) pairs, the non-persistent set."""
    return {path: (sorted(m.__dict__),
                   *([(k, type(v).__name__) for k, v in getattr(m, r).items()]
                     for r in ("_parameters", "_buffers", "_modules")),
                   sorted(m._non_persistent_buffers_set))
            for path, m in module.named_modules(remove_duplicate=False)}


def _owner(call: RegistrationCall, module: nn.Module) -> nn.Module:
    return eval(call.owner_code, {"torch": torch, "module": module})


def _built(call: RegistrationCall) -> nn.Module:
    """``build()``, the call's owner given its ``register_buffer`` override."""
    module = build()
    exec("\n".join(call.setup), {"torch": torch, "owner": _owner(call, module)})
    return module


def _run(who: str, call: RegistrationCall, module: nn.Module, args: tuple, kwargs: dict) -> Any:
    owner = _owner(call, module)
    if who == "torch":
        if call.method in BUILTIN_FORMS:
            return BUILTIN_FORMS[call.method](owner, *args, **kwargs)
        return getattr(owner, call.method)(*args, **kwargs)
    method = getattr(reference.Methods(reference.apply), call.method)
    return method(owner, *args, overwrite=None, swap=None, **kwargs)


def _outcome(who: str, call: RegistrationCall, module: nn.Module) -> BaseException | None:
    args, kwargs = call.args()
    try:
        _run(who, call, module, args, kwargs)
    except Exception as e:
        return e
    return None


@pytest.mark.parametrize("call", _forms(good_forms), ids=lambda c: c.label)
def test_good_forms_end_as_torchs(call):
    """A good form leaves the module in torch's registration state, the given object in it."""
    ours, theirs = _built(call), _built(call)
    args, kwargs = call.args()
    _run("reference", call, ours, args, kwargs)
    _run("torch", call, theirs, args, kwargs)
    assert _shape(ours) == _shape(theirs)
    if call.ends in ("parameter", "buffer", "module"):
        table = {"parameter": "_parameters", "buffer": "_buffers", "module": "_modules"}[call.ends]
        assert getattr(_owner(call, ours), table)[call.name] is args[1]


@pytest.mark.parametrize("call", _forms(bad_forms), ids=lambda c: c.label)
def test_bad_forms_raise_torchs_error_and_change_nothing(call):
    """A bad form raises the drawn error type, naming the cause, with torch's message (where
    torch refuses it), and leaves the module's registration state as it was."""
    module = _built(call)
    before = _shape(module)
    error = _outcome("reference", call, module)
    assert isinstance(error, call.error), (call.defect, error)
    assert call.mention in str(error)
    assert _shape(module) == before
    theirs = _outcome("torch", call, _built(call))
    if (call.method, call.defect) in TORCH_ACCEPTS and call.value == "torch.nn.Linear(2, 2)":
        assert theirs is None  # the declared deviation: torch registers the child
    else:
        assert type(theirs) is type(error) and str(theirs) == str(error)


def test_refused_non_leaf_parameter_keeps_the_buffer():
    """Where torch drops a buffer before refusing a non-leaf Parameter (declared), the
    reference refuses first and keeps it."""
    p = nn.Parameter(torch.zeros(2), requires_grad=False).add_(torch.zeros(2, requires_grad=True))
    ours = build()
    with pytest.raises(ValueError, match="non-leaf"):
        reference.registration.setattr(ours, "b", p)
    assert "b" in ours._buffers and "b" in ours._non_persistent_buffers_set
    theirs = build()
    with pytest.raises(ValueError, match="non-leaf"):
        theirs.b = p
    assert "b" not in theirs._buffers


@pytest.mark.parametrize("call", [c for c in _forms(good_forms) if c.method != "delattr"],
                         ids=lambda c: c.label)
def test_global_hooks_fire_as_torchs(call):
    """The global registration hooks see the same (kind, name, value class) calls on the
    reference as on torch, and their handles leave no hook behind."""
    seen: dict[str, list] = {"reference": [], "torch": []}
    for who in seen:
        handles = [getattr(torch_module, f"register_module_{kind}_registration_hook")(
            lambda m, n, v, kind=kind, who=who: seen[who].append((kind, n, type(v).__name__)))
            for kind in ("parameter", "buffer", "module")]
        try:
            args, kwargs = call.args()
            _run(who, call, _built(call), args, kwargs)
        finally:
            for handle in handles:
                handle.remove()
    assert seen["reference"] == seen["torch"]
    assert not torch_module._global_parameter_registration_hooks


def test_a_hooks_return_replaces_the_value():
    """A global hook's non-None return is what the reference registers."""
    other = nn.Parameter(torch.ones(3))
    handle = torch_module.register_module_parameter_registration_hook(lambda m, n, v: other)
    try:
        module = nn.Module()
        reference.register_parameter(module, "w", nn.Parameter(torch.zeros(2)))
    finally:
        handle.remove()
    assert module.w is other


def _pair(defect: str, requires_grad: bool) -> dict[str, Any]:
    class Slotted(torch.Tensor):
        __slots__ = ("tag",)

    namespace = {"torch": torch, "weakref": weakref, "Slotted": Slotted}
    exec(SwapPair(defect, (2,), False, requires_grad).setup(), namespace)
    return namespace


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("defect", SWAP_DEFECTS)
def test_swap_tensors_refuses_by_cause(defect, requires_grad):
    """The reference's ``swap_tensors`` refuses each bad pair with a RuntimeError that names
    the cause and swaps nothing; torch's refuses too (with an unclear message for a view of a
    tensor without grad, declared)."""
    pair = SwapPair(defect, (2,), False, requires_grad)
    made = _pair(defect, requires_grad)
    t1, t2 = made["t1"], made["t2"]
    cdata = (t1._cdata, t2._cdata)
    with pytest.raises(RuntimeError, match=pair.mention):
        reference.swap_tensors(t1, t2)
    assert (t1._cdata, t2._cdata) == cdata and not t1.any() and t2.all()
    theirs = _pair(defect, requires_grad)
    with pytest.raises(RuntimeError) as raised:
        torch.utils.swap_tensors(theirs["t1"], theirs["t2"])
    unclear = defect == "view" and not requires_grad  # torch.register.swap-view-unclear-message
    assert (pair.mention in str(raised.value)) != unclear
    ours = _pair(defect, requires_grad)
    with pytest.raises(RuntimeError) as refused:
        reference.swap_tensors(ours["t1"], ours["t2"])
    assert unclear or str(refused.value) == str(raised.value)  # torch's message, word for word


def test_swap_tensors_swaps_a_good_pair():
    """Without a defect the reference's ``swap_tensors`` swaps, as torch's does."""
    t1, t2 = torch.zeros(2), torch.ones(2)
    reference.swap_tensors(t1, t2)
    assert t1.all() and not t2.any()


def test_legacy_override_registers_a_persistent_buffer_without_the_argument():
    """On an owner whose ``register_buffer`` takes no ``persistent``, ``setattr`` of a persistent
    buffer calls it without the argument, and a non-persistent one is refused before anything
    changes (torch's ``__setattr__`` alike)."""
    seen = []

    class Legacy(nn.Module):
        def register_buffer(self, name, tensor):
            seen.append(name)
            nn.Module.register_buffer(self, name, tensor)

    module = Legacy()
    reference.registration.setattr(module, "b", nn.Buffer(torch.zeros(2)))
    assert seen == ["b"] and "b" in module._buffers
    with pytest.raises(RuntimeError, match="persistent"):
        reference.registration.setattr(module, "c", nn.Buffer(torch.zeros(2), persistent=False))
    assert seen == ["b"] and "c" not in module._buffers and "c" not in module.__dict__


def _graphed(kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(t1, t2, y)``: a pair of ``kind`` (``SwapSide`` classes) and a sum built on ``t1``."""
    class Slotted(torch.Tensor):
        __slots__ = ("tag",)

    namespace = {"torch": torch, "Slotted": Slotted}
    side = SwapSide(kind, (2,), "float32", True, False, False, True)
    other = SwapSide(kind, (2,), "float32", False, False, False, False)
    exec("\n".join([*side.setup("t1", 0), *other.setup("t2", 1)]), namespace)
    return namespace["t1"], namespace["t2"], namespace["y_t1"]


@pytest.mark.parametrize("kind", ["tensor", "parameter", "slotted"])
def test_swap_tensors_poisons_the_graph_of_every_class(kind):
    """A backward through a graph built on a swapped leaf raises on the reference for every
    tensor class, and writes no grad; torch's misses a subclass's node (declared)."""
    t1, t2, y = _graphed(kind)
    reference.swap_tensors(t1, t2)
    with pytest.raises(RuntimeError, match="poisoned") as ours:
        y.backward()
    assert t1.grad is None and t2.grad is None
    t1, t2, y = _graphed(kind)
    torch.utils.swap_tensors(t1, t2)
    if kind == "slotted":
        y.backward()  # torch.register.swap-subclass-graph-not-poisoned
        assert t2.grad is not None
    else:
        with pytest.raises(RuntimeError, match="poisoned") as theirs:
            y.backward()
        assert str(ours.value) == str(theirs.value)  # torch's message, word for word


class _Twice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


class _NegFlat(nn.Module):
    """Refused (it changes the shape) after torch wrote ``right_inverse``'s result."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten()

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        return -x.flatten()


def test_register_parametrization_registers_and_stacks_as_torchs():
    """A first and a stacked registration give torch's parametrized module and value."""
    ours = nn.Linear(3, 2)
    theirs = nn.Linear(3, 2)
    theirs.load_state_dict(ours.state_dict())
    for _ in range(2):
        got = reference.registration.register_parametrization(ours, "weight", _Twice())
        want = torch.nn.utils.parametrize.register_parametrization(theirs, "weight", _Twice())
        assert got is ours and type(want) is type(theirs)
        assert torch.equal(ours.weight, theirs.weight)
    assert len(ours.parametrizations.weight) == 2


def _one_slot_module(slot: str, tensor: torch.Tensor, requires_grad: bool) -> nn.Module:
    """A module holding a copy of ``tensor`` as ``t``, a parameter or a buffer."""
    module = nn.Module()
    if slot == "parameter":
        module.register_parameter("t", nn.Parameter(tensor.clone(), requires_grad))
    else:
        module.register_buffer("t", tensor.clone().requires_grad_(requires_grad))
    return module


def _refusal(register: Any, module: nn.Module, parametrization: nn.Module) -> str | None:
    """``register(module, "t", parametrization)``: ``None``, or the ``ValueError``'s message."""
    try:
        register(module, "t", parametrization)
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("slot", ["parameter", "buffer"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_refused_first_parametrization_changes_nothing(slot, requires_grad):
    """A first registration torch refuses raises torch's ValueError on the reference and leaves
    the tensor's object, values, shape and ``requires_grad`` as they were (torch writes
    ``right_inverse``'s result first: torch.parametrize.refused-first-writes)."""
    tensor = torch.arange(6.0).reshape(2, 3)
    module = _one_slot_module(slot, tensor, requires_grad)
    held = module.t
    with pytest.raises(ValueError, match="shape") as ours:
        reference.registration.register_parametrization(module, "t", _NegFlat())
    assert module.t is held and torch.equal(held.detach(), tensor)
    assert held.shape == (2, 3) and held.requires_grad == requires_grad
    assert not torch.nn.utils.parametrize.is_parametrized(module)
    theirs = nn.Module()
    theirs.register_buffer("t", tensor.clone())
    with pytest.raises(ValueError) as raised:
        torch.nn.utils.parametrize.register_parametrization(theirs, "t", _NegFlat())
    assert str(ours.value) == str(raised.value)


@pytest.mark.parametrize("persistent", [False, True])
def test_register_buffer_on_a_script_module_raises_torchs_error(persistent):
    """On a ``ScriptModule`` the reference's ``register_buffer`` refuses a non-persistent buffer
    before anything else, and a persistent one where the module refuses it, as torch's does."""
    errors = []
    for register in (nn.Module.register_buffer, reference.register_buffer):
        scripted = torch.jit.script(nn.Linear(2, 2))
        with pytest.raises(RuntimeError) as raised:
            register(scripted, "b", torch.zeros(1), persistent=persistent)
        errors.append(str(raised.value))
        assert "b" not in scripted._buffers
    assert errors[1] == errors[0]
    assert ("non-persistent" in errors[1]) == (not persistent)


class _TensorLike:
    """Not a tensor, but takes part in torch functions: torch takes it as a buffer."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return NotImplemented


@pytest.mark.parametrize("how", ["register_buffer", "setattr"])
def test_a_tensor_like_object_is_taken_as_a_buffer(how):
    """An object with ``__torch_function__`` is a buffer value for the reference, as for torch."""
    for who in ("torch", "reference"):
        module = nn.Module()
        module.register_buffer("b", torch.zeros(1))
        value = _TensorLike()
        if how == "register_buffer":
            if who == "torch":
                module.register_buffer("c", value)
            else:
                reference.register_buffer(module, "c", value)
            assert module._buffers["c"] is value, who
        else:
            if who == "torch":
                module.b = value
            else:
                reference.registration.setattr(module, "b", value)
            assert module._buffers["b"] is value, who


@pytest.mark.parametrize(("registry", "make"), [
    ("_parameters", lambda: nn.Parameter(torch.ones(2))), ("_modules", lambda: nn.ReLU())])
def test_setattr_of_a_name_the_class_also_has(registry, make):
    """A name the class has (a class attribute) but that is already the module's parameter
    (child) is not another attribute: ``setattr`` of a ``Parameter`` (``Module``) replaces it,
    as torch's does."""
    class WithClassAttribute(nn.Module):
        w = None

    for who in ("torch", "reference"):
        module = WithClassAttribute()
        getattr(module, registry)["w"] = make()
        new = make()
        if who == "torch":
            module.w = new
        else:
            reference.registration.setattr(module, "w", new)
        assert getattr(module, registry)["w"] is new, who


@pytest.mark.parametrize("method", ["register_parameter", "register_buffer", "add_module"])
def test_a_module_before_init_is_refused_first_for_a_class_attributes_name(method):
    """Before ``Module.__init__`` ran, a registration under a name the class has (``forward``)
    raises torch's ``AttributeError`` for the missing ``__init__``."""
    value = nn.ReLU() if method == "add_module" else nn.Parameter(torch.ones(1))
    messages = []
    for who in ("torch", "reference"):
        module = nn.Module.__new__(nn.Module)
        register = (getattr(nn.Module, method) if who == "torch"
                    else getattr(reference.registration, method))
        with pytest.raises(AttributeError) as raised:
            register(module, "forward", value)
        messages.append(str(raised.value))
    assert messages[1] == messages[0]


@pytest.mark.parametrize("side", ["t1", "t2"])
def test_swap_tensors_refuses_a_weakly_referenced_side_first(side):
    """A weak reference to either tensor is refused with torch's message naming that side,
    before anything else happens: the other tensor's AccumulateGrad node is not poisoned."""
    def pair() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        t1, t2 = torch.zeros(2, requires_grad=True), torch.ones(2, requires_grad=True)
        held = weakref.ref(t1 if side == "t1" else t2)
        graph = (t1 * t2).sum()  # both leaves now have an AccumulateGrad node
        return t1, t2, graph, held

    messages = []
    for swap in (torch.utils.swap_tensors, reference.swap_tensors):
        t1, t2, graph, _held = pair()
        with pytest.raises(RuntimeError, match="weakref") as raised:
            swap(t1, t2)
        messages.append(str(raised.value))
        graph.backward()  # a poisoned node would raise here
        assert torch.equal(t1.grad, torch.ones(2)) and torch.equal(t2.grad, torch.zeros(2))
    assert messages[1] == messages[0] and f"swap {side} " in messages[1]


class _Flatten(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten()


def test_an_unsafe_registration_skips_the_checks_as_torchs():
    """``unsafe=True`` registers a parametrization the checks would refuse, as torch's does."""
    ours, theirs = nn.Linear(3, 2), nn.Linear(3, 2)
    reference.registration.register_parametrization(ours, "weight", _Flatten(), unsafe=True)
    torch.nn.utils.parametrize.register_parametrization(theirs, "weight", _Flatten(), unsafe=True)
    assert ours.weight.shape == theirs.weight.shape == (6,)


def test_a_refused_first_parametrization_beside_another_changes_nothing():
    """On a module whose other tensor is parametrized, a refused first registration still runs
    on the probe first and leaves the tensor as it was."""
    module = nn.Module()
    module.register_parameter("a", nn.Parameter(torch.ones(2, 3)))
    module.register_parameter("b", nn.Parameter(torch.arange(6.0).reshape(2, 3)))
    torch.nn.utils.parametrize.register_parametrization(module, "a", _Twice())
    held = module.b
    with pytest.raises(ValueError, match="shape"):
        reference.registration.register_parametrization(module, "b", _NegFlat())
    assert module.b is held and torch.equal(held.detach(), torch.arange(6.0).reshape(2, 3))
    assert not torch.nn.utils.parametrize.is_parametrized(module, "b")


class _FlatWhenGrad(nn.Module):
    """Refused (shape) exactly when its tensor requires grad, after ``right_inverse`` negated it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten() if x.requires_grad else x

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        return -x


@pytest.mark.parametrize("slot", ["parameter", "buffer"])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_the_probe_sees_the_tensor_as_torch_does(slot, requires_grad):
    """The probe copy keeps the tensor's kind and ``requires_grad``: a parametrization refused
    only for a tensor that requires grad is refused (changing nothing) or accepted as torch
    accepts it."""
    tensor = torch.arange(6.0).reshape(2, 3)
    theirs = _refusal(torch.nn.utils.parametrize.register_parametrization,
                      _one_slot_module(slot, tensor, requires_grad), _FlatWhenGrad())
    module = _one_slot_module(slot, tensor, requires_grad)
    ours = _refusal(reference.registration.register_parametrization, module, _FlatWhenGrad())
    assert ours == theirs and (ours is None) == (not requires_grad)
    if ours is not None:
        assert torch.equal(module.t.detach(), tensor), "a refused registration changed the tensor"


class _Counted(nn.Module):
    """Counts its ``right_inverse`` calls in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = self.calls + 1
        return x


def test_the_probe_leaves_the_parametrization_as_it_was():
    """The probe runs on a deep copy of the parametrization: after a registration, the
    parametrization's state is what torch's one registration leaves."""
    counts = []
    for register in (torch.nn.utils.parametrize.register_parametrization,
                     reference.registration.register_parametrization):
        parametrization = _Counted()
        register(nn.Linear(3, 2), "weight", parametrization)
        counts.append(parametrization.calls.item())
    assert counts == [1.0, 1.0]


class _ViewInverse(nn.Module):
    """A first registration torch's checks refuse (shape), whose ``right_inverse`` is a view."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten()


class _ToDouble(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


class _AddOnMeta(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.zeros(x.shape, device="meta")


def _wrapped_parameter(dtype: torch.dtype, device: str) -> nn.Parameter:
    from torch.testing._internal.two_tensor import TwoTensor

    values = torch.arange(6.0, dtype=dtype, device=device).reshape(2, 3)
    return nn.Parameter(TwoTensor(values, values.clone()), requires_grad=False)


@pytest.mark.parametrize(("parametrization", "dtype", "device"), [
    (_ToDouble, torch.float64, "cpu"), (_AddOnMeta, torch.float32, "meta")])
def test_the_probe_of_a_wrapper_subclass_keeps_its_dtype_and_device(parametrization, dtype,
                                                                    device):
    """A wrapper-subclass tensor's probe has its dtype and device: a parametrization torch
    accepts on it (one that reads them) is accepted."""
    ours, theirs = nn.Module(), nn.Module()
    ours.register_parameter("w", _wrapped_parameter(dtype, device))
    theirs.register_parameter("w", _wrapped_parameter(dtype, device))
    torch.nn.utils.parametrize.register_parametrization(theirs, "w", parametrization())
    reference.registration.register_parametrization(ours, "w", parametrization())
    assert ours.w.dtype == theirs.w.dtype and ours.w.device == theirs.w.device


def test_a_refused_first_parametrization_of_a_wrapper_subclass_raises_the_checks_error():
    """On a wrapper-subclass tensor the reference raises the checks' ``ValueError`` (where torch's
    swap of the view refuses first: torch.parametrize.refused-first-swap-refused)."""
    module = nn.Module()
    module.register_parameter("w", _wrapped_parameter(torch.float32, "cpu"))
    held = module.w
    with pytest.raises(ValueError, match="shape"):
        reference.registration.register_parametrization(module, "w", _ViewInverse())
    assert module.w is held and not torch.nn.utils.parametrize.is_parametrized(module)


def test_swap_tensors_names_a_second_tensor_held_elsewhere():
    """A ``t2`` whose TensorImpl a view also holds is refused with torch's message, naming t2."""
    messages = []
    for swap in (torch.utils.swap_tensors, reference.swap_tensors):
        t1, t2 = torch.zeros(2), torch.ones(2, requires_grad=True)
        view = t2.view(2)
        with pytest.raises(RuntimeError, match="use_count") as raised:
            swap(t1, t2)
        messages.append(str(raised.value))
        assert view._base is t2 and not t1.any()
    assert messages[1] == messages[0] and "use_count of t2 " in messages[1]


class _FlatUnlessParameter(nn.Module):
    """Refused (shape) unless its original is a ``Parameter``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if isinstance(x, nn.Parameter) else x.flatten()


@pytest.mark.parametrize("slot", ["parameter", "buffer"])
def test_the_probe_keeps_a_parameter_a_parameter(slot):
    """The probe copy of a parameter is a ``Parameter`` and of a buffer a plain tensor, as the
    original torch hands the parametrization: accepted or refused as torch's is."""
    outcomes = [_refusal(register, _one_slot_module(slot, torch.ones(2, 3), True),
                         _FlatUnlessParameter())
                for register in (torch.nn.utils.parametrize.register_parametrization,
                                 reference.registration.register_parametrization)]
    assert outcomes[1] == outcomes[0] and (outcomes[0] is None) == (slot == "parameter")


@pytest.mark.parametrize("target", ["0.0", "0.fresh"])
def test_set_submodule_sets_a_dotted_target_in_its_parent_as_torchs(target):
    ours, theirs = (nn.Sequential(nn.Sequential(nn.Linear(2, 2))) for _ in range(2))
    child = nn.Linear(2, 2)
    reference.set_submodule(ours, target, child)
    theirs.set_submodule(target, child)
    assert ours.get_submodule(target) is theirs.get_submodule(target) is child
    assert _shape(ours) == _shape(theirs)
