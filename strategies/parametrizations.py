"""Parametrizations to register on a drawn tree's tensor, for the ``PARAMETRIZE-`` properties.

Two catalogues of ``torch.nn.utils.parametrize`` parametrizations, each class shape- and
dtype-agnostic:

* ``GOOD`` (:func:`good_parametrizations`): registrations ``unsafe=False`` accepts, first on a
  tensor or stacked on a parametrized one. ``double`` (:class:`~strategies.decorations.Double`:
  ``2 * x``, no ``right_inverse``), ``negate`` (:class:`~strategies.decorations.Negate`, with
  its ``right_inverse``), ``halve`` (``x / 2`` whose ``right_inverse`` raises
  ``NotImplementedError``, which torch reads as the identity), ``split-sum`` (``a + b``, whose
  ``right_inverse`` splits the value into two halves: a parametrization of two originals,
  ``original0`` and ``original1``; first registration only).
* ``BAD`` (:func:`bad_registrations`): registrations torch's ``unsafe=False`` checks refuse with a
  ``ValueError`` whose message names ``BAD_WORDS[kind]``. ``forward-dtype``/``forward-shape``/
  ``forward-not-tensor``: forward changes the dtype, the shape, or returns a list;
  ``inverse-dtype``/``inverse-shape``/``inverse-not-tensor``: ``right_inverse`` does;
  ``inverse-device``: ``right_inverse`` moves to ``meta`` (first registration only: torch checks
  the device of a stacked one's ``right_inverse`` nowhere); ``bad-element``: ``right_inverse``
  returns ``(x, None)``; ``missing-name``: a name the module does not have
  (:data:`MISSING_NAME`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st
from torch import Tensor, nn

from swapspec.strategies.decorations import Double, Negate


class Halve(nn.Module):
    """``x / 2``; its ``right_inverse`` raises ``NotImplementedError`` (torch: the identity)."""

    def forward(self, x: Tensor) -> Tensor:
        return x / 2

    def right_inverse(self, x: Tensor) -> Tensor:
        raise NotImplementedError("Halve keeps the value as its original")


class SplitSum(nn.Module):
    """Two originals ``a``, ``b`` read as ``a + b``; ``right_inverse`` stores two halves."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return a + b

    def right_inverse(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x / 2, x / 2


def _other_dtype(x: Tensor) -> torch.dtype:
    return torch.float32 if x.dtype == torch.float64 else torch.float64


class Refused(nn.Module):
    """A parametrization torch's ``unsafe=False`` checks refuse, as its ``kind`` says."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: Tensor) -> Tensor | list[Tensor]:
        if self.kind == "forward-dtype":
            return x.to(_other_dtype(x))
        if self.kind == "forward-shape":
            return x.flatten()
        if self.kind == "forward-not-tensor":
            return [x]
        return x

    def right_inverse(self, x: Tensor) -> object:
        changed = {
            "inverse-dtype": lambda: x.to(_other_dtype(x)),
            "inverse-shape": lambda: x.flatten(),
            "inverse-not-tensor": lambda: None,
            "inverse-device": lambda: x.to("meta"),
            "bad-element": lambda: (x, None),
        }
        return changed[self.kind]() if self.kind in changed else x

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


GOOD = ("double", "negate", "halve", "split-sum")
FIRST_ONLY = ("split-sum", "inverse-device")
BAD_WORDS = {
    "forward-dtype": "dtype", "forward-shape": "shape", "forward-not-tensor": "tensor",
    "inverse-dtype": "dtype", "inverse-shape": "shape", "inverse-not-tensor": "tensor",
    "inverse-device": "device", "bad-element": "tensor", "missing-name": "sw_missing",
}
BAD = tuple(BAD_WORDS)
MISSING_NAME = "sw_missing"


def make_parametrization(kind: str) -> nn.Module:
    """A fresh parametrization module of ``kind`` (one of ``GOOD`` or ``BAD``)."""
    good = {"double": Double, "negate": Negate, "halve": Halve, "split-sum": SplitSum}
    return good[kind]() if kind in good else Refused(kind)


def parametrization_source(kind: str) -> str:
    """The Python expression that makes it, for repros (after :data:`REPRO_IMPORT`)."""
    return f"make_parametrization({kind!r})"


REPRO_IMPORT = "from swapspec.strategies.parametrizations import make_parametrization"


@dataclass(frozen=True)
class Registration:
    """A ``register_parametrization`` of ``kind`` on a tensor, ``stacked`` on its parametrization
    or its first one."""

    kind: str
    stacked: bool


def good_parametrizations(*, stacked: bool) -> st.SearchStrategy[str]:
    """A kind of ``GOOD`` (``stacked``: one a stacked registration takes); shrinks towards
    ``double``. Reports ``hypothesis.event('parametrization: <kind>')``."""
    kinds = [k for k in GOOD if not (stacked and k in FIRST_ONLY)]
    return st.sampled_from(kinds).map(_reported)


def bad_registrations(*, stacked: bool) -> st.SearchStrategy[Registration]:
    """A :class:`Registration` torch refuses, of a kind of ``BAD`` (``stacked``: one a stacked
    registration is refused for, or any first)."""
    excluded = FIRST_ONLY if stacked else ()
    kinds = [k for k in BAD if k not in excluded]
    return st.sampled_from(kinds).map(_reported).map(lambda k: Registration(k, stacked))


def _reported(kind: str) -> str:
    event(f"parametrization: {kind}")
    return kind
