"""Layout conversions of convolution weights to draw: ``torch.nn.utils``'
``convert_conv2d_weight_memory_format`` and ``convert_conv3d_weight_memory_format``, each with a
memory format.

A :class:`ConvFormat` is pure data: the convolutions' ``rank`` (2 or 3 spatial dimensions) and
the ``memory_format``. Rules:

* The formats a weight of that rank takes: ``contiguous_format`` and the rank's channels-last
  format (``channels_last`` for 4-D weights, ``channels_last_3d`` for 5-D). Two are refused
  (``RuntimeError``) and drawn too, as bad input: the other rank's channels-last format and
  ``preserve_format``, which is no layout.
* Shrinks towards rank 2 and ``channels_last``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}
RANKS = (2, 3)


@dataclass(frozen=True)
class ConvFormat:
    """One call: the weights of every convolution over ``rank`` spatial dimensions take
    ``memory_format``."""

    rank: int
    memory_format: torch.memory_format

    @property
    def method(self) -> str:
        """The ``torch.nn.utils`` function (and the target's method) that makes the call."""
        return f"convert_conv{self.rank}d_weight_memory_format"

    @property
    def fits(self) -> bool:
        """Whether a strided weight of this rank can take the format (else the call is refused)."""
        return self.memory_format in (torch.contiguous_format, CHANNELS_LAST[self.rank])

    @property
    def features(self) -> frozenset[str]:
        """Reach tags: the function and the format."""
        return frozenset({self.method, f"format: {str(self.memory_format).removeprefix('torch.')}"})


def conv_formats(rank: int | None = None) -> st.SearchStrategy[ConvFormat]:
    """A :class:`ConvFormat` of ``rank`` (drawn among 2 and 3 where None) with one of the
    formats of the module docstring, each drawn alike."""
    ranks = st.sampled_from(RANKS) if rank is None else st.just(rank)
    return ranks.flatmap(lambda r: st.sampled_from(
        (CHANNELS_LAST[r], torch.contiguous_format, torch.preserve_format, CHANNELS_LAST[5 - r])
    ).map(lambda f: ConvFormat(r, f)))
