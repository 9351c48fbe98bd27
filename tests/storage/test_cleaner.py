"""The cleaner against an oracle (Kafka's LogCompactionTester idea): seeded keyed workloads
with updates and deletes; after cleaning the latest value per key matches, offsets are
unchanged and reads from any offset agree."""

from __future__ import annotations

import os

import pytest

from headrace.protocol.compression import GZIP, NONE
from headrace.storage.cleaner import DEFAULT_SPAN_BYTES, Cleaner, span_bytes_for
from headrace.storage.log import CleaningAborted
from headrace.storage.offset_map import OffsetMap
from tests.record_reading import iter_headers

from .cleaner_workload import (
    NOW_MS,
    append_workload,
    compact_config,
    latest_values,
    open_log,
    read_records,
)
from .helpers import assert_indexes_match_scan


def _clean(log, buffer_bytes=1 << 20, first_dirty=0, now_ms=NOW_MS):
    return Cleaner(OffsetMap(buffer_bytes)).clean(log, first_dirty, now_ms)


def _assert_compacted(log, before, oracle, cleanable_end):
    after = read_records(log)
    before_by_offset = {offset: (key, value) for offset, key, value in before}
    for offset, key, value in after:  # offsets never change, content never changes
        assert before_by_offset[offset] == (key, value)
    live = {k: v for k, v in latest_values(after).items() if v is not None}
    assert live == {k: v for k, v in oracle.items() if v is not None}  # no live key lost
    cleaned_keys = [key for offset, key, _ in after if offset < cleanable_end]
    assert len(cleaned_keys) == len(set(cleaned_keys)), "a duplicate survived the cleaning"
    for offset, _, _ in after[:: max(1, len(after) // 25)]:  # reads from any offset agree
        from_offset = [r for r in read_records(log, offset) if r[0] >= offset]  # whole batches
        assert from_offset == [r for r in after if r[0] >= offset]
    assert_indexes_match_scan(log)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cleaning_keeps_exactly_the_latest_record_per_key(scratch, seed):
    log = open_log(scratch / "t-0", compact_config())
    oracle = append_workload(log, seed, keys=300, batches=600, delete_fraction=0.1)
    log.roll(NOW_MS)
    before = read_records(log)
    stats = _clean(log)
    assert stats.passes == 1 and stats.end_offset == log.log_end_offset
    _assert_compacted(log, before, oracle, stats.end_offset)
    assert latest_values(read_records(log)) == oracle  # tombstones survive a first cleaning
    assert stats.end_size_bytes < stats.start_size_bytes


def test_tiny_buffer_cleans_thousands_of_keys_in_several_hash_ranges(scratch):
    log = open_log(scratch / "t-0", compact_config())
    oracle = append_workload(log, 7, keys=3000, batches=2500, delete_fraction=0.05)
    log.roll(NOW_MS)
    before = read_records(log)
    stats = _clean(log, buffer_bytes=4096)
    assert stats.passes > 8  # 4 KiB holds 307 keys: 3000 keys need many ranges
    _assert_compacted(log, before, oracle, stats.end_offset)
    assert latest_values(read_records(log)) == oracle


def test_batches_larger_than_the_read_buffer_grow_it_and_clean_alike(scratch):
    log = open_log(scratch / "t-0", compact_config(segment_bytes=16 * 1024))
    oracle = append_workload(log, 8, keys=200, batches=800, delete_fraction=0.1)
    log.roll(NOW_MS)
    before = read_records(log)
    sizes = [header.size_bytes for segment in log.segments[:-1]
             for _, header in segment.iter_batches()]
    io_chunk_bytes = 64
    assert min(sizes) < io_chunk_bytes * 2 < max(sizes)  # grown once, then grown again
    stats = Cleaner(OffsetMap(1 << 20), io_chunk_bytes=io_chunk_bytes).clean(log, 0, NOW_MS)
    assert stats.bytes_read == sum(sizes)  # every batch read once, none skipped
    _assert_compacted(log, before, oracle, stats.end_offset)
    assert latest_values(read_records(log)) == oracle


def test_active_segment_and_records_past_the_end_are_untouched(scratch):
    log = open_log(scratch / "t-0", compact_config())
    append_workload(log, 4, keys=50, batches=200, delete_fraction=0.0)
    log.roll(NOW_MS)
    append_workload(log, 5, keys=50, batches=30, delete_fraction=0.0)
    active_before = read_records(log, log.segments[-1].base_offset)
    stats = _clean(log)
    assert stats.end_offset == log.segments[-1].base_offset
    assert read_records(log, log.segments[-1].base_offset) == active_before


def test_min_compaction_lag_keeps_recent_segments_dirty(scratch, clock):
    log = open_log(scratch / "t-0", compact_config(min_compaction_lag_ms=60_000))
    append_workload(log, 8, keys=20, batches=300, delete_fraction=0.0, now_ms=NOW_MS)
    log.roll(NOW_MS)
    stats = _clean(log, now_ms=NOW_MS + 1000)
    assert stats.end_offset == 0 and stats.passes == 0
    stats = _clean(log, now_ms=NOW_MS + 120_000)
    assert stats.end_offset == log.segments[-1].base_offset and stats.passes == 1


def test_tombstones_survive_the_first_cleaning_and_go_after_the_horizon(scratch):
    config = compact_config(delete_retention_ms=10_000)
    log = open_log(scratch / "t-0", config)
    oracle = append_workload(log, 9, keys=100, batches=400, delete_fraction=0.3)
    log.roll(NOW_MS)
    timestamps_before = _record_timestamps(log)
    _clean(log, now_ms=NOW_MS)
    deleted = {k for k, v in oracle.items() if v is None}
    assert deleted and {k for _, k, v in read_records(log) if v is None} == deleted
    stamped = [h for s in log.segments for _, h in s.iter_batches() if h.has_delete_horizon]
    assert stamped and all(h.base_timestamp == NOW_MS + 10_000 for h in stamped)
    after_first = _record_timestamps(log)
    assert all(timestamps_before[o] == t for o, t in after_first.items())  # record times kept
    _clean(log, now_ms=NOW_MS + 9_999)  # before the horizon: still there
    assert {k for _, k, v in read_records(log) if v is None} == deleted
    _clean(log, now_ms=NOW_MS + 10_000)
    remaining = read_records(log)
    assert all(value is not None for _, _, value in remaining)
    assert latest_values(remaining) == {k: v for k, v in oracle.items() if v is not None}


def test_last_batch_of_a_producer_stays_as_an_empty_batch(scratch):
    from headrace.protocol.records import build_batch
    log = open_log(scratch / "t-0", compact_config())
    log.append(bytearray(build_batch([(b"a", b"1", [], NOW_MS)], producer_id=7,
                                     producer_epoch=0, base_sequence=0)), NOW_MS)
    log.append(bytearray(build_batch([(b"a", b"2", [], NOW_MS)])), NOW_MS)
    log.roll(NOW_MS)
    _clean(log)
    headers = [h for s in log.segments for _, h in s.iter_batches()]
    assert [(h.base_offset, h.records_count, h.producer_id) for h in headers] == \
        [(0, 0, 7), (1, 1, -1)]
    assert read_records(log) == [(1, b"a", b"2")]


def test_cleaned_log_reopens_with_the_same_records(scratch):
    config = compact_config()
    log = open_log(scratch / "t-0", config)
    append_workload(log, 11, keys=200, batches=500, delete_fraction=0.1)
    log.roll(NOW_MS)
    _clean(log)
    records = read_records(log)
    log.close()
    reopened = open_log(scratch / "t-0", config)
    assert read_records(reopened) == records
    names = sorted(p.name for p in (scratch / "t-0").iterdir())
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))]


