"""A planted target whose ``apply`` kills the interpreter (a segfault), for the crash-isolation test."""

from __future__ import annotations

import ctypes

from swapspec import reference

name = "crashing"
functional_call = reference.functional_call


def apply(module, fn, *, overwrite, swap, recurse=True):
    """Segfault, as a broken C++ kernel would."""
    ctypes.string_at(0)
    return module
