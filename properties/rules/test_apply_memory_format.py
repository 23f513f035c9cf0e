"""Properties of ``torch.nn.utils``' layout conversions of convolution weights
(``convert_conv2d_weight_memory_format``, ``convert_conv3d_weight_memory_format``) on modules the
target converted. One rule per test.

Each property draws a tree with a convolution of the drawn rank (``module_trees(needs=
('conv2d',))`` or ``('conv3d',)``), converts it with the target, then converts its convolutions'
weights to a memory format with the target's method (torch's function for ``torch``, the
reference's for a target without one): what users do before
running a model in channels-last after ``model.half()`` or ``model.to(device)``.

Origin: the documentation of ``torch.nn.utils.convert_conv2d_weight_memory_format`` (it changes
the memory format of every ``nn.Conv2d``/``nn.ConvTranspose2d`` weight of the tree, not the
semantics of its dimensions) and ``convert_conv3d_weight_memory_format``.
"""

from __future__ import annotations

from functools import partial

import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st
from torch import Tensor, nn

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.repro import apply_repro
from swapspec.properties.harness.target_calls import run_converted
from swapspec.properties.models.examples import Example, dense_leaves
from swapspec.properties.models.invariants import input_for
from swapspec.properties.models.load_examples import changes, snapshot_for_load
from swapspec.properties.models.outcomes import attempt, seeded_forward
from swapspec.reference.methods import CONVOLUTIONS_2D, CONVOLUTIONS_3D
from swapspec.strategies import Conversion, flag_settings, module_trees
from swapspec.strategies.conversions import modules_with_conversions
from swapspec.strategies.memory_formats import ConvFormat, conv_formats

CONVOLUTIONS = {2: CONVOLUTIONS_2D, 3: CONVOLUTIONS_3D}
# Hooks that count and change nothing; a reparametrized weight is no slot of its module.
TREE_OPTIONS = {"lazy": False, "decoration_kinds": ("tensor-hooks", "module-hooks")}


def _values_defined(conversion: Conversion) -> bool:
    """Not ``to_empty``: its values are uninitialized memory, which the rules compare."""
    return not conversion.name.startswith("to_empty")


converted = {rank: modules_with_conversions(module_trees(**TREE_OPTIONS, needs=(f"conv{rank}d",)),
                                            ["cpu"], where=_values_defined)
             for rank in CONVOLUTIONS}

# An example builds, converts and runs a tree twice: a quarter of the profile's examples keeps the
# property within the suite's time budget.
EXAMPLES_DIVISOR = 4


def conv_weights(module: nn.Module, rank: int) -> dict[int, Tensor]:
    """The weight of every convolution over ``rank`` spatial dimensions, by object id."""
    return {id(m.weight): m.weight for m in module.modules()
            if isinstance(m, CONVOLUTIONS[rank]) and isinstance(m.weight, Tensor)}


def takes_layout(weight: Tensor, memory_format: torch.memory_format) -> bool:
    """Whether a copy of ``weight`` in ``memory_format`` computes: it has strides (not sparse)
    and its class implements the copy (a host's tensor class may implement only its forward's
    ops)."""
    return weight.layout == torch.strided and attempt(
        lambda: weight.detach().clone(memory_format=memory_format)).error is None


def layouts(weights: dict[int, Tensor]) -> dict[int, list[tuple[int, ...]]]:
    """The strides of each weight and of every plain tensor it computes with (none for a
    tensor without strides)."""
    return {key: [x.stride() if x.layout == torch.strided else () for x in (w, *dense_leaves(w))]
            for key, w in weights.items()}


def laid_out(t: Tensor, memory_format: torch.memory_format) -> bool:
    """Whether ``t`` and every plain tensor it computes with (a wrapper subclass's inner ones)
    are contiguous in ``memory_format``."""
    return all(x.is_contiguous(memory_format=memory_format) for x in {t, *dense_leaves(t)})


