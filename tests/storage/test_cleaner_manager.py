"""CleanerManager: checkpoints, dirty ratios, choosing the filthiest log, uncleanable marking,
Kafka's cleaner metrics (recopy percent, compaction delay, uncleanable bytes per log dir)."""

from __future__ import annotations

import os
import struct

import crc32c

from headrace.protocol.records import build_batch
from headrace.storage.checkpoint import read_checkpoint
from headrace.storage.cleaner import Cleaner, cleanable_end_offset
from headrace.storage.cleaner_manager import CLEANER_OFFSET_CHECKPOINT, CleanerManager
from headrace.storage.fs import RealFileSystem
from headrace.storage.offset_map import OffsetMap

from .cleaner_workload import NOW_MS, append_workload, compact_config, open_log, read_records


def _manager(clock):
    clock.advance(NOW_MS + 1000 - clock.now_ms())
    return CleanerManager(RealFileSystem(), clock, Cleaner(OffsetMap(1 << 20)))


def _filled_log(path, seed, batches, **config):
    log = open_log(path, compact_config(**config))
    append_workload(log, seed, keys=40, batches=batches, delete_fraction=0.0)
    log.roll(NOW_MS)
    return log


def test_filthiest_log_is_cleaned_and_checkpointed(scratch, clock):
    manager = _manager(clock)
    small = _filled_log(scratch / "a-0", 1, 100)
    large = _filled_log(scratch / "b-0", 2, 400)
    logs = {("a", 0): (scratch, small), ("b", 0): (scratch, large)}
    stats = manager.clean_filthiest(logs)
    assert manager.metrics()["cleaner-recopy-percent"] == \
        100.0 * stats.bytes_written / stats.bytes_read < 100.0
    first = read_checkpoint(RealFileSystem(), scratch / CLEANER_OFFSET_CHECKPOINT)
    assert len(first) == 1
    manager.clean_filthiest(logs)
    offsets = read_checkpoint(RealFileSystem(), scratch / CLEANER_OFFSET_CHECKPOINT)
    assert offsets == {("a", 0): small.log_end_offset, ("b", 0): large.log_end_offset}
    assert manager.clean_filthiest(logs) is None  # nothing dirty any more
    metrics = manager.metrics()
    assert metrics["dirty-ratio"] == {("a", 0): 0.0, ("b", 0): 0.0}
    assert metrics["uncleanable-partitions-count"] == 0
    assert 0 < metrics["max-buffer-utilization-percent"] <= 90


def test_dirty_ratio_below_the_minimum_waits(scratch, clock):
    manager = _manager(clock)
    log = _filled_log(scratch / "a-0", 3, 200, min_cleanable_dirty_ratio=0.5)
    logs = {("a", 0): (scratch, log)}
    assert manager.clean_filthiest(logs) is not None  # all dirty: ratio 1.0
    append_workload(log, 4, keys=40, batches=5, delete_fraction=0.0)
    log.roll(NOW_MS)
    state = manager.log_to_clean(("a", 0), scratch, log, NOW_MS)
    assert 0 < state.dirty_ratio < 0.5
    assert manager.clean_filthiest(logs) is None


def test_max_compaction_lag_forces_a_clean_below_the_ratio(scratch, clock):
    manager = _manager(clock)
    log = _filled_log(scratch / "a-0", 3, 200, min_cleanable_dirty_ratio=0.99,
                      max_compaction_lag_ms=500)
    append_workload(log, 4, keys=40, batches=5, delete_fraction=0.0)
    log.roll(NOW_MS)
    logs = {("a", 0): (scratch, log)}
    manager.clean_filthiest(logs)
    append_workload(log, 5, keys=40, batches=5, delete_fraction=0.0)
    log.roll(NOW_MS)
    state = manager.log_to_clean(("a", 0), scratch, log, clock.now_ms())
    assert state.must_clean and state.dirty_ratio < 0.99
    assert manager.clean_filthiest(logs) is not None
    assert manager.metrics()["max-compaction-delay-secs"] == state.compaction_delay_ms / 1000
    assert state.compaction_delay_ms == clock.now_ms() - 500 - NOW_MS


