"""align.utils.heap.frozen_heap: objects alive at entry are frozen for the block only, and an exception inside the
block still gives them back to the collector."""

from __future__ import annotations

import gc

import pytest

from align.utils.heap import frozen_heap


def test_the_heap_is_frozen_inside_the_block_only():
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 1000  # the imported modules' objects, at least
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with frozen_heap():
            raise RuntimeError("a stop inside the loop")
    assert gc.get_freeze_count() == 0
