"""swapspec's reference implementation: the executable spec of ``_apply``, ``functional_call``
and ``load_state_dict``.

The module itself is a target (it has ``name``, ``apply``, ``functional_call`` and
``load_state_dict``).
"""

from swapspec.reference.apply import apply, choose_path
from swapspec.reference.flags import (
    flags,
    get_overwrite_module_params_on_conversion,
    get_swap_module_params_on_conversion,
    set_overwrite_module_params_on_conversion,
    set_swap_module_params_on_conversion,
)
from swapspec.reference.functional_call import functional_call
from swapspec.reference.load_state_dict import choose_load_path, load_state_dict
from swapspec.reference.overrides import (
    ApplyOverrideError,
    register_apply_override,
    unregister_apply_override,
)

name = "reference"

__all__ = [
    "ApplyOverrideError",
    "apply",
    "choose_load_path",
    "choose_path",
    "flags",
    "functional_call",
    "get_overwrite_module_params_on_conversion",
    "get_swap_module_params_on_conversion",
    "load_state_dict",
    "name",
    "register_apply_override",
    "set_overwrite_module_params_on_conversion",
    "set_swap_module_params_on_conversion",
    "unregister_apply_override",
]
