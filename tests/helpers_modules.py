"""Hand-built modules and state snapshots for the reference's unit tests.

Every tensor is made from fixed values or a local ``torch.Generator``: nothing here
touches the global RNG.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

FLAG_SETTINGS = [(False, False), (True, False), (False, True), (True, True)]
FLAG_IDS = ["default", "overwrite", "swap", "overwrite+swap"]
# Parametrizes a test over the four flag settings (arguments ``overwrite``, ``swap``).
flag_settings = pytest.mark.parametrize(("overwrite", "swap"), FLAG_SETTINGS, ids=FLAG_IDS)


@contextmanager
def torch_swap_flag_set() -> Iterator[None]:
    """Set ``torch.__future__``'s swap flag inside the block; restore it after, even on failure."""
    saved = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(saved)


def randn(*shape: int, seed: int = 0) -> Tensor:
    """A deterministic normal tensor from a local generator."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def linear(n_in: int = 3, n_out: int = 3, *, seed: int = 0) -> nn.Linear:
    """An ``nn.Linear`` with fixed weights from a local generator."""
    lin = torch.nn.utils.skip_init(nn.Linear, n_in, n_out)  # no global-RNG init
    with torch.no_grad():
        lin.weight.copy_(randn(n_out, n_in, seed=seed))
        lin.bias.copy_(randn(n_out, seed=seed + 1))
    return lin


class TaggedParameter(nn.Parameter):
    """A ``Parameter`` subclass; instances carry a ``tag`` attribute."""


def tagged(data: Tensor, tag: str = "x", requires_grad: bool = True) -> TaggedParameter:
    p = TaggedParameter(data, requires_grad=requires_grad)
    p.tag = tag
    return p


class Plain(nn.Module):
    """One linear layer ``l1``, a buffer, and a non-tensor attribute ``foo``."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = linear(2, 2, seed=1)
        self.register_buffer("buffer", torch.tensor([1.0, 2.0]))
        self.foo = 0.0

    def forward(self, x: Tensor) -> Tensor:
        return self.l1(x) + self.buffer


