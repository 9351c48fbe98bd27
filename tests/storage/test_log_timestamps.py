"""Log: time-based decisions on batches and segments without a valid timestamp, as Kafka makes
them -- retention and ListOffsets read a segment's largest timestamp, which is the file's
last-modified time when no batch has one; the time index never holds -1; ListOffsets skips
records without a timestamp and those below the log start."""

from __future__ import annotations

import os

import pytest

from .batches import build_batch
from .helpers import NOW_MS, assert_indexes_match_scan, open_log, reopen

NO_TIMESTAMP = -1


def untimed_batch(count: int = 1, header_max_timestamp_ms: int | None = None) -> bytearray:
    """A batch whose records carry no timestamp (-1), as librdkafka sends for timestamp -1."""
    return build_batch([b"v" * 40] * count, timestamps=[NO_TIMESTAMP] * count,
                       header_max_timestamp_ms=header_max_timestamp_ms)


def set_mtime(segment, mtime_ms: int) -> None:
    os.utime(segment.log_path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))


def test_retention_ages_segments_without_timestamps_by_their_file_mtime(scratch):
    """A closed segment of records without timestamps is deleted by retention.ms only once
    its file's last-modified time is older than retention.ms -- also after a restart."""
    log = open_log(scratch, segment_bytes=300, retention_ms=1000)
    for _ in range(8):
        log.append(untimed_batch(), NOW_MS)
    closed = log.segments[:-1]
    assert len(closed) >= 3 and all(s.max_timestamp_ms == NO_TIMESTAMP for s in closed)
    for segment in closed:
        set_mtime(segment, NOW_MS - 500)
    assert log.delete_old_segments(NOW_MS) == 0
    assert log.log_start_offset == 0
    log = reopen(log, clean=True)
    assert log.delete_old_segments(NOW_MS) == 0
    set_mtime(log.segments[0], NOW_MS - 1001)
    assert log.delete_old_segments(NOW_MS) == 1
    assert log.log_start_offset == log.segments[0].base_offset > 0


def test_time_index_gets_no_entry_for_batches_without_timestamps(scratch):
    """Kafka's maybeAppend: an empty time index's last entry is (-1, base), so untimed
    batches add nothing -- on append, on a rebuild after an unclean shutdown, on seal -- and
    the first entry is the first valid timestamp."""
    log = open_log(scratch, index_interval_bytes=0)
    for _ in range(5):
        log.append(untimed_batch(), NOW_MS)
    assert log.segments[0].time_index.entries == 0
    log.append(build_batch([b"t"], timestamp_ms=NOW_MS), NOW_MS)
    log.append(build_batch([b"t"], timestamp_ms=NOW_MS + 1), NOW_MS)
    assert list(log.segments[0].time_index.timestamps) == [NOW_MS, NOW_MS + 1]
    assert_indexes_match_scan(log)
    untimed = open_log(scratch / "untimed", index_interval_bytes=0)
    for _ in range(5):
        untimed.append(untimed_batch(), NOW_MS)
    untimed.roll(NOW_MS)
    assert untimed.segments[0].time_index.entries == 0
    rebuilt = reopen(untimed, clean=False, recovery_point=0)  # re-indexed by the kernel
    assert rebuilt.segments[0].time_index.entries == 0
    assert rebuilt.segments[0].max_timestamp_ms == NO_TIMESTAMP
    (rebuilt.segments[0].time_index.path).unlink()  # a lost index is rebuilt by the kernel
    rebuilt = reopen(rebuilt, clean=True)
    assert rebuilt.segments[0].time_index.entries == 0
    assert_indexes_match_scan(rebuilt)


def test_offsets_by_time_never_match_records_without_a_timestamp(scratch):
    """A batch whose header says max timestamp 0 (librdkafka's, for records without one) is
    searched, but none of its records matches: no offset, not offset 0 as if from 1970."""
    log = open_log(scratch)
    log.append(untimed_batch(3, header_max_timestamp_ms=0), NOW_MS)
    assert log.offset_for_timestamp(0) is None
    assert log.offset_for_timestamp(NOW_MS) is None


def test_offsets_by_time_pick_the_first_segment_whose_largest_timestamp_reaches_it(scratch):
    """Kafka's searchOffsetInLocalLog: the first segment whose largestTimestamp (mtime for an
    untimed one) is >= the target is searched, and answers alone."""
    log = open_log(scratch)
    log.append(untimed_batch(2), NOW_MS)
    log.roll(NOW_MS)
    log.append(build_batch([b"t"], timestamp_ms=NOW_MS + 100), NOW_MS)
    set_mtime(log.segments[0], NOW_MS - 1000)
    assert log.offset_for_timestamp(NOW_MS) == (2, NOW_MS + 100)
    set_mtime(log.segments[0], NOW_MS + 50)
    assert log.offset_for_timestamp(NOW_MS) is None


