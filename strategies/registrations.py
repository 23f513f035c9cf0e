"""Registration calls on a module tree, and bad pairs for ``swap_tensors``.

A :class:`RegistrationCall` is one of ``register_parameter``, ``register_buffer``,
``add_module``, ``register_module``, ``setattr``, ``delattr``, made on a submodule of a drawn
tree (``owner``, its path), written as the source of torch's arguments (evaluated with
``torch`` in scope, so the repro and the behaviour cannot drift apart), of one of two kinds:

* ``good``: a form torch accepts, with the registry the name ends in (``ends``: ``parameter``,
  ``buffer``, ``module``, ``attribute`` or ``removed``) and, for a buffer, its persistence;
* ``bad``: a form with one defect (``defect``: a name that is not a string, dotted, empty or
  another attribute's; a value of the wrong kind; a non-leaf ``Parameter``; a missing name for
  ``delattr``; a module whose ``__init__`` never ran, ``uninitialized``), the error type torch raises (``error``) and a word its message must hold
  (``mention``).

Owners are the tree's modules whose registration methods are ``nn.Module``'s own (a module that
overrides ``__setattr__``, as RNNs do, has its own rules).

A :class:`SwapPair` is two tensors ``swap_tensors`` must refuse, each for one ``defect``: a weak
reference to either, different ``__slots__``, a TensorImpl held by a saved tensor of a graph or
by a view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin

REGISTRATION_METHODS = ("register_parameter", "register_buffer", "add_module",
                        "register_module", "setattr", "delattr")
OWN_METHODS = ("__setattr__", "__delattr__", "__getattr__", "register_parameter",
               "register_buffer", "add_module", "register_module")
FRESH = "fresh_slot"
TAKEN_BY_CLASS = ("forward", "training")  # a method; an instance attribute every module has


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
        return f"{self.method}({self.owner_code}, {self.arguments})"

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


def good_forms(owner: nn.Module, path: str) -> list[RegistrationCall]:
    params, buffers = _free_slots(owner, owner._parameters), _free_slots(owner, owner._buffers)
    children, plain = list(owner._modules), _plain_attribute(owner)
    out: list[RegistrationCall] = []

    def add(method: str, name: str, value: str, ends: str, persistent: bool = True,
            extra: str = "") -> None:
        shape = _shape(getattr(owner, name, None) if name != FRESH else None)
        out.append(RegistrationCall(method, path, name, _values(shape)[value] if value else "",
                                    extra, "good", ends, persistent))

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


def bad_forms(owner: nn.Module, path: str) -> list[RegistrationCall]:
    params, buffers = _free_slots(owner, owner._parameters), _free_slots(owner, owner._buffers)
    children, plain = list(owner._modules), _plain_attribute(owner)
    out: list[RegistrationCall] = []

    def bad(method: str, name: Any, value: str, defect: str, error: type[BaseException],
            mention: str) -> None:
        shape = _shape(getattr(owner, name, None) if isinstance(name, str) and name else None)
        out.append(RegistrationCall(method, path, name, _values(shape)[value] if value else "",
                                    "", "bad", defect=defect, error=error, mention=mention))

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
    bad("delattr", FRESH, "", "name-missing", AttributeError, FRESH)
    for method, value in (("register_parameter", "param"), ("register_buffer", "tensor"),
                          ("setattr", "param"), ("setattr", "module")):
        bad(method, FRESH, value, "uninitialized", AttributeError, "__init__")
    return out


@st.composite
def registration_calls(draw: Any, module: nn.Module, kinds: tuple[str, ...] = ("good", "bad"),
                       methods: tuple[str, ...] = REGISTRATION_METHODS) -> RegistrationCall:
    """A registration call on one of ``module``'s plain owners, of one of ``kinds``: the
    method, then the defect (a good form: the registry it ends in), then the form, each drawn
    evenly."""
    paths = owners(module)
    if not paths:
        from hypothesis import reject

        reject()
    path = draw(st.sampled_from(paths), label="owner")
    owner = module.get_submodule(path)
    forms = [*(good_forms(owner, path) if "good" in kinds else ()),
             *(bad_forms(owner, path) if "bad" in kinds else ())]
    forms = [f for f in forms if f.method in methods]
    method = draw(st.sampled_from(sorted({f.method for f in forms})), label="method")
    forms = [f for f in forms if f.method == method]
    group = draw(st.sampled_from(sorted({(f.kind, f.defect or f.ends) for f in forms})),
                 label="kind and defect")
    event(f"registration: {method} {group[0]} {group[1]}")
    return draw(st.sampled_from([f for f in forms if (f.kind, f.defect or f.ends) == group]),
                label="registration")


# ---- swap_tensors ---------------------------------------------------------------------------
SWAP_DEFECTS = ("weakref-t1", "weakref-t2", "slots", "saved", "view")


@dataclass(frozen=True)
class SwapPair:
    """Two tensors ``swap_tensors`` refuses for ``defect``, as source; see the module docstring.

    ``setup`` makes ``t1``, ``t2`` and what holds them (``held``) with ``Slotted`` (a tensor
    subclass with ``__slots__``) and ``weakref`` in scope; ``requires_grad``: whether the tensor
    the defect is on requires grad; ``mention``: a word the refusal's message must hold."""

    defect: str
    shape: tuple[int, ...]
    parameter: bool
    requires_grad: bool

    @property
    def mention(self) -> str:
        return {"weakref-t1": "weakref", "weakref-t2": "weakref", "slots": "slots",
                "saved": "use_count", "view": "use_count"}[self.defect]

    def setup(self) -> str:
        shape, grad = self.shape, self.requires_grad
        make = (f"torch.nn.Parameter(torch.zeros({shape}), requires_grad={grad})" if self.parameter
                else f"torch.zeros({shape}, requires_grad={grad})")
        other = f"torch.ones({shape})"
        held = {"weakref-t1": "weakref.ref(t1)", "weakref-t2": "weakref.ref(t2)",
                "slots": "None", "saved": "t1 * t1",
                "view": "t1.view(-1)"}[self.defect]
        if self.defect == "slots":
            other = f"torch.ones({shape}).as_subclass(Slotted)"
        if self.defect == "saved":
            make = f"torch.zeros({shape}, requires_grad=True)"
        return f"t1 = {make}\nt2 = {other}\nheld = {held}"


@st.composite
def swap_pairs(draw: Any) -> SwapPair:
    """A bad pair for ``swap_tensors``."""
    defect = draw(st.sampled_from(SWAP_DEFECTS), label="defect")
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2), label="shape"))
    parameter = draw(st.booleans(), label="parameter") and defect != "saved"
    return SwapPair(defect, shape, parameter, draw(st.booleans(), label="requires_grad"))
