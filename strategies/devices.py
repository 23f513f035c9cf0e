"""Device detection. Nothing here imports ``torch_xla`` at import time.

``detected_devices()`` is always ``['cpu', 'meta']``, plus ``'cuda'`` when ``torch.cuda.is_available()`` and
``'xla'`` when ``importlib.util.find_spec('torch_xla')`` finds the package. :func:`xla_device` imports
``torch_xla`` on its first call only and caches the device.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch


def xla_available() -> bool:
    """True when ``torch_xla`` is importable (checked without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def detected_devices() -> tuple[str, ...]:
    """The device kinds usable here, in shrink order: cpu, meta, then cuda / xla when present."""
    out = ["cpu", "meta"]
    if torch.cuda.is_available():
        out.append("cuda")
    if xla_available():
        out.append("xla")
    return tuple(out)


@functools.cache
def xla_device() -> torch.device:
    """The XLA device, from ``torch_xla.device()``; imports ``torch_xla`` lazily on first use."""
    torch_xla = importlib.import_module("torch_xla")
    return torch_xla.device()