def test_a_cleaned_segment_keeps_the_last_modified_time_of_those_it_replaces(scratch):
    """Kafka's cleanSegments: the cleaned segment gets the replaced group's last segment's
    last-modified time, so retention and min.compaction.lag.ms of records without a
    timestamp (which read it) are not reset by a cleaning -- also after a restart."""
    config = compact_config(segment_bytes=1 << 20)
    log = open_log(scratch / "t-0", config)
    for _ in range(3):
        append_workload(log, 12, keys=20, batches=20, delete_fraction=0.0, now_ms=-1)
        log.roll(NOW_MS)
    closed = log.segments[:-1]
    for age_ms, segment in zip((9000, 8000, 7000), closed, strict=True):
        os.utime(segment.log_path, ns=((NOW_MS - age_ms) * 1_000_000,) * 2)
    _clean(log)
    assert len(log.segments) == 2  # one cleaned segment and the active one
    cleaned = log.segments[0]
    assert cleaned.max_timestamp_ms == -1
    assert cleaned.largest_timestamp_ms() == NOW_MS - 7000
    log.close()
    assert open_log(scratch / "t-0", config).segments[0].largest_timestamp_ms() == NOW_MS - 7000


def _index_state(segment):
    return (segment.offset_index.relative_offsets.tolist(),
            segment.offset_index.positions.tolist(), segment.time_index.timestamps.tolist(),
            segment.time_index.relative_offsets.tolist(), segment.max_timestamp_ms,
            segment.offset_of_max_timestamp, segment.first_batch_timestamp_ms,
            segment.bytes_since_last_index_entry, segment.size_bytes)


