"""Registration calls on a module tree, and bad pairs for ``swap_tensors``.

A :class:`RegistrationCall` is one of ``register_parameter``, ``register_buffer``,
``add_module``, ``register_module``, ``set_submodule``, ``setattr``, ``delattr``, made on a submodule of a drawn
tree (``owner``, its path), written as the source of torch's arguments (evaluated with
``torch`` in scope, so the repro and the behaviour cannot drift apart), of one of two kinds:

* ``good``: a form torch accepts, with the registry the name ends in (``ends``: ``parameter``,
  ``buffer``, ``module``, ``attribute`` or ``removed``) and, for a buffer, its persistence;
* ``bad``: a form with one defect (``defect``: a name that is not a string, dotted, empty or
  another attribute's; a value of the wrong kind; a non-leaf ``Parameter``; a missing name for
  ``delattr``; a module whose ``__init__`` never ran, ``uninitialized``; for ``set_submodule``, a target
  whose parent is missing, ``target-missing``, or that names an attribute holding no module,
  ``target-not-module``), the error type torch raises (``error``) and a word its message must
  hold (``mention``).

Owners are the tree's modules whose registration methods are ``nn.Module``'s own (a module that
overrides ``__setattr__``, as RNNs do, has its own rules). For ``setattr`` and ``delattr`` an
owner's class may be drawn overridden (``override``): a subclass whose ``register_buffer`` takes
``persistent`` (``"persistent"``) or, as in code written before the argument existed, does not
(``"legacy"``); ``Module.__setattr__`` registers a buffer through it, and refuses a
non-persistent buffer on a ``"legacy"`` owner (``defect`` ``legacy-override``).

A :class:`SwapPair` is two tensors ``swap_tensors`` must refuse, each for one ``defect``: a weak
reference to either, different ``__slots__``, a TensorImpl held by a saved tensor of a graph or
by a view (made with or without grad mode). A :class:`GoodSwapPair` is two tensors it must
swap: plain tensors, ``Parameter``s or both of a class with ``__slots__`` (each slot set or not),
with ``__dict__`` attributes, ``requires_grad`` and a graph built on either before the swap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin

REGISTRATION_METHODS = ("register_parameter", "register_buffer", "add_module",
                        "register_module", "set_submodule", "setattr", "delattr")
OWN_METHODS = ("__setattr__", "__delattr__", "__getattr__", "register_parameter",
               "register_buffer", "add_module", "register_module")
FRESH = "fresh_slot"
TAKEN_BY_CLASS = ("forward", "training")  # a method; an instance attribute every module has
# The owner's class, as source: nn.Module's register_buffer, or a subclass overriding it with or
# without the ``persistent`` argument (``Module.__setattr__``'s "HACK" for the latter).
BUFFER_OVERRIDES: dict[str, tuple[str, ...]] = {
    "": (),
    "persistent": (
        "class Owner(type(owner)):  # overrides register_buffer, persistent taken",
        "    def register_buffer(self, name, tensor, persistent=True):",
        "        torch.nn.Module.register_buffer(self, name, tensor, persistent)",
        "owner.__class__ = Owner"),
    "legacy": (
        "class Owner(type(owner)):  # overrides register_buffer without persistent",
        "    def register_buffer(self, name, tensor):",
        "        torch.nn.Module.register_buffer(self, name, tensor)",
        "owner.__class__ = Owner"),
}
SETATTR_METHODS = ("setattr", "delattr")


@dataclass(frozen=True)
class RegistrationCall:
    """``<method>(owner, <arguments>)``; see the module docstring."""

    method: str
    owner: str
    name: Any
    value: str = ""  # the value's source ("" for delattr)
    extra: str = ""  # more arguments' source (", False": register_buffer's persistent)
    kind: str = "good"
    ends: str = ""  # good: parameter, buffer, module, attribute or removed
    persistent: bool = True
    defect: str = ""
    error: type[BaseException] | None = None
    mention: str = ""
    override: str = ""  # "", "persistent" or "legacy": the owner's class overrides register_buffer

    @property
    def arguments(self) -> str:
        value = f", {self.value}" if self.value else ""
        return f"{self.name!r}{value}{self.extra}"

    @property
    def owner_code(self) -> str:
        """The source of the module the call is made on, from the tree ``module``: a fresh
        ``nn.Module`` whose ``__init__`` never ran for the ``uninitialized`` defect."""
        if self.defect == "uninitialized":
            return "torch.nn.Module.__new__(torch.nn.Module)"
        return f"module.get_submodule({self.owner!r})" if self.owner else "module"

    @property
    def label(self) -> str:
        override = f" [owner's register_buffer: {self.override}]" if self.override else ""
        return f"{self.method}({self.owner_code}, {self.arguments}){override}"

    @property
    def setup(self) -> list[str]:
        """Source lines, run with ``torch`` and ``owner`` in scope before the call, that give
        the owner its drawn ``register_buffer`` override (none without one)."""
        return list(BUFFER_OVERRIDES[self.override])

    def args(self) -> tuple[tuple, dict]:
        """Fresh ``(args, kwargs)`` evaluated from ``arguments``."""
        return eval(f"(lambda *a, **k: (a, k))({self.arguments})", {"torch": torch})

    def code(self, call: str = "target_method", flags: str = "False, False") -> str:
        """The call as Python source, on ``owner`` (a variable the caller defines)."""
        return f"{call}(owner, {self.method!r}, {flags}, {self.arguments})"


def plain_owner(module: nn.Module) -> bool:
    """Whether ``module`` registers by ``nn.Module``'s own methods."""
    return all(getattr(type(module), m) is getattr(nn.Module, m) for m in OWN_METHODS)


