"""WorkScheduler: round-robin hand-out, ordering modes, limits, revocation (pure logic)."""

import pytest

from headrace.client.work_scheduler import BufferLimits, WorkScheduler

NO_WAIT_S = 0.0


def _scheduler(ordering, **limits):
    scheduler = WorkScheduler(ordering, BufferLimits(**limits))
    for partition in range(3):
        scheduler.assign(("t", partition))
    return scheduler


def _fill(scheduler, partition, offsets, keys=None):
    for index, offset in enumerate(offsets):
        key = keys[index] if keys else None
        assert scheduler.add("t", partition, offset, key, 10, message=None)


def test_round_robin_across_partitions():
    scheduler = _scheduler("unordered")
    for partition in range(3):
        _fill(scheduler, partition, range(5))
    taken = [scheduler.take(NO_WAIT_S) for _ in range(6)]
    assert [item.partition for item in taken] == [0, 1, 2, 0, 1, 2]


def test_partition_ordering_one_in_flight_per_partition():
    scheduler = _scheduler("partition")
    _fill(scheduler, 0, range(3))
    first = scheduler.take(NO_WAIT_S)
    assert scheduler.take(NO_WAIT_S) is None
    scheduler.complete(first, done=True)
    assert scheduler.take(NO_WAIT_S).offset == 1


def test_key_ordering_one_in_flight_per_key():
    scheduler = _scheduler("key")
    _fill(scheduler, 0, range(4), keys=[b"a", b"a", b"b", None])
    first = scheduler.take(NO_WAIT_S)
    assert (first.offset, first.key) == (0, b"a")
    assert scheduler.take(NO_WAIT_S).offset == 2  # b"a"@1 waits for b"a"@0
    assert scheduler.take(NO_WAIT_S).offset == 3
    assert scheduler.take(NO_WAIT_S) is None
    scheduler.complete(first, done=True)
    assert scheduler.take(NO_WAIT_S).offset == 1


def test_limits_pause_full_partitions_then_all():
    scheduler = _scheduler("unordered", max_buffered_records_per_partition=2,
                           max_buffered_records=5)
    _fill(scheduler, 0, range(2))
    assert scheduler.partitions_to_pause() == {("t", 0)}
    _fill(scheduler, 1, range(3))
    assert scheduler.partitions_to_pause() == {("t", 0), ("t", 1), ("t", 2)}
    for _ in range(4):
        scheduler.take(NO_WAIT_S)
    assert scheduler.partitions_to_pause() == set()


def test_commit_stops_at_first_unfinished_record():
    scheduler = _scheduler("unordered")
    _fill(scheduler, 0, range(3))
    items = [scheduler.take(NO_WAIT_S) for _ in range(3)]
    scheduler.complete(items[1], done=True)
    scheduler.complete(items[2], done=True)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 0, "")]
    scheduler.complete(items[0], done=True)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 3, "")]
    assert scheduler.commit_candidates([("t", 0)], None) == []  # unchanged: nothing to send


def test_abandoned_record_is_not_committed():
    scheduler = _scheduler("unordered")
    _fill(scheduler, 0, range(2))
    first, second = scheduler.take(NO_WAIT_S), scheduler.take(NO_WAIT_S)
    scheduler.complete(first, done=False)
    scheduler.complete(second, done=True)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 0, "")]


def test_completion_after_revoke_does_not_leak_into_new_assignment():
    scheduler = _scheduler("partition")
    _fill(scheduler, 0, range(2))
    stale = scheduler.take(NO_WAIT_S)
    scheduler.drop_buffered([("t", 0)])
    scheduler.remove([("t", 0)])
    scheduler.assign(("t", 0))
    _fill(scheduler, 0, [0, 1])
    assert scheduler.take(NO_WAIT_S) is None  # the stale record is still in flight
    scheduler.complete(stale, done=True)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 0, "")]


def test_unknown_ordering_rejected():
    with pytest.raises(ValueError):
        WorkScheduler("random", BufferLimits())
