"""swapspec's reference implementation: the executable spec of ``_apply``, ``functional_call``
and ``load_state_dict``.

The module itself is a target (it has ``name``, ``apply``, ``functional_call``,
``load_state_dict``, ``stack_module_state`` and ``methods``: ``nn.Module``'s public methods ``to``,
``half``, ``to_empty``... built on ``apply``, also exported here as ``reference.to(module, ...)``;
``float`` and ``type`` are left out of ``__all__``, so a star import keeps the builtins).

Rules that hold after every operation (``apply`` and the methods built on it, ``functional_call``,
``load_state_dict``), whatever came before:

1. Raising changes nothing (``INV-RAISE-UNCHANGED``). A call that raises leaves everything as it
   was: the module, every other module, the caller's tensors and dicts, and the process state
   (the flags, the default dtype, grad mode).
2. Success leaves a working module (``INV-WORKING``). Whatever worked before still works:
   forward, backward, ``state_dict``, the next operation. The module behaves as one built fresh
   in the resulting state would.
3. Kinds are kept (``INV-KINDS``). Parameters stay parameters (class, subclass, instance
   attributes, ``requires_grad``; ``requires_grad_`` sets the last, and ``load_state_dict`` with
   ``assign`` gives the value's class, torch's documented rule). Buffers stay buffers,
   persistent or not. Children stay children. A module keeps its class unless torch's docs say
   when it changes (a lazy module becomes its ``cls_to_become`` in its first forward).
4. Independence (``INV-INDEPENDENT``). Modules that share no tensors never affect each other,
   whatever is done to one of them.
5. Strict means exact (``INV-STRICT-EXACT``). Every key or name that does not address a slot is
   reported: in ``load_state_dict``'s ``unexpected_keys`` and its strict error, and in
   ``functional_call``'s strict error.

The suite checks them after every one-shot property and every step of every sequence
(``swapspec.properties.models.invariants``).
"""

from swapspec.reference import methods, registration
from swapspec.reference.accessor import NamedMemberAccessor
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
    add_module,
    bfloat16,
    convert_conv2d_weight_memory_format,
    convert_conv3d_weight_memory_format,
    cpu,
    cuda,
    double,
    half,
    prune_remove,
    register_buffer,
    register_module,
    register_parameter,
    remove_spectral_norm,
    remove_weight_norm,
    requires_grad_,
    set_submodule,
    share_memory,
    skip_init,
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
from swapspec.reference.registration import swap_tensors
from swapspec.reference.stacking import stack_module_state

name = "reference"
accessor = NamedMemberAccessor  # NamedMemberAccessor(module): the spec's accessor

__all__ = [
    "ApplyOverrideError",
    "Methods",
    "NamedMemberAccessor",
    "accessor",
    "add_module",
    "apply",
    "bfloat16",
    "choose_load_path",
    "choose_path",
    "convert_conv2d_weight_memory_format",
    "convert_conv3d_weight_memory_format",
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
    "prune_remove",
    "register_apply_override",
    "register_buffer",
    "register_module",
    "register_parameter",
    "registration",
    "remove_spectral_norm",
    "remove_weight_norm",
    "requires_grad_",
    "set_overwrite_module_params_on_conversion",
    "set_submodule",
    "set_swap_module_params_on_conversion",
    "share_memory",
    "skip_init",
    "stack_module_state",
    "swap_tensors",
    "to",
    "to_empty",
    "unregister_apply_override",
    "zero_grad",
]
