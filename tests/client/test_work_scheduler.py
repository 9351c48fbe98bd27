"""WorkScheduler: round-robin hand-out in runs, ordering modes, limits, revocation, skipping
(pure logic over real confluent_kafka.Message objects)."""

import pytest
from confluent_kafka import Message

from headrace.client.work_scheduler import BufferLimits, WorkScheduler
from tests.client.done_offsets import decode_done_offsets

NO_WAIT_S = 0.0
VALUE = b"v" * 10
FAST_NS, SLOW_NS = 0, 1_000_000_000  # handler wall time of a run


def _scheduler(ordering, max_run_records=1, skip=None, **limits):
    scheduler = WorkScheduler(ordering, BufferLimits(**limits), max_run_records=max_run_records)
    for partition in range(3):
        scheduler.assign(("t", partition), (skip or {}).get(partition))
    return scheduler


def _messages(partition, offsets, keys=None):
    return [Message(topic="t", partition=partition, offset=offset,
                    key=keys[index] if keys else None, value=VALUE)
            for index, offset in enumerate(offsets)]


def _fill(scheduler, partition, offsets, keys=None):
    return scheduler.add_batch({("t", partition): _messages(partition, offsets, keys)})


def _offsets(run):
    return [m.offset() for m in run.messages]


def _grow_runs(scheduler, to_records):
    """Fast complete runs double the run length (a no-op handler's effect)."""
    while scheduler.run_records < to_records:
        scheduler._tune_run_length(scheduler.run_records, scheduler.run_records, FAST_NS)


def test_round_robin_across_partitions():
    scheduler = _scheduler("unordered")
    for partition in range(3):
        _fill(scheduler, partition, range(5))
    taken = [scheduler.take(NO_WAIT_S) for _ in range(6)]
    assert [run.partition for run in taken] == [0, 1, 2, 0, 1, 2]
    assert [_offsets(run) for run in taken] == [[0], [0], [0], [1], [1], [1]]


def test_run_length_adapts_to_handler_time():
    scheduler = _scheduler("unordered", max_run_records=8)
    _fill(scheduler, 0, range(100))
    run = scheduler.take(NO_WAIT_S)
    scheduler.complete(run, 1, FAST_NS)
    lengths = []
    for _ in range(4):
        run = scheduler.take(NO_WAIT_S)
        lengths.append(len(run.messages))
        scheduler.complete(run, len(run.messages), FAST_NS)
    assert lengths == [2, 4, 8, 8]  # doubles up to max_run_records
    run = scheduler.take(NO_WAIT_S)
    scheduler.complete(run, len(run.messages), SLOW_NS)
    assert len(scheduler.take(NO_WAIT_S).messages) == 4  # a slow run halves it


def test_partition_ordering_one_run_in_flight_per_partition():
    scheduler = _scheduler("partition", max_run_records=2)
    _grow_runs(scheduler, 2)
    _fill(scheduler, 0, range(5))
    first = scheduler.take(NO_WAIT_S)
    assert _offsets(first) == [0, 1]
    assert scheduler.take(NO_WAIT_S) is None
    scheduler.complete(first, 2, FAST_NS)
    assert _offsets(scheduler.take(NO_WAIT_S)) == [2, 3]


def test_key_ordering_one_run_per_key():
    scheduler = _scheduler("key", max_run_records=4)
    _grow_runs(scheduler, 2)
    _fill(scheduler, 0, range(6), keys=[b"a", b"b", b"a", b"c", b"b", None])
    first = scheduler.take(NO_WAIT_S)
    assert _offsets(first) == [0, 1]
    second = scheduler.take(NO_WAIT_S)  # a and b are in flight: only c and the keyless one
    assert _offsets(second) == [3, 5]
    assert scheduler.take(NO_WAIT_S) is None
    scheduler.complete(first, 2, FAST_NS)
    third, fourth = scheduler.take(NO_WAIT_S), scheduler.take(NO_WAIT_S)
    assert (_offsets(third), _offsets(fourth)) == ([2], [4])  # the rest, split around 3
    scheduler.complete(second, 2, FAST_NS)
    scheduler.complete(fourth, 1, FAST_NS)
    ((_, _, committable, metadata),) = scheduler.commit_candidates([("t", 0)], 4096)
    assert (committable, decode_done_offsets(committable, metadata)) == (2, {3, 4, 5})
    scheduler.complete(third, 1, FAST_NS)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 6, "")]


