"""Strategies for the checkpoint properties: RNN trees, extra state, and the module that holds it.

Rules:

* :func:`rnn_trees` draws a tree whose root is a catalogue leaf of a real recurrent module that keeps
  flat weights (``nn.RNN``, ``nn.GRU``, ``nn.LSTM``: an ``nn.RNNBase``), one of its catalogue variants
  (layers, directions, bias, ``proj_size``, ``batch_first``), built by :func:`~strategies.trees.build_tree`
  so that ``tree_info`` rebuilds it and a repro builds it standalone. Shrinks towards ``nn.RNN``, variant
  0, seed 0.
* :class:`ExtraState` is a module with extra state (``get_extra_state``/``set_extra_state``): it returns
  its ``state`` and records every value ``set_extra_state`` receives, in order, in ``received``.
* :func:`extra_states` draws a picklable extra-state value: an int, a string, a list of ints, a dict, or
  a small tensor. Shrinks towards ``0``.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st
from torch import nn

from swapspec.strategies.tree_spec import LeafSpec, TreeSpec, catalogue_module
from swapspec.strategies.trees import build_tree

RNN_ENTRIES = ("nn.RNN", "nn.GRU", "nn.LSTM")


def rnn_variants() -> list[tuple[str, int]]:
    """``(entry, variant)`` of every kept catalogue variant of :data:`RNN_ENTRIES`, in order."""
    catalogue = catalogue_module().catalogue()
    return [(entry, v) for entry in RNN_ENTRIES if entry in catalogue
            for v in catalogue[entry].variants]


@st.composite
def rnn_trees(draw: Any) -> nn.Module:
    """A tree whose root is a catalogue leaf wrapping an ``nn.RNNBase`` (see the module docstring)."""
    entry, variant = draw(st.sampled_from(rnn_variants()))
    seed = draw(st.integers(0, 3))
    return build_tree(TreeSpec(seed=seed, root=LeafSpec(kind="catalogue", entry=entry,
                                                        variant=variant)))


class ExtraState(nn.Module):
    """A module whose extra state is ``state``; ``received`` lists what ``set_extra_state`` got."""

    # No annotations: repros copy this class's source into a script that imports only torch.
    def __init__(self, state=0):
        super().__init__()
        self.state = state
        self.received = []

    def get_extra_state(self):
        return self.state

    def set_extra_state(self, state):
        self.received.append(state)
        self.state = state

    def forward(self, x):
        return x


def extra_states() -> st.SearchStrategy[Any]:
    """A picklable extra-state value (see the module docstring)."""
    return st.one_of(
        st.integers(0, 100),
        st.text(max_size=5),
        st.lists(st.integers(0, 9), max_size=3),
        st.dictionaries(st.sampled_from("abc"), st.integers(0, 9), max_size=2),
        st.integers(1, 3).map(lambda n: torch.arange(float(n))),
    )
