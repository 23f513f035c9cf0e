"""Deviations torch shows only on XLA device moves (torch_xla on the CPU backend), as data."""

from __future__ import annotations

from properties.deviations import Deviation

XLA_DEVIATIONS: tuple[Deviation, ...] = ()