def test_key_ordering_spans_partitions_and_revoked_runs():
    """A run cut while nothing was in flight (its key set built only when a later cut needs it)
    still holds its keys against other partitions, and after its partition is revoked."""
    scheduler = _scheduler("key", max_run_records=4)
    _grow_runs(scheduler, 2)
    _fill(scheduler, 0, range(2), keys=[b"a", b"b"])
    first = scheduler.take(NO_WAIT_S)
    scheduler.drop_buffered([("t", 0)])
    _fill(scheduler, 1, range(3), keys=[b"b", b"c", b"a"])
    second = scheduler.take(NO_WAIT_S)
    assert (second.partition, _offsets(second)) == (1, [1])  # a and b still in flight
    scheduler.complete(first, 0, FAST_NS)
    third, fourth = scheduler.take(NO_WAIT_S), scheduler.take(NO_WAIT_S)
    assert (_offsets(third), _offsets(fourth)) == ([0], [2])  # the rest, split around 1
    assert scheduler.take(NO_WAIT_S) is None


def test_limits_pause_full_partitions_then_all():
    scheduler = _scheduler("unordered", max_buffered_records_per_partition=2,
                           max_buffered_records=5)
    _fill(scheduler, 0, range(2))
    assert scheduler.full_partitions() == {("t", 0)}
    _fill(scheduler, 1, range(3))
    assert scheduler.full_partitions() == {("t", 0), ("t", 1), ("t", 2)}
    for _ in range(4):
        scheduler.take(NO_WAIT_S)
    assert scheduler.full_partitions() == set()
    assert scheduler.totals() == (1, len(VALUE), 4)


def test_consume_capacity_never_overfills_an_unpaused_partition():
    scheduler = _scheduler("unordered", max_buffered_records_per_partition=4,
                           max_buffered_records=10)
    assert scheduler.consume_capacity(set(), 0) == 4
    _fill(scheduler, 0, range(3))
    assert scheduler.consume_capacity(set(), 0) == 1  # the next batch could be all partition 0's
    assert scheduler.consume_capacity(set(), 2) == 3  # or go one batch (2) over its limit
    assert scheduler.consume_capacity({("t", 0)}, 0) == 4
    _fill(scheduler, 1, range(4))
    _fill(scheduler, 2, range(2))
    assert scheduler.consume_capacity({("t", 0), ("t", 1), ("t", 2)}, 0) == 1  # total: 9 of 10


def test_commit_stops_at_first_unfinished_record():
    scheduler = _scheduler("unordered")
    _fill(scheduler, 0, [0, 1, 5])  # a gap: offsets 2-4 were compacted away
    runs = [scheduler.take(NO_WAIT_S) for _ in range(3)]
    scheduler.complete(runs[1], 1, FAST_NS)
    scheduler.complete(runs[2], 1, FAST_NS)
    assert scheduler.commit_candidates([("t", 0)], 4096)[0][:3] == ("t", 0, 0)
    scheduler.complete(runs[0], 1, FAST_NS)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 6, "")]
    assert scheduler.commit_candidates([("t", 0)], None) == []  # unchanged: nothing to send


def test_abandoned_rest_of_a_run_is_not_committed():
    scheduler = _scheduler("unordered", max_run_records=4)
    _grow_runs(scheduler, 4)
    _fill(scheduler, 0, range(4))
    run = scheduler.take(NO_WAIT_S)
    scheduler.complete(run, 2, FAST_NS)  # records 2 and 3 abandoned
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 2, "")]