def owners(module: nn.Module) -> list[str]:
    """The paths of the tree's plain owners, each module once."""
    return [path for path, m in module.named_modules() if plain_owner(m)]


def _shape(t: Any) -> tuple[int, ...]:
    if not isinstance(t, torch.Tensor) or isinstance(t, UninitializedTensorMixin) or t.is_meta:
        return (2,)
    return tuple(t.shape)


def _values(shape: tuple[int, ...]) -> dict[str, str]:
    """Value sources by kind, tensors of ``shape``."""
    zeros = f"torch.zeros({shape})"
    return {
        "param": f"torch.nn.Parameter({zeros})",
        "nonleaf": (f"torch.nn.Parameter({zeros}, requires_grad=False)"
                    f".add_(torch.zeros({shape}, requires_grad=True))"),
        "tensor": zeros,
        "buffer": f"torch.nn.Buffer({zeros})",
        "buffer-np": f"torch.nn.Buffer({zeros}, persistent=False)",
        "module": "torch.nn.Linear(2, 2)",
        "none": "None",
        "int": "3",
    }


def _plain_attribute(owner: nn.Module) -> str | None:
    """A plain instance attribute of ``owner`` (``in_features``), or None."""
    found = [k for k, v in owner.__dict__.items()
             if not k.startswith("_") and k != "training" and isinstance(v, (int, float, str))]
    return found[0] if found else None


def _free_slots(owner: nn.Module, table: dict) -> list[str]:
    """The names of ``table`` no old-style reparametrization hook of ``owner`` reads (weight
    norm's ``p_g``/``p_v``, spectral norm's and pruning's ``weight_orig``...): removing or
    replacing one leaves a module whose forward pre-hook cannot run, which no rule here is about."""
    hooked = [getattr(h, "name", None) or getattr(h, "_tensor_name", None)
              for h in owner._forward_pre_hooks.values()]
    return [n for n in table if not any(h and n.startswith(f"{h}_") for h in hooked)]


def _legacy_refused(call: RegistrationCall) -> bool:
    """Whether ``call`` sets a non-persistent buffer by ``setattr`` on an owner whose
    ``register_buffer`` override takes no ``persistent``: torch refuses it."""
    return (call.override == "legacy" and call.method == "setattr" and call.ends == "buffer"
            and not call.persistent)


