"""Declared deviations of torch's ``nn.Module.load_state_dict`` from the ``LOAD-`` rules.

Each has a minimal plain-torch repro in ``reason``, the torch versions seen and the clauses.
"""

from __future__ import annotations

from swapspec.properties.deviations import Deviation

LOAD_DEVIATIONS: tuple[Deviation, ...] = ()