def test_revocation_stops_runs_and_later_completion_does_not_leak():
    scheduler = _scheduler("partition")
    _fill(scheduler, 0, range(2))
    stale = scheduler.take(NO_WAIT_S)
    scheduler.drop_buffered([("t", 0)])
    assert not stale.is_current()
    scheduler.remove([("t", 0)])
    scheduler.assign(("t", 0))
    _fill(scheduler, 0, [0, 1])
    assert scheduler.take(NO_WAIT_S) is None  # the stale run is still in flight
    scheduler.complete(stale, 1, FAST_NS)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 0, "")]
    assert _offsets(scheduler.take(NO_WAIT_S)) == [0]


def test_records_done_by_a_previous_owner_are_skipped():
    scheduler = _scheduler("unordered", max_run_records=8, skip={0: [(12, 14)]})
    _grow_runs(scheduler, 8)
    assert _fill(scheduler, 0, range(10, 16)) == 4
    first, second = scheduler.take(NO_WAIT_S), scheduler.take(NO_WAIT_S)
    assert (_offsets(first), _offsets(second)) == ([10, 11], [14, 15])
    scheduler.complete(first, 2, FAST_NS)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 14, "")]


def test_stop_dispatch_ends_takes_and_current_runs():
    scheduler = _scheduler("unordered")
    _fill(scheduler, 0, range(3))
    run = scheduler.take(NO_WAIT_S)
    scheduler.stop_dispatch()
    assert not run.is_current()
    assert scheduler.take(NO_WAIT_S) is None
    assert scheduler.totals() == (0, 0, 1)


def test_unknown_ordering_rejected():
    with pytest.raises(ValueError):
        WorkScheduler("random", BufferLimits())


def test_only_active_workers_take_runs():
    scheduler = _scheduler("unordered")
    _fill(scheduler, 0, range(4))
    assert scheduler.take(NO_WAIT_S, worker_index=1) is None  # one active worker: index 0
    assert _offsets(scheduler.take(NO_WAIT_S, worker_index=0)) == [0]
    scheduler.set_active_workers(2)
    assert _offsets(scheduler.take(NO_WAIT_S, worker_index=1)) == [1]
    scheduler.set_active_workers(1)
    assert scheduler.take(NO_WAIT_S, worker_index=1) is None


def test_handler_window_sums_completed_runs_then_resets():
    scheduler = _scheduler("unordered", max_run_records=2)
    _grow_runs(scheduler, 2)
    _fill(scheduler, 0, range(8))
    first, second = scheduler.take(NO_WAIT_S), scheduler.take(NO_WAIT_S)
    scheduler.complete(first, 2, wall_ns=3_000, cpu_ns=1_000)
    scheduler.complete(second, 1, wall_ns=5_000, cpu_ns=2_000)
    window = scheduler.take_handler_window(window_ns=10_000)
    assert (window.runs, window.records, window.handler_wall_ns, window.handler_cpu_ns,
            window.window_ns, window.active_workers, window.blocked) == (
        2, 3, 8_000, 3_000, 10_000, 1, False)
    scheduler.take(NO_WAIT_S)  # runs and never completes while records wait: blocked
    blocked = scheduler.take_handler_window(window_ns=10_000)
    assert (blocked.runs, blocked.handler_wall_ns, blocked.blocked) == (0, 0, True)


def test_inline_mode_no_worker_takes_runs_the_poll_thread_does():
    scheduler = _scheduler("partition")
    scheduler.set_active_workers(0)
    _fill(scheduler, 0, range(3))
    assert scheduler.take(NO_WAIT_S, worker_index=0) is None
    run = scheduler.take_inline()
    assert _offsets(run) == [0]
    assert scheduler.take_inline() is None  # partition ordering: one run in flight
    scheduler.complete(run, 1, FAST_NS)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 1, "")]
    blocked = scheduler.take_handler_window(window_ns=10_000)
    assert (blocked.active_workers, blocked.blocked) == (0, False)  # nobody to be blocked


