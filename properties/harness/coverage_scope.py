"""What ``--swapspec-coverage`` measures for the ``torch`` and ``torch-stateless`` targets: torch's
functions of the family the suite specifies, as data.

Each entry is ``(file, function)``: the file relative to torch's package folder, and a function's
qualified name in it (``Module._apply``), or ``*`` for every function of the file. A function's
statements are those of its body, nested functions included; its ``def`` line and decorators run
at import, so they are left out. Overload stubs (``@overload``) are left out too.

Statements that cannot run on a CPU-only machine are listed, each with its reason, in
``coverage_exclusions.txt`` beside this file.
"""

from __future__ import annotations

MODULE = "nn/modules/module.py"
RNN = "nn/modules/rnn.py"

TORCH_SCOPE: tuple[tuple[str, str], ...] = (
    # Module._apply and every public conversion built on it.
    (MODULE, "Module._apply"),
    *((MODULE, f"Module.{name}") for name in (
        "to", "half", "float", "double", "bfloat16", "type", "cpu", "cuda", "ipu", "xpu", "mtia",
        "share_memory", "to_empty", "requires_grad_", "zero_grad")),
    # load_state_dict and state_dict.
    (MODULE, "Module.load_state_dict"),
    (MODULE, "Module._load_from_state_dict"),
    (MODULE, "Module.state_dict"),
    (MODULE, "Module._save_to_state_dict"),
    # Attribute access and registration.
    *((MODULE, f"Module.{name}") for name in (
        "__setattr__", "__getattr__", "__delattr__", "register_parameter", "register_buffer",
        "register_module", "add_module")),
    # torch.func.functional_call and the stateless machinery under it.
    ("_functorch/functional_call.py", "functional_call"),
    ("nn/utils/stateless.py", "*"),
    ("nn/utils/_named_member_accessor.py", "*"),
    ("nn/utils/parametrize.py", "*"),
    ("nn/modules/lazy.py", "*"),
    # The RNN's flat weights, which _apply and load_state_dict keep in step.
    *((RNN, f"RNNBase.{name}") for name in (
        "_init_flat_weights", "__setattr__", "flatten_parameters", "_apply",
        "_weights_have_changed", "_update_flat_weights", "__getstate__", "__setstate__",
        "all_weights", "_replicate_for_data_parallel")),
    # Swapping tensors (the swap flag's path).
    ("utils/__init__.py", "swap_tensors"),
    ("_tensor.py", "Tensor.module_load"),
    ("nn/utils/convert_parameters.py", "*"),
)
