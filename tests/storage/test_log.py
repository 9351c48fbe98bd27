"""Log: append validation, offsets, reads, time lookups, rolling, producer state, retention."""

from __future__ import annotations

import os
import struct
import threading

import crc32c
import pytest

from headrace.errors import (
    CorruptMessage,
    InvalidProducerEpoch,
    InvalidRecord,
    InvalidTimestamp,
    MessageTooLarge,
    OffsetOutOfRange,
    OutOfOrderSequenceNumber,
)
from headrace.protocol.batch import parse_header
from headrace.protocol.records import build_batch as records_build_batch
from headrace.storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP

from .batches import build_batch
from .helpers import NOW_MS, assert_indexes_match_scan, open_log, read_all, reopen


def test_offsets_are_assigned_and_batches_read_back_byte_for_byte(scratch):
    """Each batch is stored with its assigned base offset; the caller's buffer -- a bytearray
    or a read-only view of a larger frame, as the broker passes -- is left unchanged."""
    log = open_log(scratch)
    sent = []
    for i in range(10):
        batch = build_batch([b"value-%d" % i] * (i + 1))
        original = bytes(batch)
        buffer = memoryview(b"frame" + original)[5:] if i % 2 else batch
        result = log.append(buffer, NOW_MS)
        assert bytes(buffer) == original
        sent.append((result.base_offset, struct.pack(">q", result.base_offset) + original[8:]))
        assert result.last_offset - result.base_offset == i
    assert [offset for offset, _ in sent] == [0, 1, 3, 6, 10, 15, 21, 28, 36, 45]
    assert read_all(log) == sent
    assert log.log_end_offset == log.high_watermark == 55


def test_read_from_an_offset_inside_a_batch_starts_at_that_batch(scratch):
    log = open_log(scratch)
    log.append(build_batch([b"a"] * 5), NOW_MS)
    log.append(build_batch([b"b"] * 5), NOW_MS)
    result = log.read(7, 1 << 20)
    first = parse_header(result.slices[0].read_bytes())
    assert first.base_offset == 5


def test_read_returns_at_least_one_batch_and_respects_max_bytes(scratch):
    log = open_log(scratch)
    for _ in range(4):
        log.append(build_batch([b"x" * 1000]), NOW_MS)
    batch_size = log.read(0, 1).size_bytes
    assert batch_size > 1000
    assert log.read(0, 2 * batch_size + 10).size_bytes == 2 * batch_size
    assert log.read(0, 1, min_one_batch=False).size_bytes == 0


def test_reads_outside_the_log_raise_offset_out_of_range(scratch):
    log = open_log(scratch)
    log.append(build_batch([b"a"]), NOW_MS)
    assert log.read(1, 100).slices == ()
    with pytest.raises(OffsetOutOfRange):
        log.read(2, 100)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 100)


def test_damaged_or_malformed_batches_are_rejected(scratch):
    log = open_log(scratch, max_message_bytes=500)
    corrupt = build_batch([b"a"])
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptMessage):
        log.append(corrupt, NOW_MS)
    with pytest.raises(CorruptMessage):
        log.append(build_batch([b"a"])[:-3], NOW_MS)
    with pytest.raises(MessageTooLarge):
        log.append(build_batch([b"x" * 600]), NOW_MS)
    wrong_count = build_batch([b"a", b"b"])
    struct.pack_into(">i", wrong_count, 57, 3)

    struct.pack_into(">I", wrong_count, 17, crc32c.crc32c(bytes(wrong_count[21:])))
    with pytest.raises(InvalidRecord):
        log.append(wrong_count, NOW_MS)
    assert log.log_end_offset == 0


def test_create_time_bounds_raise_invalid_timestamp(scratch):
    log = open_log(scratch, message_timestamp_before_max_ms=1000,
                   message_timestamp_after_max_ms=500)
    with pytest.raises(InvalidTimestamp):
        log.append(build_batch([b"a"], timestamp_ms=NOW_MS - 1001), NOW_MS)
    with pytest.raises(InvalidTimestamp):
        log.append(build_batch([b"a"], timestamp_ms=NOW_MS + 501), NOW_MS)
    assert log.append(build_batch([b"a"], timestamp_ms=NOW_MS - 1000), NOW_MS).base_offset == 0


