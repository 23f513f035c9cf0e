"""The ``swapspec_property`` marker: how a test becomes the check of one property, and how the
plugin recognises one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings


def spec_property(property_id: str, *, suppress: tuple[HealthCheck, ...] = (),
                  examples_divisor: int = 1) -> Callable:
    """Mark a test as the check of one property, for the report and deviation lookup.

    Also relaxes what a host profile may set that does not fit torch: the deadline
    (torch's first calls are slow and machines are noisy), the too-slow and data-too-large
    health checks, and any in ``suppress``; and always prints a failure's
    ``@reproduce_failure`` blob, so a random run's failure can be replayed exactly.
    ``examples_divisor`` runs that share of the loaded profile's ``max_examples`` (at least
    one), for a property whose every example builds and copies whole modules.
    """
    share = {} if examples_divisor == 1 else {
        "max_examples": max(1, settings().max_examples // examples_divisor)}
    relax = settings(deadline=None, print_blob=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            *suppress], **share)

    def mark(test: Callable) -> Callable:
        return pytest.mark.swapspec_property(property_id)(relax(test))

    return mark


def is_property_test(node: pytest.Item | pytest.Metafunc) -> bool:
    """Tests the plugin acts on: those marked ``swapspec_property``."""
    definition = getattr(node, "definition", node)
    return definition.get_closest_marker("swapspec_property") is not None


def property_id(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("swapspec_property")
    return marker.args[0] if marker else None


def per_target_cases(argname: str, cases_of: Callable[[Any], list[tuple[str, Any]]]) -> Callable:
    """Parametrize a property test by ``argname`` with cases that depend on its target: the
    plugin makes one item per target and ``(id, value)`` of ``cases_of(target)``, its id
    ``TARGET-ID`` (a target without a case gets no item, rather than a skip)."""
    return pytest.mark.swapspec_per_target(argname, cases_of)
