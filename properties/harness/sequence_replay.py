"""Replaying one sequence: the ``@reproduce_failure`` blob that ``run_sequences`` replays instead
of drawing sequences (the plugin's ``--swapspec-reproduce`` on a SEQ- test)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

# The ``(version, blob)`` of a printed ``@reproduce_failure`` line that ``run_sequences`` replays
# instead of drawing sequences; set by ``replaying`` (the plugin's ``--swapspec-reproduce``).
REPLAY: ContextVar[tuple[str, bytes] | None] = ContextVar("swapspec_sequence_replay", default=None)


@contextlib.contextmanager
def replaying(version: str, blob: bytes) -> Iterator[None]:
    """Within the block, ``run_sequences`` replays the one sequence the blob encodes."""
    token = REPLAY.set((version, blob))
    try:
        yield
    finally:
        REPLAY.reset(token)