def good_forms(owner: nn.Module, path: str, override: str = "") -> list[RegistrationCall]:
    """The forms torch accepts on ``owner`` (its ``setattr`` and ``delattr`` forms with the
    ``register_buffer`` override ``override``)."""
    return [f for f in _accepted_forms(owner, path, override) if not _legacy_refused(f)]


def _accepted_forms(owner: nn.Module, path: str, override: str) -> list[RegistrationCall]:
    params, buffers = _free_slots(owner, owner._parameters), _free_slots(owner, owner._buffers)
    children, plain = list(owner._modules), _plain_attribute(owner)
    out: list[RegistrationCall] = []

    def add(method: str, name: str, value: str, ends: str, persistent: bool = True,
            extra: str = "") -> None:
        shape = _shape(getattr(owner, name, None) if name != FRESH else None)
        out.append(RegistrationCall(method, path, name, _values(shape)[value] if value else "",
                                    extra, "good", ends, persistent,
                                    override=override if method in SETATTR_METHODS else ""))

    for name in [FRESH, *params[:1]]:
        for value in ("param", "none"):
            add("register_parameter", name, value, "parameter")
    for name in [FRESH, *buffers[:1]]:
        for value in ("tensor", "none"):
            for persistent in (True, False):
                add("register_buffer", name, value, "buffer", persistent,
                    "" if persistent else ", persistent=False")
    for method in ("add_module", "register_module"):
        for name in [FRESH, *children[:1]]:
            for value in ("module", "none"):
                add(method, name, value, "module")
    for name, extra in ((FRESH, ""), *((child, strict) for child in children[:1]
                                       for strict in ("", ", strict=True"))):
        add("set_submodule", name, "module", "module", extra=extra)
    others = [FRESH, *buffers[:1], *children[:1], *([plain] if plain else [])]
    for name in [*others, *params[:1]]:
        add("setattr", name, "param", "parameter")
    for name in others:
        add("setattr", name, "module", "module")
    for name in [*params[:1], *children[:1]]:
        add("setattr", name, "none", "parameter" if name in params else "module")
    for name in buffers[:1]:
        for value in ("tensor", "none"):
            add("setattr", name, value, "buffer", name not in owner._non_persistent_buffers_set)
    for value, persistent in (("buffer", True), ("buffer-np", False)):
        add("setattr", FRESH, value, "buffer", persistent)
    add("setattr", FRESH, "int", "attribute")
    for name in [*params[:1], *buffers[:1], *children[:1], *([plain] if plain else [])]:
        add("delattr", name, "", "removed")
    return out


