"""Unit tests for ``reference.flags``: the two conversion flags and the ``flags`` context manager."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swapspec import reference
from tests.helpers_modules import linear

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _restore_flags():
    """Every test starts from both flags off and leaves the reference's and torch's flags as found."""
    saved = (
        reference.get_overwrite_module_params_on_conversion(),
        reference.get_swap_module_params_on_conversion(),
        torch.__future__.get_overwrite_module_params_on_conversion(),
        torch.__future__.get_swap_module_params_on_conversion(),
    )
    reference.set_overwrite_module_params_on_conversion(False)
    reference.set_swap_module_params_on_conversion(False)
    try:
        yield
    finally:
        reference.set_overwrite_module_params_on_conversion(saved[0])
        reference.set_swap_module_params_on_conversion(saved[1])
        torch.__future__.set_overwrite_module_params_on_conversion(saved[2])
        torch.__future__.set_swap_module_params_on_conversion(saved[3])


def _state() -> tuple[bool, bool]:
    return (
        reference.get_overwrite_module_params_on_conversion(),
        reference.get_swap_module_params_on_conversion(),
    )


def test_both_flags_default_false_in_fresh_process():
    """Flags: both flags are False in a freshly imported reference."""
    code = (
        "from swapspec import reference as r; "
        "print(r.get_overwrite_module_params_on_conversion(), "
        "r.get_swap_module_params_on_conversion())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("value", [True, False])
def test_set_overwrite_leaves_swap_alone(value):
    """Flags: setting overwrite changes overwrite only."""
    reference.set_swap_module_params_on_conversion(not value)
    reference.set_overwrite_module_params_on_conversion(value)
    assert _state() == (value, not value)


@pytest.mark.parametrize("value", [True, False])
def test_set_swap_leaves_overwrite_alone(value):
    """Flags: setting swap changes swap only."""
    reference.set_overwrite_module_params_on_conversion(not value)
    reference.set_swap_module_params_on_conversion(value)
    assert _state() == (not value, value)


@pytest.mark.parametrize("initial", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("inside", [(True, True), (False, False), (True, False), (False, True)])
def test_flags_sets_inside_and_restores_previous(initial, inside):
    """Flags: ``flags(...)`` sets both for the block and restores the previous values on exit."""
    reference.set_overwrite_module_params_on_conversion(initial[0])
    reference.set_swap_module_params_on_conversion(initial[1])
    with reference.flags(overwrite=inside[0], swap=inside[1]):
        assert _state() == inside
    assert _state() == initial


def test_flags_none_leaves_that_flag_untouched():
    """Flags: a flag not given to ``flags(...)`` keeps its current value inside the block."""
    reference.set_swap_module_params_on_conversion(True)
    with reference.flags(overwrite=True):
        assert _state() == (True, True)
    assert _state() == (False, True)
    reference.set_overwrite_module_params_on_conversion(True)
    with reference.flags(swap=False):
        assert _state() == (True, False)
    assert _state() == (True, True)


def test_flags_restores_on_exception_and_propagates_it():
    """Flags: the previous values come back when the block raises; the error propagates unchanged."""
    reference.set_overwrite_module_params_on_conversion(True)
    error = KeyError("inside")
    with pytest.raises(KeyError) as info, reference.flags(overwrite=False, swap=True):
        assert _state() == (False, True)
        raise error
    assert info.value is error
    assert _state() == (True, False)


def test_flags_restores_on_base_exception():
    """Flags: the previous values come back when the block raises a BaseException."""
    with pytest.raises(KeyboardInterrupt), reference.flags(overwrite=True, swap=True):
        raise KeyboardInterrupt
    assert _state() == (False, False)


def test_flags_restores_values_set_inside_the_block():
    """Flags: setters called inside the block are undone on exit too."""
    with reference.flags(overwrite=True):
        reference.set_swap_module_params_on_conversion(True)
        reference.set_overwrite_module_params_on_conversion(False)
    assert _state() == (False, False)


def test_nested_flags_restore_level_by_level():
    """Flags: nested blocks each restore what was there when they were entered."""
    with reference.flags(overwrite=True):
        with reference.flags(swap=True):
            assert _state() == (True, True)
            with reference.flags(overwrite=False):
                assert _state() == (False, True)
            assert _state() == (True, True)
        assert _state() == (True, False)
    assert _state() == (False, False)


def test_reference_flags_independent_of_torch_future():
    """Flags: the reference's flags and ``torch.__future__``'s are separate state."""
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    torch.__future__.set_swap_module_params_on_conversion(True)
    assert _state() == (False, False)
    torch.__future__.set_overwrite_module_params_on_conversion(False)
    torch.__future__.set_swap_module_params_on_conversion(False)
    with reference.flags(overwrite=True, swap=True):
        assert not torch.__future__.get_overwrite_module_params_on_conversion()
        assert not torch.__future__.get_swap_module_params_on_conversion()


def _path_of(overwrite=None, swap=None) -> str:
    """Run ``reference.apply(..., double)`` and name the path the weight took."""
    lin = linear(2, 2)
    w, cdata = lin.weight, lin.weight._cdata
    reference.apply(lin, lambda t: t.double(), overwrite=overwrite, swap=swap)
    assert lin.weight.dtype == torch.float64
    if lin.weight is not w:
        return "overwrite"
    return "set_data" if lin.weight._cdata == cdata else "swap"


@pytest.mark.parametrize(
    ("overwrite", "swap", "path"),
    [
        (False, False, "set_data"),
        (True, False, "overwrite"),
        (False, True, "swap"),
        (True, True, "swap"),
    ],
)
def test_apply_reads_none_flags_from_reference_state(overwrite, swap, path):
    """Rule 1: ``apply``'s flags left as None are read from ``reference.flags``."""
    with reference.flags(overwrite=overwrite, swap=swap):
        assert _path_of() == path


@pytest.mark.parametrize(
    ("overwrite", "swap", "path"),
    [(False, False, "set_data"), (True, False, "overwrite"), (False, True, "swap")],
)
def test_apply_explicit_flags_override_state(overwrite, swap, path):
    """Rule 1: explicit ``overwrite``/``swap`` arguments win over the global state."""
    with reference.flags(overwrite=not overwrite, swap=not swap):
        assert _path_of(overwrite=overwrite, swap=swap) == path


@pytest.mark.parametrize(("overwrite", "swap"), [(True, False), (False, True), (True, True)])
def test_apply_ignores_torch_future_flags(overwrite, swap):
    """Rule 1: ``apply`` reads the reference's flags, not ``torch.__future__``'s."""
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    torch.__future__.set_swap_module_params_on_conversion(swap)
    assert _path_of() == "set_data"