def test_log_append_time_is_stamped_and_crc_stays_valid(scratch):
    log = open_log(scratch, message_timestamp_type="LogAppendTime")
    result = log.append(build_batch([b"a", b"b"], timestamp_ms=5), NOW_MS + 7)
    assert result.log_append_time_ms == NOW_MS + 7
    (_, stored), = read_all(log)
    header = parse_header(stored)
    assert header.is_log_append_time and header.max_timestamp == NOW_MS + 7


def test_offsets_by_time(scratch):
    log = open_log(scratch, segment_bytes=400, index_interval_bytes=1)
    for i in range(30):
        log.append(build_batch([b"v"] * 2, timestamp_ms=NOW_MS + 10 * i), NOW_MS)
    assert len(log.segments) > 3
    assert log.offset_for_timestamp(NOW_MS + 95) == (20, NOW_MS + 100)
    assert log.offset_for_timestamp(NOW_MS + 100) == (20, NOW_MS + 100)
    assert log.offset_for_timestamp(NOW_MS) == (0, NOW_MS)
    assert log.offset_for_timestamp(NOW_MS + 1000) is None
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (60, -1)
    # the first record carrying the largest timestamp, as Kafka's ListOffsets (KAFKA-16310)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (58, NOW_MS + 290)
    assert_indexes_match_scan(log)
    log = reopen(log)
    assert log.offset_for_timestamp(NOW_MS + 95) == (20, NOW_MS + 100)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (58, NOW_MS + 290)


def test_offsets_by_time_find_the_record_inside_a_batch(scratch):
    log = open_log(scratch)
    records = [(b"k", b"v%d" % i, (), NOW_MS + 10 * i) for i in (0, 1, 2, 5, 4, 3)]
    log.append(bytearray(records_build_batch(records, compression=3)), NOW_MS)
    assert log.offset_for_timestamp(NOW_MS + 15) == (2, NOW_MS + 20)
    assert log.offset_for_timestamp(NOW_MS + 40) == (3, NOW_MS + 50)
    assert log.offset_for_timestamp(NOW_MS + 51) is None
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (3, NOW_MS + 50)


def test_segments_roll_on_size_time_and_full_index(scratch):
    log = open_log(scratch, segment_bytes=1000)
    for _ in range(10):
        log.append(build_batch([b"x" * 200]), NOW_MS)
    assert len(log.segments) == 4
    assert all(s.size_bytes <= 1000 for s in log.segments)
    timed = open_log(scratch / "timed", segment_ms=1000)
    timed.append(build_batch([b"a"]), NOW_MS)
    timed.append(build_batch([b"a"], timestamp_ms=NOW_MS + 1000), NOW_MS + 1000)
    assert len(timed.segments) == 1
    timed.append(build_batch([b"a"], timestamp_ms=NOW_MS + 1001), NOW_MS + 1001)
    assert len(timed.segments) == 2
    timed.maybe_roll_by_time(NOW_MS + 5000)  # rolls by its batches' timestamps: not idle
    assert [s.base_offset for s in timed.segments] == [0, 2]
    untimed = open_log(scratch / "untimed", segment_ms=1000)
    untimed.append(build_batch([b"a"], timestamps=[-1]), NOW_MS)
    untimed.maybe_roll_by_time(NOW_MS + 1000)
    assert len(untimed.segments) == 1
    untimed.maybe_roll_by_time(NOW_MS + 1001)  # by its creation time, as at an append
    assert [s.base_offset for s in untimed.segments] == [0, 1]
    full = open_log(scratch / "full", segment_index_bytes=16, index_interval_bytes=0)
    for _ in range(6):
        full.append(build_batch([b"a"]), NOW_MS)
    assert all(s.offset_index.entries <= 2 for s in full.segments)
    assert len(full.segments) >= 2
    assert_indexes_match_scan(full)


