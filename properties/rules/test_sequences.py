"""Sequence properties: a module's life, step by step, against the model (one rule per test).

Each test runs the sequence machine (``properties/rules/sequence_machine.py``) on the target and asserts
one invariant after every step; see that module for the rules a sequence draws.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from swapspec.properties.rules.sequence_machine import (
    FORWARD,
    HOOKS,
    OPTIMIZER,
    STATE,
    run_sequences,
    sequence_property,
)
from swapspec.properties.rules.sequence_pairs import pair_property, run_pair


@sequence_property(STATE)
def test_sequence_state(target):
    """After every step of a drawn sequence the module matches the model slot by slot: the
    object where the path promised identity, ties, class, attributes, ``requires_grad``,
    dtype, device, shape, values and grads.

    Origin: what goes wrong only after something else happened first (a conversion after a
    backward, a call after a conversion, a second conversion after a first one that left state
    behind); torch's ``test_multiple_device_transfer`` checks one fixed sequence.
    """
    run_sequences(target, STATE)


@sequence_property(FORWARD)
def test_sequence_forward(target):
    """After every step the module's forward equals the forward of a fresh build holding the
    model's values, and a functional call returns what the model's call on a fresh build does.

    Origin: stale state hidden inside a module (an RNN's ``_flat_weights``, a cache of
    converted tensors) shows only in a forward after later steps.
    """
    run_sequences(target, FORWARD)


@sequence_property(HOOKS)
def test_sequence_hooks(target):
    """After every step each tensor hook registered on a parameter has fired as often as the
    model says: once per backward in which its parameter received a grad, on every path.

    Origin: training code registers hooks before ``model.to(...)``; hooks lost only after
    training and converting show in no single call.
    """
    run_sequences(target, HOOKS)


@sequence_property(OPTIMIZER)
def test_sequence_optimizer(target):
    """After every step the optimizer holds the module's parameters wherever the path promised
    identity (set_data and swap), through conversions, calls, training and loads.

    Origin: "move the model before building the optimizer"; the swap path exists so that
    optimizers built earlier keep working (pytorch #113000).
    """
    run_sequences(target, OPTIMIZER)


@pair_property(STATE)
@given(data=st.data())
def test_sequence_pair_state(target, pair, data):
    """For every ordered pair of rules (a, b), ``b`` right after ``a``: after each step the
    module matches the model slot by slot and the five invariants hold (the pair schedule,
    ``properties/rules/sequence_pairs.py``).

    Origin: a bug that shows only when one operation follows another (a second conversion
    reusing the first one's results, a functional call after a tie) is met by a free sequence
    only when it happens to draw that order; the schedule meets every order in every run.
    """
    run_pair(target, STATE, pair, data)