def test_offsets_by_time_start_at_the_log_start_offset(scratch):
    """After DeleteRecords inside a batch, the answer is the first record at or after the log
    start with a timestamp >= the target, with that record's own timestamp."""
    log = open_log(scratch)
    log.append(build_batch([b"a"] * 4, timestamps=[NOW_MS + i for i in range(4)]), NOW_MS)
    log.delete_records_before(2)
    assert log.offset_for_timestamp(NOW_MS) == (2, NOW_MS + 2)
    assert log.offset_for_timestamp(NOW_MS + 3) == (3, NOW_MS + 3)


DAY_MS = 86_400_000


def _two_batches(timestamp_ms: int) -> bytearray:
    """A request of two batches: the general append path, not the kernel's plain one."""
    return build_batch([b"a"], timestamp_ms=timestamp_ms) + build_batch([b"b"],
                                                                         timestamp_ms=timestamp_ms)


@pytest.mark.parametrize("request_of", [lambda ts: build_batch([b"a"], timestamp_ms=ts),
                                        _two_batches], ids=["plain", "general"])
def test_a_segment_rolls_by_its_batches_timestamps_not_the_broker_clock(scratch, request_of):
    """Kafka's timeWaitedForRoll: a segment whose first batch has a timestamp rolls when a
    batch to append is more than segment.ms past it; replayed old records do not roll a
    segment per append because the broker's clock is far ahead of them."""
    log = open_log(scratch, segment_ms=1000)
    first_ms = NOW_MS - 10 * DAY_MS
    log.append(request_of(first_ms), NOW_MS)
    log.append(request_of(first_ms + 500), NOW_MS + 5000)
    log.append(request_of(first_ms + 1000), NOW_MS + 9000)
    assert len(log.segments) == 1
    log.append(request_of(first_ms + 1001), NOW_MS + 9000)
    assert len(log.segments) == 2
    ahead = open_log(scratch / "ahead", segment_ms=1000)  # message.timestamp.after.max.ms 1 h
    ahead.append(request_of(NOW_MS), NOW_MS)
    ahead.append(request_of(NOW_MS + 1000), NOW_MS + 10)
    assert len(ahead.segments) == 1
    ahead.append(request_of(NOW_MS + 1001), NOW_MS + 10)  # ahead of the broker's clock
    assert len(ahead.segments) == 2


def test_untimed_segments_roll_by_creation_time_and_a_header_of_zero_loses_nothing(scratch):
    """A first batch without a timestamp (-1): the segment rolls segment.ms after its
    creation. Batches whose header max timestamp is 0 (librdkafka's for untimed records):
    whether the broker stores 0 (a timestamp to Kafka, so later untimed batches never roll
    the segment by time) or the records' -1 (rolls by creation time, segments age by
    mtime), appends and retention checks over many segment.ms lose no record."""
    untimed = open_log(scratch, segment_ms=1000)
    untimed.append(untimed_batch(), NOW_MS)
    untimed.append(untimed_batch(), NOW_MS + 1000)
    assert len(untimed.segments) == 1
    untimed.append(untimed_batch(), NOW_MS + 1001)
    assert len(untimed.segments) == 2
    zero = open_log(scratch / "zero", segment_ms=1000, retention_ms=DAY_MS)
    for step in range(5):
        zero.append(untimed_batch(header_max_timestamp_ms=0), NOW_MS + step * 5000)
        zero.maintain(NOW_MS + step * 5000 + 1, check_retention=True)
    assert (zero.log_start_offset, zero.log_end_offset) == (0, 5)


def test_maintenance_never_rolls_old_records_into_reach_of_retention(scratch):
    """Records stamped older than retention.ms stay in the active segment, which retention
    never deletes, until an append or segment.bytes rolls it (Kafka has no idle roll); only
    then does the closed segment go."""
    log = open_log(scratch, segment_ms=1000, retention_ms=DAY_MS)
    log.append(build_batch([b"old"], timestamp_ms=NOW_MS - 2 * DAY_MS), NOW_MS)
    for step in range(1, 4):
        assert log.maintain(NOW_MS + step * 5000, check_retention=True) == 0
    assert log.log_start_offset == 0 and len(log.segments) == 1
    log.append(build_batch([b"new"], timestamp_ms=NOW_MS + 20_000), NOW_MS + 20_000)
    assert log.maintain(NOW_MS + 20_000, check_retention=True) == 1
    assert log.log_start_offset == 1
