"""``--swapspec-target=mylib.swapspec_quant:target``: torch's own ``apply`` (and functional
call, load_state_dict and methods, with all of torch's declarations: ``builtin_target``) drawing
mylib's quantized material: ``QLinear`` (a layer whose weight is a ``QWeight``), ``quantize``
(a per-tensor conversion), ``quantize_dequantize`` (a per-tensor conversion that keeps a
module trainable: ``trainable=True``) and ``quantize_`` (a module conversion), each with its contract."""

from __future__ import annotations

import dataclasses
from functools import partial

import torch
from hypothesis import strategies as st

from mylib.qweight import (
    QLinear,
    QWeight,
    TinyMLP,
    dequantize,
    linear_weight_names,
    qdq_convertible,
    quantizable,
    refused,
)
from swapspec.properties.harness.targets import builtin_target
from swapspec.strategies import Contract, Conversion, HostModule, ModuleConversion


def half_a_step(t: torch.Tensor) -> float:
    """The most a value may move: half the largest row's scale step (``amax / 127 / 2``)."""
    if t.numel() == 0 or t.device.type == "meta":
        return 0.0
    return float(t.detach().abs().amax()) / 254 * 1.001


QUANTIZED = Contract("a QWeight of the input's dtype and device, values within half a scale "
                     "step through mylib's dequantize; non-finite values refused",
                     converts=quantizable, cls=QWeight, atol=half_a_step,
                     dequantize=dequantize, raises=refused)
QUANTIZE = Conversion("mylib.quantize", "lambda t: quantize(t)",
                      imports="from mylib.qweight import quantize", contract=QUANTIZED)
QDQ = Contract("a plain tensor of the input's dtype, device and shape, values within half a "
               "grid step", converts=qdq_convertible, atol=half_a_step)
QUANTIZE_DEQUANTIZE = Conversion("mylib.quantize_dequantize", "lambda t: quantize_dequantize(t)",
                                 imports="from mylib.qweight import quantize_dequantize",
                                 contract=QDQ, trainable=True)
QUANTIZE_ = ModuleConversion("mylib.quantize_", "lambda m: quantize_(m)", QUANTIZED,
                             imports="from mylib.qweight import quantize_", rebinds=True,
                             refuse="lambda t: t.fill_(float('nan'))",
                             selects=linear_weight_names)
Q_LINEARS = st.sampled_from([
    HostModule("mylib.QLinear(seed=0)", partial(QLinear, seed=0)),
    HostModule("mylib.TinyMLP(seed=0)", partial(TinyMLP, seed=0)),
    HostModule("mylib.TinyMLP(seed=1, tied=True)", partial(TinyMLP, seed=1, tied=True)),
])

target = dataclasses.replace(builtin_target("torch"), name="mylib-quant", modules=Q_LINEARS,
                             conversions=st.sampled_from([QUANTIZE, QUANTIZE_DEQUANTIZE]),
                             module_conversions=st.just(QUANTIZE_))