def test_corrupt_segment_marks_only_that_partition_uncleanable(scratch, clock):
    manager = _manager(clock)
    broken = _filled_log(scratch / "a-0", 5, 300)
    healthy = _filled_log(scratch / "b-0", 6, 100)
    with open(broken.segments[0].log_path, "r+b") as segment_file:
        segment_file.seek(200)
        byte = segment_file.read(1)
        segment_file.seek(200)
        segment_file.write(bytes([byte[0] ^ 0xFF]))
    logs = {("a", 0): (scratch, broken), ("b", 0): (scratch, healthy)}
    before = read_records(healthy)
    assert manager.clean_filthiest(logs) is None  # the filthier, broken one fails
    assert set(manager.uncleanable_partitions) == {("a", 0)}
    assert manager.metrics()["uncleanable-partitions-count"] == 1
    closed_bytes = sum(segment.size_bytes for segment in broken.segments[:-1])
    assert manager.log_dir_metrics(logs, clock.now_ms()) == {
        scratch: {"uncleanable-partitions-count": 1, "uncleanable-bytes": closed_bytes}}
    assert manager.clean_filthiest(logs) is not None  # the healthy one is still cleaned
    assert len(read_records(healthy)) < len(before)
    assert not [p for p in (scratch / "a-0").iterdir() if p.name.endswith(".cleaned")]
    broken.update_config(compact_config(delete_retention_ms=5))  # a config change: retried
    manager.clean_filthiest(logs)
    assert ("a", 0) in manager.uncleanable_partitions  # retried, still corrupt
    del logs[("a", 0)]  # the topic is deleted: its uncleanable mark goes with it
    manager.clean_filthiest(logs)
    assert manager.uncleanable_partitions == {}
    assert manager.metrics()["uncleanable-partitions-count"] == 0


def _keyed_batch(timestamp_ms: int, header_max_timestamp_ms: int | None = None) -> bytearray:
    """Keyed records all stamped ``timestamp_ms`` (-1: none); the header's max timestamp may
    be overridden, as librdkafka writes 0 there for records without a timestamp."""
    batch = bytearray(build_batch([(b"k%d" % i, b"v", [], timestamp_ms) for i in range(4)]))
    if header_max_timestamp_ms is not None:
        struct.pack_into(">q", batch, 35, header_max_timestamp_ms)
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return batch


def _segments_of(log, batches: list[bytearray]) -> None:
    for batch in batches:
        log.append(batch, NOW_MS)
        log.roll(NOW_MS)


def test_max_compaction_lag_ignores_first_batches_without_a_timestamp(scratch, clock):
    """Kafka's maxCompactionDelay: the earliest first-batch timestamp > 0 of the dirty closed
    segments counts; -1 and 0 (librdkafka's header for untimed records) never force a
    cleaning, and an untimed first segment does not hide an old timed one after it."""
    manager = _manager(clock)
    untimed = open_log(scratch / "u-0", compact_config(min_cleanable_dirty_ratio=0.99,
                                                      max_compaction_lag_ms=500))
    _segments_of(untimed, [_keyed_batch(-1, header_max_timestamp_ms=0), _keyed_batch(-1)])
    state = manager.log_to_clean(("u", 0), scratch, untimed, clock.now_ms())
    assert state.compaction_delay_ms == 0 and not state.must_clean
    _segments_of(untimed, [_keyed_batch(NOW_MS)])
    state = manager.log_to_clean(("u", 0), scratch, untimed, clock.now_ms())
    assert state.compaction_delay_ms == clock.now_ms() - 500 - NOW_MS > 0


def test_min_compaction_lag_ages_untimed_dirty_segments_by_their_file_mtime(scratch, clock):
    """Kafka's firstUncleanableDirtyOffset: the first *dirty* closed segment whose
    largestTimestamp (mtime when untimed) is newer than min.compaction.lag.ms; clean
    segments before the first dirty offset do not count."""
    log = open_log(scratch / "m-0", compact_config(min_compaction_lag_ms=1000))
    _segments_of(log, [_keyed_batch(-1), _keyed_batch(-1), _keyed_batch(-1)])
    first, second, third = log.segments[:3]
    now_ms = clock.now_ms()
    for segment, mtime_ms in ((first, now_ms), (second, now_ms - 5000), (third, now_ms - 100)):
        os.utime(segment.log_path, ns=(mtime_ms * 1_000_000,) * 2)
    assert cleanable_end_offset(log, now_ms, 0) == 0
    assert cleanable_end_offset(log, now_ms, second.base_offset) == third.base_offset
    os.utime(third.log_path, ns=((now_ms - 1001) * 1_000_000,) * 2)
    assert cleanable_end_offset(log, now_ms, second.base_offset) == log.segments[-1].base_offset