def bad_forms(owner: nn.Module, path: str, override: str = "") -> list[RegistrationCall]:
    """The forms torch's documented rules refuse on ``owner`` (its ``setattr`` and ``delattr``
    forms with the ``register_buffer`` override ``override``), each with its defect."""
    params, buffers = _free_slots(owner, owner._parameters), _free_slots(owner, owner._buffers)
    children, plain = list(owner._modules), _plain_attribute(owner)
    out: list[RegistrationCall] = [
        replace(f, kind="bad", ends="", defect="legacy-override", error=RuntimeError,
                mention="persistent")
        for f in _accepted_forms(owner, path, override) if _legacy_refused(f)]

    def bad(method: str, name: Any, value: str, defect: str, error: type[BaseException],
            mention: str) -> None:
        shape = _shape(getattr(owner, name, None) if isinstance(name, str) and name else None)
        overridden = method in SETATTR_METHODS and defect != "uninitialized"
        out.append(RegistrationCall(method, path, name, _values(shape)[value] if value else "",
                                    "", "bad", defect=defect, error=error, mention=mention,
                                    override=override if overridden else ""))

    kinds = {"register_parameter": ("param", "parameter"), "register_buffer": ("tensor", "buffer"),
             "add_module": ("module", "module"), "register_module": ("module", "module")}
    for method, (value, kind) in kinds.items():
        bad(method, 1, value, "name-not-str", TypeError, "int")
        bad(method, "a.b", value, "name-dotted", KeyError, '"."')
        bad(method, "", value, "name-empty", KeyError, "empty")
        own = {"parameter": params, "buffer": buffers, "module": children}[kind]
        taken = [n for n in (*params[:1], *buffers[:1], *children[:1]) if n not in own]
        for name in (*taken, *TAKEN_BY_CLASS):
            bad(method, name, value, "name-taken", KeyError, name)
    bad("register_parameter", FRESH, "tensor", "value-kind", TypeError, "Tensor")
    bad("register_parameter", FRESH, "int", "value-kind", TypeError, "int")
    bad("register_parameter", FRESH, "nonleaf", "value-non-leaf", ValueError, "non-leaf")
    bad("register_buffer", FRESH, "int", "value-kind", TypeError, "int")
    for method in ("add_module", "register_module"):
        bad(method, FRESH, "int", "value-kind", TypeError, "int")
        bad(method, FRESH, "tensor", "value-kind", TypeError, "Tensor")
    for name in (FRESH, *buffers[:1], *children[:1], *([plain] if plain else [])):
        bad("setattr", name, "nonleaf", "value-non-leaf", ValueError, "non-leaf")
    for value in ("param", "buffer", "module"):
        bad("setattr", "a.b", value, "name-dotted", KeyError, '"."')
        bad("setattr", "", value, "name-empty", KeyError, "empty")
    for value in ("param", "module"):
        bad("setattr", "forward", value, "name-taken", KeyError, "forward")
    bad("setattr", "training", "buffer", "name-taken", KeyError, "training")
    for name in params[:1]:
        for value in ("tensor", "int", "module"):
            bad("setattr", name, value, "slot-kind", TypeError, name)
    for name in children[:1]:
        for value in ("tensor", "int"):
            bad("setattr", name, value, "slot-kind", TypeError, name)
    for name in buffers[:1]:
        bad("setattr", name, "int", "slot-kind", TypeError, name)
    _bad_set_submodule(bad, params, buffers)
    bad("delattr", FRESH, "", "name-missing", AttributeError, FRESH)
    for method, value in (("register_parameter", "param"), ("register_buffer", "tensor"),
                          ("setattr", "param"), ("setattr", "module")):
        bad(method, FRESH, value, "uninitialized", AttributeError, "__init__")
    for method in ("add_module", "register_module"):  # torch reads the missing registry
        bad(method, FRESH, "module", "uninitialized", AttributeError, "_modules")
    bad("set_submodule", FRESH, "module", "uninitialized", AttributeError, "__init__")
    return out


def _bad_set_submodule(bad: Any, params: list[str], buffers: list[str]) -> None:
    """``set_submodule``'s refused forms, each made by ``bad(method, name, value, defect, error,
    mention)``: an empty target, a value that is no module, a missing parent, a target holding
    no module (a parameter, a buffer, a method)."""
    bad("set_submodule", "", "module", "name-empty", ValueError, "target name")
    for value in ("tensor", "none", "int"):
        bad("set_submodule", FRESH, value, "value-kind", ValueError, "nn.Module")
    bad("set_submodule", f"missing.{FRESH}", "module", "target-missing", AttributeError, "missing")
    for name in (*params[:1], *buffers[:1], "forward"):
        bad("set_submodule", name, "module", "target-not-module", AttributeError, name)


