"""The reference's functional call with its errors reworded, for ``tests/test_expected_errors.py``.

- ``reworded``: every error keeps its type and the keys it names, in other words
  (``"mylib could not call: <torch's message>"``). Follows the spec: it is not held to
  torch's wording.
- ``keyless``: every error keeps its type but says only ``"bad input"``. Breaks the rules
  whose errors name keys (FC-STRICT: ``strict-error``).
"""

from __future__ import annotations

from types import SimpleNamespace

from swapspec import reference


def _rewording(say):
    def functional_call(module, tensors, args=(), kwargs=None, *, tie_weights=True, strict=False):
        try:
            return reference.functional_call(module, tensors, args, kwargs,
                                             tie_weights=tie_weights, strict=strict)
        except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as e:
            if type(e).__module__ != "builtins":
                raise  # forward's own errors (ForwardError) pass unchanged
            raise type(e)(say(e)) from None
    return functional_call


reworded = SimpleNamespace(name="reworded", functional_call=_rewording(
    lambda e: f"mylib could not call: {e.args[0] if e.args else e}"))
keyless = SimpleNamespace(name="keyless", functional_call=_rewording(lambda e: "bad input"))
