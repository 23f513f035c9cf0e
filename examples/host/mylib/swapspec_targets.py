"""mylib's targets for swapspec's conformance suite.

- ``--swapspec-target=mylib.swapspec_targets:target``: ``mylib.apply`` and
  ``mylib.functional_call``, with mylib's own conversion and layer drawn alongside swapspec's.
  Both wrap torch, so torch's declared deviations are reused; mylib adds its own.
- ``--swapspec-target=mylib.swapspec_targets:short_form``: ``mylib.call_with``, a
  functional-call-only target without ``tie_weights`` or ``strict`` (each name written on its
  own: held to torch's ``tie_weights=False`` rules), reusing torch's functional_call
  declarations by ID.
"""

from __future__ import annotations

from functools import partial

from hypothesis import strategies as st

import mylib
from swapspec.properties.declarations.torch import TORCH_DEVIATIONS
from swapspec.properties.harness.targets import Target, torch_declarations
from swapspec.properties.vocabulary import Deviation
from swapspec.strategies import Conversion, HostModule

MERGES_OVERLAPS = Deviation(
    "FC-INPUT-FORMS",
    applies=lambda example: bool(example.call.merged()),  # the property tries an overlap then
    observed="overlap-accepted",
    reason="mylib reads a tuple of dicts like a ChainMap (the later dict wins) where the spec "
           "raises ValueError. Repro: m = nn.Linear(2, 2); b = torch.zeros(2); "
           "mylib.functional_call(m, ({'bias': b}, {'bias': b}), (torch.ones(1, 2),))  # returns",
    id="mylib.fc.merges-overlaps",
)

FAKE_QUANTIZE = Conversion("mylib.fake_quantize", "lambda t: fake_quantize(t)",
                           imports="from mylib import fake_quantize", trainable=True)
GATES = st.integers(0, 3).map(
    lambda seed: HostModule(f"mylib.Gate(seed={seed})", partial(mylib.Gate, seed=seed)))

target = Target(
    "mylib", apply=mylib.apply, functional_call=mylib.functional_call,
    # torch's apply declarations, and those of APPLY-CONTRACT (where torch's _apply raises)
    deviations=(*TORCH_DEVIATIONS, *torch_declarations(properties=["APPLY-CONTRACT"]),
                MERGES_OVERLAPS),
    call_forms=("dict", "tuple-single", "tuple-disjoint"),  # overlaps merge: not a form it checks
    conversions=st.just(FAKE_QUANTIZE), modules=GATES,
)


def _call_with(module, tensors, args=(), kwargs=None):
    return mylib.call_with(module, tensors, *args, **(kwargs or {}))


short_form = Target("mylib-short", functional_call=_call_with, lacks={"tie_weights", "strict"},
                    call_forms=("dict",), modules=GATES,
                    deviations=torch_declarations(ids=["torch.fc.*"]))
