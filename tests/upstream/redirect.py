"""pytest plugin: ``nn.Module.load_state_dict`` is ``reference.load_state_dict`` for the session.

Load it with ``-p tests.upstream.redirect``. The swap flag the upstream tests set is
``torch.__future__``'s, so the redirect passes it as ``swap=``. ``EXCLUDED`` lists the upstream
tests about what the reference does not model, each with the reason; they are deselected.
Of ``test/test_nn.py`` only the load tests run (``is_load_test``); the rest of it is about
other things and is deselected.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from swapspec import reference

EXCLUDED = {
    "test_register_state_dict_pre_hook_backward_compat":
        "about state_dict() pre-hooks and pickling a whole module with torch.load, not "
        "load_state_dict; it fails on plain torch 2.13 too (torch.load's weights_only default)",
}


def reference_load_state_dict(self: nn.Module, state_dict, strict: bool = True,
                              assign: bool = False):
    """``Module.load_state_dict``'s signature, answered by the reference."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    return reference.load_state_dict(self, state_dict, strict=strict, assign=assign, swap=swap)


def excluded_reason(name: str) -> str | None:
    """The reason an upstream test is left out (its name without the parametrization suffix)."""
    return next((why for base, why in EXCLUDED.items() if name.startswith(base)), None)


def is_load_test(item: pytest.Item) -> bool:
    """A test of ``test/test_nn.py`` about ``load_state_dict``: its name says so, or its own
    code calls it. Every test of the other upstream files counts."""
    if Path(str(item.fspath)).name != "test_nn.py" or "load_state_dict" in item.name:
        return True
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return ".load_state_dict(" in source


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        (drop if excluded_reason(item.name) or not is_load_test(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _redirected() -> Iterator[None]:
    """Every test sees the reference as ``nn.Module.load_state_dict``; torch's comes back after."""
    original = nn.Module.load_state_dict
    nn.Module.load_state_dict = reference_load_state_dict  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.load_state_dict = original  # type: ignore[method-assign]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return ["nn.Module.load_state_dict -> swapspec.reference.load_state_dict",
            *(f"excluded {name}*: {why}" for name, why in EXCLUDED.items())]