def test_failed_inline_run_is_handed_to_a_worker_still_in_flight():
    scheduler = _scheduler("partition", max_run_records=4)
    _grow_runs(scheduler, 4)
    scheduler.set_active_workers(0)
    _fill(scheduler, 0, range(8))
    run = scheduler.take_inline()
    error = RuntimeError("inline failure")
    scheduler.hand_over(run, 2, error)
    assert scheduler.active_workers == 1
    assert scheduler.take_inline() is None  # the handed-over run still holds the partition
    resumed = scheduler.take(NO_WAIT_S, worker_index=0)
    assert resumed is run and (run.resume_index, run.resume_error) == (2, error)
    scheduler.complete(run, 4, FAST_NS)
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 4, "")]
    assert _offsets(scheduler.take(NO_WAIT_S)) == [4, 5, 6, 7]


def test_slow_inline_run_gives_its_rest_back_in_order():
    scheduler = _scheduler("key", max_run_records=8, skip={0: [(3, 4)]})
    _grow_runs(scheduler, 8)
    scheduler.set_active_workers(0)
    _fill(scheduler, 0, range(6), keys=[b"a", b"b", b"c", b"d", b"a", b"b"])
    run = scheduler.take_inline()
    assert _offsets(run) == [0, 1, 2]  # offset 3 done by a previous owner: a separate chunk
    scheduler.give_back(run, 1, SLOW_NS, 0)
    assert scheduler.run_records == 1
    assert scheduler.totals()[0] == 4  # 1, 2, 4, 5 buffered again
    assert scheduler.commit_candidates([("t", 0)], None)[0][2] == 1
    taken = []
    while (next_run := scheduler.take_inline()) is not None:
        taken.append(_offsets(next_run))
        scheduler.complete(next_run, len(next_run.messages), FAST_NS)
    assert taken == [[1], [2], [4, 5]]  # runs of one record, growing as they finish fast
    assert scheduler.commit_candidates([("t", 0)], None)[0][2] == 6


def test_stop_dispatch_abandons_handed_over_runs():
    scheduler = _scheduler("unordered", max_run_records=4)
    _grow_runs(scheduler, 4)
    scheduler.set_active_workers(0)
    _fill(scheduler, 0, range(4))
    scheduler.hand_over(scheduler.take_inline(), 1, RuntimeError("x"))
    scheduler.stop_dispatch()
    assert scheduler.take(NO_WAIT_S) is None
    assert scheduler.totals() == (0, 0, 0)  # nothing left in flight for close() to wait for
    assert scheduler.commit_candidates([("t", 0)], None) == [("t", 0, 1, "")]


def test_inline_batch_starts_runs_directly_while_nothing_is_in_flight():
    scheduler = _scheduler("key", max_run_records=8, skip={2: [(1, 2)]})
    scheduler.set_active_workers(0)
    added, runs = scheduler.add_batch_inline({
        ("t", 0): _messages(0, range(3)), ("t", 1): _messages(1, range(2)),
        ("t", 2): _messages(2, range(3))})  # partition 2: offset 1 done before, so buffered
    assert added == 7 and [(run.partition, _offsets(run)) for run in runs] == [
        (0, [0, 1, 2]), (1, [0, 1])]
    assert scheduler.totals() == (2, 20, 5)  # partition 2's two records buffered, 5 in flight
    later_added, later_runs = scheduler.add_batch_inline({("t", 0): _messages(0, range(3, 5))})
    assert (later_added, later_runs) == (2, [])  # runs in flight: buffered behind them
    scheduler.complete(runs[1], 2, FAST_NS)
    scheduler.put_back([runs[0]])  # not started: back in front of offsets 3 and 4
    assert scheduler.totals() == (7, 70, 0)
    assert scheduler.commit_candidates([("t", 0), ("t", 1)], None) == [
        ("t", 0, 0, ""), ("t", 1, 2, "")]
    _grow_runs(scheduler, 8)
    assert _offsets(scheduler.take_inline()) == [0, 1, 2]  # one chunk for each fetch
    assert _offsets(scheduler.take_inline()) == [0]  # partition 2, before the skipped offset
    assert _offsets(scheduler.take_inline()) == [3, 4]