@st.composite
def registration_forms(draw: Any, module: nn.Module, kinds: tuple[str, ...] = ("good", "bad"),
                       methods: tuple[str, ...] = REGISTRATION_METHODS
                       ) -> list[RegistrationCall]:
    """Every form of ``kinds`` and ``methods`` on one of ``module``'s plain owners (drawn), with
    a ``register_buffer`` override drawn for the owner where ``methods`` are ``setattr`` and
    ``delattr`` only."""
    paths = owners(module)
    if not paths:
        from hypothesis import reject

        reject()
    path = draw(st.sampled_from(paths), label="owner")
    override = ""
    if set(methods) <= set(SETATTR_METHODS):
        override = draw(st.sampled_from(list(BUFFER_OVERRIDES)), label="register_buffer override")
        event(f"registration: owner's register_buffer {override or 'own'}")
    owner = module.get_submodule(path)
    forms = [*(good_forms(owner, path, override) if "good" in kinds else ()),
             *(bad_forms(owner, path, override) if "bad" in kinds else ())]
    return [f for f in forms if f.method in methods]


@st.composite
def registration_calls(draw: Any, module: nn.Module, kinds: tuple[str, ...] = ("good", "bad"),
                       methods: tuple[str, ...] = REGISTRATION_METHODS) -> RegistrationCall:
    """A registration call on one of ``module``'s plain owners, of one of ``kinds``: the owner
    (and its ``register_buffer`` override, ``registration_forms``), the method, then the defect
    (a good form: the registry it ends in), then the form, each drawn evenly."""
    forms = draw(registration_forms(module, kinds, methods))
    method = draw(st.sampled_from(sorted({f.method for f in forms})), label="method")
    forms = [f for f in forms if f.method == method]
    group = draw(st.sampled_from(sorted({_group(f) for f in forms})), label="kind and defect")
    event(f"registration: {method} {group[0]} {group[1]}{' None' if group[2] else ''}")
    return draw(st.sampled_from([f for f in forms if _group(f) == group]), label="registration")


def _group(call: RegistrationCall) -> tuple[str, str, bool]:
    """What a call is drawn by: its kind, its defect (a good form: the registry it ends in), and
    whether its value is ``None`` (a registered name kept, holding ``None``)."""
    return call.kind, call.defect or call.ends, call.value == "None"


# ---- swap_tensors ---------------------------------------------------------------------------
SWAP_DEFECTS = ("weakref-t1", "weakref-t2", "slots", "saved", "view", "view-no-grad")


@dataclass(frozen=True)
class SwapPair:
    """Two tensors ``swap_tensors`` refuses for ``defect``, as source; see the module docstring.

    ``setup`` makes ``t1``, ``t2`` and what holds them (``held``) with ``Slotted`` (a tensor
    subclass with ``__slots__``) and ``weakref`` in scope; ``requires_grad``: whether the tensor
    the defect is on requires grad (always for ``saved`` and ``view-no-grad``); ``mention``: a word the refusal's message must hold."""

    defect: str
    shape: tuple[int, ...]
    parameter: bool
    requires_grad: bool

    @property
    def mention(self) -> str:
        return {"weakref-t1": "weakref", "weakref-t2": "weakref", "slots": "slots",
                "saved": "use_count", "view": "use_count",
                "view-no-grad": "use_count"}[self.defect]

    def setup(self) -> str:
        shape, grad = self.shape, self.requires_grad
        make = (f"torch.nn.Parameter(torch.zeros({shape}), requires_grad={grad})" if self.parameter
                else f"torch.zeros({shape}, requires_grad={grad})")
        other = f"torch.ones({shape})"
        held = {"weakref-t1": "weakref.ref(t1)", "weakref-t2": "weakref.ref(t2)",
                "slots": "None", "saved": "t1 * t1",
                "view": "t1.view(-1)", "view-no-grad": "t1.view(-1)"}[self.defect]
        if self.defect == "slots":
            other = f"torch.ones({shape}).as_subclass(Slotted)"
        if self.defect in ("saved", "view-no-grad"):  # a leaf that requires grad
            make = (f"torch.nn.Parameter(torch.zeros({shape}))" if self.parameter
                    else f"torch.zeros({shape}, requires_grad=True)")
        if self.defect == "view-no-grad":  # the view holds t1; t1 has no AccumulateGrad node yet
            return f"t1 = {make}\nt2 = {other}\nwith torch.no_grad():\n    held = {held}"
        return f"t1 = {make}\nt2 = {other}\nheld = {held}"