@spec_property("APPLY-CONV-MEMORY-FORMAT", examples_divisor=EXAMPLES_DIVISOR)
@given(data=st.data())
def test_conv_weight_memory_format_after_apply(target, data):
    """After the target converts a module, converting its convolutions' weights to a memory
    format (``convert_conv2d_weight_memory_format``, ``convert_conv3d_weight_memory_format``)
    leaves each weight of that rank the same object of the same class, ``requires_grad``, grad
    and values, laid out in the format, it and every tensor it computes with (each inner tensor
    of a wrapper subclass); every other tensor, slot and grad of the module is as it was, and
    forward runs where it ran. A format the weights cannot take (the other rank's channels-last,
    ``preserve_format``; a sparse weight, a class that cannot copy itself) raises and leaves the
    module as it was.

    Origin: ``torch.nn.utils.convert_conv2d_weight_memory_format``'s documentation; swapspec spec
    (the layout is the tensor the convolution computes with, a wrapper subclass's inner tensors
    too; bad input leaves the module as it was; the call is the target's method, torch's
    function for ``torch``).
    """
    conv_format = data.draw(conv_formats(), label="memory format")
    module, conversion = data.draw(converted[conv_format.rank], label="module and conversion")
    for feature in sorted(conv_format.features):
        event(f"call: {feature}")
    example = Example(module, conversion=conversion, flags=data.draw(flag_settings(), label="flags"),
                      method=conv_format)
    check = Checker("APPLY-CONV-MEMORY-FORMAT", target, example)
    assume(run_converted(target, example).error is None)
    x = input_for(module)
    output = seeded_forward(module, x)
    weights = conv_weights(module, conv_format.rank)
    fits = conv_format.fits and all(takes_layout(w, conv_format.memory_format)
                                    for w in weights.values())
    before, strides = snapshot_for_load(module), layouts(weights)
    convert = target.method(conv_format.method)
    call = attempt(lambda: convert(module, conv_format.memory_format, overwrite=False, swap=False))
    event(f"call: {'raised' if call.error else 'returned'}")
    if not fits:
        check.that(call.error is not None, "refused",
                   f"{conv_format.memory_format} returned on weights of rank "
                   f"{conv_format.rank + 2} ({sorted({str(w.layout) for w in weights.values()})})")
    elif call.error is not None:
        check.that(False, "raised", f"the conversion raised {call.error!r}")
    if call.error is not None:
        changed = changes(before, module) + (["a weight's layout"] if layouts(weights) != strides else [])
        check.that(not changed, "changed",
                   f"the conversion raised {call.error!r} and changed the module: {changed[:4]}")
    else:
        _check_converted(check, module, conv_format, weights, before)
        after = seeded_forward(module, x)
        check.that(after.error is None or output.error is not None, "forward",
                   f"forward raises after the conversion: {after.error!r}")
    check.verdict(_repro(example, target, conv_format))


def _check_converted(check: Checker, module: nn.Module, conv_format: ConvFormat,
                     weights: dict[int, Tensor], before: object) -> None:
    """The clauses of a conversion that returned: objects, kept state, layout."""
    now = conv_weights(module, conv_format.rank)
    check.that(now.keys() == weights.keys(), "object",
               "a convolution's weight is another object after the conversion")
    names = {n for n, t in before.slots.items() if id(t) in weights}
    kept = [c for c in changes(before, module)
            if not (c.split(":")[0] in names and c.endswith("TensorImpl replaced"))]
    check.that(not kept, "kept", f"the conversion changed more than the weights' layout: {kept[:4]}")
    if conv_format.fits:
        wrong = sorted(n for n in names if not laid_out(before.slots[n], conv_format.memory_format))
        check.that(not wrong, "layout",
                   f"{wrong} (or a tensor it computes with) is not laid out in "
                   f"{conv_format.memory_format}")


def _repro(example: Example, target, conv_format: ConvFormat):
    fmt = str(conv_format.memory_format)
    kinds = ", ".join(f"torch.nn.{k.__name__}" for k in CONVOLUTIONS[conv_format.rank])
    layout = (f"[[x.is_contiguous(memory_format={fmt}) for x in "
              f"[w, *[getattr(w, n) for n in (w.__tensor_flatten__()[0] "
              f"if hasattr(w, '__tensor_flatten__') else [])]]] "
              f"for w in (m.weight for m in module.modules() if isinstance(m, ({kinds},)))]")
    return partial(apply_repro, example, target, observe={"layout": layout}, extra=[
        "try:",
        f"    target_method(module, {conv_format.method!r}, False, False, {fmt})",
        "except Exception as e:",
        "    print('raised', type(e).__name__, e)"])
