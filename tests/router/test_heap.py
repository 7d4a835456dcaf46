"""router/cli/heap.py: what exists when serving starts is frozen, and young collections are spaced."""

from __future__ import annotations

import gc

from router.cli import heap


def test_settle_freezes_the_startup_heap_and_spaces_young_collections():
    before = gc.get_threshold()
    try:
        survivor = [object() for _ in range(100)]  # lives on: must end up frozen
        heap.settle()
        assert gc.get_freeze_count() >= len(survivor)
        assert gc.get_threshold()[0] == heap.YOUNG_THRESHOLD
        assert gc.get_threshold()[1:] == before[1:]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