class Tied(nn.Module):
    """Tied weights (``enc.weight is dec.weight``) and tied buffers (``enc.scale is dec.scale``)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = linear(3, 3, seed=2)
        self.dec = linear(3, 3, seed=3)
        self.dec.weight = self.enc.weight
        scale = torch.tensor([0.5, 1.0, 2.0])
        self.enc.register_buffer("scale", scale)
        self.dec.register_buffer("scale", scale)

    def forward(self, x: Tensor) -> Tensor:
        return self.dec(self.enc(x) * self.enc.scale) * self.dec.scale


class Shared(nn.Module):
    """One submodule reachable as ``a`` and ``b`` (``self.a is self.b``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = linear(2, 2, seed=4)
        self.b = self.a
        self.register_buffer("offset", torch.tensor([1.0, -1.0]))

    def forward(self, x: Tensor) -> Tensor:
        return self.b(self.a(x)) + self.offset


class Tagged(nn.Module):
    """A ``TaggedParameter`` with ``tag == 'x'`` (requires grad) and one that does not require grad."""

    def __init__(self) -> None:
        super().__init__()
        self.p = tagged(randn(2, 2, seed=5), "x")
        self.q = tagged(randn(2, seed=6), "y", requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.p + self.q


class RebindBuffer(nn.Module):
    """Forward rebinds its buffer: ``self.count = self.count + 1``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(2))
        self.weight = nn.Parameter(torch.ones(2))

    def forward(self, x: Tensor) -> Tensor:
        self.count = self.count + 1
        return x * self.weight + self.count


class InplaceBuffer(nn.Module):
    """Forward updates its buffer in place: ``self.count.add_(1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(2))

    def forward(self, x: Tensor) -> Tensor:
        self.count.add_(1)
        return x + self.count


class Boom(Exception):
    """The exception ``Raises`` throws by default."""


class BoomBase(BaseException):
    """A ``BaseException`` that is not an ``Exception`` (like ``KeyboardInterrupt``)."""


class Raises(nn.Module):
    """Forward records what it sees in ``seen``, then raises ``self.error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__()
        self.l1 = linear(2, 2, seed=7)
        self.register_buffer("buffer", torch.tensor([3.0, 4.0]))
        self.error = Boom("forward failed") if error is None else error
        self.seen: dict[str, object] = {}

    def forward(self, x: Tensor) -> Tensor:
        self.seen["weight"] = self.l1.weight
        self.seen["buffer"] = self.buffer
        raise self.error


class Holder(nn.Module):
    """An empty module that holds whatever ``w`` it is given."""

    def forward(self) -> None:  # pragma: no cover - never called
        return None


class ThreeAliases(nn.Module):
    """One parameter reachable as ``w``, ``a.w`` and ``b.w`` (three distinct owners)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.a = Holder()
        self.b = Holder()
        self.a.w = self.w
        self.b.w = self.w

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.w, self.a.w, self.b.w


class WithNones(nn.Module):
    """A parameter and a buffer registered as ``None``, next to real ones."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.register_parameter("missing", None)
        self.register_buffer("buf", torch.tensor([3.0]))
        self.register_buffer("nobuf", None)
        self.register_buffer("steps", torch.tensor([7], dtype=torch.long))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight


class Nested(nn.Module):
    """A parent with its own parameter and buffer, and a child ``Linear``."""

    def __init__(self) -> None:
        super().__init__()
        self.own = nn.Parameter(randn(2, seed=8))
        self.register_buffer("own_buf", torch.tensor([1.0, 1.0]))
        self.child = linear(2, 2, seed=9)

    def forward(self, x: Tensor) -> Tensor:
        return self.child(x) + self.own + self.own_buf


class Echo(nn.Module):
    """Forward returns its positional and keyword arguments as given."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))

    def forward(
        self, *args: object, **kwargs: object
    ) -> tuple[tuple[object, ...], dict[str, object]]:
        return args, kwargs


class Small(nn.Module):
    """A scriptable module."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = linear(2, 2, seed=10)

    def forward(self, x: Tensor) -> Tensor:
        return self.l1(x)


# ---------------------------------------------------------------------------
# Snapshots: everything a test compares to say "the module is exactly as it was".


@dataclass
class TensorState:
    obj: Tensor
    cdata: int
    cls: type
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    value: Tensor | None
    grad: TensorState | None


def tensor_state(t: Tensor) -> TensorState:
    value = t.detach().clone() if t.device.type != "meta" else None
    grad = t.grad if t.is_leaf else None
    return TensorState(
        t,
        t._cdata,
        type(t),
        t.dtype,
        t.device,
        t.requires_grad,
        value,
        None if grad is None else tensor_state(grad),
    )


@dataclass
class ModuleState:
    module: nn.Module
    dict_keys: list[str]
    params: dict[str, TensorState | None]
    buffers: dict[str, TensorState | None]
    children: dict[str, nn.Module]


def snapshot(module: nn.Module) -> list[ModuleState]:
    """Every module object of the tree once, with every slot's object and contents."""
    states = []
    for m in module.modules():
        states.append(
            ModuleState(
                m,
                list(m.__dict__),
                {k: None if t is None else tensor_state(t) for k, t in m._parameters.items()},
                {k: None if t is None else tensor_state(t) for k, t in m._buffers.items()},
                dict(m._modules),
            )
        )
    return states


def _dense(t: Tensor) -> Tensor:
    return t.to_dense() if t.layout != torch.strided else t


def assert_tensor_unchanged(before: TensorState, now: Tensor | None, where: str) -> None:
    assert now is before.obj, f"{where}: another object"
    assert now._cdata == before.cdata, f"{where}: _cdata changed"
    assert type(now) is before.cls, f"{where}: class changed"
    assert now.dtype == before.dtype, f"{where}: dtype changed"
    assert now.device == before.device, f"{where}: device changed"
    assert now.requires_grad == before.requires_grad, f"{where}: requires_grad changed"
    if before.value is not None:
        assert torch.equal(_dense(now.detach()), _dense(before.value)), f"{where}: value changed"
    grad = now.grad if now.is_leaf else None
    if before.grad is None:
        assert grad is None, f"{where}: grad appeared"
    else:
        assert_tensor_unchanged(before.grad, grad, f"{where}.grad")


def assert_unchanged(before: list[ModuleState], module: nn.Module) -> None:
    """The tree holds the same module objects, slots, objects and contents as ``before``."""
    assert [s.module for s in before] == list(module.modules())
    for s in before:
        m = s.module
        name = m._get_name()
        assert list(m.__dict__) == s.dict_keys, f"{name}: __dict__ keys changed"
        assert list(m._parameters) == list(s.params), f"{name}: _parameters keys changed"
        assert list(m._buffers) == list(s.buffers), f"{name}: _buffers keys changed"
        assert dict(m._modules) == s.children, f"{name}: submodules changed"
        for table, states in (("_parameters", s.params), ("_buffers", s.buffers)):
            for key, state in states.items():
                now = getattr(m, table)[key]
                if state is None:
                    assert now is None, f"{name}.{key}: was None"
                else:
                    assert_tensor_unchanged(state, now, f"{name}.{key}")


def fill_grads(module: nn.Module, seed: int = 20) -> None:
    """Give every parameter that requires grad a deterministic ``.grad``."""
    for i, p in enumerate(module.parameters()):
        if p.requires_grad:
            p.grad = randn(*p.shape, seed=seed + i)