@st.composite
def swap_pairs(draw: Any) -> SwapPair:
    """A bad pair for ``swap_tensors``."""
    defect = draw(st.sampled_from(SWAP_DEFECTS), label="defect")
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2), label="shape"))
    parameter = draw(st.booleans(), label="parameter") and defect != "saved"
    return SwapPair(defect, shape, parameter, draw(st.booleans(), label="requires_grad"))


SWAP_CLASSES = ("tensor", "parameter", "slotted")


@dataclass(frozen=True)
class SwapSide:
    """One tensor of a :class:`GoodSwapPair`: its class (``tensor``, ``parameter`` or
    ``slotted``: ``Slotted``, a subclass with ``__slots__``), shape, dtype, ``requires_grad``,
    whether its ``tag`` slot is set (``slotted`` only), whether it has a ``__dict__`` attribute
    ``note``, and whether a graph is built on it before the swap (``graph``: a leaf that requires
    grad, so its TensorImpl is held by its AccumulateGrad node too)."""

    kind: str
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool
    slot: bool
    note: bool
    graph: bool

    def setup(self, name: str, fill: int) -> list[str]:
        """Source making the tensor ``name`` (filled with ``fill``) and, with ``graph``,
        ``y_<name>``, a sum built on it."""
        base = f"torch.full({self.shape}, {fill}, dtype=torch.{self.dtype})"
        grad = self.requires_grad
        make = {"tensor": f"{base}.requires_grad_({grad})",
                "parameter": f"torch.nn.Parameter({base}, requires_grad={grad})",
                "slotted": f"{base}.as_subclass(Slotted).requires_grad_({grad})"}[self.kind]
        lines = [f"{name} = {make}"]
        if self.slot:
            lines.append(f"{name}.tag = {name!r}")
        if self.note:
            lines.append(f"{name}.note = {name!r}")
        if self.graph:
            lines.append(f"y_{name} = ({name} * 2).sum()")
        return lines


@dataclass(frozen=True)
class GoodSwapPair:
    """Two tensors ``swap_tensors`` swaps: ``t1`` (zeros) and ``t2`` (ones), as source with
    ``Slotted`` in scope; see the module docstring."""

    t1: SwapSide
    t2: SwapSide

    def setup(self) -> str:
        return "\n".join([*self.t1.setup("t1", 0), *self.t2.setup("t2", 1)])


@st.composite
def swap_sides(draw: Any, slotted: bool) -> SwapSide:
    """One side of a good pair: ``Slotted`` where ``slotted`` (``swap_tensors`` swaps only
    tensors with the same slots), else a plain tensor or a ``Parameter``."""
    kind = "slotted" if slotted else draw(st.sampled_from(SWAP_CLASSES[:2]), label="class")
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2), label="shape"))
    dtype = draw(st.sampled_from(("float32", "float64")), label="dtype")
    requires_grad = draw(st.booleans(), label="requires_grad")
    slot = slotted and draw(st.booleans(), label="slot set")
    graph = requires_grad and draw(st.booleans(), label="graph built before the swap")
    return SwapSide(kind, shape, dtype, requires_grad, slot,
                    draw(st.booleans(), label="__dict__ attribute"), graph)


@st.composite
def good_swap_pairs(draw: Any) -> GoodSwapPair:
    """A pair ``swap_tensors`` swaps: both ``Slotted`` (a third of the pairs) or neither."""
    slotted = draw(st.integers(0, 2), label="slotted") == 0
    pair = GoodSwapPair(draw(swap_sides(slotted)), draw(swap_sides(slotted)))
    event(f"swap pair: {pair.t1.kind}/{pair.t2.kind}"
          f"{' graph' if pair.t1.graph or pair.t2.graph else ''}")
    return pair