def test_segment_jitter_is_within_bounds(scratch):
    log = open_log(scratch, segment_ms=1000, segment_jitter_ms=400)
    assert 0 <= log._roll_policy.jitter_ms < 400


def test_flush_messages_advances_the_recovery_point(scratch):
    log = open_log(scratch, flush_messages=3)
    log.append(build_batch([b"a"] * 2), NOW_MS)
    assert log.recovery_point == 0
    log.append(build_batch([b"a"]), NOW_MS)
    assert log.recovery_point == 3
    timed = open_log(scratch / "timed", flush_ms=100)
    timed.append(build_batch([b"a"]), NOW_MS)
    timed.flush_if_due(NOW_MS + 50)
    assert timed.recovery_point == 0
    timed.flush_if_due(NOW_MS + 100)
    assert timed.recovery_point == 1


def test_idempotent_producer_duplicates_epochs_and_sequences(scratch):
    log = open_log(scratch)

    def send(sequence, count=2, epoch=0, producer_id=42):
        return log.append(build_batch([b"p"] * count, producer_id=producer_id,
                                      producer_epoch=epoch, base_sequence=sequence), NOW_MS)

    assert send(0).base_offset == 0
    assert send(2).base_offset == 2
    retry = send(0)
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (0, 1)
    with pytest.raises(OutOfOrderSequenceNumber):
        send(7)
    with pytest.raises(OutOfOrderSequenceNumber):
        send(5, epoch=1)
    assert send(0, epoch=1).base_offset == 4
    with pytest.raises(InvalidProducerEpoch):
        send(4, epoch=0)
    assert send(1000, producer_id=99).base_offset == 6  # unknown producer: any sequence
    assert log.log_end_offset == 8


@pytest.mark.parametrize("clean", [True, False])
def test_producer_dedupe_survives_restart(scratch, clean):
    log = open_log(scratch, segment_bytes=300)
    for sequence in range(0, 20, 2):
        log.append(build_batch([b"p"] * 2, producer_id=7, producer_epoch=3,
                               base_sequence=sequence), NOW_MS)
    assert len(log.segments) > 2
    log.flush()
    log = reopen(log, clean=clean)
    retry = log.append(build_batch([b"p"] * 2, producer_id=7, producer_epoch=3,
                                   base_sequence=18), NOW_MS)
    assert retry.duplicate and retry.base_offset == 18
    with pytest.raises(OutOfOrderSequenceNumber):
        log.append(build_batch([b"p"], producer_id=7, producer_epoch=3, base_sequence=21), NOW_MS)
    assert log.append(build_batch([b"p"], producer_id=7, producer_epoch=3,
                                  base_sequence=20), NOW_MS).base_offset == 20


def test_retention_by_time_and_size_deletes_exactly_eligible_segments(scratch):
    log = open_log(scratch, segment_bytes=500, retention_ms=1000, file_delete_delay_ms=100)
    for i in range(12):
        log.append(build_batch([b"x" * 100], timestamp_ms=NOW_MS + i * 100), NOW_MS + i * 100)
    bases = [s.base_offset for s in log.segments]
    maxes = [s.max_timestamp_ms for s in log.segments]
    now = NOW_MS + 1500
    expected = sum(1 for m in maxes[:-1] if now - m > 1000)
    assert 0 < expected < len(bases) - 1
    assert log.delete_old_segments(now) == expected
    assert log.log_start_offset == bases[expected]
    assert [s.base_offset for s in log.segments] == bases[expected:]
    deleted = sorted(p.name for p in log.dir.iterdir() if p.name.endswith(".deleted"))
    assert len(deleted) == 3 * expected
    log.remove_deleted_files(now + 99)
    assert any(p.name.endswith(".deleted") for p in log.dir.iterdir())
    log.remove_deleted_files(now + 100)
    assert not any(p.name.endswith(".deleted") for p in log.dir.iterdir())

    sized = open_log(scratch / "sized", segment_bytes=500, retention_bytes=1000)
    for _ in range(12):
        sized.append(build_batch([b"x" * 100]), NOW_MS)
    sizes = [s.size_bytes for s in sized.segments]
    sized.delete_old_segments(NOW_MS)
    assert sized.size_bytes <= 1000 + sizes[-1]
    assert sized.size_bytes - sized.segments[0].size_bytes < 1000
    assert len(sized.segments) >= 1


