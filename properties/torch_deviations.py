"""Deviations of the ``torch`` and ``torch-stateless`` targets from the spec, as data.

Each entry was observed with the suite, reduced to a minimal repro, and is kept in
its ``reason``. A declaration that stops being observed fails the run (stale).
"""

from __future__ import annotations

from properties.deviations import Deviation

TORCH_DEVIATIONS: tuple[Deviation, ...] = ()
