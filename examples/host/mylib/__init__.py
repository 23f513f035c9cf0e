"""mylib: a tiny library with its own ``functional_call`` and ``apply`` (swapspec's example host)."""

from mylib.apply import apply
from mylib.functional import call_with, functional_call
from mylib.layers import Gate
from mylib.quant import fake_quantize
from mylib.swap import swap_call

__all__ = ["Gate", "apply", "call_with", "fake_quantize", "functional_call", "swap_call"]
