"""Modules built without initializing them, to draw: ``torch.nn.utils.skip_init`` and a build
under ``with torch.device("meta")`` followed by ``to_empty``, each under a default dtype.

A :class:`Construction` is pure data: a catalogue entry and variant of
``strategies.torch_modules`` (its constructor arguments), the ``path`` that builds it, the
default dtype set around the build, and, for a refused build, what the class lacks. Rules:

* Paths: ``skip_init`` (``skip_init(cls, *args, **kwargs)``: built on ``meta``, then
  ``to_empty(device=kwargs.get("device", "cpu"))``) and ``default-device`` (the constructor run
  under ``with torch.device("meta")``, then ``to_empty(device="cpu")``).
* Drawn entries are the catalogue's that are not lazy and whose constructor names ``device``
  (``accepts_device``); ``skip_init`` refuses the rest (``RuntimeError``), and those are drawn
  as ``refused="no-device-arg"``, on the ``skip_init`` path only (``nn.LSTM`` takes ``device`` through ``**kwargs`` only, which
  torch's documented check does not see). ``refused="not-a-module"`` passes a class that is no
  ``nn.Module`` (``dict``).
* Default dtypes: float32 and float64, set around the build and restored after it.
* Shrinks towards the first such entry, variant 0, ``skip_init``, float32, accepted.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from swapspec.strategies import torch_modules

PATHS = ("skip_init", "default-device")
DEFAULT_DTYPES = (torch.float32, torch.float64)
REFUSALS = ("no-device-arg", "not-a-module")


def accepts_device(entry: str) -> bool:
    """Whether the entry's class names ``device`` in its constructor's signature."""
    return "device" in inspect.signature(torch_modules.info(entry).module_cls).parameters


@dataclass(frozen=True)
class Construction:
    """One drawn build: see the module docstring."""

    entry: str
    variant: int = 0
    path: str = "skip_init"
    default_dtype: torch.dtype = torch.float32
    refused: str | None = None

    @property
    def module_cls(self) -> type:
        """The class the build is asked to make (``dict`` for ``not-a-module``)."""
        return dict if self.refused == "not-a-module" else torch_modules.info(self.entry).module_cls

    def constructor_inputs(self) -> tuple[tuple, dict]:
        """Fresh copies of the variant's constructor ``(args, kwargs)``."""
        args, kwargs, _, _ = torch_modules.copied_inputs(self.entry, self.variant, 0)
        return args, kwargs

    def forward_inputs(self) -> tuple[tuple, dict]:
        """Fresh copies of the variant's forward ``(args, kwargs)``."""
        _, _, args, kwargs = torch_modules.copied_inputs(self.entry, self.variant, 0)
        return args, kwargs

    @property
    def features(self) -> frozenset[str]:
        """Reach tags: the path, the default dtype, the refusal (or ``accepted``)."""
        return frozenset({f"path: {self.path}", f"default dtype: {str(self.default_dtype)[6:]}",
                          f"refused: {self.refused or 'accepted'}"})


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """``torch.set_default_dtype(dtype)`` inside the block, the previous one restored after it."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _entries(*, device: bool) -> list[str]:
    return [name for name in torch_modules.entry_names()
            if not torch_modules.is_lazy(name) and accepts_device(name) == device]


def _construction(entry: str, refused: str | None) -> st.SearchStrategy[Construction]:
    variants = torch_modules.catalogue()[entry].variants
    paths = PATHS if refused is None else ("skip_init",)  # the default device refuses nothing
    return st.builds(Construction, entry=st.just(entry), variant=st.sampled_from(variants),
                     path=st.sampled_from(paths),
                     default_dtype=st.sampled_from(DEFAULT_DTYPES), refused=st.just(refused))


def constructions(*, refused: bool = False) -> st.SearchStrategy[Construction]:
    """Accepted builds (``refused=False``) or refused ones (a class without a ``device``
    argument, or one that is no module), as the module docstring says."""
    if not refused:
        return st.sampled_from(_entries(device=True)).flatmap(lambda e: _construction(e, None))
    without = st.sampled_from(_entries(device=False)).flatmap(
        lambda e: _construction(e, "no-device-arg"))
    not_module = st.sampled_from(_entries(device=True)).flatmap(
        lambda e: _construction(e, "not-a-module"))
    return st.one_of(without, not_module)
