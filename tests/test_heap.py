"""The sequences' heap freezing (``properties/harness/heap.py``)."""

from __future__ import annotations

import gc

from swapspec.properties.harness.heap import freeze_heap, heap_frozen, unfreeze_heap


def test_the_heap_is_frozen_once_and_given_back():
    assert not heap_frozen() and gc.get_freeze_count() == 0
    assert freeze_heap() is True
    try:
        assert heap_frozen() and gc.get_freeze_count() > 0
        assert freeze_heap() is False  # frozen already: the caller does not own it
    finally:
        unfreeze_heap()
    assert not heap_frozen() and gc.get_freeze_count() == 0


def test_a_heap_frozen_by_someone_else_is_left_to_them():
    gc.freeze()
    try:
        assert heap_frozen() and freeze_heap() is False
    finally:
        gc.unfreeze()
    assert not heap_frozen()
