"""swapspec's reference implementation: the executable spec of ``_apply``, ``functional_call``
and ``load_state_dict``.

The module itself is a target (it has ``name``, ``apply``, ``functional_call``,
``load_state_dict`` and ``methods``: ``nn.Module``'s public methods ``to``, ``half``,
``to_empty``... built on ``apply``, also exported here as ``reference.to(module, ...)``;
``float`` and ``type`` are left out of ``__all__``, so a star import keeps the builtins).
"""

from swapspec.reference import methods
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
from swapspec.reference.methods import (
    Methods,
    bfloat16,
    cpu,
    cuda,
    double,
    half,
    requires_grad_,
    share_memory,
    to,
    to_empty,
    zero_grad,
)
from swapspec.reference.methods import (
    float as float,  # reference.float(module); not in __all__ (a star import keeps the builtin)
)
from swapspec.reference.methods import (
    type as type,  # reference.type(module, dst_type); likewise
)
from swapspec.reference.overrides import (
    ApplyOverrideError,
    register_apply_override,
    unregister_apply_override,
)

name = "reference"

__all__ = [
    "ApplyOverrideError",
    "Methods",
    "apply",
    "bfloat16",
    "choose_load_path",
    "choose_path",
    "cpu",
    "cuda",
    "double",
    "flags",
    "functional_call",
    "get_overwrite_module_params_on_conversion",
    "get_swap_module_params_on_conversion",
    "half",
    "load_state_dict",
    "methods",
    "name",
    "register_apply_override",
    "requires_grad_",
    "set_overwrite_module_params_on_conversion",
    "set_swap_module_params_on_conversion",
    "share_memory",
    "to",
    "to_empty",
    "unregister_apply_override",
    "zero_grad",
]
