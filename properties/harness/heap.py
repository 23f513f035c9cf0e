"""Freezing the heap around one sequence (``gc.freeze``), so the collections its steps make scan
only the objects it made.

``gc.get_freeze_count()`` walks every frozen object (millions once torch is loaded), so whether
swapspec froze the heap is kept here and the walk is made only while nothing is frozen.
"""

from __future__ import annotations

import gc

_frozen_by_swapspec = False


def freeze_heap() -> bool:
    """Freeze every object alive now, unless anything is frozen already (by swapspec or by the
    process); True when this call froze them, so its caller is the one to ``unfreeze_heap``."""
    global _frozen_by_swapspec
    if heap_frozen():
        return False
    gc.freeze()
    _frozen_by_swapspec = True
    return True


def unfreeze_heap() -> None:
    """Give the objects ``freeze_heap`` froze back to the collector."""
    global _frozen_by_swapspec
    gc.unfreeze()
    _frozen_by_swapspec = False


def heap_frozen() -> bool:
    """Whether anything is frozen (the walk is made only when swapspec froze nothing)."""
    return _frozen_by_swapspec or bool(gc.get_freeze_count())
