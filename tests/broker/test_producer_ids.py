"""The producer-id allocator: ids are never reused across restarts, and only the first id of
each block needs the file write (and its fsync) that InitProducerId moves off the event loop."""

from __future__ import annotations

from headrace.broker.state import ProducerIdAllocator


def test_only_the_first_id_of_a_block_needs_io(tmp_path):
    allocator = ProducerIdAllocator(tmp_path, block_size=3)
    assert allocator.next_id_without_io() is None  # nothing persisted yet
    assert allocator.next_id() == 0
    assert [allocator.next_id_without_io() for _ in range(2)] == [1, 2]
    assert allocator.next_id_without_io() is None  # block used up
    assert allocator.next_id() == 3


def test_ids_are_not_reused_after_a_restart(tmp_path):
    first = ProducerIdAllocator(tmp_path, block_size=4)
    handed_out = [first.next_id() for _ in range(6)]  # blocks [0, 4) and [4, 8) persisted
    restarted = ProducerIdAllocator(tmp_path, block_size=4)
    assert restarted.next_id_without_io() is None
    after_restart = restarted.next_id()
    assert after_restart == 8
    assert after_restart not in handed_out
