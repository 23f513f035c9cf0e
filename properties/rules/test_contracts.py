"""APPLY-CONTRACT: a conversion is judged by its contract, not by its own function's output.

A conversion with a contract (``strategies.contracts.Contract``: the public methods' implied
conversions carry theirs, a host's conversion may state one) is applied by the target, as
``_apply(fn)`` or as the public method call; each tensor after it must meet the contract against
the tensor before it, and a conversion that raises where its contract accepts every tensor of the
module breaks it.
"""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from swapspec.properties.harness.checker import Checker
from swapspec.properties.harness.marking import spec_property
from swapspec.properties.harness.plugged import CURRENT
from swapspec.properties.harness.repro import asserting_repro, converted_body
from swapspec.properties.harness.target_calls import run_converted
from swapspec.properties.models.apply_state import WORLD_CHANCE, snapshot_for_apply
from swapspec.properties.models.examples import Example, named_tensors
from swapspec.properties.rules.contract_checks import before_copies, check_contract
from swapspec.strategies import flag_settings, module_trees
from swapspec.strategies.contracts import raising_allowed
from swapspec.strategies.method_calls import modules_with_method_conversions
from swapspec.strategies.trees import WRAPPERS

trees = module_trees(wrappers=WRAPPERS, world_chance=WORLD_CHANCE)
by_method = modules_with_method_conversions(trees, where=lambda c: c.contract is not None)


@st.composite
def _with_contract(draw, base):
    """``(module, conversion)``: a public method's conversion, or one chance in two a conversion
    of the running target's own that states a contract (drawn on a module of ``trees``)."""
    module, conversion = draw(base)
    own = getattr(CURRENT.get(), "conversions", None)
    if own is not None and draw(st.booleans()):
        conversion = draw(own)
        assume(conversion.contract is not None)  # a host conversion without one: nothing to hold
    return module, conversion


converted = _with_contract(by_method)


def _repro(example: Example, target, violations) -> str:
    asserts = [(v.code, v.message) for v in violations if v.code]
    return asserting_repro(example, target, converted_body(example), asserts)


@spec_property("APPLY-CONTRACT", examples_divisor=2)
@given(case=converted, flags=flag_settings())
def test_apply_meets_the_conversions_contract(target, case, flags):
    """Every tensor a conversion with a contract converts meets the contract, and the conversion raises only where its contract lets it.

    The contract states the result's dtype, device and class, and whether values survive and
    within what tolerance, read through the library's own dequantization; it is checked against
    each tensor as it was before, not against what the conversion's function returns (an oracle
    that trusts the function passes whatever it does). A conversion that raises on a module whose
    tensors its contract all accepts breaks the contract. Origin: the contracts of ``half()``,
    ``to('meta')``, ``to_empty``... and swapspec issue 34 (a quantization library whose
    conversions the function-trusting oracle could not fault).
    """
    module, conversion = case
    snap = snapshot_for_apply(module, conversion.make_fn, conversion.recurse, flags)
    assume(not snap.swap_refused)  # a refused swap is APPLY-REFUSED-SWAP's business
    example = Example(module, conversion=conversion, flags=flags, recurse=conversion.recurse)
    check = Checker("APPLY-CONTRACT", target, example)
    contract = conversion.contract
    before = before_copies(module)
    # a conversion that raises where its contract lets it: what the target does then is
    # APPLY-ATOMIC's business, nothing to hold to the contract
    assume(snap.expected_error is None or not raising_allowed(contract, list(before.values())))
    outcome = run_converted(target, example)
    if outcome.error is not None:
        check.that(raising_allowed(contract, list(before.values())), "raised",
                   f"the conversion raised {type(outcome.error).__name__}: {outcome.error} where "
                   f"its contract ({contract.text}) accepts every tensor of the module",
                   code="error is None")
    else:
        check_contract(check, contract, before, named_tensors(module))
    check.verdict(lambda violations: _repro(example, target, violations))