def test_maintain_skips_a_log_whose_lock_is_held_and_catches_up_after(scratch):
    log = open_log(scratch, segment_bytes=500, retention_ms=1000)
    for i in range(12):
        log.append(build_batch([b"x" * 100], timestamp_ms=NOW_MS + i * 100), NOW_MS + i * 100)
    segments = len(log.segments)
    held, release = threading.Event(), threading.Event()

    def swap_in_progress():
        with log._lock:  # what replace_segments holds across its renames and fsyncs
            held.set()
            release.wait(10)

    holder = threading.Thread(target=swap_in_progress)
    holder.start()
    assert held.wait(10)
    try:
        assert log.maintain(NOW_MS + 1500, check_retention=True) is None
        assert len(log.segments) == segments
    finally:
        release.set()
        holder.join()
    assert log.maintain(NOW_MS + 1500) == 0  # rolls and flushes; retention only when asked
    assert len(log.segments) == segments
    assert log.maintain(NOW_MS + 1500, check_retention=True) == segments - len(log.segments) > 0
    assert len(log.segments) >= 1


def test_retention_never_deletes_the_active_segment(scratch):
    log = open_log(scratch, retention_ms=10)
    log.append(build_batch([b"a"]), NOW_MS)
    assert log.delete_old_segments(NOW_MS + 10_000) == 0
    assert log.log_end_offset == 1 and len(log.segments) == 1


def test_delete_records_moves_log_start_inside_a_segment(scratch):
    log = open_log(scratch, segment_bytes=300)
    for _ in range(10):
        log.append(build_batch([b"x" * 50] * 2), NOW_MS)
    second_base = log.segments[1].base_offset
    assert log.delete_records_before(second_base + 1) == second_base + 1
    with pytest.raises(OffsetOutOfRange):
        log.read(second_base, 100)
    assert parse_header(log.read(second_base + 1, 100).slices[0].read_bytes()).base_offset \
        == second_base
    assert log.delete_old_segments(NOW_MS) == 1
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(log.log_end_offset + 1)
    log = reopen(log)
    assert log.segments[0].base_offset == second_base


def test_reader_of_an_old_snapshot_finishes_after_its_segments_are_deleted(scratch):
    log = open_log(scratch, segment_bytes=300)
    for _ in range(10):
        log.append(build_batch([b"x" * 50] * 2), NOW_MS)
    old = log.read(0, 1 << 20)
    expected = b"".join(piece.read_bytes() for piece in old.slices)
    segments_before, active_base = len(log.segments), log.segments[-1].base_offset
    assert segments_before > 2 and len(old.slices) == segments_before
    log.delete_records_before(log.log_end_offset)
    assert log.delete_old_segments(NOW_MS) == segments_before - 1  # all but the active one
    assert [segment.base_offset for segment in log.segments] == [active_base]
    assert not (log.dir / "00000000000000000000.log").exists()
    assert b"".join(piece.read_bytes() for piece in old.slices) == expected
    out_path = scratch / "sent"
    with open(out_path, "wb") as sink:
        for piece in old.slices:
            os.sendfile(sink.fileno(), piece.fd, piece.position, piece.length)
    assert out_path.read_bytes() == expected


def test_append_listener_sees_the_new_log_end(scratch):
    log = open_log(scratch)
    seen = []
    log.add_append_listener(seen.append)
    log.append(build_batch([b"a"] * 3), NOW_MS)
    log.append(build_batch([b"a"]), NOW_MS)
    assert seen == [3, 4]