def test_the_swapped_in_index_is_the_one_a_scan_of_the_file_rebuilds(scratch):
    log = open_log(scratch / "t-0", compact_config(index_interval_bytes=200))
    for step, now_ms in enumerate([NOW_MS, NOW_MS + 5000, NOW_MS - 3000, NOW_MS + 9000]):
        append_workload(log, 20 + step, keys=150, batches=150, delete_fraction=0.1,
                        now_ms=now_ms)  # half the batches compressed: both write paths
    log.roll(NOW_MS)
    stats = _clean(log)
    assert len(stats.groups) > 2
    handed_over = [_index_state(segment) for segment in log.segments[:-1]]
    assert sum(len(state[0]) for state in handed_over) > 20
    for segment in log.segments[:-1]:  # what recovery computes from the cleaned files
        segment.recover(0)
        segment.seal()
    assert [_index_state(segment) for segment in log.segments[:-1]] == handed_over


def _record_timestamps(log):
    from headrace.protocol.kernel import decode_columns
    timestamps = {}
    for segment in log.segments:
        data = segment.fs.pread(segment.fd, segment.size_bytes, 0)
        if data:
            assert list(iter_headers(data, verify_crc=True))
            columns = decode_columns(data)
            timestamps.update(zip(columns.offsets.tolist(), columns.timestamps_ms.tolist(),
                                  strict=True))
    return timestamps


def _closed_bytes(log):
    return sum(segment.size_bytes for segment in log.segments[:-1])


def test_the_hook_sees_every_byte_of_both_passes_span_by_span(scratch):
    log = open_log(scratch / "t-0", compact_config(segment_bytes=64 * 1024))
    oracle = append_workload(log, 12, keys=100, batches=1500, delete_fraction=0.1)
    log.roll(NOW_MS)
    closed_bytes = _closed_bytes(log)
    calls = []
    cleaner = Cleaner(OffsetMap(1 << 20), io_chunk_bytes=1024, span_bytes=4096,
                      on_chunk=lambda _log, bytes_read: calls.append(bytes_read))
    stats = cleaner.clean(log, 0, NOW_MS)
    assert stats.passes == 1 and stats.bytes_read == closed_bytes
    assert sum(calls) == 2 * closed_bytes  # the throttle counts every byte read, once
    assert len(calls) > 2 * closed_bytes // (4096 + 1024)  # a call per span, not per pass
    assert latest_values(read_records(log)) == oracle
    codecs = {header.compression for s in log.segments for _, header in s.iter_batches()}
    assert codecs == {NONE, GZIP}  # compressed batches were rebuilt recompressed


def test_an_abort_between_spans_of_pass_two_leaves_the_log_as_it_was(scratch):
    log = open_log(scratch / "t-0", compact_config(segment_bytes=64 * 1024))
    append_workload(log, 13, keys=100, batches=1500, delete_fraction=0.1)
    log.roll(NOW_MS)
    before = read_records(log)
    closed_bytes = _closed_bytes(log)
    read = []

    def abort_in_pass_two(_log, bytes_read):
        read.append(bytes_read)
        if sum(read[:-1]) > closed_bytes:  # the second span of pass 2 is done
            raise CleaningAborted("stop")

    cleaner = Cleaner(OffsetMap(1 << 20), io_chunk_bytes=1024, span_bytes=4096,
                      on_chunk=abort_in_pass_two)
    with pytest.raises(CleaningAborted):
        cleaner.clean(log, 0, NOW_MS)
    assert closed_bytes < sum(read) < closed_bytes + 3 * (4096 + 1024)
    assert not [p for p in (scratch / "t-0").iterdir() if p.name.endswith(".cleaned")]
    assert read_records(log) == before


def test_a_throttled_cleaner_takes_spans_as_fine_as_its_limit():
    chunk = 256 * 1024
    assert span_bytes_for(1.7976931348623157e308, chunk) == DEFAULT_SPAN_BYTES  # Kafka's default
    assert span_bytes_for(200_000_000, chunk) == 20_000_000  # 100 ms at 200 MB/s
    assert span_bytes_for(1_000_000, chunk) == chunk  # never below one chunk
