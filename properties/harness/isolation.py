"""Global-state isolation: every property test (and every test of swapspec's own suite) leaves
torch's and the reference's global state as it found it, or fails."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import pytest
import torch
import torch.nn.modules.module as module_globals

from swapspec import reference
from swapspec.reference import overrides as reference_overrides


@contextlib.contextmanager
def isolated_global_state() -> Iterator[None]:
    """Restore torch's and the reference's global state on exit, even on failure.

    Covers ``torch.__future__``'s two flags, the reference's flags and ``_apply`` override
    registrations, the default dtype, grad mode, torch's global module hooks (forward, backward
    and registration: ``GLOBAL_HOOK_TABLES``) and the CPU RNG (torch's and Python's). A body
    that leaves them changed fails (``pytest.fail``) after they are restored.
    """
    saved = _global_state()
    rng = torch.get_rng_state()
    py_rng = random.getstate()
    try:
        yield
    finally:
        leaked = {k: v for k, v in _global_state().items() if saved[k] != v}
        _restore(saved)
        torch.set_rng_state(rng)
        random.setstate(py_rng)
    if leaked:
        pytest.fail(f"test leaked global state (now restored): {sorted(leaked)}")


# torch's process-wide module hook tables (``torch.nn.modules.module``), which
# ``register_module_*_hook`` fill and ``Module._call_impl`` and the registration methods read.
GLOBAL_HOOK_TABLES = tuple(name for name in (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_with_kwargs",
    "_global_forward_hooks_always_called", "_global_backward_pre_hooks", "_global_backward_hooks",
    "_global_buffer_registration_hooks", "_global_module_registration_hooks",
    "_global_parameter_registration_hooks") if hasattr(module_globals, name))


# Whether the global backward hooks are full ones (None: neither kind registered yet). torch sets
# it at a registration and never resets it, not even when the last hook is removed, so a process
# that once registered one kind refuses the other kind for good.
GLOBAL_BACKWARD_KIND = "_global_is_full_backward_hook"


def global_module_hooks() -> tuple[tuple[str, object], ...]:
    """Each global module hook table's entries, in order, and the global backward hooks' kind."""
    return (*((name, tuple(getattr(module_globals, name).items()))
              for name in GLOBAL_HOOK_TABLES),
            (GLOBAL_BACKWARD_KIND, getattr(module_globals, GLOBAL_BACKWARD_KIND, None)))


def restore_global_module_hooks(saved: tuple[tuple[str, object], ...]) -> None:
    """Put back what ``global_module_hooks`` returned."""
    for name, entries in saved:
        if name == GLOBAL_BACKWARD_KIND:
            setattr(module_globals, name, entries)
            continue
        table = getattr(module_globals, name)
        table.clear()
        table.update(entries)


def _global_state() -> dict[str, object]:
    future = torch.__future__
    return {
        "torch overwrite flag": future.get_overwrite_module_params_on_conversion(),
        "torch swap flag": future.get_swap_module_params_on_conversion(),
        "reference overwrite flag": reference.get_overwrite_module_params_on_conversion(),
        "reference swap flag": reference.get_swap_module_params_on_conversion(),
        "reference apply overrides": reference_overrides.registered_apply_overrides(),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "global module hooks": global_module_hooks(),
    }


def _restore(state: dict[str, object]) -> None:
    future = torch.__future__
    future.set_overwrite_module_params_on_conversion(state["torch overwrite flag"])
    future.set_swap_module_params_on_conversion(state["torch swap flag"])
    reference.set_overwrite_module_params_on_conversion(state["reference overwrite flag"])
    reference.set_swap_module_params_on_conversion(state["reference swap flag"])
    reference_overrides.restore_registered_apply_overrides(state["reference apply overrides"])
    torch.set_default_dtype(state["default dtype"])
    torch.set_grad_enabled(state["grad mode"])
    restore_global_module_hooks(state["global module hooks"])
